"""Monitoring: the alert rules (promtool), the generated Prometheus and Alertmanager
configs, and a live fault: a model server that fails every request pages through real
Prometheus, Alertmanager and the project's receiver into the audit log."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from conftest import ROOT, _free_port

from ops.monitoring import stack

MON = ROOT / "ops" / "monitoring"


def _tool(*cmd: str, cwd: Path = MON) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), cwd=cwd, capture_output=True, text=True, timeout=300)


def test_alert_rules_pass_promtool_check_and_their_unit_tests():
    assert stack.binaries()["promtool"], "promtool is not installed (make test-deps)"
    r = _tool("promtool", "check", "rules", "rules.yml")
    assert r.returncode == 0, r.stdout + r.stderr
    r = _tool("promtool", "test", "rules", "rules_test.yml")
    assert r.returncode == 0 and "SUCCESS" in r.stdout, r.stdout + r.stderr
    # Every alert has a summary and a runbook line, and is unit-tested.
    import yaml

    rules = [r for g in yaml.safe_load((MON / "rules.yml").read_text())["groups"] for r in g["rules"]]
    tested = (MON / "rules_test.yml").read_text()
    for rule in rules:
        assert rule["annotations"]["summary"] and rule["annotations"]["runbook"], rule["alert"]
        assert f"alertname: {rule['alert']}" in tested, f"{rule['alert']} has no promtool test"


def test_a_broken_rule_fails_promtool(tmp_path):
    (tmp_path / "rules.yml").write_text(
        "groups:\n- name: x\n  rules:\n  - alert: Broken\n    expr: rate(intentops_requests_total[5m] > 1\n")
    r = _tool("promtool", "check", "rules", "rules.yml", cwd=tmp_path)
    assert r.returncode != 0


def test_generated_configs_are_valid_for_prometheus_and_alertmanager(tmp_path):
    ports = stack.MonitoringPorts()
    paths = stack.write_configs(tmp_path, ports, tmp_path / "deploy")
    r = _tool("promtool", "check", "config", str(paths["prometheus"]), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    r = _tool("amtool", "check-config", str(paths["alertmanager"]), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    import yaml

    am = yaml.safe_load(paths["alertmanager"].read_text())
    assert am["receivers"][0]["webhook_configs"][0]["url"] == f"{ports.url('receiver')}/alerts"


def _wait_http(url: str, proc: subprocess.Popen, log: Path, timeout: float = 60) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"{proc.args[0]} exited: {log.read_text()[-2000:]}")
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"{url} not ready; {log.read_text()[-2000:]}")


# -- the StatsD bridge ---------------------------------------------------------------------

def test_statsd_bridge_reads_airflows_and_dogstatsd_lines():
    from ops.monitoring.statsd_bridge import BadLine, parse_line

    s = parse_line("airflow.ti.finish,dag_id=intentops_pipeline,task_id=train,state=success:1|c")
    assert (s.name, s.kind, s.value, dict(s.labels)) == (
        "airflow.ti.finish", "c", 1.0, {"dag_id": "intentops_pipeline", "task_id": "train", "state": "success"})
    s = parse_line("intentops.stage.duration:1500|ms|@0.5|#stage:clean,dataset:banking77")
    assert (s.kind, s.value, s.rate, dict(s.labels)) == ("ms", 1500.0, 0.5, {"stage": "clean", "dataset": "banking77"})
    assert parse_line("airflow.pool.open_slots,pool_name=default_pool:-2|g").relative
    assert parse_line("airflow.executor.running_tasks:3|g").relative is False
    assert parse_line("x.timer:12|h").kind == "ms"
    for bad in ("no_value", "x:|c", "x:1", "x:1|q", "x:abc|c", "x:1|c|@2", "x,tag:1|c", "x:nan|g"):
        with pytest.raises(BadLine):
            parse_line(bad)


def test_statsd_bridge_counts_like_prometheus_and_bounds_its_series():
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from ops.monitoring.statsd_bridge import Store

    store = Store(max_series=4)
    store.feed("airflow.ti.finish,dag_id=d,task_id=t,state=success:1|c\n"
               "airflow.ti.finish,dag_id=d,task_id=t,state=success:1|c|@0.25\n"  # sampled: counts 4
               "airflow.executor.open_slots:32|g\nairflow.executor.open_slots:-2|g\n"
               "airflow.dag.duration,dag_id=d:250|ms\nairflow.dag.duration,dag_id=d:90000|ms\n"
               "garbage line\n\n"
               "airflow.dagrun.active,dag_id=a:1|s\nairflow.dagrun.active,dag_id=a:1|s\n"
               "one.too.many:1|c\n")
    reg = CollectorRegistry()
    reg.register(store)
    got = {(smp.name, tuple(sorted(smp.labels.items()))): smp.value
           for fam in text_string_to_metric_families(generate_latest(reg).decode()) for smp in fam.samples}
    assert got[("airflow_ti_finish_total", (("dag_id", "d"), ("state", "success"), ("task_id", "t")))] == 5
    assert got[("airflow_executor_open_slots", ())] == 30
    assert got[("airflow_dag_duration_seconds_count", (("dag_id", "d"),))] == 2
    assert got[("airflow_dag_duration_seconds_sum", (("dag_id", "d"),))] == pytest.approx(90.25)
    assert got[("airflow_dag_duration_seconds_bucket", (("dag_id", "d"), ("le", "0.5")))] == 1
    assert got[("airflow_dag_duration_seconds_bucket", (("dag_id", "d"), ("le", "120.0")))] == 2
    assert got[("airflow_dagrun_active_distinct", (("dag_id", "a"),))] == 1
    assert ("one_too_many_total", ()) not in got  # the fifth series is refused, and counted
    assert got[("statsd_bridge_refused_samples_total", ())] == 1
    assert got[("statsd_bridge_bad_lines_total", ())] == 1
    assert got[("statsd_bridge_lines_total", ())] == 10


def test_receiver_refuses_what_it_cannot_record(tmp_path, project_env):
    from fastapi.testclient import TestClient

    from ops.monitoring.receiver import create_app

    client = TestClient(create_app(triggers={"Dead": "intentops_pipeline"}))
    assert client.post("/alerts", content=b"not json").status_code == 422
    assert client.post("/alerts", json={"no": "alerts"}).status_code == 422
    # A trigger that cannot reach Airflow: the alert is recorded anyway, with the error.
    os.environ["INTENTOPS_AIRFLOW_URL"] = f"http://127.0.0.1:{_free_port()}"
    os.environ["INTENTOPS_AIRFLOW_PASSWORD"] = "x"
    try:
        r = client.post("/alerts", json={"alerts": [{"status": "firing", "labels": {"alertname": "Dead"},
                                                       "annotations": {"summary": "s"}}]})
    finally:
        os.environ.pop("INTENTOPS_AIRFLOW_URL")
        os.environ.pop("INTENTOPS_AIRFLOW_PASSWORD")
    assert r.status_code == 200
    assert "trigger_error" in client.get("/alerts").json()["alerts"][-1]
    # An audit log that cannot be written: 503, so Alertmanager retries.
    blocker = tmp_path / "file"
    blocker.write_text("")
    old = os.environ["INTENTOPS_AUDIT_LOG"]
    os.environ["INTENTOPS_AUDIT_LOG"] = str(blocker / "audit.jsonl")
    try:
        r = client.post("/alerts", json={"alerts": [{"status": "firing", "labels": {"alertname": "X"}}]})
    finally:
        os.environ["INTENTOPS_AUDIT_LOG"] = old
    assert r.status_code == 503


@pytest.fixture(scope="module")
def monitoring(tmp_path_factory, project_env):
    """Prometheus, Alertmanager, the Pushgateway and the receiver, started from the
    project's own configs and command lines on free ports, with 1 s intervals."""
    base = tmp_path_factory.mktemp("monitoring")
    ports = stack.MonitoringPorts(prometheus=_free_port(), alertmanager=_free_port(),
                                  pushgateway=_free_port(), receiver=_free_port(), statsd=_free_port(),
                                  statsd_http=_free_port())
    deploy_root = base / "deploy"
    os.environ["INTENTOPS_MONITORING_INTERVAL"] = "1s"
    try:
        stack.write_configs(base, ports, deploy_root)
    finally:
        os.environ.pop("INTENTOPS_MONITORING_INTERVAL")
    procs = {}
    try:
        for name, cmd in stack.commands(base, ports, sys.executable).items():
            log = base / f"{name}.log"
            procs[name] = subprocess.Popen(cmd, env=project_env, cwd=ROOT, stdout=log.open("w"),
                                           stderr=subprocess.STDOUT)
            _wait_http(ports.url(stack.PORT_OF[name]) + stack.HEALTH[name], procs[name], log)
        yield {"ports": ports, "deploy_root": deploy_root, "base": base}
    finally:
        for p in procs.values():
            p.terminate()
            p.wait(timeout=30)


def _received(ports, alertname: str, timeout: float, **labels: str) -> tuple[dict | None, float]:
    """The first firing alert of that name (and those labels) at the receiver. Other
    processes on the machine may push to the same gateway port later reused: only the
    alert this test caused counts."""
    t0 = time.time()
    while time.time() - t0 < timeout:
        got = [a for a in httpx.get(f"{ports.url('receiver')}/alerts").json()["alerts"]
               if a["labels"].get("alertname") == alertname and a["status"] == "firing"
               and all(a["labels"].get(k) == v for k, v in labels.items())]
        if got:
            return got[0], time.time() - t0
        time.sleep(0.5)
    return None, time.time() - t0


def test_a_failing_server_pages_through_prometheus_and_alertmanager(monitoring, exported, project_env, audit_log):
    from test_scaling import CLIENT, INTERNAL, router

    ports, deploy_root = monitoring["ports"], monitoring["deploy_root"]
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "deploy.server", "--build", str(exported["out"] / "int8"),
                               "--port", str(port), "--inject-fail-rate", "1.0"],
                              env=dict(project_env, INTENTOPS_API_KEYS=INTERNAL), cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
    rp = None
    try:
        _wait_http(f"http://127.0.0.1:{port}/health/ready", server, monitoring["base"] / "prometheus.log")
        rp, url = router(project_env, [f"http://127.0.0.1:{port}"])
        targets = deploy_root / "prometheus"
        targets.mkdir(parents=True)
        (targets / "demo.router.json").write_text(json.dumps([{"targets": [url.split("//")[1]]}]))
        (targets / "demo.servers.json").write_text(json.dumps([{"targets": [f"127.0.0.1:{port}"]}]))
        (targets / "demo.autoscaler.json").write_text("[]")
        # Every request fails at the server (injected): the router answers 5xx.
        t_fault = time.time()
        stop_at = t_fault + 90
        alert = None
        while time.time() < stop_at and alert is None:
            for _ in range(10):
                httpx.post(f"{url}/v1/predict", json={"text": "my card"}, headers={"Authorization": f"Bearer {CLIENT}"})
            alert, _ = _received(ports, "IntentopsHighErrorRate", 0.5, instance=url.split("//")[1])
        assert alert is not None, httpx.get(f"{ports.url('prometheus')}/api/v1/alerts").text
        assert alert["labels"]["severity"] == "page" and alert["annotations"]["runbook"]
        records = [json.loads(x) for x in audit_log.read_text().splitlines()]
        paged = [r for r in records if r["action"] == "alert" and r["target"].startswith("IntentopsHighErrorRate")]
        assert paged and paged[-1]["actor"] == "alertmanager" and paged[-1]["outcome"] == "firing"
        assert "runbook:" in paged[-1]["reason"]
        # The router's and server's own metrics are scraped (the memory rule's inputs too).
        q = httpx.get(f"{ports.url('prometheus')}/api/v1/query", params={
            "query": 'intentops_memory_limit_bytes{job=~"intentops-router|intentops-servers"}'}).json()
        assert {r["metric"]["job"] for r in q["data"]["result"]} == {"intentops-router", "intentops-servers"}
    finally:
        if rp is not None:
            rp.terminate()
            rp.wait(timeout=20)
        server.terminate()
        server.wait(timeout=20)


def test_a_failed_pipeline_run_pushed_to_the_gateway_pages(monitoring, monkeypatch):
    from core import pushmetrics

    ports = monitoring["ports"]
    monkeypatch.setenv("INTENTOPS_PUSHGATEWAY_URL", ports.url("pushgateway"))
    assert pushmetrics.pipeline_run("intentops_pipeline", "manual__test", True, "train")
    alert, _ = _received(ports, "IntentopsPipelineRunFailed", 60, run_id="manual__test")
    assert alert is not None and alert["labels"]["task_id"] == "train"
    # The next good run clears it in the gateway.
    assert pushmetrics.pipeline_run("intentops_pipeline", "manual__next", False)
    text = httpx.get(f"{ports.url('pushgateway')}/metrics").text
    assert 'intentops_pipeline_run_failed{dag_id="intentops_pipeline",instance="",job="intentops-pipeline",' \
           'run_id="manual__next",task_id=""} 0' in text
    # With the gateway down a push is dropped, never raised.
    monkeypatch.setenv("INTENTOPS_PUSHGATEWAY_URL", f"http://127.0.0.1:{_free_port()}")
    assert pushmetrics.pipeline_run("intentops_pipeline", "x", True) is False


def test_stage_outcomes_reach_prometheus_through_the_statsd_bridge(monitoring, monkeypatch, tmp_path):
    """run_stage's own metrics (published, cache hit, failed) over UDP to the real bridge,
    scraped by the real Prometheus; with no bridge listening a stage still runs."""
    from core import stage

    ports = monitoring["ports"]
    lake = tmp_path / "lake" / "demo-statsd"
    monkeypatch.setenv("INTENTOPS_STATSD_ADDR", f"{ports.host}:{ports.statsd}")

    def work(out: Path) -> dict:
        (out / "x.txt").write_text("x")
        return {"rows": 1}

    def broken(out: Path) -> dict:
        raise RuntimeError("the stage failed")

    stage.run_stage("probe", lake, {"a": 1}, {}, "v1", work)
    stage.run_stage("probe", lake, {"a": 1}, {}, "v1", work)  # the same key: a cache hit
    with pytest.raises(RuntimeError):
        stage.run_stage("probe", lake, {"a": 2}, {}, "v1", broken)
    want = {"published", "cache_hit", "failed"}
    seen: dict[str, float] = {}
    deadline = time.time() + 60
    while time.time() < deadline and set(seen) != want:
        q = httpx.get(f"{ports.url('prometheus')}/api/v1/query", params={
            "query": 'intentops_stage_runs_total{stage="probe",dataset="demo-statsd",job="statsd-bridge"}'}).json()
        seen = {r["metric"]["outcome"]: float(r["value"][1]) for r in q["data"]["result"]}
        time.sleep(0.5)
    assert seen == dict.fromkeys(want, 1.0), seen
    q = httpx.get(f"{ports.url('prometheus')}/api/v1/query", params={
        "query": 'intentops_stage_duration_seconds_count{stage="probe",dataset="demo-statsd"}'}).json()
    assert sum(float(r["value"][1]) for r in q["data"]["result"]) == 3
    # Nothing listens there: the stage runs all the same.
    monkeypatch.setenv("INTENTOPS_STATSD_ADDR", f"127.0.0.1:{_free_port()}")
    assert stage.run_stage("probe", lake, {"a": 3}, {}, "v1", work).cache_hit is False
def test_a_drift_check_pushed_to_the_gateway_raises_the_drift_alert(monitoring, monkeypatch):
    """The monitoring check's push (ops/monitor.py) reaches Alertmanager as the drift ticket;
    the next check (too little traffic) pushes 0 for the same dataset."""
    from core import pushmetrics

    ports = monitoring["ports"]
    monkeypatch.setenv("INTENTOPS_PUSHGATEWAY_URL", ports.url("pushgateway"))
    assert pushmetrics.drift("drifttest", "drift", {"drift": 1.0, "embedding_novelty_excess": 0.21})
    alert, _ = _received(ports, "IntentopsDriftDetected", 60, dataset="drifttest")
    assert alert is not None and alert["labels"]["severity"] == "ticket"
    assert "monitoring/<check>/check.json" in alert["annotations"]["runbook"]
    assert pushmetrics.drift("drifttest", "too_little_traffic", {"drift": 0.0, "predictions": 12.0})
    text = httpx.get(f"{ports.url('pushgateway')}/metrics").text
    assert ('intentops_drift_detected{dataset="drifttest",instance="",job="intentops-monitoring",'
            'status="too_little_traffic"} 0') in text


def test_training_pushes_gpu_figures_read_through_nvml(monitoring, monkeypatch):
    """Where a GPU driver exists, training's push carries NVML's utilization and memory
    (the GPU-underused alert's input). This machine has no GPU, so the NVML module is a
    stand-in with NVML's call signatures; the push and the gateway are real. Without the
    module the two gauges are left out, never zero."""
    import types

    from core import pushmetrics

    ports = monitoring["ports"]
    monkeypatch.setenv("INTENTOPS_PUSHGATEWAY_URL", ports.url("pushgateway"))
    fake = types.ModuleType("pynvml")
    fake.nvmlInit = lambda: None
    fake.nvmlDeviceGetHandleByIndex = lambda i: ("gpu", i)
    fake.nvmlDeviceGetUtilizationRates = lambda h: types.SimpleNamespace(gpu=37, memory=12)
    fake.nvmlDeviceGetMemoryInfo = lambda h: types.SimpleNamespace(used=3 * 2**30, total=16 * 2**30)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert pushmetrics._gpu() == (0.37, float(3 * 2**30))
    assert pushmetrics.training("gpu-probe", 120.0, 0.5, 1.2, every_s=0.0)
    text = httpx.get(f"{ports.url('pushgateway')}/metrics").text
    util = [ln for ln in text.splitlines() if ln.startswith("intentops_training_gpu_utilization{") and 'run="gpu-probe"' in ln]
    mem = [ln for ln in text.splitlines() if ln.startswith("intentops_training_gpu_memory_bytes{") and 'run="gpu-probe"' in ln]
    assert util and float(util[0].rsplit(" ", 1)[1]) == 0.37, util
    assert mem and float(mem[0].rsplit(" ", 1)[1]) == 3 * 2**30, mem
    # No NVML (this machine, or a driver that fails to load): the gauges are absent.
    monkeypatch.setitem(sys.modules, "pynvml", None)
    assert pushmetrics._gpu() == (None, None)
    assert pushmetrics.training("gpu-probe-cpu", 120.0, 0.5, 1.2, every_s=0.0)
    text = httpx.get(f"{ports.url('pushgateway')}/metrics").text
    assert not [ln for ln in text.splitlines() if "gpu" in ln.split("{")[0] and 'run="gpu-probe-cpu"' in ln]
    assert [ln for ln in text.splitlines() if ln.startswith("intentops_training_loss{") and 'run="gpu-probe-cpu"' in ln]
