#!/usr/bin/env python3
"""Container health check of the Airflow image, for each role it plays.

    intentops-healthcheck ROLE

ROLE is api-server, scheduler, celery-worker, dag-processor, triggerer, spark-master,
spark-worker, or ``auto``: the role read from the container's command line (PID 1; with
``init: true`` that is docker-init, whose command line holds the real command). A container
with no long-running role (the init job, a one-off CLI run) counts as healthy.

Exit 0 when healthy, 1 otherwise, with one line saying why.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

ROLES = ("api-server", "scheduler", "celery-worker", "dag-processor", "triggerer",
         "spark-master", "spark-worker")


def role_from_cmdline(args: list[str]) -> str | None:
    """The role a command line starts, or None for anything else."""
    if "org.apache.spark.deploy.master.Master" in args:
        return "spark-master"
    if "org.apache.spark.deploy.worker.Worker" in args:
        return "spark-worker"
    if "celery" in args and "worker" in args:
        return "celery-worker"
    for role in ("api-server", "scheduler", "dag-processor", "triggerer"):
        if role in args:
            return role
    return None


def _option(args: list[str], name: str, default: str) -> str:
    return args[args.index(name) + 1] if name in args[:-1] else default


def http_ok(url: str, timeout: float = 10.0) -> tuple[bool, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            body = r.read(65536)
            return 200 <= r.status < 300, f"{url}: HTTP {r.status} {body[:120]!r}"
    except OSError as exc:
        return False, f"{url}: {exc}"


def http_json(url: str, timeout: float = 10.0) -> tuple[bool, dict]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return 200 <= r.status < 300, json.loads(r.read())
    except (OSError, ValueError) as exc:
        return False, {"status": f"unreachable ({exc})"}


def run_ok(cmd: list[str], timeout: float = 25.0) -> tuple[bool, str]:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"{' '.join(cmd)}: {exc}"
    tail = (p.stdout + p.stderr).strip().splitlines()[-1:] or [""]
    return p.returncode == 0, f"{' '.join(cmd)}: exit {p.returncode} {tail[0][:200]}"


def check(role: str, args: list[str]) -> tuple[bool, str]:
    if role == "api-server":
        port = os.environ.get("AIRFLOW__API__PORT", "8080")
        return http_ok(f"http://127.0.0.1:{port}/api/v2/monitor/health")
    if role == "scheduler":
        port = os.environ.get("AIRFLOW__SCHEDULER__SCHEDULER_HEALTH_CHECK_SERVER_PORT", "8974")
        return http_ok(f"http://127.0.0.1:{port}/health")
    if role == "celery-worker":
        return run_ok(["celery", "--app", "airflow.providers.celery.executors.celery_executor.app",
                       "inspect", "ping", "-d", f"celery@{socket.gethostname()}"])
    if role == "dag-processor":
        return run_ok(["airflow", "jobs", "check", "--job-type", "DagProcessorJob", "--local"])
    if role == "triggerer":
        return run_ok(["airflow", "jobs", "check", "--job-type", "TriggererJob", "--local"])
    if role == "spark-master":
        url = f"http://127.0.0.1:{_option(args, '--webui-port', '8080')}/json/"
        ok, msg = http_json(url)
        return ok and msg.get("status") == "ALIVE", f"{url}: master status {msg.get('status')}"
    if role == "spark-worker":
        return http_ok(f"http://127.0.0.1:{_option(args, '--webui-port', '8081')}/json/")
    raise ValueError(f"unknown role {role!r}; one of {', '.join(ROLES)} or auto")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    try:
        args = Path("/proc/1/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        args = []
    role = argv[0]
    if role == "auto":
        role = role_from_cmdline(args)
        if role is None:
            print(f"no long-running role in {' '.join(args)!r}: healthy")
            return 0
    ok, msg = check(role, args)
    print(f"{role}: {'healthy' if ok else 'UNHEALTHY'}: {msg}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
