"""Synthetic personal data and where it goes in a message: the value generators
(``PiiFactory``: names, e-mails, phones, Luhn-valid cards, IBANs, US SSNs, PRC IDs,
addresses, IPs), look-alike decoys that fail their validators, and the templates that
insert values, decoys and harmless amounts/dates into a message's parts.
"""

from __future__ import annotations

import ipaddress
import random
import re
import unicodedata
from collections.abc import Sequence

from demo.common import _check
from demo.parts import Part, _lower_first
from pii import checksums as ck

FULLWIDTH_PII_SHARE = 0.02
NAME_LOCALES = ("en_US", "en_GB", "de_DE", "fr_FR", "es_ES", "it_IT", "nl_NL")
ADDRESS_LOCALES = ("en_US", "en_GB", "de_DE", "fr_FR")
TITLES = ("Mr.", "Ms.", "Mrs.", "Dr.")
EMAIL_DOMAINS = (
    "gmail.com", "outlook.com", "yahoo.co.uk", "web.de", "orange.fr", "qq.com", "proton.me",
    "hotmail.com", "gmx.de", "acme-corp.com", "northwind-traders.co.uk", "globex.de",
)  # fmt: skip
IBAN_COUNTRIES = ("DE", "GB", "FR", "ES", "IT", "NL", "BE", "AT", "CH", "IE", "PT", "PL")
_FW_DIGITS = {ord(c): 0xFF10 + i for i, c in enumerate("0123456789")}
_FOLD = str.maketrans({"ß": "ss", "æ": "ae", "Æ": "ae", "ø": "o", "Ø": "o", "ł": "l", "đ": "d"})


def _ascii_fold(s: str) -> str:
    s = unicodedata.normalize("NFKD", s.translate(_FOLD))
    return "".join(c for c in s if c.isascii() and c.isalpha()).lower()


def _digits(rng: random.Random, n: int) -> str:
    return "".join(rng.choice("0123456789") for _ in range(n))


class PiiFactory:
    """Synthetic personal data. Faker runs once per build to fill small pools (names,
    addresses); per-row values are sampled from them, so Faker is never the bottleneck."""

    def __init__(self, seed: int, size: int) -> None:
        from faker import Faker

        self.first: list[list[str]] = []
        self.last: list[list[str]] = []
        for loc in NAME_LOCALES:
            f = Faker(loc)
            f.seed_instance(seed)
            self.first.append([" ".join(f.first_name().split()) for _ in range(size)])
            self.last.append([" ".join(f.last_name().split()) for _ in range(size)])
        self.addresses: list[list[str]] = []
        for loc in ADDRESS_LOCALES:
            f = Faker(loc)
            f.seed_instance(seed)
            out = []
            for _ in range(size):
                a = " ".join(f.street_address().split())
                if loc == "fr_FR":
                    a = re.sub(r"^(\d+), ", r"\1 ", a)  # "12, rue de la Paix" -> "12 rue ..."
                elif loc.startswith("en") and f.random.random() < 0.3:
                    a = f"{a}, {' '.join(f.city().split())}"
                out.append(a)
            self.addresses.append(out)

    def person(self, rng: random.Random) -> tuple[str, str, str]:
        """(as written, given name, family name)."""
        loc = rng.randrange(len(NAME_LOCALES))
        given, family = rng.choice(self.first[loc]), rng.choice(self.last[loc])
        r = rng.random()
        if r < 0.15:
            shown = f"{rng.choice(TITLES)} {given} {family}"
        elif r < 0.30:
            shown = f"{given} {rng.choice(self.first[loc])} {family}"
        else:
            shown = f"{given} {family}"
        return shown, given, family

    def email(self, rng: random.Random, person: tuple[str, str, str] | None = None) -> str:
        _, given, family = person or self.person(rng)
        g, f = _ascii_fold(given) or "alex", _ascii_fold(family) or "smith"
        domain = rng.choice(EMAIL_DOMAINS)
        if domain == "qq.com" and rng.random() < 0.6:
            return f"{rng.randint(10000, 9999999999)}@qq.com"
        local = rng.choice((
            f"{g}.{f}", f"{g[0]}{f}{rng.randint(10, 99)}", f"{g[0]}_{f}", f"{f}.{g[0]}",
            f"{g}{f[0]}", f"{g}.{f}{rng.randint(1, 9)}",
        ))  # fmt: skip
        return f"{local}@{domain}"

    @staticmethod
    def phone(rng: random.Random) -> str:
        d = lambda n: _digits(rng, n)  # noqa: E731
        area = f"{rng.randint(2, 9)}{d(2)}"
        shapes = (
            lambda: f"({area}) 555-{d(4)}",
            lambda: f"{area}-{rng.randint(2, 9)}{d(2)}-{d(4)}",
            lambda: f"+1 {area} {rng.randint(2, 9)}{d(2)} {d(4)}",
            lambda: f"+44 20 {rng.randint(3, 8)}{d(3)} {d(4)}",
            lambda: f"07{rng.randint(4, 9)}{d(2)} {d(6)}",
            lambda: f"+49 {rng.choice(('30', '40', '89', '221', '69'))} {d(rng.choice((7, 8)))}",
            lambda: f"0{rng.choice(('30', '40', '89', '221', '69'))} {d(rng.choice((7, 8)))}",
            lambda: f"+33 {rng.randint(1, 9)} {d(2)} {d(2)} {d(2)} {d(2)}",
            lambda: f"0{rng.choice('67')} {d(2)} {d(2)} {d(2)} {d(2)}",
            lambda: f"+86 1{rng.randint(3, 9)}{d(1)} {d(4)} {d(4)}",
            lambda: f"1{rng.randint(3, 9)}{d(9)}",
            lambda: f"+91 {rng.randint(6, 9)}{d(4)} {d(5)}",
        )
        return rng.choice(shapes)()

    @staticmethod
    def card(rng: random.Random) -> str:
        digits = ck.make_card_number(rng)
        r = rng.random()
        if len(digits) == 15 and digits[:2] in ("34", "37") and r < 0.7:
            sep = rng.choice(" -")
            return f"{digits[:4]}{sep}{digits[4:10]}{sep}{digits[10:]}"
        if r < 0.05:
            return ck.group(digits, 4, ".")
        if r < 0.30:
            return digits
        return ck.group(digits, 4, " " if r < 0.75 else "-")

    @staticmethod
    def iban(rng: random.Random) -> str:
        cc = rng.choice(IBAN_COUNTRIES)
        iban = ck.make_iban(cc, ck.random_bban(cc, rng))
        return ck.group(iban, 4, " ") if rng.random() < 0.5 else iban

    def address(self, rng: random.Random) -> str:
        return rng.choice(rng.choice(self.addresses))

    @staticmethod
    def ip(rng: random.Random) -> str:
        o = lambda: rng.randint(0, 255)  # noqa: E731
        h = lambda: rng.randint(1, 254)  # noqa: E731
        x = lambda: f"{rng.randint(1, 0xFFFF):x}"  # noqa: E731
        r = rng.random()
        if r < 0.70:
            return rng.choice((
                lambda: f"203.0.113.{h()}", lambda: f"198.51.100.{h()}",
                lambda: f"10.{o()}.{o()}.{h()}", lambda: f"192.168.{o()}.{h()}",
                lambda: f"172.{rng.randint(16, 31)}.{o()}.{h()}",
                lambda: f"{rng.choice((81, 92, 145, 185, 212, 77))}.{o()}.{o()}.{h()}",
            ))()  # fmt: skip
        raw = rng.choice((
            lambda: f"2001:db8:{x()}:{x()}::{x()}", lambda: f"2001:db8::{x()}:{x()}",
            lambda: f"fe80::{x()}:{x()}:{x()}:{x()}", lambda: f"2a02:{x()}:{x()}::{x()}",
        ))()  # fmt: skip
        return ipaddress.IPv6Address(raw).compressed

    def value(self, kind: str, rng: random.Random, person: tuple[str, str, str] | None) -> str:
        if kind == "person_name":
            return person[0] if person else self.person(rng)[0]
        if kind == "email":
            return self.email(rng, person)
        if kind in ("phone", "card_number"):
            v = self.phone(rng) if kind == "phone" else self.card(rng)
            # Some systems store digits full-width (CJK input methods); NFKC folds them.
            return v.translate(_FW_DIGITS) if rng.random() < FULLWIDTH_PII_SHARE else v
        if kind == "iban":
            return self.iban(rng)
        if kind == "us_ssn":
            return ck.make_us_ssn(rng)
        if kind == "prc_id":
            return ck.make_prc_id(rng)
        if kind == "street_address":
            return self.address(rng)
        if kind == "ip_address":
            return self.ip(rng)
        raise ValueError(kind)


def decoy_value(kind: str, rng: random.Random) -> str:
    """A value with the shape of an identifier that fails its validator."""
    if kind == "decoy_card":
        digits = rng.choice("456") + _digits(rng, 15)
        if ck.luhn_valid(digits):  # any single-digit change breaks Luhn
            digits = digits[:-1] + str((int(digits[-1]) + 1) % 10)
        value = ck.group(digits, 4, rng.choice(" -"))
        _check(not ck.card_number_valid(value), "decoy card passes Luhn")
    elif kind == "decoy_iban":
        cc = rng.choice(IBAN_COUNTRIES)
        bban = ck.random_bban(cc, rng)
        good = int(ck.iban_check_digits(cc, bban))
        bad = rng.choice([c for c in range(2, 99) if c != good])
        value = f"{cc}{bad:02d}{bban}"
        value = ck.group(value, 4, " ") if rng.random() < 0.5 else value
        _check(not ck.iban_valid(value), "decoy IBAN is valid")
    elif kind == "decoy_ssn":
        a, g, s = f"{rng.randint(1, 899):03d}", f"{rng.randint(1, 99):02d}", f"{rng.randint(1, 9999):04d}"
        value = rng.choice((
            f"000-{g}-{s}", f"666-{g}-{s}", f"9{rng.randint(0, 99):02d}-{g}-{s}",
            f"{a}-00-{s}", f"{a}-{g}-0000", "000-12-3456",
        ))  # fmt: skip
        _check(not ck.us_ssn_valid(value), "decoy SSN is valid")
    elif kind == "decoy_prc_id":
        good = ck.make_prc_id(rng)
        value = good[:17] + rng.choice([c for c in "0123456789X" if c != good[17]])
        _check(not ck.prc_id_valid(value), "decoy PRC ID is valid")
    else:
        raise ValueError(kind)
    return value


# Templates: "sentence" ones go before, after or between the message's sentences; "lead"
# ones start the message (which then continues in lower case); "sign" ones end it.
PII_TEMPLATES: dict[str, dict[str, tuple[str, ...]]] = {
    "person_name": {
        "sentence": ("My name is {v}.", "This is {v} speaking.", "I'm writing on behalf of {v}.",
                     "Account holder: {v}.", "My husband {v} has the same problem.",
                     "Please send it to {v}.", "I'm {v} and I need some help."),
        "lead": ("{v} here,", "Hi, this is {v},"),
        "sign": ("Regards, {v}", "Thanks, {v}", "Kind regards, {v}", "Cheers, {v}"),
    },
    "email": {
        "sentence": ("My email is {v}.", "Contact me at {v}.", "You can email me at {v}.",
                     "Please reply to {v}."),
        "sign": ("({v})",),
    },
    "phone": {
        "sentence": ("My number is {v}.", "Call me on {v}.", "You can reach me at {v}.",
                     "My phone number is {v}."),
        "sign": ("Tel: {v}", "({v})"),
    },
    "card_number": {
        "sentence": ("My card number is {v}.", "The card is {v}.", "It was charged to card {v}.",
                     "Card number: {v}."),
    },
    "iban": {
        "sentence": ("My IBAN is {v}.", "Please send it to IBAN {v}.", "The money went to {v}.",
                     "Account: {v}."),
    },
    "us_ssn": {"sentence": ("My SSN is {v}.", "My social security number is {v}.", "SSN: {v}.")},
    "prc_id": {"sentence": ("My ID number is {v}.", "ID card number: {v}.", "My resident ID is {v}.")},
    "street_address": {
        "sentence": ("I live at {v}.", "My address is {v}.", "Please ship it to {v}.",
                     "I moved to {v}."),
    },
    "ip_address": {"sentence": ("My IP is {v}.", "I logged in from {v}.", "The login came from {v}.")},
}  # fmt: skip
DECOY_TEMPLATES = ("Order number {v}.", "My reference is {v}.", "Tracking number {v}.",
                   "Reference {v}.", "Ticket {v}.")
HARMLESS_TEMPLATES = ("I paid {amount}.", "It was {amount} on {date}.", "Ref {ref}.",
                      "This happened on {date}.", "The amount was {amount}.")
_BOUNDARY_RE = re.compile(r"[.?!] (?=\S)")


def insert_value(parts: list[Part], template: str, value: str, kind: str | None, where: str,
                 rng: random.Random) -> list[Part]:
    """Insert ``template`` (with ``value`` as a typed part at {v}) at ``where``:
    prefix, suffix, inside (at a sentence boundary) or lead (prefix, message lower-cased)."""
    before, _, after = template.partition("{v}")
    piece: list[Part] = [(before, None), (value, kind), (after, None)]
    if where == "inside":
        hits = [(i, m.end()) for i, (t, k) in enumerate(parts) if k is None
                for m in _BOUNDARY_RE.finditer(t)]
        if hits:
            i, cut = rng.choice(hits)
            t = parts[i][0]
            return [*parts[:i], (t[:cut], None), *piece, (" " + t[cut:], None), *parts[i + 1:]]
        where = "suffix"
    if where == "suffix":
        return [*parts, (" ", None), *piece]
    rest = parts
    if where == "lead" and rest and rest[0][1] is None:
        rest = [(_lower_first(rest[0][0]), None), *rest[1:]]
    return [*piece, (" ", None), *rest]


def add_pii(parts: list[Part], kinds: Sequence[str], factory: PiiFactory,
            rng: random.Random) -> list[Part]:
    person = factory.person(rng) if {"person_name", "email"} <= set(kinds) else None
    for kind in kinds:
        value = factory.value(kind, rng, person)
        groups = PII_TEMPLATES[kind]
        style = rng.choice(sorted(groups))
        template = rng.choice(groups[style])
        if style == "lead":
            where = "lead"
        elif style == "sign":
            where = "suffix"
        else:
            where = rng.choices(("prefix", "suffix", "inside"), (0.3, 0.45, 0.25))[0]
        parts = insert_value(parts, template, value, kind, where, rng)
    return parts


def add_decoy(parts: list[Part], kind: str, rng: random.Random) -> list[Part]:
    where = rng.choices(("prefix", "suffix", "inside"), (0.25, 0.5, 0.25))[0]
    return insert_value(parts, rng.choice(DECOY_TEMPLATES), decoy_value(kind, rng), kind, where, rng)


def add_harmless(parts: list[Part], rng: random.Random) -> list[Part]:
    amount = rng.choice((
        f"£{rng.randint(5, 2000)}.{rng.randint(0, 99):02d}", f"€{rng.randint(5, 900)}.{rng.choice(('00', '50', '99'))}",
        f"${rng.randint(1, 9)},{rng.randint(0, 999):03d}.00", f"{rng.randint(10, 500)} GBP",
    ))  # fmt: skip
    date = rng.choice((
        f"{rng.randint(1, 28):02d}/{rng.randint(1, 12):02d}/2026", f"2026-11-{rng.randint(1, 7):02d}",
        f"{rng.randint(1, 28)} Oct",
    ))  # fmt: skip
    ref = f"2026{rng.randint(1, 12):02d}{rng.randint(1, 28):02d}"
    sentence = rng.choice(HARMLESS_TEMPLATES).format(amount=amount, date=date, ref=ref)
    return [*parts, (" " + sentence, None)]
