"""The preemption controller: Airflow never preempts a running task, this loop does.

Each pass: the running trainings are the live leases under ``<lake>/train/.running/`` of
every dataset under ``lake_root`` (written by the train task: launcher pid, priority); the
waiting ones are the ``train`` task instances Airflow holds in ``scheduled``/``queued`` for
the ``intentops_training`` pool, of any DAG (``intentops_pipeline``,
``intentops_experiment``), each at the priority of its run's resolved config (the saved
``config.json``: the trigger form's ``training_priority`` over the config file; an
experiment's default 0), else ``training_priority`` in the run's conf, else
``training.priority`` of the config given here. When no slot is free and a
waiting training outranks a running one, ``training.preempt.choose_victim`` picks the
victim and ``preempt`` sends it SIGTERM (SIGKILL after ``training.preempt_grace_seconds``).
The victim's task goes to ``up_for_reschedule`` and resumes later from its checkpoint.

    python -m ops.preempt_controller [--config FILE] [--interval 5] [--once]

It runs on the host of the trainings it signals (the lease holds a local pid); with
workers on several hosts, one per host.
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from core.config import PipelineConfig, load_config
from core.stage import run_dir
from core.stages import TRAINING_POOL
from training.preempt import Job, choose_victim, preempt, read_leases

log = logging.getLogger("intentops.preempt")
WAITING = ("scheduled", "queued")


def _saved_priority(lakes: list[Path], run_id: str) -> int | None:
    """``training.priority`` of the run's resolved config, in whichever dataset's lake."""
    for lake in lakes:
        path = run_dir(lake, run_id) / "config.json"
        if path.exists():
            try:
                return int(json.loads(path.read_text())["training"]["priority"])
            except (OSError, ValueError, KeyError, TypeError):
                return None
    return None


def lakes(cfg: PipelineConfig) -> list[Path]:
    """Every dataset's lake under ``lake_root`` (one controller serves them all)."""
    root = cfg.resolve_path(cfg.lake_root)
    found = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
    return found if cfg.lake in found else [cfg.lake, *found]


def waiting_jobs(api: Any, default_priority: int, lakes: list[Path] = ()) -> list[Job]:
    """The train task instances waiting for the training pool, with their runs' priorities."""
    tis = api("GET", "/dags/~/dagRuns/~/taskInstances",
              params={"state": list(WAITING), "limit": 100})["task_instances"]
    jobs = []
    for ti in tis:
        if ti["task_id"] != "train" or ti.get("pool") != TRAINING_POOL:
            continue
        priority = _saved_priority(list(lakes), ti["dag_run_id"])
        if priority is None:  # its config is not resolved yet: the trigger's conf says it
            run = api("GET", f"/dags/{ti['dag_id']}/dagRuns/{ti['dag_run_id']}")
            given = (run.get("conf") or {}).get("training_priority")
            priority = int(default_priority if given is None else given)
        jobs.append(Job(ti["dag_run_id"], priority))
    return jobs


def one_pass(cfg: PipelineConfig, api: Any) -> dict[str, Any] | None:
    where = lakes(cfg)
    leases = [x for lake in where for x in read_leases(lake)]
    slots = int(api("GET", f"/pools/{TRAINING_POOL}")["slots"])
    jobs = waiting_jobs(api, cfg.training.priority, where)
    victim = choose_victim([x.job() for x in leases], jobs, slots)
    if victim is None:
        return None
    lease = next(x for x in leases if x.run_id == victim.run_id)
    log.warning("preempting training of %s (priority %d) for a waiting higher-priority one",
                victim.run_id, victim.priority)
    result = preempt(lease, cfg.training.preempt_grace_seconds)
    how = "checkpointed" if result["checkpointed"] else "killed without a checkpoint"
    log.warning("%s: freed after %.1fs (%s)", victim.run_id, result["seconds"], how)
    from core import audit

    waiting = max(j.priority for j in jobs)
    audit.record("training.preempt", victim.run_id, "done",
                 f"priority {victim.priority} gave way to a waiting training at {waiting}; "
                 f"freed after {result['seconds']:.1f}s, {how}", actor_="preempt-controller")
    return {"run_id": victim.run_id, **result}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ops.preempt_controller", description=__doc__.split("\n")[0])
    p.add_argument("--config", default=None, help="pipeline config YAML (default: the project's)")
    p.add_argument("--interval", type=float, default=5.0)
    p.add_argument("--once", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per poll in its log
    from ops.airflow_api import AirflowApi
    from ops.services import Services, admin_password

    cfg = load_config(args.config) if args.config else load_config()
    api = None
    while True:
        try:
            # A fresh client (and token) after any failure: the JWT expires, Airflow restarts.
            api = api or AirflowApi(Services(cfg).airflow_url, "admin", admin_password())
            one_pass(cfg, api)
        except Exception:
            if args.once:
                raise
            log.exception("controller pass failed; trying again in %.0fs", args.interval)
            api = None
        if args.once:
            return 0
        time.sleep(args.interval)


if __name__ == "__main__":
    raise SystemExit(main())
