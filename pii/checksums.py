"""Check-digit generators and validators for identifiers that carry personal data.

What: Luhn (payment card numbers), ISO 13616 IBAN (mod 97-10), US Social Security
numbers (SSA's structural rules) and PRC resident identity numbers (GB 11643-1999,
ISO 7064 MOD 11-2).

Why: the raw-data builder (``demo/builder.py``) plants synthetic but *valid* values
of these kinds, plus look-alike decoys that are not valid, and the PII detector reuses
the validators to tell a real identifier from a number that merely has its shape. So
the validators are strict: exact shape, ASCII digits only (``str.isdigit`` would accept
other scripts' digits), and every rule of the scheme, not just the checksum.

Pure Python, no dependencies. Generators take a ``random.Random`` so callers control
determinism.
"""

from __future__ import annotations

import datetime as _dt
import random
import re

__all__ = [
    "IBAN_LENGTHS",
    "card_number_valid",
    "group",
    "iban_check_digits",
    "iban_valid",
    "luhn_check_digit",
    "luhn_valid",
    "make_card_number",
    "make_iban",
    "make_prc_id",
    "make_us_ssn",
    "prc_id_check_char",
    "prc_id_valid",
    "random_bban",
    "us_ssn_valid",
]

_DIGITS_RE = re.compile(r"[0-9]+")

# --------------------------------------------------------------------------- Luhn


def _luhn_sum(digits: str) -> int:
    # Double every second digit from the right (the rightmost digit is not doubled).
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2 == 1:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total


def luhn_valid(digits: str) -> bool:
    """True if ``digits`` (ASCII digits only, at least two) passes the Luhn check.

    Separators are not accepted here; see ``card_number_valid`` for grouped numbers.
    A single digit is rejected: "0" passes the arithmetic but is no identifier.
    """
    if not isinstance(digits, str) or len(digits) < 2 or not _DIGITS_RE.fullmatch(digits):
        return False
    return _luhn_sum(digits) % 10 == 0


def luhn_check_digit(partial: str) -> str:
    """The digit to append to ``partial`` (ASCII digits) so the result passes Luhn."""
    if not isinstance(partial, str) or not _DIGITS_RE.fullmatch(partial):
        raise ValueError(f"partial must be a non-empty string of ASCII digits: {partial!r}")
    # Appending a check digit shifts every digit of `partial` one place left, so compute
    # the sum as if the check digit were already there (as 0).
    return str((10 - _luhn_sum(partial + "0") % 10) % 10)


# Groups of 4 separated by one space, dash or dot (the way cards are printed and typed);
# the last group may be shorter (13-19 digit numbers). Amex-style 4-6-5 is also common.
_CARD_RE = re.compile(r"[0-9]{13,19}|[0-9]{4}([ .-])[0-9]{4}(?:\1[0-9]{4}){0,2}(?:\1[0-9]{1,4})?")
_AMEX_RE = re.compile(r"[0-9]{4}([ .-])[0-9]{6}\1[0-9]{5}")


def card_number_valid(s: str) -> bool:
    """True for a payment card number: 13-19 ASCII digits passing Luhn, either plain or
    grouped in 4s (or Amex 4-6-5) with one consistent separator (space, dash or dot)."""
    if not isinstance(s, str) or not (_CARD_RE.fullmatch(s) or _AMEX_RE.fullmatch(s)):
        return False
    digits = s.replace(" ", "").replace("-", "").replace(".", "")
    return 13 <= len(digits) <= 19 and luhn_valid(digits)


# Issuer prefixes that look real (Visa, Mastercard, Amex, Discover, Maestro, UnionPay,
# JCB) with the lengths those networks use.
_CARD_BRANDS: tuple[tuple[str, tuple[int, ...]], ...] = (
    ("4", (13, 16, 19)),
    ("51", (16,)),
    ("53", (16,)),
    ("55", (16,)),
    ("2221", (16,)),
    ("34", (15,)),
    ("37", (15,)),
    ("6011", (16, 19)),
    ("6304", (16, 18, 19)),
    ("62", (16, 17, 18, 19)),
    ("3528", (16,)),
)


def make_card_number(
    rng: random.Random, prefix: str | None = None, length: int | None = None
) -> str:
    """A random Luhn-valid card number (digits only). Without ``prefix``/``length`` a
    brand prefix and one of its lengths are drawn."""
    if prefix is None:
        prefix, lengths = rng.choice(_CARD_BRANDS)
        if length is None:
            length = rng.choice(lengths)
    if length is None:
        length = 16
    if not 13 <= length <= 19 or len(prefix) >= length or not _DIGITS_RE.fullmatch(prefix):
        raise ValueError(f"bad card prefix/length: {prefix!r}/{length}")
    body = prefix + "".join(rng.choice("0123456789") for _ in range(length - len(prefix) - 1))
    return body + luhn_check_digit(body)


def group(s: str, size: int = 4, sep: str = " ") -> str:
    """``s`` in groups of ``size`` characters (the last may be shorter)."""
    return sep.join(s[i : i + size] for i in range(0, len(s), size))


# --------------------------------------------------------------------------- IBAN

# Total IBAN length per country (SWIFT IBAN registry). A country not listed is rejected:
# an unknown country code is far more likely a look-alike than a real account.
IBAN_LENGTHS: dict[str, int] = {
    "AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22,
    "BH": 22, "BR": 29, "BY": 28, "CH": 21, "CR": 22, "CY": 28, "CZ": 24, "DE": 22,
    "DK": 18, "DO": 28, "EE": 20, "EG": 29, "ES": 24, "FI": 18, "FO": 18, "FR": 27,
    "GB": 22, "GE": 22, "GI": 23, "GL": 18, "GR": 27, "GT": 28, "HR": 21, "HU": 28,
    "IE": 22, "IL": 23, "IQ": 23, "IS": 26, "IT": 27, "JO": 30, "KW": 30, "KZ": 20,
    "LB": 28, "LC": 32, "LI": 21, "LT": 20, "LU": 20, "LV": 21, "MC": 27, "MD": 24,
    "ME": 22, "MK": 19, "MR": 27, "MT": 31, "MU": 30, "NL": 18, "NO": 15, "PK": 24,
    "PL": 28, "PS": 29, "PT": 25, "QA": 29, "RO": 24, "RS": 22, "SA": 24, "SC": 31,
    "SE": 24, "SI": 19, "SK": 24, "SM": 27, "ST": 25, "SV": 28, "TL": 23, "TN": 24,
    "TR": 26, "UA": 29, "VA": 22, "VG": 24, "XK": 20,
}  # fmt: skip

# BBAN structure for the countries we generate (n = digit, a = upper-case letter,
# c = letter or digit), used both to generate and to validate those countries strictly.
_BBAN_FORMATS: dict[str, tuple[tuple[int, str], ...]] = {
    "AT": ((16, "n"),),
    "BE": ((12, "n"),),
    "CH": ((5, "n"), (12, "c")),
    "DE": ((18, "n"),),
    "DK": ((14, "n"),),
    "ES": ((20, "n"),),
    "FI": ((14, "n"),),
    "FR": ((10, "n"), (11, "c"), (2, "n")),
    "GB": ((4, "a"), (14, "n")),
    "IE": ((4, "a"), (14, "n")),
    "IT": ((1, "a"), (10, "n"), (12, "c")),
    "NL": ((4, "a"), (10, "n")),
    "NO": ((11, "n"),),
    "PL": ((24, "n"),),
    "PT": ((21, "n"),),
    "SE": ((20, "n"),),
}
_CLASS_RE = {"n": "[0-9]", "a": "[A-Z]", "c": "[A-Z0-9]"}
_BBAN_RE = {
    cc: re.compile("".join(f"{_CLASS_RE[k]}{{{n}}}" for n, k in fmt))
    for cc, fmt in _BBAN_FORMATS.items()
}
_IBAN_SHAPE_RE = re.compile(r"[A-Z]{2}[0-9]{2}[A-Z0-9]{11,30}")
_ALNUM_UPPER = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"


def _iban_mod97(rearranged: str) -> int:
    # Letters become two-digit numbers (A=10 .. Z=35); Python's big ints make this exact.
    return int("".join(str(int(ch, 36)) for ch in rearranged)) % 97


def iban_check_digits(country: str, bban: str) -> str:
    """The two ISO 7064 mod 97-10 check digits for ``country`` + ``bban``."""
    return f"{98 - _iban_mod97(bban.upper() + country.upper() + '00'):02d}"


def make_iban(country: str, bban: str) -> str:
    """A valid IBAN (compact, upper case) for a country in ``IBAN_LENGTHS`` and a BBAN of
    that country's length (and structure, where known)."""
    cc, bban = country.upper(), bban.replace(" ", "").upper()
    if cc not in IBAN_LENGTHS:
        raise ValueError(f"unknown IBAN country {country!r}")
    if len(bban) + 4 != IBAN_LENGTHS[cc] or not re.fullmatch("[A-Z0-9]+", bban):
        raise ValueError(f"BBAN {bban!r} does not fit {cc} (IBAN length {IBAN_LENGTHS[cc]})")
    if cc in _BBAN_RE and not _BBAN_RE[cc].fullmatch(bban):
        raise ValueError(f"BBAN {bban!r} does not match the {cc} format")
    return cc + iban_check_digits(cc, bban) + bban


def random_bban(country: str, rng: random.Random) -> str:
    """A random BBAN with the structure of ``country`` (one of the generated countries)."""
    fmt = _BBAN_FORMATS.get(country.upper())
    if fmt is None:
        raise ValueError(f"no BBAN format for {country!r}; known: {sorted(_BBAN_FORMATS)}")
    alphabet = {"n": "0123456789", "a": _ALNUM_UPPER[:26], "c": _ALNUM_UPPER}
    return "".join(rng.choice(alphabet[kind]) for n, kind in fmt for _ in range(n))


def iban_valid(s: str) -> bool:
    """True for a valid IBAN: spaces ignored, case-insensitive, known country with its
    exact length (and BBAN structure where known), check digits 02-98, mod 97 == 1."""
    if not isinstance(s, str):
        return False
    compact = s.replace(" ", "").upper()
    if not _IBAN_SHAPE_RE.fullmatch(compact):
        return False
    cc, check, bban = compact[:2], compact[2:4], compact[4:]
    if IBAN_LENGTHS.get(cc) != len(compact) or not "02" <= check <= "98":
        return False
    if cc in _BBAN_RE and not _BBAN_RE[cc].fullmatch(bban):
        return False
    return _iban_mod97(bban + cc + check) == 1


# --------------------------------------------------------------------------- US SSN

_SSN_RE = re.compile(r"([0-9]{3})-([0-9]{2})-([0-9]{4})|([0-9]{3})([0-9]{2})([0-9]{4})")
# Numbers the SSA voided after they were printed in advertisements (wallet inserts).
_SSN_VOID = frozenset({"078051120", "219099999"})


def us_ssn_valid(s: str) -> bool:
    """True for a structurally valid US SSN, ``AAA-GG-SSSS`` or nine digits: area not 000,
    666 or 900-999; group not 00; serial not 0000; not one of the voided ad numbers."""
    if not isinstance(s, str):
        return False
    m = _SSN_RE.fullmatch(s)
    if not m:
        return False
    area, grp, serial = m.group(1, 2, 3) if m.group(1) else m.group(4, 5, 6)
    if area in ("000", "666") or area >= "900" or grp == "00" or serial == "0000":
        return False
    return area + grp + serial not in _SSN_VOID


def make_us_ssn(rng: random.Random) -> str:
    """A random valid SSN formatted ``AAA-GG-SSSS``."""
    while True:
        area = rng.randint(1, 899)
        out = f"{area:03d}-{rng.randint(1, 99):02d}-{rng.randint(1, 9999):04d}"
        if us_ssn_valid(out):  # rejects 666 and the voided numbers
            return out


# --------------------------------------------------------------------------- PRC ID

_PRC_WEIGHTS = (7, 9, 10, 5, 8, 4, 2, 1, 6, 3, 7, 9, 10, 5, 8, 4, 2)
_PRC_CHECK = "10X98765432"
_PRC_RE = re.compile(r"[0-9]{17}[0-9Xx]")
# First two digits: province-level division codes of GB/T 2260 (incl. 71 Taiwan, 81 Hong
# Kong, 82 Macau, used on residence permits). Anything else is not a PRC ID.
_PRC_PROVINCES = frozenset(
    [
        "11",
        "12",
        "13",
        "14",
        "15",
        "21",
        "22",
        "23",
        "31",
        "32",
        "33",
        "34",
        "35",
        "36",
        "37",
        "41",
        "42",
        "43",
        "44",
        "45",
        "46",
        "50",
        "51",
        "52",
        "53",
        "54",
        "61",
        "62",
        "63",
        "64",
        "65",
        "71",
        "81",
        "82",
    ]
)
# Real county-level codes to generate from (Beijing Dongcheng, Shanghai Xuhui, Shenzhen
# Nanshan, Chengdu Jinjiang, Hangzhou Xihu, Nanjing Xuanwu, Wuhan Wuchang, Tianjin Heping,
# Xi'an Yanta, Guangzhou Tianhe, Chongqing Yuzhong, Harbin Daoli).
_PRC_REGIONS = (
    "110101", "310104", "440305", "510104", "330106", "320102",
    "420106", "120101", "610113", "440106", "500103", "230102",
)  # fmt: skip


def prc_id_check_char(first17: str) -> str:
    """The ISO 7064 MOD 11-2 check character ('0'-'9' or 'X') for 17 ASCII digits."""
    if not isinstance(first17, str) or len(first17) != 17 or not _DIGITS_RE.fullmatch(first17):
        raise ValueError(f"need exactly 17 ASCII digits: {first17!r}")
    return _PRC_CHECK[sum(int(c) * w for c, w in zip(first17, _PRC_WEIGHTS, strict=True)) % 11]


def prc_id_valid(s: str, today: _dt.date | None = None) -> bool:
    """True for an 18-character PRC resident ID: known province code, a real birth date
    (YYYYMMDD, from 1900 up to ``today``) and the MOD 11-2 check character. The check
    character 'X' is accepted in either case (it carries no case information, and
    upper-casing text must not make a valid ID invalid)."""
    if not isinstance(s, str) or not _PRC_RE.fullmatch(s) or s[:2] not in _PRC_PROVINCES:
        return False
    try:
        born = _dt.date(int(s[6:10]), int(s[10:12]), int(s[12:14]))
    except ValueError:
        return False
    if not _dt.date(1900, 1, 1) <= born <= (today or _dt.date.today()):
        return False
    return prc_id_check_char(s[:17]) == s[17].upper()


def make_prc_id(
    rng: random.Random,
    born_from: _dt.date = _dt.date(1940, 1, 1),
    born_to: _dt.date = _dt.date(2007, 12, 31),
) -> str:
    """A random valid PRC resident ID (birth date drawn uniformly from the range)."""
    born = born_from + _dt.timedelta(days=rng.randint(0, (born_to - born_from).days))
    first17 = f"{rng.choice(_PRC_REGIONS)}{born:%Y%m%d}{rng.randint(0, 999):03d}"
    return first17 + prc_id_check_char(first17)
