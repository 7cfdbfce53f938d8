"""The Spark JVM's class-data-sharing archive (spark.class_archive, `intentops spark-archive`):
added to the JVM options only when its file exists, built atomically, and mapped by a real
spark-submit (`make test` builds it before the suite, as `make up` does)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from conftest import FAST_PIPELINE_ENV

from core.config import PROJECT_ROOT, load_config
from jobs.spark.class_archive import ArchiveError, build


def _conf(**spark) -> dict[str, str]:
    return load_config(overrides={f"spark.{k}": v for k, v in spark.items()}).spark.java_conf()


def test_the_archive_is_in_the_jvm_options_only_when_its_file_exists(tmp_path):
    archive = tmp_path / "classes.jsa"
    assert _conf(class_archive=str(archive), java_options="") == {}  # missing: not used
    archive.write_bytes(b"x")
    conf = _conf(class_archive=str(archive), java_options="-XX:TieredStopAtLevel=1")
    assert conf == {f"spark.{r}.extraJavaOptions": f"-XX:TieredStopAtLevel=1 -XX:SharedArchiveFile={archive}"
                    for r in ("driver", "executor")}
    assert _conf(class_archive="", java_options="-Xss2m") == {
        f"spark.{r}.extraJavaOptions": "-Xss2m" for r in ("driver", "executor")}
    rel = load_config(overrides={"spark.class_archive": ".venv/x.jsa"}).spark.archive_path()
    assert rel == PROJECT_ROOT / ".venv" / "x.jsa"


def test_a_failed_build_leaves_no_archive_and_says_why(tmp_path):
    out = tmp_path / "classes.jsa"
    with pytest.raises(ArchiveError, match="without writing the archive"):
        build(out, java_options="-Xmx1k")  # a heap no JVM starts with
    assert list(tmp_path.iterdir()) == []  # neither the archive nor its temporary file


def test_spark_submit_maps_the_archive_make_test_built(tmp_path, project_env):
    """-Xshare:on: the JVM exits with an error instead of starting when it cannot map the
    archive (a stale one, or one for another classpath), so this run proves it is used."""
    archive = Path(FAST_PIPELINE_ENV["INTENTOPS__SPARK__CLASS_ARCHIVE"])
    assert archive.is_file(), f"{archive} missing: `make spark-archive` builds it (`make test` does)"
    job = tmp_path / "job.py"
    job.write_text("from pyspark.sql import SparkSession\n"
                   "s = SparkSession.builder.getOrCreate()\n"
                   "print('rows', s.range(5).count())\n")
    options = _conf(class_archive=str(archive), java_options="-XX:TieredStopAtLevel=1")["spark.driver.extraJavaOptions"]
    out = subprocess.run(["spark-submit", "--master", "local[1]", "--conf", "spark.ui.enabled=false",
                          "--conf", f"spark.driver.extraJavaOptions={options} -Xshare:on", str(job)],
                         env={**project_env, "PYSPARK_PYTHON": sys.executable}, capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0 and "rows 5" in out.stdout, (out.stdout + out.stderr)[-3000:]
