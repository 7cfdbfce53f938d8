"""Benchmark: how much more of the names the shipped name table misses a wider trim of
names-dataset would hold, and at what size (tuned side only).

The name table (``pii/data/names.tsv.gz``, ``tools/pii_tables.py``) keeps the names ranked
within ``--max-rank`` 4,000 in some country. For each wider rank this counts, on the
*tuned* half of presidio-evaluator's sentences (``data/pii_eval/presidio_tuned.jsonl``),
the PERSON tokens the shipped table does not hold that the wider one would, how many
tokens the wider table would hold in all (its size in every process that masks), and
which words of Banking77's *training* split it would newly rank as names (a false-name
risk). No held-back set is read.

Runs in the PII tools' environment (names-dataset holds 3 GB in memory):

    make .venv-pii-tools/.installed
    .venv-pii-tools/bin/python benchmarks/pii_table_coverage.py \\
        [--results benchmarks/results/pii_table_coverage.json]
"""

from __future__ import annotations

import argparse
import csv
import datetime as dt
import gzip
import json
import os
import platform
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RANKS = (4000, 10000, 20000, 50000)


def main() -> None:
    import names_dataset

    sys.path.insert(0, str(ROOT / "tools"))
    from pii_tables import _ranks  # the table's own reading of names-dataset

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results" / "pii_table_coverage.json")
    args = ap.parse_args()
    with gzip.open(ROOT / "pii" / "data" / "names.tsv.gz", "rt", encoding="utf-8") as f:
        shipped = {line.split("\t", 1)[0] for line in f if not line.startswith(("#", "token\t"))}
    data = Path(names_dataset.__file__).parent / "v3"
    first, last = (_ranks(data / f"{kind}_names.pkl.gz", 1 << 40) for kind in ("first", "last"))
    best = {w: min(r for r in (first.get(w), last.get(w)) if r) for w in first.keys() | last.keys()}
    tokens = []
    with open(ROOT / "data" / "pii_eval" / "presidio_tuned.jsonl", encoding="utf-8") as f:
        for line in f:
            d = json.loads(line)
            for sp in d["spans"]:
                if sp["type"] == "PERSON":
                    tokens += [w.strip(".,") for w in d["text"][sp["start"]:sp["end"]].lower().split()
                               if len(w.strip(".,")) > 1]
    unknown = [w for w in tokens if w not in shipped]
    b77 = set()
    with open(ROOT / "data" / "banking77" / "train.csv", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            b77 |= set(re.findall(r"[^\W\d_]+", row["text"].lower()))
    rows = []
    for max_rank in RANKS:
        names = sum(1 for r in best.values() if r <= max_rank)
        rows.append({
            "max_rank": max_rank,
            "names_in_table": names,
            "unknown_tokens_covered": sum(1 for w in unknown if best.get(w, 1 << 40) <= max_rank),
            "banking77_train_words_newly_ranked": sorted(
                w for w in b77 if w not in shipped and best.get(w, 1 << 40) <= max_rank),
        })
        print(rows[-1], flush=True)
    result = {
        "benchmark": "pii_table_coverage",
        "command": "benchmarks/pii_table_coverage.py (in .venv-pii-tools)",
        "date": dt.date.today().isoformat(),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform()},
        "names_dataset": getattr(names_dataset, "__version__", "3.3.1"),
        "tuned_person_tokens": len(tokens),
        "tuned_person_tokens_not_in_shipped_table": len(unknown),
        "shipped_table_tokens": len(shipped),
        "by_max_rank": rows,
    }
    args.results.write_text(json.dumps(result, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
