"""Benchmark: logging the trained model to MLflow (the train stage's pyfunc), with the
requirements MLflow infers against the ones the stage declares
(``training.task.model_requirements``), side by side and alternating.

MLflow infers a model's requirements by loading it in a subprocess and recording what it
imports; the stage declares them instead. Reported per way: median seconds of
``mlflow.pyfunc.log_model`` and the requirements it wrote.

    .venv/bin/python benchmarks/model_logging.py --model-dir LAKE/<dataset>/train/<key>/model [--repeats 5]

Any trained model folder works (the train stage's output, ``model/`` under it). The
tracking store is a temporary SQLite file. Results go to
``benchmarks/results/model_logging.json``; docs/BENCHMARKS.md quotes them.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def log_once(model_dir: Path, requirements: list[str] | None) -> tuple[float, list[str]]:
    import mlflow
    import pandas as pd

    from training.predictor import IntentClassifierModel

    example = pd.DataFrame({"text": ["I still have not received my new card", "How do I change my PIN?"]})
    with mlflow.start_run():
        start = time.perf_counter()
        info = mlflow.pyfunc.log_model(
            name="model", python_model=IntentClassifierModel(), artifacts={"model_dir": str(model_dir)},
            input_example=example,
            code_paths=[str(ROOT / p) for p in ("training", "contract", "pii", "textnorm", "core")],
            **({"pip_requirements": requirements} if requirements else {}))
        seconds = time.perf_counter() - start
    written = Path(mlflow.pyfunc.get_model_dependencies(info.model_uri)).read_text().split()
    return seconds, written


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", type=Path, required=True)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results" / "model_logging.json")
    args = ap.parse_args()

    import mlflow

    from training.task import model_requirements

    declared = model_requirements()
    times: dict[str, list[float]] = {"inferred": [], "declared": []}
    written: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory(prefix="model-logging-") as tmp:
        os.chdir(tmp)  # artifacts land beside the store, not in the checkout
        mlflow.set_tracking_uri(f"sqlite:///{tmp}/mlflow.db")
        mlflow.set_experiment("model-logging")
        log_once(args.model_dir, declared)  # warm-up: imports, the store's tables
        for rep in range(args.repeats):
            order = ("inferred", "declared") if rep % 2 == 0 else ("declared", "inferred")
            for way in order:
                seconds, written[way] = log_once(args.model_dir, declared if way == "declared" else None)
                times[way].append(round(seconds, 2))
                print(rep, way, round(seconds, 2), flush=True)
    medians = {way: round(statistics.median(v), 2) for way, v in times.items()}
    result = {
        "benchmark": "model_logging",
        "command": f"benchmarks/model_logging.py --model-dir <a trained model folder> --repeats {args.repeats}",
        "date": dt.date.today().isoformat(),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "median_seconds": medians,
        "ratio_declared_to_inferred": round(medians["declared"] / medians["inferred"], 3),
        "seconds": times,
        "requirements_written": written,
    }
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("median_seconds", "ratio_declared_to_inferred")}, indent=2))


if __name__ == "__main__":
    main()
