"""Summarize a test-suite run for docs/BENCHMARKS.md: its wall time, test count and the
test time per module (setup, call and teardown, summed over both pytest-xdist workers),
from the JUnit report pytest writes.

    PYTEST_ADDOPTS="--junitxml=/tmp/suite.xml" .ci/run     # note the wall time it prints
    .venv/bin/python benchmarks/suite_time.py /tmp/suite.xml --wall-seconds 2726 \
        --commit 0b81dbb --label "C1 JVM, declared requirements" [--results ...]

Each run is added to ``benchmarks/results/suite_time.json`` (a list, newest last).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import xml.etree.ElementTree as ET
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def summarize(junit: Path) -> dict:
    tree = ET.parse(junit)
    per_module: dict[str, float] = defaultdict(float)
    outcomes: dict[str, int] = defaultdict(int)
    for case in tree.iter("testcase"):
        per_module[case.get("classname", "").split(".")[-1]] += float(case.get("time", 0))
        kinds = {child.tag for child in case}
        outcomes["failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed"] += 1
    total = sum(per_module.values())
    return {
        "tests": dict(outcomes),
        "test_minutes": round(total / 60, 1),
        "module_minutes": {m: round(s / 60, 1) for m, s in sorted(per_module.items(), key=lambda x: -x[1])
                           if s >= 30},
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("junit", type=Path)
    ap.add_argument("--wall-seconds", type=float, required=True)
    ap.add_argument("--commit", required=True)
    ap.add_argument("--label", default="")
    ap.add_argument("--host-note", default="", help="e.g. what else ran on the host")
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results" / "suite_time.json")
    args = ap.parse_args()
    run = {
        "date": dt.date.today().isoformat(),
        "commit": args.commit,
        "label": args.label,
        "command": ".ci/run (make test: pytest -n 2 --dist loadfile)",
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "wall_minutes": round(args.wall_seconds / 60, 1),
        "host_note": args.host_note,
        **summarize(args.junit),
    }
    runs = json.loads(args.results.read_text()) if args.results.exists() else []
    runs.append(run)
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(runs, indent=2) + "\n")
    print(json.dumps(run, indent=2))


if __name__ == "__main__":
    main()
