"""Benchmark: the PII detector on template-held-out folds of the *tuned* halves.

For K = 0..4, ``tools/pii_token_models.py --validate --fold K`` trains both token models on
four fifths of the tuned templates and phrasings (``data/pii_eval``); the detector, with
those models, is scored on the fifth it did not see; the figures pool the five folds. This
is how rules and settings are chosen without reading the held-back halves: their misses
are printed with ``--examples``. Also: false detections on Banking77's *training* split
with the shipped models (its test split is the held-out false-detection corpus).

    .venv/bin/python benchmarks/pii_folds.py [--root <checkout>] [--trainer-root <checkout>]
        [--join -4] [--threshold -0.3] [--fold-models DIR]
        [--results benchmarks/results/pii_folds.json] [--examples FILE]

``--root``: the checkout whose detector is scored (default: this one); ``--trainer-root``:
whose trainer makes the fold models (default: the same); ``--join``: the name model's join
logit instead of the trained one; ``--threshold``: the name model's threshold instead of the
trained one; ``--fold-models``: score the fold models an earlier run kept there (its
``m0.json.gz`` .. ``m4.json.gz``) instead of training them again.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import subprocess
import sys
import tempfile
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("PERSON", "ADDRESS")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=str(ROOT))
    ap.add_argument("--trainer-root")
    ap.add_argument("--join", type=float)
    ap.add_argument("--threshold", type=float)
    ap.add_argument("--fold-models", help="the fold models of an earlier run (not trained again)")
    ap.add_argument("--train-args", default="", help="more arguments for the trainer")
    ap.add_argument("--results", default="benchmarks/results/pii_folds.json")
    ap.add_argument("--examples", help="write the folds' misses and false detections here")
    args = ap.parse_args()
    root = Path(args.root).resolve()
    trainer = Path(args.trainer_root or root).resolve()
    sys.path.insert(0, str(root))
    from pii import detector as pii  # the scored checkout's
    from pii import evaluation as E
    from pii import model as pm

    folds = Path(args.fold_models or tempfile.mkdtemp(prefix="pii-folds-"))
    print("fold models:", folds)
    for k in range(5 if not args.fold_models else 0):
        subprocess.run(
            [sys.executable, str(trainer / "tools/pii_token_models.py"), "--validate",
             "--fold", str(k), "--out", str(folds / f"m{k}.json.gz"), *args.train_args.split()],
            check=True, cwd=trainer, stdout=subprocess.DEVNULL,
        )  # fmt: skip
    presidio = E.load_presidio(E.EVAL_DIR / "presidio_tuned.jsonl")
    casual = E.load_casual(E.EVAL_DIR / "casual_tuned.tsv")
    totals: dict = collections.defaultdict(lambda: [0, 0, 0, 0])
    lines: list[str] = []  # the folds' misses and false detections, for --examples

    def detect(t: str) -> list[tuple[int, int, str]]:
        return [(d.start, d.end, d.entity) for d in pii.detect(t)]

    for k in range(5):
        def in_fold(s: E.Sample, k: int = k) -> bool:  # as the trainer splits
            return hashlib.sha256(s.group.encode()).digest()[1] % 5 == k

        models = {kd: pm.TokenModel.load(folds / f"m{k}.json.gz", kd) for kd in KINDS}
        if args.join is not None:
            models["PERSON"].join = args.join
        if args.threshold is not None:
            models["PERSON"].threshold = args.threshold
        pii._token_model = lambda kind, models=models: models[kind]
        for name, part in (("presidio", presidio), ("casual", casual)):
            held = [s for s in part if in_fold(s)]
            for case in E.CASES:
                r = E.score(E.case_variant(held, case), detect, KINDS, examples=200)
                for t, v in r.items():
                    c = totals[f"{name}/{case}/{t}"]
                    c[0] += v["labeled"]
                    c[1] += v["found"]
                    c[2] += v["detections"]
                    c[3] += v["correct"]
                    lines += [f"MISS {name} {case} {t} {m[:240]}" for m in v["missed_examples"]]
                    lines += [f"FALSE {name} {case} {t} {m[:240]}" for m in v["false_examples"]]
    pooled = {
        key: {"labeled": n, "found": f, "detections": d, "correct": c,
              "recall": round(f / n, 4) if n else None,
              "precision": round(c / d, 4) if d else None}
        for key, (n, f, d, c) in sorted(totals.items())
    }  # fmt: skip
    if args.examples:
        Path(args.examples).write_text("\n".join(lines) + "\n", encoding="utf-8")
    for key, v in pooled.items():
        print(key, v["recall"], v["precision"])
    shipped = {kd: pm.TokenModel.load(kind=kd) for kd in KINDS}
    if args.join is not None:
        shipped["PERSON"].join = args.join
    if args.threshold is not None:
        shipped["PERSON"].threshold = args.threshold
    pii._token_model = lambda kind: shipped[kind]
    bank = E.load_banking77("train")
    fp = {
        case: E.false_positives(bank if case == "cased" else [t.lower() for t in bank], detect)
        for case in ("cased", "lower")
    }
    print("banking77-train", {c: v["per_1000"] for c, v in fp.items()})
    dest = ROOT / args.results
    dest.write_text(json.dumps({
        "date": date.today().isoformat(),
        # Checkouts by their commit, not their path on this machine.
        "command": "benchmarks/pii_folds.py" + (" --root <checkout>" if args.root != str(ROOT) else "")
        + (" --trainer-root <checkout>" if args.trainer_root else "")
        + (f" --join {args.join}" if args.join is not None else "")
        + (f" --threshold {args.threshold}" if args.threshold is not None else "")
        + (" --fold-models <the folds' models>" if args.fold_models else "")
        + (f" --train-args '{args.train_args}'" if args.train_args else ""),
        "scored": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root,
                                 capture_output=True, text=True).stdout.strip(),
        "trainer": subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=trainer,
                                  capture_output=True, text=True).stdout.strip(),
        "join": args.join, "threshold": args.threshold, "pooled_folds": pooled, "banking77_train": fp,
    }, indent=1))  # fmt: skip
    print("wrote", dest)


if __name__ == "__main__":
    main()
