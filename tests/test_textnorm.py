"""Normalization tables: the reference rules the Spark jobs implement."""

from __future__ import annotations

import pytest

import textnorm


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("I lost my card", "I lost my card"),
        ("  leading and trailing  ", "leading and trailing"),
        ("tabs\tand\nnewlines\r\nhere", "tabs and newlines here"),
        ("non\u00a0breaking space", "non breaking space"),
        ("zero\u200bwidth", "zerowidth"),
        ("soft\u00adhyphen", "softhyphen"),
        ("\ufeffbom first", "bom first"),
        ("Ｆｕｌｌｗｉｄｔｈ １２３", "Fullwidth 123"),
        ("ligature ﬁle", "ligature file"),
        ("caf\u0065\u0301", "café"),  # combining accent composed
        ("many     spaces", "many spaces"),
        ("", ""),
        ("   \t  ", ""),
    ],
)
def test_normalize_text(raw, expected):
    assert textnorm.normalize_text(raw) == expected


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        ("Where is my card?", "where is my card", True),
        ("Where is my card?", "WHERE IS MY CARD!!", True),
        ("Where is my card?", "Where  is my\tcard ?", True),
        ("Where is my card?", "Where, is my card.", True),
        ("Where is my card?", "Where is my new card?", False),
        ("top-up failed", "top up failed", True),
    ],
)
def test_dedup_key(a, b, same):
    assert (textnorm.dedup_key(a) == textnorm.dedup_key(b)) is same


@pytest.mark.parametrize(
    ("text", "is_control"),
    [
        ("plain text", False),
        ("tab\tis fine", False),
        ("bell\x07", True),
        ("nul\x00", True),
        ("escape\x1b[31m", True),
        ("del\x7f", True),
        ("c1 \x85 next line", True),
    ],
)
def test_control_chars(text, is_control):
    assert bool(textnorm.CONTROL_RE.search(text)) is is_control


@pytest.mark.parametrize(
    ("text", "is_mojibake"),
    [
        ("I’m waiting", False),
        ("Iâ€™m waiting", True),
        ("a fee of â‚¬1", True),  # "€" read as cp1252
        ("crème brûlée à côté", False),
        ("cafÃ© au lait", True),
        ("costs Â£5", True),
        ("café", False),
        ("Ärger über Äpfel", False),
        ("£5 fee", False),
    ],
)
def test_mojibake(text, is_mojibake):
    assert bool(textnorm.MOJIBAKE_RE.search(text)) is is_mojibake


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ("card_arrival", "card_arrival"),
        ("Card Arrival", "card_arrival"),
        ("card-arrival", "card_arrival"),
        ("  CARD_ARRIVAL ", "card_arrival"),
        ("", None),
        ("   ", None),
        (None, None),
    ],
)
def test_normalize_label(raw, expected):
    assert textnorm.normalize_label(raw) == expected


def test_shingles_and_jaccard():
    assert textnorm.shingles("abc", k=5) == {b"abc"}
    assert textnorm.shingles("abcdef", k=5) == {b"abcde", b"bcdef"}
    assert textnorm.jaccard("Where is my card?", "where is my card") == 1.0
    j = textnorm.jaccard("I want to know where my new card is right now", "I want to know where my card is right now")
    assert 0.6 < j < 1.0
    assert textnorm.jaccard("completely different", "nothing alike here") < 0.1
