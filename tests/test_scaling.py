"""Serving that scales, with real processes: replica pools behind the router, a replica
killed under load, the response cache, and the autoscaler growing and shrinking the
stable variant through the deployment."""

from __future__ import annotations

import concurrent.futures as cf
import json
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
from conftest import ROOT, _free_port

CLIENT, INTERNAL, OPERATOR, ADMIN = "client-key", "internal-key", "operator-key", "router-admin-key"
H = {"Authorization": f"Bearer {CLIENT}"}
A = {"Authorization": f"Bearer {ADMIN}"}
TEXTS = ["my card has not arrived yet", "how do I top up by bank transfer", "the atm kept my card",
         "why was I charged a fee for the exchange", "I want to close my account", "my pin is blocked"]


@pytest.fixture(scope="module")
def store(exported, tmp_path_factory) -> Path:
    """The tiny model's int8 build twice, as versions 1 and 2, in a build store."""
    root = tmp_path_factory.mktemp("scaling-store")
    for v in ("1", "2"):
        dst = root / f"v{v}"
        shutil.copytree(exported["out"] / "int8", dst)
        pre = json.loads((dst / "preprocessing.json").read_text())
        (dst / "preprocessing.json").write_text(json.dumps({**pre, "model_version": v}))
    return root


def _wait(url: str, proc: subprocess.Popen, path: str = "/health/ready") -> None:
    for _ in range(600):
        if proc.poll() is not None:
            raise AssertionError(proc.stdout.read() if proc.stdout else f"exited {proc.returncode}")
        try:
            if httpx.get(f"{url}{path}", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"{url} never ready")


def server(store: Path, env: dict[str, str], version: str = "1", port: int | None = None, *extra: str):
    port = port or _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "deploy.server", "--build", str(store / f"v{version}"),
                             "--build-store", str(store), "--port", str(port), "--max-delay-ms", "2", *extra],
                            env=dict(env, INTENTOPS_API_KEYS=INTERNAL, INTENTOPS_OPERATOR_KEYS=OPERATOR), cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    _wait(url, proc)
    return proc, url


def router(env: dict[str, str], stable: list[str], *extra: str):
    port = _free_port()
    args = [a for u in stable for a in ("--stable", u)]
    proc = subprocess.Popen([sys.executable, "-m", "deploy.router", *args, "--port", str(port),
                             "--health-interval", "0.3", *extra],
                            env=dict(env, INTENTOPS_API_KEYS=CLIENT, INTENTOPS_UPSTREAM_KEY=INTERNAL,
                                     INTENTOPS_ADMIN_KEYS=ADMIN), cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    url = f"http://127.0.0.1:{port}"
    _wait(url, proc)
    return proc, url


def stop(*procs: subprocess.Popen) -> None:
    for p in procs:
        if p.poll() is None:
            p.terminate()
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()


class Load:
    """Closed-loop clients in threads until stopped; every answer's status is kept."""

    def __init__(self, url: str, clients: int, headers: dict[str, str] | None = None) -> None:
        self.url, self.statuses, self.go = url, [], True
        self.headers = headers or H
        self.threads = [threading.Thread(target=self._client, args=(i,)) for i in range(clients)]
        for t in self.threads:
            t.start()

    def _client(self, i: int) -> None:
        with httpx.Client(timeout=30) as c:
            n = 0
            while self.go:
                try:
                    r = c.post(f"{self.url}/v1/predict", json={"text": f"{TEXTS[n % len(TEXTS)]} {i}-{n}"},
                               headers=self.headers)
                    self.statuses.append(r.status_code)
                except httpx.HTTPError as exc:
                    self.statuses.append(type(exc).__name__)
                n += 1

    def stop(self) -> list:
        self.go = False
        for t in self.threads:
            t.join(timeout=60)
        return self.statuses


def pools(url: str) -> dict:
    return httpx.get(f"{url}/admin/pools", headers=A, timeout=5).json()


def test_two_replicas_share_load_and_a_killed_one_costs_no_request(store, project_env):
    (p1, s1), (p2, s2) = server(store, project_env), server(store, project_env)
    rp, url = router(project_env, [s1, s2])
    try:
        with cf.ThreadPoolExecutor(8) as pool:
            got = list(pool.map(lambda i: httpx.post(f"{url}/v1/predict", json={"text": f"{TEXTS[i % 6]} {i}"},
                                                     headers=H, timeout=30).status_code, range(160)))
        assert set(got) == {200}
        served = {r["url"]: r["served"] for r in pools(url)["stable"]}
        assert all(n >= 20 for n in served.values()), served  # both replicas took a share

        load = Load(url, 8)
        time.sleep(1.5)
        p2.send_signal(signal.SIGKILL)  # mid-load, requests in flight on it
        time.sleep(3)
        statuses = load.stop()
        assert len(statuses) > 50 and set(statuses) == {200}, {s: statuses.count(s) for s in set(statuses)}
        view = {r["url"]: r for r in pools(url)["stable"]}
        assert not view[s2]["healthy"] or view[s2]["ejected"]

        # The replica comes back on its port: the health check re-admits it.
        p2, _ = server(store, project_env, port=int(s2.rsplit(":", 1)[1]))
        deadline = time.time() + 20
        while time.time() < deadline and not {r["url"]: r for r in pools(url)["stable"]}[s2]["healthy"]:
            time.sleep(0.2)
        before = {r["url"]: r["served"] for r in pools(url)["stable"]}[s2]
        for i in range(40):
            assert httpx.post(f"{url}/v1/predict", json={"text": TEXTS[i % 6]}, headers=H).status_code == 200
        assert {r["url"]: r["served"] for r in pools(url)["stable"]}[s2] > before
        metrics = httpx.get(f"{url}/metrics").text
        assert 'intentops_router_replicas{state="usable",variant="stable"} 2.0' in metrics

        # Every replica of the only variant down: a fast 503 with Retry-After, not a hang.
        for p in (p1, p2):
            p.send_signal(signal.SIGKILL)
            p.wait()
        codes = [httpx.post(f"{url}/v1/predict", json={"text": "hi"}, headers=H, timeout=30) for _ in range(3)]
        assert codes[-1].status_code == 503 and codes[-1].headers["retry-after"] == "1"
        assert {c.status_code for c in codes} <= {502, 503}
    finally:
        stop(rp, p1, p2)


def test_cache_answers_repeats_per_variant_and_empties_on_a_new_version(store, project_env, tmp_path):
    (p1, s1) = server(store, project_env, "1", None, "--prediction-log", str(tmp_path / "predictions.db"))
    (p3, s3) = server(store, project_env)
    rp, url = router(project_env, [s1], "--cache-size", "100")
    try:
        deadline = time.time() + 20
        while time.time() < deadline and pools(url)["cache"]["stable"]["version"] != "1":
            time.sleep(0.1)
        assert pools(url)["cache"]["stable"]["off"] is None

        first = httpx.post(f"{url}/v1/predict", json={"text": "My card from Sarah Jones has not arrived"}, headers=H)
        again = httpx.post(f"{url}/v1/predict", json={"text": "My card from Sarah Jones has not arrived"}, headers=H)
        other_name = httpx.post(f"{url}/v1/predict", json={"text": "My card from John Smith has not arrived"},
                                headers=H)
        assert first.headers["x-cache"] == "miss" and again.headers["x-cache"] == "hit"
        assert other_name.headers["x-cache"] == "hit"  # masked alike: one entry
        assert again.json() == other_name.json()
        # The same answer, but a replay carries no prediction id (nothing was logged for it).
        strip = [{k: v for k, v in p.items() if k != "prediction_id"} for p in first.json()["predictions"]]
        assert [{k: v for k, v in p.items() if k != "prediction_id"} for p in again.json()["predictions"]] == strip
        assert first.json()["predictions"][0]["prediction_id"]  # the model's answer was logged
        assert all(p.get("prediction_id") is None for p in again.json()["predictions"])
        several = httpx.post(f"{url}/v1/predict", json={"texts": ["a", "b"]}, headers=H)
        assert several.status_code == 200 and several.headers["x-cache"] == "miss"  # only single texts
        metrics = httpx.get(f"{url}/metrics").text
        assert 'intentops_cache_hits_total{variant="stable"} 2.0' in metrics
        assert 'intentops_cache_misses_total{variant="stable"} 1.0' in metrics
        # Nothing of the text is kept: the key is the version and a hash of the masked text.
        assert "Sarah" not in json.dumps(pools(url))

        # A canary has its own cache: the same text is a miss there first.
        assert httpx.put(f"{url}/admin/routes", json={"canary": s3, "weight": 1.0}, headers=A).status_code == 200
        while time.time() < deadline + 20 and pools(url)["cache"]["canary"]["version"] != "1":
            time.sleep(0.1)
        c1 = httpx.post(f"{url}/v1/predict", json={"text": "My card from Sarah Jones has not arrived"}, headers=H)
        c2 = httpx.post(f"{url}/v1/predict", json={"text": "My card from Sarah Jones has not arrived"}, headers=H)
        assert c1.headers["x-variant"] == "canary" and c1.headers["x-cache"] == "miss"
        assert c2.headers["x-cache"] == "hit"
        assert 'intentops_cache_hits_total{variant="canary"} 1.0' in httpx.get(f"{url}/metrics").text
        assert httpx.put(f"{url}/admin/routes", json={"canary": "", "weight": 0.0}, headers=A).status_code == 200

        # A reload to another version empties the stable cache; the answer is the new version's.
        r = httpx.post(f"{s1}/admin/reload", json={"build": str(store / "v2")},
                       headers={"Authorization": f"Bearer {OPERATOR}"}, timeout=120)
        assert r.status_code == 200, r.text
        while time.time() < deadline + 40 and pools(url)["cache"]["stable"]["version"] != "2":
            time.sleep(0.1)
        assert pools(url)["cache"]["stable"]["entries"] == 0
        after = httpx.post(f"{url}/v1/predict", json={"text": "My card from Sarah Jones has not arrived"}, headers=H)
        assert after.headers["x-cache"] == "miss" and after.json()["model_version"] == "2"
    finally:
        stop(rp, p1, p3)


def test_autoscaler_adds_a_replica_under_load_and_removes_it_after(store, project_env, tmp_path, audit_log,
                                                                  monkeypatch):
    # Short windows to keep the test short; 6 s of calm before a scale-down, not 3: on a
    # busy host the test's load threads can stall long enough to look calm for 4 s (a CI
    # run of 2026-12-07 scaled 1 -> 2 -> 1 -> 2 under load).
    dep, build = _deployment(store, tmp_path, project_env, monkeypatch, {
        "deploy.max_delay_ms": 2,
        "deploy.autoscale.min_replicas": 1, "deploy.autoscale.max_replicas": 2,
        "deploy.autoscale.interval_seconds": 0.5, "deploy.autoscale.target_outstanding": 2,
        "deploy.autoscale.low_outstanding": 1, "deploy.autoscale.max_p99_ms": 60000,
        "deploy.autoscale.max_cpu": 1.0, "deploy.autoscale.window_seconds": 2,
        "deploy.autoscale.up_cooldown_seconds": 1, "deploy.autoscale.down_after_seconds": 6,
        "deploy.autoscale.down_cooldown_seconds": 2})
    cfg = dep.cfg
    state = dep.state()
    try:
        state["stable"] = dep.start_server(build, "1", "stable")
        assert state["stable"]["cold_start_s"] > 0
        dep.save(state)
        dep.ensure_router(state)
        assert dep.ensure_autoscaler(state) is not None
        url = dep.state()["router"]["url"]
        load = Load(url, 12, {"Authorization": f"Bearer {dep.client_key()}"})
        deadline = time.time() + 90
        grown = dep.status()
        while time.time() < deadline and grown["replicas"]["stable"] < 2:
            time.sleep(0.5)
            grown = dep.status()  # the status that saw two (a second call could see one again)
        time.sleep(2)  # traffic on both replicas
        statuses = load.stop()
        assert grown["replicas"]["stable"] == 2, grown
        # Prometheus's file-based discovery follows the replicas (written just after the
        # replicas file that status() reads).
        sd_file = dep.root.parent / "prometheus" / f"{cfg.dataset}.servers.json"
        deadline = time.time() + 10
        while time.time() < deadline and len(json.loads(sd_file.read_text())) < 2:
            time.sleep(0.2)
        scraped = json.loads(sd_file.read_text())
        assert len(scraped) == 2 and all(g["labels"]["variant"] == "stable" for g in scraped)
        assert grown["stable_extras"][0]["cold_start_s"] > 0
        assert len(statuses) > 20 and set(statuses) == {200}, {s: statuses.count(s) for s in set(statuses)}
        # Both replicas write the deployment's one prediction log, in the dataset's lake.
        from deploy import predlog

        assert dep.prediction_log == tmp_path / "lake" / cfg.dataset / "predictions" / "predictions.db"
        time.sleep(0.5)  # the writer threads commit just after answering
        variants = {r["variant"] for r in predlog.recent(dep.prediction_log)}
        assert "stable" in variants and len(variants) == 2, variants

        deadline = time.time() + 90
        while time.time() < deadline and dep.status()["replicas"]["stable"] > 1:
            time.sleep(0.5)
        assert dep.status()["replicas"]["stable"] == 1
        records = [json.loads(x) for x in audit_log.read_text().splitlines()]
        scale = [r for r in records if r["action"] == "scale" and r["actor"] == "autoscaler"
                 and str(tmp_path) not in r["target"]]
        outcomes = [r["outcome"] for r in scale[-2:]]
        assert outcomes == ["1 -> 2 replicas", "2 -> 1 replicas"], scale[-2:]
        assert "outstanding" in scale[-2]["reason"] and scale[-1]["reason"].startswith("autoscaler: calm")
        metrics = httpx.get(f"{dep.state()['autoscaler']['url']}/metrics").text
        assert 'intentops_autoscaler_decisions_total{direction="up"}' in metrics
    finally:
        stopped = dep.stop()
    assert any("autoscaler" in s for s in stopped)
    assert not dep.extras()
    # No server of this deployment outlives it, a replica the autoscaler was still starting
    # included (Deployment.stop_unrecorded_children).
    deadline = time.time() + 15
    while time.time() < deadline and _servers_of(build):
        time.sleep(0.2)
    assert not _servers_of(build)


def _servers_of(build: Path) -> list[int]:
    import psutil

    out = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = p.info["cmdline"] or []
        if "deploy.server" in cmd and str(build) in cmd:
            out.append(p.info["pid"])
    return out


def test_a_server_started_but_not_yet_recorded_is_stopped_with_its_starter(store, project_env, tmp_path,
                                                                          monkeypatch):
    """What the autoscaler does when it is stopped: a replica it had started but not yet
    recorded (it was waiting for it to be ready) is stopped; recorded servers are not."""
    dep, build = _deployment(store, tmp_path, project_env, monkeypatch, {})
    state = dep.state()
    try:
        state["stable"] = dep.start_server(build, "1", "stable")
        dep.save(state)
        starting = dep.start_server(build, "1", "stable-r1")  # started, not recorded
        assert dep.stop_unrecorded_children() == [starting["pid"]]
        assert not dep.alive(starting) and dep.alive(state["stable"])
        assert dep.stop_unrecorded_children() == []
    finally:
        dep.stop()
    assert not _servers_of(build)


def _deployment(store: Path, tmp_path: Path, env: dict, monkeypatch, overrides: dict):
    """A deployment under ``tmp_path`` with the store's v1 build copied in: (dep, build)."""
    from core.config import load_config
    from deploy.deployment import Deployment

    for k, v in env.items():
        monkeypatch.setenv(k, v)
    dep = Deployment(load_config(overrides={
        "deploy.root": str(tmp_path / "deploy"), "lake_root": str(tmp_path / "lake"),
        "deploy.router_port": 0} | overrides))
    build = dep.root / "builds" / "v1"
    shutil.copytree(store / "v1", build)
    return dep, build
