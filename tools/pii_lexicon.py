"""Build the PII detector's English lexicon, ``pii/data/lexicon.tsv.gz``, from
lemminflect's (MIT; the SPECIALIST Lexicon's inflections).

What it is for: a name in a casual message is often the subject or object of a verb and
nothing else says it is a name ("what if jake loses the card", "i think todd stole my
card", "can paige use my card", "i gave wes my old card"). ``pii.clauses`` reads a word's
grammar from this table: whether it is a finite verb form (3rd person singular "loses",
past "stole"), a base form, a participle, and whether it can also be a noun or an
adjective ("keeps", "use", "used"); and whether a first name is also a common English
word ("grace", "pin", "visa", "chase": in the lexicon in lower case) or not ("jake").

Why a table and not the package at run time: the detector runs in every Spark worker and
model server; lemminflect loads two lexicons and a model it does not need there. The table
keeps, for each lower-case word form of the lexicon, its tags: for verb forms ``Z`` (VBZ),
``D`` (VBD), ``N`` (VBN), ``G`` (VBG), ``B`` (VB/VBP); ``n`` noun, ``a`` adjective, ``r``
adverb, ``x`` auxiliary. Proper nouns (capitalized entries) are left out.

    make pii-tables     (or: .venv-pii-tools/bin/python tools/pii_lexicon.py)
"""

from __future__ import annotations

import argparse
import csv
import gzip
import importlib.resources
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_TAGS = {"VBZ": "Z", "VBD": "D", "VBN": "N", "VBG": "G", "VB": "B", "VBP": "B"}


def lexicon() -> dict[str, set[str]]:
    """Every lower-case word form of the lexicon -> its tags (see the module's docstring)."""
    import lemminflect

    upos_tag = {"noun": "n", "adj": "a", "adv": "r", "aux": "x"}
    res = importlib.resources.files("lemminflect") / "resources" / "lemma_lu.csv.gz"
    out: dict[str, set[str]] = {}
    lemmas = set()
    with res.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as f:
        for row in csv.reader(f):
            if len(row) < 3 or not row[0].isalpha() or not row[0].islower():
                continue
            form, upos, lemma = row[0], row[1], row[2]
            if upos == "verb":
                lemmas.add(lemma)
            elif upos in upos_tag:
                out.setdefault(form, set()).add(upos_tag[upos])
    for lemma in sorted(lemmas):
        for tag, forms in lemminflect.getAllInflections(lemma, upos="VERB").items():
            for form in forms:
                if form.isalpha() and form.islower():
                    out.setdefault(form, set()).add(_TAGS[tag])
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=str(ROOT / "pii" / "data" / "lexicon.tsv.gz"))
    args = ap.parse_args()
    forms = lexicon()
    import lemminflect

    with gzip.GzipFile(args.out, "wb", mtime=0) as raw:  # byte-identical rebuilds
        raw.write(
            f"# built by tools/pii_lexicon.py from lemminflect {lemminflect.__version__}\n"
            "form\ttags\n".encode()
        )
        for form in sorted(forms):
            raw.write(f"{form}\t{''.join(sorted(forms[form]))}\n".encode())
    print(f"{len(forms)} word forms -> {args.out}")


if __name__ == "__main__":
    main()
