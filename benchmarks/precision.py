"""Benchmark: one training step in fp32 and under bf16 autocast, on this machine's CPU.

``training.hparams.precision: auto`` picks bf16 only where the hardware computes it
(``training.optim.native_bf16``); this measures what the choice is worth here. For each
model (``small``, the 2-layer encoder the tests and quick runs use; ``minilm``, the demo's)
it times forward, backward and the fused AdamW step on batches of real Banking77 training
messages, the two precisions alternating batch by batch in this one process (side by side),
and reports the median step time of each after a warm-up.

    .venv/bin/python benchmarks/precision.py [--steps 30] [--threads 1]

Results: ``benchmarks/results/precision.json``; docs/BENCHMARKS.md quotes them.
"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import statistics
import sys
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

WARMUP = 5
SETTINGS = {"small": {"batch": 32, "max_length": 32}, "minilm": {"batch": 16, "max_length": 64}}


def cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def batches(max_length: int, batch: int, steps: int) -> list[tuple]:
    import torch

    from training.data import load_tokenizer, pad_token_id

    tok = load_tokenizer(max_length)
    with open(ROOT / "data" / "banking77" / "train.csv", newline="") as f:
        texts = [row["text"] for row in csv.DictReader(f)][: batch * steps]
    enc = [e.ids for e in tok.encode_batch(texts)]
    pad = pad_token_id(tok)
    out = []
    for i in range(0, len(enc), batch):
        chunk = enc[i:i + batch]
        width = max(len(x) for x in chunk)
        ids = torch.tensor([x + [pad] * (width - len(x)) for x in chunk])
        out.append((ids, (ids != pad).long(), torch.randint(0, 77, (len(chunk),)), pad,
                    tok.get_vocab_size()))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the tests' runs: 1 per process)")
    ap.add_argument("--models", nargs="+", default=list(SETTINGS))
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results" / "precision.json")
    args = ap.parse_args(argv)

    import torch
    import torch.nn.functional as F  # noqa: N812

    from training.models import build_model
    from training.optim import adamw, native_bf16, param_groups

    torch.set_num_threads(args.threads)
    rows = []
    for kind in args.models:
        s = SETTINGS[kind]
        data = batches(s["max_length"], s["batch"], args.steps)
        runs = {}
        for precision in ("fp32", "bf16"):
            torch.manual_seed(0)
            model, _ = build_model(kind, 77, s["max_length"], data[0][4], data[0][3], 0.1)
            runs[precision] = (model, adamw(param_groups(model, 0.01), 1e-4), [])
        for ids, mask, y, _, _ in data:
            for precision, (model, opt, times) in runs.items():
                t = time.perf_counter()
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
                    logits = model(ids, mask)
                loss = F.cross_entropy(logits.float(), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                times.append(time.perf_counter() - t)
        med = {p: statistics.median(r[2][WARMUP:]) for p, r in runs.items()}
        rows.append({"model": kind, "batch": s["batch"], "max_length": s["max_length"],
                     "steps_timed": len(data) - WARMUP,
                     "fp32_step_s": round(med["fp32"], 4), "bf16_step_s": round(med["bf16"], 4),
                     "bf16_over_fp32_time": round(med["bf16"] / med["fp32"], 2)})
        print(json.dumps(rows[-1]))
    result = {"date": date.today().isoformat(), "cpu": cpu_name(), "threads": args.threads,
              "torch": torch.__version__, "native_bf16": native_bf16(torch.device("cpu")),
              "command": "benchmarks/precision.py " + " ".join(argv or sys.argv[1:]), "rows": rows}
    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
