"""Benchmark: what each fault of the cluster shape costs (issue 28), in one sitting.

In the cluster shape (``intentops cluster-up``: CeleryExecutor with two workers on
Postgres and Redis, a Spark standalone master with two workers, MLflow on Postgres), the
demo DAG on the builder's export (``--rows`` rows, seed 5; the small encoder,
``--max-steps`` steps, two training nodes) runs twice, triggered through the REST API:

* ``clean``: no fault; each task's duration is the baseline;
* ``faulted``: the faults of ``tests/test_cluster.py``, at the same points: the Celery
  worker running ``train`` SIGKILLed once the two-node group has taken a few steps; the
  MLflow server SIGKILLed as registration is due and started again once ``register`` has
  failed an attempt; the scheduler SIGKILLed while ``export`` runs and started again 5 s
  later.

Then ``clean.py`` through spark-submit on a 60,000-row export twice: without a fault and
with worker 1 SIGKILLed as soon as it runs an executor of the job.

Reported per fault: when it was noticed (the failed attempt's end, or the task's next
state change), the time from the fault to the task's success, and the time the fault
added to the task (faulted minus clean duration, first start to success) and to the run.
The worker fault's detection is Airflow's task-heartbeat timeout, shortened to 30 s here
(the test's setting; the default is 300 s). One run each: where the time goes, not a
distribution.

    .venv/bin/python benchmarks/cluster_faults.py [--rows 3000] [--max-steps 120]

Results: ``benchmarks/results/cluster_faults.json``; docs/BENCHMARKS.md quotes them.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from cluster_shape import GATES, _cli  # noqa: E402
from data_stages import cpu_model, write_results  # noqa: E402
from pipeline_run import _seconds  # noqa: E402

from ops.airflow_api import AirflowApi  # noqa: E402
from ops.cluster import worker_running  # noqa: E402

DAG = "intentops_pipeline"


def _ts(iso: str | None) -> float | None:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp() if iso else None


def _after(iso: str | None, t: float) -> float | None:
    """Seconds from ``t`` to the time ``iso`` (None when Airflow recorded none)."""
    x = _ts(iso)
    return None if x is None else round(x - t, 1)


class Run:
    def __init__(self, api: AirflowApi, run_id: str) -> None:
        self.api, self.id = api, run_id

    def task(self, name: str) -> dict:
        return self.api("GET", f"/dags/{DAG}/dagRuns/{self.id}/taskInstances/{name}")

    def wait_for(self, name: str, states: tuple[str, ...], timeout: float = 1800, poll: float = 0.5) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ti = self.task(name)
            if ti["state"] in states:
                return ti
            time.sleep(poll)
        raise SystemExit(f"{name} never reached {states}: {self.task(name)}")

    def tasks(self) -> dict[str, dict]:
        tis = self.api("GET", f"/dags/{DAG}/dagRuns/{self.id}/taskInstances")["task_instances"]
        return {t["task_id"] + (f"[{t['map_index']}]" if t.get("map_index", -1) >= 0 else ""): t for t in tis}

    def tries(self, name: str) -> list[dict]:
        return self.api("GET", f"/dags/{DAG}/dagRuns/{self.id}/taskInstances/{name}/tries")["task_instances"]


def _kill(root: Path, name: str) -> float:
    rec = json.loads((root / "state.json").read_text())[name]
    os.killpg(os.getpgid(rec["pid"]), signal.SIGKILL)
    return time.time()


def pipeline(env: dict[str, str], root: Path, api: AirflowApi, conf: dict, faults: bool) -> dict:
    run = Run(api, api.trigger(conf))
    t0 = time.time()
    out: dict = {"faults": {}}
    if faults:
        work = root / "data" / "lake" / "banking77" / "train"
        victim = None
        while victim is None:
            ti = run.task("train")
            if ti["state"] in ("success", "failed", "upstream_failed"):
                raise SystemExit("train ended before the fault")
            steps = sum(len(h.read_text().splitlines()) for h in work.glob(".work-*/history.jsonl"))
            if ti["state"] == "running" and steps >= 3:
                victim = worker_running(root, ti["id"])
            time.sleep(0.1 if steps else 1)
        killed = _kill(root, victim)
        ok = run.wait_for("train", ("success", "failed"), poll=1)
        tries = run.tries("train")
        retry = max(tries, key=lambda t: t["try_number"])
        out["faults"]["celery_worker"] = {
            "killed_worker": victim, "tries": len(tries), "state": ok["state"],
            "noticed_after_s": _after(min(tries, key=lambda t: t["try_number"])["end_date"], killed),
            "retry_started_after_s": _after(retry["start_date"], killed),
            "success_after_s": _after(ok["end_date"], killed)}
        run.wait_for("train", ("success",))
        killed = _kill(root, "mlflow")
        failed = run.wait_for("register", ("up_for_retry", "failed", "success"), poll=0.5)
        noticed = time.time()
        restarted_at = time.time()
        again = _cli(env, "cluster-up")
        back = time.time()
        ok = run.wait_for("register", ("success", "failed"), poll=0.5)
        out["faults"]["mlflow"] = {
            "state_seen": failed["state"], "noticed_after_s": round(noticed - killed, 1),
            "restart_seconds": round(back - restarted_at, 1), "restarted": again.get("started"),
            "success_after_restart_s": _after(ok["end_date"], back), "state": ok["state"]}
        run.wait_for("export", ("running", "success", "failed"), poll=0.5)
        killed = _kill(root, "scheduler")
        time.sleep(5)
        t_up = time.time()
        again = _cli(env, "cluster-up")
        back = time.time()
        ok = run.wait_for("export", ("success", "failed"), poll=0.5)
        dep = run.wait_for("deploy", ("queued", "running", "success", "failed"), poll=0.5)
        out["faults"]["scheduler"] = {
            "down_seconds": round(t_up - killed, 1), "restart_seconds": round(back - t_up, 1),
            "restarted": again.get("started"), "export_state": ok["state"],
            "next_task_queued_after_restart_s": _after(dep.get("queued_when") or dep.get("start_date"), back)}
    done = api.wait_runs([run.id], timeout=3600)[run.id]
    out.update(state=done["state"], run_seconds=round(time.time() - t0, 1),
               tasks={k: {"state": t["state"], "seconds": _seconds(t["start_date"], t["end_date"]),
                          "tries": t["try_number"]} for k, t in run.tasks().items()})
    if faults:  # first start to success, across the attempts
        for name in ("train", "register", "export"):
            tries = run.tries(name)
            first = min(_ts(t["start_date"]) for t in tries if t["start_date"])
            out["tasks"][name]["first_start_to_end_s"] = round(_ts(run.task(name)["end_date"]) - first, 1)
    return out


def spark_worker(env: dict[str, str], root: Path, info: dict) -> dict:
    import httpx
    import psutil

    big = root / "big"
    subprocess.run([sys.executable, "-m", "demo.builder", "--out", str(big), "--rows", "60000", "--seed", "9",
                    "--format", "csv"], env=env, cwd=ROOT, check=True, timeout=900, capture_output=True)

    def clean(lake: Path) -> subprocess.Popen:
        cmd = [str(Path(sys.executable).parent / "spark-submit"), "--master", info["spark_master"]["url"],
               "--conf", "spark.ui.showConsoleProgress=false", str(ROOT / "jobs" / "spark" / "clean.py"),
               "--set", f"lake_root={lake}", "--set", f"input.path={big / 'raw.csv'}", "--run-id", "fault"]
        return subprocess.Popen(cmd, env={**env, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"},
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    t = time.time()
    if clean(root / "lake-ref").wait(timeout=900) != 0:
        raise SystemExit("clean.py failed without a fault")
    ref = time.time() - t
    state = json.loads((root / "state.json").read_text())
    victim = psutil.Process(state["spark_worker_1"]["pid"])
    t = time.time()
    proc = clean(root / "lake-fault")
    killed = None
    while proc.poll() is None and killed is None:
        if httpx.get(info["spark_workers"][0]["ui"] + "/json/", timeout=10).json().get("executors"):
            for p in [victim, *victim.children(recursive=True)]:
                p.send_signal(signal.SIGKILL)
            killed = time.time()
        time.sleep(0.2)
    rc = proc.wait(timeout=900)
    end = time.time()
    _cli(env, "cluster-up")
    return {"rows": 60000, "clean_seconds": round(ref, 1), "faulted_seconds": round(end - t, 1),
            "killed_after_s": round(killed - t, 1) if killed else None,
            "success_after_kill_s": round(end - killed, 1) if killed else None, "exit_code": rc,
            "added_s": round(end - t - ref, 1)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=3000)
    p.add_argument("--max-steps", type=int, default=120)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="intentops-faults-") as tmp:
        root = Path(tmp)
        root.chmod(0o755)  # Postgres runs as the postgres user and must reach its data
        subprocess.run([sys.executable, "-m", "demo.builder", "--out", str(root / "raw"), "--rows", str(args.rows),
                        "--seed", "5", "--format", "csv"], cwd=ROOT, check=True, capture_output=True, timeout=900)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("INTENTOPS__", "AIRFLOW", "MLFLOW_TRACKING_"))}
        env.update(GATES, PATH=f"{Path(sys.executable).parent}{os.pathsep}{env['PATH']}",
                   INTENTOPS__INPUT__PATH=str(root / "raw" / "raw.csv"), INTENTOPS_CLUSTER_ROOT=str(root),
                   INTENTOPS_TRAINING_NNODES="2", INTENTOPS_TRAINING_NPROC_PER_NODE="1",
                   INTENTOPS__TRAINING__RESCHEDULE_SECONDS="5",
                   AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT="30",
                   AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT_DETECTION_INTERVAL="5")
        conf = {"input_path": str(root / "raw" / "raw.csv"), "model": "small", "epochs": 1,
                "max_steps": args.max_steps, "learning_rate": 0.002, "canary_bake_seconds": 3,
                "max_suspect_rate": 0.25}
        info = _cli(env, "cluster-up")
        try:
            password = json.loads((root / "airflow" / "passwords.json").read_text())["admin"]
            api = AirflowApi(info["airflow"]["url"], "admin", password)
            api.wait_dag(DAG, timeout=300)
            api.unpause_without_the_scheduled_run(DAG)
            clean = pipeline(env, root, api, conf, faults=False)
            # The second run must train again: another learning rate is another stage key.
            faulted = pipeline(env, root, api, {**conf, "learning_rate": 0.0021, "registration_margin": -1.0},
                               faults=True)
            spark = spark_worker(env, root, info)
        finally:
            _cli(env, "cluster-down")
    for name in ("train", "register", "export"):
        base = clean["tasks"][name]["seconds"]
        faulted["tasks"][name]["added_s"] = round(faulted["tasks"][name]["first_start_to_end_s"] - base, 1)
    out = {"benchmark": "cluster_faults", "rows": args.rows, "max_steps": args.max_steps,
           "machine": {"cpu": cpu_model(), "cores": os.cpu_count()}, "date": time.strftime("%Y-%m-%d"),
           "command": "benchmarks/cluster_faults.py " + " ".join(argv or sys.argv[1:]),
           "heartbeat_timeout_s": 30, "clean": clean, "faulted": faulted, "spark_worker": spark,
           "run_added_s": round(faulted["run_seconds"] - clean["run_seconds"], 1)}
    write_results(out, "benchmarks/results/cluster_faults.json")
    print(json.dumps({k: out[k] for k in ("run_added_s", "spark_worker")}, indent=1))
    print(json.dumps(faulted["faults"], indent=1))
    for name in ("train", "register", "export"):
        print(name, "clean", clean["tasks"][name]["seconds"], "s; faulted", faulted["tasks"][name])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
