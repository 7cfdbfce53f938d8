"""Drift monitoring: the detector on Banking77 streams (held-back intents vs an unshifted
stream), too little traffic, what an asset-triggered run reads ("no new data"), and the
monitoring DAG's asset events under a real `airflow dags test`.

Data: the reference is Banking77's train split without the held-back intents (as the
champion's curated training set would be); the windows are drawn from its test split, so
no message of a window is in the reference."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import time
import uuid
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from conftest import ROOT

from core.config import load_config
from deploy import predlog

HELD_BACK = ["card_arrival", "lost_or_stolen_card", "exchange_rate", "top_up_failed", "pin_blocked",
             "apple_pay_or_google_pay", "cash_withdrawal_charge", "age_limit", "beneficiary_not_allowed",
             "country_support"]
END = 1_790_000_000.0  # the window's end (Unix time): fixed, so the checks are reproducible


def _banking77() -> tuple[pd.DataFrame, pd.DataFrame]:
    train = pd.read_csv(ROOT / "data" / "banking77" / "train.csv").rename(columns={"category": "label"})
    test = pd.read_csv(ROOT / "data" / "banking77" / "test.csv").rename(columns={"category": "label"})
    assert not set(train.text) & set(test.text)
    return train, test


def reference_frame() -> pd.DataFrame:
    train, _ = _banking77()
    ref = train[~train.label.isin(HELD_BACK)].copy()
    ref["split"] = "train"
    return ref


def stream(n: int, shift: float, seed: int, exclude: set[str] = frozenset()) -> pd.DataFrame:
    """``n`` test messages: a share ``shift`` from the held-back intents, the rest from the
    reference's intents in the reference's proportions (an unshifted mix)."""
    train, test = _banking77()
    rng = np.random.default_rng(seed)
    test = test[~test.text.isin(exclude)]
    kept = test[~test.label.isin(HELD_BACK)]
    share = train[~train.label.isin(HELD_BACK)].label.value_counts(normalize=True)
    w = kept.label.map(share / kept.label.value_counts()).to_numpy()
    n_new = int(round(n * shift))
    parts = [kept.iloc[rng.choice(len(kept), n - n_new, replace=False, p=w / w.sum())]]
    if n_new:
        new = test[test.label.isin(HELD_BACK)]
        parts.append(new.iloc[rng.choice(len(new), n_new, replace=False)])
    return pd.concat(parts).sample(frac=1.0, random_state=seed)


def write_log(db: Path, rows: pd.DataFrame, start: float, end: float, seed: int, version: str = "1",
              labels: list[str] | None = None) -> list[str]:
    """Prediction-log rows as the model server writes them. The label is the true intent for
    the reference's intents; a held-back intent's message gets one of the model's labels at
    random (the model has no label for it), so only the embeddings can tell them apart."""
    rng = np.random.default_rng(seed)
    known = sorted(set(labels or reference_frame().label))
    con = predlog.connect(db)
    ids, out = [], []
    ts = np.sort(rng.uniform(start, end, len(rows)))
    for t, (text, label) in zip(ts, rows[["text", "label"]].itertuples(index=False), strict=True):
        pid = uuid.uuid4().hex
        ids.append(pid)
        lab = label if label in known else known[rng.integers(len(known))]
        out.append((pid, float(t), text, lab, float(rng.beta(8, 2)), 0, 0, version, 5.0, "stable"))
    with predlog.transaction(con):
        con.executemany(f"INSERT INTO predictions ({', '.join(predlog.COLUMNS)}) VALUES "
                        f"({', '.join('?' * len(predlog.COLUMNS))})", out)
    con.close()
    return ids


@pytest.fixture(scope="module")
def tracking(tmp_path_factory):
    """Each check logs to MLflow: a local store of the module (the one `make demo` uses by
    default), never one in the checkout. The DAG test below uses the session's server."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MLFLOW_TRACKING_URI", uri)
        yield uri


def _cfg(tmp_path: Path, **over):
    return load_config(overrides={"lake_root": str(tmp_path / "lake"), "monitoring.embedding_sample": 500, **over})


@pytest.fixture(scope="module")
def reference():
    return reference_frame(), "Banking77 train without the held-back intents"


@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    """One lake for the detector's checks: the reference's embeddings are computed once
    (the check caches them by content); each check starts from an empty prediction log."""
    return tmp_path_factory.mktemp("drift")


def _check(shared, reference, shift: float, seed: int):
    import shutil

    from ops import monitor

    cfg = _cfg(shared)
    shutil.rmtree(cfg.lake / "predictions", ignore_errors=True)
    db = monitor.log_path(cfg)
    base = stream(500, 0.0, seed + 100)  # the same version's earlier traffic: the baseline
    write_log(db, base, END - 3 * 3600, END - 3600, seed + 100)
    write_log(db, stream(500, shift, seed, exclude=set(base.text)), END - 3600, END, seed)
    return monitor.check(cfg, end=END, check_id=f"s{shift}", reference=reference)


def test_the_detector_fires_on_a_stream_from_held_back_intents(shared, reference, tracking):
    r = _check(shared, reference, 0.3, seed=1)
    assert r["status"] == "drift" and r["drift"], r
    emb = next(t for t in r["tests"] if t["test"] == "embedding_novelty")
    assert emb["shifted"] and emb["excess"] >= 0.03 and emb["p_value"] < 2.5e-4, emb
    assert any(reason.startswith("embedding_novelty") for reason in r["reasons"])
    sample = json.loads(Path(r["sample"]).read_text())
    assert len(sample["prediction_ids"]) == 500 and sample["window"] == [END - 3600, END]
    saved = json.loads(Path(r["path"]).read_text())
    assert saved["status"] == "drift" and "text" not in json.dumps(saved["tests"])


def test_the_detector_stays_quiet_on_an_unshifted_stream(shared, reference, tracking):
    r = _check(shared, reference, 0.0, seed=2)
    assert r["status"] == "no_drift" and not r["drift"], r["reasons"]
    by = {t["test"]: t for t in r["tests"]}
    assert by["embedding_novelty"]["p_value"] > 0.01
    assert by["label_chi2"]["tvd"] < 0.15
    assert by["confidence_ks"]["ks"] is not None and by["oos_rate"]["change"] is not None  # the baseline was used
    assert by["live_accuracy"]["note"].startswith("0 feedback rows")


def test_too_little_traffic_is_said_not_alarmed(tmp_path, reference, tracking):
    from ops import monitor

    cfg = _cfg(tmp_path)
    write_log(monitor.log_path(cfg), stream(60, 1.0, 3), END - 3600, END, 3)  # all of it shifted
    r = monitor.check(cfg, end=END, check_id="few", reference=reference)
    assert r["status"] == "too_little_traffic" and not r["drift"] and r["tests"] == []
    assert "60 predictions in the window, 200 needed" in r["note"]


def test_no_log_and_no_champion_are_reported_not_raised(tmp_path, tracking):
    from ops import monitor

    cfg = _cfg(tmp_path, dataset="nochampion")
    assert monitor.check(cfg, end=END, check_id="a")["status"] == "no_log"
    write_log(monitor.log_path(cfg), stream(300, 0.0, 4), END - 3600, END, 4)
    r = monitor.check(cfg, end=END, check_id="b")
    assert r["status"] == "no_reference" and "intentops-nochampion has no champion" in r["note"], r
    assert r["mlflow_run_id"]  # the check is in MLflow all the same


def test_new_labels_and_review_traffic_count_since_their_last_event(tmp_path):
    from ops import monitor

    cfg = _cfg(tmp_path, **{"monitoring.min_new_labels": 5, "monitoring.min_review_rows": 3})
    db = monitor.log_path(cfg)
    ids = write_log(db, stream(20, 0.0, 5), END - 600, END - 300, 5)
    con = predlog.connect(db)
    con.execute("UPDATE predictions SET oos = 1 WHERE id IN (?, ?, ?, ?)", ids[:4])
    for pid in ids[4:10]:
        predlog.record_feedback(con, pid, "card_linking", None, "1", "test", now=END - 100)
    p = monitor.pending(cfg, con, END)
    assert p["new_labels"] == {"count": 6, "since": 0.0, "enough": True, "needed": 5}
    assert p["review"]["count"] == 4 and p["review"]["enough"]
    monitor.mark_emitted(cfg, "new_labels", END)
    monitor.mark_emitted(cfg, "review", END)
    p = monitor.pending(cfg, con, END + 60)
    assert p["new_labels"]["count"] == 0 and not p["new_labels"]["enough"]
    assert p["review"]["count"] == 0
    con.close()


@pytest.mark.parametrize(("kind", "bad"), [("min_predictions", 5), ("alpha", 0.0), ("min_novel_excess", 0),
                                            ("window_hours", 0)])
def test_invalid_monitoring_settings_fail_early(kind, bad):
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=kind):
        load_config(overrides={f"monitoring.{kind}": bad})


# -- what an asset-triggered run reads --------------------------------------------------


def _published_clean(lake: Path, inputs: dict) -> None:
    from core.stage import MANIFEST

    out = lake / "clean" / uuid.uuid4().hex[:8]
    out.mkdir(parents=True)
    (out / MANIFEST).write_text(json.dumps({"inputs": {"raw": inputs}}))


TRIGGER = [{"asset": "intentops_drift_detected", "extra": {"reasons": ["embedding_novelty excess 0.21"],
                                                           "check": "scheduled__x"}}]


def test_an_asset_triggered_run_reads_the_latest_export_or_ends_with_no_new_data(tmp_path, monkeypatch):
    from core import runs
    from core.stage import file_fingerprint, run_dir
    from ops import triggers

    export = tmp_path / "export.csv"
    export.write_text("ticket_id,message,intent\n1,where is my card,card_arrival\n")
    monkeypatch.setenv("INTENTOPS__LAKE_ROOT", str(tmp_path / "lake"))
    monkeypatch.setenv("INTENTOPS__INPUT__PATH", str(export))
    lake = tmp_path / "lake" / "banking77"

    path, note = triggers.resolve_triggered_run("asset_triggered__1", {}, TRIGGER)  # never read
    assert "started by intentops_drift_detected (embedding_novelty excess 0.21) from check scheduled__x" in note
    assert json.loads((run_dir(lake, "asset_triggered__1") / runs.TRIGGER_FILE).read_text()) == TRIGGER

    _published_clean(lake, file_fingerprint(export) | {"format": "csv"})  # a run read this export
    with pytest.raises(runs.NoNewData, match="nothing new to train on"):
        triggers.resolve_triggered_run("asset_triggered__2", {}, TRIGGER)
    summary = json.loads((run_dir(lake, "asset_triggered__2") / "summary.json").read_text())
    assert summary["status"] == "no_new_data" and summary["stages"] == []
    assert runs.latest_summary(lake).splitlines()[1] == "NO NEW DATA: no stage ran and no model was trained"
    from ops import report

    page = report.publish_no_new_data(load_config(), "asset_triggered__2").read_text()
    assert "NO NEW DATA</b>: no stage ran and no model was trained" in page
    assert "started by intentops_drift_detected" in page
    assert report.publish_no_new_data(load_config(), "asset_triggered__1") is None  # it did read new data

    export.write_text(export.read_text() + "2,my card is lost,lost_or_stolen_card\n")  # new rows arrive
    _, note = triggers.resolve_triggered_run("asset_triggered__3", {}, TRIGGER)
    assert "new export.csv" in note


def test_a_partitioned_export_is_new_when_a_day_was_never_read(tmp_path, monkeypatch):
    from core.stage import file_fingerprint
    from ops import triggers

    daily = tmp_path / "daily"
    for day in ("2026-11-02", "2026-11-03"):
        (daily / f"date={day}").mkdir(parents=True)
        (daily / f"date={day}" / "raw.csv").write_text(f"ticket_id,message,intent\n{day},hi,greeting\n")
    cfg = load_config(overrides={"lake_root": str(tmp_path / "lake"), "input.path": str(daily)})
    _published_clean(cfg.lake, {"format": "csv", "partitions": {
        "date=2026-11-02": file_fingerprint(daily / "date=2026-11-02")}})
    assert triggers.unread_input(cfg) == ["date=2026-11-03"]
    _published_clean(cfg.lake, {"format": "csv", "partitions": {
        "date=2026-11-03": file_fingerprint(daily / "date=2026-11-03")}})
    assert triggers.unread_input(cfg) == []


# -- the monitoring DAG under `airflow dags test` ------------------------------------------


def test_monitoring_dag_emits_its_asset_events_under_airflow_dags_test(tmp_path, project_env, mlflow_server):
    """A window of shifted traffic with enough feedback: `airflow dags test` runs the check
    and emits the drift and new-labels events (their extra holds the figures and the
    sample), and not the review event; the check is in MLflow."""
    from ops import monitor

    logical = "2026-12-01T10:00:00+00:00"
    end = 1_796_119_200.0  # that time: an hourly (cron trigger) run's data interval ends at its logical date
    ref = reference_frame()
    curated = tmp_path / "curated"
    curated.mkdir()
    ref[["text", "label", "split"]].to_parquet(curated / "part-0.parquet")
    env = dict(project_env)
    env.update(AIRFLOW_HOME=str(tmp_path / "airflow"), AIRFLOW__CORE__DAGS_FOLDER=str(ROOT / "dags"),
               AIRFLOW__CORE__LOAD_EXAMPLES="False", MLFLOW_TRACKING_URI=mlflow_server,
               INTENTOPS__LAKE_ROOT=str(tmp_path / "lake"), INTENTOPS__MONITORING__REFERENCE_PATH=str(curated),
               INTENTOPS__MONITORING__EMBEDDING_SAMPLE="400",
               INTENTOPS__MONITORING__REFERENCE_SAMPLE="1200", INTENTOPS__MONITORING__MIN_NEW_LABELS="20")
    cfg = load_config(env=env)
    db = monitor.log_path(cfg)
    ids = write_log(db, stream(400, 0.5, 7), end - 1800, end - 1, 7)
    con = predlog.connect(db)
    for pid in ids[:25]:
        predlog.record_feedback(con, pid, "card_linking", None, "1", "test", now=end - 60)
    con.close()
    subprocess.run(["airflow", "db", "migrate"], env=env, cwd=ROOT, check=True, timeout=600, capture_output=True)
    out = subprocess.run(["airflow", "dags", "test", "intentops_monitoring", logical], env=env, cwd=ROOT,
                         capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, (out.stdout + out.stderr)[-6000:]

    db_af = sqlite3.connect(tmp_path / "airflow" / "airflow.db")
    events = {name: json.loads(extra) for name, extra in db_af.execute(
        "SELECT a.name, e.extra FROM asset_event e JOIN asset a ON a.id = e.asset_id")}
    states = dict(db_af.execute("SELECT task_id, state FROM task_instance WHERE dag_id = 'intentops_monitoring'"))
    db_af.close()
    assert set(events) == {"intentops_drift_detected", "intentops_new_labels"}, (events, states)
    assert states["emit_review"] == "skipped" and states["emit_drift"] == "success"
    drift = events["intentops_drift_detected"]
    assert drift["figures"]["drift"] == 1.0 and drift["figures"]["embedding_novelty_excess"] >= 0.03
    assert drift["window"]["end"] == end and drift["window"]["predictions"] == 400
    sample = json.loads(Path(drift["sample"]).read_text())
    assert set(sample["prediction_ids"]) <= set(ids)
    assert events["intentops_new_labels"]["feedback_labels"] == 25

    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=mlflow_server)
    exp = client.get_experiment_by_name("intentops-banking77-monitoring")
    runs = client.search_runs([exp.experiment_id], filter_string="tags.`intentops.monitoring.status` = 'drift'")
    assert runs and runs[0].data.metrics["embedding_novelty_excess"] >= 0.03

    # The new-labels event was emitted for these labels: the next check does not repeat it.
    again = monitor.pending(cfg, predlog.open_log(db), time.time())
    assert again["new_labels"]["count"] == 0
