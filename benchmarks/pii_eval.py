"""Benchmark: PII detection quality per source, ours against Presidio, and throughput.

Sources (``pii/evaluation.py`` and ``data/pii_eval/SOURCE.md`` describe them):

* ``builder``: the project's raw-data builder (20,000 rows, seed 11, Banking77 *test*
  messages); our own generator, so its figures are an upper bound;
* ``presidio-tuned`` / ``presidio-heldback``: presidio-evaluator's sentences, split by
  template; the held-back half has its own seed and no rule or model saw it;
* ``casual-tuned`` / ``casual-heldback``: hand-labeled casual messages, split by phrasing;
  ``casual-fresh``: a second held-back set of casual messages, other phrasings (2026-12-07);
* each of these as written, lower-cased and upper-cased;
* Banking77's real messages (test split, never trained on; train split, whose messages
  were the model's negatives) for false detections per 1,000 messages.

Quality: per entity type, recall (a labeled span at least half covered by a detection of
its type) and precision (a detection overlapping a labeled span of its type), for our
detector and for Presidio's pattern recognizers (``pii_presidio.presidio_engines``: no
PERSON or ADDRESS without an NER model, none of which installs offline).

Speed: ours (``pii.redact``) and Presidio (analyze + anonymize) on the same texts, one
after the other, interleaved ``--repeats`` times in this process (one core); medians and
the ratio. Texts: the builder rows (the issue-3 workload), Banking77 test messages, and
the held-back presidio-evaluator sentences.

    .venv/bin/pip install -c constraints.txt -e '.[bench]'
    .venv/bin/python benchmarks/pii_eval.py [--repeats 5] [--results benchmarks/results/pii_eval.json]
        [--no-speed] [--no-presidio-quality]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from datetime import date
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from demo.groundtruth import load_builder  # noqa: E402
from pii import detector as pii  # noqa: E402
from pii import evaluation as E  # noqa: E402

TYPES = ("PERSON", "ADDRESS", "PHONE", "CARD", "EMAIL", "IBAN", "US_SSN", "PRC_ID", "IP_ADDRESS")
PRESIDIO_MAP = {"EMAIL_ADDRESS": "EMAIL", "PHONE_NUMBER": "PHONE", "CREDIT_CARD": "CARD",
                "IBAN_CODE": "IBAN", "US_SSN": "US_SSN", "IP_ADDRESS": "IP_ADDRESS"}


def ours(text: str) -> list[tuple[int, int, str]]:
    return [(d.start, d.end, d.entity) for d in pii.detect(text)]


def presidio_detector(analyzer):
    def detect(text: str) -> list[tuple[int, int, str]]:
        res = analyzer.analyze(text=text, language="en", entities=list(PRESIDIO_MAP))
        return [(r.start, r.end, PRESIDIO_MAP[r.entity_type]) for r in res]

    return detect


def builder_set(rows: int, seed: int) -> list[E.Sample]:
    from demo.builder import BuilderConfig, build_raw

    raw_dir = ROOT / "var" / "bench" / f"pii-{rows}-test-{seed}"
    if not (raw_dir / "raw.parquet").exists():
        build_raw(raw_dir, BuilderConfig(rows=rows, seed=seed, fmt="parquet", source="test"))
    return load_builder(raw_dir)


def timed(fn, texts: list[str]) -> float:
    t0 = time.perf_counter()
    for t in texts:
        fn(t)
    return time.perf_counter() - t0


def main() -> None:
    from data_stages import cpu_model
    from pii_presidio import presidio_engines

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--builder-rows", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--no-presidio-quality", dest="presidio_quality", action="store_false")
    ap.add_argument("--examples", type=int, default=0, help="missed/false examples per type")
    ap.add_argument("--no-speed", dest="speed", action="store_false",
                    help="quality only (on a busy host, where a timing would mean nothing)")
    ap.add_argument("--results", default="benchmarks/results/pii_eval.json")
    args = ap.parse_args()

    analyzer, anonymizer = presidio_engines()
    theirs = presidio_detector(analyzer)
    ev = E.EVAL_DIR
    sets = {
        "builder": builder_set(args.builder_rows, 11),
        "presidio-tuned": E.load_presidio(ev / "presidio_tuned.jsonl"),
        "presidio-heldback": E.load_presidio(ev / "presidio_heldback.jsonl"),
        "casual-tuned": E.load_casual(ev / "casual_tuned.tsv"),
        "casual-heldback": E.load_casual(ev / "casual_heldback.tsv"),
        "casual-fresh": E.load_casual(ev / "casual_fresh.tsv"),
    }
    quality: dict = {}
    for name, samples in sets.items():
        for case in E.CASES:
            part = E.case_variant(samples, case)
            key = f"{name}/{case}"
            quality[key] = {"samples": len(part),
                            "ours": E.score(part, ours, TYPES, examples=args.examples)}
            if args.presidio_quality:
                quality[key]["presidio"] = E.score(part, theirs, TYPES)
            print(key, {t: (v["recall"], v["precision"]) for t, v in quality[key]["ours"].items()},
                  flush=True)
    false_pos: dict = {}
    for split in ("test", "train"):
        texts = E.load_banking77(split)
        for case, tx in (("cased", texts), ("lower", [t.lower() for t in texts])):
            key = f"banking77-{split}/{case}"
            false_pos[key] = {"ours": E.false_positives(tx, ours, examples=20)}
            if args.presidio_quality:
                false_pos[key]["presidio"] = E.false_positives(tx, theirs)
            print(key, false_pos[key]["ours"]["per_1000"], flush=True)

    speed: dict = {}
    workloads = {
        "builder": [s.text for s in sets["builder"]],
        "banking77-test": E.load_banking77("test"),
        "presidio-heldback": [s.text for s in sets["presidio-heldback"]],
    }

    def ours_redact(t: str) -> None:
        pii.redact(t)

    def presidio_redact(t: str) -> None:
        anonymizer.anonymize(text=t, analyzer_results=analyzer.analyze(
            text=t, language="en", entities=list(PRESIDIO_MAP)))

    for name, texts in workloads.items() if args.speed else ():
        timed(presidio_redact, texts[:50])  # warm-up
        timed(ours_redact, texts[:50])
        o, p = [], []
        for _ in range(args.repeats):  # interleaved, so drift on a shared machine hits both
            o.append(timed(ours_redact, texts))
            p.append(timed(presidio_redact, texts))
        n = len(texts)
        speed[name] = {
            "texts": n, "repeats": args.repeats,
            "ours_us_per_text": round(1e6 * statistics.median(o) / n, 1),
            "presidio_us_per_text": round(1e6 * statistics.median(p) / n, 1),
            "ratio": round(statistics.median(p) / statistics.median(o), 1),
            "ours_s": [round(x, 3) for x in o], "presidio_s": [round(x, 3) for x in p],
        }
        print(name, speed[name], flush=True)

    import presidio_analyzer

    result = {
        "date": date.today().isoformat(),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform(), "processor": cpu_model()},
        "presidio_analyzer": getattr(presidio_analyzer, "__version__", "see constraints.txt"),
        "quality": quality, "false_positives": false_pos, "speed": speed,
    }
    dest = ROOT / args.results
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(result, indent=1, ensure_ascii=False))
    print("wrote", dest)



if __name__ == "__main__":
    main()
