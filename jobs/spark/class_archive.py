"""A class-data-sharing (AppCDS) archive of the Spark JVM's classes, and the job that fills it.

A spark-submit of a few thousand rows is mostly fixed cost, and a large part of it is the
JVM loading and verifying some ten thousand classes of Spark, Hadoop and Arrow. JDK 17 can
write the classes a run loaded to an archive when it exits (``-XX:ArchiveClassesAtExit``)
and map that archive into later JVMs (``-XX:SharedArchiveFile``, what
``spark.class_archive`` adds to the driver and executor options). Measured here: an empty
job 19 -> 12 CPU-seconds; the pipeline's Spark stages in docs/BENCHMARKS.md.

:func:`build` runs this file under spark-submit as the filling job: it touches what the
stages use (CSV and Parquet reading and writing, a shuffle, a broadcast join, a window, a
pandas UDF over Arrow), so most of their classes are in the archive; a class that is not
still loads the usual way. The archive is written to a temporary name and renamed only after
the JVM exited cleanly: a truncated archive crashes the JVM that maps it (SIGBUS, measured),
while a whole one that no longer fits the JVM or the classpath is refused with a warning.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path


class ArchiveError(RuntimeError):
    """The archive could not be built; the message says why."""


def build(out: Path, java_options: str = "", timeout: float = 600) -> Path:
    """Write the archive to ``out`` (atomically) by running the filling job once."""
    out = Path(out).resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    tmp.unlink(missing_ok=True)
    options = f"{java_options} -XX:ArchiveClassesAtExit={tmp}".strip()
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    # This interpreter's spark-submit (pyspark's, in the same bin folder), else the PATH's.
    submit = Path(sys.executable).with_name("spark-submit")
    cmd = [str(submit) if submit.is_file() else "spark-submit", "--master", "local[2]", "--conf", "spark.ui.enabled=false",
           "--conf", "spark.ui.showConsoleProgress=false",
           "--conf", f"spark.driver.extraJavaOptions={options}", str(Path(__file__).resolve())]
    try:
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout)
        if proc.returncode != 0 or not tmp.is_file() or tmp.stat().st_size == 0:
            lines = [x for x in (proc.stdout + proc.stderr).splitlines() if " INFO " not in x]
            tail = "\n".join(lines[-15:])
            raise ArchiveError(f"spark-submit exited {proc.returncode} without writing the archive "
                               f"(JVM options: {options!r}):\n{tail}")
        os.replace(tmp, out)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ArchiveError(f"could not run spark-submit to build the archive: {exc}") from exc
    finally:
        tmp.unlink(missing_ok=True)
    return out


def _fill() -> None:
    """The filling job: the operations the Spark stages use, on a few rows."""
    import tempfile

    from pyspark.sql import SparkSession, Window
    from pyspark.sql import functions as F

    spark = (SparkSession.builder.appName("intentops-class-archive")
             .config("spark.sql.shuffle.partitions", "2")
             .config("spark.sql.session.timeZone", "UTC").getOrCreate())
    rows = [(i, f"message {i} about card {i % 7}", f"label_{i % 3}", "2026-11-01T10:00:00Z") for i in range(200)]
    df = spark.createDataFrame(rows, "id long, text string, label string, created_at string")

    def _upper(s):  # no annotations: under `from __future__ import annotations` they are strings
        return s.str.upper()

    upper = F.pandas_udf(_upper, "string", F.PandasUDFType.SCALAR)

    with tempfile.TemporaryDirectory() as tmp:
        df.write.mode("overwrite").option("header", "true").csv(f"{tmp}/csv")
        read = spark.read.option("header", "true").option("mode", "PERMISSIVE").csv(f"{tmp}/csv")
        read = read.withColumn("created_at", F.to_timestamp("created_at")).withColumn("up", upper("text"))
        read.write.mode("overwrite").partitionBy("label").parquet(f"{tmp}/parquet")
        back = spark.read.parquet(f"{tmp}/parquet")
        counts = back.groupBy("label").agg(F.count("*").alias("n"), F.collect_list("id").alias("ids"))
        joined = back.join(F.broadcast(counts), "label").withColumn(
            "rank", F.row_number().over(Window.partitionBy("label").orderBy(F.sha2("text", 256))))
        joined.select(F.explode("ids").alias("x"), "rank", F.xxhash64("text").alias("h"),
                      F.regexp_replace("text", r"\d+", "#").alias("t")).distinct().count()
        joined.write.mode("overwrite").json(f"{tmp}/json")
        spark.read.json(f"{tmp}/json").toPandas()
    spark.stop()


if __name__ == "__main__":
    _fill()
