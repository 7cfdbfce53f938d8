"""Benchmark: distributed training on Banking77 (its own train/test split).

1. Throughput: ``--steps`` optimizer steps of MiniLM at batch 16 per process, max_length
   64, for 1 process and for 2 (torchrun, gloo), fp32 and bf16; samples/s from the
   trainer's metrics (evaluation time excluded); scaling efficiency = 2-process samples/s
   / (2 x 1-process samples/s) with the same number of threads in all (one per core).
2. Time to accuracy: MiniLM fine-tuned for ``--epochs`` with 2 processes; validation
   accuracy after each epoch (from history), test accuracy at the end, training wall time.

The curated folder is built from the bundled Banking77 CSVs: the official train split
(10% of it held out as validation, stratified) and the official test split.

    .venv/bin/python benchmarks/training.py [--epochs 3] [--steps 40]

Results go to ``benchmarks/results/training.json``; docs/BENCHMARKS.md quotes them.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from data_stages import write_results  # noqa: E402


def curated(out: Path) -> Path:
    from sklearn.model_selection import train_test_split

    from textnorm import normalize_label

    train = pd.read_csv(ROOT / "data" / "banking77" / "train.csv")
    test = pd.read_csv(ROOT / "data" / "banking77" / "test.csv")
    tr, va = train_test_split(train, test_size=0.1, stratify=train.category, random_state=0)
    frames = []
    for split, df in (("train", tr), ("val", va), ("test", test)):
        frames.append(pd.DataFrame({
            "record_id": [f"{split}-{i}" for i in range(len(df))], "text": df.text.to_numpy(),
            "label": df.category.map(normalize_label).to_numpy(), "weight": 1.0, "split": split}))
    folder = out / "curated"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    pd.concat(frames).to_parquet(folder / "part-0.parquet", index=False)
    return folder


def run(folder: Path, out: Path, nproc: int, hp: dict, env: dict) -> dict:
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    (out / "hp.json").write_text(json.dumps(hp))
    bin_dir = Path(sys.executable).parent
    cmd = [str(bin_dir / "torchrun"), "--standalone", "--nproc-per-node", str(nproc), "-m",
           "training.train", "--curated", str(folder), "--labels",
           str(ROOT / "data" / "banking77" / "categories.json"), "--out", str(out / "run"),
           "--config", str(out / "hp.json")]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.stderr.write(proc.stdout[-3000:] + proc.stderr[-3000:])
        raise SystemExit(f"training failed ({proc.returncode})")
    m = json.loads((out / "run" / "metrics.json").read_text())
    return {"nproc": nproc, "wall_s": round(wall, 1), "steps": m["steps"],
            "samples_per_s": round(m["train_samples_per_s"], 2),
            "train_seconds": round(m["train_seconds"], 1), "test_accuracy": m["test_accuracy"],
            "test_macro_f1": m["test_macro_f1"], "val_history": m.get("val_history"),
            "precision": m["precision"], "num_threads": m.get("num_threads")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--steps", type=int, default=40, help="steps per throughput run")
    ap.add_argument("--out", default="var/bench/training")
    ap.add_argument("--skip-accuracy", action="store_true")
    ap.add_argument("--results", default="benchmarks/results/training.json")
    args = ap.parse_args()
    out = (ROOT / args.out).resolve()
    folder = curated(out)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    env.pop("MLFLOW_TRACKING_URI", None)
    base = {"model": "minilm", "max_length": 64, "batch_size": 16, "lr": 1e-4, "warmup_ratio": 0.06,
            "checkpoint_every_steps": 10_000, "early_stopping_patience": None}
    cores = os.cpu_count() or 2
    results: dict = {"machine": {"cpus": cores, "mem_gb": round(psutil.virtual_memory().total / 2**30, 1),
                                 "python": platform.python_version(), "platform": platform.platform()},
                     "throughput": []}
    for precision in ("fp32", "bf16"):
        for nproc in (1, 2):
            hp = base | {"epochs": 1, "max_steps": args.steps, "precision": precision,
                         "num_threads": max(1, cores // nproc)}
            r = run(folder, out / f"tp-{precision}-{nproc}", nproc, hp, env)
            results["throughput"].append(r)
            print(json.dumps(r), flush=True)
    tp = {(r["precision"], r["nproc"]): r["samples_per_s"] for r in results["throughput"]}
    results["scaling_efficiency_fp32"] = round(tp[("fp32", 2)] / (2 * tp[("fp32", 1)]), 3)
    results["bf16_over_fp32_2proc"] = round(tp[("bf16", 2)] / tp[("fp32", 2)], 3)
    if not args.skip_accuracy:
        best = "bf16" if tp[("bf16", 2)] > tp[("fp32", 2)] else "fp32"
        hp = base | {"epochs": args.epochs, "precision": best, "early_stopping_patience": 2}
        results["accuracy_run"] = run(folder, out / "accuracy", 2, hp, env)
        results["accuracy_run"]["hparams"] = hp
        print(json.dumps(results["accuracy_run"]), flush=True)
    write_results(results, args.results)


if __name__ == "__main__":
    main()
