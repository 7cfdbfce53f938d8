"""The preemption controller's choice (pure) and its signalling of a real process."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from training.preempt import Job, Lease, choose_victim, preempt, read_leases, write_lease


def test_a_waiting_production_retrain_preempts_the_running_experiment() -> None:
    exp, prod = Job("experiment", 1, since=100.0), Job("retrain", 100, since=200.0)
    assert choose_victim([exp], [prod], slots=1) == exp


def test_no_preemption_without_need_or_rank() -> None:
    exp, prod = Job("experiment", 1, 100.0), Job("retrain", 100, 200.0)
    assert choose_victim([exp], [], slots=1) is None  # nobody waits
    assert choose_victim([exp], [prod], slots=2) is None  # a slot is free
    assert choose_victim([prod], [exp], slots=1) is None  # the waiter ranks lower
    assert choose_victim([Job("a", 5, 1.0)], [Job("b", 5, 2.0)], slots=1) is None  # equals


def test_the_victim_is_the_lowest_priority_then_the_newest() -> None:
    running = [Job("mid", 50, 1.0), Job("low-old", 1, 2.0), Job("low-new", 1, 9.0)]
    assert choose_victim(running, [Job("prod", 100, 10.0)], slots=3).run_id == "low-new"
    assert choose_victim(running, [Job("p", 20, 10.0)], slots=3).run_id == "low-new"
    assert choose_victim(running[:1], [Job("p", 20, 10.0)], slots=1) is None


def test_preempt_signals_a_real_process_and_escalates(tmp_path: Path) -> None:
    # A process that honours SIGTERM (writes the marker, exits 75) ...
    work = tmp_path / "work"
    work.mkdir()
    honours = subprocess.Popen([sys.executable, "-c", (
        "import signal, sys, time, pathlib\n"
        "def h(*_):\n"
        f"    pathlib.Path({str(work)!r}, 'preempted').write_text('{{}}'); sys.exit(75)\n"
        "signal.signal(signal.SIGTERM, h)\n"
        "print('ready', flush=True)\n"
        "time.sleep(60)\n")], stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert honours.stdout.readline().strip() == "ready"
    lease = Lease("run-a", 1, honours.pid, time.time(), str(work))
    write_lease(tmp_path, lease)
    assert read_leases(tmp_path) == [lease]
    r = preempt(lease, grace_seconds=30)
    assert r["checkpointed"] and not r["killed"]
    assert honours.wait(timeout=10) == 75
    assert read_leases(tmp_path) == []  # its lease is dropped once the process is gone
    # ... and one that ignores it is killed after the grace period.
    stubborn = subprocess.Popen([sys.executable, "-c", (
        "import signal, time\nsignal.signal(signal.SIGTERM, signal.SIG_IGN)\n"
        "print('ready', flush=True)\ntime.sleep(60)\n")], stdout=subprocess.PIPE, text=True,
        start_new_session=True)
    assert stubborn.stdout.readline().strip() == "ready"
    r = preempt(Lease("run-b", 1, stubborn.pid, time.time(), str(tmp_path / "none")), 1.0)
    assert r["killed"] and not r["checkpointed"]
    assert stubborn.wait(timeout=10) < 0


def test_controller_pass_preempts_the_running_experiment_for_a_waiting_retrain(tmp_path: Path) -> None:
    """One pass of the controller loop over a real lease (a live process that honours SIGTERM)
    and Airflow's answers for the pool and the waiting task instance (a stand-in object for
    the REST client: the controller's decision and signalling are what is tested here)."""
    from core.config import load_config
    from ops.preempt_controller import one_pass

    cfg = load_config(overrides={"lake_root": str(tmp_path / "lake"), "training.priority": 1,
                                 "training.preempt_grace_seconds": 30})
    work, proc = _trainer_that_checkpoints_on_sigterm(tmp_path)
    write_lease(cfg.lake, Lease("manual__experiment", 1, proc.pid, time.time(), str(work)))
    answers = {
        "/pools/intentops_training": {"slots": 1},
        "/dags/~/dagRuns/~/taskInstances": {"task_instances": [
            {"task_id": "train", "pool": "intentops_training", "dag_id": "intentops_pipeline",
             "dag_run_id": "manual__retrain", "state": "scheduled"}]},
        "/dags/intentops_pipeline/dagRuns/manual__retrain": {"conf": {"training_priority": 100}},
    }
    calls: list[str] = []

    def api(method: str, path: str, **kw: object) -> dict:
        calls.append(path)
        return answers[path]

    done = one_pass(cfg, api)
    assert done is not None and done["run_id"] == "manual__experiment" and done["checkpointed"]
    assert proc.wait(timeout=10) == 75
    # The next pass finds the slot taken by nobody: nothing more to preempt.
    assert one_pass(cfg, api) is None
    # An equal-priority waiter never preempts.
    answers["/dags/intentops_pipeline/dagRuns/manual__retrain"] = {"conf": {}}
    assert one_pass(cfg, api) is None


def test_controller_reads_every_datasets_leases_and_the_waiters_resolved_priority(tmp_path: Path) -> None:
    """An experiment of another dataset holds the pool; a pipeline run whose resolved config
    (not its conf) says priority 100 waits: the controller finds the lease under the other
    dataset's lake, preempts it and leaves an audit record."""
    from core import audit
    from core.config import load_config
    from core.runs import save_run_config
    from ops.preempt_controller import one_pass

    cfg = load_config(overrides={"lake_root": str(tmp_path / "lake"), "training.preempt_grace_seconds": 30},
                      env={})
    other = load_config(overrides={"lake_root": str(tmp_path / "lake"), "dataset": "tickets"}, env={})
    save_run_config(load_config(overrides={"lake_root": str(tmp_path / "lake"), "training.priority": 100},
                                env={}), "manual__retrain")
    work, proc = _trainer_that_checkpoints_on_sigterm(tmp_path)
    write_lease(other.lake, Lease("manual__exp", 0, proc.pid, time.time(), str(work)))
    answers = {
        "/pools/intentops_training": {"slots": 1},
        "/dags/~/dagRuns/~/taskInstances": {"task_instances": [
            {"task_id": "train", "pool": "intentops_training", "dag_id": "intentops_pipeline",
             "dag_run_id": "manual__retrain", "state": "queued"}]},
    }
    done = one_pass(cfg, lambda method, path, **kw: answers[path])  # never asks for the conf
    assert done is not None and done["run_id"] == "manual__exp" and done["checkpointed"]
    assert proc.wait(timeout=10) == 75
    rec = [r for r in audit.read(action="training.preempt") if r["target"] == "manual__exp"][-1]
    assert rec["actor"] == "preempt-controller" and "gave way to a waiting training at 100" in rec["reason"]


def test_a_training_preempted_while_starting_is_rescheduled_not_failed(tmp_path: Path) -> None:
    """SIGTERM before the trainer's handler is installed (the group still starting): no
    checkpoint marker, the launcher simply dies; the controller's request marks it as a
    preemption, so the task reschedules (no retry used) instead of failing."""
    import threading

    import pytest

    from core.stage import StagePreempted
    from training.preempt import REQUESTED
    from training.task import launch_preemptible

    lake, work = tmp_path / "lake", tmp_path / "work"
    work.mkdir()
    (work / REQUESTED).write_text("{}")  # a stale request of an earlier attempt is cleared

    def controller() -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not read_leases(lake):
            time.sleep(0.05)
        preempt(read_leases(lake)[0], 10.0)

    t = threading.Thread(target=controller)
    t.start()
    with pytest.raises(StagePreempted, match="without a checkpoint"):
        launch_preemptible([sys.executable, "-c", "import time; time.sleep(60)"], {}, lake, "manual__x", 0, work)
    t.join()
    assert read_leases(lake) == []
    # A failure nobody asked for stays a failure (a retry).
    from core.stage import StageError

    with pytest.raises(StageError, match="exited with 3") as err:
        launch_preemptible([sys.executable, "-c", "raise SystemExit(3)"], {}, lake, "manual__y", 0, work)
    assert not isinstance(err.value, StagePreempted)


def _trainer_that_checkpoints_on_sigterm(tmp_path: Path) -> tuple[Path, subprocess.Popen]:
    """A live process that honours SIGTERM as the trainer does: the ``preempted`` marker in
    its work folder, exit 75."""
    work = tmp_path / "work"
    work.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", (
        "import signal, sys, time, pathlib\n"
        "def h(*_):\n"
        f"    pathlib.Path({str(work)!r}, 'preempted').write_text('{{}}'); sys.exit(75)\n"
        "signal.signal(signal.SIGTERM, h)\nprint('ready', flush=True)\ntime.sleep(60)\n")],
        stdout=subprocess.PIPE, text=True, start_new_session=True)
    assert proc.stdout.readline().strip() == "ready"
    return work, proc
