"""Identifier spans: e-mails, IBANs, PRC resident IDs, payment cards, US SSNs, IP addresses
and phone numbers, found by regex and kept only if their check digits or structure
validate (``pii.checksums``, ``ipaddress``; national phone formats and 12-digit cards come
from ``pii.phones``).

``_identifiers(text)`` returns the candidate spans typed ``"EMAIL"``, ``"CARD"``, ...
(and ``"_BLOCK"`` for IBAN-shaped runs whose check digits fail), for ``pii.detector`` to
resolve against the other types. The number patterns are searched only in the part of the
text that holds digits, from a literal "hint" each (see ``_matches``)."""

from __future__ import annotations

import ipaddress
import re
from typing import TYPE_CHECKING

from pii import checksums as ck
from pii.phones import _DIGITS_AS_0, card_spans, phone_spans

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator


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


# --------------------------------------------------------------------------- per text


def _identifiers(text: str) -> tuple[list[tuple[int, int, str]], tuple[int, int] | None]:
    """The pattern-and-validator detections (e-mails, IBANs, IDs, cards, SSNs, IPs,
    phones) of ``text``, and where its first and last ASCII digits are (None: no digit;
    see ``pii.addresses._street_starts``)."""
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


def identifier_spans(text: str) -> list[tuple[int, int]]:
    """Where the identifiers of ``text`` are: no address is read inside them (for
    training the address model as detect runs it)."""
    return [(s, e) for s, e, _ in _identifiers(text)[0]]
