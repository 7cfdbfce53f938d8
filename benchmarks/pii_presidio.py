"""Benchmark: our PII detector against Microsoft Presidio, side by side, on builder rows.

Both run in this one process, one after the other, on the same normalized texts (the
clean stage's output form) and the same core: ours is ``pii.detector.mask``; Presidio is
``AnalyzerEngine.analyze`` + ``AnonymizerEngine.anonymize`` with its pattern recognizers
(email, phone via ``phonenumbers``, credit card, IBAN, US SSN, IP) and a blank spaCy
pipeline saved to disk as its NLP engine (no NER model: none installs offline). Presidio
has no PRC ID, name or address recognizer without NER, so those rows of its table are
empty. Scored against the builder's ground truth with ``demo.groundtruth.pii_scores``:
recall (planted span inside a detection of its type), precision, decoys flagged.

    .venv/bin/pip install -c constraints.txt '.[bench]'
    .venv/bin/python benchmarks/pii_presidio.py [--raw var/bench/raw-1000000] [--sample 4000]

Without ``--raw`` a 20,000-row build is made. Our detector is also scored on every row of
the build (``--full``, default on). Results: ``benchmarks/results/pii_presidio.json`` (or
``--results``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from demo.groundtruth import pii_scores, read_builder  # noqa: E402
from pii import detector as pii  # noqa: E402

PRESIDIO_MAP = {"EMAIL_ADDRESS": "EMAIL", "PHONE_NUMBER": "PHONE", "CREDIT_CARD": "CARD",
                "IBAN_CODE": "IBAN", "US_SSN": "US_SSN", "IP_ADDRESS": "IP_ADDRESS"}


def load(raw_dir: Path) -> tuple[pd.DataFrame, dict[str, str]]:
    if not sorted(raw_dir.glob("raw.*")):
        raise SystemExit(f"no raw.* in {raw_dir}")
    return read_builder(raw_dir)


def presidio_engines():
    import spacy
    from presidio_analyzer import AnalyzerEngine, RecognizerRegistry
    from presidio_analyzer.nlp_engine import NlpEngineProvider
    from presidio_analyzer.predefined_recognizers import (
        CreditCardRecognizer,
        EmailRecognizer,
        IbanRecognizer,
        IpRecognizer,
        PhoneRecognizer,
        UsSsnRecognizer,
    )
    from presidio_anonymizer import AnonymizerEngine

    model_dir = Path(tempfile.mkdtemp(prefix="blank-spacy-")) / "en_blank"
    spacy.blank("en").to_disk(model_dir)
    nlp = NlpEngineProvider(nlp_configuration={
        "nlp_engine_name": "spacy", "models": [{"lang_code": "en", "model_name": str(model_dir)}],
    }).create_engine()
    registry = RecognizerRegistry(supported_languages=["en"])
    for rec in (EmailRecognizer(), CreditCardRecognizer(), IbanRecognizer(), UsSsnRecognizer(),
                IpRecognizer(),
                PhoneRecognizer(supported_regions=("US", "GB", "DE", "FR", "CN", "IN"))):
        registry.add_recognizer(rec)
    analyzer = AnalyzerEngine(registry=registry, nlp_engine=nlp, supported_languages=["en"])
    return analyzer, AnonymizerEngine()


def run_ours(texts: dict[str, str]) -> tuple[dict, float]:
    t0 = time.perf_counter()
    dets = {}
    for tid, t in texts.items():
        _, found = pii.redact(t)  # detect and mask, like analyze + anonymize
        dets[tid] = [(d.start, d.end, d.entity) for d in found]
    return dets, time.perf_counter() - t0


def run_presidio(texts: dict[str, str], analyzer, anonymizer) -> tuple[dict, float]:
    t0 = time.perf_counter()
    dets = {}
    for tid, t in texts.items():
        res = analyzer.analyze(text=t, language="en", entities=list(PRESIDIO_MAP))
        anonymizer.anonymize(text=t, analyzer_results=res)
        dets[tid] = [(r.start, r.end, PRESIDIO_MAP[r.entity_type]) for r in res]
    return dets, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--raw", help="a builder output folder (raw.* + ground_truth/)")
    ap.add_argument("--sample", type=int, default=4000, help="rows for the side-by-side run")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-full", dest="full", action="store_false",
                    help="skip scoring our detector on every row")
    ap.add_argument("--results", default=str(ROOT / "benchmarks" / "results" / "pii_presidio.json"),
                    help="where to write the results (default: the committed results file)")
    args = ap.parse_args()

    if args.raw:
        raw_dir = Path(args.raw)
    else:
        from demo.builder import BuilderConfig, build_raw

        raw_dir = ROOT / "var" / "bench" / "pii-20000"
        if not (raw_dir / "raw.parquet").exists():
            build_raw(raw_dir, BuilderConfig(rows=20000, seed=11, fmt="parquet"))
    truth, texts = load(raw_dir)
    ids = sorted(texts)
    import random

    sample_ids = random.Random(0).sample(ids, min(args.sample, len(ids)))
    sample = {t: texts[t] for t in sample_ids}
    sample_truth = truth[truth["ticket_id"].isin(sample)]

    analyzer, anonymizer = presidio_engines()
    run_presidio(dict(list(sample.items())[:50]), analyzer, anonymizer)  # warm-up
    ours_t, pres_t = [], []
    for _ in range(args.repeats):  # interleaved, so drift on a shared machine hits both
        d_ours, t = run_ours(sample)
        ours_t.append(t)
        d_pres, t = run_presidio(sample, analyzer, anonymizer)
        pres_t.append(t)
    n = len(sample)
    ours_rps = n / statistics.median(ours_t)
    pres_rps = n / statistics.median(pres_t)
    result = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform()},
        "raw": raw_dir.name,
        "sample_rows": n,
        "repeats": args.repeats,
        "ours": {"rows_per_s_median": round(ours_rps), "seconds": [round(x, 2) for x in ours_t],
                 "scores": pii_scores(sample, sample_truth, d_ours, pii.BUILDER_TYPE_MAP)},
        "presidio": {"rows_per_s_median": round(pres_rps), "seconds": [round(x, 2) for x in pres_t],
                     "scores": pii_scores(sample, sample_truth, d_pres, pii.BUILDER_TYPE_MAP)},
        "throughput_ratio": round(ours_rps / pres_rps, 1),
    }
    import presidio_analyzer

    result["presidio"]["version"] = presidio_analyzer.__version__ if hasattr(
        presidio_analyzer, "__version__") else "see constraints"
    if args.full:
        t0 = time.perf_counter()
        d_full = {t: [(d.start, d.end, d.entity) for d in pii.detect(s)] for t, s in texts.items()}
        secs = time.perf_counter() - t0
        result["ours_full"] = {"rows": len(texts), "seconds": round(secs, 1),
                               "rows_per_s": round(len(texts) / secs),
                               "scores": pii_scores(texts, truth, d_full, pii.BUILDER_TYPE_MAP)}
    dest = Path(args.results)
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
