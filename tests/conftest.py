"""Shared fixtures: one local Spark session for the suite, and a clean environment for
subprocesses (spark-submit, airflow) that points at the project's virtualenv."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def spark():
    from jobs.spark.common import get_spark
    from pipeline.config import load_config

    cfg = load_config(overrides={"spark.master": "local[2]", "spark.shuffle_partitions": 2})
    session = get_spark(cfg, "intentops-tests")
    yield session
    session.stop()


@pytest.fixture
def lake(tmp_path: Path) -> Path:
    return tmp_path / "lake"


@pytest.fixture(scope="session")
def project_env() -> dict[str, str]:
    """Environment for child processes: the venv first on PATH (spark-submit, airflow)."""
    bin_dir = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INTENTOPS__", "AIRFLOW"))}
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        PYSPARK_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
        PYTHONPATH=str(ROOT),
    )
    return env
