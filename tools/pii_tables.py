"""Build the PII detector's name table, ``pii/data/names.tsv.gz``, from
names-dataset (first and last names by country, with their rank there) and wordfreq
(how common a word is in English).

Why a trimmed table and not the packages: names-dataset holds about 3 GB in memory per
process, too much for every Spark worker and model server, and wordfreq pulls regex,
ftfy and langcodes into the pipeline for one number per word. The table keeps what the
detector reads: for each lower-cased token, its best rank as a first name and as a last
name in any country (0 = not ranked there) and its Zipf frequency in English (0 = rarer
than 1 in 10^8 words). Names in Latin script only (the detector reads Latin-script
messages), ranked within ``--max-rank`` in some country, with their accent-free forms;
plus the commonest English words, so that a capitalized non-name is known as a word.

    make pii-tables     (or: .venv-pii-tools/bin/python tools/pii_tables.py)
"""

from __future__ import annotations

import argparse
import gzip
import pickle
import unicodedata
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _latin(name: str) -> bool:
    return all(
        c in " '-" or ("LATIN" in unicodedata.name(c, "") and c.isalpha()) for c in name
    )


def _fold(s: str) -> str:
    return unicodedata.normalize("NFKD", s).encode("ascii", "ignore").decode()


def _ranks(path: Path, max_rank: int) -> dict[str, int]:
    with gzip.open(path) as f:
        table = pickle.load(f)
    out: dict[str, int] = {}
    for name, info in table.items():
        ranks = info.get("rank") or {}
        if not ranks:
            continue
        r = min(ranks.values())
        low = name.strip().lower()
        if r > max_rank or not low or " " in low or not _latin(low):
            continue
        for form in {low, _fold(low)}:
            if form and (form not in out or r < out[form]):
                out[form] = r
    return out


def main() -> None:
    import names_dataset
    import wordfreq

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-rank", type=int, default=4000)
    ap.add_argument("--english-words", type=int, default=60000)
    ap.add_argument("--out", default=str(ROOT / "pii" / "data" / "names.tsv.gz"))
    args = ap.parse_args()
    data = Path(names_dataset.__file__).parent / "v3"
    first = _ranks(data / "first_names.pkl.gz", args.max_rank)
    last = _ranks(data / "last_names.pkl.gz", args.max_rank)
    words = set(wordfreq.top_n_list("en", args.english_words))
    tokens = sorted(set(first) | set(last) | {w for w in words if w.isalpha()})
    rows = []
    for t in tokens:
        z = wordfreq.zipf_frequency(t, "en")
        rows.append(f"{t}\t{first.get(t, 0)}\t{last.get(t, 0)}\t{z:.2f}\n")
    dest = Path(args.out)
    dest.parent.mkdir(parents=True, exist_ok=True)
    header = (f"# names-dataset {getattr(names_dataset, '__version__', '3.3.1')}, wordfreq "
              f"{wordfreq.__version__ if hasattr(wordfreq, '__version__') else '3.1.1'}; "
              f"max rank {args.max_rank}, {args.english_words} English words\n"
              "token\tfirst_rank\tlast_rank\tzipf_en\n")
    body = (header + "".join(rows)).encode("utf-8")
    with open(dest, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
        f.write(body)  # mtime 0: the same inputs give the same bytes
    print(f"{dest}: {len(rows)} tokens ({len(first)} first, {len(last)} last names), "
          f"{dest.stat().st_size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
