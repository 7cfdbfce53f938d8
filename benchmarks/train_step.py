"""Benchmark: where one MiniLM training step's time goes, and what padding costs.

Times forward (bf16 autocast), backward and the optimizer step (gradient clipping plus
AdamW) of the demo's model on batches of 16 Banking77 training messages, steps 6 to 40
averaged, for each ``--variants`` entry: ``default`` (``torch.optim.AdamW`` as it comes),
``fused`` (``fused=True``, what ``training.optim.adamw`` uses) and ``foreach``, each on
random batches or, with the suffix ``-grouped``, on the training loop's length-grouped batches. Also reports
the padding of both batchings (padded tokens over real tokens). Every variant runs in this
one process, one after the other, on the same messages.

    .venv/bin/python benchmarks/train_step.py [--variants default fused default-grouped fused-grouped]

Results: ``benchmarks/results/train_step.json``; docs/BENCHMARKS.md (issue 21) quotes them.
"""

from __future__ import annotations

import argparse
import csv
import os
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.append(str(ROOT / "benchmarks"))  # after the project: benchmarks/training.py is a script

BATCH = 16


def ordered(enc: list[list[int]], grouped: bool) -> list[list[int]]:
    """Random order, or the training loop's grouping (runs of 50 batches sorted by length,
    the batches shuffled: ``training.data.group_by_length``)."""
    if not grouped:
        return enc
    from training.data import group_by_length

    order = group_by_length(list(range(len(enc))), [len(x) for x in enc], BATCH, 50, seed=0)
    return [enc[i] for i in order]


def batches(enc: list[list[int]], grouped: bool):
    import torch

    rows = ordered(enc, grouped)
    out = []
    for i in range(0, len(rows) - BATCH + 1, BATCH):
        b = rows[i:i + BATCH]
        width = max(map(len, b))
        ids = torch.zeros((BATCH, width), dtype=torch.long)
        mask = torch.zeros((BATCH, width), dtype=torch.long)
        for r, x in enumerate(b):
            ids[r, :len(x)] = torch.tensor(x)
            mask[r, :len(x)] = 1
        out.append((ids, mask))
    return out


def padding(enc: list[list[int]], grouped: bool) -> float:
    rows = ordered(enc, grouped)
    padded = sum(BATCH * max(map(len, rows[i:i + BATCH])) for i in range(0, len(rows) - BATCH + 1, BATCH))
    real = sum(len(x) for x in rows[:len(rows) // BATCH * BATCH])
    return padded / real


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--variants", nargs="+",
                    default=["default", "fused", "foreach", "default-grouped", "fused-grouped"])
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--results", default="benchmarks/results/train_step.json")
    args = ap.parse_args()

    import torch
    import torch.nn.functional as F
    from data_stages import cpu_model, write_results

    from training.data import load_tokenizer, pad_token_id
    from training.models import build_model

    torch.set_num_threads(args.threads)
    tok = load_tokenizer(64)
    with (ROOT / "data" / "banking77" / "train.csv").open() as fh:
        texts = [r["text"] for r in csv.DictReader(fh)]
    random.Random(0).shuffle(texts)
    enc = [e.ids for e in tok.encode_batch(texts[:BATCH * args.steps * 2])]
    model, _ = build_model("minilm", 77, 64, tok.get_vocab_size(), pad_token_id(tok), 0.1)
    y = torch.randint(0, 77, (BATCH,), generator=torch.Generator().manual_seed(0))
    rows = {}
    for variant in args.variants:
        kind, _, grouping = variant.partition("-")
        kw = {"default": {}, "fused": {"fused": True}, "foreach": {"foreach": True}}[kind]
        opt = torch.optim.AdamW(model.parameters(), lr=1e-5, **kw)
        fwd = bwd = step = 0.0
        for i, (ids, mask) in enumerate(batches(enc, grouping == "grouped")[:args.steps]):
            t0 = time.perf_counter()
            with torch.autocast("cpu", dtype=torch.bfloat16):
                logits = model(ids, mask)
            loss = F.cross_entropy(logits.float(), y)
            t1 = time.perf_counter()
            loss.backward()
            t2 = time.perf_counter()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
            t3 = time.perf_counter()
            if i >= 5:
                fwd, bwd, step = fwd + t1 - t0, bwd + t2 - t1, step + t3 - t2
        n = args.steps - 5
        rows[variant] = {"forward_ms": round(1000 * fwd / n, 1), "backward_ms": round(1000 * bwd / n, 1),
                         "optimizer_ms": round(1000 * step / n, 1),
                         "step_ms": round(1000 * (fwd + bwd + step) / n, 1)}
        print(variant, rows[variant], flush=True)
    write_results({
        "command": "python benchmarks/train_step.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d"), "hardware": {"cores": os.cpu_count(), "cpu": cpu_model()},
        "threads": args.threads, "batch": BATCH, "steps_averaged": args.steps - 5, "torch": torch.__version__,
        "padding_over_real_tokens": {"random": round(padding(enc, False), 3), "grouped": round(padding(enc, True), 3)},
        "variants": rows,
    }, args.results)


if __name__ == "__main__":
    main()
