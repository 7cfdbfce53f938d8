"""Router and canary controller with real processes: model servers, the router, a real
MLflow registry, and a load generator sending real HTTP through the router."""

from __future__ import annotations

import json
import random
import shutil
import time
import uuid
from pathlib import Path

import httpx
import psutil
import pytest

from core.config import load_config
from deploy import canary, deployment
from deploy.deployment import DeployError, Deployment
from export import task as export_task


@pytest.fixture(scope="module")
def registry(mlflow_server, exported, trained, tmp_path_factory):
    """A registered model whose versions carry real export builds; ``add(kind)`` registers
    a new version: ``good``, ``permuted`` (labels shuffled: a wrong model) or ``failed``
    (int8 build marked as failing its gate)."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(mlflow_server)
    name = f"canary-{uuid.uuid4().hex[:8]}"
    client.create_registered_model(name)
    exp = client.create_experiment(name)
    base = tmp_path_factory.mktemp("registry")
    env = {"MLFLOW_TRACKING_URI": mlflow_server, "INTENTOPS_API_KEYS": ""}

    def cfg(**over):
        return load_config(overrides={"training.registered_model": name, "tracking.uri": mlflow_server,
                                      "deploy.root": str(base / "deploy"), "lake_root": str(base / "lake"),
                                      "deploy.router_port": 0, "deploy.steps": [25, 100],
                                      "deploy.bake_seconds": 2, "deploy.min_requests": 15,
                                      "deploy.min_probes": 15, "deploy.min_compared": 10,
                                      "deploy.poll_seconds": 0.5, "deploy.ready_timeout_seconds": 60,
                                      # The rollouts here are of identical builds: the p99 of a
                                      # hundred answers swings by tens of ms on a busy 2-core
                                      # host (65.5 ms against a 65.2 ms limit rolled one back).
                                      # The latency gate's own case, a canary slowed by 300 ms,
                                      # is far over this slack too.
                                      "deploy.latency_slack_ms": 100,
                                      **over}, env=env)

    def add(kind: str = "good") -> str:
        out = base / f"{kind}-{uuid.uuid4().hex[:6]}"
        shutil.copytree(exported["out"], out)
        rep = json.loads(json.dumps(exported["report"]))
        if kind == "permuted":
            f = out / "int8" / "labels.json"
            labels = json.loads(f.read_text())
            shuffled = list(labels)
            random.Random(3).shuffle(shuffled)
            f.write_text(json.dumps(shuffled))  # labels.json is the class list, in logit order
        if kind == "failed":
            rep["int8"] |= {"status": "failed", "reason": "agreement 90.00% < 99.00%"}
        rid = client.create_run(exp).info.run_id
        client.log_metric(rid, "test_accuracy", rep["builds"]["onnx_fp32"]["accuracy"])
        # what the canary compares against without a stable model: the answers under the
        # build's reject rule, as the train stage records them
        client.log_metric(rid, "test_in_scope_accuracy", rep["reject"]["onnx_int8"]["in_scope_accuracy"])
        note = base / "note.txt"
        note.write_text("builds only")
        client.log_artifact(rid, str(note), artifact_path="model")
        mv = client.create_model_version(name, source=f"runs:/{rid}/model", run_id=rid)
        export_task.attach(cfg(), name, mv.version, out, rep, key=f"k-{mv.version}")
        return str(mv.version)

    yield {"client": client, "name": name, "cfg": cfg, "add": add, "trained": trained}
    Deployment(cfg()).stop()


def roll(reg, version, **kw):
    cfg = reg["cfg"]()
    t = reg["trained"]
    return canary.rollout(cfg, version, t["texts"], t["labels"], Path(cfg.deploy.root) / f"out-{version}", **kw)


def aliases(reg):
    return dict(reg["client"].get_registered_model(reg["name"]).aliases)


def predict(dep: Deployment, text: str) -> httpx.Response:
    url = dep.state()["router"]["url"]
    return httpx.post(f"{url}/v1/predict", json={"text": text},
                      headers={"Authorization": f"Bearer {dep.client_key()}"}, timeout=10)


def test_rollouts_promote_good_versions_and_roll_back_bad_ones(registry):
    reg = registry
    dep = Deployment(reg["cfg"]())
    # First deployment: no stable yet, a plain rollout with the same checks.
    v1 = reg["add"]()
    r1 = roll(reg, v1)
    assert r1["decision"] == "promoted", r1["reason"]
    assert "first deployment" in r1["reason"] and r1["client_failures"] == 0
    assert aliases(reg) == {"champion": v1}
    assert predict(dep, reg["trained"]["texts"][0]).json()["model_version"] == v1

    # A good challenger goes through every step, compared with stable; the alias moves.
    v2 = reg["add"]()
    r2 = roll(reg, v2)
    assert r2["decision"] == "promoted", r2["reason"]
    # The same build, yet not always the same label: dynamic int8 quantization scales
    # activations per batch, so a message's answer depends a little on its batch-mates.
    assert r2["steps_passed"] == 2 and r2["shadow"]["compared"] >= 10 and r2["shadow"]["agreement"] >= 0.95
    assert r2["client_failures"] == 0
    assert aliases(reg) == {"champion": v2, "previous": v1}
    tags = reg["client"].get_model_version(reg["name"], v2).tags
    assert tags[deployment.DECISION_TAG] == "promoted"
    arts = [a.path for a in reg["client"].list_artifacts(
        reg["client"].get_model_version(reg["name"], v2).run_id, f"deploy/v{v2}")]
    assert f"deploy/v{v2}/rollout.png" in arts and f"deploy/v{v2}/rollout.json" in arts
    state = dep.state()
    assert state["stable"]["version"] == v2 and state["canary"] is None
    assert predict(dep, "my card has not arrived yet").headers["x-variant"] == "stable"

    # Labels permuted: a wrong model. Shadow agreement and probe accuracy catch it.
    v3 = reg["add"]("permuted")
    r3 = roll(reg, v3)
    assert r3["decision"] == "rolled_back"
    assert "agrees with stable" in r3["reason"] or "accuracy" in r3["reason"]
    assert r3["client_failures"] == 0
    assert aliases(reg) == {"champion": v2, "previous": v1}
    assert reg["client"].get_model_version(reg["name"], v3).tags[deployment.DECISION_TAG] == "rolled_back"
    assert dep.state()["canary"] is None

    # Failing half its requests: the router retries them on stable, clients see none.
    v4 = reg["add"]()
    r4 = roll(reg, v4, server_args=["--inject-fail-rate", "0.5"])
    assert r4["decision"] == "rolled_back" and "error rate" in r4["reason"], r4["reason"]
    assert r4["client_failures"] == 0 and r4["fallbacks"] > 0
    assert aliases(reg)["champion"] == v2

    # Slowed down: latency far above stable's.
    v5 = reg["add"]()
    r5 = roll(reg, v5, server_args=["--inject-delay-ms", "300"])
    assert r5["decision"] == "rolled_back" and "canary p50" in r5["reason"], r5["reason"]
    assert r5["client_failures"] == 0

    # A version whose int8 build failed its gate is never deployed.
    v6 = reg["add"]("failed")
    r6 = roll(reg, v6)
    assert r6["decision"] == "refused" and "failed its checks" in r6["reason"]
    assert not (reg["cfg"]().deploy_dir / "builds" / f"v{v6}").exists()

    # Rerunning for the version already serving does nothing.
    assert roll(reg, v2)["decision"] == "already_serving"

    # One-command rollback to `previous`, and back again.
    assert dep.rollback() == {"serving": v1, "champion": v1, "previous": v2}
    assert predict(dep, "where is my card").json()["model_version"] == v1
    assert aliases(reg) == {"champion": v1, "previous": v2}
    status = dep.status()
    assert status["stable"]["version"] == v1 and status["stable"]["health"] == "ready"
    assert status["router"]["health"] == "ready"

    # Every one of those actions left an audit record with its actor.
    from core import audit

    mine = [r for r in audit.read() if reg["name"] in r["target"]]
    actions = {(r["action"], r["outcome"]) for r in mine}
    assert {("rollout", "promoted"), ("rollout", "rolled_back"), ("rollback", "done"),
            ("alias.move", f"v{v1}"), ("alias.move", f"v{v2}")} <= actions, actions
    assert all(r["actor"] for r in mine)
    rb = next(r for r in mine if r["action"] == "rollback")
    assert rb["target"] == f"{reg['name']} v{v1}" and "rollback" in rb["reason"]
    routes = [r for r in audit.read(action="router.routes")]
    assert any(r["outcome"] == "done" for r in routes) and all(r["actor"].startswith("key:") for r in routes)

    # Stop ends only what the deployment started, and leaves no process behind.
    pids = [p["pid"] for p in dep.state().values() if isinstance(p, dict) and "pid" in p]
    assert dep.stop()
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE for p in pids)


def _roll_and_kill(reg, dep, version, which: str, settle: float = 0.0) -> tuple[dict, list[int]]:
    """Roll ``version`` out and SIGKILL the ``which`` server ("stable" or "canary") once the
    rollout is under way (the canary is up, then ``settle`` seconds): not after a fixed
    delay (on a loaded machine fetching the build can take longer than any delay) and never
    after the rollout (pids are reused: a late kill could hit another process)."""
    import os
    import signal
    import threading

    rollout_over, killed = threading.Event(), []

    def kill():
        while not rollout_over.wait(0.2):
            state = dep.state()
            if state.get("canary"):
                time.sleep(settle)
                pid = (dep.state().get(which) or {}).get("pid")
                if (not rollout_over.is_set() and pid and psutil.pid_exists(pid)
                        and "deploy.server" in " ".join(psutil.Process(pid).cmdline())):
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                return

    killer = threading.Thread(target=kill, daemon=True)
    killer.start()
    try:
        result = roll(reg, version)
    finally:
        rollout_over.set()
        killer.join()
    return result, killed


def test_stable_that_dies_during_a_rollout_is_restarted(registry):
    reg = registry
    dep = Deployment(reg["cfg"]())
    dep.stop()
    v1 = reg["add"]()
    r1 = roll(reg, v1)
    assert r1["decision"] == "promoted", r1["reason"]
    r, killed = _roll_and_kill(reg, dep, reg["add"](), "stable")
    assert killed, "the rollout ended before stable could be killed"
    assert any("restarted" in e["event"] for e in r["events"]), r["events"]
    assert r["decision"] in ("promoted", "rolled_back")
    dep.stop()


def test_canary_killed_mid_rollout_is_rolled_back_and_clients_see_no_failure(registry):
    """A canary server SIGKILLed while it takes traffic: the router retries its share on
    stable (no client sees a failure), the controller rolls back saying why, the champion
    stays, and stable serves on."""
    reg = registry
    dep = Deployment(reg["cfg"]())
    dep.stop()
    v1 = reg["add"]()
    assert roll(reg, v1)["decision"] == "promoted"
    r, killed = _roll_and_kill(reg, dep, reg["add"](), "canary", settle=1.0)  # 1 s: it has taken traffic
    assert killed, "the rollout ended before the canary could be killed"
    assert r["decision"] == "rolled_back" and "canary server exited" in r["reason"], r["reason"]
    assert r["client_failures"] == 0, r
    assert aliases(reg)["champion"] == v1
    assert dep.state()["canary"] is None
    assert predict(dep, "my card has not arrived").json()["model_version"] == v1
    dep.stop()


def test_canary_that_never_becomes_ready_is_aborted(registry, tmp_path):
    reg = registry
    dep = Deployment(reg["cfg"](**{"deploy.ready_timeout_seconds": 3}))
    bad = tmp_path / "bad"
    bad.mkdir()
    with pytest.raises(DeployError, match="exited .*before it was ready|not ready after"):
        dep.start_server(bad, "9", "canary")


def test_a_second_dataset_cannot_take_the_port_of_anothers_router(tmp_path):
    """Deployments live side by side under one deploy.root; a dataset whose configured
    router port is held by another dataset's running router is refused with the fix."""
    import os

    me = psutil.Process(os.getpid())
    over = {"deploy.root": str(tmp_path), "deploy.router_port": 8299}
    demo = Deployment(load_config(overrides={**over, "dataset": "banking77"}))
    demo.save({"router": {"pid": me.pid, "create_time": me.create_time(), "url": "http://127.0.0.1:8299"},
               "stable": None, "canary": None})
    other = Deployment(load_config(overrides={**over, "dataset": "tickets"}))
    assert other.port_owner(8299) == "banking77" and other.port_owner(8300) is None
    with pytest.raises(DeployError, match="8299 is taken by the router of dataset 'banking77'.*tickets"):
        other.ensure_router(other.state())
    assert demo.port_owner(8299) is None  # its own router is not a collision
