"""Case helpers shared by the rule modules: whether a text has case, the forms of it the
patterns read, a message's words as the phrase rules read them (``message_words``), and a
builder for case-insensitive alternations that Python's ``re`` tries quickly
(``pii.names``, ``pii.addresses``)."""

from __future__ import annotations

import functools
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterable


# Words (letters, inner apostrophes) and "&" as a word (not "&amp;"), with their offsets.
_TOKEN_RE = re.compile(r"[^\W\d_]+(?:['’-][^\W\d_]+)*|&(?!\w)")
# The same on ASCII text, where it matches alike and runs faster (no Unicode classes).
_TOKEN_ASCII_RE = re.compile(r"[A-Za-z]+(?:['-][A-Za-z]+)*|&(?!\w)")


Words = tuple[str, str, "re.Pattern[str]", list[str]]


def message_words(text: str) -> Words:
    """A message's lower case; the text its words are read from (the lower case when
    lower-casing keeps the offsets, nearly always: "İ" does not); the pattern that reads
    them; the words, lower-cased. ``pii.detect`` reads them once per message and hands them
    to ``pii.addresses``' cues, ``pii.phrases`` and ``pii.clauses``."""
    low = text.lower()
    src = low if len(low) == len(text) else text
    token_re = _TOKEN_ASCII_RE if src.isascii() else _TOKEN_RE
    ws = token_re.findall(src)
    if src is text:
        ws = [w.lower() for w in ws]
    return low, src, token_re, ws


def _lower_is_ignorecase(text: str) -> bool:
    """Whether a case-insensitive regex of ASCII letters matches ``text`` where its lower
    case holds the same letters, at the same positions: in all text but the four characters
    re.IGNORECASE matches to an ASCII letter (and "İ" lengthens the lower case)."""
    return text.isascii() or not any(c in text for c in "\u0130\u0131\u017f\u212a")


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


def _is_caseless(text: str) -> bool:
    """Whether ``text`` says nothing by its case: no upper-case or no lower-case letter, or
    capitals only where any text has them (``_sentence_case``)."""
    has_upper = has_lower = False
    for ch in text:
        if ch.isupper():
            has_upper = True
        elif ch.islower():
            has_lower = True
        if has_upper and has_lower:
            return _sentence_case(text)
    return True


# A capitalized word's first letter (an upper-case letter before a lower-case one, at a
# word's start); all-capital words ("PIN", "ATM") and "I" do not match.
_CAPITALIZED_ASCII_RE = re.compile(r"(?<![A-Za-z0-9_'’])[A-Z](?=[a-z])")
_CAPITALIZED_RE = re.compile(r"(?<![\w'’])[^\W\d_](?=[^\W\d_])")
# What may stand between a sentence's end (or a line's start) and its first word.
_LEAD_CHARS = frozenset(" \t\"'“‘«([{*-•>")
_SENTENCE_ENDS = frozenset(".!?\n:;…")


@functools.lru_cache(maxsize=4096)  # asked by several rule modules of the same message
def _sentence_case(text: str) -> bool:
    """Whether every capitalized word of ``text`` starts a sentence or a line ("Hi, my
    name is john smith", "Name - joanna kowalska\nAddress - ..."): then a capital says
    nothing about names, and the text is read as text without case. A capital inside a
    sentence ("Thanks, Tom", "paid via PayPal") keeps the case."""
    if text.isascii():
        starts = (m.start() for m in _CAPITALIZED_ASCII_RE.finditer(text))
    else:
        starts = (m.start() for m in _CAPITALIZED_RE.finditer(text)
                  if text[m.start()].isupper() and text[m.start() + 1].islower())
    for i in starts:
        j = i - 1
        while j >= 0 and text[j] in _LEAD_CHARS:
            j -= 1
        if j >= 0 and (text[j] not in _SENTENCE_ENDS or (text[j] == "." and _abbreviation_before(text, j))):
            return False
    return True


def _abbreviation_before(text: str, dot: int) -> bool:
    """Whether the full stop at ``dot`` follows a capital initial ("J. Okafor"), which ends
    no sentence. (A phone's keyboard capitalizes after any full stop, a title's ("Dr.
    Brooke") or a lower-case initial's ("paige k. Tardif") too: no evidence there.)"""
    return dot >= 1 and text[dot - 1].isupper() and (dot == 1 or not text[dot - 2].isalpha())


def _lower_same_length(text: str) -> str:
    # str.lower() can lengthen text ("İ" -> "i̇"); offsets must survive, so lower per char.
    if text.isascii():
        return text.lower()
    return "".join(c if len(lc := c.lower()) != 1 else lc for c in text)


def _case_forms(text: str) -> tuple[bool, str, str]:
    """Whether ``text`` is without case (no upper-case or no lower-case letter, or
    capitals only at sentences' starts: ``_is_caseless``); the text the patterns read (its
    lower case then, of the same length); its lower case."""
    if text.isascii():  # as below, by whole-string operations
        low = text.lower()
        # no upper case, or no lower case, or capitals at sentences' starts only
        caseless = low == text or text.isupper() or _sentence_case(text)
        return caseless, low if caseless else text, low
    caseless = _is_caseless(text)
    scan = _lower_same_length(text) if caseless else text
    return caseless, scan, scan if caseless else text.lower()
