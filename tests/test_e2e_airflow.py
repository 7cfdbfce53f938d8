"""End to end: the DAG through real `airflow dags test`, real spark-submit, on a small
build of the raw-data builder; then the same run again is a cache hit everywhere."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from conftest import ROOT

from pipeline import stage
from pipeline.evaluate import evaluate

pytestmark = pytest.mark.e2e
ROWS = 4000


@pytest.fixture(scope="module")
def airflow_env(tmp_path_factory, project_env):
    base = tmp_path_factory.mktemp("e2e")
    env = dict(project_env)
    env.update(
        AIRFLOW_HOME=str(base / "airflow"),
        AIRFLOW__CORE__DAGS_FOLDER=str(ROOT / "dags"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW_CONN_SPARK_DEFAULT='{"conn_type": "spark", "host": "local[2]"}',
        INTENTOPS__LAKE_ROOT=str(base / "lake"),
        INTENTOPS_SPARK_DRIVER_MEMORY="2g",
    )
    raw = base / "raw"
    subprocess.run([sys.executable, "-m", "pipeline.rawdata", "--out", str(raw), "--rows", str(ROWS),
                    "--seed", "3", "--format", "csv"], env=env, cwd=ROOT, check=True, timeout=600)
    subprocess.run(["airflow", "db", "migrate"], env=env, cwd=ROOT, check=True, timeout=600,
                   capture_output=True)
    return env, base, raw


def _dags_test(env: dict[str, str], raw: Path) -> subprocess.CompletedProcess:
    conf = json.dumps({"input_path": str(raw / "raw.csv")})
    return subprocess.run(["airflow", "dags", "test", "intentops_pipeline", "--conf", conf],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=1200)


def _latest(lake: Path) -> tuple[str, dict]:
    name = (lake / "runs" / "LATEST").read_text().strip()
    return name, json.loads((lake / "runs" / name / "summary.json").read_text())


@pytest.fixture(scope="module")
def first_run(airflow_env):
    env, base, raw = airflow_env
    out = _dags_test(env, raw)
    assert out.returncode == 0, (out.stdout + out.stderr)[-6000:]
    return _latest(base / "lake")


def test_dag_run_accounts_for_every_row(first_run, airflow_env):
    _, base, raw = airflow_env
    _, summary = first_run
    stages = {s["stage"]: s for s in summary["stages"]}
    gt_rows = len(pd.read_parquet(raw / "ground_truth" / "rows.parquet"))
    c, d = stages["clean"], stages["dedup"]
    assert c["rows_in"] == gt_rows
    assert c["kept"] + c["quarantined"] == c["rows_in"]
    assert d["rows_in"] == c["kept"]
    assert d["kept"] + d["merged"] == d["rows_in"]
    assert c["quarantined"] > 0 and d["merged_exact"] > 0 and d["merged_near"] > 0


def test_data_stages_meet_quality_targets(first_run, airflow_env):
    _, base, raw = airflow_env
    run_name, _ = first_run
    lake = base / "lake"
    c = stage.upstream(lake, run_name, "clean")
    d = stage.upstream(lake, run_name, "dedup")
    q = evaluate(raw / "ground_truth", c.path, d.path, 0.8)
    assert q["clean"]["defective_survived"] == 0, q["clean"]
    assert q["clean"]["clean_rows_quarantined"] == 0, q["clean"]
    assert q["dedup"]["exact_recall"]["recall"] == 1.0, q["dedup"]
    assert q["dedup"]["near_recall"]["recall"] >= 0.95, q["dedup"]
    assert q["dedup"]["near_precision"]["precision"] >= 0.99, q["dedup"]
    assert q["dedup"]["exact_precision"]["precision"] >= 0.99, q["dedup"]


def test_second_run_is_a_cache_hit_with_unchanged_output(first_run, airflow_env):
    env, base, raw = airflow_env
    first_name, first = first_run
    outputs = {s["stage"]: s["output"] for s in first["stages"]}
    before = {k: stage.file_fingerprint(v) for k, v in outputs.items()}
    out = _dags_test(env, raw)
    assert out.returncode == 0, (out.stdout + out.stderr)[-6000:]
    name, second = _latest(base / "lake")
    assert name != first_name
    for s in second["stages"]:
        assert s["cache_hit"], s
        assert s["output"] == outputs[s["stage"]]
        assert stage.file_fingerprint(s["output"]) == before[s["stage"]]
