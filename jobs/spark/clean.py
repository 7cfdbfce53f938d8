"""Clean stage: schema, Unicode and whitespace normalization, length bounds, labels.

Reads the raw export (CSV, JSONL or Parquet, columns mapped by ``input.columns``) and
publishes ``kept/`` (canonical, normalized rows) and ``quarantine/`` (every rejected row
with a reason code and a detail) as one stage output. Every input record ends in exactly
one of the two; the manifest holds the counts per reason.

Run by hand:  spark-submit jobs/spark/clean.py [--config FILE] [--set input.path=...]
or:           intentops clean --set input.path=data.csv
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

if __package__ in (None, ""):  # run as a file by spark-submit
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import textnorm
from core import stage, stages
from core.config import CleanConfig, PipelineConfig
from jobs.spark import common

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame, SparkSession

STAGE = "clean"
LABELS_FILE = "labels.json"  # the run's label set, which every later stage reads
ANNOTATIONS_SCHEMA = "array<struct<annotator:string,label:string>>"

# Reject reasons, in the order they are checked: a row gets the first that applies.
REASONS = (
    "malformed_record",  # the parser could not split the record into the header's columns
    "empty_text",  # missing, empty or whitespace-only message
    "control_chars",  # binary garbage / terminal escapes in the text
    "mojibake",  # UTF-8 decoded as cp1252 somewhere upstream
    "too_short",
    "too_long",
    "missing_label",
    "rare_label",  # label_set: infer, and the label occurs fewer than min_class_count times
    "unknown_label",  # not in the label set even after normalization
    "bad_annotations",  # annotations present but not a JSON list of {annotator, label}
    "bad_timestamp",
    "duplicate_id",  # a second record with an id already seen: ids must identify rows
)


def nfkc_col(col: Column) -> Column:
    """Unicode NFKC of a string column, in the JVM.

    Spark SQL has no Unicode normalization function, but Spark 4 ships ICU4J (its collation
    support uses it), whose static ``Normalizer.compose(text, compat=true)`` is NFKC.
    Called through ``java_method``, per row in the executor: at 1M rows this is faster than
    a vectorized pandas UDF, which ships every message to Python and back. ICU may know a
    newer Unicode version than Python's ``unicodedata``; both agree on every code point
    Python knows (tests/test_clean.py checks them all).
    """
    from pyspark.sql import functions as F

    nfkc = F.java_method(F.lit("com.ibm.icu.text.Normalizer"), F.lit("compose"), col, F.lit(True))
    return F.when(col.isNotNull(), nfkc)  # compose() throws on null


def contains_any(col: Column, chars: str) -> Column:
    """Whether the string holds any of ``chars``: byte searches, no Java regex, so a cheap
    guard in front of a regex that costs microseconds a row and rarely matches."""
    from functools import reduce

    return reduce(lambda acc, ch: acc | col.contains(ch), chars[1:], col.contains(chars[0]))


def normalize_text_col(col: Column) -> Column:
    """Spark version of ``textnorm.normalize_text`` (NFKC, invisible chars, whitespace)
    for a column that is already NFKC (``nfkc_col``): that call is not deterministic to
    Spark, so it is never merged into, and repeated by, the expressions that use it."""
    from pyspark.sql import functions as F

    t = col
    # The regex runs only on text that holds one of the characters (9 us a row otherwise).
    inv = F.regexp_replace(t, f"[{textnorm._INVISIBLE}]", "")
    t = F.when(contains_any(t, textnorm._INVISIBLE), inv).otherwise(t)
    t = F.regexp_replace(t, r"(?U)\s+", " ")
    return F.trim(t)


def normalize_label_col(col: Column) -> Column:
    from pyspark.sql import functions as F

    out = F.regexp_replace(F.lower(F.trim(col)), r"[\s\-]+", "_")
    return F.when(out == "", None).otherwise(out)


def clean_frame(raw: DataFrame, labels: list[str], cfg: CleanConfig,
                rare: list[str] | None = None) -> DataFrame:
    """Flag every row of a canonical raw frame (see ``common.read_raw``).

    Returns all rows, normalized, with ``reason`` and ``detail`` (null when the row is
    kept), every reason but ``duplicate_id`` (``flag_duplicate_ids`` adds that one). Every
    expression is native Spark (NFKC calls ICU4J in the JVM, see nfkc_col).
    """
    from pyspark.sql import functions as F

    df = raw.withColumn("_row", F.monotonically_increasing_id())
    df = df.withColumn(
        "record_id",
        F.coalesce(F.col("id"), F.concat_ws(":", F.col("_source"), F.col("_row").cast("string"))),
    )
    df = df.withColumn("_nfkc", nfkc_col(F.col("text")))
    df = df.withColumn("norm_text", normalize_text_col(F.col("_nfkc"))).drop("_nfkc")
    df = df.withColumn("norm_len", F.length("norm_text"))
    df = df.withColumn("norm_label", normalize_label_col(F.col("label")))
    df = df.withColumn("ann", F.from_json("annotations", ANNOTATIONS_SCHEMA))
    df = df.withColumn("ts", F.try_to_timestamp(F.col("created_at")))

    label_set = F.array(*[F.lit(x) for x in sorted(labels)])
    checks: list[tuple[str, Column, Column]] = [
        (
            "malformed_record",
            F.col(common.CORRUPT).isNotNull(),
            F.lit("the record does not parse into the header's columns (broken quoting?)"),
        ),
        (
            "empty_text",
            F.col("norm_text").isNull() | (F.col("norm_len") == 0),
            F.lit("message is missing, empty or whitespace only"),
        ),
        (
            "control_chars",
            F.col("text").rlike(textnorm.CONTROL_RE.pattern),
            F.lit("message contains control characters"),
        ),
        (
            "mojibake",
            # Every mojibake pair starts with one of these letters, so the regex (4 us a
            # row) runs only on the few texts that have one.
            contains_any(F.col("text"), "\u00e2\u00c3\u00c2")
            & F.col("text").rlike(textnorm.MOJIBAKE_RE.pattern),
            F.lit("message looks mis-decoded (UTF-8 read as cp1252)"),
        ),
        (
            "too_short",
            F.col("norm_len") < cfg.min_chars,
            F.format_string("length %d < min_chars %d", F.col("norm_len"), F.lit(cfg.min_chars)),
        ),
        (
            "too_long",
            F.col("norm_len") > cfg.max_chars,
            F.format_string("length %d > max_chars %d", F.col("norm_len"), F.lit(cfg.max_chars)),
        ),
        ("missing_label", F.col("norm_label").isNull(), F.lit("no label")),
        (
            "rare_label",
            F.array_contains(F.array(*[F.lit(x) for x in sorted(rare or [])] or [F.lit(None).cast("string")]),
                             F.col("norm_label")),
            F.lit(f"fewer than {cfg.min_class_count} rows carry this label (clean.min_class_count)"),
        ),
        (
            "unknown_label",
            ~F.array_contains(label_set, F.col("norm_label")),
            F.lit("label is not in the label set"),
        ),
        (
            "bad_annotations",
            F.col("annotations").isNotNull() & F.col("ann").isNull(),
            F.lit("annotations are not a JSON list of {annotator, label}"),
        ),
        (
            "bad_timestamp",
            F.col("created_at").isNotNull() & F.col("ts").isNull(),
            F.lit("created_at is not an ISO-8601 timestamp"),
        ),
    ]
    reason: Column = F.lit(None).cast("string")
    for code, cond, _ in reversed(checks):
        reason = F.when(cond, F.lit(code)).otherwise(reason)
    # The detail follows from the reason: the checks run once per row, not once per column.
    detail: Column = F.lit(None).cast("string")
    for code, _, why in reversed(checks):
        detail = F.when(F.col("reason") == code, why).otherwise(detail)
    df = df.withColumn("reason", reason).withColumn("detail", detail)

    ann_norm = F.transform(
        "ann",
        lambda a: F.struct(
            a["annotator"].alias("annotator"), normalize_label_col(a["label"]).alias("label")
        ),
    )
    return df.withColumn("ann_norm", ann_norm)


def reused_ids(flagged: DataFrame) -> DataFrame:
    """Ids on more than one record, each with its first record (``_source``, ``_row``).

    Only ids and row positions are shuffled; usually few ids qualify."""
    from pyspark.sql import functions as F

    return (
        flagged.groupBy("record_id")
        .agg(F.count("*").alias("_n"), F.min(F.struct("_source", "_row")).alias("_first"))
        .where(F.col("_n") > 1)
        .drop("_n")
    )


def flag_duplicate_ids(flagged: DataFrame, reused: DataFrame) -> DataFrame:
    """Quarantine as ``duplicate_id`` every otherwise kept record whose id an earlier
    record (by source file, then position) already used. ``reused`` is ``reused_ids``'
    output, possibly with a broadcast hint: then no record is shuffled (a window over
    the id would sort every record with all its columns)."""
    from pyspark.sql import functions as F

    dup = (
        F.col("reason").isNull()
        & F.col("_first").isNotNull()
        & (F.struct("_source", "_row") != F.col("_first"))
    )
    return (
        flagged.join(reused, "record_id", "left")
        .withColumns(
            {
                "reason": F.when(dup, F.lit("duplicate_id")).otherwise(F.col("reason")),
                "detail": F.when(dup, F.lit("id already used by an earlier record")).otherwise(
                    F.col("detail")
                ),
            }
        )
        .drop("_first")
    )


def kept_view(flagged: DataFrame) -> DataFrame:
    from pyspark.sql import functions as F

    return flagged.where(F.col("reason").isNull()).select(
        "record_id",
        F.col("norm_text").alias("text"),
        F.col("norm_label").alias("label"),
        F.coalesce("ann_norm", F.array().cast(ANNOTATIONS_SCHEMA)).alias("annotations"),
        F.col("ts").alias("created_at"),
        "channel",
        F.col("_source").alias("source_file"),
    )


def unlabeled_view(flagged: DataFrame) -> DataFrame:
    """Rows whose one finding is a missing label (``clean.unlabeled: review``): kept's
    columns, no label; desensitize masks them, label QA pre-labels and queues them."""
    from pyspark.sql import functions as F

    return kept_view(flagged.withColumn("reason", F.when(F.col("reason") == "missing_label", F.lit(None))
                                        .otherwise(F.lit("x"))))


def quarantine_view(flagged: DataFrame, unlabeled: bool = False) -> DataFrame:
    from pyspark.sql import functions as F

    bad = F.col("reason").isNotNull()
    if unlabeled:
        bad &= F.col("reason") != "missing_label"
    return flagged.where(bad).select(
        "record_id",
        "reason",
        "detail",
        F.col("text").alias("raw_text"),
        F.col("label").alias("raw_label"),
        F.col(common.CORRUPT).alias("raw_record"),
        F.col("_source").alias("source_file"),
    )


def load_labels(cfg: PipelineConfig) -> list[str]:
    """The configured label set (``clean.labels_file``); a bad file is a StageError."""
    return textnorm.load_label_set(cfg.resolve_path(cfg.clean.labels_file))


def label_counts(raw: DataFrame) -> dict[str, int]:
    """Rows per normalized label in the export (rows without a label are not counted)."""
    from pyspark.sql import functions as F

    counted = (raw.select(normalize_label_col(F.col("label")).alias("l")).where(F.col("l").isNotNull())
               .groupBy("l").count().collect())
    return {r["l"]: r["count"] for r in counted}


def infer_labels(counts: dict[str, int], min_count: int, src: str) -> tuple[list[str], list[str]]:
    """The label set of ``label_set: infer``: labels with at least ``min_count`` rows, and
    the rarer ones (their rows are quarantined). Fewer than two labels is an error."""
    labels = sorted(k for k, n in counts.items() if n >= min_count)
    rare = sorted(k for k, n in counts.items() if n < min_count)
    if len(labels) < 2:
        raise stage.StageError(
            f"{src}: cannot infer a label set: {len(counts)} distinct labels, "
            f"{len(labels)} with at least {min_count} rows (clean.min_class_count); a classifier "
            f"needs two or more ({', '.join(f'{k} {n}' for k, n in sorted(counts.items())[:10])})")
    return labels, rare


def check_label_fit(checked: DataFrame, by_reason: dict[str | None, int], total: int, src: str,
                    labels_file: str) -> None:
    """A label file that does not describe the export fails with what does not match:
    when most labelled rows have labels missing from it. (Counted from the reasons already
    computed; the labels are looked up only on that failure.)"""
    from pyspark.sql import functions as F

    unknown = by_reason.get("unknown_label", 0)
    labelled = total - by_reason.get("missing_label", 0)
    if labelled and unknown > labelled / 2:
        top = (checked.where(F.col("reason") == "unknown_label").groupBy("norm_label").count()
               .orderBy(F.desc("count")).limit(5).collect())
        names = ", ".join(f"{r['norm_label']!r} ({r['count']})" for r in top)
        raise stage.StageError(
            f"{src}: {unknown:,} of {labelled:,} labelled rows have labels that are not in "
            f"{labels_file} (most common: {names}); is it this export's label set? Point "
            f"clean.labels_file at the right file, or set clean.label_set: infer")


def run(cfg: PipelineConfig, run_id: str | None = None, spark: SparkSession | None = None):
    src = cfg.resolve_path(cfg.input.path)
    fmt = common.detect_format(str(src), cfg.input.format)
    labels = load_labels(cfg) if cfg.clean.label_set == "file" else None
    if cfg.input.partitions:  # a scheduled run's days: its key covers those days only
        inputs: dict[str, Any] = {
            "raw": {
                "format": fmt,
                "partitions": {
                    Path(p).name: stage.file_fingerprint(p) for p in common.input_sources(cfg)
                },
            }
        }
    else:
        inputs = {"raw": stage.file_fingerprint(src) | {"format": fmt}}
    stage_cfg = {
        "input": cfg.input.model_dump(exclude={"path"}),
        "clean": cfg.clean.model_dump(),
        "labels": sorted(labels) if labels is not None else "infer",
        "oos_label": cfg.oos.label,
    }

    def work(out: Path) -> dict[str, Any]:
        from pyspark import StorageLevel

        session = spark or common.get_spark(cfg, "intentops-clean")
        raw = common.read_raw(session, cfg, str(src))
        if labels is None:  # one more pass over the export, in infer mode only
            run_labels, rare = infer_labels(label_counts(raw), cfg.clean.min_class_count, str(src))
        else:
            run_labels, rare = labels, []
        (out / LABELS_FILE).write_text(json.dumps(run_labels, indent=1))
        checked = clean_frame(raw, run_labels, cfg.clean, rare).persist(StorageLevel.MEMORY_AND_DISK)
        reused = reused_ids(checked).persist(StorageLevel.MEMORY_AND_DISK)
        try:
            flagged = flag_duplicate_ids(checked, common.broadcast_if_small(reused))
            # One pass counts rows per reason and, for kept rows, per label.
            by_reason: dict[str | None, int] = {}
            kept_labels: dict[str, int] = {}
            for r in flagged.groupBy("reason", "norm_label").count().collect():
                by_reason[r["reason"]] = by_reason.get(r["reason"], 0) + r["count"]
                if r["reason"] is None:
                    kept_labels[r["norm_label"]] = r["count"]
            total = sum(by_reason.values())
            if total == 0:
                raise stage.StageError(f"{src}: input has no records")
            kept_n = by_reason.pop(None, 0)
            if labels is not None:
                check_label_fit(checked, by_reason, total, str(src), cfg.clean.labels_file)
            review_unlabeled = cfg.clean.unlabeled == "review"
            unlabeled_n = by_reason.pop("missing_label", 0) if review_unlabeled else 0
            kept_view(flagged).write.parquet(str(out / "kept"))
            quarantine_view(flagged, review_unlabeled).write.parquet(str(out / "quarantine"))
            if review_unlabeled:
                unlabeled_view(flagged).write.parquet(str(out / "unlabeled"))
            oos = textnorm.normalize_label(cfg.oos.label) if cfg.oos.label else None
            if oos is not None and oos not in kept_labels:
                raise stage.StageError(
                    f"{src}: oos.label {cfg.oos.label!r} never occurs among the rows that pass "
                    f"cleaning (labels: {', '.join(sorted(kept_labels)[:8])}"
                    f"{', ...' if len(kept_labels) > 8 else ''}); name the label your export "
                    "gives out-of-scope messages, or leave oos.label empty")
            if len(kept_labels) < 2:
                raise stage.StageError(
                    f"{src}: the rows that pass cleaning carry {len(kept_labels)} label(s) "
                    f"({', '.join(map(str, kept_labels)) or 'none'}); a classifier needs two or more")
        finally:
            checked.unpersist()
            reused.unpersist()
        quarantined = sum(by_reason.values())
        # A guard against a bug, not a user error: nothing may be lost between in and out.
        if kept_n + quarantined + unlabeled_n != total:
            raise AssertionError(f"row accounting broken: {kept_n}+{quarantined}+{unlabeled_n} != {total}")
        return {
            "rows_in": total,
            "kept": kept_n,
            "quarantined": quarantined,
            "unlabeled": unlabeled_n,
            "quarantine_by_reason": {r: by_reason.get(r, 0) for r in REASONS if by_reason.get(r)},
            "input_path": str(src),
            "label_set": cfg.clean.label_set,
            "labels": run_labels,
            "rare_labels": rare,
            "label_counts": dict(sorted(kept_labels.items())),
        }

    return stage.run_stage(STAGE, cfg.lake, inputs, stage_cfg, stages.code_version(STAGE), work, run_id)


def main(argv: list[str] | None = None) -> None:
    def go(args):
        return run(common.config_from_args(args), run_id=args.run_id)

    common.run_main(go, __doc__.splitlines()[0], argv)


if __name__ == "__main__":
    main()
