"""PII detection and masking for customer messages: rules, validators, a name lexicon.

What: ``detect(text)`` finds person names, e-mails, phone numbers, payment cards, IBANs,
US SSNs, PRC resident IDs, street addresses and IP addresses; ``mask(text, mode, key)``
replaces each with a typed placeholder (``<EMAIL>``) or a keyed pseudonym
(``<EMAIL_3f9a0c17d2>``, HMAC-SHA256 of the canonical value); ``mask_series`` does it for a
pandas Series (the Spark job calls it from ``mapInArrow``).

How, per type:

* identifiers (card, IBAN, SSN, PRC ID, IP) are found by shape and kept only if their
  check digits or structure validate (``pipeline.checksums``, ``ipaddress``): a 16-digit
  order number that fails Luhn stays as it is;
* phones by national shapes (NANP, UK, DE, FR, CN, any ``+CC``) with a digit-count bound;
* addresses by house number + street words + a street-type lexicon (USPS Publication 28
  suffixes; French voie types; German ``-straße``/``-weg``/... compounds), with unit prefixes
  (Flat, Apt., Suite, Studio) and an optional trailing city;
* names by context and a lexicon: a cue ("my name is", "regards,", "on behalf of", a title
  "Mr.", ...) followed by capitalized name tokens (with particles: van, de, von, da, ...),
  or, without a cue, a "Given Family" pair whose parts are in the US Census name lists
  (the ``names`` package: 5,494 given and 88,799 family names). In text without case
  (all lower or all upper) only cues work, and tokens must not be common English words.

Why rules and not an NER model: no offline NER model installs from the package
registries here (spaCy and Hugging Face models download at run time), and Presidio's
own recognizers for these types are regexes plus the same validators; we measure against
them in ``benchmarks/pii_presidio.py``.

Input is expected NFKC-normalized (the clean stage does it); ``mask`` normalizes text
that is not, so full-width digits are still found.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import ipaddress
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline import checksums as ck

if TYPE_CHECKING:
    import pandas as pd

__all__ = [
    "BUILDER_TYPE_MAP", "CANDIDATE_REGEX", "ENTITY_TYPES", "RESIDUAL_PATTERNS", "Detection",
    "detect", "mask", "mask_series", "pseudonym", "redact",
]  # fmt: skip

ENTITY_TYPES = ("PERSON", "EMAIL", "PHONE", "CARD", "IBAN", "US_SSN", "PRC_ID", "ADDRESS",
                "IP_ADDRESS")  # fmt: skip
# The raw-data builder's ground-truth type names -> ours.
BUILDER_TYPE_MAP = {
    "person_name": "PERSON", "email": "EMAIL", "phone": "PHONE", "card_number": "CARD",
    "iban": "IBAN", "us_ssn": "US_SSN", "prc_id": "PRC_ID", "street_address": "ADDRESS",
    "ip_address": "IP_ADDRESS",
}  # fmt: skip
# Overlaps: the earlier type wins (a validated identifier beats a phone-shaped reading of
# the same digits; anything beats a name), then the longer span.
PRIORITY = {
    t: i
    for i, t in enumerate(
        (
            "EMAIL",
            "IBAN",
            "_BLOCK",
            "PRC_ID",
            "CARD",
            "US_SSN",
            "IP_ADDRESS",
            "PHONE",
            "ADDRESS",
            "PERSON",
        )
    )
}


@dataclass(frozen=True, order=True)
class Detection:
    start: int
    end: int
    entity: str
    value: str


# --------------------------------------------------------------------------- identifiers

_EMAIL_RE = re.compile(
    r"(?<![\w.%+-])[A-Za-z0-9][A-Za-z0-9._%+-]*@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*\.[A-Za-z]{2,24}(?![\w-])"
)
_IBAN_START_RE = re.compile(r"(?<![A-Za-z0-9])[A-Za-z]{2}[0-9]{2}(?= ?[A-Za-z0-9])")
_PRC_RE = re.compile(r"(?<![A-Za-z0-9])[0-9]{17}[0-9Xx](?![A-Za-z0-9])")
_CARD_RE = re.compile(
    r"(?<![0-9A-Za-z+])(?<![0-9][ .-])"
    r"(?:[0-9]{4}([ .-])[0-9]{6}\1[0-9]{5}"
    r"|[0-9]{4}([ .-])[0-9]{4}(?:\2[0-9]{4}){1,2}(?:\2[0-9]{1,4})?"
    r"|[0-9]{13,19})"
    r"(?![0-9A-Za-z])(?![ .-][0-9])"
)
_SSN_RE = re.compile(r"(?<![0-9-])[0-9]{3}-[0-9]{2}-[0-9]{4}(?![0-9-])")
_IPV4_RE = re.compile(r"(?<![0-9.])(?:[0-9]{1,3}\.){3}[0-9]{1,3}(?!\.?[0-9])")
_IPV6_RE = re.compile(r"(?<![\w:])(?:[0-9A-Fa-f]{0,4}:){2,7}[0-9A-Fa-f]{0,4}(?![\w:])")


# IBAN-shaped runs ("NL92 NSCM 0401 2071 03") whose check digits fail: not an IBAN, and
# not a phone or card either; they block other readings of their digits.
_IBAN_SHAPE_RE = re.compile(
    r"(?<![A-Za-z0-9])[A-Z]{2}[0-9]{2}(?:(?: [A-Z0-9]{4}){1,6} [0-9]{4}(?: [0-9]{1,4})?"
    r"|[A-Z0-9]{11,30})(?![A-Za-z0-9])"
)


def _iban_spans(text: str) -> list[tuple[int, int]]:
    # An IBAN's length is fixed per country, so read exactly that many characters
    # (single spaces between groups allowed) instead of guessing where it ends.
    out = []
    for m in _IBAN_START_RE.finditer(text):
        need = ck.IBAN_LENGTHS.get(m.group()[:2].upper())
        if need is None:
            continue
        i, got = m.start(), 0
        while i < len(text) and got < need:
            ch = text[i]
            if ch.isascii() and ch.isalnum():
                got += 1
            elif not (
                ch == " " and got % 4 == 0 and got and i + 1 < len(text) and text[i + 1] != " "
            ):
                break
            i += 1
        at_end = not (i < len(text) and text[i].isascii() and text[i].isalnum())
        if got == need and at_end and ck.iban_valid(text[m.start() : i]):
            out.append((m.start(), i))
    return out


def _card_ok(s: str) -> bool:
    # An 18-digit number with a PRC ID's structure (province, birth date) but a wrong
    # check character is a mistyped ID or a reference, not one of the rare 18-digit cards.
    if len(s) == 18 and s.isdigit() and ck.prc_id_valid(s[:17] + ck.prc_id_check_char(s[:17])):
        return False
    return ck.card_number_valid(s)


def _ip_ok(s: str) -> bool:
    try:
        ipaddress.ip_address(s)
    except ValueError:
        return False
    return True


# --------------------------------------------------------------------------- phones

_PHONE_RES = (
    # International: +CC then 2-6 groups (optionally one in parentheses).
    re.compile(
        r"(?<![\w+])\+[1-9][0-9]{0,2}(?:[ .-]?\([0-9]{1,5}\))?(?:[ .-]?[0-9]{1,5}){1,6}(?![0-9])"
    ),
    # NANP: (212) 555-0199, 212-555-0199, 212.555.0199.
    re.compile(r"(?<![0-9])\([2-9][0-9]{2}\) ?[0-9]{3}[-. ][0-9]{4}(?![0-9])"),
    re.compile(r"(?<![0-9-.])[2-9][0-9]{2}([-.])[0-9]{3}\1[0-9]{4}(?![0-9]|[-.][0-9])"),
    # National numbers with a trunk 0 (UK 07xxx xxxxxx, DE 030 1234567, FR 06 12 34 56 78).
    re.compile(
        r"(?<![0-9A-Za-z+.,/-])(?<![0-9][ .-])0[1-9][0-9]{0,4}(?:[ -][0-9]{2,8}){1,4}(?![0-9]|[.,/-][0-9])"
    ),
    # Chinese mobile numbers, written without separators.
    re.compile(r"(?<![0-9A-Za-z])(?<![0-9][ .-])1[3-9][0-9]{9}(?![0-9A-Za-z])"),
)


# Per pattern of _PHONE_RES: the fewest digits a match that _phone_ok accepts has, and a
# character the text must contain ("" for none).
_PHONE_NEEDS = ((9, "+"), (10, "("), (10, ""), (10, "0"), (11, "1"))


def _phone_ok(s: str) -> bool:
    n = sum(c.isdigit() for c in s)
    return 9 <= n <= 15 if s.startswith("+") else 10 <= n <= 12


_GROUP_END_RE = re.compile(r"[0-9](?![0-9])")


def _phone_spans(rx: re.Pattern[str], text: str) -> list[tuple[int, int]]:
    # A match that runs into a following number ("+49 30 7683485 and 2 more") has too many
    # digits; the longest prefix ending at a digit group that is a phone is kept.
    out = []
    for m in rx.finditer(text):
        v = m.group()
        if _phone_ok(v):
            out.append(m.span())
            continue
        if not v.startswith("+"):  # a long national-looking run is some other number
            continue
        for g in reversed(list(_GROUP_END_RE.finditer(v))[:-1]):
            if _phone_ok(v[: g.end()]):
                out.append((m.start(), m.start() + g.end()))
                break
    return out


# --------------------------------------------------------------------------- addresses

# USPS Publication 28, Appendix C1 street suffixes (primary names, common abbreviations and
# the plurals in use), and British street types.
_EN_STREET = """
alley aly anex annex arcade avenue ave av bayou beach bend bluff bluffs bottom boulevard
blvd branch bridge brook brooks burg burgs bypass camp canyon cape causeway center
centre centers circle cir circles cliff cliffs club common commons corner corners course
court ct courts cove coves creek crescent crest crossing crossroad crossroads curve dale
dam divide drive dr drives estate estates expressway extension extensions fall falls
ferry field fields flat flats ford fords forest forge forges fork forks fort freeway
garden gardens gateway glen glens green greens grove groves harbor harbors haven heights
highway hwy hill hills hollow inlet island islands isle junction junctions key keys
knoll knolls lake lakes land landing lane ln light lights loaf lock locks lodge loop
mall manor manors meadow meadows mews mill mills mission motorway mount mountain
mountains neck orchard oval overpass park parks parkway parkways pass passage path pike
pine pines place pl plain plains plaza point points port ports prairie radial ramp ranch
rapid rapids rest ridge ridges river road rd roads route row rue run shoal shoals shore
shores skyway spring springs spur spurs square squares station stravenue stream street
st streets summit terrace ter throughway trace track trafficway trail trailer tunnel
turnpike underpass union unions valley valleys via viaduct view views village villages
ville vista walk walks wall way ways well wells close gate gates wharf yard quay
""".split()
_FR_VOIE = ["rue", "avenue", "av.", "boulevard", "bd", "place", "chemin", "allée", "allee", "impasse", "quai", "route", "cours", "square", "passage", "voie", "sentier", "rond-point"]  # fmt: skip
_DE_SUFFIX = ["straße", "strasse", "str.", "weg", "gasse", "platz", "allee", "ring", "damm", "ufer", "chaussee", "steig", "pfad", "markt", "berg", "hof", "garten"]  # fmt: skip
_UNIT = r"(?:flat|apt\.?|apartment|suite|ste\.?|unit|studio|room|#)"
_WORD = r"[^\W\d_][\w'’-]*"  # any word (caseless texts)
_CAP = r"[A-ZÀ-ÖØ-Þ][\w'’-]*"  # a capitalized word
_SUFFIX_EN = (
    "(?i:" + "|".join(re.escape(s) for s in sorted(_EN_STREET, key=len, reverse=True)) + ")"
)
_VOIE_FR = "(?i:" + "|".join(re.escape(s) for s in _FR_VOIE) + ")"
_DE_END = "(?i:" + "|".join(re.escape(s) for s in _DE_SUFFIX) + ")"


def _address_res(word: str, caseless: bool) -> tuple[re.Pattern[str], ...]:
    city = r"(?:,\s*(?!I\b)" + word + r"(?:\s+(?!I\b)" + word + r"){0,2})?"
    en = re.compile(
        rf"(?<![\w-])(?:(?i:{_UNIT})\s*[0-9]{{1,4}}[A-Za-z]?,?\s+)?[0-9]{{1,6}}[A-Za-z]?\s+"
        rf"(?:{word}\s+){{0,3}}{_SUFFIX_EN}\b\.?"
        rf"(?:,?\s+(?i:{_UNIT})\s*[0-9]{{1,5}}[A-Za-z]?)?{city}"
    )
    # Unit first ("Flat 17 Janet Meadows"): the unit number, then street words and a suffix.
    en_unit = re.compile(
        rf"(?<![\w-])(?i:flat|apt\.?|apartment|suite|unit|studio)\s*[0-9]{{1,4}}[A-Za-z]?,?\s+"
        rf"(?:{word}\s+){{1,3}}{_SUFFIX_EN}\b\.?{city}"
    )
    particle = r"(?:(?:de la|de l'|du|des|de|d'|la|le|l')\s*)?"
    w = rf"(?!I\b|I['’]){word}"
    fr_body = rf"{_VOIE_FR}\s+{particle}{w}(?:\s+{particle}{w}){{0,3}}"
    bare = rf"(?i:rue|avenue|boulevard|chemin|allée|impasse|quai)\s+{particle}{w}(?:\s+{particle}{w}){{0,3}}"
    number = r"[0-9]{1,4}(?:\s?(?:bis|ter))?,?\s+"
    fr = re.compile(rf"(?<![\w-])(?:{number}{fr_body}" + ("" if caseless else rf"|{bare}") + ")")
    de_name = r"[^\W\d_][\w'’-]*?" if caseless else r"[A-ZÄÖÜ][\w'’-]*?"
    de = re.compile(
        rf"(?<![\w-])(?:(?!I\b){de_name}[ -]){{0,{0 if caseless else 2}}}?(?:{de_name}-)*{de_name}{_DE_END}\s*[0-9]{{1,4}}[a-zA-Z]?(?:\s?[-/]\s?[0-9]{{1,4}})?"
        r"(?![\w])"
    )
    return en, en_unit, fr, de


_ADDRESS_CASED = _address_res(_CAP, caseless=False)
_ADDRESS_CASELESS = _address_res(_WORD, caseless=True)


# --------------------------------------------------------------------------- names

_TITLES = r"(?:Mr|Mrs|Ms|Miss|Mx|Dr|Prof|Sir|Madam|Mme|Mlle|Herr|Frau|Sr|Sra)\.?"
_TITLES = r"(?:Mr|Mrs|Ms|Miss|Mx|Dr|Prof|Sir|Madam|Mme|Mlle|Herr|Frau|Sr|Sra)\.?"
# Phrases after which a name follows. Strong cues all but guarantee one ("my name is ___",
# "regards, ___"); weak ones often precede other words ("this is urgent", "I'm stuck"),
# so in text without case their name needs support from the lexicon.
_STRONG_CUES = (
    r"my name (?:is|was)",
    r"my name's",
    r"name:",
    r"on behalf of",
    r"(?:hi|hello|hey),? (?:this|that) (?:is|was)",
    r"account holder:?",
    r"account holder is",
    r"card ?holder:?",
    r"(?:kind |best |warm )?regards[,:;]*",
    r"thanks[,:;]*",
    r"thank you[,:;]*",
    r"many thanks[,:;]*",
    r"cheers[,:;]*",
    r"sincerely[,:;]*",
    r"yours[,:;]*",
    r"signed[,:;]*",
)
_WEAK_CUES = (
    r"(?:this|that) (?:is|was)",
    r"i'm",
    r"i am",
    r"dear",
    r"sent to",
    r"send it to",
    r"transfer(?:red)? to",
    r"my (?:husband|wife|partner|son|daughter|mother|father|mum|mom|dad|brother|sister|friend|"
    r"colleague|boss|landlord|flatmate|roommate),?",
)


def _cue(cues: tuple[str, ...]) -> str:
    return r"(?i:\b(?:" + "|".join(cues) + "))"


_CUE_AFTER_RE = r"(?i:\s+(?:here|speaking)\b)"
_PARTICLE = r"(?:van der|van den|van de|van|von der|von|de la|de los|del|della|de|der|den|di|da|du|dos|das|le|la|ter|ten|bin|ibn|al|y)"
_UP, _LO = "A-ZÀ-ÖØ-Þ", "a-zß-öø-ÿ"
_TOK1 = rf"(?:[{_UP}][{_LO}]?['’]?)?[{_UP}][{_LO}'’]+"  # Anna, McDonald, O'Neill, D'Souza
_NAME_TOK = rf"{_TOK1}(?:-{_TOK1})?"
_GEN_SUFFIX = r"(?:,?\s+(?:Jr\.?|Sr\.?|II|III|IV))?"
_NAME_CASED = rf"{_NAME_TOK}(?:\s+(?:{_PARTICLE}\s+)?{_NAME_TOK}){{0,3}}{_GEN_SUFFIX}"
_LOW_TOK = r"[a-zß-öø-ÿ][a-zß-öø-ÿ'’-]+"
_NAME_CASELESS = rf"{_LOW_TOK}(?:\s+{_LOW_TOK}){{0,4}}"

# Words that are not names although capitalized after a cue (pronouns, products, places).
_NOT_NAMES = frozenset(
    """
i i'm i've i'd i'll a an the my your our their his her its this that these those there
here what why how when where who which can could would should will might must do
does did is am are was were be been being have has had not no yes ok okay please thanks
thank hi hello hey dear sir madam apple google samsung android iphone visa mastercard
maestro amex american express paypal revolut monzo western union euro euros pound pounds
dollar dollars gbp eur usd uk us usa eu europe england britain london america spain
france germany china india atm pin sepa iban bank banking card cards app account
transfer money cash payment refund top exchange rate support team customer service
disposable virtual physical contactless direct debit standing order urgent again
so ref any cheers regards kind best also then now ps thanks
""".split()
)
# Extra words that stop a cue-less "Given Family" pair: calendar words are given names in
# the Census lists (April, June, Monday is not, but May and August are).
_NOT_PAIR = _NOT_NAMES | frozenset(
    """
monday tuesday wednesday thursday friday saturday sunday january february march april
may june july august september october november december swift post office
""".split()
)
# Words that end a name in text without case: function words and the common verbs and nouns
# of customer messages.
_STOP_LOWER = _NOT_PAIR | frozenset(
    """
and or but so to from for with without of in on at by about as into over after before
speaking writing calling asking need needs needed want wants wanted help got get getting
me we you they he she it can't cannot don't didn't won't trying still just also really
very much go going gone went through waiting wait sick tired stuck sure unable able
happy sorry looking having making using paying unhappy confused worried abroad
travelling traveling currently already now today yesterday tomorrow week month year day
time some any all
""".split()
)


@functools.cache
def _lexicon() -> tuple[frozenset[str], frozenset[str]]:
    """US Census 1990 given names (5,494) and family names (88,799), lower-cased."""
    import names  # MIT-licensed package that ships the Census name files

    root = Path(names.__file__).parent

    def read(*files: str) -> frozenset[str]:
        out = set()
        for f in files:
            for line in (root / f).read_text(encoding="ascii").splitlines():
                if line.strip():
                    out.add(line.split()[0].lower())
        return frozenset(out)

    return read("dist.male.first", "dist.female.first"), read("dist.all.last")


def _fold(tok: str) -> str:
    return unicodedata.normalize("NFKD", tok).encode("ascii", "ignore").decode().lower()


_CUED_CASED_RE = re.compile(
    rf"(?:{_cue(_STRONG_CUES + _WEAK_CUES)}\s+(?P<t>{_TITLES}\s+)?(?P<a>{_NAME_CASED}))"
    rf"|(?:(?<![\w'’])(?P<b>{_NAME_CASED})(?={_CUE_AFTER_RE}))"
    rf"|(?:(?<![\w'’])(?P<c>{_TITLES}\s+{_NAME_CASED}))"
)
_CUED_CASELESS_RE = re.compile(
    rf"(?:(?P<s>{_cue(_STRONG_CUES)})|(?P<w>{_cue(_WEAK_CUES)}))\s+(?P<t>(?i:{_TITLES})\s+)?"
    rf"(?P<a>{_NAME_CASELESS})"
    rf"|(?:(?:^|(?<=[,.!?:;]\s))(?P<b>{_NAME_CASELESS})(?={_CUE_AFTER_RE}))"
    rf"|(?:(?<![\w'’])(?P<c>(?i:{_TITLES})\s+{_NAME_CASELESS}))"
)
_RUN_RE = re.compile(rf"(?<![\w'’-]){_NAME_TOK}(?:\s+{_NAME_TOK})+(?![\w'’-])")
_TOK_RE = re.compile(r"\S+")


def _trim_cased(s: str, start: int) -> tuple[int, int] | None:
    """Drop leading and trailing non-name tokens of a cased match; None if nothing is left."""
    toks = [(m.start(), m.end(), m.group()) for m in _TOK_RE.finditer(s)]
    while toks and toks[0][2].lower() in _NOT_NAMES:
        toks.pop(0)
    while toks and (toks[-1][2].lower() in _NOT_NAMES or re.fullmatch(_PARTICLE, toks[-1][2])):
        toks.pop()
    if not toks:
        return None
    return start + toks[0][0], start + toks[-1][1]


def _trim_caseless(s: str, start: int, mode: str) -> tuple[int, int] | None:
    """mode: "strong" (after a strong cue), "weak" (after a weak cue) or "before" (a name
    before "here")."""
    given, family = _lexicon()
    toks = [(m.start(), m.end(), m.group()) for m in _TOK_RE.finditer(s)]
    if mode == "before":  # "... severin kaul here": keep the tail that looks like a name
        keep = []
        for t in reversed(toks):
            if t[2] in _STOP_LOWER:
                break
            keep.insert(0, t)
        toks = keep[-4:]
    else:
        cut = next((i for i, t in enumerate(toks) if t[2] in _STOP_LOWER), len(toks))
        toks = toks[:cut]
    toks = toks[:5]
    if not toks:
        return None
    # Without case a weak cue needs two tokens, the first a known given name ("i'm doing
    # wrong", "this is fairly certain" are no names).
    if mode != "strong" and (len(toks) < 2 or _fold(toks[0][2]) not in given):
        return None
    return start + toks[0][0], start + toks[-1][1]


def _search_all(rx: re.Pattern[str], text: str):
    """Like ``finditer``, but the next search starts where this match's name starts, not
    where it ends: "I'm writing on behalf of Ann Lee" first matches the weak cue "I'm"
    (rejected: "writing" is no name) and must still find "on behalf of"."""
    pos = 0
    while (m := rx.search(text, pos)) is not None:
        yield m
        name = next(g for g in ("a", "b", "c") if m.group(g) is not None)
        pos = max(m.start() + 1, m.start(name))


def _names(text: str, caseless: bool, cued: bool = True) -> list[tuple[int, int]]:
    """Name spans; ``cued=False`` (no cue word in the text) skips the cue patterns."""
    out = []
    if caseless:
        for m in _search_all(_CUED_CASELESS_RE, text):
            if m.group("a"):
                span = _trim_caseless(
                    m.group("a"), m.start("a"), "strong" if m.group("s") else "weak"
                )
                if span and m.group("t"):
                    span = (m.start("t"), span[1])
            elif m.group("b"):
                span = _trim_caseless(m.group("b"), m.start("b"), "before")
            else:
                span = _trim_caseless(m.group("c"), m.start("c"), "strong")
            if span:
                out.append(span)
        return out
    for m in _search_all(_CUED_CASED_RE, text) if cued else ():
        g = "a" if m.group("a") else ("b" if m.group("b") else "c")
        if g == "c":
            out.append(m.span("c"))
            continue
        span = _trim_cased(m.group(g), m.start(g))
        if span and g == "a" and m.group("t"):
            span = (m.start("t"), span[1])
        if span:
            out.append(span)
    given, family = _lexicon()
    # Cue-less: in each run of capitalized words, "Given Family" or "Given Middle Family".
    for m in _RUN_RE.finditer(text):
        toks = [
            (t.start() + m.start(), t.end() + m.start(), t.group())
            for t in _TOK_RE.finditer(m.group())
        ]
        i = 0
        while i < len(toks) - 1:
            for width in (3, 2):
                win = toks[i : i + width]
                if len(win) < width or any(t[2].lower() in _NOT_PAIR for t in win):
                    continue
                if _fold(win[0][2]) in given and _fold(win[-1][2]) in family:
                    out.append((win[0][0], win[-1][1]))
                    i += width - 1
                    break
            i += 1
    return out


# --------------------------------------------------------------------------- detect


def _is_caseless(text: str) -> bool:
    has_upper = has_lower = False
    for ch in text:
        if ch.isupper():
            has_upper = True
        elif ch.islower():
            has_lower = True
        if has_upper and has_lower:
            return False
    return True


# Searched in the lower-cased text: Python's re tries a case-insensitive alternation at
# every position (5 us a message); a case-sensitive one is found by a literal-prefix scan.
_VOIE_HINT_RE = re.compile(r"(?:rue|avenue|boulevard|chemin|all[ée]e|impasse|quai)\s")
_FR_HINT_RE = re.compile("|".join(re.escape(v) for v in _FR_VOIE))
_DE_HINT_RE = re.compile("|".join(re.escape(d) for d in _DE_SUFFIX))
_EN_STREET_SET = frozenset(_EN_STREET)
_LETTER_RUN_RE = re.compile(r"[^\W\d_]+")
# A capitalized word after whitespace: every name the cased name patterns can return
# contains one that is not in _NOT_NAMES (after a cue or a title, or the second word of a
# "Given Family" pair), or stands before "here" / "speaking".
_CAP_AFTER_SPACE_RE = re.compile(r"\s([A-ZÀ-ÖØ-Þ][\w'’-]*)")
# One word (lower case, a whole run of letters) of every cue, title and after-cue: a
# message with none of them cannot match _CUED_CASED_RE.
_CUE_WORDS = frozenset(
    """
name behalf this that holder cardholder regards thanks thank cheers sincerely yours signed
m am dear sent send transfer transferred husband wife partner son daughter mother father
mum mom dad brother sister friend colleague boss landlord flatmate roommate
mr mrs ms miss mx dr prof sir madam mme mlle herr frau sr sra here speaking
""".split()
)

# The gates below only skip work: each returns False only when its patterns cannot match
# (tests/test_pii.py checks detections with every gate open). They are exact for ASCII
# text, where lower-casing and re.IGNORECASE agree; other text runs every pattern.


def _may_hold_cased_name(text: str, low: str) -> bool:
    """Whether the cased name patterns can find a name: a 2 us test in front of the cue
    search (20 us), which most messages fail."""
    if "here" in low or "speaking" in low:
        return True
    return any(w.lower() not in _NOT_NAMES for w in _CAP_AFTER_SPACE_RE.findall(text))


def _words(text: str, low: str) -> set[str] | None:
    """The lower-cased words the gates below look up; None (every gate open) for non-ASCII
    text."""
    return set(_LETTER_RUN_RE.findall(low)) if text.isascii() else None


def _cue_possible(words: set[str] | None) -> bool:
    """Whether a cue word occurs: a set lookup over the words, not a failing search."""
    return words is None or not _CUE_WORDS.isdisjoint(words)


def _street_gates(low: str, words: set[str] | None) -> tuple[bool, bool, bool, bool]:
    """Which address pattern (en, en_unit, fr, de) can match: each needs its street word
    (a whole word for the English suffixes, a substring for the French and German ones)."""
    if words is None:
        return True, True, True, True
    en = not _EN_STREET_SET.isdisjoint(words)
    return en, en, _FR_HINT_RE.search(low) is not None, _DE_HINT_RE.search(low) is not None


def _lower_same_length(text: str) -> str:
    # str.lower() can lengthen text ("İ" -> "i̇"); offsets must survive, so lower per char.
    return "".join(c if len(lc := c.lower()) != 1 else lc for c in text)


def detect(text: str) -> list[Detection]:
    """All PII in ``text``, non-overlapping, in order of position."""
    if not text:
        return []
    found: list[tuple[int, int, str]] = []
    # Cheap gates first: most messages have no "@", no digit run, no colon, and a regex
    # pass over them costs more than these scans.
    if "@" in text:
        found += [(*m.span(), "EMAIL") for m in _EMAIL_RE.finditer(text)]
    # ASCII digits only: every number pattern below reads [0-9] (NFKC made full-width
    # digits ASCII). Card, PRC ID, SSN and phone numbers all have 9 digits or more.
    n_digits = sum(map(text.count, "0123456789"))
    digits = n_digits > 0
    if digits:
        found += [(s, e, "IBAN") for s, e in _iban_spans(text)]
        found += [(*m.span(), "_BLOCK") for m in _IBAN_SHAPE_RE.finditer(text)]
        if n_digits >= 4 and text.count(".") >= 3:
            found += [(*m.span(), "IP_ADDRESS") for m in _IPV4_RE.finditer(text) if _ip_ok(m.group())]
    if n_digits >= 9:
        if n_digits >= 17:
            found += [(*m.span(), "PRC_ID") for m in _PRC_RE.finditer(text) if ck.prc_id_valid(m.group())]
        if n_digits >= 13:
            found += [(*m.span(), "CARD") for m in _CARD_RE.finditer(text) if _card_ok(m.group())]
        if "-" in text:
            found += [(*m.span(), "US_SSN") for m in _SSN_RE.finditer(text) if ck.us_ssn_valid(m.group())]
        # Phones: "+CC" numbers have 9 digits or more, national ones 10 (see _phone_ok);
        # each pattern also needs its leading character.
        for rx, need in zip(_PHONE_RES, _PHONE_NEEDS, strict=True):
            if n_digits >= need[0] and (not need[1] or need[1] in text):
                found += [(s, e, "PHONE") for s, e in _phone_spans(rx, text)]
    if text.count(":") >= 2:
        found += [(*m.span(), "IP_ADDRESS") for m in _IPV6_RE.finditer(text) if _ip_ok(m.group())]
    caseless = _is_caseless(text)
    scan = _lower_same_length(text) if caseless else text
    low = scan if caseless else text.lower()
    words: set[str] | None | bool = False  # False: not computed yet (at most once)
    if digits or _VOIE_HINT_RE.search(low):
        words = _words(text, low)
        street = _street_gates(low, words)
        for rx, ok in zip(_ADDRESS_CASELESS if caseless else _ADDRESS_CASED, street, strict=True):
            if ok:
                found += [
                    (*m.span(), "ADDRESS")
                    for m in rx.finditer(scan)
                    if not caseless or not _STOP_LOWER.intersection(m.group().split())
                ]
    if caseless or _may_hold_cased_name(text, low):
        if not caseless and words is False:
            words = _words(text, low)
        cued = caseless or _cue_possible(words)
        found += [(s, e, "PERSON") for s, e in _names(scan, caseless, cued)]

    found.sort(key=lambda d: (PRIORITY[d[2]], d[0] - d[1], d[0]))
    taken: list[tuple[int, int]] = []
    out = []
    for s, e, ent in found:
        if s >= e or any(s < te and ts < e for ts, te in taken):
            continue
        taken.append((s, e))
        if ent != "_BLOCK":
            out.append(Detection(s, e, ent, text[s:e]))
    return sorted(out)


# --------------------------------------------------------------------------- masking


def canonical(entity: str, value: str) -> str:
    """The form a pseudonym is computed from, so formatting does not change the token:
    the same card typed with spaces or dashes, an e-mail in any case, map alike."""
    if entity in ("CARD", "PHONE", "US_SSN"):
        return "".join(c for c in value if c.isdigit())
    if entity in ("IBAN", "PRC_ID"):
        return "".join(c for c in value if c.isalnum()).upper()
    if entity == "IP_ADDRESS":
        try:
            return ipaddress.ip_address(value).compressed
        except ValueError:
            return value
    if entity == "PERSON":
        value = re.sub(rf"^(?i:{_TITLES})\s+", "", value)
    return " ".join(value.casefold().split())


def pseudonym(entity: str, value: str, key: bytes) -> str:
    digest = hmac.new(key, f"{entity}:{canonical(entity, value)}".encode(), hashlib.sha256)
    return f"<{entity}_{digest.hexdigest()[:10]}>"


def mask(text: str, mode: str = "placeholder", key: bytes | None = None) -> tuple[str, list[str]]:
    """``text`` with every detection replaced, and the entity types replaced (in order)."""
    masked, dets = redact(text, mode, key)
    return masked, [d.entity for d in dets]


def redact(
    text: str, mode: str = "placeholder", key: bytes | None = None
) -> tuple[str, list[Detection]]:
    """Like ``mask``, with the detections (offsets into the NFKC form of ``text``)."""
    if mode not in ("placeholder", "pseudonym"):
        raise ValueError(f"mode must be 'placeholder' or 'pseudonym', got {mode!r}")
    if mode == "pseudonym" and not key:
        raise ValueError("pseudonym mode needs a key")
    if text is None:
        return text, []
    if not unicodedata.is_normalized("NFKC", text):
        text = unicodedata.normalize("NFKC", text)
    dets = detect(text)
    if not dets:
        return text, dets
    pieces, last = [], 0
    for d in dets:
        pieces.append(text[last : d.start])
        pieces.append(
            f"<{d.entity}>" if mode == "placeholder" else pseudonym(d.entity, d.value, key)
        )
        last = d.end
    pieces.append(text[last:])
    return "".join(pieces), dets


def mask_series(
    series: pd.Series, mode: str = "placeholder", key: bytes | None = None
) -> pd.DataFrame:
    """Vectorized entry for Arrow/pandas UDFs: columns ``text``, ``entities``, ``n_entities``."""
    import pandas as pd

    texts, ents = [], []
    for t in series.tolist():
        m, e = mask(t, mode, key)
        texts.append(m)
        ents.append(e)
    return pd.DataFrame(
        {"text": texts, "entities": ents, "n_entities": [len(e) for e in ents]}, index=series.index
    )


# --------------------------------------------------------------------------- Spark & gate

# Spark prefilter (Java regex, also valid Python): a row can hold a detection only if it
# has a digit, an "@", an IPv6 colon pair, a capitalized word after another word (names,
# street words), or a name cue. Rows that match none skip the Python UDF entirely.
CANDIDATE_REGEX = (
    r"[0-9]|@|:[0-9A-Fa-f]*:|[^\s.!?]\s+(?!I\b|I['’])[A-ZÀ-ÖØ-Þ]|(?i:\b(?:"
    + "|".join(
        [
            "name",
            "regards",
            "thanks",
            "thank",
            "cheers",
            "sincerely",
            "yours",
            "signed",
            "dear",
            "this",
            "that",
            "i'm",
            "i am",
            "behalf",
            "holder",
            "here",
            "speaking",
            "sent",
            "send",
            "transfer",
            "transferred",
            "husband",
            "wife",
            "partner",
            "son",
            "daughter",
            "mother",
            "father",
            "mum",
            "mom",
            "dad",
            "brother",
            "sister",
            "friend",
            "colleague",
            "boss",
            "landlord",
            "flatmate",
            "roommate",
            "mr",
            "mrs",
            "ms",
            "miss",
            "mx",
            "dr",
            "prof",
            "sir",
            "madam",
            "mme",
            "mlle",
            "herr",
            "frau",
            "sr",
            "sra",
        ]
    )
    + r")\b)"
)
# Patterns whose presence after desensitization is a leak whatever the context: they cannot
# be mistaken for a decoy (SSN area/group/serial rules, strict IPv4 octets, "+CC" phones).
RESIDUAL_PATTERNS = {
    "EMAIL": r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}",
    "US_SSN": r"(^|[^0-9-])(?!000|666|9[0-9][0-9])[0-9]{3}-(?!00)[0-9]{2}-(?!0000)[0-9]{4}([^0-9-]|$)",
    "IP_ADDRESS": r"(^|[^0-9.])((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}"
    r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])([^0-9.]|$)",
    "PHONE": r"(^|[^\w+])\+[1-9][0-9]{0,2}[ .-]?\(?[0-9]{1,5}\)?[ .-]?[0-9]{2,}[ .-]?[0-9]{2,}",
}
