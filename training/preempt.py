"""Preemption: which running training gives way to a waiting one, and how it is told.

Airflow never preempts a running task: pools only decide which *waiting* task gets a free
slot. The project's controller (``ops/preempt_controller.py``, a loop or one pass) closes
the gap: when a training of higher ``training.priority`` waits for the training pool and
no slot is free, the running training of the lowest priority below it is sent SIGTERM (as a
spot-instance notice would be). The trainer (``training/train.py``) checkpoints at the next
optimizer step and exits as preempted; its task (``training/task.py``) raises
``StagePreempted`` and the DAG turns that into ``AirflowRescheduleException``: the task
instance goes to ``up_for_reschedule`` (no retry used up, the pool slot freed) and resumes
from the checkpoint when the scheduler picks it again.

The choice is the pure function ``choose_victim``; ``Lease`` files (one per running
training, written by the train task under ``<lake>/train/.running/``) say which process to
signal and at what priority it runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from dataclasses import asdict, dataclass
from pathlib import Path

REQUESTED = "preempt-requested"  # written into the work folder by ``preempt``


@dataclass(frozen=True)
class Job:
    """A training, running or waiting for the pool."""

    run_id: str
    priority: int
    since: float = 0.0  # when it started running / began to wait (epoch seconds)


def choose_victim(running: list[Job], waiting: list[Job], slots: int) -> Job | None:
    """The running training to preempt, or None.

    Only when a waiting training finds no free slot and outranks a running one: the victim is
    the lowest-priority running training, the most recently started among equals (it has the
    least work since its start to redo at worst; the checkpoint makes that little anyway).
    Equal priorities never preempt each other, so two experiments cannot ping-pong."""
    if not waiting or len(running) < slots:
        return None
    top = max(w.priority for w in waiting)
    below = [r for r in running if r.priority < top]
    if not below:
        return None
    return min(below, key=lambda r: (r.priority, -r.since))


@dataclass(frozen=True)
class Lease:
    """What the train task records while its torchrun launcher runs."""

    run_id: str
    priority: int
    pid: int  # the torchrun launcher (or the single training process)
    since: float
    work_dir: str

    def job(self) -> Job:
        return Job(self.run_id, self.priority, self.since)


def lease_dir(lake: Path) -> Path:
    return Path(lake) / "train" / ".running"


def write_lease(lake: Path, lease: Lease) -> Path:
    folder = lease_dir(lake)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{lease.run_id.replace('/', '_').replace(':', '_')}.json"
    tmp = path.with_name(f".tmp-{path.name}")
    tmp.write_text(json.dumps(asdict(lease)))
    os.replace(tmp, path)
    return path


def read_leases(lake: Path) -> list[Lease]:
    """The leases whose process is still alive (a lease of a dead process is removed)."""
    out = []
    folder = lease_dir(lake)
    for p in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            lease = Lease(**json.loads(p.read_text()))
        except (OSError, ValueError, TypeError):
            continue
        if _alive(lease.pid) and not _zombie(lease.pid):
            out.append(lease)
        else:
            p.unlink(missing_ok=True)
    return out


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def preempt(lease: Lease, grace_seconds: float, poll: float = 0.1) -> dict[str, float | bool]:
    """SIGTERM the lease's launcher; SIGKILL its process group after ``grace_seconds`` if it
    is still alive. Returns how long it took and whether the checkpoint marker appeared."""
    t0 = time.monotonic()
    # Said before the signal: a training stopped before it could checkpoint (still starting)
    # is preempted too, not failed (its task is rescheduled, no retry used).
    with contextlib.suppress(OSError):
        Path(lease.work_dir, REQUESTED).write_text(json.dumps({"at": time.time(), "priority": lease.priority}))
    try:
        os.kill(lease.pid, signal.SIGTERM)
    except ProcessLookupError:
        return {"seconds": 0.0, "killed": False, "checkpointed": False}
    killed = False
    while _alive(lease.pid) and not _zombie(lease.pid):
        if time.monotonic() - t0 > grace_seconds:
            try:
                os.killpg(lease.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                os.kill(lease.pid, signal.SIGKILL)
            killed = True
            break
        time.sleep(poll)
    return {"seconds": time.monotonic() - t0, "killed": killed,
            "checkpointed": (Path(lease.work_dir) / "preempted").exists()}


def _zombie(pid: int) -> bool:
    """Exited but not yet reaped by its parent: gone, as far as its resources go."""
    import psutil

    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True
