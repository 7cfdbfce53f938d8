"""The preemption controller: Airflow never preempts a running task, this loop does.

Each pass: the running trainings are the live leases under ``<lake>/train/.running/``
(written by the train task: launcher pid, priority); the waiting ones are the ``train``
task instances Airflow holds in ``scheduled``/``queued`` for the ``intentops_training``
pool, each at the priority its run was triggered with (``training_priority`` in the run's
conf, else ``training.priority`` of the config given here). When no slot is free and a
waiting training outranks a running one, ``training.preempt.choose_victim`` picks the
victim and ``preempt`` sends it SIGTERM (SIGKILL after ``training.preempt_grace_seconds``).
The victim's task goes to ``up_for_reschedule`` and resumes later from its checkpoint.

    python -m ops.preempt_controller [--config FILE] [--interval 5] [--once]

It runs on the host of the trainings it signals (the lease holds a local pid); with
workers on several hosts, one per host.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Sequence
from typing import Any

from core.config import PipelineConfig, load_config
from core.stages import TRAINING_POOL
from training.preempt import Job, choose_victim, preempt, read_leases

log = logging.getLogger("intentops.preempt")
WAITING = ("scheduled", "queued")


def waiting_jobs(api: Any, default_priority: int) -> list[Job]:
    """The train task instances waiting for the training pool, with their runs' priorities."""
    tis = api("GET", "/dags/~/dagRuns/~/taskInstances",
              params={"state": list(WAITING), "limit": 100})["task_instances"]
    jobs = []
    for ti in tis:
        if ti["task_id"] != "train" or ti.get("pool") != TRAINING_POOL:
            continue
        run = api("GET", f"/dags/{ti['dag_id']}/dagRuns/{ti['dag_run_id']}")
        conf = run.get("conf") or {}
        jobs.append(Job(ti["dag_run_id"], int(conf.get("training_priority", default_priority))))
    return jobs


def one_pass(cfg: PipelineConfig, api: Any) -> dict[str, Any] | None:
    leases = read_leases(cfg.lake)
    slots = int(api("GET", f"/pools/{TRAINING_POOL}")["slots"])
    victim = choose_victim([x.job() for x in leases], waiting_jobs(api, cfg.training.priority), slots)
    if victim is None:
        return None
    lease = next(x for x in leases if x.run_id == victim.run_id)
    log.warning("preempting training of %s (priority %d) for a waiting higher-priority one",
                victim.run_id, victim.priority)
    result = preempt(lease, cfg.training.preempt_grace_seconds)
    log.warning("%s: freed after %.1fs (%s)", victim.run_id, result["seconds"],
                "checkpointed" if result["checkpointed"] else "killed without a checkpoint")
    return {"run_id": victim.run_id, **result}


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m ops.preempt_controller", description=__doc__.split("\n")[0])
    p.add_argument("--config", default=None, help="pipeline config YAML (default: the project's)")
    p.add_argument("--interval", type=float, default=5.0)
    p.add_argument("--once", action="store_true")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    from ops.airflow_api import AirflowApi
    from ops.services import Services, admin_password

    cfg = load_config(args.config) if args.config else load_config()
    api = AirflowApi(Services(cfg).airflow_url, "admin", admin_password())
    while True:
        one_pass(cfg, api)
        if args.once:
            return 0
        time.sleep(args.interval)


if __name__ == "__main__":
    raise SystemExit(main())
