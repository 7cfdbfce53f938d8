"""Shared plumbing for the Spark jobs: session, raw-input reader, argument parsing.

Every job is both an importable function over DataFrames (what the tests call) and a
spark-submit entry point (what the DAG runs). Under spark-submit the master and the
resources come from spark-submit itself; run directly, the job starts a local session
from ``spark.master`` in the config.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from core.config import PipelineConfig
from core.stage import StageError

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

CORRUPT = "_corrupt_record"
# Canonical names the rest of the pipeline uses, whatever the export calls them.
FIELDS = ("id", "text", "label", "annotations", "created_at", "channel")
REQUIRED = ("text", "label")
# A persisted side table (repeated ids or keys, clusters) of up to this many rows is joined
# by broadcast (about 100 bytes a row); a larger one falls back to a shuffle join.
BROADCAST_ROWS = 2_000_000


def get_spark(cfg: PipelineConfig, app: str) -> SparkSession:
    import os

    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app)
    # spark-submit starts the Python driver with a gateway to its JVM (and the master,
    # memory, etc. it was given); only outside it do we pick a master ourselves.
    if "PYSPARK_GATEWAY_PORT" not in os.environ:
        if cfg.spark.master.startswith("local"):
            os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        # Python workers must run this interpreter (it has the project's packages).
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        builder = builder.master(cfg.spark.master).config(
            "spark.driver.memory", cfg.spark.driver_memory
        )
        for key, value in cfg.spark.java_conf().items():
            builder = builder.config(key, value)
    spark = (
        builder.config("spark.sql.shuffle.partitions", str(cfg.spark.shuffle_partitions))
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.ui.enabled", "false")
        .config("spark.log.structuredLogging.enabled", "false")
        # Arrow batches feed the vectorized UDFs; 4k rows keeps their numpy buffers small.
        .config("spark.sql.execution.arrow.maxRecordsPerBatch", "4096")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    if spark.conf.get("spark.sql.files.minPartitionNum", None) is None:
        # Input files split into at least two tasks per core. By default a file is cut at
        # 128 MB or size/cores: 427 MB of CSV on 2 cores became 128+128+128+43 MB, so one
        # core idled through a third of the read, and the outputs inherited those skewed
        # parts. With 4 parts of 107 MB both cores finish together; large inputs still
        # split at 128 MB.
        spark.conf.set(
            "spark.sql.files.minPartitionNum", str(2 * spark.sparkContext.defaultParallelism)
        )
    return spark


def broadcast_if_small(table: DataFrame) -> DataFrame:
    """``table`` (persisted) with a broadcast hint when it has at most BROADCAST_ROWS rows:
    then the large side of the join is not shuffled."""
    from pyspark.sql import functions as F

    return F.broadcast(table) if table.count() <= BROADCAST_ROWS else table


_EXTENSIONS = ((".csv", "csv"), (".jsonl", "jsonl"), (".json", "jsonl"), (".parquet", "parquet"))


def detect_format(path: str, fmt: str) -> str:
    """The input format: given, or by the file's extension, or for a local folder by the
    extension its data files share (a folder of date partitions, say)."""
    if fmt != "auto":
        return fmt
    name = path.rstrip("/").lower()
    for ext, f in _EXTENSIONS:
        if name.endswith(ext):
            return f
    local = Path(path)
    if "://" not in path and local.is_dir():
        found = {
            f
            for p in local.rglob("*")
            if p.is_file() and not p.name.startswith((".", "_"))
            for ext, f in _EXTENSIONS
            if p.name.lower().endswith(ext)
        }
        if len(found) == 1:
            return found.pop()
    raise StageError(
        f"{path}: cannot tell the input format from the name; set input.format to csv, jsonl or parquet"
    )


def input_sources(cfg: PipelineConfig, path: str | None = None) -> list[str]:
    """What the clean stage reads: the input path, or its selected date partitions."""
    src = str(cfg.resolve_path(path or cfg.input.path))
    if not cfg.input.partitions:
        return [src]
    missing = [p for p in cfg.input.partitions if not (Path(src) / p).is_dir()]
    if missing:
        raise StageError(f"{src}: partition(s) not found: {', '.join(missing)}")
    return [str(Path(src) / p) for p in cfg.input.partitions]


def _mapped(cfg: PipelineConfig) -> dict[str, str]:
    cols = cfg.input.columns.model_dump()
    return {f: cols[f] for f in FIELDS if cols.get(f)}


def _check_columns(path: str, present: list[str], mapping: dict[str, str]) -> None:
    missing = [f"{src!r} (for {field})" for field, src in mapping.items() if src not in present]
    required_missing = [m for m in missing if any(m.endswith(f"(for {r})") for r in REQUIRED)]
    if required_missing:
        raise StageError(
            f"{path}: missing required column(s) {', '.join(required_missing)}; "
            f"the file has {present}. Map your columns with input.columns.*"
        )
    if missing:
        log.warning("%s: optional column(s) absent, treated as null: %s", path, ", ".join(missing))


def read_raw(spark: SparkSession, cfg: PipelineConfig, path: str | None = None) -> DataFrame:
    """Read a raw export into the canonical columns, all strings, plus ``_corrupt_record``
    (the raw line of a record the parser could not read) and ``_source`` (file name).

    Fails with a message naming the file for an unreadable or empty input or a missing
    required column. Row-level problems are left for the clean stage to quarantine.
    """
    from pyspark.errors import AnalysisException
    from pyspark.sql import functions as F
    from pyspark.sql.types import StringType, StructField, StructType

    sources = input_sources(cfg, path)
    src = sources[0] if len(sources) == 1 else str(cfg.resolve_path(path or cfg.input.path))
    fmt = detect_format(src, cfg.input.format)
    mapping = _mapped(cfg)
    for one in sources:
        local = Path(one)
        if "://" not in one:
            if not local.exists():
                raise StageError(f"{one}: input not found")
            if local.is_file() and local.stat().st_size == 0:
                raise StageError(f"{one}: input is empty (0 bytes)")
    try:
        if fmt == "parquet":
            df = spark.read.parquet(*sources)
            present = df.columns
            _check_columns(src, present, mapping)
            df = df.withColumn(CORRUPT, F.lit(None).cast("string"))
        else:
            present = _header(spark, sources, fmt)
            _check_columns(src, present, mapping)
            schema = StructType(
                [StructField(c, StringType()) for c in present]
                + [StructField(CORRUPT, StringType())]
            )
            reader = (
                spark.read.schema(schema)
                .option("mode", "PERMISSIVE")
                .option("columnNameOfCorruptRecord", CORRUPT)
            )
            if fmt == "csv":
                df = (
                    reader.option("header", True)
                    .option("multiLine", cfg.input.csv_multiline)
                    .option("encoding", cfg.input.encoding)
                    .option("escape", '"')
                    # Spark's default for escape == quote is NUL, which makes the parser
                    # silently drop a NUL next to a doubled quote: the control character
                    # would vanish instead of reaching the clean stage's check.
                    .option("charToEscapeQuoteEscaping", '"')
                    # Keep the text exactly as exported; the clean stage normalizes it.
                    .option("ignoreLeadingWhiteSpace", False)
                    .option("ignoreTrailingWhiteSpace", False)
                    .csv(sources)
                )
            else:
                df = reader.json(sources)
    except AnalysisException as exc:
        raise StageError(f"{src}: cannot read as {fmt}: {exc.getMessage()}") from exc
    cols = []
    for field in FIELDS:
        source = mapping.get(field)
        if source and source in present:
            cols.append(F.col(f"`{source}`").cast("string").alias(field))
        else:
            cols.append(F.lit(None).cast("string").alias(field))
    return df.select(*cols, F.col(CORRUPT), F.col("_metadata.file_name").alias("_source"))


def _header(spark: SparkSession, sources: list[str], fmt: str) -> list[str]:
    """Column names without a schema-inference pass over the whole file."""
    from pyspark.sql.utils import AnalysisException

    src = sources[0] if len(sources) == 1 else ", ".join(sources)
    try:
        head = [r.value for r in spark.read.text(sources).limit(200).collect()]
    except AnalysisException as exc:
        raise StageError(f"{src}: cannot read: {exc.getMessage()}") from exc
    head = [h for h in head if h.strip()]
    if not head:
        raise StageError(f"{src}: input is empty (no records)")
    if fmt == "csv":
        import csv

        return next(csv.reader([head[0]]))
    keys: dict[str, None] = {}
    for line in head:
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict):
            keys.update(dict.fromkeys(obj))
    if not keys:
        raise StageError(f"{src}: no JSON object in the first {len(head)} lines; is it JSONL?")
    return list(keys)


def job_args(description: str, argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--config", help="YAML config file (default configs/pipeline.yaml)")
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a config field, e.g. --set dedup.threshold=0.85 (repeatable)",
    )
    p.add_argument(
        "--resolved-config",
        help="a run's resolved config.json (what the DAG passes); --config/--set then apply on top",
    )
    p.add_argument("--run-id", help="pipeline run id: records which outputs this run used")
    return p.parse_args(argv)


def config_from_args(args: argparse.Namespace) -> PipelineConfig:
    from core.runs import config_from_args as resolve

    return resolve(args)


def run_main(fn, description: str, argv: list[str] | None = None) -> None:
    """Entry-point wrapper: a StageError becomes a one-line message and exit code 2
    (a user problem), anything else a traceback (a bug)."""
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        result = fn(job_args(description, argv))
    except StageError as exc:
        print(f"ERROR: {exc}", file=sys.stderr)
        sys.exit(2)
    print(result.to_json())
