"""Benchmark: the raw-data builder at 1,000,000 rows, then clean and dedup on it.

Each step runs as its own process, the stages through ``spark-submit`` exactly as the DAG
runs them (local[*]). Reported per step: wall time, rows/s, and peak resident memory of
the whole process tree (JVM and Python workers), sampled every 0.2 s. Then the stages are
scored against the builder's ground truth.

    .venv/bin/python benchmarks/data_stages.py [--rows 1000000] [--out var/bench]

``--baseline DIR`` runs the same stages from another checkout (``git worktree add DIR
<commit>``) in the same repeats, alternating which goes first, and reports both medians
and their ratio: how a refactor is shown to cost nothing.

Results go to ``benchmarks/results/data_stages.json``; docs/BENCHMARKS.md quotes them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def run_measured(cmd: list[str], env: dict[str, str]) -> dict[str, float]:
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    parent = psutil.Process(proc.pid)
    peak = 0
    output: list[str] = []
    while proc.poll() is None:
        try:
            procs = [parent, *parent.children(recursive=True)]
            peak = max(peak, sum(p.memory_info().rss for p in procs if p.is_running()))
        except psutil.Error:
            pass
        time.sleep(0.2)
    output.append(proc.stdout.read())
    if proc.returncode != 0:
        sys.stderr.write("".join(output)[-5000:])
        raise SystemExit(f"{cmd[:3]} failed with {proc.returncode}")
    return {"wall_s": round(time.perf_counter() - start, 2), "peak_rss_mb": round(peak / 2**20, 1),
            "stdout": "".join(output)}


def cpu_model() -> str:
    """The processor's model name, for the machine line of a results file."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def write_results(results: dict, dest: str | Path) -> None:
    """Write and print a benchmark's results; paths of this machine stay out of them."""
    text = json.dumps(results, indent=2, default=str).replace(str(ROOT), ".")
    dest = ROOT / dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(text)
    print(text)


def _same_outputs(a: Path, b: Path) -> bool:
    """Two stage outputs hold the same rows (every parquet folder, sorted by record)."""
    import pandas as pd

    folders = sorted(p.name for p in a.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))
    for sub in folders:
        x, y = pd.read_parquet(a / sub), pd.read_parquet(b / sub)
        key = [c for c in ("record_id", "cluster_id") if c in x.columns][:1] or [x.columns[0]]
        x = x.sort_values(key).reset_index(drop=True).astype(str)
        y = y.sort_values(key).reset_index(drop=True).astype(str)
        if list(x.columns) != list(y.columns) or not x.equals(y):
            return False
    return True


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--seed", type=int, default=11)
    ap.add_argument("--out", default="var/bench")
    ap.add_argument("--driver-memory", default="6g")
    ap.add_argument("--repeats", type=int, default=3, help="runs of the stages; medians reported")
    ap.add_argument("--stages", nargs="+", default=["clean", "dedup", "desensitize"])
    ap.add_argument("--reuse-raw", action="store_true", help="skip the build if raw.csv exists")
    ap.add_argument("--results", default="benchmarks/results/data_stages.json")
    ap.add_argument("--baseline", help="another checkout whose jobs run in the same repeats")
    args = ap.parse_args()

    out = (ROOT / args.out).resolve()
    raw_dir = out / f"raw-{args.rows}"
    lake = out / "lake"
    bin_dir = Path(sys.executable).parent
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
               PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1",
               INTENTOPS__LAKE_ROOT=str(lake))
    run_id = f"bench-{args.rows}-{int(time.time())}"
    results: dict[str, object] = {
        "rows": args.rows,
        "machine": {"cpus": os.cpu_count(), "mem_gb": round(psutil.virtual_memory().total / 2**30, 1),
                    "python": platform.python_version(), "platform": platform.platform()},
    }

    if args.reuse_raw and (raw_dir / "raw.csv").exists():
        build = {"wall_s": None, "peak_rss_mb": None, "stdout": "", "reused": True}
    else:
        build = run_measured([sys.executable, "-m", "demo.builder", "--out", str(raw_dir), "--rows",
                          str(args.rows), "--seed", str(args.seed), "--format", "csv"], env)
    build.pop("stdout")
    results["build"] = build | {"rows_per_s": round(args.rows / build["wall_s"]) if build["wall_s"] else None}

    import shutil
    import statistics

    def run_stages(tree: Path, lake_rep: Path, tree_env: dict[str, str]) -> dict[str, dict]:
        shutil.rmtree(lake_rep, ignore_errors=True)
        sets = ["--set", f"input.path={raw_dir / 'raw.csv'}", "--set", f"lake_root={lake_rep}"]
        rep_res: dict[str, dict] = {}
        for name in args.stages:
            cmd = ["spark-submit", "--master", "local[*]", "--driver-memory", args.driver_memory,
                   str(tree / "jobs" / "spark" / f"{name}.py"), *sets, "--run-id", run_id]
            res = run_measured(cmd, tree_env)
            res.pop("stdout")
            # <lake_root>/<dataset>/runs/ (a baseline checkout from before datasets: <lake_root>/runs/)
            found = sorted(lake_rep.glob(f"*/runs/{run_id}/{name}.json")) or [lake_rep / "runs" / run_id / f"{name}.json"]
            pointer = json.loads(found[0].read_text())
            stats = pointer["manifest"]["stats"]
            rep_res[name] = res | {
                "stage_s": pointer["manifest"]["timings"]["seconds"],
                "cache_hit": pointer["cache_hit"],
                "rows_in": stats["rows_in"],
                "stats": stats,
                "path": pointer["path"],
            }
        return rep_res

    runs: list[dict[str, dict]] = []
    base_runs: list[dict[str, dict]] = []
    base = Path(args.baseline).resolve() if args.baseline else None
    # The baseline's own modules first on the path (its Spark jobs and their Python workers).
    base_env = dict(env, PYTHONPATH=str(base)) if base else None
    for rep in range(args.repeats):
        # A fresh lake per repeat: otherwise the second repeat is (correctly) a cache hit.
        order = [("current", ROOT, env), ("baseline", base, base_env)] if base else [("current", ROOT, env)]
        for which, tree, tree_env in (order if rep % 2 == 0 else order[::-1]):
            res = run_stages(tree, lake / f"{which}-rep{rep}", tree_env)
            (runs if which == "current" else base_runs).append(res)

    if base_runs:
        results["baseline"] = {name: {"wall_s_median": statistics.median(r[name]["wall_s"] for r in base_runs),
                                      "wall_s_all": [r[name]["wall_s"] for r in base_runs]}
                               for name in args.stages}
        results["current_over_baseline"] = {
            name: round(statistics.median(r[name]["wall_s"] for r in runs)
                        / results["baseline"][name]["wall_s_median"], 3) for name in args.stages}
        results["outputs_identical"] = {
            name: _same_outputs(Path(runs[-1][name]["path"]), Path(base_runs[-1][name]["path"]))
            for name in args.stages}

    for name in args.stages:
        walls = [r[name]["wall_s"] for r in runs]
        last = runs[-1][name]
        results[name] = {
            "wall_s_median": statistics.median(walls),
            "wall_s_all": walls,
            "peak_rss_mb_median": statistics.median(r[name]["peak_rss_mb"] for r in runs),
            "rows_in": last["rows_in"],
            "rows_per_s": round(last["rows_in"] / statistics.median(walls)),
            "stats": last["stats"],
        }
    if {"clean", "dedup"} <= set(args.stages):
        from demo.groundtruth import evaluate

        c, d = runs[-1]["clean"], runs[-1]["dedup"]
        results["quality"] = evaluate(raw_dir / "ground_truth", c["path"], d["path"],
                                      d["stats"].get("threshold", 0.8))
        results["clean_plus_dedup_wall_s_median"] = statistics.median(
            r["clean"]["wall_s"] + r["dedup"]["wall_s"] for r in runs)
    write_results(results, args.results)


if __name__ == "__main__":
    main()
