"""Phone and payment card numbers that ``pii.detector``'s fixed patterns miss.

What:

* ``phone_spans(text)`` finds phone numbers written in national and international formats
  of many countries: "730 064 218", "(73) 4746-3459", "96 466712", "06-82237745",
  "(07700)553419", "0521 61 09 13", "001-680-876-0385", "+46 (0)358 416 87",
  "(415) 555-0123", "555.123.4567 x1234", "1-800-555-0199", "+1 (555) 123-4567". A span
  covers the whole number: a leading "+", parentheses, an extension ("x426", "ext. 12").
* ``card_spans(text)`` finds payment card numbers of 12 to 19 digits that pass Luhn,
  written bare or in groups of four (spaces, dashes or dots; Amex 4-6-5 too). A 12-digit
  number (Maestro) must also start with a Maestro issuer prefix.

How, phones:

1. A gate: fewer than 7 ASCII digits in the text, no phone (most messages stop here).
2. A regex finds candidate runs: digit groups separated by one space, dot or dash (a
   slash only after a trunk-prefixed area code, "0521/610913"), or set off by
   parentheses, with an optional leading "+" or "(+44)" and a trailing extension ("x426",
   "ext. 12"). A run does not start right after a digit and a separator, after "@", "+",
   ".", "_", or after a letter and a dot or dash: it would be the tail of a longer number
   or a code ("INV-2023..."). A letter straight before it is allowed only as an escape
   ("\\n" kept as two characters, which presidio-evaluator's samples hold).
3. Shapes of other numbers are turned down, whatever the digits: 3+ groups of four (card
   numbers, left to the card pattern), dates (2026-11-03, 12/03/2026, 03.11.2026), IPv4
   addresses, SSN shapes (123-45-6789), decimals, amounts (thousand groups "1 500 000",
   "12 500 000", or a currency sign or word next to the run), single-digit groups other
   than a leading trunk or country digit, a year and another number ("2019 2020",
   "2023-123456"), two groups with lengths no phone has (house and street numbers,
   postcodes "29120-320"), the tail of an IBAN written in groups ("NL64 KEEJ 8734 2420
   00"), digits glued to an "@" (an e-mail address), and runs named as another kind of
   number right before them ("Invoice 123-4567", "account number is 0123456789").
4. Address guard: a run that is not clearly a phone (no "+", parentheses, extension,
   North American shape, or trunk "0" with 10+ digits) is turned down after a unit word
   ("Suite 787 33150") or when a word follows it that does not usually follow a phone
   number ("9711 1162 Oost St"), unless a phone cue comes before it and no street type
   follows within three words.
5. What is left is checked with ``phonenumbers`` (libphonenumber): a run with "+" (or the
   international prefix "00") must have a possible length for its country code (trailing
   groups that overflow it are dropped); a national run must be a valid number for one of
   ``REGIONS`` or have the North American 3-3-4 shape (Faker and many documents use area
   codes that do not exist, "(155)792-4991"). libphonenumber alone is a weak filter for
   national numbers (Germany's plan takes most 7-12 digit strings), so the shape rules do
   most of the work.
6. A run written without separators is accepted only with a national prefix shape (a
   trunk "0" and 10-11 digits, a Chinese mobile "1[3-9]" and 11 digits) or a phone cue
   ("call", "phone", "tel", "mobile", "number", "whatsapp", ...) in the 25 characters
   before it; "number" does not count after "account", "card", "order", "licence", ...

How, cards: a run of 12-19 digits, bare or in groups of four with one consistent space,
dash or dot (or Amex 4-6-5), not touching a letter, a digit or another group, nor the tail
of an IBAN. 13-19 digits must pass ``checksums.card_number_valid`` (Luhn), and an 18-digit
number that has a PRC resident ID's structure is left to the ID (as ``pii`` does). 12
digits must pass Luhn (``checksums.luhn_valid``) and start with a Maestro issuer prefix
(``MAESTRO_PREFIXES``), since one random 12-digit number in ten passes Luhn.

Why: ``pii``'s phone patterns know NANP, UK, DE, FR and CN shapes with 10+ digits and
"+CC" numbers; text written by others (presidio-evaluator's Faker phones in many locales,
customers' own messages) also has 7-9 digit numbers, parenthesized trunks, dotted and
dashed national formats and extensions. Its card pattern needs 13+ digits, so 12-digit
Maestro numbers were missed. Both functions are pure (text in, sorted non-overlapping
``(start, end)`` spans out) so ``pii.detect`` can add them as PHONE and CARD candidates,
after its own, and resolve overlaps by its priority.

Speed: messages with fewer than 7 digits (most) cost the digit count only (both functions
together 0.7 us a Banking77 message); libphonenumber (20-30 us a parse and check, up to one
per region in ``REGIONS``) runs only on runs that passed the shape rules, and its answers
are cached per digit string (presidio-evaluator's sentences: 7 us a message on average).
"""

from __future__ import annotations

import functools
import re

import phonenumbers

from pii import checksums as ck

__all__ = ["MAESTRO_PREFIXES", "REGIONS", "card_spans", "phone_spans"]

# Regions a national number (no "+") may belong to; the first that validates it wins, so
# the permissive numbering plans come first (fewer parses per accepted number).
REGIONS = (
    "DE", "GB", "FR", "IT", "ES", "NL", "BE", "AT", "CH", "US", "CA", "PT", "BR", "PL", "CZ",
    "SK", "SE", "NO", "DK", "FI", "HU", "IE", "AU", "NZ", "IN", "CN", "JP", "ZA", "MX", "AR",
    "TN", "EE", "SI", "IS", "GR", "CY", "UY", "GL", "LU", "RO", "HR", "TR", "RU", "UA",
)  # fmt: skip

# Maestro issuer prefixes: the IIN ranges card networks publish (5018, 5020, 5038, 5893,
# 6304, 6759, 6761-6763; 56-58 from the older "50, 56-69" range) and the two more that
# Faker's generator uses (0604, 6390, as faker.providers.credit_card lists them).
MAESTRO_PREFIXES = ("5018", "5020", "5038", "5893", "56", "57", "58", "6304", "6759", "6761",
                    "6762", "6763", "0604", "6390")  # fmt: skip

_DIGITS_AS_0 = bytes.maketrans(b"0123456789", b"0" * 10)


def _n_digits(text: str) -> int:
    """The number of ASCII digits in ``text`` (one table pass over its UTF-8 bytes, whose
    multi-byte characters hold no ASCII byte)."""
    return text.encode("utf-8", "surrogatepass").translate(_DIGITS_AS_0).count(b"0")


# A run starts where a word can (or after an escape such as "\n" kept as two characters),
# not right after "@", "+", "_", "." (decimals, domains), not after a digit and one
# separator (the run would be the tail of a longer one, read from its start instead) and
# not after a letter and a dot or dash (a code like "INV-2023").
_START = r"(?:(?<![0-9A-Za-z@_.+/])|(?<=\\[nrtNRT]))(?<![0-9][ ./-])(?<![A-Za-z][./-])"
_RUN_RE = re.compile(
    _START + r"(?P<run>(?:\+ ?|(?=\(\+))?(?:\(\+?[0-9]{1,5}\)|[0-9]+)"
    # Next groups: "(...)" after an optional separator; digits after one separator, or
    # straight after a ")". Possessive: a run is read once, never split by backtracking.
    r"(?:[ .-]?\([0-9]{1,5}\)|(?:[ ./-]|(?<=\)))[0-9]+)*+)"
    r"(?P<ext> ?(?i:x|ext\.?|extension) ?[0-9]{1,6})?"
    r"(?![0-9A-Za-z@_])"
)
_ITEM_RE = re.compile(r"\(\+?([0-9]+)\)|([0-9]+)|([ ./-])")

_CUE_RE = re.compile(
    r"\b(?:call(?:ing)?|phone|tel|telephone|mobile|mob|cell|cellphone|number|num|text|sms|"
    r"whatsapp|reach|contact|fax|office|desk|ring)\b"
)
# "number" after these is some other number.
_OTHER_NUMBERS = (
    r"(?:account|acct|card|order|ref|reference|tracking|transaction|invoice|iban|sort|"
    r"routing|id|pin|policy|case|ticket|customer|member|serial|confirmation|receipt|"
    r"payment|transfer|swift|bic|cvv|code|passport|licen[cs]e|postcode|zip)"
)
_NOT_PHONE_RE = re.compile(rf"\b{_OTHER_NUMBERS}\b")
# Another kind of number named right before a run: "Invoice 123-4567", "account number
# is 0123456789", "order no.: 5521378".
_OTHER_BEFORE_RE = re.compile(
    rf"\b{_OTHER_NUMBERS}\.?(?:\s*(?:number|num|no\.?|nr\.?|#|id))?\s*(?:is|was|:|#|=)?\s*$",
    re.IGNORECASE,
)
_CURRENCY_BEFORE_RE = re.compile(
    r"(?i:[£$€¥₹₩₽]|\b(?:eur|usd|gbp|chf|sek|nok|dkk|pln|czk|huf|aud|cad|inr|jpy|cny|rs|r\$))"
    r"\s?$"
)
_CURRENCY_AFTER_RE = re.compile(
    r"\s?(?i:[£$€¥₹₩₽%]|(?:eur|euros?|usd|dollars?|gbp|pounds?|quid|chf|francs?|sek|nok|dkk|"
    r"kr|kronor|kroner|pln|zl|zł|czk|kč|huf|ft|forint|aud|cad|inr|rupees?|yen|jpy|cny|yuan|"
    r"rmb|k|m|bn|million|billion)\b)"
)
_YEAR_RE = re.compile(r"(?:19[5-9][0-9]|20[0-4][0-9])")


def _is_date(g: list[str], seps: list[str], i: int) -> bool:
    """Whether groups ``i..i+2``, joined by one separator, read as a date."""
    if seps[i] != seps[i + 1] or seps[i] not in "-./" or not seps[i]:
        return False
    a, b, c = g[i : i + 3]
    if len(a) == 4 and len(b) <= 2 and len(c) <= 2:  # 2026-11-03
        y, m, d = a, b, c
    elif len(a) <= 2 and len(b) <= 2 and len(c) in (2, 4):  # 03.11.2026, 11/03/26
        y, m, d = c, b, a
        if int(m) > 12:  # US order: month first
            m, d = d, m
    else:
        return False
    return (len(y) == 2 or bool(_YEAR_RE.fullmatch(y))) and 1 <= int(m) <= 12 and 1 <= int(d) <= 31


def _other_number(g: list[str], paren: list[bool], seps: list[str]) -> bool:
    """Whether a national run (groups ``g``, separators ``seps`` between them, "" next to
    a parenthesis) has the shape of something other than a phone number."""
    k = len(g)
    if sum(len(x) == 4 for x in g) >= 3 and len(g[0]) == 4:  # card-like groups of four
        return True
    # A slash only after an area code with its trunk "0" ("0521/610913"); else a date, a
    # fraction, a range.
    if "/" in seps[1:] or seps[:1] == ["/"] and not (g[0][0] == "0" and len(g[0]) <= 5):
        return True
    if "." in seps and (k < 3 or any(s != "." for s in seps)):  # decimals, mixed
        return True
    if k == 4 and seps == [".", ".", "."] and all(len(x) <= 3 for x in g):  # IPv4
        return True
    if [len(x) for x in g] == [3, 2, 4] and len(set(seps)) == 1:  # US SSN
        return True
    if any(_is_date(g, seps, i) for i in range(k - 2)):
        return True
    # Single digits: only a leading trunk or country digit ("1-800-...") or "(0)".
    if any(len(x) == 1 and not (i == 0 and k >= 3) and not paren[i] for i, x in enumerate(g)):
        return True
    # Thousands: "1 500 000", "12 500 000", "3.250.000", "100 200 300".
    if (
        k >= 2
        and not any(paren)
        and len(g[0]) <= 3
        and all(len(x) == 3 for x in g[1:])
        and (len(g[0]) == 1 or g[-1].endswith("00"))
    ):
        return True
    # A year and another number: "2023-123456", "2026 1103", "2019 2020".
    if k == 2 and _YEAR_RE.fullmatch(g[0]):
        return True
    return k == 2 and len(g[0]) == 4 == len(g[1]) and bool(_YEAR_RE.fullmatch(g[1]))


@functools.lru_cache(maxsize=4096)
def _valid_national(digits: str) -> bool:
    """Whether ``digits`` is a valid number of one of ``REGIONS``."""
    for region in REGIONS:
        try:
            n = phonenumbers.parse(digits, region)
        except phonenumbers.NumberParseException:
            continue
        if phonenumbers.is_valid_number(n):
            return True
    return False


@functools.lru_cache(maxsize=4096)
def _international(digits: str, valid: bool) -> bool:
    """Whether ``+digits`` has a possible length for its country code (and, if ``valid``,
    is a valid number)."""
    try:
        n = phonenumbers.parse("+" + digits, None)
    except phonenumbers.NumberParseException:
        return False
    return phonenumbers.is_valid_number(n) if valid else phonenumbers.is_possible_number(n)


def _two_groups_ok(a: str, b: str) -> bool:
    """Whether a number written as two groups ``a b`` has a phone's lengths: "478 0780",
    "9962 2821", "26 694711", "0493-6561181", "07700 900461", and an Indian mobile as it
    is written, "98765 43210" (libphonenumber checks it as any other)."""
    if a[0] == "0":
        return len(a) <= 5 and len(b) >= 4
    if len(a) == len(b) == 5:
        return a[0] in "6789"
    return len(a) <= 4 and len(b) in (4, 6, 7, 8)


def _nanp_shape(g: list[str], paren: list[bool], seps: list[str]) -> bool:
    """(415) 555-0123, (155)792-4991, 415-555-0123, 415.555.0123, 1-800-555-0199."""
    if len(g) == 4 and g[0] == "1" and not paren[0]:
        g, paren, seps = g[1:], paren[1:], seps[1:]
    if [len(x) for x in g] != [3, 3, 4] or paren[1] or paren[2]:
        return False
    return paren[0] and seps[1] in "- " or seps[0] == seps[1] and seps[0] in "-."


def _cue_before(text: str, start: int) -> bool:
    """Whether a phone cue word is in the 25 characters before ``start`` (and no word
    that names another kind of number follows it)."""
    window = text[max(0, start - 25) : start].lower()
    cues = list(_CUE_RE.finditer(window))
    if not cues:
        return False
    cue = cues[-1]
    if cue.group() in ("number", "num"):
        before = window[: cue.start()].split()
        if before and _NOT_PHONE_RE.fullmatch(before[-1].strip(".,:;!?()")):
            return False
    return not _NOT_PHONE_RE.search(window, cue.end())


_WORD_AFTER_RE = re.compile(r"[ \t]+([^\W\d_][\w'’]*)")
_FINE_AFTER = frozenset("""
and or but please pls plz thanks thank thx ty cheers if is was as for to from now today
tonight tomorrow anytime whenever later soon morning afternoon evening weekdays weekends
after before between during until till at on in instead too also again back asap ok
okay when so which that its it's it i im i'm cant can't cannot can will would you we they
he she my me not no call ring text sms whatsapp mobile cell home work office fax landline
number anymore any with by ext extension x yet though because since regarding about re
has have had does did do should could might may must only just still
""".split())  # fmt: skip
# Street types (English, French, German, Dutch, Nordic, Italian, Spanish, Portuguese,
# Polish, Hungarian): a street name after a run makes it a house number.
_STREET_TYPES = frozenset("""
street st road rd avenue ave av lane ln drive dr way boulevard blvd court ct place pl
circle cir square sq terrace crescent close grove gardens park parkway pkwy highway hwy
alley row hill mews walk rue chemin allée allee impasse quai strasse straße str weg gasse
platz ring laan straat plein dreef kade vej gade gatan vägen veien gate via viale piazza
corso calle avenida rua travessa largo praça ulica ul út utca
""".split())  # fmt: skip
_WORDS_RE = re.compile(r"[^\W\d_]+")
_UNIT_BEFORE_RE = re.compile(
    r"\b(?:suite|ste|apt|apartment|unit|flat|box|bldg|building|floor|room|house|lot|"
    r"quadra|lote|bloco|casa)\.?\s*$",
    re.IGNORECASE,
)
# The groups of an IBAN before a run: "NL64 KEEJ " before "8734 2420 00".
_IBAN_BEFORE_RE = re.compile(r"\b[A-Za-z]{2}[0-9]{2}(?: [A-Za-z0-9]{4}){0,7} $")


def _address_next_to(text: str, start: int, end: int) -> bool:
    """Whether the run ``text[start:end]`` comes after a unit word ("Suite"), or is
    followed by a word that does not usually follow a phone number (a street name) while
    no phone cue comes before it or a street type follows within three words."""
    if _UNIT_BEFORE_RE.search(text, max(0, start - 12), start):
        return True
    w = _WORD_AFTER_RE.match(text, end)
    if not w or w.group(1).lower() in _FINE_AFTER:
        return False
    after = _WORDS_RE.findall(text, end, end + 40)[:3]
    return not _cue_before(text, start) or any(x.lower() in _STREET_TYPES for x in after)


def _in_iban(text: str, start: int) -> bool:
    """Whether a run at ``start`` continues an IBAN written in groups."""
    return bool(_IBAN_BEFORE_RE.search(text, max(0, start - 45), start))


def _other_noun_before(text: str, start: int) -> bool:
    """Whether a word naming another kind of number ("order", "invoice", "account
    number is") comes right before ``start``."""
    return bool(_OTHER_BEFORE_RE.search(text, max(0, start - 40), start))


def _currency_next_to(text: str, start: int, end: int) -> bool:
    return bool(
        _CURRENCY_BEFORE_RE.search(text[max(0, start - 5) : start])
        or _CURRENCY_AFTER_RE.match(text, end)
    )


def _phone_end(text: str, m: re.Match[str]) -> int | None:
    """Where the phone number of run ``m`` ends (before its extension), or None."""
    run = m.group("run")
    start = m.start("run")
    items = [(x.lastindex, x.group(x.lastindex), x.end()) for x in _ITEM_RE.finditer(run)]
    g: list[str] = []
    paren: list[bool] = []
    seps: list[str] = []
    ends: list[int] = []  # each group's end, in run
    sep = ""
    for kind, value, end in items:
        if kind == 3:
            sep = value
            continue
        if g:
            seps.append("" if paren[-1] or kind == 1 else sep)
        g.append(value)
        paren.append(kind == 1)
        ends.append(end)
        sep = ""
    digits = "".join(g)
    n = len(digits)
    if n < 7 or n > 15 or _currency_next_to(text, start, m.end("run")):
        return None
    plus = run.startswith(("+", "(+"))
    if plus and len(g) == 2 and seps == ["."]:  # "+1234567.89", a signed amount
        return None
    if plus or (digits.startswith("00") and digits[2] != "0"):
        # International: keep the longest prefix of groups with a possible length.
        idd = not plus  # "00": only numbers libphonenumber calls valid
        for i in range(len(g), 0, -1):
            d = "".join(g[:i])[2 if idd else 0 :]
            if len(d) < 7:
                break
            if _international(d, idd):
                return start + ends[i - 1] if i < len(g) else m.end("run")
        return None
    if n > 13 or _other_number(g, paren, seps) or _in_iban(text, start):
        return None
    if len(g) == 1:  # bare: a national prefix shape, or a cue before it
        shaped = (digits[0] == "0" and digits[1] != "0" and 10 <= n <= 11) or (
            n == 11 and digits[0] == "1" and digits[1] in "3456789"
        )
        if not (shaped or _cue_before(text, start)):
            return None
        if n == 10 and digits[0] in "23456789" and digits[3] in "23456789":
            return m.end("run")  # NANP, written bare after a cue
    nanp = _nanp_shape(g, paren, seps)
    if len(g) == 2 and not any(paren) and not _two_groups_ok(g[0], g[1]):
        return None  # house and street numbers, postcodes ("29120-320", "41 15485"), ...
    # Without a "+", parentheses, an extension, the North American shape or a trunk "0"
    # and 10+ digits, a run of groups could also be the numbers of an address ("Suite 787
    # 33150 Lozerlaan", "9711 1162 Oost St"): it must not be followed by a word other than
    # a few that often follow a phone number, nor come after a unit word.
    strong = nanp or any(paren) or m.group("ext") or (digits[0] == "0" and n >= 10)
    if not strong and len(g) > 1 and _address_next_to(text, start, m.end()):
        return None
    # "Invoice 123-4567", "my account number is 0123456789".
    if not (any(paren) or m.group("ext")) and _other_noun_before(text, start):
        return None
    if nanp or _valid_national(digits):
        return m.end("run")
    return None


def phone_spans(text: str, n_digits: int | None = None) -> list[tuple[int, int]]:
    """Phone numbers in ``text`` as sorted, non-overlapping ``(start, end)`` spans;
    ``n_digits``: its ASCII digit count, when the caller has it (``pii.detect`` does)."""
    if not text or (_n_digits(text) if n_digits is None else n_digits) < 7:
        return []
    out = []
    for m in _RUN_RE.finditer(text):
        end = _phone_end(text, m)
        if end is not None:
            out.append((m.start("run"), m.end() if end == m.end("run") else end))
    return out


# --------------------------------------------------------------------------- cards

_CARD_RE = re.compile(
    r"(?:(?<![0-9A-Za-z@_.,+])|(?<=\\[nrtNRT]))(?<![0-9][ .,-])(?<![A-Za-z][.,-])"
    r"(?:[0-9]{12,19}"
    r"|[0-9]{4}([ .-])[0-9]{4}(?:\1[0-9]{4}){1,3}(?:\1[0-9]{1,3})?"
    r"|[0-9]{4}([ .-])[0-9]{6}\2[0-9]{5})"
    r"(?![0-9A-Za-z@_])(?![ .,-][0-9])"
)


def _card_ok(s: str) -> bool:
    digits = s.replace(" ", "").replace("-", "").replace(".", "")
    n = len(digits)
    if n == 12:
        return digits.startswith(MAESTRO_PREFIXES) and ck.luhn_valid(digits)
    # 13-19 digits: Luhn, and not an 18-digit number with a PRC ID's structure (a
    # mistyped ID, not one of the rare 18-digit cards).
    return (
        13 <= n <= 19
        and ck.card_number_valid(s)
        and not (n == 18 and ck.prc_id_valid(digits[:17] + ck.prc_id_check_char(digits[:17])))
    )


def card_spans(text: str, n_digits: int | None = None) -> list[tuple[int, int]]:
    """Payment card numbers in ``text`` as sorted, non-overlapping ``(start, end)`` spans
    (``n_digits`` as in ``phone_spans``)."""
    if not text or (_n_digits(text) if n_digits is None else n_digits) < 12:
        return []
    return [
        m.span()
        for m in _CARD_RE.finditer(text)
        if _card_ok(m.group()) and not _in_iban(text, m.start())
    ]
