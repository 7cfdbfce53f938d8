"""The prediction log and feedback (issue 25), with real server and router processes and real
HTTP: predictions get ids, the log holds masked text only, feedback round-trips into the
live-accuracy metric, bad feedback is refused, retention bounds the log, and sampling 0
logs nothing."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from conftest import ROOT, _free_port

from deploy import predlog
from deploy.server import key_actor

CLIENT, INTERNAL, OPERATOR, ROUTER_CLIENT = "pl-client-key", "pl-internal-key", "pl-operator-key", "pl-router-client"
H = {"Authorization": f"Bearer {CLIENT}"}
OP = {"Authorization": f"Bearer {OPERATOR}"}
RH = {"Authorization": f"Bearer {ROUTER_CLIENT}"}
# A person's name and an email: the log must hold their placeholders, never them.
PERSONAL = "hi i am John Smith, mail john.smith@example.com, my card has not arrived"


def _wait(url: str, proc: subprocess.Popen) -> None:
    for _ in range(600):
        if proc.poll() is not None:
            raise AssertionError(proc.stdout.read() if proc.stdout else f"exited {proc.returncode}")
        try:
            if httpx.get(f"{url}/health/ready", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} never ready")


def _server(build: Path, env: dict[str, str], *extra: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "deploy.server", "--build", str(build), "--port", str(port),
                             "--max-delay-ms", "2", *extra],
                            env=dict(env, INTENTOPS_API_KEYS=f"{CLIENT},{INTERNAL}",
                                     INTENTOPS_OPERATOR_KEYS=OPERATOR), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    _wait(url, proc)
    return proc, url


def _stop(*procs: subprocess.Popen) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


def _rows(db: Path, n: int, timeout: float = 10.0) -> list[dict]:
    """The log's rows once it holds at least ``n`` (the writer thread commits shortly after
    the answer)."""
    deadline = time.time() + timeout
    while True:
        rows = predlog.recent(db) if db.exists() else []
        if len(rows) >= n or time.time() > deadline:
            return rows
        time.sleep(0.05)


def _metric(url: str, name: str, labels: str) -> float | None:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    m = re.search(rf"^{re.escape(name)}\{{{re.escape(labels)}\}} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


@pytest.fixture(scope="module")
def served(exported, project_env, tmp_path_factory):
    """One server logging to a fresh database, and a router in front of it."""
    db = tmp_path_factory.mktemp("predlog") / "predictions" / "predictions.db"
    build = exported["out"] / "int8"
    proc, url = _server(build, project_env, "--prediction-log", str(db), "--variant", "stable")
    rport = _free_port()
    rproc = subprocess.Popen([sys.executable, "-m", "deploy.router", "--stable", url, "--port", str(rport),
                              "--health-interval", "0.3"],
                             env=dict(project_env, INTENTOPS_API_KEYS=ROUTER_CLIENT, INTENTOPS_UPSTREAM_KEY=INTERNAL,
                                      INTENTOPS_ADMIN_KEYS="pl-router-admin"), cwd=ROOT,
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    router = f"http://127.0.0.1:{rport}"
    _wait(router, rproc)
    yield {"url": url, "router": router, "db": db, "build": build}
    _stop(rproc, proc)


def test_predictions_are_logged_with_masked_text_only(served):
    url, db = served["url"], served["db"]
    texts = [PERSONAL, "how do I top up by bank transfer", "the atm kept my card"]
    r = httpx.post(f"{url}/v1/predict", json={"texts": texts}, headers=H, timeout=30)
    assert r.status_code == 200, r.text
    body = r.json()
    ids = [p["prediction_id"] for p in body["predictions"]]
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids) and len(set(ids)) == 3
    rows = {row["id"]: row for row in _rows(db, 3) if row["id"] in ids}
    assert set(rows) == set(ids)
    for pid, p in zip(ids, body["predictions"], strict=True):
        row = rows[pid]
        assert (row["label"], row["oos"], row["version"], row["variant"]) == (
            p["label"], p["oos"], body["model_version"], "stable")
        assert row["score"] == pytest.approx(p["score"]) and row["latency_ms"] > 0
        assert abs(row["ts"] - time.time()) < 60
    personal = rows[ids[0]]["text"]
    assert "<PERSON>" in personal and "<EMAIL>" in personal, personal
    assert "John" not in personal and "Smith" not in personal and "example.com" not in personal
    # Nowhere in the file either (not even in a page of an earlier version of a row).
    raw = b"".join(f.read_bytes() for f in db.parent.iterdir() if f.name.startswith("predictions.db"))
    assert b"john.smith" not in raw.lower() and b"Smith" not in raw


def test_feedback_round_trip_updates_live_accuracy(served):
    url, db = served["url"], served["db"]
    r = httpx.post(f"{url}/v1/predict", json={"texts": ["my card has not arrived yet", "I want to close my account"]},
                   headers=H, timeout=30)
    assert r.status_code == 200, r.text
    version = r.json()["model_version"]
    (a, b) = r.json()["predictions"]
    labels = json.loads((served["build"] / "labels.json").read_text())  # the build's label set
    before_c = _metric(url, "intentops_feedback_total", 'outcome="correct"') or 0.0
    before_w = _metric(url, "intentops_feedback_total", 'outcome="wrong"') or 0.0
    # Right (client key), then wrong (operator key): sent at once, before the log may hold them.
    ok = httpx.post(f"{url}/v1/feedback", json={"prediction_id": a["prediction_id"], "label": a["label"]},
                    headers=H, timeout=10)
    assert ok.status_code == 200, ok.text
    assert ok.json()["correct"] is True and ok.json()["model_version"] == version
    other = next(lb for lb in labels if lb != b["label"])
    bad = httpx.post(f"{url}/v1/feedback", json={"prediction_id": b["prediction_id"], "label": other},
                     headers=OP, timeout=10)
    assert bad.status_code == 200 and bad.json()["correct"] is False, bad.text
    assert _metric(url, "intentops_feedback_total", 'outcome="correct"') == before_c + 1
    assert _metric(url, "intentops_feedback_total", 'outcome="wrong"') == before_w + 1
    fb = {f["prediction_id"]: f for f in predlog.feedback(db)}
    assert fb[a["prediction_id"]]["label"] == a["label"] and fb[a["prediction_id"]]["correct"] is True
    assert fb[a["prediction_id"]]["actor"] == key_actor(CLIENT)
    assert fb[b["prediction_id"]]["actor"] == key_actor(OPERATOR) and fb[b["prediction_id"]]["correct"] is False
    # The gauge is the accuracy over every feedback in the log for the version.
    n = len([f for f in fb.values() if f["version"] == version])
    right = len([f for f in fb.values() if f["version"] == version and f["correct"]])
    assert _metric(url, "intentops_live_accuracy", f'model_version="{version}"') == pytest.approx(right / n)
    assert _metric(url, "intentops_live_feedback", f'model_version="{version}"') == n
    # A later feedback replaces the earlier one: b corrected to its predicted label.
    again = httpx.post(f"{url}/v1/feedback", json={"prediction_id": b["prediction_id"], "label": b["label"]},
                       headers=H, timeout=10)
    assert again.status_code == 200 and again.json()["correct"] is True
    assert _metric(url, "intentops_live_accuracy", f'model_version="{version}"') == pytest.approx((right + 1) / n)


def test_bad_feedback_is_refused_without_echo(served):
    url, db = served["url"], served["db"]
    p = httpx.post(f"{url}/v1/predict", json={"text": "my pin is blocked"}, headers=H, timeout=30).json()
    pid = p["predictions"][0]["prediction_id"]
    unknown = httpx.post(f"{url}/v1/feedback", json={"prediction_id": "0" * 32, "label": p["predictions"][0]["label"]},
                         headers=H, timeout=10)
    assert unknown.status_code == 404 and "unknown prediction id" in unknown.text
    malformed = httpx.post(f"{url}/v1/feedback", json={"prediction_id": "not an id",
                                                       "label": p["predictions"][0]["label"]}, headers=H)
    assert malformed.status_code == 404
    # A label outside the label set (here: personal data) is 422, and never echoed or logged.
    free = httpx.post(f"{url}/v1/feedback", json={"prediction_id": pid, "label": "John Smith 07700 900123"},
                      headers=H, timeout=10)
    assert free.status_code == 422 and "Smith" not in free.text and "07700" not in free.text
    assert pid not in {f["prediction_id"] for f in predlog.feedback(db)}
    extra = httpx.post(f"{url}/v1/feedback", json={"prediction_id": pid, "label": p["predictions"][0]["label"],
                                                   "note": "John Smith"}, headers=H)
    assert extra.status_code == 422 and "Smith" not in extra.text
    assert httpx.post(f"{url}/v1/feedback", json={"prediction_id": pid, "label": "x"}).status_code == 401
    assert httpx.post(f"{url}/v1/feedback", json={"prediction_id": pid, "label": "x"},
                      headers={"X-API-Key": "wrong"}).status_code == 401
    raw = b"".join(f.read_bytes() for f in db.parent.iterdir() if f.name.startswith("predictions.db"))
    assert b"Smith" not in raw and b"07700" not in raw


def test_feedback_through_the_router(served):
    router, db = served["router"], served["db"]
    r = httpx.post(f"{router}/v1/predict", json={"text": PERSONAL}, headers=RH, timeout=30)
    assert r.status_code == 200 and r.headers["x-variant"] == "stable", r.text
    p = r.json()["predictions"][0]
    ok = httpx.post(f"{router}/v1/feedback", json={"prediction_id": p["prediction_id"], "label": p["label"]},
                    headers=RH, timeout=10)
    assert ok.status_code == 200 and ok.json()["correct"] is True, ok.text
    fb = {f["prediction_id"]: f for f in predlog.feedback(db)}
    # Who: the router's client by key fingerprint, via the router's upstream key.
    assert fb[p["prediction_id"]]["actor"] == f"{key_actor(ROUTER_CLIENT)} via {key_actor(INTERNAL)}"
    assert "<PERSON>" in fb[p["prediction_id"]]["text"]
    # The router's operator key may send feedback too.
    op = httpx.post(f"{router}/v1/feedback", json={"prediction_id": p["prediction_id"], "label": p["label"]},
                    headers={"Authorization": "Bearer pl-router-admin"}, timeout=10)
    assert op.status_code == 200, op.text
    assert httpx.post(f"{router}/v1/feedback", json={"prediction_id": "f" * 32, "label": p["label"]},
                      headers=RH, timeout=10).status_code == 404
    assert httpx.post(f"{router}/v1/feedback", json={"prediction_id": p["prediction_id"], "label": "nope"},
                      headers=RH, timeout=10).status_code == 422
    assert httpx.post(f"{router}/v1/feedback", json={"prediction_id": p["prediction_id"], "label": p["label"]},
                      headers={"Authorization": "Bearer wrong"}).status_code == 401


def test_sampling_zero_logs_nothing_and_no_log_means_no_ids(exported, project_env, tmp_path):
    db = tmp_path / "predictions.db"
    build = exported["out"] / "int8"
    proc, url = _server(build, project_env, "--prediction-log", str(db), "--prediction-log-sample", "0")
    try:
        for _ in range(5):
            r = httpx.post(f"{url}/v1/predict", json={"texts": ["my card has not arrived", PERSONAL]}, headers=H,
                           timeout=30)
            assert r.status_code == 200 and all(p["prediction_id"] is None for p in r.json()["predictions"])
        label = r.json()["predictions"][0]["label"] or "x"
        assert httpx.post(f"{url}/v1/feedback", json={"prediction_id": "a" * 32, "label": label},
                          headers=H, timeout=10).status_code == 404
    finally:
        _stop(proc)
    assert predlog.recent(db) == []  # the database exists (the server made it) and is empty
    proc, url = _server(build, project_env)  # no --prediction-log at all
    try:
        r = httpx.post(f"{url}/v1/predict", json={"text": "my card has not arrived"}, headers=H, timeout=30)
        assert r.status_code == 200 and r.json()["predictions"][0]["prediction_id"] is None
        assert httpx.post(f"{url}/v1/feedback", json={"prediction_id": "a" * 32, "label": "x"},
                          headers=H).status_code == 404
    finally:
        _stop(proc)


def test_retention_deletes_old_rows_and_beyond_the_row_limit(tmp_path):
    db = tmp_path / "predictions.db"
    writer = predlog.Writer(db)
    now = time.time()
    old = [(f"{i:032x}", now - 40 * 86400, "<PERSON> old", "card_arrival", 0.9, 0, 0, "1", 3.0, "stable")
           for i in range(5)]
    new = [(f"{i + 100:032x}", now - (10 - i), "my card", "card_arrival", 0.9, 0, 0, "2", 3.0, "canary")
           for i in range(10)]
    assert writer.put(old) and writer.put(new) and writer.flush()
    writer.close()
    con = predlog.connect(db)
    predlog.record_feedback(con, old[0][0], "card_arrival", "card_arrival", "1", "key:000000000000")
    predlog.record_feedback(con, new[-1][0], "card_arrival", "card_arrival", "2", "key:000000000000")
    predlog.record_feedback(con, new[0][0], "card_arrival", "card_arrival", "2", "key:000000000000")
    assert predlog.retain(con, days=30, max_rows=1_000) == 5  # the 40-day-old ones
    assert [r["id"] for r in predlog.recent(db)] == [r[0] for r in new]
    assert predlog.retain(con, days=30, max_rows=3) == 7  # only the newest 3 stay
    assert [r["id"] for r in predlog.recent(db)] == [r[0] for r in new[-3:]]
    assert [f["prediction_id"] for f in predlog.feedback(db)] == [new[-1][0]]  # feedback of deleted rows goes
    assert predlog.accuracy(con) == {"2": (1, 1)}
    assert predlog.retain(con, days=30, max_rows=3) == 0
    assert predlog.recent(db, since=now - 2) == [r for r in predlog.recent(db) if r["ts"] >= now - 2]
    con.close()


def test_the_deployment_passes_the_shared_log_to_every_server(tmp_path):
    from core.config import load_config
    from deploy.deployment import Deployment

    cfg = load_config(overrides={"lake_root": str(tmp_path / "lake"), "deploy.root": str(tmp_path / "deploy"),
                                 "deploy.prediction_log_sample": 0.25, "deploy.prediction_log_days": 7})
    args = Deployment(cfg).prediction_log_args()
    assert args[args.index("--prediction-log") + 1] == str(cfg.lake / "predictions" / "predictions.db")
    assert args[args.index("--prediction-log-sample") + 1] == "0.25"
    assert args[args.index("--prediction-log-days") + 1] == "7.0"
    off = load_config(overrides={"lake_root": str(tmp_path / "lake"), "deploy.root": str(tmp_path / "deploy"),
                                 "deploy.prediction_log": False})
    assert Deployment(off).prediction_log_args() == []
