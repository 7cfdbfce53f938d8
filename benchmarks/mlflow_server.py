"""Benchmark: what an idle MLflow tracking server costs, as the project starts it
(``mlflow server --app-name basic-auth``, SQLite store, one worker) with MLflow 3's job
execution on (MLflow's default) and off (``core.registry_auth.server_env``).

For each, one after the other: start the server, wait until it answers, then count its
process tree, its resident memory (sum of RSS) and the CPU seconds the tree used during
``--idle`` seconds of no requests, then stop it.

    .venv/bin/python benchmarks/mlflow_server.py [--idle 60]

Results go to ``benchmarks/results/mlflow_server.json``; docs/BENCHMARKS.md quotes them.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _tree(proc: psutil.Process) -> list[psutil.Process]:
    return [proc, *proc.children(recursive=True)]


def _cpu(procs: list[psutil.Process]) -> float:
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            continue
    return total


def measure(jobs: bool, idle: float, tmp: Path) -> dict:
    from core import registry_auth

    store = tmp / ("jobs-on" if jobs else "jobs-off")
    creds = registry_auth.RegistryCredentials.load_or_create(store / "credentials.json")
    env = {**os.environ, **registry_auth.server_env(creds, store / "auth")}
    if jobs:
        env.pop("MLFLOW_SERVER_ENABLE_JOB_EXECUTION")  # MLflow's default: on
    port = _port()
    start = time.perf_counter()
    proc = subprocess.Popen(
        [str(Path(sys.executable).parent / "mlflow"), "server", *registry_auth.server_args(),
         "--host", "127.0.0.1", "--port", str(port), "--backend-store-uri", f"sqlite:///{store}/mlflow.db",
         "--artifacts-destination", str(store / "artifacts"), "--workers", "1"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if proc.poll() is not None or time.perf_counter() - start > 300:
                raise SystemExit("the MLflow server did not start")
            time.sleep(0.5)
        ready = time.perf_counter() - start
        time.sleep(10)  # what starts after the first answer (the job consumers) is up
        root = psutil.Process(proc.pid)
        procs = _tree(root)
        started_cpu = _cpu(procs)
        time.sleep(idle)
        procs = _tree(root)
        return {
            "job_execution": jobs,
            "seconds_to_answer": round(ready, 1),
            "processes": len(procs),
            "job_consumers": sum("huey" in " ".join(p.cmdline()) for p in procs),
            "rss_mb": round(sum(p.memory_info().rss for p in procs) / 2**20),
            "cpu_seconds_to_start": round(started_cpu, 1),
            f"cpu_seconds_in_{int(idle)}s_idle": round(_cpu(procs) - started_cpu, 1),
        }
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=60)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--idle", type=float, default=60)
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results" / "mlflow_server.json")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="mlflow-server-") as tmp:
        runs = [measure(jobs, args.idle, Path(tmp)) for jobs in (True, False)]
    import mlflow

    result = {
        "benchmark": "mlflow_server",
        "command": f"benchmarks/mlflow_server.py --idle {int(args.idle)}",
        "date": dt.date.today().isoformat(),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "mlflow": mlflow.__version__,
        "runs": runs,
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(runs, indent=2))


if __name__ == "__main__":
    main()
