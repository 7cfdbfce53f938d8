"""Dedup stage: exact duplicates on the normalized key, then near-duplicates by MinHash LSH.

Input: the clean stage's ``kept/``. Output (one stage output):

* ``kept/``      one survivor per duplicate cluster (plus every unique row), with
                 ``cluster_size``, ``cluster_labels`` and ``label_conflict``;
* ``merged/``    every other member, whole, with ``survivor_id`` and ``match_type``
                 (``exact`` or ``near``): nothing is dropped, label QA reads their votes;
* ``clusters/``  one row per cluster of two or more, its labels and whether they disagree.

The survivor of a cluster is its earliest message (``created_at``, then ``record_id``), so
the choice does not depend on partitioning or file order. Clusters whose labels disagree
are flagged for label QA, not resolved here.

Run by hand:  spark-submit jobs/spark/dedup.py --run-id RUN   (after clean ran for RUN)
or:           intentops dedup --run-id RUN
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if __package__ in (None, ""):  # run as a file by spark-submit
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from core import stage, stages
from core.config import DedupConfig, PipelineConfig
from jobs.spark import common

if TYPE_CHECKING:
    from collections.abc import Iterator

    import pyarrow as pa
    from pyspark.sql import Column, DataFrame, SparkSession

STAGE = "dedup"
# What minhash_fn yields: the doc, its shingle-set size, the set, its band keys.
MH_SCHEMA = "doc long, n int, shingles array<long>, bands array<long>"
CHUNK = 5000  # shingles per slab in minhash_fn; measured: 3000-16000 alike, 2048 3x slower


def dedup_key_col(text: Column) -> Column:
    """Spark version of ``textnorm.dedup_key`` (its input is already NFKC-normalized)."""
    from pyspark.sql import functions as F

    # One pass: each run of characters that are neither letters nor digits (punctuation,
    # whitespace, both) becomes one space, which is what replacing punctuation by spaces
    # and then collapsing whitespace gives.
    return F.trim(F.regexp_replace(F.lower(text), r"[^\p{L}\p{N}]+", " "))


def minhash_fn(cfg: DedupConfig):
    """Build the ``mapInArrow`` function: (doc, key) -> (doc, shingles, bands).

    Why a vectorized UDF: Spark has no MinHash with banding. Spark ML's MinHashLSH uses
    one hash per table (OR-amplification only), so unrelated pairs collide with
    probability 1-(1-J)^L and the candidate set grows quadratically; its per-row lambda
    alternative (``transform`` over shingles for each of 120 permutations) runs
    interpreted. In numpy the whole Arrow batch is hashed at once, straight from the
    Arrow buffers.
    """
    import numpy as np

    k, b, r = cfg.shingle_k, cfg.num_bands, cfg.rows_per_band
    rng = np.random.default_rng(cfg.seed)
    n_perm = b * r
    # Multiply-shift hashing, h(x) = (a*x + c) >> 32 with a odd: a universal family that
    # numpy evaluates with wrapping uint64 arithmetic, no modulo.
    mul = rng.integers(1, 2**63, size=n_perm, dtype=np.uint64) | np.uint64(1)
    add = rng.integers(0, 2**63, size=n_perm, dtype=np.uint64)
    band_mul = rng.integers(1, 2**63, size=r, dtype=np.uint64) | np.uint64(1)
    # One salt per band makes each bucket key unique to its band, so buckets group on a
    # single long instead of (band, key) pairs.
    band_salt = rng.integers(0, 2**63, size=b, dtype=np.uint64)
    shift = np.uint64(32)

    def shingle_values(keys: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        import pyarrow as pa

        width = np.int64 if pa.types.is_large_string(keys.type) else np.int32
        offsets = np.frombuffer(keys.buffers()[1], dtype=width)
        offsets = offsets[keys.offset : keys.offset + len(keys) + 1].astype(np.int64)
        data = (
            np.frombuffer(keys.buffers()[2], dtype=np.uint8)
            if offsets[-1]
            else np.zeros(0, np.uint8)
        )
        lens = np.diff(offsets)
        counts = np.where(lens >= k, lens - k + 1, 1)
        seg = np.concatenate(([0], np.cumsum(counts)[:-1]))
        # k consecutive bytes packed big-endian into one integer: an exact, collision-free
        # shingle id for k <= 8, computed for every byte position in k vector ops.
        n_pos = max(int(offsets[-1]) - k + 1, 0)
        packed = np.zeros(n_pos, dtype=np.uint64)
        for j in range(k):
            packed = (packed << np.uint64(8)) | data[j : j + n_pos].astype(np.uint64)
        start = np.repeat(offsets[:-1], counts)
        local = np.arange(int(counts.sum())) - np.repeat(seg, counts)
        pos = np.minimum(start + local, max(n_pos - 1, 0))
        values = packed[pos] if n_pos else np.zeros(len(pos), np.uint64)
        for i in np.flatnonzero(lens < k):  # rare: keys shorter than one shingle
            v = 0
            for byte in data[offsets[i] : offsets[i + 1]]:
                v = (v << 8) | int(byte)
            values[seg[i]] = v
        return values, seg

    def distinct_per_doc(
        values: np.ndarray, seg: np.ndarray, n_docs: int
    ) -> tuple[np.ndarray, np.ndarray]:
        # Each document's shingle set, sorted: the MinHash is the same (min ignores
        # repeats) with fewer values to hash, and verification needs no array_distinct
        # and can bound Jaccard by the set sizes (see candidate_pairs).
        doc = np.repeat(np.arange(n_docs, dtype=np.uint64), np.diff(np.append(seg, len(values))))
        bits = 8 * k
        if bits + int(n_docs).bit_length() <= 64:  # k <= 6: one sort of (doc, shingle) keys
            # kind="stable" (timsort for int64) measured 2.5x faster than the default here:
            # the keys arrive grouped by doc, sorted runs that only need merging inside.
            key = np.sort((doc << np.uint64(bits)) | values, kind="stable")
            keep = np.ones(len(key), dtype=bool)
            keep[1:] = key[1:] != key[:-1]
            key = key[keep]
            doc, values = key >> np.uint64(bits), key & np.uint64((1 << bits) - 1)
        else:
            order = np.lexsort((values, doc))
            values, doc = values[order], doc[order]
            keep = np.ones(len(values), dtype=bool)
            keep[1:] = (values[1:] != values[:-1]) | (doc[1:] != doc[:-1])
            values, doc = values[keep], doc[keep]
        counts = np.bincount(doc, minlength=n_docs)  # every doc keeps at least one shingle
        return values, np.concatenate(([0], np.cumsum(counts)[:-1]))

    def signatures(values: np.ndarray, seg: np.ndarray, n_docs: int) -> np.ndarray:
        # Hash all permutations of a slab of ~CHUNK shingles at once into one reused
        # buffer: small enough to stay in cache, and no large temporaries (allocating and
        # faulting in fresh (shingles x perms) arrays cost 10x the arithmetic). The slab is
        # laid out (perms x shingles) so each document's minimum is a reduction over a
        # contiguous run: numpy's reduceat over rows of the other layout made one
        # 100-wide call per shingle, 2.5x slower in all.
        sig = np.empty((n_perm, n_docs), dtype=np.uint64)
        bounds = np.append(seg, len(values))
        buf = np.empty((n_perm, CHUNK), dtype=np.uint64)
        d = 0
        while d < n_docs:
            lo = bounds[d]
            e = int(np.searchsorted(bounds, lo + CHUNK, side="right")) - 1
            e = min(max(e, d + 1), n_docs)
            m = int(bounds[e] - lo)
            # one document longer than the slab gets a buffer of its own
            h = buf[:, :m] if m <= CHUNK else np.empty((n_perm, m), dtype=np.uint64)
            np.multiply(mul[:, None], values[None, lo : bounds[e]], out=h)
            h += add[:, None]
            h >>= shift
            sig[:, d:e] = np.minimum.reduceat(h, seg[d:e] - lo, axis=1)
            d = e
        return sig.T

    def fn(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        import pyarrow as pa

        for batch in batches:
            keys = batch.column(1)
            if len(keys) == 0:
                continue
            values, seg = distinct_per_doc(*shingle_values(keys), len(keys))
            sig = signatures(values, seg, len(keys))
            offsets = np.append(seg, len(values)).astype(np.int32)
            bands = (sig.reshape(len(keys), b, r) * band_mul).sum(axis=2, dtype=np.uint64)
            bands ^= band_salt
            yield pa.RecordBatch.from_arrays(
                [
                    batch.column(0),
                    # the set sizes on their own, so the LSH stage reads no shingle array
                    pa.array(np.diff(offsets)),
                    pa.ListArray.from_arrays(
                        pa.array(offsets),
                        pa.array(values.view(np.int64)),
                    ),
                    pa.FixedSizeListArray.from_arrays(
                        pa.array(bands.view(np.int64).ravel()), b
                    ).cast(pa.list_(pa.int64())),
                ],
                names=["doc", "n", "shingles", "bands"],
            )

    return fn


def candidate_pairs(
    mh: DataFrame, max_bucket_pairs: int, min_band_hits: int, threshold: float = 0.0
) -> DataFrame:
    """Pairs of docs that share at least ``min_band_hits`` band buckets.

    All pairs in small buckets, a star around the smallest doc in large ones (so a message
    sent 10,000 times costs 10,000 pairs, not 50 million). Requiring two or more hits
    sharpens the LSH S-curve: with 20 bands of 5 rows a pair at J=0.8 still becomes a
    candidate with P=0.996, while one at J=0.5 drops from 0.47 (one hit) to 0.13 and one
    at J=0.3 from 0.047 to 0.001, so far fewer pairs reach the costly exact-Jaccard join.

    A pair whose shingle sets differ too much in size cannot reach ``threshold``
    (J <= min(|A|, |B|) / max(|A|, |B|)), so it is dropped in the bucket, before the
    shuffle that counts hits: an exact filter, no pair at or above the threshold is lost.
    """
    from pyspark.sql import functions as F

    buckets = (
        mh.select(
            F.struct("doc", "n").alias("d"),
            F.explode("bands").alias("bkey"),
        )
        # Shuffled as plain rows, grouped after: almost every band key is unique, so a
        # map-side partial collect_list only sorted 18M rows to save nothing (measured:
        # that map stage 23 s -> 6 s of CPU, and fewer bytes shuffled).
        .repartition("bkey")
        .groupBy("bkey")
        .agg(F.collect_list("d").alias("m"))
        .where(F.size("m") > 1)
    )
    # One pass over the buckets for both shapes: as two filtered branches (all pairs, star)
    # the plan computed the whole exploded band shuffle twice.
    left = F.when(F.size("m") <= max_bucket_pairs, F.col("m")).otherwise(F.array(F.array_min("m")))
    lo, hi = F.least("x.n", "y.n"), F.greatest("x.n", "y.n")
    hits = (
        buckets.select(F.explode(left).alias("x"), "m")
        .select("x", F.explode("m").alias("y"))
        .where((F.col("x.doc") < F.col("y.doc")) & (lo >= F.lit(threshold) * hi - 1e-9))
        .select(F.col("x.doc").alias("a"), F.col("y.doc").alias("b"))
        .groupBy("a", "b")
        .count()
    )
    return hits.where(F.col("count") >= min_band_hits).select("a", "b")


def verified_edges(pairs: DataFrame, mh: DataFrame, threshold: float) -> DataFrame:
    """Candidate pairs whose exact Jaccard of shingle sets reaches ``threshold`` (native
    array functions).

    The shingle arrays are sets already (``minhash_fn``), so |A u B| = |A| + |B| - |A n B|:
    one set operation per pair instead of two."""
    from pyspark.sql import functions as F

    sh = mh.select("doc", "shingles")
    joined = pairs.join(sh.toDF("a", "sa"), "a").join(sh.toDF("b", "sb"), "b")
    # J = i / (|A| + |B| - i) >= t  <=>  i * (1 + t) >= t * (|A| + |B|): the intersection
    # appears once (Spark pushes the filter into the join condition and evaluated a ratio's
    # two copies of it separately). The two sides differ by union * (J - t), so the 1e-9
    # tolerance only keeps J == t on the right side of rounding.
    inter = F.size(F.array_intersect("sa", "sb"))
    return joined.where(
        inter * (1 + threshold) >= threshold * (F.size("sa") + F.size("sb")) - 1e-9
    ).select("a", "b")


def components(edges: list[tuple[int, int]]) -> dict[int, int]:
    """doc -> component id (the smallest doc in it), for docs on at least one edge.

    On the driver with scipy: the verified edges number about one per near-duplicate,
    small next to the input, and this avoids an iterative Spark job of several shuffles.
    """
    import numpy as np
    from scipy.sparse import coo_matrix
    from scipy.sparse.csgraph import connected_components

    if not edges:
        return {}
    arr = np.asarray(edges, dtype=np.int64)
    nodes, inv = np.unique(arr.ravel(), return_inverse=True)
    inv = inv.reshape(-1, 2)
    n = len(nodes)
    graph = coo_matrix((np.ones(len(inv)), (inv[:, 0], inv[:, 1])), shape=(n, n))
    _, labels = connected_components(graph, directed=False)
    smallest = np.full(labels.max() + 1, np.iinfo(np.int64).max)
    np.minimum.at(smallest, labels, nodes)
    return dict(zip(nodes.tolist(), smallest[labels].tolist(), strict=True))


@dataclass(frozen=True)
class DedupResult:
    """What ``dedup_frames`` returns.

    ``kept``, ``merged`` and ``clusters`` are the stage's output frames, ``stats`` the pass
    statistics, ``persisted`` the frames cached on the way: the outputs read them, so the
    caller unpersists them (``unpersist()``) only once the outputs are written.
    """

    kept: DataFrame
    merged: DataFrame
    clusters: DataFrame
    stats: dict[str, Any]
    persisted: list[DataFrame]

    def outputs(self) -> dict[str, DataFrame]:
        """The output frames by folder name: ``kept``, ``merged``, ``clusters``."""
        return {"kept": self.kept, "merged": self.merged, "clusters": self.clusters}

    def unpersist(self) -> None:
        """Release every frame ``dedup_frames`` persisted."""
        for df in self.persisted:
            df.unpersist()


class _Laps:
    """Wall time per phase: ``lap(name)`` records the seconds since the previous lap."""

    def __init__(self) -> None:
        self.timings: dict[str, float] = {}
        self._clock = time.perf_counter()

    def lap(self, phase: str) -> None:
        now = time.perf_counter()
        self.timings[phase] = round(now - self._clock, 2)
        self._clock = now


def _persist(df: DataFrame) -> DataFrame:
    from pyspark import StorageLevel

    return df.persist(StorageLevel.MEMORY_AND_DISK)


def exact_pass(
    spark: SparkSession, kept: DataFrame
) -> tuple[DataFrame, DataFrame, list[DataFrame]]:
    """Exact duplicates on the normalized key.

    Takes the clean stage's kept rows. Returns ``(rows, survivors, persisted)``: ``rows`` is
    every row's narrow columns (``record_id``, ``created_at``, ``label``, ``key``) with
    ``esurv``, the earliest row holding its key; ``survivors`` the rows that are their own
    ``esurv`` (``record_id``, ``key``, ``created_at``) numbered by ``doc``; ``persisted``
    the frames this pass cached, ``survivors`` last.
    """
    from pyspark.sql import functions as F

    # Only the narrow columns the passes need are cached. The full rows (text, annotations)
    # are read again at the end and joined with the small map of merged rows: no cache of
    # whole rows is built and no whole row is shuffled.
    keyed = _persist(
        kept.select("record_id", "created_at", "label", dedup_key_col(F.col("text")).alias("key"))
    )
    # The keys held by more than one row, each with its earliest row (the struct orders as
    # the window of ``near_survivors`` does: dated first, then ``created_at``, then
    # ``record_id``). Only keys and sort fields are shuffled, and the repeated keys, usually
    # few, are joined back by broadcast: no row is shuffled with its text.
    earliest = F.min(F.struct(F.col("created_at").isNull(), "created_at", "record_id"))
    repeated = _persist(
        keyed.groupBy("key")
        .agg(F.count("*").alias("n"), earliest.alias("first"))
        .where(F.col("n") > 1)
        .select("key", F.col("first.record_id").alias("first_id"))
    )
    rows = (
        keyed.join(common.broadcast_if_small(repeated), "key", "left")
        .withColumn("esurv", F.coalesce("first_id", "record_id"))
        .drop("first_id")
    )
    # Evenly sized partitions, a multiple of the cores, for the MinHash UDF and the LSH
    # stages after it, whatever parts the input came in (one file for a small input; 3
    # parts on 2 cores left one core idle a third of each stage). Only narrow columns move.
    survivors = _persist(
        rows.where(F.col("record_id") == F.col("esurv"))
        .select("record_id", "key", "created_at")
        .repartition(2 * spark.sparkContext.defaultParallelism)
        .withColumn("doc", F.monotonically_increasing_id())
    )
    return rows, survivors, [keyed, repeated, survivors]


def minhash_signatures(
    spark: SparkSession, exact_survivors: DataFrame, cfg: DedupConfig
) -> DataFrame:
    """MinHash signatures and LSH band keys of the exact survivors' keys.

    Takes the exact survivors (``doc``, ``key``). Returns their ``MH_SCHEMA`` rows, persisted
    (not yet computed) and hash-partitioned by ``doc``.
    """
    return _persist(
        exact_survivors.select("doc", "key")
        .mapInArrow(minhash_fn(cfg), MH_SCHEMA)
        # Cached hash-partitioned by doc, as both joins of verified_edges need it: one
        # shuffle of the shingle arrays here instead of one in each join.
        .repartition(int(spark.conf.get("spark.sql.shuffle.partitions")), "doc")
    )


def collect_near_edges(pairs: DataFrame, mh: DataFrame, cfg: DedupConfig) -> list[tuple[int, int]]:
    """The candidate pairs that pass ``verified_edges``, collected to the driver as
    ``(doc, doc)`` tuples. Raises ``StageError`` above ``cfg.max_driver_edges``."""
    edges_df = verified_edges(pairs, mh, cfg.threshold)
    edges = [(r["a"], r["b"]) for r in edges_df.select("a", "b").collect()]
    if len(edges) > cfg.max_driver_edges:
        raise stage.StageError(
            f"{len(edges)} near-duplicate edges exceed dedup.max_driver_edges="
            f"{cfg.max_driver_edges}; raise the threshold or the limit"
        )
    return edges


def near_survivors(
    spark: SparkSession, exact_survivors: DataFrame, edges: list[tuple[int, int]]
) -> DataFrame:
    """Survivor of each near cluster: the earliest of its exact survivors.

    Takes the exact survivors (with ``doc``) and the verified edges. Returns ``esurv`` ->
    ``survivor_id`` for the exact survivors on an edge (none of them persisted).
    """
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    comp = components(edges)
    comp_df = spark.createDataFrame(list(comp.items()) or [(-1, -1)], "doc long, comp long")
    # Only exact survivors on a verified edge change survivor, and they are as few as the
    # components the driver holds: a broadcast map, so the rows are never shuffled to apply it.
    by_comp = Window.partitionBy("comp").orderBy(
        F.col("created_at").asc_nulls_last(), F.col("record_id")
    )
    return (
        exact_survivors.join(F.broadcast(comp_df), "doc")
        .withColumn("survivor_id", F.first("record_id").over(by_comp))
        .select(F.col("record_id").alias("esurv"), "survivor_id")
    )


def merged_rows(rows: DataFrame, near: DataFrame) -> DataFrame:
    """The merged rows only (most rows survive), persisted.

    Takes every row with its exact survivor (``exact_pass``) and the near survivors
    (``near_survivors``). Returns ``record_id``, ``survivor_id``, ``match_type`` (``exact``
    or ``near``) and ``label`` of each row that is not its own final survivor.
    """
    from pyspark.sql import functions as F

    return _persist(
        rows.join(F.broadcast(near), "esurv", "left")
        .withColumn("survivor_id", F.coalesce("survivor_id", "esurv"))
        .where(F.col("record_id") != F.col("survivor_id"))
        .withColumn(
            "match_type",
            F.when(F.col("esurv") == F.col("survivor_id"), "exact").otherwise("near"),
        )
        .select("record_id", "survivor_id", "match_type", "label")
    )


def cluster_members(merged_map: DataFrame) -> DataFrame:
    """Per survivor with copies, persisted: ``record_id`` (the survivor), ``n_merged``,
    ``n_exact``, ``n_near`` and ``merged_labels`` (the set of its merged rows' labels).

    Takes ``merged_rows``' output; survivors without copies get no row."""
    from pyspark.sql import functions as F

    return _persist(
        merged_map.groupBy("survivor_id")
        .agg(
            F.count("*").alias("n_merged"),
            F.sum((F.col("match_type") == "exact").cast("int")).alias("n_exact"),
            F.sum((F.col("match_type") == "near").cast("int")).alias("n_near"),
            F.collect_set("label").alias("merged_labels"),
        )
        .withColumnRenamed("survivor_id", "record_id")
    )


def assemble_outputs(
    kept: DataFrame, merged_map: DataFrame, members: DataFrame
) -> tuple[DataFrame, DataFrame, DataFrame]:
    """The stage's three outputs, label conflicts flagged.

    Takes the input rows, ``merged_rows`` and ``cluster_members``. Returns ``(kept, merged,
    clusters)``: the survivors, whole, with ``cluster_size``, ``cluster_labels`` and
    ``label_conflict``; the merged rows, whole, with ``survivor_id`` and ``match_type``; one
    row per cluster of two or more.
    """
    from pyspark.sql import functions as F

    merged_ids = common.broadcast_if_small(merged_map.drop("label"))
    members = common.broadcast_if_small(members)
    base_cols = list(kept.columns)
    # A survivor adds itself and its label to its merged rows' statistics.
    cluster_labels = F.array_sort(
        F.array_union(
            F.array_compact(F.array("label")),
            F.coalesce("merged_labels", F.array().cast("array<string>")),
        )
    )
    survivors = (
        kept.join(merged_ids.select("record_id"), "record_id", "left_anti")
        .join(members, "record_id", "left")
        .withColumn("cluster_size", (F.coalesce("n_merged", F.lit(0)) + 1).cast("long"))
        .withColumn("n_exact", F.coalesce("n_exact", F.lit(0)).cast("long"))
        .withColumn("n_near", F.coalesce("n_near", F.lit(0)).cast("long"))
        .withColumn("cluster_labels", cluster_labels)
        .withColumn("label_conflict", F.size("cluster_labels") > 1)
    )
    clusters = survivors.select(
        F.col("record_id").alias("survivor_id"),
        "cluster_size",
        "n_exact",
        "n_near",
        "cluster_labels",
        "label_conflict",
    )
    return (
        survivors.select(*base_cols, "cluster_size", "cluster_labels", "label_conflict"),
        kept.join(merged_ids, "record_id").select(*base_cols, "survivor_id", "match_type"),
        clusters.where(F.col("cluster_size") > 1),
    )


def dedup_frames(spark: SparkSession, kept: DataFrame, cfg: DedupConfig) -> DedupResult:
    """Run both passes over the clean stage's kept rows.

    Returns the three output frames, the pass statistics and the frames persisted on the
    way, which the caller unpersists after writing the outputs (``DedupResult.unpersist``).
    """
    laps = _Laps()
    rows, exact_survivors, persisted = exact_pass(spark, kept)
    n_exact_survivors = exact_survivors.count()
    laps.lap("exact_s")
    mh = minhash_signatures(spark, exact_survivors, cfg)
    mh.count()
    laps.lap("minhash_s")
    pairs = _persist(candidate_pairs(mh, cfg.max_bucket_pairs, cfg.min_band_hits, cfg.threshold))
    n_pairs = pairs.count()
    laps.lap("candidates_s")
    edges = collect_near_edges(pairs, mh, cfg)
    laps.lap("verify_s")
    merged_map = merged_rows(rows, near_survivors(spark, exact_survivors, edges))
    members = cluster_members(merged_map)
    persisted += [mh, pairs, merged_map, members]
    out_kept, out_merged, out_clusters = assemble_outputs(kept, merged_map, members)
    stats = {
        "exact_survivors": n_exact_survivors,
        "candidate_pairs": n_pairs,
        "near_edges": len(edges),
        "timings": laps.timings,
    }
    return DedupResult(out_kept, out_merged, out_clusters, stats, persisted)


def run(
    cfg: PipelineConfig,
    run_id: str,
    spark: SparkSession | None = None,
    clean_output: str | None = None,
):
    src = (
        Path(clean_output) if clean_output else Path(stage.upstream(cfg.lake, run_id, "clean").path)
    )
    upstream_manifest = stage.read_manifest(src)
    inputs = {"clean": {"key": upstream_manifest["key"]}}

    def work(out: Path) -> dict[str, Any]:
        from pyspark.sql import functions as F

        session = spark or common.get_spark(cfg, "intentops-dedup")
        kept = session.read.parquet(str(src / "kept"))
        res = dedup_frames(session, kept, cfg.dedup)
        try:
            for name, df in res.outputs().items():
                df.write.parquet(str(out / name))
            counts = {
                r["match_type"]: r["count"]
                for r in session.read.parquet(str(out / "merged"))
                .groupBy("match_type")
                .count()
                .collect()
            }
            clusters = session.read.parquet(str(out / "clusters"))
            n_clusters = clusters.count()
            n_conflict = clusters.where(F.col("label_conflict")).count()
            n_kept = session.read.parquet(str(out / "kept")).count()
            # Unlabeled rows (clean.unlabeled: review) pass through to desensitize, which masks
            # them; label QA drops those that repeat a labelled message.
            unlabeled = None
            if (src / "unlabeled").exists():
                session.read.parquet(str(src / "unlabeled")).write.parquet(str(out / "unlabeled"))
                unlabeled = session.read.parquet(str(out / "unlabeled")).count()
        finally:
            res.unpersist()
        rows_in = upstream_manifest["stats"]["kept"]
        merged = counts.get("exact", 0) + counts.get("near", 0)
        if n_kept + merged != rows_in:
            raise AssertionError(f"row accounting broken: {n_kept}+{merged} != {rows_in}")
        return {
            "rows_in": rows_in,
            "kept": n_kept,
            "merged_exact": counts.get("exact", 0),
            "merged_near": counts.get("near", 0),
            "clusters": n_clusters,
            "label_conflict_clusters": n_conflict,
            "unlabeled": unlabeled,
            **res.stats,
        }

    return stage.run_stage(
        STAGE, cfg.lake, inputs, {"dedup": cfg.dedup.model_dump()}, stages.code_version(STAGE), work, run_id
    )


def main(argv: list[str] | None = None) -> None:
    def go(args):
        if not args.run_id:
            raise stage.StageError("--run-id is required: dedup reads that run's clean output")
        return run(common.config_from_args(args), run_id=args.run_id)

    common.run_main(go, __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    main()
