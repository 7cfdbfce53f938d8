"""Facts about the machine a process runs on (standard library only: the serving image
carries this file)."""

from __future__ import annotations

from pathlib import Path


def memory_limit_bytes() -> int:
    """The cgroup v2 memory limit when one is set, else the machine's memory (MemTotal)."""
    try:
        raw = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if raw.isdigit():
            return int(raw)
    except OSError:
        pass
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) * 1024
    raise OSError("no MemTotal in /proc/meminfo")
