"""The dedup job on small frames, checked against the pure-Python reference rules."""

from __future__ import annotations

import datetime as dt

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

import textnorm
from core.config import DedupConfig
from jobs.spark import dedup

T0 = dt.datetime(2026, 11, 1, 10, 0, 0)
KEY_CASES = [
    "Where is my card?",
    "WHERE is my   card!!",
    "top-up failed, why?",
    "I'm (still) waiting for my card...",
    "Ça coûte 5 € ?",
    "über-schnell",
    "a",
    "tabs\tinside",
    "a -- b",
    "x,\ty",
    "  ..hi..  ",
    "snake_case",
    "١٢٣ abc",
    "...",
]


@pytest.mark.parametrize("text", KEY_CASES)
def test_spark_key_matches_reference(spark, text):
    from pyspark.sql import functions as F

    norm = textnorm.normalize_text(text)  # the clean stage's output is dedup's input
    got = spark.createDataFrame([(norm,)], "t string").select(dedup.dedup_key_col(F.col("t"))).first()[0]
    assert got == textnorm.dedup_key(text)


def _mh(spark, rows):
    """A MinHash frame from (doc, shingles, bands) rows; ``n`` is the set size."""
    return spark.createDataFrame([(d, len(sh), sh, b) for d, sh, b in rows], dedup.MH_SCHEMA)


def _arrow_keys(texts):
    return pa.array([textnorm.dedup_key(t) for t in texts], pa.string())


@pytest.mark.parametrize("k", [3, 5, 8])
def test_minhash_shingles_match_reference(k):
    texts = ["Where is my card?", "ab", "exactly5", "Ça coûte 5 €", "x" * 40]
    fn = dedup.minhash_fn(DedupConfig(shingle_k=k))
    batch = pa.RecordBatch.from_arrays([pa.array(range(len(texts)), pa.int64()), _arrow_keys(texts)],
                                       names=["doc", "key"])
    out = next(fn(iter([batch])))
    sizes = out.column("n").to_pylist()
    for text, packed, n in zip(texts, out.column("shingles").to_pylist(), sizes, strict=True):
        ref = {int.from_bytes(s, "big") for s in textnorm.shingles(text, k)}
        assert {v & (2**64 - 1) for v in packed} == ref, text  # int64 view of uint64
        assert len(packed) == len(ref) == n  # a set: each shingle once ("x" * 40 has one)
    bands = out.column("bands").to_pylist()
    assert all(len(b) == DedupConfig().num_bands for b in bands)


def test_minhash_is_deterministic_and_similar_texts_share_bands():
    fn = dedup.minhash_fn(DedupConfig())
    texts = [
        "I ordered a new card last week and it still has not arrived, what should I do?",
        "I ordered a new card last week and it still has not arrived, what can I do?",
        "How do I change the PIN of my card in the app?",
    ]
    batch = pa.RecordBatch.from_arrays([pa.array([0, 1, 2], pa.int64()), _arrow_keys(texts)],
                                       names=["doc", "key"])
    b1 = next(fn(iter([batch]))).column("bands").to_pylist()
    b2 = next(dedup.minhash_fn(DedupConfig())(iter([batch]))).column("bands").to_pylist()
    assert b1 == b2
    assert set(b1[0]) & set(b1[1])  # J ~ 0.85: shares a band with overwhelming probability
    assert not set(b1[0]) & set(b1[2])


def test_components():
    comp = dedup.components([(5, 7), (7, 9), (1, 2)])
    assert comp == {5: 5, 7: 5, 9: 5, 1: 1, 2: 1}
    assert dedup.components([]) == {}


def _kept(rows):
    return pd.DataFrame(
        [
            {"record_id": rid, "text": text, "label": label, "annotations": [],
             "created_at": T0 + dt.timedelta(minutes=minute), "channel": "chat", "source_file": "f"}
            for rid, text, label, minute in rows
        ]
    )


LONG = "I ordered a new card last week and it still has not arrived, what should I do about it?"
ROWS = [
    ("a1", LONG, "card_arrival", 5),
    ("a2", LONG.upper(), "card_arrival", 1),  # earliest: the survivor
    ("a3", LONG.replace("should", "can"), "card_delivery_estimate", 9),  # near, other label
    ("a4", LONG + " Thanks.", "card_arrival", 3),  # near
    ("b1", "How do I change my PIN?", "change_pin", 2),
    ("b2", "how do i change my pin", "change_pin", 4),  # exact after normalization
    ("c1", "What is the exchange rate today?", "exchange_rate", 0),  # unique
    ("d1", "Can I get a refund for this?", "request_refund", 0),
]


@pytest.fixture
def result(spark):
    schema = ("record_id string, text string, label string, "
              "annotations array<struct<annotator:string,label:string>>, created_at timestamp, "
              "channel string, source_file string")
    kept = spark.createDataFrame(_kept(ROWS), schema)
    res = dedup.dedup_frames(spark, kept, DedupConfig())
    out = {name: df.toPandas() for name, df in res.outputs().items()}
    res.unpersist()
    return out


def test_survivors_and_merges(result):
    kept = result["kept"].set_index("record_id")
    assert sorted(kept.index) == ["a2", "b1", "c1", "d1"]
    merged = result["merged"].set_index("record_id")
    assert merged.loc["a1", "survivor_id"] == "a2" and merged.loc["a1", "match_type"] == "exact"
    assert merged.loc["a3", "match_type"] == "near" and merged.loc["a4", "match_type"] == "near"
    assert merged.loc["b2", "survivor_id"] == "b1" and merged.loc["b2", "match_type"] == "exact"
    assert len(kept) + len(merged) == len(ROWS)


def test_label_conflicts_are_flagged_not_resolved(result):
    kept = result["kept"].set_index("record_id")
    assert bool(kept.loc["a2", "label_conflict"]) is True
    assert list(kept.loc["a2", "cluster_labels"]) == ["card_arrival", "card_delivery_estimate"]
    assert kept.loc["a2", "label"] == "card_arrival"  # survivor keeps its own label
    assert bool(kept.loc["b1", "label_conflict"]) is False
    assert kept.loc["c1", "cluster_size"] == 1
    clusters = result["clusters"].set_index("survivor_id")
    assert clusters.loc["a2", "cluster_size"] == 4
    assert (clusters.loc["a2", "n_exact"], clusters.loc["a2", "n_near"]) == (1, 2)


def test_large_bucket_is_a_star_not_all_pairs(spark):
    from pyspark.sql import functions as F

    n = 120
    mh = _mh(spark, [(i, [], [7, i + 1000]) for i in range(n)])
    pairs = dedup.candidate_pairs(mh, max_bucket_pairs=50, min_band_hits=1)
    assert pairs.count() == n - 1
    assert pairs.where(F.col("a") != 0).count() == 0


def test_verified_jaccard_matches_reference(spark):
    texts = [LONG, LONG.replace("should", "can"), "How do I change my PIN?"]
    fn = dedup.minhash_fn(DedupConfig())
    batch = pa.RecordBatch.from_arrays([pa.array([0, 1, 2], pa.int64()), _arrow_keys(texts)],
                                       names=["doc", "key"])
    out = next(fn(iter([batch]))).to_pandas()
    mh = spark.createDataFrame(out, dedup.MH_SCHEMA)
    pairs = spark.createDataFrame([(0, 1), (0, 2)], "a long, b long")
    for pair in ((0, 1), (0, 2)):
        _assert_edge_at_reference_jaccard(mh, pairs, pair, textnorm.jaccard(*(texts[i] for i in pair)))


def _assert_edge_at_reference_jaccard(mh, pairs, pair, j):
    """The pair is an edge for a threshold just under its reference Jaccard, not just over."""
    edges = lambda t: {tuple(r) for r in dedup.verified_edges(pairs, mh, t).collect()}  # noqa: E731
    assert 0 <= j < 1
    assert pair in edges(j - 1e-6)
    assert pair not in edges(j + 1e-6)


def test_verified_edges_keep_a_pair_exactly_at_the_threshold(spark):
    # |A n B| = 4, |A u B| = 5: J = 0.8 exactly, an edge at threshold 0.8 (J >= t).
    rows = [(0, [1, 2, 3, 4, 5], []), (1, [1, 2, 3, 4], []), (2, [1, 2, 3], [])]
    mh = _mh(spark, rows)
    pairs = spark.createDataFrame([(0, 1), (0, 2)], "a long, b long")
    assert [tuple(r) for r in dedup.verified_edges(pairs, mh, 0.8).collect()] == [(0, 1)]
    assert sorted(tuple(r) for r in dedup.verified_edges(pairs, mh, 0.6).collect()) == [(0, 1), (0, 2)]


def test_pairs_need_min_band_hits(spark):
    # docs 0,1 share one bucket; 2,3 share two; 4,5 share three.
    rows = [(0, [], [1, 10, 20]), (1, [], [1, 11, 21]), (2, [], [2, 3, 22]),
            (3, [], [2, 3, 23]), (4, [], [4, 5, 6]), (5, [], [4, 5, 6])]
    mh = _mh(spark, rows)
    got = lambda hits: sorted(tuple(r) for r in dedup.candidate_pairs(mh, 50, hits).collect())  # noqa: E731
    assert got(1) == [(0, 1), (2, 3), (4, 5)]
    assert got(2) == [(2, 3), (4, 5)]
    assert got(3) == [(4, 5)]


def test_pairs_whose_set_sizes_rule_out_the_threshold_are_dropped(spark):
    # J(A, B) <= min(|A|, |B|) / max(|A|, |B|): 8 of 10 shingles can still reach 0.8, 7 cannot.
    rows = [(0, list(range(10)), [1, 2]), (1, list(range(8)), [1, 2]), (2, list(range(7)), [1, 2])]
    mh = _mh(spark, rows)
    got = lambda t: sorted(tuple(r) for r in dedup.candidate_pairs(mh, 50, 2, t).collect())  # noqa: E731
    assert got(0.8) == [(0, 1), (1, 2)]
    assert got(0.0) == [(0, 1), (0, 2), (1, 2)]


def test_signatures_match_direct_minhash_across_slabs():
    """The slab-wise hashing equals the textbook min over all shingles, also for a
    document longer than one slab and for batches spanning many slabs."""
    cfg = DedupConfig()
    texts = [f"message number {i} about my card" for i in range(300)] + ["y" * (dedup.CHUNK * 3)]
    fn = dedup.minhash_fn(cfg)
    batch = pa.RecordBatch.from_arrays([pa.array(range(len(texts)), pa.int64()), _arrow_keys(texts)],
                                       names=["doc", "key"])
    out = next(fn(iter([batch])))
    rng = np.random.default_rng(cfg.seed)
    n_perm = cfg.num_bands * cfg.rows_per_band
    mul = rng.integers(1, 2**63, size=n_perm, dtype=np.uint64) | np.uint64(1)
    add = rng.integers(0, 2**63, size=n_perm, dtype=np.uint64)
    band_mul = rng.integers(1, 2**63, size=cfg.rows_per_band, dtype=np.uint64) | np.uint64(1)
    band_salt = rng.integers(0, 2**63, size=cfg.num_bands, dtype=np.uint64)
    for idx in (0, 157, 299, 300):
        sh = np.array(out.column("shingles")[idx].as_py(), dtype=np.int64).view(np.uint64)
        sig = ((sh[:, None] * mul[None, :] + add[None, :]) >> np.uint64(32)).min(axis=0)
        bands = (sig.reshape(cfg.num_bands, cfg.rows_per_band) * band_mul).sum(axis=1, dtype=np.uint64)
        bands ^= band_salt
        assert out.column("bands")[idx].as_py() == bands.view(np.int64).tolist()


def test_verified_jaccard_with_repeated_shingles(spark):
    texts = ["ha ha ha ha ha ha ha ha", "ha ha ha ha ha ha ha ha ha ha ha ho"]
    fn = dedup.minhash_fn(DedupConfig())
    batch = pa.RecordBatch.from_arrays([pa.array([0, 1], pa.int64()), _arrow_keys(texts)],
                                       names=["doc", "key"])
    out = next(fn(iter([batch]))).to_pandas()
    mh = spark.createDataFrame(out, dedup.MH_SCHEMA)
    pairs = spark.createDataFrame([(0, 1)], "a long, b long")
    _assert_edge_at_reference_jaccard(mh, pairs, (0, 1), textnorm.jaccard(*texts))


def test_exact_survivor_is_the_earliest_dated_row(spark):
    """Among exact copies the survivor is the earliest ``created_at``; an undated row
    comes last whatever its id, and equal times fall back to the smallest id."""
    schema = ("record_id string, text string, label string, "
              "annotations array<struct<annotator:string,label:string>>, created_at timestamp, "
              "channel string, source_file string")
    rows = _kept([("x0", "Where is my card?", "card_arrival", 9),
                  ("x2", "where is my card", "card_arrival", 4),
                  ("x1", "WHERE IS MY CARD", "card_arrival", 4),
                  ("y1", "How do I top up?", "top_up", 1)])
    rows.loc[0, "created_at"] = None
    res = dedup.dedup_frames(spark, spark.createDataFrame(rows, schema), DedupConfig())
    merged = res.merged.toPandas().set_index("record_id")
    kept = sorted(res.kept.toPandas()["record_id"])
    res.unpersist()
    assert kept == ["x1", "y1"]
    assert merged["survivor_id"].to_dict() == {"x0": "x1", "x2": "x1"}
    assert set(merged["match_type"]) == {"exact"}


def test_side_tables_too_large_to_broadcast_give_the_same_result(spark, result, monkeypatch):
    """Above common.BROADCAST_ROWS the repeated keys and clusters are shuffle-joined."""
    from jobs.spark import common

    monkeypatch.setattr(common, "BROADCAST_ROWS", 0)
    schema = ("record_id string, text string, label string, "
              "annotations array<struct<annotator:string,label:string>>, created_at timestamp, "
              "channel string, source_file string")
    res = dedup.dedup_frames(spark, spark.createDataFrame(_kept(ROWS), schema), DedupConfig())
    got = {name: df.toPandas() for name, df in res.outputs().items()}
    res.unpersist()
    for name, df in got.items():
        key = "survivor_id" if name == "clusters" else "record_id"
        want = result[name].sort_values(key).reset_index(drop=True)
        pd.testing.assert_frame_equal(df.sort_values(key).reset_index(drop=True), want)
