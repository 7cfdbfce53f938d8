"""Benchmark: the CPU an idle service stack takes, per process.

Samples the user+system CPU time (``/proc/<pid>/stat``) of every process whose environment
holds ``--marker`` (for the stack ``intentops up`` started: its ``INTENTOPS_SERVICES_ROOT``,
which every service it starts inherits) twice, ``--seconds`` apart, and prints each
process's CPU seconds in between, most first, and the total as a share of one core.

    INTENTOPS_SERVICES_ROOT=<dir> ... .venv/bin/intentops up
    sleep 60   # let start-up settle
    .venv/bin/python benchmarks/idle_stack.py --marker <dir> --seconds 180

Linux only (reads /proc). The 2026-12-07 figure (raw ``results/idle_stack_cpu.txt``) is
quoted in docs/BENCHMARKS.md ("The test suite's time").
"""

from __future__ import annotations

import argparse
import os
import time


def snapshot(marker: bytes) -> dict[str, tuple[int, str]]:
    out = {}
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                if marker not in f.read():
                    continue
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace")[:110]
        except OSError:  # gone, or not ours to read
            continue
        out[pid] = (int(fields[11]) + int(fields[12]), cmd)  # utime + stime, in ticks
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--marker", required=True, help="a string in the environment of the processes to sample")
    ap.add_argument("--seconds", type=float, default=180)
    args = ap.parse_args()
    hz = os.sysconf("SC_CLK_TCK")
    before = snapshot(args.marker.encode())
    t0 = time.monotonic()
    time.sleep(args.seconds)
    after = snapshot(args.marker.encode())
    elapsed = time.monotonic() - t0
    rows = sorted(((ticks - before.get(pid, (0, ""))[0]) / hz, pid, cmd) for pid, (ticks, cmd) in after.items())
    total = sum(r[0] for r in rows)
    print(f"elapsed {elapsed:.0f}s total cpu {total:.1f}s = {total / elapsed * 100:.1f}% of one core; procs {len(rows)}")
    for cpu, pid, cmd in reversed(rows):
        print(f"{cpu:7.1f} {pid:>7} {cmd}")


if __name__ == "__main__":
    main()
