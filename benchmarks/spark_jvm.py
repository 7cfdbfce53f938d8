"""Benchmark: the CPU and wall time of the Spark stages (clean, dedup, desensitize) as one
spark-submit each, for each of several JVM option sets (``spark.java_options``), side by
side: the option sets take turns within every repeat, on the same raw-data builder export.

At the sizes of a daily increment or a test run (thousands of rows) a spark-submit is
mostly fixed cost: the JVM starting, Spark planning and compiling, Python workers starting.
CPU is the user+system time of the whole process tree (JVM, Python driver and workers), as
``/usr/bin/time`` reports it.

    .venv/bin/python benchmarks/spark_jvm.py [--rows 3000] [--repeats 3] \
        [--options "" "-XX:TieredStopAtLevel=1"]

Results go to ``benchmarks/results/spark_jvm.json``; docs/BENCHMARKS.md quotes them.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
STAGES = ("clean", "dedup", "desensitize")


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def run_stages(raw: Path, lake: Path, options: str, env: dict[str, str]) -> dict[str, dict[str, float]]:
    """clean, dedup and desensitize on ``raw`` into a fresh ``lake``: wall and CPU seconds each."""
    shutil.rmtree(lake, ignore_errors=True)
    out = {}
    for name in STAGES:
        cmd = ["spark-submit", "--master", "local[2]"]
        if options:
            cmd += ["--conf", f"spark.driver.extraJavaOptions={options}"]
        cmd += [str(ROOT / "jobs" / "spark" / f"{name}.py"), "--set", f"input.path={raw}",
                "--set", f"lake_root={lake}", "--set", "spark.shuffle_partitions=2", "--run-id", "bench"]
        cpu, start = _children_cpu(), time.perf_counter()
        proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
        if proc.returncode:
            raise SystemExit(f"{name} failed:\n{proc.stderr[-3000:]}")
        out[name] = {"wall_seconds": round(time.perf_counter() - start, 2),
                     "cpu_seconds": round(_children_cpu() - cpu, 2)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=3000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--options", nargs="+", default=["", "-XX:TieredStopAtLevel=1"],
                    help="JVM option sets to compare ('' is Spark's default)")
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results" / "spark_jvm.json")
    args = ap.parse_args()

    bin_dir = str(Path(sys.executable).parent)
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}",
               PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1", PYTHONPATH=str(ROOT))
    env = {k: v for k, v in env.items() if not k.startswith("INTENTOPS__")}
    with tempfile.TemporaryDirectory(prefix="spark-jvm-") as tmp:
        raw = Path(tmp) / "raw"
        subprocess.run([sys.executable, "-m", "demo.builder", "--out", str(raw), "--rows", str(args.rows),
                        "--seed", "5", "--format", "csv"], env=env, cwd=ROOT, check=True,
                       capture_output=True)
        runs: dict[str, list[dict]] = {o: [] for o in args.options}
        for rep in range(args.repeats):
            order = args.options if rep % 2 == 0 else list(reversed(args.options))
            for options in order:
                runs[options].append(run_stages(raw / "raw.csv", Path(tmp) / "lake", options, env))
                print(rep, repr(options), runs[options][-1], flush=True)

    def median(options: str, stage: str | None, key: str) -> float:
        vals = [sum(r[s][key] for s in STAGES) if stage is None else r[stage][key] for r in runs[options]]
        return round(statistics.median(vals), 2)

    base = args.options[0]
    summary = {}
    for options in args.options:
        summary[options or "(default)"] = {
            **{f"{s}_{k}": median(options, s, k) for s in STAGES for k in ("wall_seconds", "cpu_seconds")},
            "total_wall_seconds": median(options, None, "wall_seconds"),
            "total_cpu_seconds": median(options, None, "cpu_seconds"),
            "cpu_ratio_to_first": round(median(options, None, "cpu_seconds") / median(base, None, "cpu_seconds"), 3),
            "wall_ratio_to_first": round(median(options, None, "wall_seconds") / median(base, None, "wall_seconds"), 3),
        }
    result = {
        "benchmark": "spark_jvm",
        "command": "benchmarks/spark_jvm.py " + " ".join(
            [f"--rows {args.rows}", f"--repeats {args.repeats}", "--options", *(repr(o) for o in args.options)]),
        "date": dt.date.today().isoformat(),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "rows": args.rows,
        "master": "local[2]",
        "medians": summary,
        "runs": {o or "(default)": r for o, r in runs.items()},
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
