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

A second table, ``pii/data/rare_names.npz``, holds the names ranked beyond ``--max-rank``
and within ``--rare-max-rank`` (20,000: names-dataset ranks no further) that the first
does not hold: about 700,000 names from every country, which the PERSON model reads as
names of rank over 1,000. It is kept as a sorted array of 64-bit keys (``pii.model.rare_key``:
a BLAKE2b digest of the lower-cased name) and a byte per name, 9 bytes a name, loaded in
milliseconds: as text in a dict it would cost several times the first table's 90 MB per
process. Measured before it was built
(``benchmarks/pii_table_coverage.py``): 44% of the tuned presidio names' tokens the first
table misses are in it.

    make pii-tables     (or: .venv-pii-tools/bin/python tools/pii_tables.py)
"""

from __future__ import annotations

import argparse
import gzip
import io
import pickle
import sys
import unicodedata
import zipfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


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
    ap.add_argument("--rare-max-rank", type=int, default=20000)
    ap.add_argument("--out", default=str(ROOT / "pii" / "data" / "names.tsv.gz"))
    ap.add_argument("--rare-out", default=str(ROOT / "pii" / "data" / "rare_names.npz"))
    args = ap.parse_args()
    data = Path(names_dataset.__file__).parent / "v3"
    first = _ranks(data / "first_names.pkl.gz", args.rare_max_rank)
    last = _ranks(data / "last_names.pkl.gz", args.rare_max_rank)
    words = set(wordfreq.top_n_list("en", args.english_words))
    common = {t for t in first.keys() | last.keys()
              if min(r for r in (first.get(t), last.get(t)) if r) <= args.max_rank}
    tokens = sorted(common | {w for w in words if w.isalpha()})
    # Names only: names-dataset holds entries such as "-mr", words of the English lexicon
    # ("token", "mope") and, being read off social-network profiles, words run together
    # ("isok", "moremoney", "topup": two words of Zipf 5 or more), which customers write too.
    with gzip.open(ROOT / "pii" / "data" / "lexicon.tsv.gz", "rt", encoding="utf-8") as f:
        english = {line.split("\t", 1)[0] for line in f if not line.startswith(("#", "form\t"))}

    def run_together(t: str) -> bool:
        return any(t[:i].isalpha() and t[i:].isalpha() and wordfreq.zipf_frequency(t[:i], "en") >= 5
                   and wordfreq.zipf_frequency(t[i:], "en") >= 5 for i in range(2, len(t) - 1))

    rare = sorted(t for t in (first.keys() | last.keys()) - set(tokens)
                  if t[0].isalpha() and t[-1].isalpha() and t not in english and not run_together(t))
    version = (f"names-dataset {getattr(names_dataset, '__version__', '3.3.1')}, wordfreq "
               f"{wordfreq.__version__ if hasattr(wordfreq, '__version__') else '3.1.1'}")

    def rank(table: dict[str, int], t: str, within: int) -> int:
        return r if (r := table.get(t, 0)) <= within else 0

    dest = Path(args.out)
    rows = [f"{t}\t{rank(first, t, args.max_rank)}\t{rank(last, t, args.max_rank)}\t"
            f"{wordfreq.zipf_frequency(t, 'en'):.2f}\n" for t in tokens]
    header = (f"# {version}; max rank {args.max_rank}, {args.english_words} English words\n"
              "token\tfirst_rank\tlast_rank\tzipf_en\n")
    body = (header + "".join(rows)).encode("utf-8")
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0) as f:
        f.write(body)  # mtime 0: the same inputs give the same bytes
    print(f"{dest}: {len(rows)} tokens, {dest.stat().st_size / 1e6:.1f} MB")

    # The rare names as the detector reads them (pii.model.rare_names): their keys sorted,
    # a code per key (1 a first name, 2 a last name, 4 times the Zipf bucket).
    from pii.model import rare_key

    keyed = sorted((rare_key(t), (t in first) | (t in last) << 1
                    | min(int(wordfreq.zipf_frequency(t, "en") * 2), 14) << 2) for t in rare)
    keys = np.array([k for k, _ in keyed], dtype=np.uint64)
    if len(np.unique(keys)) != len(keys):
        raise SystemExit("two rare names share a key")
    rare_dest = Path(args.rare_out)
    arrays = {
        "keys": keys,
        "codes": np.array([c for _, c in keyed], dtype=np.uint8),
        "about": np.array(f"{version}; names ranked {args.max_rank + 1} to {args.rare_max_rank} "
                          f"in some country that {dest.name} does not hold"),
    }
    # An .npz as np.savez writes it, but with fixed entry dates: the same inputs give the
    # same bytes (np.savez stamps each entry with the current time).
    with zipfile.ZipFile(rare_dest, "w", zipfile.ZIP_STORED) as z:
        for name, arr in arrays.items():
            buf = io.BytesIO()
            np.lib.format.write_array(buf, arr, allow_pickle=False)
            z.writestr(zipfile.ZipInfo(f"{name}.npy", date_time=(1980, 1, 1, 0, 0, 0)), buf.getvalue())
    print(f"{rare_dest}: {len(keys)} names, {rare_dest.stat().st_size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
