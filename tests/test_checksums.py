"""Check-digit validators against published test vectors, and generators against them."""

from __future__ import annotations

import datetime as dt
import random

import pytest

from pii import checksums as ck


@pytest.mark.parametrize(
    ("s", "ok"),
    [
        ("4111111111111111", True),  # the classic Visa test number
        ("4111 1111 1111 1111", True),
        ("4111-1111-1111-1111", True),
        ("4111.1111.1111.1111", True),
        ("3782 822463 10005", True),  # Amex test number, 4-6-5
        ("378282246310005", True),
        ("4111111111111112", False),  # Luhn fails
        ("4111 1111-1111 1111", False),  # mixed separators
        ("411111111111", False),  # 12 digits
        ("４１１１１１１１１１１１１１１１", False),  # full-width digits are not ASCII
        ("41111111111111111111", False),  # 20 digits
    ],
)
def test_card_number_valid(s: str, ok: bool) -> None:
    assert ck.card_number_valid(s) is ok


def test_luhn_check_digit_round_trip() -> None:
    assert ck.luhn_valid("79927398713") and not ck.luhn_valid("79927398710")
    assert ck.luhn_check_digit("7992739871") == "3"
    assert not ck.luhn_valid("0")
    with pytest.raises(ValueError):
        ck.luhn_check_digit("12a")


@pytest.mark.parametrize(
    ("s", "ok"),
    [
        ("GB82 WEST 1234 5698 7654 32", True),  # ECBS examples
        ("GB82WEST12345698765432", True),
        ("gb82west12345698765432", True),
        ("DE89 3704 0044 0532 0130 00", True),
        ("FR14 2004 1010 0505 0001 3M02 606", True),
        ("GB83 WEST 1234 5698 7654 32", False),  # check digits off by one
        ("GB82 WEST 1234 5698 7654 3", False),  # too short for GB
        ("XX82 WEST 1234 5698 7654 32", False),  # unknown country
        ("DE89 3704 0044 0532 0130 0A", False),  # DE BBAN is numeric
    ],
)
def test_iban_valid(s: str, ok: bool) -> None:
    assert ck.iban_valid(s) is ok


@pytest.mark.parametrize(
    ("s", "ok"),
    [
        ("123-45-6789", True),
        ("123456789", True),
        ("000-12-3456", False),
        ("666-12-3456", False),
        ("900-12-3456", False),
        ("123-00-4567", False),
        ("123-45-0000", False),
        ("078-05-1120", False),
        ("12-345-6789", False),
    ],
)
def test_us_ssn_valid(s: str, ok: bool) -> None:
    assert ck.us_ssn_valid(s) is ok


@pytest.mark.parametrize(
    ("s", "ok"),
    [
        ("11010519491231002X", True),  # the GB 11643 example
        ("11010519491231002x", True),
        ("110105194912310021", False),  # wrong check character
        ("99010519491231002X", False),  # no such province
        ("11010519491331002X", False),  # month 13
        ("1101051949123100", False),
    ],
)
def test_prc_id_valid(s: str, ok: bool) -> None:
    assert ck.prc_id_valid(s, today=dt.date(2026, 1, 1)) is ok


def test_prc_id_born_in_the_future_is_invalid() -> None:
    first17 = "11010520300101001"
    assert not ck.prc_id_valid(first17 + ck.prc_id_check_char(first17), today=dt.date(2026, 1, 1))


def test_generators_make_valid_values_and_one_digit_change_breaks_them() -> None:
    rng = random.Random(0)
    for _ in range(300):
        card = ck.make_card_number(rng)
        assert ck.card_number_valid(card)
        bad = card[:-1] + str((int(card[-1]) + 1) % 10)
        assert not ck.card_number_valid(bad)
        cc = rng.choice(["DE", "GB", "FR", "IT", "NL", "ES", "CH"])
        iban = ck.make_iban(cc, ck.random_bban(cc, rng))
        assert ck.iban_valid(iban) and ck.iban_valid(ck.group(iban))
        assert not ck.iban_valid(iban[:2] + f"{(int(iban[2:4]) + 1) % 97:02d}" + iban[4:])
        assert ck.us_ssn_valid(ck.make_us_ssn(rng))
        prc = ck.make_prc_id(rng)
        assert ck.prc_id_valid(prc)
        assert not ck.prc_id_valid(prc[:-1] + ("0" if prc[-1] != "0" else "1"))


def test_make_iban_rejects_a_bban_of_the_wrong_shape() -> None:
    with pytest.raises(ValueError, match="does not fit"):
        ck.make_iban("DE", "123")
    with pytest.raises(ValueError, match="unknown IBAN country"):
        ck.make_iban("XX", "1234567890")
