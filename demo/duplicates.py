"""Duplicates of an original: exact-class copies (case, punctuation, whitespace: same
dedup key) and near copies (a word swapped or a short clause added, aiming at a Jaccard
at or above the dedup threshold). Copies edit plain parts only, so PII values survive.
"""

from __future__ import annotations

import random
import re

from demo.common import NEAR_DUP_J, _check
from demo.parts import _SPACE_RE, _WORD_RE, Part, _edit_plain, _lower_first, render
from textnorm import dedup_key, shingles

# Share of word swaps that cannot reach the threshold which become a clause instead; the
# rest stay as planted, below the threshold (~2% of near copies).
SWAP_FALLBACK_SHARE = 0.6
_PUNCT_RE = re.compile(r"[.?!,](?=\s|$)")
# Replacements that change few 5-byte shingles (inflections, British/American spelling)
# first, then short synonyms: a one-word edit of a 45-character message is only >= 0.8
# similar when the edit is small.
WORD_SWAPS: dict[str, tuple[str, ...]] = {
    "card": ("cards",), "cards": ("card",), "transfer": ("transfers", "transferred"),
    "transfers": ("transfer",), "payment": ("payments",), "payments": ("payment",),
    "account": ("accounts",), "fee": ("fees",), "fees": ("fee",), "charge": ("charges", "charged"),
    "charged": ("charge",), "refund": ("refunds",), "transaction": ("transactions",),
    "rate": ("rates",), "top": ("topped",), "want": ("wanted",), "need": ("needed",),
    "get": ("got",), "is": ("was",), "was": ("is",), "can": ("could",), "could": ("can",),
    "recognised": ("recognized",), "recognize": ("recognise",), "cancelled": ("canceled",),
    "canceled": ("cancelled",), "cheque": ("check",), "withdrawal": ("withdrawals",),
    "my": ("the",), "the": ("my", "a"), "a": ("the",), "this": ("that",), "that": ("this",),
    "money": ("cash",), "please": ("pls",), "why": ("how",), "how": ("why",),
    "still": ("yet",), "help": ("assist",), "do": ("can",), "app": ("application",),
}  # fmt: skip
PREPEND_CLAUSES = ("Hi,", "Hello,", "Hi there,", "Urgent:", "Hey,", "Good morning,", "Hello again,")
APPEND_CLAUSES = ("Thanks.", "Thanks!", "Please help.", "Thank you.", "Thanks in advance.",
                  "Any help appreciated.", "Please advise.", "ASAP please.", "Help!", "Cheers.")


def _jac(a: frozenset[bytes], b: frozenset[bytes]) -> float:
    # textnorm.jaccard on precomputed shingle sets (same formula, same value).
    if not a and not b:
        return 1.0
    inter = len(a & b)
    return inter / (len(a) + len(b) - inter)


def exact_class_copy(parts: list[Part], kind: str, rng: random.Random) -> tuple[list[Part], str]:
    """A copy with the original's dedup key; returns (parts, kind actually applied)."""
    text, _ = render(parts)
    key = dedup_key(text)
    out: list[Part] | None = None
    if kind == "case":
        modes = [str.lower, str.upper, lambda s: s[:1].swapcase() + s[1:]]
        rng.shuffle(modes)
        for mode in modes:
            # Per part, so values keep their boundaries (the span then holds the new case).
            cand = [(mode(t) if i == 0 or mode in (str.lower, str.upper) else t, k)
                    for i, (t, k) in enumerate(parts)]
            new = render(cand)[0]
            if new != text and dedup_key(new) == key:
                out = cand
                break
    elif kind == "punct":
        op = rng.random()
        if op < 0.4:
            out = _edit_plain(parts, rng, _PUNCT_RE, lambda m: m.group() * 2)
        elif op < 0.8:
            out = _edit_plain(parts, rng, _PUNCT_RE, lambda m: "")
        if out is None or dedup_key(render(out)[0]) != key:
            out = [*parts, (rng.choice(("?", "!", "??", "...")), None)]
    elif kind == "whitespace":
        if rng.random() < 0.7:
            out = _edit_plain(parts, rng, _SPACE_RE,
                              lambda m: rng.choice(("  ", " \t", "\t", "   ", " \t ")))
        if out is None:
            out = [(rng.choice((" ", "  ", "\t")), None), *parts, (rng.choice((" ", "  ")), None)]
    if out is None:  # case impossible (nothing to change safely): an identical copy
        return list(parts), "exact"
    _check(dedup_key(render(out)[0]) == key, f"{kind} copy changed the dedup key: {text!r}")
    return out, kind


def _match_case(word: str, like: str) -> str:
    if like.isupper() and len(like) > 1:
        return word.upper()
    return word.capitalize() if like[:1].isupper() else word


def _swap_candidates(parts: list[Part], rng: random.Random) -> list[list[Part]]:
    hits = [(i, m) for i, (t, k) in enumerate(parts) if k is None
            for m in _WORD_RE.finditer(t) if m.group().lower() in WORD_SWAPS]
    rng.shuffle(hits)
    out = []
    for i, m in hits[:6]:
        w, t = m.group(), parts[i][0]
        new = _match_case(rng.choice(WORD_SWAPS[w.lower()]), w)
        out.append([*parts[:i], (t[: m.start()] + new + t[m.end():], None), *parts[i + 1:]])
    return out


def _clause_candidates(parts: list[Part], short: bool, rng: random.Random) -> list[list[Part]]:
    clauses = [(c, True) for c in PREPEND_CLAUSES] + [(c, False) for c in APPEND_CLAUSES]
    rng.shuffle(clauses)
    if short:  # the shortest clauses change the fewest shingles
        clauses.sort(key=lambda c: len(c[0]))
    out = []
    for clause, front in clauses[:6]:
        if front:
            first = parts[0]
            lowered = [(_lower_first(first[0]), None)] if first[1] is None else [first]
            out.append([(clause + " ", None), *lowered, *parts[1:]])
        else:
            out.append([*parts, (" " + clause, None)])
    return out


def near_copy(parts: list[Part], kind: str, orig_set: frozenset[bytes],
              rng: random.Random) -> tuple[list[Part], str, float]:
    """A near copy (one word swapped, or a short clause added) aiming at Jaccard >= 0.8
    with the original; returns (parts, kind actually applied, Jaccard).

    Candidates are tried in random order and the first reaching the threshold is kept.
    A one-word edit of a short message often cannot reach it: such a word swap mostly
    falls back to a (short) clause, and otherwise the most similar candidate is kept with
    its Jaccard recorded as is, so the ground truth also holds near copies below the
    threshold (as real re-sent tickets do)."""
    text, _ = render(parts)
    key = dedup_key(text)
    short = len(key) < 70
    plans = []
    if kind == "word_swap":
        plans.append((kind, _swap_candidates(parts, rng)))
    if kind != "word_swap" or not plans[0][1] or rng.random() < SWAP_FALLBACK_SHARE:
        plans.append(("clause_added", _clause_candidates(parts, short, rng)))
    best: tuple[float, list[Part], str] | None = None
    for applied, cands in plans:
        for cand in cands:
            new = render(cand)[0]
            if dedup_key(new) == key:
                continue
            j = _jac(frozenset(shingles(new)), orig_set)
            if j >= NEAR_DUP_J:
                return cand, applied, j
            if best is None or j > best[0]:
                best = (j, cand, applied)
    if best is None:
        raise AssertionError(f"no near copy possible for {text!r}")
    return best[1], best[2], best[0]
