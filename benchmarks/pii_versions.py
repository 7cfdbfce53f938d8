"""Benchmark: the PII detector of two checkouts side by side, on the same texts.

Each checkout's ``pii.redact`` runs in its own worker process (two versions of one package
cannot share a process); the parent tells them in turn to time one whole pass over the
texts, ``--repeats`` times, so that drift on a shared machine hits both alike. Medians per
text and the ratio (old / new: above 1, the new one is faster). Texts: the builder rows
(the issue-3 workload; 20,000 rows, seed 11, Banking77 *test* messages), Banking77's test
messages, and the held-back presidio-evaluator sentences.

    git worktree add ../pii-old <commit>
    .venv/bin/python benchmarks/pii_versions.py --old ../pii-old [--repeats 5] \\
        [--results benchmarks/results/pii_versions.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

WORKLOADS = ("builder", "banking77-test", "presidio-heldback")


def _texts(name: str) -> list[str]:
    from pii import evaluation as E

    if name == "builder":
        from pii_eval import builder_set

        return [s.text for s in builder_set(20000, 11)]
    if name == "banking77-test":
        return E.load_banking77("test")
    return [s.text for s in E.load_presidio(E.EVAL_DIR / "presidio_heldback.jsonl")]


def worker(checkout: str) -> None:
    """Run in a checkout: load it, warm up on every workload, then per line on stdin (a
    workload's name) time one pass over it and print the seconds."""
    sys.path.insert(0, checkout)
    from pii import detector as pii  # the checkout's, on the path above

    assert Path(pii.__file__).resolve().is_relative_to(Path(checkout).resolve()), pii.__file__
    texts = {name: _texts(name) for name in WORKLOADS}
    for ts in texts.values():
        for t in ts:
            pii.redact(t)
    print("ready", flush=True)
    for line in sys.stdin:
        ts = texts[line.strip()]
        t0 = time.perf_counter()
        for t in ts:
            pii.redact(t)
        print(time.perf_counter() - t0, flush=True)


def main() -> None:
    from data_stages import cpu_model

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--old", required=True, help="the other checkout (a git worktree)")
    ap.add_argument("--new", default=str(ROOT))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--results", default="benchmarks/results/pii_versions.json")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.worker)
        return

    def commit(path: str) -> str:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=path, check=True,
                              capture_output=True, text=True).stdout.strip()

    procs = {}
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    for label, path in (("old", args.old), ("new", args.new)):
        procs[label] = subprocess.Popen(
            [sys.executable, __file__, "--old", "-", "--worker", path], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, text=True, cwd=path, env=env)
        assert procs[label].stdout.readline().strip() == "ready"
    n = {name: len(_texts(name)) for name in WORKLOADS}
    speed = {}
    for name in WORKLOADS:
        runs: dict[str, list[float]] = {"old": [], "new": []}
        for _ in range(args.repeats):
            for label, p in procs.items():
                p.stdin.write(name + "\n")
                p.stdin.flush()
                runs[label].append(float(p.stdout.readline()))
        mo, mn = statistics.median(runs["old"]), statistics.median(runs["new"])
        speed[name] = {"texts": n[name], "old_us_per_text": round(1e6 * mo / n[name], 1),
                       "new_us_per_text": round(1e6 * mn / n[name], 1),
                       "old_over_new": round(mo / mn, 2),
                       "old_s": [round(x, 3) for x in runs["old"]],
                       "new_s": [round(x, 3) for x in runs["new"]]}  # fmt: skip
        print(name, speed[name], flush=True)
    for p in procs.values():
        p.stdin.close()
        p.wait(timeout=60)
    result = {
        "date": date.today().isoformat(),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform(), "processor": cpu_model()},
        "old": commit(args.old), "new": commit(args.new), "repeats": args.repeats,
        "speed": speed,
    }  # fmt: skip
    dest = ROOT / args.results
    dest.write_text(json.dumps(result, indent=1))
    print("wrote", dest)


if __name__ == "__main__":
    main()
