"""Raw-data builder: turn Banking77 into a realistic raw export of a customer-service
system, with a ground-truth record of everything planted in it.

What: ``OUT/raw.<csv|jsonl|parquet>`` (ticket_id, created_at, channel, message, intent,
annotations) holding originals with synthetic personal data (names, e-mails, phones, Luhn-valid
cards, IBANs, US SSNs, PRC IDs, addresses, IPs) and look-alike decoys, exact and near
duplicates, defective rows, benign Unicode/whitespace noise and several annotators per
message with planted label errors; ``OUT/ground_truth/`` (``rows.parquet``,
``pii_spans.parquet``, ``summary.json``) says which row is which.

Why: every pipeline stage (clean, dedup, desensitize, label QA) can then be measured
against a known truth instead of eyeballed. The build is deterministic for a seed (same
seed and arguments give byte-identical files) and fast enough for a million rows.

    python -m demo.builder --out var/demo/raw --rows 20000 --seed 7 --format csv
"""

from __future__ import annotations

import argparse
import bisect
import csv
import dataclasses
import functools
import hashlib
import ipaddress
import json
import math
import random
import re
import sys
import time
import unicodedata
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from pii import checksums as ck
from textnorm import (
    CONTROL_RE,
    MOJIBAKE_RE,
    dedup_key,
    normalize_label,
    normalize_text,
    shingles,
)

__all__ = [
    "COLUMNS",
    "DECOY_TYPES",
    "DEFECT_KINDS",
    "EXACT_KINDS",
    "NEAR_KINDS",
    "NOISE_KINDS",
    "PII_TYPES",
    "BuilderConfig",
    "Composer",
    "Pool",
    "build_pool",
    "build_raw",
    "main",
]

BANKING77 = Path(__file__).resolve().parent.parent / "data" / "banking77"
COLUMNS = ("ticket_id", "created_at", "channel", "message", "intent", "annotations")
CHANNELS = ("email", "chat", "app", "phone_transcript")
CHANNEL_P = (0.30, 0.35, 0.25, 0.10)
EPOCH = np.datetime64("2026-11-01T00:00:00", "s")
WINDOW_S = 7 * 86400

EXACT_KINDS = ("exact", "case", "punct", "whitespace")
NEAR_KINDS = ("word_swap", "clause_added")
DEFECT_KINDS = (
    "empty_text",
    "whitespace_text",
    "missing_label",
    "unknown_label",
    "control_chars",
    "mojibake",
    "too_long",
    "malformed_record",
)
# label_variant is half of the noise so that ~2.5% of clean rows carry a label spelled the
# way CRMs export it ("Card Arrival"); the four text kinds share the other half.
NOISE_WEIGHTS = {
    "nbsp": 0.125,
    "zero_width": 0.125,
    "fullwidth": 0.125,
    "tabs": 0.125,
    "label_variant": 0.5,
}
NOISE_KINDS = tuple(NOISE_WEIGHTS)
PII_WEIGHTS = {
    "person_name": 0.22,
    "email": 0.14,
    "phone": 0.14,
    "card_number": 0.10,
    "iban": 0.09,
    "us_ssn": 0.06,
    "prc_id": 0.06,
    "street_address": 0.11,
    "ip_address": 0.08,
}
PII_TYPES = tuple(PII_WEIGHTS)
DECOY_TYPES = ("decoy_card", "decoy_iban", "decoy_ssn", "decoy_prc_id")
UNKNOWN_LABELS = (
    "refund_status_xyz",
    "card_arival",
    "general_enquiry",
    "complaint",
    "account_closure_request",
    "other",
)

NEAR_DUP_J = 0.8  # the dedup threshold: originals must stay below it pairwise
MIN_TEXT_CHARS = 3
MAX_COMPOSED_CHARS = 600  # + PII, decoys, clauses stays well under clean.max_chars=1000
MAX_CLEAN_CHARS = 990
TOO_LONG_CHARS = 1500
HARMLESS_SHARE = 0.05  # originals with plain amounts/dates/refs (not recorded as spans)
SINGLE_ANNOTATOR_SHARE = 0.05
FULLWIDTH_PII_SHARE = 0.02
# Annotator error rates as multiples of label_error_rate (mean 1.0): at 0.08 that is
# 2%, 4%, 6%, 8%, 8%, 10%, 12%, 14%.
RELIABILITY = (0.25, 0.5, 0.75, 1.0, 1.0, 1.25, 1.5, 1.75)
NEIGHBOUR_ERROR_SHARE = 0.5  # label errors that pick a confusable neighbour label
# Composition rules (see Composer): a part may make up at most PART_MAX of a composed
# message's shingles; messages sharing 2+ parts stay below SHARED_MAX_J; two texts
# overlapping by SIMILAR_CONTAINMENT (of the smaller) count as "similar". The margins below
# 0.8 leave room for PII, clauses and near copies added later.
PART_MAX = 0.72
SHARED_MAX_J = 0.72
SIMILAR_CONTAINMENT = 0.5
# Share of word swaps that cannot reach the threshold which become a clause instead; the
# rest stay as planted, below the threshold (~2% of near copies).
SWAP_FALLBACK_SHARE = 0.6


def _check(cond: bool, msg: str) -> None:
    # Builder invariants are checked with an explicit raise so that `python -O` keeps them.
    if not cond:
        raise AssertionError(msg)


# --------------------------------------------------------------------------- config


@dataclass
class BuilderConfig:
    rows: int
    seed: int = 7
    fmt: Literal["csv", "jsonl", "parquet"] = "csv"
    pii_share: float = 0.3
    exact_dup_share: float = 0.05
    near_dup_share: float = 0.08
    defect_share: float = 0.03
    label_error_rate: float = 0.08
    annotators_per_item: int = 3
    decoy_share: float = 0.03
    noise_share: float = 0.05
    source: Literal["train", "test", "all"] = "all"

    def validate(self) -> None:
        if self.rows < 1:
            raise ValueError(f"rows must be >= 1, got {self.rows}")
        if self.fmt not in ("csv", "jsonl", "parquet"):
            raise ValueError(f"fmt must be csv, jsonl or parquet, got {self.fmt!r}")
        if self.source not in ("train", "test", "all"):
            raise ValueError(f"source must be train, test or all, got {self.source!r}")
        for name in ("pii_share", "exact_dup_share", "near_dup_share", "defect_share",
                     "label_error_rate", "decoy_share", "noise_share"):
            v = getattr(self, name)
            if not 0.0 <= v <= 1.0:
                raise ValueError(f"{name} must be within [0, 1], got {v}")
        if self.exact_dup_share + self.near_dup_share + self.defect_share >= 1.0:
            raise ValueError("exact_dup_share + near_dup_share + defect_share must be < 1")
        if not 1 <= self.annotators_per_item <= len(RELIABILITY):
            raise ValueError(f"annotators_per_item must be within 1..{len(RELIABILITY)}")


def _py_rng(seed: int, stream: str) -> random.Random:
    # A string seed is hashed with SHA-512 by random.seed: stable across processes.
    return random.Random(f"intentops-rawdata:{seed}:{stream}")


def _np_rng(seed: int, stream: int) -> np.random.Generator:
    return np.random.default_rng([seed, stream])


# --------------------------------------------------------------------------- source pool


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


# --------------------------------------------------------------------------- messages as parts

# A message is a list of parts (text, span type or None); typed parts are the recorded
# PII/decoy values. Edits touch plain parts only (a re-sent ticket keeps its PII values),
# and rendering recomputes every span offset.
Part = tuple[str, str | None]
Span = tuple[str, int, int]


def render(parts: Sequence[Part]) -> tuple[str, list[Span]]:
    out, spans, pos = [], [], 0
    for text, kind in parts:
        if not text:
            continue
        if kind is not None:
            spans.append((kind, pos, pos + len(text)))
        out.append(text)
        pos += len(text)
    return "".join(out), spans


def to_parts(text: str, spans: Sequence[Span] | None) -> list[Part]:
    if not spans:
        return [(text, None)]
    parts: list[Part] = []
    pos = 0
    for kind, start, end in sorted(spans, key=lambda s: s[1]):
        parts.append((text[pos:start], None))
        parts.append((text[start:end], kind))
        pos = end
    parts.append((text[pos:], None))
    return [p for p in parts if p[0]]


def _edit_plain(parts: list[Part], rng: random.Random, pattern: re.Pattern[str],
                edit: Callable[[re.Match[str]], str]) -> list[Part] | None:
    """Apply ``edit`` to one random match of ``pattern`` inside a plain part; None if none."""
    hits = [(i, m) for i, (t, k) in enumerate(parts) if k is None for m in pattern.finditer(t)]
    if not hits:
        return None
    i, m = rng.choice(hits)
    t = parts[i][0]
    return [*parts[:i], (t[: m.start()] + edit(m) + t[m.end():], None), *parts[i + 1:]]


# --------------------------------------------------------------------------- synthetic PII

NAME_LOCALES = ("en_US", "en_GB", "de_DE", "fr_FR", "es_ES", "it_IT", "nl_NL")
ADDRESS_LOCALES = ("en_US", "en_GB", "de_DE", "fr_FR")
TITLES = ("Mr.", "Ms.", "Mrs.", "Dr.")
EMAIL_DOMAINS = (
    "gmail.com", "outlook.com", "yahoo.co.uk", "web.de", "orange.fr", "qq.com", "proton.me",
    "hotmail.com", "gmx.de", "acme-corp.com", "northwind-traders.co.uk", "globex.de",
)  # fmt: skip
IBAN_COUNTRIES = ("DE", "GB", "FR", "ES", "IT", "NL", "BE", "AT", "CH", "IE", "PT", "PL")
_FW_DIGITS = {ord(c): 0xFF10 + i for i, c in enumerate("0123456789")}
_FW_ASCII = {c: c + 0xFEE0 for c in range(0x21, 0x7F)}
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


def _lower_first(text: str) -> str:
    if text[:2] in ("I ", "I'") or not text[:1].isupper():
        return text
    return text[0].lower() + text[1:]


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


# --------------------------------------------------------------------------- duplicates

_PUNCT_RE = re.compile(r"[.?!,](?=\s|$)")
_SPACE_RE = re.compile(r" ")
# A word not glued to an apostrophe or a digit: replacing it keeps its neighbours intact.
_WORD_RE = re.compile(r"(?<![\w'’])[A-Za-z]{2,}(?![\w'’])")
_INNER_RE = re.compile(r"[A-Za-z](?=[A-Za-z])")
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


# --------------------------------------------------------------------------- noise and defects


def apply_noise(parts: list[Part], kind: str, rng: random.Random) -> list[Part] | None:
    """Benign noise that normalize_text undoes; None if the message offers no place for it."""
    if kind == "nbsp":
        return _edit_plain(parts, rng, _SPACE_RE, lambda m: "\u00a0")
    if kind == "tabs":
        return _edit_plain(parts, rng, _SPACE_RE, lambda m: "\t")
    if kind == "zero_width":
        return _edit_plain(parts, rng, _INNER_RE, lambda m: m.group() + "\u200b")
    if kind == "fullwidth":
        return _edit_plain(parts, rng, _WORD_RE, lambda m: m.group().translate(_FW_ASCII))
    raise ValueError(kind)


def label_variant(label: str, rng: random.Random) -> str:
    """The label as a CRM exports it; textnorm.normalize_label maps it back."""
    words = label.split("_")
    variants = (
        " ".join(w.capitalize() for w in words),
        "-".join(words),
        f" {label.upper()} ",
        "_".join(w.capitalize() for w in words),
        " ".join(words),
        f"{label} ",
    )
    v = rng.choice([x for x in variants if x != label])
    _check(normalize_label(v) == label, f"label variant {v!r} does not normalize to {label!r}")
    return v


def _mojibake(text: str) -> str:
    # Make sure there is a non-ASCII character to mangle, then read UTF-8 as cp1252.
    if "'" in text:
        text = text.replace("'", "’")
    elif text.isascii():
        text += " I’m still waiting."
    raw = text.encode("utf-8")
    try:
        out = raw.decode("cp1252")
    except UnicodeDecodeError:  # bytes cp1252 leaves undefined: latin-1 like most tools
        out = "".join(bytes([b]).decode("cp1252", errors="ignore") or chr(b) for b in raw)
    _check(MOJIBAKE_RE.search(out) is not None, f"mojibake not detectable: {out!r}")
    return out


def make_defect(kind: str, text: str, rng: random.Random) -> str:
    if kind == "empty_text":
        return ""
    if kind == "whitespace_text":
        return rng.choice(("   \t ", " ", "\t\t", "    ", " \t"))
    if kind == "control_chars":
        ch = rng.choice([chr(c) for c in range(0x00, 0x09)] + ["\x1b", "\x1b[31m"])
        cuts = [m.start() for m in _SPACE_RE.finditer(text)] or [len(text)]
        cut = rng.choice(cuts)
        return text[:cut] + ch + text[cut:]
    if kind == "mojibake":
        return _mojibake(text)
    if kind == "too_long":
        return " ".join([text] * (TOO_LONG_CHARS // (len(text) + 1) + 2))
    return text  # labels and malformed records keep a normal message


# --------------------------------------------------------------------------- annotations


def _neighbour_table(names: Sequence[str]) -> tuple[np.ndarray, np.ndarray]:
    """Confusable labels per label: same first word (card_*, top_*), else a shared word."""
    stop = {"or", "by", "of", "and", "to", "after", "not", "a", "the", "on", "my", "for", "into", "via"}
    toks = [set(n.rstrip("?").split("_")) - stop for n in names]
    lists = []
    for i, n in enumerate(names):
        head = n.split("_")[0]
        nb = [j for j, m in enumerate(names) if j != i and m.split("_")[0] == head]
        lists.append(nb or [j for j in range(len(names)) if j != i and toks[i] & toks[j]])
    width = max(1, max(len(x) for x in lists))
    table = np.zeros((len(names), width), dtype=np.int16)
    for i, nb in enumerate(lists):
        table[i, : len(nb)] = nb
    return table, np.array([len(x) for x in lists], dtype=np.int64)


@dataclass
class Annotations:
    json: list[str]
    first_label: np.ndarray
    n_annotations: int
    n_wrong: int
    first_wrong: int
    single_annotator_rows: int


def annotate(true_labels: np.ndarray, names: Sequence[str], cfg: BuilderConfig) -> Annotations:
    """Vectorized: annotators drawn per row from a pool of 8 of varied reliability; an error
    is a confusable neighbour label half the time, else any other label."""
    rng = _np_rng(cfg.seed, 3)
    n, pool_n, n_labels = len(true_labels), len(RELIABILITY), len(names)
    k = cfg.annotators_per_item
    err = np.clip(cfg.label_error_rate * np.array(RELIABILITY), 0.0, 0.95)
    who = np.argsort(rng.random((n, pool_n)), axis=1)[:, :k]
    count = np.full(n, k)
    count[rng.random(n) < SINGLE_ANNOTATOR_SHARE] = 1
    truth = true_labels.astype(np.int64)[:, None].repeat(k, axis=1)
    wrong = rng.random((n, k)) < err[who]
    table, nb_count = _neighbour_table(names)
    use_nb = (rng.random((n, k)) < NEIGHBOUR_ERROR_SHARE) & (nb_count[truth] > 0)
    nb_pick = table[truth, (rng.random((n, k)) * np.maximum(nb_count[truth], 1)).astype(np.int64)]
    other = rng.integers(0, n_labels - 1, size=(n, k))
    other += other >= truth  # any label but the true one
    labels = np.where(wrong, np.where(use_nb, nb_pick, other), truth)
    active = np.arange(k)[None, :] < count[:, None]
    ann_str = [[f'{{"annotator": "ann_{a + 1:02d}", "label": "{lab}"}}' for lab in names]
               for a in range(pool_n)]
    out = []
    for row_who, row_lab, c in zip(who.tolist(), labels.tolist(), count.tolist(), strict=True):
        out.append("[" + ", ".join(ann_str[a][b] for a, b in zip(row_who[:c], row_lab[:c],
                                                                strict=True)) + "]")
    mis = (labels != truth) & active
    return Annotations(
        json=out,
        first_label=labels[:, 0],
        n_annotations=int(active.sum()),
        n_wrong=int(mis.sum()),
        first_wrong=int(mis[:, 0].sum()),
        single_annotator_rows=int((count == 1).sum()),
    )


# --------------------------------------------------------------------------- the build


@dataclass
class Rows:
    """All rows in generation order: originals, then copies, then defects."""

    message: list[str]
    spans: list[list[Span] | None]
    label: list[int]
    origin: list[int]
    dup_kind: list[str | None]
    dup_jaccard: list[float | None]
    defect: list[str | None]
    noise: list[str | None]
    has_pii: list[bool]


def _counts(cfg: BuilderConfig) -> tuple[int, int, int, int]:
    n = cfg.rows
    n_def = round(n * cfg.defect_share)
    n_exact, n_near = round(n * cfg.exact_dup_share), round(n * cfg.near_dup_share)
    if n - n_def - n_exact - n_near < 1:  # tiny builds: copies need an original
        n_exact = n_near = 0
        n_def = min(n_def, n - 1)
    return n - n_def - n_exact - n_near, n_exact, n_near, n_def


def _defect_kinds(n: int, fmt: str, rng: random.Random) -> list[str]:
    # Parquet has no physical record to break: its share goes to the other kinds.
    kinds = [k for k in DEFECT_KINDS if not (fmt == "parquet" and k == "malformed_record")]
    out = [kinds[i % len(kinds)] for i in range(n)]
    rng.shuffle(out)
    return out


def _build_originals(texts: list[str], cfg: BuilderConfig, factory: PiiFactory,
                     rng: random.Random, nprng: np.random.Generator,
                     ) -> tuple[list[str], list[list[Span] | None], list[bool]]:
    n = len(texts)
    pii_rows = set(nprng.choice(n, size=round(n * cfg.pii_share), replace=False).tolist())
    decoy_rows = set(nprng.choice(n, size=round(n * cfg.decoy_share), replace=False).tolist())
    harmless = nprng.random(n) < HARMLESS_SHARE
    pii_types, pii_p = list(PII_WEIGHTS), list(PII_WEIGHTS.values())
    messages, spans, has_pii = [], [], []
    for i, text in enumerate(texts):
        if i not in pii_rows and i not in decoy_rows and not harmless[i]:
            messages.append(text)
            spans.append(None)
            has_pii.append(False)
            continue
        parts: list[Part] = [(text, None)]
        if harmless[i]:
            parts = add_harmless(parts, rng)
        if i in decoy_rows:
            parts = add_decoy(parts, rng.choice(DECOY_TYPES), rng)
        if i in pii_rows:
            kinds = [rng.choices(pii_types, pii_p)[0]]
            if rng.random() < 0.3:
                second = rng.choices(pii_types, pii_p)[0]
                if second != kinds[0]:
                    kinds.append(second)
            parts = add_pii(parts, kinds, factory, rng)
        msg, sp = render(parts)
        messages.append(msg)
        spans.append(sp or None)
        has_pii.append(i in pii_rows)
    return messages, spans, has_pii


def _plan_copies(n_orig: int, n_exact: int, n_near: int, rng: random.Random,
                 nprng: np.random.Generator) -> list[tuple[int, str]]:
    """(original index, kind) per copy; an original gets 1-3 copies."""
    total = n_exact + n_near
    if total == 0:
        return []
    per = nprng.choice([1, 2, 3], size=total, p=[0.75, 0.18, 0.07])
    n_src = int(np.searchsorted(np.cumsum(per), total) + 1)
    srcs = nprng.choice(n_orig, size=n_src, replace=n_src > n_orig)
    slots = [int(s) for s, c in zip(srcs, per[:n_src], strict=True) for _ in range(int(c))][:total]
    kinds = [EXACT_KINDS[i % 4] for i in range(n_exact)] + [NEAR_KINDS[i % 2] for i in range(n_near)]
    rng.shuffle(kinds)
    return list(zip(slots, kinds, strict=True))


def _make_rows(cfg: BuilderConfig, pool: Pool) -> tuple[Rows, dict[str, Any]]:
    n_orig, n_exact, n_near, n_def = _counts(cfg)
    rng, nprng = _py_rng(cfg.seed, "rows"), _np_rng(cfg.seed, 4)
    texts, labels, base_stats = make_bases(pool, n_orig + n_def, cfg.seed)
    # Defects come from their own fresh messages, never from an original of other rows.
    is_def = np.zeros(len(texts), dtype=bool)
    is_def[nprng.choice(len(texts), size=n_def, replace=False)] = True
    orig_texts = [t for t, d in zip(texts, is_def, strict=True) if not d]
    orig_labels = labels[~is_def].tolist()
    def_texts, def_labels = [t for t, d in zip(texts, is_def, strict=True) if d], labels[is_def].tolist()

    factory = PiiFactory(cfg.seed, int(np.clip(cfg.rows // 50, 200, 2500)))
    messages, spans, has_pii = _build_originals(orig_texts, cfg, factory, rng, nprng)
    rows = Rows(message=messages, spans=spans, label=list(orig_labels), origin=list(range(n_orig)),
                dup_kind=[None] * n_orig, dup_jaccard=[None] * n_orig, defect=[None] * n_orig,
                noise=[None] * n_orig, has_pii=has_pii)

    orig_sets: dict[int, frozenset[bytes]] = {}
    for src, kind in _plan_copies(n_orig, n_exact, n_near, rng, nprng):
        parts = to_parts(messages[src], spans[src])
        if kind in EXACT_KINDS:
            parts, kind = exact_class_copy(parts, kind, rng)
            j = None
        else:
            if src not in orig_sets:
                orig_sets[src] = frozenset(shingles(messages[src]))
            parts, kind, j = near_copy(parts, kind, orig_sets[src], rng)
        msg, sp = render(parts)
        rows.message.append(msg)
        rows.spans.append(sp or None)
        rows.label.append(orig_labels[src])
        rows.origin.append(src)
        rows.dup_kind.append(kind)
        rows.dup_jaccard.append(j)
        rows.defect.append(None)
        rows.noise.append(None)
        rows.has_pii.append(has_pii[src])

    for text, lab, kind in zip(def_texts, def_labels, _defect_kinds(n_def, cfg.fmt, rng), strict=True):
        rows.origin.append(len(rows.message))
        rows.message.append(make_defect(kind, text, rng))
        rows.spans.append(None)
        rows.label.append(lab)
        rows.dup_kind.append(None)
        rows.dup_jaccard.append(None)
        rows.defect.append(kind)
        rows.noise.append(None)
        rows.has_pii.append(False)

    _add_noise(rows, cfg, rng, nprng)
    return rows, base_stats


def _add_noise(rows: Rows, cfg: BuilderConfig, rng: random.Random, nprng: np.random.Generator) -> None:
    clean = [i for i, d in enumerate(rows.defect) if d is None]
    picked = nprng.choice(len(clean), size=round(len(clean) * cfg.noise_share), replace=False)
    kinds, weights = list(NOISE_WEIGHTS), list(NOISE_WEIGHTS.values())
    for p in sorted(picked.tolist()):
        i = clean[p]
        kind = rng.choices(kinds, weights)[0]
        if kind != "label_variant" and rows.dup_kind[i] != "exact":  # exact stays identical
            before = rows.message[i]
            parts = apply_noise(to_parts(before, rows.spans[i]), kind, rng)
            if parts is not None:
                msg, sp = render(parts)
                _check(normalize_text(msg) == normalize_text(before), f"{kind} noise not benign")
                rows.message[i], rows.spans[i] = msg, sp or None
            else:
                kind = "label_variant"
        else:
            kind = "label_variant"
        rows.noise[i] = kind


def _timestamps(rows: Rows, nprng: np.random.Generator) -> list[str]:
    n = len(rows.message)
    secs = nprng.integers(0, WINDOW_S - 3600, size=n)
    origin = np.array(rows.origin)
    copy = np.array([k is not None for k in rows.dup_kind])
    # A re-sent ticket comes after its original: 1 minute to 3 days later, within the window.
    room = np.minimum(3 * 86400, WINDOW_S - 1 - secs[origin])
    delay = 60 + (nprng.random(n) * np.maximum(room - 60, 1)).astype(np.int64)
    secs = np.where(copy, secs[origin] + delay, secs)
    stamps = np.datetime_as_string(EPOCH + secs.astype("timedelta64[s]"), unit="s")
    return [s + "Z" for s in stamps.tolist()]


def _check_rows(rows: Rows) -> None:
    for i, msg in enumerate(rows.message):
        _check("\n" not in msg and "\r" not in msg, f"raw newline in row {i}")
        for kind, start, end in rows.spans[i] or ():
            _check(start < end <= len(msg), f"bad span {kind} in row {i}")
        if rows.defect[i] is None:
            # Clean rows must pass the clean stage: no reject rule may fire on them.
            _check(len(msg) <= MAX_CLEAN_CHARS, f"clean row {i} too long")
            _check(not CONTROL_RE.search(msg) and not MOJIBAKE_RE.search(msg),
                   f"clean row {i} looks defective: {msg!r}")


def _malformed_line(tid: str, ts: str, channel: str, msg: str, intent: str,
                    rng: random.Random) -> str:
    # An unclosed quote: a line-based CSV reader sees fewer fields than the header.
    msg = msg.replace('"', "")
    if rng.random() < 0.5:
        return f'{tid},{ts},"{channel},{msg}'
    return f'{tid},{ts},{channel},"{msg},{intent},[{{'


def _write_raw(path: Path, fmt: str, cols: dict[str, list[Any]], defect: list[str | None],
               rng: random.Random) -> None:
    n = len(cols["ticket_id"])
    if fmt == "parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        table = pa.table({c: pa.array(cols[c], type=pa.string()) for c in COLUMNS})
        pq.write_table(table, path)
        return
    with path.open("w", encoding="utf-8", newline="") as fh:
        if fmt == "csv":
            w = csv.writer(fh, quoting=csv.QUOTE_MINIMAL, lineterminator="\n")
            w.writerow(COLUMNS)
            for i in range(n):
                rec = [cols[c][i] for c in COLUMNS]
                if defect[i] == "malformed_record":
                    fh.write(_malformed_line(*rec[:5], rng) + "\n")
                else:
                    w.writerow(rec)
        else:
            for i in range(n):
                line = json.dumps({c: cols[c][i] for c in COLUMNS}, ensure_ascii=False)
                if defect[i] == "malformed_record":
                    line = line[: rng.randint(10, len(line) - 2)]  # a truncated object
                fh.write(line + "\n")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _write_daily(out: Path, fmt: str, cols: dict[str, list[Any]], defect: list[str | None],
                 seed: int) -> dict[str, int]:
    """The same rows again as a date-partitioned export, ``out/date=YYYY-MM-DD/raw.<fmt>``,
    the layout a scheduled run reads one day of. A row goes to its ``created_at`` day; a
    row whose timestamp is broken (a planted defect) goes to the day of the row before
    it, as an export job partitioning by ingestion time would put it."""
    days: list[str] = []
    for ts in cols["created_at"]:
        ok = isinstance(ts, str) and re.fullmatch(r"\d{4}-\d{2}-\d{2}T.*", ts or "")
        days.append(ts[:10] if ok else (days[-1] if days else EPOCH.astype(str)[:10]))
    counts: dict[str, int] = {}
    for day in sorted(set(days)):
        idx = [i for i, d in enumerate(days) if d == day]
        part = out / f"date={day}"
        part.mkdir(parents=True, exist_ok=True)
        _write_raw(part / f"raw.{fmt}", fmt, {c: [cols[c][i] for i in idx] for c in COLUMNS},
                   [defect[i] for i in idx], _py_rng(seed, f"daily-{day}"))
        counts[day] = len(idx)
    return counts


def build_raw(out_dir: str | Path, config: BuilderConfig, daily: bool = False) -> dict[str, Any]:
    """Build ``out_dir/raw.<fmt>`` and ``out_dir/ground_truth/`` (and with ``daily`` the
    same rows partitioned by day under ``out_dir/daily/``); returns the summary."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    config.validate()
    t0 = time.perf_counter()
    out = Path(out_dir)
    gt_dir = out / "ground_truth"
    gt_dir.mkdir(parents=True, exist_ok=True)
    pool = build_pool(config.source)
    rows, base_stats = _make_rows(config, pool)
    _check_rows(rows)
    names = pool.label_names
    n = len(rows.message)
    nprng = _np_rng(config.seed, 5)
    ann = annotate(np.array(rows.label, dtype=np.int64), names, config)

    given: list[str | None] = [names[x] for x in ann.first_label.tolist()]
    rng = _py_rng(config.seed, "output")
    for i in range(n):
        if rows.noise[i] == "label_variant":
            given[i] = label_variant(given[i], rng)
        elif rows.defect[i] == "missing_label":
            given[i] = ""
        elif rows.defect[i] == "unknown_label":
            given[i] = rng.choice(UNKNOWN_LABELS)
    stamps = _timestamps(rows, nprng)
    channels = nprng.choice(len(CHANNELS), size=n, p=CHANNEL_P).tolist()

    order = nprng.permutation(n)  # output position -> generation index
    pos = np.empty(n, dtype=np.int64)
    pos[order] = np.arange(n)
    tid = [f"TCK-{p + 1:08d}" for p in pos.tolist()]
    ol = order.tolist()
    cols = {
        "ticket_id": [tid[g] for g in ol],
        "created_at": [stamps[g] for g in ol],
        "channel": [CHANNELS[channels[g]] for g in ol],
        "message": [rows.message[g] for g in ol],
        "intent": [given[g] for g in ol],
        "annotations": [ann.json[g] for g in ol],
    }
    fname = f"raw.{config.fmt}"
    raw_path = out / fname
    _write_raw(raw_path, config.fmt, cols, [rows.defect[g] for g in ol], rng)
    daily_rows = (_write_daily(out / "daily", config.fmt, cols, [rows.defect[g] for g in ol],
                               config.seed) if daily else None)

    malformed = [rows.defect[g] == "malformed_record" for g in ol]
    gt = pa.table({
        "ticket_id": pa.array(cols["ticket_id"], pa.string()),
        "origin_id": pa.array([tid[rows.origin[g]] for g in ol], pa.string()),
        "dup_kind": pa.array([rows.dup_kind[g] for g in ol], pa.string()),
        "dup_jaccard": pa.array([rows.dup_jaccard[g] for g in ol], pa.float64()),
        "defect": pa.array([rows.defect[g] for g in ol], pa.string()),
        "noise": pa.array([rows.noise[g] for g in ol], pa.string()),
        "true_label": pa.array([names[rows.label[g]] for g in ol], pa.string()),
        "has_pii": pa.array([rows.has_pii[g] for g in ol], pa.bool_()),
        "annotator_labels": pa.array([None if m else a for a, m in
                                      zip(cols["annotations"], malformed, strict=True)], pa.string()),
        "given_label": pa.array([None if m else g for g, m in
                                 zip(cols["intent"], malformed, strict=True)], pa.string()),
    })  # fmt: skip
    pq.write_table(gt, gt_dir / "rows.parquet")

    span_cols: dict[str, list[Any]] = {"ticket_id": [], "pii_type": [], "start": [], "end": [], "value": []}
    for p, g in enumerate(ol):
        for kind, start, end in rows.spans[g] or ():
            msg = cols["message"][p]
            span_cols["ticket_id"].append(cols["ticket_id"][p])
            span_cols["pii_type"].append(kind)
            span_cols["start"].append(start)
            span_cols["end"].append(end)
            span_cols["value"].append(msg[start:end])
    pq.write_table(pa.table({
        "ticket_id": pa.array(span_cols["ticket_id"], pa.string()),
        "pii_type": pa.array(span_cols["pii_type"], pa.string()),
        "start": pa.array(span_cols["start"], pa.int32()),
        "end": pa.array(span_cols["end"], pa.int32()),
        "value": pa.array(span_cols["value"], pa.string()),
    }), gt_dir / "pii_spans.parquet")  # fmt: skip

    summary = _summary(config, rows, ann, pool, base_stats, span_cols["pii_type"], fname,
                       _sha256(raw_path))
    (gt_dir / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n",
                                         encoding="utf-8")
    summary["_seconds"] = round(time.perf_counter() - t0, 2)  # printed, never written
    summary["_daily"] = daily_rows
    return summary


def _summary(cfg: BuilderConfig, rows: Rows, ann: Annotations, pool: Pool,
             base_stats: dict[str, int], span_types: list[str], fname: str,
             sha: str) -> dict[str, Any]:
    def count(values: Sequence[str | None]) -> dict[str, int]:
        return dict(sorted(Counter(v for v in values if v is not None).items()))

    near = [j for j in rows.dup_jaccard if j is not None]
    types = Counter(span_types)
    return {
        "file": fname,
        "format": cfg.fmt,
        "sha256": sha,
        "config": dataclasses.asdict(cfg),
        "rows": len(rows.message),
        "originals": sum(k is None and d is None for k, d in
                         zip(rows.dup_kind, rows.defect, strict=True)),
        "originals_by_source": base_stats,
        "pool": pool.stats,
        "dup_kind": count(rows.dup_kind),
        "near_copies": {
            "count": len(near),
            "jaccard_ge_threshold": sum(j >= NEAR_DUP_J for j in near),
            "jaccard_min": round(min(near), 4) if near else None,
            "jaccard_median": round(float(np.median(near)), 4) if near else None,
        },
        "defect": count(rows.defect),
        "noise": count(rows.noise),
        "rows_with_pii": sum(rows.has_pii),
        "pii_type": {t: types[t] for t in PII_TYPES if types[t]},
        "decoy_type": {t: types[t] for t in DECOY_TYPES if types[t]},
        "label_errors": {
            "annotations": ann.n_annotations,
            "wrong_annotations": ann.n_wrong,
            "wrong_rate": round(ann.n_wrong / max(ann.n_annotations, 1), 5),
            "rows_with_wrong_exported_label": ann.first_wrong,
            "single_annotator_rows": ann.single_annotator_rows,
        },
    }


# --------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="intentops build-raw", description=__doc__.splitlines()[0])
    d = BuilderConfig(rows=20000)
    p.add_argument("--out", required=True, help="output folder (raw file + ground_truth/)")
    p.add_argument("--rows", type=int, default=d.rows)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--format", dest="fmt", choices=("csv", "jsonl", "parquet"), default=d.fmt)
    p.add_argument("--source", choices=("train", "test", "all"), default=d.source)
    for name in ("pii_share", "exact_dup_share", "near_dup_share", "defect_share",
                 "label_error_rate", "decoy_share", "noise_share"):
        p.add_argument(f"--{name.replace('_', '-')}", dest=name, type=float, default=getattr(d, name))
    p.add_argument("--annotators-per-item", type=int, default=d.annotators_per_item)
    p.add_argument("--daily", action="store_true",
                   help="also write the rows partitioned by day under OUT/daily/date=YYYY-MM-DD/")
    args = vars(p.parse_args(argv))
    out = args.pop("out")
    daily = args.pop("daily")
    cfg = BuilderConfig(**args)
    try:
        cfg.validate()
    except ValueError as exc:
        p.error(str(exc))
    s = build_raw(out, cfg, daily=daily)
    if s["_daily"]:
        print(f"{Path(out) / 'daily'}: {len(s['_daily'])} daily partitions "
              f"({min(s['_daily'])} to {max(s['_daily'])})")
    print(f"{Path(out) / s['file']}: {s['rows']} rows ({s['originals']} originals, "
          f"{sum(s['dup_kind'].values())} copies, {sum(s['defect'].values())} defects, "
          f"{s['rows_with_pii']} with PII) in {s['_seconds']}s; ground truth in "
          f"{Path(out) / 'ground_truth'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
