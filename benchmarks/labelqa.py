"""Benchmark: label QA on builder data with 5% and 10% planted label errors.

For each noise level: build 100,000 rows, run the data stages (clean, dedup, desensitize,
validate) as the CLI runs them, then the label-QA stage ``--repeats`` times as its own
process (its output removed between repeats, so each is a full run, not a cache hit).
Reported: wall time and peak resident memory of the label-QA process (median), the
relabel queue's precision and recall against the ground truth, exported-label error
detection, and the accuracy of the consensus and curated labels
(``demo.groundtruth.labelqa_scores`` documents each figure).

    .venv/bin/python benchmarks/labelqa.py [--rows 100000] [--rates 0.05 0.10] [--repeats 3]

Results go to ``benchmarks/results/labelqa.json``; docs/BENCHMARKS.md quotes them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from data_stages import run_measured, write_results  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--rates", type=float, nargs="+", default=[0.05, 0.10])
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", default="var/bench")
    ap.add_argument("--reuse", action="store_true", help="reuse builds and data stages already there")
    ap.add_argument("--results", default="benchmarks/results/labelqa.json")
    args = ap.parse_args()

    from demo.groundtruth import labelqa_scores

    bin_dir = Path(sys.executable).parent
    env = dict(os.environ, PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
               PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    cli = [str(bin_dir / "intentops")]
    results: dict[str, object] = {
        "rows": args.rows,
        "machine": {"cpus": os.cpu_count(), "mem_gb": round(psutil.virtual_memory().total / 2**30, 1),
                    "python": platform.python_version(), "platform": platform.platform()},
        "levels": {},
    }
    for rate in args.rates:
        tag = f"{round(rate * 100):02d}"
        raw = (ROOT / args.out / f"lq-{tag}").resolve()
        lake = (ROOT / args.out / f"lqlake-{tag}").resolve()
        sets = ["--set", f"input.path={raw / 'raw.parquet'}", "--set", f"lake_root={lake}"]
        run_id = "lq"
        if not (args.reuse and (lake / "banking77" / "runs" / run_id / "validate.json").exists()):
            shutil.rmtree(lake, ignore_errors=True)
            run_measured([*cli, "build-raw", "--out", str(raw), "--rows", str(args.rows), "--seed",
                          str(args.seed), "--format", "parquet", "--label-error-rate", str(rate)], env)
            for name in ("clean", "dedup", "desensitize", "validate"):
                run_measured([*cli, name, *sets, "--run-id", run_id], env)
        runs = []
        for _ in range(args.repeats):
            shutil.rmtree(lake / "banking77" / "labelqa", ignore_errors=True)
            # The gate is not under test here (alpha falls with the noise level on purpose).
            res = run_measured([*cli, "labelqa", *sets, "--set", "labelqa.min_alpha=-1",
                                "--run-id", run_id], env)
            res.pop("stdout")
            runs.append(res)
        # <lake_root>/<dataset>/runs/...
        pointer = json.loads((lake / "banking77" / "runs" / run_id / "labelqa.json").read_text())
        scores = labelqa_scores(raw / "ground_truth", pointer["path"])
        results["levels"][str(rate)] = {
            "wall_s_median": statistics.median(r["wall_s"] for r in runs),
            "wall_s_all": [r["wall_s"] for r in runs],
            "stage_s": pointer["manifest"]["timings"]["seconds"],
            "peak_rss_mb_median": statistics.median(r["peak_rss_mb"] for r in runs),
            "items": scores["items"],
            "scores": scores,
            "krippendorff_alpha": pointer["manifest"]["stats"]["krippendorff_alpha"],
        }
    write_results(results, args.results)


if __name__ == "__main__":
    main()
