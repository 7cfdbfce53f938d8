"""Benchmark: the demo's default model on Banking77's untouched official test split.

The raw export is built from Banking77's official train.csv only (the builder's
``--source train``: 20,000 rows, seed 7, like ``make demo``), run through the pipeline's
stages in-process (clean ... train, ``intentops run --through train``, default config:
MiniLM, the training budget of ``configs/pipeline.yaml``), and the trained model is scored
on the official test.csv, which no stage, rule or threshold has seen. Test messages that
also occur in train.csv (after text normalization) are left out of the score and counted.
``--epochs 2 3`` retrains with more epochs on the same curated data (a cache hit up to
label QA) and reports those too, each with its training wall time.

    .venv/bin/python benchmarks/banking77_accuracy.py [--epochs 1 2 3]

Results go to ``benchmarks/results/banking77_accuracy.json``; docs/BENCHMARKS.md quotes them.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from data_stages import cpu_model, write_results  # noqa: E402


def official_test(train_texts: set[str]) -> tuple[pd.DataFrame, int]:
    from textnorm import normalize_label, normalize_text

    test = pd.read_csv(ROOT / "data" / "banking77" / "test.csv")
    test["label"] = test.category.map(normalize_label)
    seen = test.text.map(normalize_text).isin(train_texts)
    return test[~seen].reset_index(drop=True), int(seen.sum())


def score(model_dir: Path, test: pd.DataFrame) -> dict[str, float]:
    from sklearn.metrics import f1_score

    from training.predictor import Predictor

    predictor = Predictor(model_dir)
    pred = predictor.labels_of(test.text.tolist())
    acc = float((pd.Series(pred) == test.label).mean())
    return {"accuracy": round(acc, 4),
            "macro_f1": round(float(f1_score(test.label, pred, average="macro")), 4)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=20000)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", default="var/bench/banking77")
    ap.add_argument("--epochs", type=int, nargs="+", default=[1])
    ap.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                    help="a config override for every run (e.g. training.nproc_per_node=1)")
    ap.add_argument("--results", default="benchmarks/results/banking77_accuracy.json")
    args = ap.parse_args()

    from core import stage
    from core.config import load_config
    from textnorm import normalize_text

    out = (ROOT / args.out).resolve()
    raw = out / "raw"
    env = dict(os.environ, PYSPARK_PYTHON=sys.executable, SPARK_LOCAL_IP="127.0.0.1")
    if not (raw / "raw.csv").exists():
        subprocess.run([sys.executable, "-m", "demo.builder", "--out", str(raw), "--rows", str(args.rows),
                        "--seed", str(args.seed), "--format", "csv", "--source", "train"],
                       env=env, cwd=ROOT, check=True)
    train_texts = set(pd.read_csv(ROOT / "data" / "banking77" / "train.csv").text.map(normalize_text))
    test, overlap = official_test(train_texts)
    base = load_config()
    results: dict = {
        "command": "python benchmarks/banking77_accuracy.py " + " ".join(sys.argv[1:]),
        "rows": args.rows, "seed": args.seed, "source": "train.csv only",
        "official_test_messages_scored": len(test), "official_test_messages_also_in_train": overlap,
        "hardware": {"cores": os.cpu_count(), "cpu": cpu_model()},
        "date": time.strftime("%Y-%m-%d"),
        "default_hparams": base.training.hparams.model_dump(),
        "overrides": args.set, "nproc_per_node": base.training.nproc_per_node,
        "runs": [],
    }
    for epochs in args.epochs:
        run_id = f"b77-acc-e{epochs}" + "".join(f"-{kv}" for kv in args.set)
        sets = ["--set", f"input.path={raw / 'raw.csv'}", "--set", f"lake_root={out / 'lake'}",
                "--set", f"tracking.uri=sqlite:///{out / 'mlflow.db'}",
                "--set", f"training.hparams.epochs={epochs}",
                *[a for kv in args.set for a in ("--set", kv)]]
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "ops.cli", "run", "--through", "train", *sets,
                               "--run-id", run_id], env=env, cwd=ROOT, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if done.returncode != 0:
            sys.exit(done.stdout[-3000:] + done.stderr[-3000:])
        cfg = load_config(overrides={"lake_root": str(out / "lake")})
        tr = stage.upstream(cfg.lake, run_id, "train")
        s = tr.manifest["stats"]
        row = {"epochs": epochs, "run_wall_seconds": round(wall, 1),
               "train_stage_seconds": tr.manifest["timings"]["seconds"], "train_cache_hit": tr.cache_hit,
               "pipeline_test_split_accuracy": s.get("test_accuracy"),
               "train_samples_per_s": s.get("train_samples_per_s"),
               "official_test": score(Path(tr.path) / "model", test)}
        results["runs"].append(row)
        print(json.dumps(row, indent=2))
    write_results(results, args.results)


if __name__ == "__main__":
    main()
