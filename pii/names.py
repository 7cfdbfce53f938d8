"""Rule-based PERSON spans: a cue ("my name is", "regards,", "on behalf of", a title "Mr.",
...) followed by name tokens (with particles: van, de, von, ...), a name before "here" /
"speaking", and, without a cue, a "Given Family" pair from the US Census name lists (the
``names`` package).

The PERSON token model (``pii.model``) reads these spans as a feature; in text with case
``pii.detector`` also keeps the cued names on their own. ``rule_name_spans`` is the entry
point for training; ``_names`` with ``_cue_starts`` (where a cue can start) and the gate
``_may_hold_cased_name`` is what ``detect`` runs."""

from __future__ import annotations

import functools
import re
import unicodedata
from pathlib import Path
from typing import TYPE_CHECKING

import ahocorasick

from pii.casing import _by_first_char, _case_forms, _lower_is_ignorecase

if TYPE_CHECKING:
    from collections.abc import Iterable


def _word_start(s: str, i: int) -> bool:
    """Whether a word can start at ``s[i]``, as after a regex's ``\\b``."""
    return not i or not (s[i - 1].isalnum() or s[i - 1] == "_")


def _automaton(entries: Iterable[tuple[str, object]]) -> ahocorasick.Automaton:
    """An Aho-Corasick automaton over (word, value) pairs: one pass finds them all."""
    a = ahocorasick.Automaton()
    for word, value in entries:
        a.add_word(word, value)
    a.make_automaton()
    return a


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
mr mrs ms mx
""".split()  # (not "dr": a street's "Drive" too)
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


# A capitalized word after whitespace: every name the cased name patterns can return
# contains one that is not in _NOT_NAMES (after a cue or a title, or the second word of a
# "Given Family" pair), or stands before "here" / "speaking".
# (Written capital first: re finds the few capitals faster than it tries every space.)
_CAP_AFTER_SPACE_RE = re.compile(r"[A-ZÀ-ÖØ-Þ](?<=\s[A-ZÀ-ÖØ-Þ])[\w'’-]*")
_NOT_NAMES_AS_WRITTEN = frozenset(f(w) for w in _NOT_NAMES for f in (str.capitalize, str.upper))


# The gate below only skips work: it returns False only when the cased name patterns
# cannot match (tests/test_pii.py checks detections with every gate open).


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


def rule_name_spans(text: str) -> tuple[bool, list[tuple[int, int]]]:
    """Whether ``text`` is without case, and the spans the cue rules take for names (a
    feature of the name model, see ``pii.model``)."""
    caseless, scan, low = _case_forms(text)
    if not (caseless or _may_hold_cased_name(text, low)):
        return caseless, []
    cued, pairs = _names(scan, caseless, _cue_starts(scan, low, caseless))
    return caseless, cued + pairs
