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
from pathlib import Path
from typing import TYPE_CHECKING, Any

if __package__ in (None, ""):  # run as a file by spark-submit
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import textnorm
from core import stage
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


def dedup_frames(spark: SparkSession, kept: DataFrame, cfg: DedupConfig) -> dict[str, Any]:
    """Run both passes over the clean stage's kept rows.

    Returns the three output frames and the pass statistics.
    """
    from pyspark import StorageLevel
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    timings: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(phase: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        timings[phase] = round(now - clock, 2)
        clock = now

    order = [F.col("created_at").asc_nulls_last(), F.col("record_id")]
    # Only the narrow columns the passes need are cached. The full rows (text, annotations)
    # are read again at the end and joined with the small map of merged rows: no cache of
    # whole rows is built and no whole row is shuffled.
    keyed = kept.select(
        "record_id", "created_at", "label", dedup_key_col(F.col("text")).alias("key")
    ).persist(StorageLevel.MEMORY_AND_DISK)
    # Exact duplicates: the keys held by more than one row, each with its earliest row (the
    # struct orders like ``order``). Only keys and sort fields are shuffled, and the repeated
    # keys, usually few, are joined back by broadcast: no row is shuffled with its text.
    earliest = F.min(F.struct(F.col("created_at").isNull(), "created_at", "record_id"))
    repeated = (
        keyed.groupBy("key")
        .agg(F.count("*").alias("n"), earliest.alias("first"))
        .where(F.col("n") > 1)
        .select("key", F.col("first.record_id").alias("first_id"))
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    cached = [keyed, repeated]
    rows = (
        keyed.join(common.broadcast_if_small(repeated), "key", "left")
        .withColumn("esurv", F.coalesce("first_id", "record_id"))
        .drop("first_id")
    )
    # Evenly sized partitions, a multiple of the cores, for the MinHash UDF and the LSH
    # stages after it, whatever parts the input came in (one file for a small input; 3
    # parts on 2 cores left one core idle a third of each stage). Only narrow columns move.
    exact_survivors = (
        rows.where(F.col("record_id") == F.col("esurv"))
        .select("record_id", "key", "created_at")
        .repartition(2 * spark.sparkContext.defaultParallelism)
        .withColumn("doc", F.monotonically_increasing_id())
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    n_exact_survivors = exact_survivors.count()
    lap("exact_s")
    mh = (
        exact_survivors.select("doc", "key")
        .mapInArrow(minhash_fn(cfg), MH_SCHEMA)
        # Cached hash-partitioned by doc, as both joins of verified_edges need it: one
        # shuffle of the shingle arrays here instead of one in each join.
        .repartition(int(spark.conf.get("spark.sql.shuffle.partitions")), "doc")
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    mh.count()
    lap("minhash_s")
    pairs = candidate_pairs(mh, cfg.max_bucket_pairs, cfg.min_band_hits, cfg.threshold).persist(
        StorageLevel.MEMORY_AND_DISK
    )
    n_pairs = pairs.count()
    lap("candidates_s")
    edges_df = verified_edges(pairs, mh, cfg.threshold)
    edges = [(r["a"], r["b"]) for r in edges_df.select("a", "b").collect()]
    if len(edges) > cfg.max_driver_edges:
        raise stage.StageError(
            f"{len(edges)} near-duplicate edges exceed dedup.max_driver_edges="
            f"{cfg.max_driver_edges}; raise the threshold or the limit"
        )
    lap("verify_s")
    comp = components(edges)
    comp_df = spark.createDataFrame(list(comp.items()) or [(-1, -1)], "doc long, comp long")
    # Survivor of a near cluster: the earliest of its exact survivors. Only exact survivors
    # on a verified edge change survivor, and they are as few as the components the driver
    # holds: a broadcast map, so the rows are never shuffled to apply it.
    by_comp = Window.partitionBy("comp").orderBy(*order)
    near = (
        exact_survivors.join(F.broadcast(comp_df), "doc")
        .withColumn("survivor_id", F.first("record_id").over(by_comp))
        .select(F.col("record_id").alias("esurv"), "survivor_id")
    )
    # The merged rows only (most rows survive): record -> survivor and match type.
    merged_map = (
        rows.join(F.broadcast(near), "esurv", "left")
        .withColumn("survivor_id", F.coalesce("survivor_id", "esurv"))
        .where(F.col("record_id") != F.col("survivor_id"))
        .withColumn(
            "match_type",
            F.when(F.col("esurv") == F.col("survivor_id"), "exact").otherwise("near"),
        )
        .select("record_id", "survivor_id", "match_type", "label")
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    # Cluster statistics from the merged rows (a survivor adds itself and its label); most
    # survivors have no copy and need no join.
    members = (
        merged_map.groupBy("survivor_id")
        .agg(
            F.count("*").alias("n_merged"),
            F.sum((F.col("match_type") == "exact").cast("int")).alias("n_exact"),
            F.sum((F.col("match_type") == "near").cast("int")).alias("n_near"),
            F.collect_set("label").alias("merged_labels"),
        )
        .withColumnRenamed("survivor_id", "record_id")
        .persist(StorageLevel.MEMORY_AND_DISK)
    )
    cached += [exact_survivors, mh, pairs, merged_map, members]
    merged_ids = common.broadcast_if_small(merged_map.drop("label"))
    members = common.broadcast_if_small(members)
    base_cols = list(kept.columns)
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
    merged = kept.join(merged_ids, "record_id").select(*base_cols, "survivor_id", "match_type")
    return {
        "kept": survivors.select(*base_cols, "cluster_size", "cluster_labels", "label_conflict"),
        "merged": merged,
        "clusters": clusters.where(F.col("cluster_size") > 1),
        "stats": {
            "exact_survivors": n_exact_survivors,
            "candidate_pairs": n_pairs,
            "near_edges": len(edges),
            "timings": timings,
        },
        "_persisted": cached,
    }


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
            for name in ("kept", "merged", "clusters"):
                res[name].write.parquet(str(out / name))
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
        finally:
            for df in res["_persisted"]:
                df.unpersist()
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
            **res["stats"],
        }

    return stage.run_stage(
        STAGE, cfg.lake, inputs, {"dedup": cfg.dedup.model_dump()}, _code_version(), work, run_id
    )


def _code_version() -> str:
    return stage.code_version([Path(__file__), common, textnorm, stage])


def main(argv: list[str] | None = None) -> None:
    def go(args):
        if not args.run_id:
            raise stage.StageError("--run-id is required: dedup reads that run's clean output")
        return run(common.config_from_args(args), run_id=args.run_id)

    common.run_main(go, __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    main()
