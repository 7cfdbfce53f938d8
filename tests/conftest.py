"""Shared fixtures: one local Spark session for the suite, and a clean environment for
subprocesses (spark-submit, airflow) that points at the project's virtualenv."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pandas as pd
import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="session")
def spark():
    from core.config import load_config
    from jobs.spark.common import get_spark

    cfg = load_config(overrides={"spark.master": "local[2]", "spark.shuffle_partitions": 2,
                                 "spark.java_options": FAST_PIPELINE_ENV["INTENTOPS__SPARK__JAVA_OPTIONS"],
                                 "spark.class_archive": FAST_PIPELINE_ENV["INTENTOPS__SPARK__CLASS_ARCHIVE"]})
    session = get_spark(cfg, "intentops-tests")
    yield session
    session.stop()


@pytest.fixture
def lake(tmp_path: Path) -> Path:
    return tmp_path / "lake"


@pytest.fixture(scope="session", autouse=True)
def audit_log(tmp_path_factory) -> Path:
    """One audit log for the session, in a temp folder (never the checkout's var/audit/):
    this process and every child process (through the environment) append to it."""
    path = tmp_path_factory.mktemp("audit") / "audit.jsonl"
    os.environ["INTENTOPS_AUDIT_LOG"] = str(path)
    return path


@pytest.fixture(scope="session", autouse=True)
def registry_credentials(tmp_path_factory):
    """Generated passwords of the session MLflow server's users; this process and every
    child process (through the environment) talk to it as the pipeline user."""
    from core import registry_auth

    creds = registry_auth.RegistryCredentials.load_or_create(
        tmp_path_factory.mktemp("registry-auth") / "credentials.json")
    os.environ.update(registry_auth.client_env(creds))
    return creds


@pytest.fixture(scope="session")
def project_env(audit_log, registry_credentials) -> dict[str, str]:
    """Environment for child processes: the venv first on PATH (spark-submit, airflow)."""
    bin_dir = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("INTENTOPS__", "AIRFLOW"))}
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        PYSPARK_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
        PYTHONPATH=str(ROOT),
        INTENTOPS_AUDIT_LOG=str(audit_log),
    )
    return env


# What the suite's whole-pipeline runs (airflow dags test, make up's standalone) set on top
# of the config they test: a smaller int8 search (2 of the default 12 quantization
# candidates; test_export.py runs the search over fusions and per-channel itself), fewer
# latency samples for the speed report, and as many shuffle partitions as cores. None of
# these is a gate; every gate keeps its value.
FAST_PIPELINE_ENV = {
    "INTENTOPS__EXPORT__FUSIONS": "[none, full]",
    "INTENTOPS__EXPORT__PER_CHANNEL": "[true]",
    "INTENTOPS__EXPORT__REDUCE_RANGE": "[false]",
    "INTENTOPS__EXPORT__LATENCY_SAMPLES": "30",
    "INTENTOPS__EXPORT__THROUGHPUT_BATCHES": "4",
    "INTENTOPS__EXPORT__CANDIDATE_BATCHES": "2",
    "INTENTOPS__SPARK__SHUFFLE_PARTITIONS": "2",
    # The JIT's optimizing compiler costs a short spark-submit about 40% of its CPU (the
    # suite's two workers share two cores): C1 only (spark.java_options, docs/BENCHMARKS.md).
    "INTENTOPS__SPARK__JAVA_OPTIONS": "-XX:TieredStopAtLevel=1",
    # The class archive `make test` builds (make spark-archive): Spark's classes mapped, not
    # loaded, at each spark-submit (unused if missing).
    "INTENTOPS__SPARK__CLASS_ARCHIVE": str(Path(sys.prefix) / "spark-classes.jsa"),
}


def _wait_healthy(name: str, url: str, proc, timeout: float, log: Path, kill) -> None:
    """Until ``url`` answers 200; a process that exits or a timeout is killed (``kill``)
    and raised with the tail of its log."""
    import time
    import urllib.request

    deadline = time.time() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if proc.poll() is not None or time.time() > deadline:
            kill()
            raise RuntimeError(f"{name} did not start: " + log.read_text()[-3000:])
        time.sleep(0.5)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory, project_env, registry_credentials):
    """A real MLflow tracking server (SQLite backend, proxied local artifact store) with
    MLflow's basic-auth app, as ``make up`` runs it, for the session; yields its URI. The
    suite talks to it as the pipeline user (``registry_credentials``)."""
    import subprocess

    from core import registry_auth

    base = tmp_path_factory.mktemp("mlflow")
    port = _free_port()
    log = (base / "server.log").open("w")
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "mlflow"), "server", *registry_auth.server_args(),
         "--host", "127.0.0.1",
         "--port", str(port), "--backend-store-uri", f"sqlite:///{base / 'mlflow.db'}",
         "--artifacts-destination", str(base / "artifacts"), "--workers", "1"],
        env={**project_env, **registry_auth.server_env(registry_credentials, base / "auth")},
        stdout=log, stderr=subprocess.STDOUT,
    )
    uri = f"http://127.0.0.1:{port}"
    _wait_healthy("mlflow server", f"{uri}/health", proc, 120, base / "server.log", proc.kill)
    registry_auth.provision(uri, registry_credentials)
    yield uri
    proc.terminate()
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()


@pytest.fixture(scope="session")
def label_studio(tmp_path_factory):
    """A real Label Studio server for the session, started as `make up` starts it (its own
    virtual environment, SQLite, 127.0.0.1, generated admin and token), on a free port so
    a developer's `make up` on 8300 and other test sessions never collide. Yields
    ``(url, credentials)``. Fails (not skips) when ``.venv-label-studio`` is missing:
    `make test-deps` (part of `make test`, so CI) creates it."""
    import signal
    import subprocess

    from core.labeling_auth import LabelStudioCredentials
    from ops import labelstudio_service as ls

    # Not a skip: the review loop is part of the product, and `make test` creates this.
    assert ls.executable().exists(), f"{ls.executable()} is missing: run `make label-studio` (make test-deps does)"
    base = tmp_path_factory.mktemp("label-studio")
    creds = LabelStudioCredentials.load_or_create(base / "credentials.json")
    port = _free_port()
    log = (base / "server.log").open("w")
    proc = subprocess.Popen(ls.command("127.0.0.1", port, base / "data"), env=ls.environment(creds, base / "data"),
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    # 300 s: the first start migrates a new database.
    _wait_healthy("label studio", f"{url}/health", proc, 300, base / "server.log",
                  lambda: os.killpg(proc.pid, signal.SIGKILL))
    yield url, creds
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)


EXPORT_CLASSES = ["age_limit", "apple_pay_or_google_pay", "card_arrival", "exchange_rate", "top_up_failed",
                  "lost_or_stolen_card", "pin_blocked", "cash_withdrawal_charge"]


@pytest.fixture(scope="session")
def trained(tmp_path_factory, project_env) -> dict:
    """A small encoder trained on 8 Banking77 classes (a real training.train process)."""
    from test_training import make_curated, run, write_config

    root = tmp_path_factory.mktemp("export-model")
    # 8 classes x 40 test rows: one flipped row moves accuracy 0.31 points, finer than the gate.
    curated, labels = make_curated(root / "data", n_train=60, n_test=40, classes=EXPORT_CLASSES)
    cfg = write_config(root / "cfg.json", epochs=6, batch_size=16, lr=2e-3, max_length=64)
    out = root / "out"
    env = {k: v for k, v in project_env.items() if not k.startswith("MLFLOW_")}
    res = run([sys.executable, "-m", "training.train", "--curated", str(curated), "--labels",
               str(labels), "--out", str(out), "--config", str(cfg)], env)
    assert res.returncode == 0, res.stderr[-4000:]
    # The serving contract, as the train stage attaches it (120 in-scope val rows: enough
    # for a threshold at a lowered minimum).
    from contract import preprocess
    from core.config import OosConfig
    from training import contract
    from training.data import load_curated

    splits = load_curated(curated, [c for c in EXPORT_CLASSES])
    figures = contract.attach(out / "model", splits, OosConfig(min_calibration_rows=100),
                              preprocess.spec("placeholder", None))
    assert figures["reject_threshold"] is not None, figures["reject_note"]
    test = pd.read_parquet(curated).query("split == 'test'")
    return {"model_dir": out / "model", "texts": test.text.tolist(), "ids": test.record_id.tolist(),
            "labels": test.label.str.lower().str.replace(" ", "_").tolist()}


@pytest.fixture(scope="session")
def exported(trained, tmp_path_factory) -> dict:
    """fp32 and int8 builds of the ``trained`` model (one candidate), with the report."""
    from core.config import ExportConfig
    from export import build

    out = tmp_path_factory.mktemp("exported")
    rep = build.build_all(trained["model_dir"], trained["texts"], trained["labels"], trained["ids"],
                          ExportConfig(fusions=["none"], per_channel=[True], reduce_range=[False],
                                       latency_samples=10, throughput_batches=2, candidate_batches=2),
                          out)
    assert rep["int8"]["status"] == "passed", rep["int8"]["reason"]
    return {"out": out, "report": rep}
