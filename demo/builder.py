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
import dataclasses
import json
import random
import sys
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from demo.annotators import NEIGHBOUR_ERROR_SHARE as NEIGHBOUR_ERROR_SHARE
from demo.annotators import RELIABILITY, Annotations, annotate
from demo.annotators import SINGLE_ANNOTATOR_SHARE as SINGLE_ANNOTATOR_SHARE
from demo.common import (
    CHANNEL_P,
    CHANNELS,
    COLUMNS,
    DECOY_TYPES,
    DEFECT_KINDS,
    EPOCH,
    EXACT_KINDS,
    HARMLESS_SHARE,
    MAX_CLEAN_CHARS,
    NEAR_DUP_J,
    NEAR_KINDS,
    NOISE_KINDS,
    NOISE_WEIGHTS,
    PII_TYPES,
    PII_WEIGHTS,
    UNKNOWN_LABELS,
    WINDOW_S,
    _check,
    _np_rng,
    _py_rng,
)
from demo.common import TOO_LONG_CHARS as TOO_LONG_CHARS
from demo.defects import _defect_kinds, apply_noise, label_variant, make_defect
from demo.duplicates import APPEND_CLAUSES as APPEND_CLAUSES
from demo.duplicates import PREPEND_CLAUSES as PREPEND_CLAUSES
from demo.duplicates import SWAP_FALLBACK_SHARE as SWAP_FALLBACK_SHARE
from demo.duplicates import WORD_SWAPS as WORD_SWAPS
from demo.duplicates import exact_class_copy, near_copy
from demo.output import _sha256, _write_daily, _write_raw
from demo.parts import Part, Span, render, to_parts
from demo.pii_values import ADDRESS_LOCALES as ADDRESS_LOCALES
from demo.pii_values import DECOY_TEMPLATES as DECOY_TEMPLATES
from demo.pii_values import EMAIL_DOMAINS as EMAIL_DOMAINS
from demo.pii_values import FULLWIDTH_PII_SHARE as FULLWIDTH_PII_SHARE
from demo.pii_values import HARMLESS_TEMPLATES as HARMLESS_TEMPLATES
from demo.pii_values import IBAN_COUNTRIES as IBAN_COUNTRIES
from demo.pii_values import NAME_LOCALES as NAME_LOCALES
from demo.pii_values import PII_TEMPLATES as PII_TEMPLATES
from demo.pii_values import TITLES as TITLES
from demo.pii_values import PiiFactory, add_decoy, add_harmless, add_pii
from demo.pii_values import decoy_value as decoy_value
from demo.pii_values import insert_value as insert_value
from demo.pool import BANKING77 as BANKING77
from demo.pool import MAX_COMPOSED_CHARS as MAX_COMPOSED_CHARS
from demo.pool import MIN_TEXT_CHARS as MIN_TEXT_CHARS
from demo.pool import PART_MAX as PART_MAX
from demo.pool import SHARED_MAX_J as SHARED_MAX_J
from demo.pool import SIMILAR_CONTAINMENT as SIMILAR_CONTAINMENT
from demo.pool import Composer, Pool, build_pool, make_bases
from demo.pool import load_label_names as load_label_names
from demo.pool import load_source as load_source
from demo.pool import similar_pairs as similar_pairs
from textnorm import CONTROL_RE, MOJIBAKE_RE, normalize_text, shingles

# The builder's modules: common (shared kinds, thresholds, random streams), parts
# (messages as parts), pool (source pool, compositions), pii_values, duplicates,
# defects (and noise), annotators, output (raw files). ``from m import X as X`` above
# re-exports a name so that ``demo.builder.X`` keeps working for callers and tests.
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
