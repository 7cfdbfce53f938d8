"""Where the originals come from: the Banking77 source pool (flattened, unique, pairwise
below the dedup threshold) and, when a build needs more originals than the pool holds,
messages composed of 2-4 same-intent pool texts that stay pairwise distinct (``Composer``).
"""

from __future__ import annotations

import bisect
import csv
import functools
import json
import math
import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from demo.common import NEAR_DUP_J, _check, _np_rng, _py_rng
from textnorm import dedup_key, normalize_label, normalize_text, shingles

BANKING77 = Path(__file__).resolve().parent.parent / "data" / "banking77"
MIN_TEXT_CHARS = 3
MAX_COMPOSED_CHARS = 600  # + PII, decoys, clauses stays well under clean.max_chars=1000
# Composition rules (see Composer): a part may make up at most PART_MAX of a composed
# message's shingles; messages sharing 2+ parts stay below SHARED_MAX_J; two texts
# overlapping by SIMILAR_CONTAINMENT (of the smaller) count as "similar". The margins below
# 0.8 leave room for PII, clauses and near copies added later.
PART_MAX = 0.72
SHARED_MAX_J = 0.72
SIMILAR_CONTAINMENT = 0.5


@dataclass
class Pool:
    """Source texts: flattened, unique by dedup key, pairwise Jaccard < NEAR_DUP_J."""

    texts: list[str]
    labels: np.ndarray  # index into label_names
    label_names: list[str]
    sets: list[frozenset[bytes]]
    stats: dict[str, int]


def load_label_names() -> list[str]:
    # Canonicalized like the clean stage does ("Refund_not_showing_up" -> lower case).
    raw = json.loads((BANKING77 / "categories.json").read_text(encoding="utf-8"))
    return [normalize_label(x) for x in raw]


def load_source(source: str) -> list[tuple[str, str]]:
    """(flattened text, canonical label) in file order: train, then test."""
    files = {"train": ("train.csv",), "test": ("test.csv",), "all": ("train.csv", "test.csv")}
    out: list[tuple[str, str]] = []
    for name in files[source]:
        with (BANKING77 / name).open(newline="", encoding="utf-8") as fh:
            for rec in csv.DictReader(fh):
                out.append((" ".join(rec["text"].split()), normalize_label(rec["category"])))
    return out


def similar_pairs(sets: Sequence[frozenset[bytes]], threshold: float) -> list[tuple[int, int]]:
    """All pairs (i < j) with Jaccard >= threshold, exactly, by prefix filtering.

    Shingles are ordered rarest first; two sets with Jaccard >= t share at least
    ceil(t * |x|) shingles, so they must share one of the first |x| - ceil(t * |x|) + 1
    (rare) shingles of each. Only those prefixes are indexed, which keeps candidate
    buckets small, and every candidate is verified."""
    df: Counter[bytes] = Counter()
    for s in sets:
        df.update(s)
    rank = {t: r for r, t in enumerate(sorted(df, key=lambda t: (df[t], t)))}
    # Smallest sets first: a bucket then holds sets no larger than the probe, in size
    # order, and those smaller than threshold * |probe| (Jaccard < t) are skipped by bisect.
    order = sorted(range(len(sets)), key=lambda i: (len(sets[i]), i))
    ids: dict[int, list[int]] = {}
    sizes: dict[int, list[int]] = {}
    cands: set[tuple[int, int]] = set()
    for i in order:
        n = len(sets[i])
        toks = sorted(rank[t] for t in sets[i])
        min_size = math.ceil(threshold * n - 1e-9)
        for t in toks[: n - min_size + 1]:
            b_ids, b_sizes = ids.setdefault(t, []), sizes.setdefault(t, [])
            lo = bisect.bisect_left(b_sizes, min_size)
            cands.update((min(j, i), max(j, i)) for j in b_ids[lo:])
            b_ids.append(i)
            b_sizes.append(n)
    out = []
    for j, i in sorted(cands):
        inter = len(sets[j] & sets[i])
        if inter >= threshold * (len(sets[j]) + len(sets[i]) - inter):
            out.append((j, i))
    return out


@functools.lru_cache(maxsize=3)  # a pool depends on the source only; reused across builds
def build_pool(source: str = "all") -> Pool:
    names = load_label_names()
    label_idx = {n: i for i, n in enumerate(names)}
    items = load_source(source)
    first: dict[str, tuple[int, str]] = {}
    conflicting: set[str] = set()
    kept: list[tuple[str, str, str]] = []
    for text, label in items:
        _check(label in label_idx, f"label {label!r} is not in categories.json")
        if len(normalize_text(text)) < MIN_TEXT_CHARS:
            continue
        key = dedup_key(text)
        if key in first:
            if first[key][1] != label:
                conflicting.add(key)
            continue
        first[key] = (len(kept), label)
        kept.append((text, label, key))
    # A text Banking77 itself labels two ways has no single true label: leave it out.
    kept = [k for k in kept if k[2] not in conflicting]
    sets = [frozenset(shingles(t)) for t, _, _ in kept]
    drop: set[int] = set()
    for j, i in similar_pairs(sets, NEAR_DUP_J):
        if j not in drop and i not in drop:
            drop.add(i)
    keep_idx = [i for i in range(len(kept)) if i not in drop]
    return Pool(
        texts=[kept[i][0] for i in keep_idx],
        labels=np.array([label_idx[kept[i][1]] for i in keep_idx], dtype=np.int16),
        label_names=names,
        sets=[sets[i] for i in keep_idx],
        stats={
            "source_texts": len(items),
            "exact_duplicates_dropped": len(items) - len(kept) - len(conflicting),
            "conflicting_label_texts_dropped": len(conflicting),
            "near_duplicates_dropped": len(drop),
            "pool_texts": len(keep_idx),
        },
    )


# --------------------------------------------------------------------------- compositions


class Composer:
    """More originals than the pool holds: 2 (then 3, as a last resort 4) same-intent texts
    joined by a space.

    Composed originals must stay pairwise below the dedup threshold, and a 13k-text pool
    reused for a million messages makes that the hard part (every pool text is also a
    single original, and appears in ~100 compositions). The rules, in shingle-set terms:

    * every set of parts is used once (no "A B" and "B A");
    * each part is at most PART_MAX of the message's shingles, so "A" vs "A B" stays low;
    * a message sharing two or more parts with an existing one ("A B" / "A B D" vs
      "A B C") must have an exact Jaccard below SHARED_MAX_J with it;
    * messages sharing one part must not differ only by *similar* other parts: a text
      never gets two partners overlapping each other by SIMILAR_CONTAINMENT or more
      (dropped only after many failed draws, and counted in the summary).

    2-part sets are drawn first, without replacement from those satisfying the part bound;
    a label whose pairs are used up moves on to 3-part sets."""

    def __init__(self, pool: Pool, rng: random.Random, nprng: np.random.Generator) -> None:
        self.pool, self.rng, self.nprng = pool, rng, nprng
        n_labels = len(pool.label_names)
        self.n = len(pool.texts)
        self.lengths = np.array([len(t) for t in pool.texts], dtype=np.int64)
        self.members = [np.flatnonzero(pool.labels == lab) for lab in range(n_labels)]
        self.pairs: list[np.ndarray] = []
        self.cursor = [0] * n_labels
        self.similar: list[tuple[int, ...]] = [()] * self.n
        self.partners: list[set[int]] = [set() for _ in pool.texts]
        self.used: set[tuple[int, ...]] = set()
        self.pair_msgs: set[int] = set()  # pair keys used as 2-part messages
        self.multi: dict[int, list[tuple[int, ...]]] = {}  # pair key -> 3+-part messages
        self.relaxed = 0
        self._unions: dict[tuple[int, ...], frozenset[bytes]] = {}
        self.strict_exhausted: set[int] = set()
        self.by_parts: Counter[int] = Counter()
        for lab in range(n_labels):
            self._prepare_label(lab)

    def _prepare_label(self, lab: int) -> None:
        mem = self.members[lab]
        inter = _intersection_matrix([self.pool.sets[i] for i in mem])
        size = np.diag(inter).astype(np.int64)
        union = size[:, None] + size[None, :] - inter
        lens = self.lengths[mem]
        ok = np.maximum(size[:, None], size[None, :]) <= PART_MAX * union
        ok &= lens[:, None] + lens[None, :] + 1 <= MAX_COMPOSED_CHARS
        pairs = np.argwhere(np.triu(ok, 1)).astype(np.int32)
        self.pairs.append(pairs[self.nprng.permutation(len(pairs))])
        contain = inter / np.maximum(np.minimum(size[:, None], size[None, :]), 1)
        np.fill_diagonal(contain, 0.0)
        for a, row in enumerate(contain >= SIMILAR_CONTAINMENT):
            self.similar[int(mem[a])] = tuple(int(x) for x in mem[np.flatnonzero(row)])

    def _key(self, x: int, y: int) -> int:
        return min(x, y) * self.n + max(x, y)

    def _compatible(self, parts: Sequence[int]) -> bool:
        for x in parts:
            p = self.partners[x]
            for o in parts:
                if o != x and any(s in p for s in self.similar[o]):
                    return False
        return True

    def _union(self, parts: Sequence[int]) -> set[bytes]:
        return set().union(*(self.pool.sets[p] for p in parts))

    def _union_cached(self, parts: tuple[int, ...]) -> frozenset[bytes]:
        # Registered messages are compared again and again as "others"; their unions are
        # kept (bounded, oldest first out) instead of rebuilt for every candidate.
        u = self._unions.get(parts)
        if u is None:
            if len(self._unions) >= 400_000:
                self._unions.pop(next(iter(self._unions)))
            u = self._unions[parts] = frozenset(self._union(parts))
        return u

    def _ok(self, parts: tuple[int, ...], strict: bool) -> bool:
        # A pure predicate: the checks are ordered cheapest first (set unions last), which
        # changes nothing but the time a million-row build takes.
        if int(self.lengths[list(parts)].sum()) + len(parts) - 1 > MAX_COMPOSED_CHARS:
            return False
        if tuple(sorted(parts)) in self.used:
            return False
        if strict and not self._compatible(parts):
            return False
        union = self._union(parts)
        if max(len(self.pool.sets[p]) for p in parts) > PART_MAX * len(union):
            return False
        others: list[tuple[int, ...]] = []
        for i, x in enumerate(parts):
            for y in parts[i + 1:]:
                k = self._key(x, y)
                if k in self.pair_msgs:
                    others.append((x, y))
                others.extend(self.multi.get(k, ()))
        for other in dict.fromkeys(others):
            ou = self._union_cached(other)
            inter = len(union & ou)
            if inter >= SHARED_MAX_J * (len(union) + len(ou) - inter):
                return False
        return True

    def _register(self, parts: tuple[int, ...], strict: bool = True) -> tuple[int, ...]:
        for i, x in enumerate(parts):
            self.partners[x].update(o for o in parts if o != x)
            for y in parts[i + 1:]:
                if len(parts) == 2:
                    self.pair_msgs.add(self._key(x, y))
                else:
                    self.multi.setdefault(self._key(x, y), []).append(parts)
        self.used.add(tuple(sorted(parts)))
        self.by_parts[len(parts)] += 1
        self.relaxed += not strict
        return parts

    def _pair(self, lab: int) -> tuple[int, ...] | None:
        mem, pairs = self.members[lab], self.pairs[lab]
        while self.cursor[lab] < len(pairs):
            a, b = (int(mem[x]) for x in pairs[self.cursor[lab]])
            self.cursor[lab] += 1
            parts = (a, b) if self.rng.random() < 0.5 else (b, a)
            if b not in self.partners[a] and self._ok(parts, strict=True):
                return self._register(parts)
        return None

    def _multi(self, lab: int) -> tuple[int, ...]:
        mem = self.members[lab]
        _check(len(mem) >= 4, f"label {self.pool.label_names[lab]!r} has fewer than 4 texts")
        # 3 parts; 4 only when a label's 3-part space is crowded; the similar-partner rule
        # is dropped last (far beyond a million rows), never the exact-Jaccard check.
        # Once a label's strict space has failed a whole round, later draws for it go straight
        # to the relaxed rule: at a million rows the strict rounds otherwise cost ~500 failed
        # tries per message and the build time grows quadratically.
        rounds = ((3, True, 300), (4, True, 200), (3, False, 200), (4, False, 200))
        if lab in self.strict_exhausted:
            rounds = rounds[2:]
        for k, strict, tries in rounds:
            for _ in range(tries):
                parts = tuple(int(mem[x]) for x in self.rng.sample(range(len(mem)), k))
                if self._ok(parts, strict):
                    return self._register(parts, strict)
            if strict and k == 4:
                self.strict_exhausted.add(lab)
        raise RuntimeError(f"cannot compose more distinct messages for {self.pool.label_names[lab]}")

    def draw(self, n: int, label: int | None = None) -> list[tuple[int, ...]]:
        """``n`` new part tuples (pool indices), labels drawn like the pool's (or ``label``)."""
        if label is None:
            w = np.array([len(m) for m in self.members], dtype=np.float64)
            labels = self.nprng.choice(len(w), size=n, p=w / w.sum())
        else:
            labels = np.full(n, label)
        return [self._pair(int(lab)) or self._multi(int(lab)) for lab in labels]


def _intersection_matrix(sets: Sequence[frozenset[bytes]]) -> np.ndarray:
    """|s_i & s_j| for all pairs, by one dense matrix product over the label's vocabulary."""
    vocab: dict[bytes, int] = {}
    rows, cols = [], []
    for i, s in enumerate(sets):
        for t in s:
            rows.append(i)
            cols.append(vocab.setdefault(t, len(vocab)))
    m = np.zeros((len(sets), max(len(vocab), 1)), dtype=np.float32)
    m[rows, cols] = 1.0
    return np.rint(m @ m.T).astype(np.int64)


def make_bases(pool: Pool, n: int, seed: int) -> tuple[list[str], np.ndarray, dict[str, int]]:
    """``n`` distinct base messages: pool texts first (shuffled), then compositions."""
    nprng = _np_rng(seed, 1)
    order = nprng.permutation(len(pool.texts))[:n]
    texts = [pool.texts[i] for i in order]
    labels = [int(pool.labels[i]) for i in order]
    stats = {"single": len(texts), "composed_2": 0, "composed_3": 0, "composed_4": 0,
             "composed_relaxed": 0}
    if n > len(texts):
        composer = Composer(pool, _py_rng(seed, "compose"), _np_rng(seed, 2))
        for parts in composer.draw(n - len(texts)):
            texts.append(" ".join(pool.texts[p] for p in parts))
            labels.append(int(pool.labels[parts[0]]))
        stats.update(composed_2=composer.by_parts[2], composed_3=composer.by_parts[3],
                     composed_4=composer.by_parts[4], composed_relaxed=composer.relaxed)
    return texts, np.array(labels, dtype=np.int16), stats
