"""Benchmark: how much of an int8 build's disagreement with fp32 the mixed-precision
fallback removes, per number of first weight MatMuls kept in fp32 (``export.onnx_build.
ffn_nodes``), on any exported fp32 build.

    .venv/bin/python benchmarks/int8_fallback.py --fp32 <export dir>/fp32 [--max-kept 4]
        [--results benchmarks/results/int8_fallback.json]

Texts: Banking77's test messages. Quantization as the export stage's (dynamic int8,
per-channel, no reduce-range), agreement of the argmax with the fp32 build's.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fp32", required=True, help="an export's fp32 folder")
    ap.add_argument("--max-kept", type=int, default=4)
    ap.add_argument("--results", default="benchmarks/results/int8_fallback.json")
    args = ap.parse_args()
    from export import onnx_build as ob
    from export.runtime import TextEncoder, session
    from pii import evaluation as E

    src = Path(args.fp32)
    pre = json.loads((src / "preprocessing.json").read_text())
    enc = TextEncoder(src / "tokenizer.json", pre["max_length"], pre["pad_id"])
    texts = E.load_banking77("test")
    ref = ob.batched_logits(ob.onnx_logits_fn(session(src / "model.onnx", 2)), enc, texts)
    work = Path(tempfile.mkdtemp())
    rows = []
    for k in range(args.max_kept + 1):
        path, kept = ob.quantize(src / "model.onnx", work / f"q{k}.onnx", True, False, work, k)
        got = ob.batched_logits(ob.onnx_logits_fn(session(path, 2)), enc, texts)
        rows.append({"fp32_kept": k, "nodes": kept,
                     "agreement": round(float((got.argmax(1) == ref.argmax(1)).mean()), 4),
                     "size_mb": round(ob.size_mb(path), 2)})
        print(rows[-1])
    dest = ROOT / args.results
    dest.write_text(json.dumps({"date": date.today().isoformat(), "model_kind": pre.get("model_kind"),
                                "texts": f"Banking77 test ({len(texts)})", "fp32_size_mb":
                                round(ob.size_mb(src / "model.onnx"), 2), "rows": rows}, indent=1))
    print("wrote", dest)


if __name__ == "__main__":
    main()
