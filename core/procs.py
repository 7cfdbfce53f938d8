"""Records of the long-running processes the project starts (services, model servers,
router) and the one test of whether such a process still runs.

A record holds the pid and the process's start time as the kernel reports it. A pid alone
is not enough: pids are reused (they wrap at 32768 on small hosts). The start time is read
once, from ``/proc/<pid>/stat``; the process's command line is not used, because reading
``/proc/<pid>/cmdline`` under heavy load once came back without the module name and a live
server was taken for dead (and restarted beside itself)."""

from __future__ import annotations

from typing import Any

# psutil's start time is the boot time plus the process's start ticks, and the boot time
# is /proc/stat's `btime`: whole seconds the kernel derives from the wall clock at each
# read, so a clock slewed or stepped since the record was written moves it by a second or
# more, and a 1 s tolerance took a live process for another (after an e2e module, `deploy
# stop` left a router and a server running: the suspected cause, not proven). A reused pid
# cannot start within seconds of the recorded start (the pid space would have to wrap).
_START_TOLERANCE_S = 5.0


def start_time(pid: int) -> float:
    import psutil

    return psutil.Process(pid).create_time()


def alive(rec: dict[str, Any] | None) -> bool:
    """The recorded process runs (not a zombie) and is the one recorded (same start time).
    Records written before start times were kept fall back to the module in the command line."""
    if not rec:
        return False
    import psutil

    try:
        p = psutil.Process(rec["pid"])
        if p.status() == psutil.STATUS_ZOMBIE:
            return False
        if "create_time" in rec:
            return abs(p.create_time() - rec["create_time"]) < _START_TOLERANCE_S
        return rec.get("module", "\0") in " ".join(p.cmdline())
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return False
