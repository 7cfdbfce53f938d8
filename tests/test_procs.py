"""core.procs: whether a recorded process still runs, with real child processes."""

from __future__ import annotations

import subprocess
import sys
import time

from core import procs


def _child() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])


def test_a_running_child_is_alive_and_a_reaped_one_is_not():
    p = _child()
    rec = {"pid": p.pid, "create_time": procs.start_time(p.pid)}
    try:
        assert procs.alive(rec)
    finally:
        p.kill()
    p.wait()
    assert not procs.alive(rec)


def test_an_exited_unreaped_child_is_not_alive():
    import os
    import time

    import psutil

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    rec = {"pid": p.pid, "create_time": procs.start_time(p.pid)}
    # Wait for the exit without reaping (WNOWAIT): the pid stays, as a zombie.
    os.waitid(os.P_PID, p.pid, os.WEXITED | os.WNOWAIT)
    deadline = time.monotonic() + 10
    while psutil.Process(p.pid).status() != psutil.STATUS_ZOMBIE and time.monotonic() < deadline:
        time.sleep(0.01)
    assert psutil.pid_exists(p.pid)
    assert not procs.alive(rec)
    p.wait()


def test_a_reused_pid_is_not_the_recorded_process():
    p = _child()
    try:
        # The same pid with another start time: what a record looks like after pid reuse.
        assert not procs.alive({"pid": p.pid, "create_time": procs.start_time(p.pid) - 3600})
        assert not procs.alive(None) and not procs.alive({})
    finally:
        p.kill()
        p.wait()


def test_records_without_a_start_time_fall_back_to_the_module_name():
    import psutil

    p = _child()
    try:
        # Until the child has exec'd, /proc shows the parent's command line (a busy host
        # once caught it there).
        deadline = time.time() + 10
        while time.time() < deadline and "time.sleep" not in " ".join(psutil.Process(p.pid).cmdline()):
            time.sleep(0.01)
        assert procs.alive({"pid": p.pid, "module": "time.sleep"})
        assert not procs.alive({"pid": p.pid, "module": "deploy.server"})
    finally:
        p.kill()
        p.wait()
