"""Benchmark: ONNX export of the fine-tuned MiniLM, int8 quantization, speed and size.

Runs the export stage's own ``export.build.build_all`` on the MiniLM model that
``benchmarks/training.py`` fine-tuned (``var/bench/training/accuracy/run/model``) with the
Banking77 test split (3,080 rows) and the default export config: fp32 parity, all int8
candidates (fusion x per-channel x reduce-range) timed side by side, the shipped int8
build chosen, then PyTorch eager, ONNX Runtime fp32 (unfused) and int8 timed interleaved
in one run. ``--repeats`` repeats that final side-by-side timing and reports medians.

    .venv/bin/python benchmarks/export.py [--model-dir DIR] [--repeats 3]

Results go to ``benchmarks/results/export.json``; docs/BENCHMARKS.md quotes them.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from data_stages import write_results  # noqa: E402

TARGETS = {"int8_speedup_vs_eager_b1": (">=", 5.0), "int8_throughput_vs_fp32_b32": (">=", 2.5),
           "int8_size_share_of_fp32": ("<=", 0.26), "int8_accuracy_drop_points": ("<=", 0.5)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model-dir", default=str(ROOT / "var/bench/training/accuracy/run/model"))
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    from core.config import ExportConfig
    from export import build, onnx_build
    from export.runtime import TextEncoder, session
    from textnorm import normalize_label
    from training.models import load_trained

    model_dir = Path(args.model_dir)
    if not (model_dir / "model.pt").exists():
        sys.exit(f"{model_dir} has no trained model: run benchmarks/training.py first")
    test = pd.read_csv(ROOT / "data/banking77/test.csv")
    texts, labels = test.text.tolist(), test.category.map(normalize_label).tolist()
    cfg = ExportConfig()
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        report = build.build_all(model_dir, texts, labels, [str(i) for i in range(len(texts))], cfg, tmp)
        seconds = time.perf_counter() - t0
        # More side-by-side repeats of the final comparison, medians across them.
        model, _ = load_trained(model_dir)
        pre = json.loads((Path(tmp) / "fp32" / "preprocessing.json").read_text())
        enc = TextEncoder(Path(tmp) / "fp32" / "tokenizer.json", pre["max_length"], pre["pad_id"])
        fns = {"pytorch_eager": onnx_build.torch_logits_fn(model),
               "onnx_fp32": onnx_build.onnx_logits_fn(session(Path(tmp) / "fp32" / "model.onnx")),
               "onnx_int8": onnx_build.onnx_logits_fn(session(Path(tmp) / "int8" / "model.onnx"))}
        runs = [report["builds"]] + [
            onnx_build.time_side_by_side(fns, enc, texts, cfg.latency_samples, cfg.throughput_batches)
            for _ in range(args.repeats - 1)]
    med = {b: {k: statistics.median(r[b][k] for r in runs)
               for k in ("p50_ms_b1", "p99_ms_b1", "p50_ms_b32", "throughput_b32")} for b in fns}
    e, f, q = med["pytorch_eager"], med["onnx_fp32"], med["onnx_int8"]
    sizes = {b: report["builds"][b]["size_mb"] for b in fns}
    ratios = {"int8_speedup_vs_eager_b1": e["p50_ms_b1"] / q["p50_ms_b1"],
              "int8_throughput_vs_fp32_b32": q["throughput_b32"] / f["throughput_b32"],
              "int8_size_share_of_fp32": sizes["onnx_int8"] / sizes["onnx_fp32"],
              "int8_accuracy_drop_points": report["ratios"]["int8_accuracy_drop_points"]}
    met = {k: (v >= TARGETS[k][1] if TARGETS[k][0] == ">=" else v <= TARGETS[k][1])
           for k, v in ratios.items()}
    write_results({
        "command": "python benchmarks/export.py " + " ".join(sys.argv[1:]),
        "model_dir": str(model_dir),
        "test_rows": len(texts),
        "hardware": report["hardware"],
        "repeats": args.repeats,
        "median_over_repeats": med,
        "ratios_of_medians": ratios,
        "targets": {k: f"{op} {v}" for k, (op, v) in TARGETS.items()},
        "targets_met": met,
        "sizes_mb": sizes,
        "accuracy": {b: report["builds"][b]["accuracy"] for b in fns},
        "parity": report["parity"],
        "int8": report["int8"],
        "candidates": report["candidates"],
        "export_seconds": seconds,
        "per_repeat": runs,
    }, "benchmarks/results/export.json")


if __name__ == "__main__":
    main()
