"""PII detection and masking for customer messages: rules, validators, token models.

What: ``detect(text)`` finds person names, e-mails, phone numbers, payment cards, IBANs,
US SSNs, PRC resident IDs, street addresses and IP addresses, each ``Detection`` naming
the rule or model that found it (``source``); ``mask(text, mode, key)`` replaces each
with a typed placeholder (``<EMAIL>``) or a keyed pseudonym (``<EMAIL_3f9a0c17d2>``,
HMAC-SHA256 of the canonical value); ``mask_series`` does it for a pandas Series (the
Spark job calls it from ``mapInArrow``).

How, per type:

* identifiers (card, IBAN, SSN, PRC ID, IP) are found by shape (``pii.identifiers``)
  and kept only if their check digits or structure validate (``pii.checksums``,
  ``ipaddress``): a 16-digit order number that fails Luhn stays as it is;
* phones by national shapes (NANP, UK, DE, FR, CN, any ``+CC``) with a digit-count
  bound, and, in ``pii.phones``, national formats of many countries checked with
  libphonenumber; 12-digit Maestro cards by Luhn and their issuer prefix there too;
* addresses by the ADDRESS token model (``pii.model``) near a house number, and by the
  patterns of ``pii.addresses``: house number + street words + a street-type lexicon
  (USPS Publication 28 suffixes; French voie types; German ``-straße``/``-weg``/...
  compounds), unit prefixes (Flat, Apt., Suite, Studio) and an optional trailing city; in
  text without case a pattern's match stands alone only with a street name besides the
  type;
* address parts the patterns and the model leave out (``pii.addresses.address_parts``):
  a country line's postcode, a building number before the house number, an
  intersection's second street, a town and postcode on the street's line ("10 downing
  st, london sw1a 2aa"; not over another type's span); an address the model ran over the
  name line before it ("Mrs. Madeline MacMahon Suite 787 ...") starts after the name;
* names by the PERSON token model (a name-frequency prior, the word's shape and context),
  which reads the cue rules of ``pii.names`` as features: a cue ("my name is", "regards,",
  "on behalf of", a title "Mr.", ...) followed by capitalized name tokens (with
  particles: van, de, von, da, ...), or, without a cue, a "Given Family" pair from the US
  Census name lists (the ``names`` package). In text with case the cued names also stand
  alone. A name runs across a middle initial ("Julio A McDonald") but not across a line
  break; a country's name is no person unless it is also a given name ("Jordan");
  casual phrasings and lists of names are ``pii.phrases``'; a first name rare in English
  as a verb's subject or first object ("what if jake loses the card", "can wes use my
  card", "i gave tyler my old card") is ``pii.clauses``', which reads English grammar
  from a trimmed lexicon (``pii/data/lexicon.tsv.gz``), as is a name of any country after
  a cue that says a person follows ("said khasanbek", "producer nate p. sage").

Why no NER model: none installs offline from the package registries here (spaCy and
Hugging Face models download at run time); Presidio's own recognizers for these types
are regexes plus the same validators. ``benchmarks/pii_eval.py`` measures both on text
nobody here wrote.

Input is expected NFKC-normalized (the clean stage does it); ``mask`` normalizes text
that is not, so full-width digits are still found.

This module holds the entry points (``detect``, ``mask``, ``redact``, ``mask_series``),
``Detection``, the type tables and the overlap resolution; the spans come from
``pii.identifiers`` (with ``pii.phones``, ``pii.checksums``), ``pii.addresses``,
``pii.names``, ``pii.phrases``, ``pii.clauses`` and the token models of ``pii.model``;
pseudonyms from ``pii.pseudonyms``.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass
from typing import TYPE_CHECKING

# Imported "X as X": re-exports, not used here. pii.model, tools/pii_token_models.py and
# tests/test_pii.py read them as ``pii.<name>`` (``from pii import detector as pii``);
# canonical, identifier_spans and the rule_*_spans were defined here before the split.
from pii.addresses import _ADDRESS_CASED as _ADDRESS_CASED
from pii.addresses import _ADDRESS_CASELESS as _ADDRESS_CASELESS
from pii.addresses import _DE_END as _DE_END
from pii.addresses import _DE_SUFFIX as _DE_SUFFIX
from pii.addresses import _EN_STREET as _EN_STREET
from pii.addresses import _EN_STREET_SET as _EN_STREET_SET
from pii.addresses import _FR_VOIE as _FR_VOIE
from pii.addresses import _SUFFIX_EN as _SUFFIX_EN
from pii.addresses import (
    _address_rules,
    _country_names,
    _may_hold_address,
    address_parts,
    corner_spans,
    cued_address_spans,
)
from pii.addresses import rule_address_spans as rule_address_spans
from pii.casing import _case_forms, message_words
from pii.casing import _is_caseless as _is_caseless
from pii.casing import _lower_is_ignorecase as _lower_is_ignorecase
from pii.clauses import clause_name_spans, family_name_after
from pii.identifiers import _IBAN_READ_RES as _IBAN_READ_RES
from pii.identifiers import _IBAN_SHAPE_RE as _IBAN_SHAPE_RE
from pii.identifiers import _IBAN_START_RE as _IBAN_START_RE
from pii.identifiers import _identifiers
from pii.identifiers import identifier_spans as identifier_spans
from pii.model import address_like, tokenize
from pii.names import _CAP_AFTER_SPACE_RE as _CAP_AFTER_SPACE_RE
from pii.names import _CUED_CASED_RE as _CUED_CASED_RE
from pii.names import _CUED_CASELESS_RE as _CUED_CASELESS_RE
from pii.names import _NOT_NAMES, _cue_starts, _may_hold_cased_name, _names
from pii.names import _RUN_RE as _RUN_RE
from pii.names import _TITLES as _TITLES
from pii.names import rule_name_spans as rule_name_spans
from pii.phrases import (
    list_name_spans,
    name_pair_spans,
    phrase_name_spans,
    repeated_name_spans,
    title_name_spans,
)
from pii.pseudonyms import canonical as canonical
from pii.pseudonyms import pseudonym

if TYPE_CHECKING:
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


@functools.cache
def _token_model(kind: str):
    from pii.model import TokenModel

    return TokenModel.load(kind=kind)


# What follows a name at the head of a postal address: a unit word, or a house number
# on the next line or after a comma ("Joaquin Suarez 2906" is a street and its number).
_ADDRESS_HEAD_RE = re.compile(
    r"[ \t]*(?:(?i:suite|ste|apt|apartment|flat|unit|room|floor|studio|p\.?\s?o\.?\s?box)\b"
    r"|(?:,|\n)\s*\d)"
)


def _names_before_addresses(
    text: str, found: list[tuple[int, int, str]]
) -> list[tuple[int, int, str]]:
    """An address that begins with the name in front of it ("Mrs. Madeline MacMahon Suite
    787 33150 Lozerlaan 172", the address model reading the name line as a street's
    words) starts after the name instead, when a unit word follows the name or a house
    number does on the next line or after a comma: else the address, which wins an
    overlap, would swallow the name. A street named after someone stays whole ("Joaquin
    Suarez 2906", "Tom Wilhelmsens vei 83")."""
    persons = [(s, e) for s, e, ent in found if ent.startswith("PERSON")]
    if not persons or not any(ent.startswith("ADDRESS") for *_, ent in found):
        return found
    out = []
    for s, e, ent in found:
        if ent.startswith("ADDRESS"):
            for ps, pe in persons:
                if ps <= s < pe < e and (m := _ADDRESS_HEAD_RE.match(text, pe)):
                    rest = m.start()
                    while rest < e and not text[rest].isalnum():
                        rest += 1
                    if address_like(text[rest:e].split()):
                        s = rest
                    break
        out.append((s, e, ent))
    return out


# A line break, or an export's escaped one (the two characters "\n"; "\N" too in text
# without case, upper-cased after it was escaped).
_LINE_BREAK_RE = re.compile(r"\n|\\n")
_LINE_BREAK_CASELESS_RE = re.compile(r"\n|\\[nN]")
# A word of a name line: a name, an initial ("A", "J."), with hyphens and apostrophes.
_NAME_LINE_WORD_RE = re.compile(r"[^\W\d_](?:[\w'’-]*[^\W\d_])?\.?")


def _lines(text: str, breaks: re.Pattern[str]) -> list[tuple[int, int]]:
    """(start, end) of each line of ``text``, split at ``breaks``."""
    lines, pos = [], 0
    for m in breaks.finditer(text):
        lines.append((pos, m.start()))
        pos = m.end()
    lines.append((pos, len(text)))
    return lines


def _name_line(text: str, s: int, e: int, caseless: bool) -> tuple[int, int] | None:
    """The span of the line ``text[s:e]`` (leading marks such as "}}" or "???" skipped) if it
    reads as a person's name: 1 to 4 words of letters, each capitalized in text with case,
    no closed-class word, the words that are no initials name candidates (not a common
    English word unless a common name: ``pii.model.person_candidate``)."""
    from pii.model import person_candidate

    while s < e and not text[s].isalnum():
        s += 1
    while e > s and text[e - 1] in " \t.,":
        e -= 1
    words = text[s:e].split()
    if not 1 <= len(words) <= 4 or not all(_NAME_LINE_WORD_RE.fullmatch(w) for w in words):
        return None
    full = [w.rstrip(".") for w in words if len(w.rstrip(".")) > 1]
    if not full or (not caseless and not all(w[0].isupper() for w in words)):
        return None
    lows = [w.lower() for w in full]
    if any(w in _NOT_NAMES for w in lows) or not all(person_candidate(w) for w in lows):
        return None
    return s, e


def _addressees(text: str, found: list[tuple[int, int, str]], caseless: bool) -> list[tuple[int, int]]:
    """The name line at the head of a postal address block: the block's first line (the
    message's, or after a blank line), above the address's first line or above one more
    line without digits (a company's: "Makkal A Sheripov\nLumen Technologies Inc.\n0028
    Norra Larsmovägen 12"), when it reads as a name (``_name_line``): "Pomeroy
    Lemelin\n\n2016 Via Solfatara 21\n Suite 423 ...". The envelope's convention, in
    cased text and without case."""
    heads = sorted(s for s, _, ent in found if ent.startswith("ADDRESS"))
    breaks = _LINE_BREAK_CASELESS_RE if caseless else _LINE_BREAK_RE
    if not heads or not breaks.search(text, 0, heads[-1]):
        return []
    lines = _lines(text, breaks)

    def blank(i: int) -> bool:
        return not any(c.isalnum() for c in text[lines[i][0] : lines[i][1]])

    out = []
    for head in heads:
        li = next((i for i, (ls, le) in enumerate(lines) if ls <= head <= le), None)
        if li is None or any(c.isalnum() for c in text[lines[li][0] : head]):
            continue  # the address starts inside an escaped break, or not at its line's start
        j = li - 1
        while j >= 0 and blank(j):
            j -= 1
        for _ in range(2):  # the name line, or a company's line and the name line above it
            if j < 0:
                break
            first = j == 0 or blank(j - 1)
            if first and (span := _name_line(text, *lines[j], caseless)):
                out.append(span)
                break
            if any(c.isdigit() for c in text[lines[j][0] : lines[j][1]]) or first:
                break
            j -= 1
    return out


def _no_town_lines(
    text: str, found: list[tuple[int, int, str]], caseless: bool
) -> list[tuple[int, int, str]]:
    """Without a guessed name that fills a postal block's town line: below a name line and
    a blank line, right above a country's line (and postcode): "Željko Jovanović\n\nSão
    Paulo\nBrazil", "Arnaude L'Heureux\n\nRancho Santa Margarita\nUnited States".
    Not "hi\nLayla Bird\nBrazil" (no blank line above)."""
    persons = [(s, e) for s, e, ent in found if ent.startswith("PERSON")]
    if len(persons) < 2:
        return found
    breaks = _LINE_BREAK_CASELESS_RE if caseless else _LINE_BREAK_RE
    lines = _lines(text, breaks)
    if len(lines) < 4:
        return found
    countries = _country_names()

    def words(i: int) -> str:
        return " ".join(text[lines[i][0] : lines[i][1]].strip(" \t.,;:!?-}{[]()*#>").split())

    out = []
    for s, e, ent in found:
        if ent in _GUESSED_NAMES:
            k = next((i for i, (ls, le) in enumerate(lines) if ls <= s and e <= le), None)
            if (
                k is not None and 2 <= k < len(lines) - 1
                and not any(c.isdigit() for c in words(k))
                and not words(k - 1)
                and any(lines[k - 2][0] <= ps and pe <= lines[k - 2][1] for ps, pe in persons)
                and words(k + 1).rstrip("0123456789 ").lower() in countries
            ):
                continue
        out.append((s, e, ent))
    return out


def _with_family_names(
    text: str, found: list[tuple[int, int, str]], caseless: bool
) -> list[tuple[int, int, str]]:
    """Each name with the family name after it that no rule or model took (see
    ``pii.clauses.family_name_after``: "kira mitchell" where the model found "kira"),
    unless another span starts there."""
    if not any(ent.startswith("PERSON") for *_, ent in found):
        return found
    starts = {s for s, _, _ in found}
    out = []
    merged: set[tuple[int, int, str]] = set()  # names the extension took in ("Roxy van" + "Torre")
    for s, e, ent in found:
        if ent.startswith("PERSON") and e < len(text) and text[e] == " " and (e + 1) not in starts:
            e2 = family_name_after(text, e, caseless)
            inside = [d for d in found if e < d[0] < e2]
            if e2 > e and all(d[2].startswith("PERSON") and d[1] <= e2 for d in inside):
                merged.update(inside)
                e = e2
        out.append((s, e, ent))
    return [d for d in out if d not in merged] if merged else out


# Countries that are also given names in English: a person when the model says so.
_NAME_COUNTRIES = frozenset(("chad", "georgia", "jordan", "israel", "india", "kenya"))


# Words after which a capitalized or name-like word is a place: "lives in Stora Vika",
# "moved here from São Paulo", "based in Newell".
_PLACE_BEFORE_RE = re.compile(
    r"(?i:\b(?:lives?|living|lived|based|located|situated|born|stationed|holiday|vacation)\s+in"
    r"|\bmoved?\s+(?:here\s+|there\s+)?(?:from|to)|\bmoving\s+(?:to|from)"
    r"|\b(?:flew|flying|fly|travel(?:l?ing|l?ed)?|trip|relocat(?:e|ed|ing))\s+to"
    r"|\b(?:i['’]?m|i\s+am|we['’]?re|we\s+are)\s+(?:now\s+|currently\s+)?in)"
    r"\s+(?:([^\W\d_]+)\s+)?$"  # a place's first word the model left ("stora vika", "são paulo")
)


def _rare_word(low: str) -> bool:
    """Not a common English word (Zipf under 4.5 in the name table, or not in it)."""
    from pii.model import table

    hit = table().get(low)
    return hit is None or hit[2] < 4.5


def _no_countries(text: str, found: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """Without the PERSON spans the token model found on a country's name ("Slovenia",
    "czech republic": the name table holds many countries as rare given names) or right
    after a phrase that names a place ("lives in Stora Vika", "moved here from São
    Paulo"). A span the model starts on an export's escaped line break ("\\nBrazil")
    starts after it."""
    countries = None
    out = []
    for s, e, ent in found:
        if ent in ("PERSON~name-model", "PERSON~name-pair"):
            if s and text[s - 1] == "\\" and text[s] in "nN":
                s += 1  # an export's escaped line break: "\\nBrazil" is "Brazil"
                if s >= e:
                    continue
            if countries is None:
                countries = _country_names()
            low = " ".join(text[s:e].lower().split())
            if low in countries and low not in _NAME_COUNTRIES:
                continue
            m = _PLACE_BEFORE_RE.search(text, max(s - 30, 0), s)
            if m and (m.group(1) is None or _rare_word(m.group(1).lower())):
                continue  # not "a trip to see anna": a common word between is no place's
        out.append((s, e, ent))
    return out


# What ends a company's name: a legal form ("Inc.", "PLC", "GmbH", "Co.Ltd."), or "and
# Sons" / "& Co." before one or at the end. After one or two more capitalized words
# ("Ernst Young LLP", "Douglas Emmett Realty Inc") in text with case; without case, only
# right after.
_ORG_FORMS = (  # in any case
    r"inc|incorporated|corp|corporation|llc|l\.l\.c|ltd|co\.?[ \t]?ltd|plc|llp|gmbh|kgaa|sarl"
    r"|bancorp|bancshares|holdings|s\.a|s\.p\.a|s\.a\.s|s\.a\.r\.l|a\.g"
)
# Common words or names in other uses: as written in text with case ("SA", "Co"); without
# case, only the two-letter forms that no one's name is ("ag", "sa", "nv", "bv", "se").
_ORG_FORMS_AS_WRITTEN = r"Limited|Group|SA|AG|NV|BV|AB|ASA|OYJ|SpA|SE|LP|Co"
_ORG_FORMS_CASELESS = _ORG_FORMS + r"|ag|sa|nv|bv|se|oyj|asa|spa"
_ORG_TAIL = r"(?i:[ \t]*,?[ \t]*(?:and|&)[ \t]+(?:sons|co|company|associates|partners)\b)"
# Between the name and the form: a space (and a comma), or a full stop or a comma alone
# ("Tokyo Tekko Co.,Ltd.", "Aigan Co.Ltd.").
_ORG_SEP = r"(?:[ \t]*,?[ \t]+|[ \t]*[.,][ \t]*)"
_ORG_AFTER_CASED_RE = re.compile(
    rf"(?:[ \t]+[A-Z][\w'’.-]*){{0,2}}?"
    rf"(?:{_ORG_TAIL}|{_ORG_SEP}(?:(?i:{_ORG_FORMS})|{_ORG_FORMS_AS_WRITTEN})\b(?!-))"
)
# Without case, one or two words between that are no function words ("gencan capital
# inc.", "konoshima chemical co.ltd."; not "john at acme inc").
_ORG_MID_CASELESS = (
    r"[ \t]+(?!(?:and|or|the|a|an|of|at|to|from|for|with|in|on|by|is|was|my|your|his|her"
    r"|our|their|me|him|them|us)\b)[^\W\d_][\w'’-]*"
)
_ORG_AFTER_CASELESS_RE = re.compile(
    rf"{_ORG_TAIL}|(?i:(?:{_ORG_MID_CASELESS}){{0,2}}?{_ORG_SEP}(?:{_ORG_FORMS_CASELESS})\b(?!-))"
)
# A legal form as the span's own last word ("Biofrontera AG", "Musee Grevin SA").
# Or glued to the word before it ("The Keiyo BankLtd.", "Maxell HoldingsLtd.").
_ORG_END_CASED_RE = re.compile(
    rf"(?:^|\s)(?:(?i:{_ORG_FORMS})|{_ORG_FORMS_AS_WRITTEN})\.?$|[^\W\d_](?i:ltd)\.?$"
)
_ORG_END_CASELESS_RE = re.compile(rf"(?i:(?:^|\s)(?:{_ORG_FORMS_CASELESS})\.?$|[^\W\d_]ltd\.?$)")
# A company's head noun after a guessed name and up to three more capitalized words
# ("Hyundai Motor Company", "Nuveen Georgia Quality Municipal Income Fund", "Atlas Van
# Lines", "First Trust Dorsey Wright People's Portfolio ETF"), as written in text with
# case; without case only the nouns no one's name runs into ("konoshima pharmaceuticals").
_ORG_HEADS = (
    r"Company|Fund|Trust|Bank|Bancorp|Motors?|Airlines|Airways|Lines|Industries|Technologies"
    r"|Therapeutics|Pharmaceuticals|Pharma|Biosciences|Entertainment|Communications|Financial"
    r"|Capital|Partners|Portfolio|ETF|ETN|Foundation|Institute|University|Hospital|Foods"
    r"|Energy|Systems|Solutions|Software|Labs|Media|Insurance|Realty|Properties|Resources"
    r"|Networks|Logistics|Healthcare|Sciences|Acquisition|Enterprises|Ventures|Investments"
    r"|Securities|Associates|Analytics"
)
_ORG_HEAD_CASED_RE = re.compile(rf"(?:[ \t]+[A-Z][\w'’.&-]*){{0,3}}?[ \t]+(?:{_ORG_HEADS})\b(?!-)")
_ORG_HEAD_CASELESS_RE = re.compile(
    r"(?i:[ \t]+(?:airlines|airways|industries|technologies|therapeutics|pharmaceuticals"
    r"|biosciences|bancorp|realty|etf|etn)\b(?!-))"
)
# A guessed name that starts with a legal form ("Corp. Class B") or after a Japanese one
# ("Kabushiki Kaisha Seiyoken").
_ORG_START_RE = re.compile(r"(?i:(?:corp|inc|ltd|llc|plc|co|kabushiki)\b)")
_ORG_BEFORE_RE = re.compile(r"(?i:kabushiki[ \t]+kaisha[ \t]+)$")
# After a guessed name: "-182" makes it a brand ("Blink-182", "Covid-19").
_BRAND_NUMBER_RE = re.compile(r"-\d")
# After a guessed name, what makes it a place or a thing: a place's noun ("María Albina
# bridge"), or "is a(n) ..." a company's or a work's noun ("Onstar is a design agency",
# "Zoolander is a 1994 American action-comedy film"; not "a film director").
_THING_AFTER_RE = re.compile(
    r"(?i:[ \t]+(?:bridge|river|lake|airport|station|square|mountains?|valley|castle|cathedral"
    r"|museum|stadium)\b"
    r"|[ \t]+(?:is|was)[ \t]+an?[ \t]+(?:[\w-]+[ \t]+){0,5}?(?:company|corporation|bank|agency"
    r"|firm|film|movie|novel|band|brand|restaurant|startup|newspaper|magazine)\b"
    r"(?![ \t]+(?:manager|director|owner|clerk|teller|employee|worker|executive|officer|critic"
    r"|star|producer|analyst|maker)))"
)
# A people's adjective before food or a place ("great Danish food", "a nice new
# Norwegian place"): one word ending as most do, never a name ("tell John food is here").
_PEOPLES_FOOD_RE = re.compile(
    r"(?i:[ \t]+(?:food|cuisine|dishes|cooking|restaurants?|place|wine|beer)\b)"
)
_PEOPLES_END = ("ish", "ian", "ese", "ean", "ic", "ch", "ai", "an", "i")


# A letter alone, perhaps with a full stop.
_LONE_LETTER_RE = re.compile(r"[^\W\d_]\.?")
# The PERSON sources that read a word's likeness to a name, or a casual phrasing ("paid
# Samuel Heath and Sons Ltd"), not a cue that says a name follows ("my name is").
_GUESSED_NAMES = frozenset(
    ("PERSON~name-model", "PERSON~name-list", "PERSON~name-pair", "PERSON~name-phrase",
     "PERSON~name-clause", "PERSON~name-block")
)


def _no_organizations(
    text: str, found: list[tuple[int, int, str]], caseless: bool
) -> list[tuple[int, int, str]]:
    """Without the PERSON spans guessed from the words (the token model, a list, a name
    pair, a casual phrasing) in a company's name ("Johnson Matthey PLC", "Samuel Heath and Sons PLC", "Douglas
    Emmett Inc.", "Biofrontera AG"): the words in front of a legal form, or ending in one;
    nor a brand's ("Blink-182"). Names a phrase says are names ("Dr. ...", "my name is
    ...") stay."""
    if not any(ent in _GUESSED_NAMES for *_, ent in found):
        return found
    after = _ORG_AFTER_CASELESS_RE if caseless else _ORG_AFTER_CASED_RE
    end = _ORG_END_CASELESS_RE if caseless else _ORG_END_CASED_RE
    head = _ORG_HEAD_CASELESS_RE if caseless else _ORG_HEAD_CASED_RE
    return [
        (s, e, ent)
        for s, e, ent in found
        if ent not in _GUESSED_NAMES
        or not (
            after.match(text, e) or end.search(text[s:e]) or _BRAND_NUMBER_RE.match(text, e)
            or head.match(text, e) or _ORG_START_RE.match(text, s)
            or _ORG_BEFORE_RE.search(text, max(0, s - 40), s)
            or _THING_AFTER_RE.match(text, e)
            or (_PEOPLES_FOOD_RE.match(text, e) and " " not in text[s:e] and text[s:e].lower().endswith(_PEOPLES_END))
        )  # fmt: skip
    ]


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
    # Announced by a phrase: "i live on maple street", "send it to 5 the paddock".
    words = message_words(text)  # the words the phrase, grammar and cue rules read
    if cued := cued_address_spans(text, low, digits is not None, words):
        found += [(s, e, "ADDRESS~address-cue") for s, e in cued]
    if "corner" in low:  # "the corner of 86 Pavlou Drandaki St. and Luke Throughway"
        found += [(s, e, "ADDRESS~corner") for s, e in corner_spans(text)]
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
    # Casual phrasings that introduce a name ("call me will", "text bob", "my husband, will,").
    found += [(s, e, "PERSON~name-phrase") for s, e in phrase_name_spans(text, words)]
    # A first name as a verb's subject or object ("what if jake loses the card").
    if clauses := clause_name_spans(text, words):
        found += [(s, e, "PERSON~name-clause") for s, e in clauses]
    # Without case: a first name and a family name side by side ("virginia adkins").
    if caseless:
        found += [(s, e, "PERSON~name-pair") for s, e in name_pair_spans(text, low)]
        if "mr" in low or "ms" in low or "mx" in low or "dr." in low or "prof." in low:
            found += [(s, e, "PERSON~name-title") for s, e in title_name_spans(text)]
    if "," in text:  # the rest of a list of names ("founders: Zweig, Coleman and Gray")
        found += [
            (s, e, "PERSON~name-list")
            for s, e in list_name_spans(
                text, [(s, e) for s, e, ent in found if ent.startswith("PERSON")], caseless
            )
        ]

    # The name line at the head of an address block.
    if (
        digits is not None and ("\n" in text or "\\" in text)
        and any(ent.startswith("ADDRESS") for *_, ent in found)
    ):
        found += [(s, e, "PERSON~name-block") for s, e in _addressees(text, found, caseless)]

    if not found:
        return []
    found = _no_organizations(text, _no_countries(text, found), caseless)
    if "\n" in text or "\\" in text:
        found = _no_town_lines(text, found, caseless)
    # A lone letter is an initial, a share class or a series ("Series H", "ETN U"), not a
    # name: guessed names of one letter go (the cue rules' "Mr. K" stays).
    found = [
        d for d in found
        if d[2] not in _GUESSED_NAMES or not _LONE_LETTER_RE.fullmatch(text, d[0], d[1])
    ]
    # The other mentions of a name found once ("Toby West ... West was influenced").
    found += [
        (s, e, "PERSON~name-repeat")
        for s, e in repeated_name_spans(
            text, [(s, e) for s, e, ent in found if ent.startswith("PERSON")], caseless
        )
    ]
    found = _names_before_addresses(text, address_parts(text, found))
    found = _with_family_names(text, found, caseless)
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
