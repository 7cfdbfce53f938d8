"""PII detection and masking for customer messages: rules, validators, token models.

What: ``detect(text)`` finds person names, e-mails, phone numbers, payment cards, IBANs,
US SSNs, PRC resident IDs, street addresses and IP addresses, each ``Detection`` naming
the rule or model that found it (``source``); ``mask(text, mode, key)`` replaces each
with a typed placeholder (``<EMAIL>``) or a keyed pseudonym (``<EMAIL_3f9a0c17d2>``,
HMAC-SHA256 of the canonical value); ``mask_series`` does it for a pandas Series (the
Spark job calls it from ``mapInArrow``).

How, per type:

* identifiers (card, IBAN, SSN, PRC ID, IP) are found by shape and kept only if their
  check digits or structure validate (``pii.checksums``, ``ipaddress``): a 16-digit
  order number that fails Luhn stays as it is;
* phones by national shapes (NANP, UK, DE, FR, CN, any ``+CC``) with a digit-count
  bound, and, in ``pii.phones``, national formats of many countries checked with
  libphonenumber; 12-digit Maestro cards by Luhn and their issuer prefix there too;
* addresses by the ADDRESS token model (``pii.model``) near a house number, and
  by the patterns here: house number + street words + a street-type lexicon (USPS
  Publication 28 suffixes; French voie types; German ``-straße``/``-weg``/... compounds),
  unit prefixes (Flat, Apt., Suite, Studio) and an optional trailing city; in text
  without case a pattern's match stands alone only with a street name besides the type;
* names by the PERSON token model (a name-frequency prior, the word's shape and context),
  which reads the cue rules here as features: a cue ("my name is", "regards,", "on behalf
  of", a title "Mr.", ...) followed by capitalized name tokens (with particles: van, de,
  von, da, ...), or, without a cue, a "Given Family" pair from the US Census name lists
  (the ``names`` package). In text with case the cued names also stand alone.

Why no NER model: none installs offline from the package registries here (spaCy and
Hugging Face models download at run time); Presidio's own recognizers for these types
are regexes plus the same validators. ``benchmarks/pii_eval.py`` measures both on text
nobody here wrote.

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

import ahocorasick

from pii import checksums as ck
from pii.model import address_like, tokenize
from pii.phones import _DIGITS_AS_0, card_spans, phone_spans

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

    import pandas as pd

__all__ = [
    "BUILDER_TYPE_MAP", "ENTITY_TYPES", "RESIDUAL_PATTERNS", "Detection",
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
    source: str = ""  # the rule or model that found it (see SOURCES)


# What finds each type, unless a detection names another source ("PERSON~name-model"
# inside detect): the pattern, and the check that keeps it.
SOURCES = {
    "EMAIL": "email-pattern", "IBAN": "iban-pattern+mod97", "PRC_ID": "prc-id-pattern+check",
    "CARD": "card-pattern+luhn", "US_SSN": "ssn-pattern+ssa-rules",
    "IP_ADDRESS": "ip-pattern+parse", "PHONE": "phone-pattern", "ADDRESS": "address-pattern",
    "PERSON": "name-cue-rules",
}  # fmt: skip


def _detection(text: str, s: int, e: int, ent: str) -> Detection:
    entity, _, source = ent.partition("~")
    return Detection(s, e, entity, text[s:e], source or SOURCES[entity])


def _lower_is_ignorecase(text: str) -> bool:
    """Whether a case-insensitive regex of ASCII letters matches ``text`` where its lower
    case holds the same letters, at the same positions: in all text but the four characters
    re.IGNORECASE matches to an ASCII letter (and "İ" lengthens the lower case)."""
    return text.isascii() or not any(c in text for c in "\u0130\u0131\u017f\u212a")


def _word_start(s: str, i: int) -> bool:
    """Whether a word can start at ``s[i]``, as after a regex's ``\\b``."""
    return not i or not (s[i - 1].isalnum() or s[i - 1] == "_")


def _by_first_char(alternatives: Iterable[str]) -> str:
    """``(?:a1|a2|...)``, with the alternatives (regexes that start with a plain character)
    grouped by that character, each group in the order given. Python's re tries the
    case-insensitive alternatives one by one at every place (0.1 us each for the 250 street
    types); alternatives that start with different letters never match at the same place,
    so the groups match as the plain list does."""
    groups: dict[str, list[str]] = {}
    for a in alternatives:
        assert a[0].isalnum() or a[0] == "#", a  # a plain character
        groups.setdefault(a[0].lower(), []).append(a)
    parts = []
    for group in groups.values():
        assert all(a[0] == group[0][0] for a in group), group
        tails = [a[1:] for a in group]
        parts.append(group[0] if len(group) == 1 else f"{group[0][0]}(?:{'|'.join(tails)})")
    return "(?:" + "|".join(parts) + ")"


def _automaton(entries: Iterable[tuple[str, object]]) -> ahocorasick.Automaton:
    """An Aho-Corasick automaton over (word, value) pairs: one pass finds them all."""
    a = ahocorasick.Automaton()
    for word, value in entries:
        a.add_word(word, value)
    a.make_automaton()
    return a


# --------------------------------------------------------------------------- identifiers

_EMAIL_RE = re.compile(
    r"(?<![\w.%+-])[A-Za-z0-9][A-Za-z0-9._%+-]*@[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
    r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*\.[A-Za-z]{2,24}(?![\w-])"
)


def _email_from(text: str) -> int:
    """Where an e-mail address in ``text`` can start: its name part holds no whitespace
    and no "@", so not before the space in front of the first "@" (re tries the pattern at
    every position before, 3 us a message)."""
    return text.rfind(" ", 0, text.find("@")) + 1


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


def _iban_spans(text: str, zone: tuple[int, int]) -> list[tuple[int, int, str]]:
    """IBANs, and IBAN-shaped runs ("_BLOCK"), which all start where _IBAN_START_RE does."""
    starts = list(_matches(_IBAN_START_RE, text, zone))
    if not starts:
        return []
    out = [(*m.span(), "_BLOCK") for m in _matches(_IBAN_SHAPE_RE, text, zone)]
    # An IBAN's length is fixed per country, so read exactly that many characters
    # (single spaces between groups allowed) instead of guessing where it ends.
    for m in starts:
        rx = _IBAN_READ_RES.get(ck.IBAN_LENGTHS.get(m.group()[:2].upper()))
        if rx is not None and (r := rx.match(text, m.start())) and ck.iban_valid(r.group()):
            out.append((*r.span(), "IBAN"))
    return out


def _iban_read_re(n: int) -> re.Pattern[str]:
    """``n`` ASCII letters and digits, in groups of 4 with at most one space after each,
    then no letter or digit."""
    groups, rest = divmod(n, 4)
    if not rest:
        groups, rest = groups - 1, 4
    return re.compile(rf"(?:[A-Za-z0-9]{{4}} ?){{{groups}}}[A-Za-z0-9]{{{rest}}}(?![A-Za-z0-9])")


_IBAN_READ_RES = {n: _iban_read_re(n) for n in set(ck.IBAN_LENGTHS.values())}


def _card_ok(s: str) -> bool:
    # An 18-digit number with a PRC ID's structure (province, birth date) but a wrong
    # check character is a mistyped ID or a reference, not one of the rare 18-digit cards.
    # (Luhn first: it rules out 9 in 10 numbers for a third of the PRC check's 8 us.)
    return ck.card_number_valid(s) and not (
        len(s) == 18 and s.isdigit() and ck.prc_id_valid(s[:17] + ck.prc_id_check_char(s[:17]))
    )


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


# Per pattern of _PHONE_RES: the fewest digits a match that _phone_ok accepts has ("+CC"
# numbers 9, national ones 10).
_PHONE_MIN_DIGITS = (9, 10, 10, 10, 11)

# Per number pattern: a hint, a part of every match that starts at most ``back``
# characters into it, and whether every match ends at a digit (or at the "X" after one).
# The patterns start with lookbehinds, so re tries them at every position (3-8 us a
# message); a hint starts with a literal or a digit class, which re skips ahead to (the
# IBAN hint, two letters and two digits, is written digit first). Keyed by the pattern's
# text: hashing a compiled pattern hashes its code (0.1-0.4 us).
_HINTS = {
    _IBAN_START_RE.pattern: (re.compile(r"[0-9](?<=[A-Za-z]{2}[0-9])[0-9]"), 2, True),
    _IBAN_SHAPE_RE.pattern: (re.compile(r"[0-9](?<=[A-Z]{2}[0-9])[0-9]"), 2, False),
    _PRC_RE.pattern: (re.compile(r"[0-9][0-9]{16}"), 0, True),
    _CARD_RE.pattern: (re.compile(r"[0-9][0-9]{3}"), 0, True),
    _SSN_RE.pattern: (re.compile(r"[0-9]-[0-9]{2}-[0-9]"), 2, True),
    _IPV4_RE.pattern: (re.compile(r"[0-9]\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]"), 2, True),
    _IPV6_RE.pattern: (re.compile(r":[0-9A-Fa-f]{0,4}:"), 4, False),
    **dict(zip((rx.pattern for rx in _PHONE_RES), (
        (re.compile(r"\+[1-9]"), 0, True),
        (re.compile(r"\([2-9]"), 0, True),
        (re.compile(r"[0-9][-.][0-9]{3}[-.][0-9]"), 2, True),
        (re.compile(r"0[1-9][0-9]{0,4}[ -][0-9]"), 0, True),
        (re.compile(r"1[3-9][0-9]{9}"), 0, True),
    ), strict=True)),
}  # fmt: skip




def _matches(rx: re.Pattern[str], text: str, zone: tuple[int, int]) -> Iterator[re.Match[str]]:
    """``rx.finditer(text)`` for a number pattern, over the part of ``text`` where it can
    match. ``zone``: the first digit's position less one (a "+" or "(" before it) and the
    last digit's plus three (the "X" of a PRC ID, then lookaheads of two characters); a hint
    is inside the zone, a match starts no earlier than its hint and, if it ends at a digit,
    ends inside the zone. Without the hint there is no match."""
    hint, back, ends_at_digit = _HINTS[rx.pattern]
    lo, hi = zone[0], zone[1] if ends_at_digit else len(text)
    h = hint.search(text, lo, hi)
    return rx.finditer(text, max(h.start() - back, 0), hi) if h else iter(())


def _valid(
    rx: re.Pattern[str], entity: str, ok: Callable[[str], bool], text: str, zone: tuple[int, int]
) -> list[tuple[int, int, str]]:
    """The matches of a number pattern that ``ok`` accepts, typed ``entity``."""
    return [(*m.span(), entity) for m in _matches(rx, text, zone) if ok(m.group())]


# PRC IDs, cards and SSNs: the fewest digits a match has, the pattern, the type, the
# validator (see _valid).
_VALIDATED = (
    (17, _PRC_RE, "PRC_ID", ck.prc_id_valid),
    (13, _CARD_RE, "CARD", _card_ok),
    (9, _SSN_RE, "US_SSN", ck.us_ssn_valid),
)


def _phone_ok(s: str) -> bool:
    n = sum(map(str.isdigit, s))
    return 9 <= n <= 15 if s.startswith("+") else 10 <= n <= 12


_GROUP_END_RE = re.compile(r"[0-9](?![0-9])")


def _phone_spans(text: str, zone: tuple[int, int], n_digits: int) -> list[tuple[int, int, str]]:
    # A match that runs into a following number ("+49 30 7683485 and 2 more") has too many
    # digits; the longest prefix ending at a digit group that is a phone is kept.
    out = []
    for rx, need in zip(_PHONE_RES, _PHONE_MIN_DIGITS, strict=True):
        for m in _matches(rx, text, zone) if n_digits >= need else ():
            v = m.group()
            if _phone_ok(v):
                out.append((*m.span(), "PHONE"))
                continue
            if not v.startswith("+"):  # a long national-looking run is some other number
                continue
            for g in reversed(list(_GROUP_END_RE.finditer(v))[:-1]):
                if _phone_ok(v[: g.end()]):
                    out.append((m.start(), m.start() + g.end(), "PHONE"))
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
_UNIT = _by_first_char(["flat", r"apt\.?", "apartment", "suite", r"ste\.?", "unit", "studio", "room", "#"])  # fmt: skip
_UNIT_FIRST = _by_first_char(["flat", r"apt\.?", "apartment", "suite", "unit", "studio"])
_VOIE_BARE = _by_first_char(["rue", "avenue", "boulevard", "chemin", "allée", "impasse", "quai"])
_WORD = r"[^\W\d_][\w'’-]*+"  # any word (caseless texts); possessive: see _TOK1
_CAP = r"[A-ZÀ-ÖØ-Þ][\w'’-]*+"  # a capitalized word
_SUFFIX_EN = f"(?i:{_by_first_char(map(re.escape, sorted(_EN_STREET, key=len, reverse=True)))})"
_VOIE_FR = f"(?i:{_by_first_char(map(re.escape, _FR_VOIE))})"
_DE_END = f"(?i:{_by_first_char(map(re.escape, _DE_SUFFIX))})"


def _address_res(word: str, caseless: bool) -> tuple[re.Pattern[str], ...]:
    city = r"(?:,\s*(?!I\b)" + word + r"(?:\s+(?!I\b)" + word + r"){0,2})?"
    en = re.compile(
        rf"(?<![\w-])(?:(?i:{_UNIT})\s*[0-9]{{1,4}}[A-Za-z]?,?\s+)?[0-9]{{1,6}}[A-Za-z]?\s+"
        rf"(?:{word}\s+){{0,3}}{_SUFFIX_EN}\b\.?"
        rf"(?:,?\s+(?i:{_UNIT})\s*[0-9]{{1,5}}[A-Za-z]?)?{city}"
    )
    # Unit first ("Flat 17 Janet Meadows"): the unit number, then street words and a suffix.
    en_unit = re.compile(
        rf"(?<![\w-])(?i:{_UNIT_FIRST})\s*[0-9]{{1,4}}[A-Za-z]?,?\s+"
        rf"(?:{word}\s+){{1,3}}{_SUFFIX_EN}\b\.?{city}"
    )
    particle = r"(?:(?:de la|de l'|du|des|de|d'|la|le|l')\s*)?"
    w = rf"(?!I\b|I['’]){word}"
    fr_body = rf"{_VOIE_FR}\s+{particle}{w}(?:\s+{particle}{w}){{0,3}}"
    bare = rf"(?i:{_VOIE_BARE})\s+{particle}{w}(?:\s+{particle}{w}){{0,3}}"
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

_TITLES = _by_first_char("Mr Mrs Ms Miss Mx Dr Prof Sir Madam Mme Mlle Herr Frau Sr Sra".split())
_TITLES += r"\.?"
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
_RELATIVES = (
    "husband", "wife", "partner", "son", "daughter", "mother", "father", "mum", "mom", "dad",
    "brother", "sister", "friend", "colleague", "boss", "landlord", "flatmate", "roommate",
)  # fmt: skip
_WEAK_CUES = (
    r"(?:this|that) (?:is|was)",
    r"i'm",
    r"i am",
    r"dear",
    r"sent to",
    r"send it to",
    r"transfer(?:red)? to",
    r"my (?:" + "|".join(_RELATIVES) + "),?",
)
# The literal text each cue and title starts with (lower case): a cued name pattern can
# match only where one of them starts, or before "here" / "speaking" (see _cue_starts).
# Spelled out in full where a shorter prefix is a common word ("hi", "transfer"), as every
# place it starts is a regex match tried (1 us).
_CUE_PREFIXES = (
    "my name", "name:", "on behalf of",
    *(f"{h}{c} {t} {v}" for h in ("hi", "hello", "hey") for c in (",", "")
      for t in ("this", "that") for v in ("is", "was")),
    "account holder", "card holder", "cardholder", "kind regards", "best regards",
    "warm regards", "regards", "thanks", "thank you", "many thanks", "cheers", "sincerely",
    "yours", "signed", "this is", "this was", "that is", "that was", "i'm", "i am", "dear",
    "sent to", "send it to", "transfer to", "transferred to",
    *(f"my {r}" for r in _RELATIVES),
    "mr", "ms", "miss", "mx", "dr", "prof", "sir", "madam", "mme", "mlle", "herr", "frau", "sr",
)  # fmt: skip


def _cue(cues: tuple[str, ...]) -> str:
    return r"(?i:\b(?:" + "|".join(cues) + "))"


_CUE_AFTER_RE = r"(?i:\s+(?:here|speaking)\b)"
_PARTICLE = r"(?:van der|van den|van de|van|von der|von|de la|de los|del|della|de|der|den|di|da|du|dos|das|le|la|ter|ten|bin|ibn|al|y)"
_UP, _LO = "A-ZÀ-ÖØ-Þ", "a-zß-öø-ÿ"
# Name tokens and words end with a possessive run ("++", "*+": never given back, as no
# pattern goes on with one of its characters), so a failed match does not retry each
# shorter run (0.2-0.5 us a try).
# Anna, McDonald, O'Neill, D'Souza: rf"(?:[{_UP}][{_LO}]?['’]?)?[{_UP}][{_LO}'’]+", written
# capital first (the same alternatives, in the same order) for _RUN_RE.
_TOK1_TAIL = rf"(?:[{_LO}]?['’]?[{_UP}][{_LO}'’]++|[{_LO}'’]++)"
_TOK1 = rf"[{_UP}]{_TOK1_TAIL}"
_NAME_TOK = rf"{_TOK1}(?:-{_TOK1})?"
_GEN_SUFFIX = r"(?:,?\s+(?:Jr\.?|Sr\.?|II|III|IV))?"
_PARTICLE_RE = re.compile(_PARTICLE)
_NAME_CASED = rf"{_NAME_TOK}(?:\s+(?:{_PARTICLE}\s+)?{_NAME_TOK}){{0,3}}{_GEN_SUFFIX}"
_LOW_TOK = r"[a-zß-öø-ÿ][a-zß-öø-ÿ'’-]++"
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
time some any all en
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
    if tok.isascii():  # what the line below returns for it
        return tok.lower()
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
# A run of capitalized words: rf"(?<![\w'’-]){_NAME_TOK}(?:\s+{_NAME_TOK})+(?![\w'’-])",
# written capital first (its first token's capital, the lookbehind, the rest of the
# token), so that re tries it at the capitals only, not at every position (1-2 us).
_RUN_RE = re.compile(
    rf"[{_UP}](?<![\w'’-][{_UP}]){_TOK1_TAIL}(?:-{_TOK1})?(?:\s+{_NAME_TOK})+(?![\w'’-])"
)
_TOK_RE = re.compile(r"\S+")
_CUE_AUTOMATON = _automaton(
    [(w, (len(w), False)) for w in _CUE_PREFIXES]
    + [(w, (len(w), True)) for w in ("here", "speaking")]
)


# Where a name before "here" / "speaking" can start: at a capital in cased text; at the
# start or after a punctuation mark and a space in text without case.
_CAP_WORD_START_RE = re.compile(rf"[{_UP}](?<!\w[{_UP}])")  # where _word_start holds
_PUNCT_SPACE_RE = re.compile(r"[,.!?:;]\s")


def _cue_starts(scan: str, low: str, caseless: bool) -> list[int] | None:
    """Every position where the cued name pattern can match in ``scan``, in order: starts of
    cue prefixes and titles at a word boundary (one Aho-Corasick pass over ``low``; the
    regex tries its case-insensitive cues at every position), and, if "here" or "speaking"
    follows a space, the starts a name before it can have. None (search everywhere) where
    lower-casing and the regex disagree (see _lower_is_ignorecase)."""
    if not _lower_is_ignorecase(scan):
        return None
    starts = set()
    before = False
    for end, (n, after) in _CUE_AUTOMATON.iter(low):
        p = end - n + 1
        if after:
            before = before or (p > 0 and scan[p - 1].isspace())
        elif _word_start(scan, p):
            starts.add(p)
    if before and caseless:
        starts.add(0)
        starts.update(m.end() for m in _PUNCT_SPACE_RE.finditer(scan))
    elif before:
        starts.update(m.start() for m in _CAP_WORD_START_RE.finditer(scan))
    return sorted(starts)


def _search_from(
    rx: re.Pattern[str], text: str, pos: int, starts: Iterable[int] | None
) -> re.Match[str] | None:
    """``rx.search(text, pos)``; given ``starts``, every position where ``rx`` can match (in
    order), by trying it there only."""
    if starts is None:
        return rx.search(text, pos)
    for p in starts:
        if p >= pos and (m := rx.match(text, p)):
            return m
    return None


def _keeps_all(s: str) -> bool:
    """Whether _trim_cased drops no token of ``s`` (a cased name match, which starts and
    ends with a token), as for most names: a test on its first and last words only."""
    words = s.split()  # the tokens, as _TOK_RE finds them
    return not (
        words[0].lower() in _NOT_NAMES
        or words[-1].lower() in _NOT_NAMES
        or _PARTICLE_RE.fullmatch(words[-1])
    )


def _trim_cased(s: str, start: int) -> tuple[int, int] | None:
    """Drop leading and trailing non-name tokens of a cased match; None if nothing is left."""
    if _keeps_all(s):
        return start, start + len(s)
    toks = [(m.start(), m.end(), m.group()) for m in _TOK_RE.finditer(s)]
    while toks and toks[0][2].lower() in _NOT_NAMES:
        toks.pop(0)
    while toks and (toks[-1][2].lower() in _NOT_NAMES or _PARTICLE_RE.fullmatch(toks[-1][2])):
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


def _search_all(rx: re.Pattern[str], text: str, starts: list[int] | None):
    """Like ``finditer``, but the next search starts where this match's name starts, not
    where it ends: "I'm writing on behalf of Ann Lee" first matches the weak cue "I'm"
    (rejected: "writing" is no name) and must still find "on behalf of". ``starts``: see
    _search_from and _cue_starts."""
    m = _search_from(rx, text, 0, starts)
    while m is not None:
        yield m
        # The group of the name ("a", "b" or "c"): each branch closes it last.
        m = _search_from(rx, text, max(m.start() + 1, m.start(m.lastgroup)), starts)


def _names(
    text: str, caseless: bool, starts: list[int] | None
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Name spans after a cue or title, and cue-less "Given Family" pairs (in text with
    case only); ``starts``: where the cue patterns can match (see _cue_starts)."""
    out = []
    if caseless:
        for m in _search_all(_CUED_CASELESS_RE, text, starts):
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
        return out, []
    for m in _search_all(_CUED_CASED_RE, text, starts) if starts != [] else ():
        g = m.lastgroup  # "a", "b" or "c" (see _search_all)
        if g == "c":
            out.append(m.span("c"))
            continue
        span = _trim_cased(m.group(g), m.start(g))
        if span and g == "a" and m.group("t"):
            span = (m.start("t"), span[1])
        if span:
            out.append(span)
    cued, out = out, []
    given, family = _lexicon()
    # Cue-less: in each run of capitalized words, "Given Family" or "Given Middle Family"
    # (tried in this order at each token), no token in _NOT_PAIR.
    for m in _RUN_RE.finditer(text):
        words = m.group().split()  # the tokens, as _TOK_RE finds them
        lows = [w.lower() for w in words]
        ok = [lw not in _NOT_PAIR for lw in lows]
        folds = [lw if w.isascii() else _fold(w) for w, lw in zip(words, lows, strict=True)]
        pairs = []  # (first token, last token)
        i, n = 0, len(words)
        while i < n - 1:
            if ok[i] and folds[i] in given:
                if i + 2 < n and ok[i + 1] and ok[i + 2] and folds[i + 2] in family:
                    pairs.append((i, i + 2))
                    i += 3
                    continue
                if ok[i + 1] and folds[i + 1] in family:
                    pairs.append((i, i + 1))
                    i += 2
                    continue
            i += 1
        if pairs:
            toks = list(_TOK_RE.finditer(text, m.start(), m.end()))
            out += [(toks[i].start(), toks[j].end()) for i, j in pairs]
    return cued, out


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
# A German street suffix before a house number ("hauptstr. 5"), in the lower case.
_DE_HINT_RE = re.compile("(?:" + "|".join(map(re.escape, _DE_SUFFIX)) + r")\s*[0-9]")
_EN_STREET_SET = frozenset(_EN_STREET)
_LETTER_RUN_RE = re.compile(r"[^\W\d_]+")
_UNIT_SET = frozenset(("flat", "apt", "apartment", "suite", "unit", "studio"))  # en_unit's
# A house or unit number before a space ("12b ", "12, ", "12bis "): in every match of the
# English patterns and of the French one but its bare form ("rue de ...").
_HOUSE_NUMBER_RE = re.compile(r"[0-9](?:[a-z]|bis|ter)?,?\s")
# The first run of letters of each French voie type ("av." -> "av", "rond-point" -> "rond").
_FR_VOIE_SET = frozenset(re.match(r"[^\W\d_]+", v).group() for v in _FR_VOIE)
_STREET_WORDS = _EN_STREET_SET | _UNIT_SET | _FR_VOIE_SET
# Every byte but the ASCII letters -> a space: letter runs by one table pass and a split.
_LETTERS_ONLY = bytes(b if b < 128 and chr(b).isalpha() else 32 for b in range(256))
# A capitalized word after whitespace: every name the cased name patterns can return
# contains one that is not in _NOT_NAMES (after a cue or a title, or the second word of a
# "Given Family" pair), or stands before "here" / "speaking".
# (Written capital first: re finds the few capitals faster than it tries every space.)
_CAP_AFTER_SPACE_RE = re.compile(r"[A-ZÀ-ÖØ-Þ](?<=\s[A-ZÀ-ÖØ-Þ])[\w'’-]*")
_NOT_NAMES_AS_WRITTEN = frozenset(f(w) for w in _NOT_NAMES for f in (str.capitalize, str.upper))

# The gates below only skip work: each returns False only when its patterns cannot match
# (tests/test_pii.py checks detections with every gate open). _street_starts, like
# _cue_starts, reads the lower case, so it stays open where that does not match like
# re.IGNORECASE.


def _may_hold_cased_name(text: str, low: str) -> bool:
    """Whether the cased name patterns can find a name: a 1 us test in front of the name
    search, which most messages fail."""
    if "here" in low or "speaking" in low:
        return True
    words = _CAP_AFTER_SPACE_RE.findall(text)
    # Most are "I" or a capitalized or upper-case _NOT_NAMES word, found without lower().
    if _NOT_NAMES_AS_WRITTEN.issuperset(words):
        return False
    return not _NOT_NAMES.issuperset(map(str.lower, words))


def _words(text: str, low: str) -> list[str]:
    """The lower-cased words (runs of letters) the gates below look up."""
    if text.isascii():
        return low.encode().translate(_LETTERS_ONLY).decode().split()
    return _LETTER_RUN_RE.findall(low)


_NO_STREET = (None, None, None, None)


def _street_starts(
    text: str, low: str, caseless: bool, digits: tuple[int, int] | None
) -> tuple[int | None, ...]:
    """Where each address pattern (en, en_unit, fr, de) can first match; None: nowhere.
    Each needs its street word, a whole word for the English and French ones (spaces or a
    word's end around it) and for German a word ending before a house number ("hauptstr.
    5"); en_unit also a unit word; all but the bare French form (only in text with case)
    a house number. ``digits``: where the first and the last ASCII digit are ((0,
    len(text)) if unknown), None if there is none."""
    if not _lower_is_ignorecase(text):
        return 0, 0, 0, 0
    if digits is None:  # only the bare French form can match, with a voie type ("rue de ...")
        return (None, None, 0, None) if not caseless and _VOIE_HINT_RE.search(low) else _NO_STREET
    first_digit, last_digit = digits
    # German: a suffix, spaces, a digit. The suffix ends where the spaces before some digit
    # start, so not before they start in front of the first one; it has 8 letters at most.
    de_from = max(len(low[:first_digit].rstrip()) - 8, 0)
    de = _DE_HINT_RE.search(low, de_from, last_digit + 1) is not None
    house = _HOUSE_NUMBER_RE.search(low, first_digit, last_digit + 6)  # 6 characters at most
    if house is None:
        fr = not caseless and _VOIE_HINT_RE.search(low) is not None
        return None, None, 0 if fr else None, 0 if de else None
    hits = _STREET_WORDS.intersection(_words(text, low))  # most messages hold none
    en = not hits.isdisjoint(_EN_STREET_SET)
    en_unit = en and not hits.isdisjoint(_UNIT_SET)
    fr = not hits.isdisjoint(_FR_VOIE_SET)
    # An English match starts at its first number (at most 5 digits before the house hint
    # of its last one) or at a unit word before it: 9 letters at most, and spaces.
    first = max(len(low[: max(house.start() - 5, 0)].rstrip()) - 9, 0)
    return first if en else None, first if en_unit else None, 0 if fr else None, 0 if de else None


def _lower_same_length(text: str) -> str:
    # str.lower() can lengthen text ("İ" -> "i̇"); offsets must survive, so lower per char.
    if text.isascii():
        return text.lower()
    return "".join(c if len(lc := c.lower()) != 1 else lc for c in text)


def _apart(found: list[tuple[int, int, str]]) -> list[tuple[int, int, str]] | None:
    """The candidates in order, if none is empty and none overlaps another (the same span
    found twice counts once), as in most messages: then resolving them by priority keeps
    every one. Else None."""
    if len(found) == 1:
        return found if found[0][0] < found[0][1] else None
    found = sorted(set(found))
    end = 0
    for s, e, _ in found:
        if s < end or s >= e:
            return None
        end = e
    return found


def _case_forms(text: str) -> tuple[bool, str, str]:
    """Whether ``text`` is without case (no upper-case or no lower-case letter); the text
    the patterns read (its lower case then, of the same length); its lower case."""
    if text.isascii():  # as below, by whole-string operations
        low = text.lower()
        caseless = low == text or text.isupper()  # no upper case, or no lower case
        return caseless, low if caseless else text, low
    caseless = _is_caseless(text)
    scan = _lower_same_length(text) if caseless else text
    return caseless, scan, scan if caseless else text.lower()


def rule_name_spans(text: str) -> tuple[bool, list[tuple[int, int]]]:
    """Whether ``text`` is without case, and the spans the cue rules take for names (a
    feature of the name model, see ``pii.model``)."""
    caseless, scan, low = _case_forms(text)
    if not (caseless or _may_hold_cased_name(text, low)):
        return caseless, []
    cued, pairs = _names(scan, caseless, _cue_starts(scan, low, caseless))
    return caseless, cued + pairs


def _address_rules(
    text: str, scan: str, low: str, caseless: bool, digits: tuple[int, int] | None
) -> list[tuple[int, int]]:
    """The spans the address patterns match (a feature of the address model)."""
    street = _street_starts(text, low, caseless, digits)
    if street is _NO_STREET:
        return []
    out = []
    for rx, start in zip(_ADDRESS_CASELESS if caseless else _ADDRESS_CASED, street, strict=True):
        if start is not None:
            out += [
                m.span()
                for m in rx.finditer(scan, start)
                if not caseless or not _STOP_LOWER.intersection(m.group().split())
            ]
    return out


def rule_address_spans(text: str) -> list[tuple[int, int]]:
    """The spans the address patterns match in ``text`` (for training the address model)."""
    caseless, scan, low = _case_forms(text)
    return _address_rules(text, scan, low, caseless, (0, len(text)))


@functools.cache
def _token_model(kind: str):
    from pii.model import TokenModel

    return TokenModel.load(kind=kind)


def _identifiers(text: str) -> tuple[list[tuple[int, int, str]], tuple[int, int] | None]:
    """The pattern-and-validator detections (e-mails, IBANs, IDs, cards, SSNs, IPs,
    phones) of ``text``, and where its first and last ASCII digits are (None: no digit;
    see _street_starts)."""
    found: list[tuple[int, int, str]] = []
    # Cheap gates first: most messages have no "@", no digit run, no colon, and a regex
    # pass over them costs more than these scans.
    if "@" in text:
        found += [(*m.span(), "EMAIL") for m in _EMAIL_RE.finditer(text, _email_from(text))]
    # ASCII digits only: every number pattern below reads [0-9] (NFKC made full-width
    # digits ASCII). Card, PRC ID, SSN and phone numbers all have 9 digits or more. Counted
    # in UTF-8 (whose multi-byte characters hold no ASCII byte) with each digit written as
    # "0" by one table pass; in ASCII text, byte and character positions agree.
    marked = text.encode("utf-8", "surrogatepass").translate(_DIGITS_AS_0)
    n_digits = marked.count(b"0")
    digits = None  # the first and the last digit's positions (see _street_starts)
    if n_digits:
        if len(marked) == len(text):
            digits = (marked.find(b"0"), marked.rfind(b"0"))
            zone = (digits[0] - 1, digits[1] + 3)  # see _matches
        else:  # positions unknown
            digits = zone = (0, len(text))
        found += _iban_spans(text, zone)
        if n_digits >= 4 and text.count(".") >= 3:
            found += _valid(_IPV4_RE, "IP_ADDRESS", _ip_ok, text, zone)
        for need, rx, entity, ok in _VALIDATED:  # (as _valid, without its call layers)
            if n_digits >= need:
                for m in _matches(rx, text, zone):
                    if ok(m.group()):
                        found.append((*m.span(), entity))
        if n_digits >= 9:
            found += _phone_spans(text, zone, n_digits)
        if n_digits >= 7:  # national formats, checked by libphonenumber (pii_phones)
            found += [(s, e, "PHONE~phone-shapes+libphonenumber") for s, e in phone_spans(text, n_digits)]
        if n_digits >= 12:  # 12-digit Maestro numbers and cards in any grouping
            found += [(s, e, "CARD~card-pattern+luhn+iin") for s, e in card_spans(text, n_digits)]
    if text.count(":") >= 2:  # IPv6 needs no digit
        found += _valid(_IPV6_RE, "IP_ADDRESS", _ip_ok, text, (0, len(text)))
    return found, digits


# A number that can be a house number: 1 to 6 digits, not an amount ("$20", "12.50",
# "1,250", "15%"). A superset of the numbers pii_model.candidates reads as house numbers
# (which also skips those after a currency sign and a space).
_HOUSE_NUMBER_HINT_RE = re.compile(r"(?<![0-9.,$£€¥₹])[0-9]{1,6}(?![0-9%]|[.,][0-9])")


def _may_hold_address(text: str, found: list[tuple[int, int, str]]) -> bool:
    """Whether some number of ``text`` can be a house number outside the identifiers
    found: the address model reads no other message."""
    for m in _HOUSE_NUMBER_HINT_RE.finditer(text):
        p = m.start()
        if not any(s <= p < e for s, e, _ in found):
            return True
    return False


def identifier_spans(text: str) -> list[tuple[int, int]]:
    """Where the identifiers of ``text`` are: no address is read inside them (for
    training the address model as detect runs it)."""
    return [(s, e) for s, e, _ in _identifiers(text)[0]]


def detect(text: str) -> list[Detection]:
    """All PII in ``text``, non-overlapping, in order of position."""
    if not text:
        return []
    found, digits = _identifiers(text)
    caseless, scan, low = _case_forms(text)
    toks = None  # tokenized once, for whichever model needs it
    rules = _address_rules(text, scan, low, caseless, digits)  # (gated inside)
    if digits is not None and _may_hold_address(text, found):
        # Every address the model finds has a number.
        toks = tokenize(text)
        blocked = [(s, e) for s, e, _ in found]
        found += [
            (s, e, "ADDRESS~address-model")
            for s, e in _token_model("ADDRESS").spans(text, caseless, rules, blocked, toks)
        ]
    # The patterns also stand on their own: in text with case all of them (the bare
    # French form "rue de Leblanc" has no number); without case those with a house number
    # and a street name besides the street type ("134 james creek", not "top 10 ways").
    found += [
        (s, e, "ADDRESS")
        for s, e in rules
        if not caseless or address_like(text[s:e].split())
    ]
    cued, pairs = (
        _names(scan, caseless, _cue_starts(scan, low, caseless))
        if caseless or _may_hold_cased_name(text, low)
        else ([], [])
    )
    name_model = _token_model("PERSON")
    if name_model.may_find(text, caseless):
        toks = toks or tokenize(text)
        found += [
            (s, e, "PERSON~name-model")
            for s, e in name_model.spans(text, caseless, cued + pairs, (), toks)
        ]
    if not caseless:  # cues and titles in text with case ("Dr. Luke McDonald"); without
        found += [(s, e, "PERSON") for s, e in cued]  # case they mask "signed up"

    if not found:
        return []
    if (apart := _apart(found)) is not None:
        return [_detection(text, s, e, ent) for s, e, ent in apart if ent != "_BLOCK"]
    found.sort(key=lambda d: (PRIORITY[d[2].partition("~")[0]], d[0] - d[1], d[0]))
    taken: list[tuple[int, int]] = []
    out = []
    for s, e, ent in found:
        if s >= e:
            continue
        for ts, te in taken:
            if s < te and ts < e:  # overlaps a span taken before
                break
        else:
            taken.append((s, e))
            if ent != "_BLOCK":
                out.append((s, e, ent))
    # Sorted as tuples: the spans do not overlap, so this is the order of the Detections.
    return [_detection(text, s, e, ent) for s, e, ent in sorted(out)]


# --------------------------------------------------------------------------- masking


_LEADING_TITLE_RE = re.compile(rf"^(?i:{_TITLES})\s+")


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
        value = _LEADING_TITLE_RE.sub("", value)
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

# Patterns whose presence after desensitization is a leak whatever the context: they cannot
# be mistaken for a decoy (SSN area/group/serial rules, strict IPv4 octets, "+CC" phones).
RESIDUAL_PATTERNS = {
    "EMAIL": r"[A-Za-z0-9._%+-]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)*\.[A-Za-z]{2,}",
    "US_SSN": r"(^|[^0-9-])(?!000|666|9[0-9][0-9])[0-9]{3}-(?!00)[0-9]{2}-(?!0000)[0-9]{4}([^0-9-]|$)",
    "IP_ADDRESS": r"(^|[^0-9.])((25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}"
    r"(25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])([^0-9.]|$)",
    "PHONE": r"(^|[^\w+])\+[1-9][0-9]{0,2}[ .-]?\(?[0-9]{1,5}\)?[ .-]?[0-9]{2,}[ .-]?[0-9]{2,}",
}
