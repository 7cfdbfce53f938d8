"""Leak scanner: search everything downstream of desensitization for known personal data.

Given the values that were planted in the raw export (the builder's ground truth, or any
list of known-sensitive values), it reads every file under the given folders — Parquet
string columns cell by cell, every other file (JSON, HTML, logs, MLflow artifacts) as
text — and reports each file in which any value occurs. Number-like values are also
searched in their digits-only form, so a card written ``4111 1111 1111 1111`` is found
as ``4111111111111111`` too.

Multi-pattern search with Aho-Corasick (pyahocorasick): hundreds of thousands of values
against gigabytes of text in one pass per file, where ``value in text`` per value would be
quadratic.

    intentops leak-scan --ground-truth var/demo/raw/ground_truth DIR [DIR ...]

Without a ground truth (your own export), ``--detect`` runs the desensitize stage's own
detector (``pii.detector.detect``) over the same cells and lines instead, and reports per
file and column how many spans of each type it still finds there: after masking, each is
either a leak or one of the detector's false positives, so the count is an upper bound
of what leaked. Values are never reported, only types, counts and sources.

    intentops leak-scan --detect var/lake/desensitize DIR [DIR ...]
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import pandas as pd

# Planted entity types whose values are personal data (the decoys are not).
SENSITIVE_TYPES = frozenset({
    "person_name", "email", "phone", "card_number", "iban", "us_ssn", "prc_id",
    "street_address", "ip_address",
})  # fmt: skip
_NUMERIC_TYPES = frozenset({"phone", "card_number", "us_ssn", "iban", "prc_id"})
_MIN_LEN = 6  # shorter values ("Li", "12 A St") would match unrelated text
_BINARY_SUFFIXES = {".png", ".jpg", ".jpeg", ".gif", ".onnx", ".pt", ".bin", ".safetensors",
                    ".crc", ".gz", ".zip", ".woff", ".woff2", ".ttf", ".ico"}


@dataclass(frozen=True)
class Hit:
    path: str
    entity: str
    where: str  # "column text" or "text"; the value itself is never reported


def needles(spans: pd.DataFrame) -> dict[str, str]:
    """value -> entity type, for the sensitive spans of a ground truth (with the
    digits-only and case-folded forms of number-like values)."""
    out: dict[str, str] = {}
    for value, kind in zip(spans["value"], spans["pii_type"], strict=True):
        if kind not in SENSITIVE_TYPES or not isinstance(value, str):
            continue
        forms = {value.strip()}
        if kind in _NUMERIC_TYPES:
            forms.add(re.sub(r"[^0-9A-Za-z]", "", value).upper())
        if kind == "email":
            forms.add(value.lower())
        for form in forms:
            if len(form) >= _MIN_LEN:
                out[form] = kind
    return out


def load_needles(ground_truth: str | Path) -> dict[str, str]:
    return needles(pd.read_parquet(Path(ground_truth) / "pii_spans.parquet",
                                   columns=["pii_type", "value"]))


class Scanner:
    def __init__(self, values: dict[str, str]) -> None:
        import ahocorasick

        self._auto = ahocorasick.Automaton()
        for value, kind in values.items():
            self._auto.add_word(value, kind)
            if value.upper() != value:  # names and addresses re-cased by a copy
                self._auto.add_word(value.upper(), kind)
        self.empty = not values
        if not self.empty:
            self._auto.make_automaton()

    def find(self, text: str) -> set[str]:
        if self.empty or not text:
            return set()
        return {kind for _, kind in self._auto.iter(text)}

    def scan_file(self, path: Path) -> Iterator[Hit]:
        if path.suffix == ".parquet":
            yield from self._scan_parquet(path)
        elif path.suffix.lower() not in _BINARY_SUFFIXES:
            text = path.read_bytes().decode("utf-8", errors="replace")
            for kind in sorted(self.find(text)):
                yield Hit(str(path), kind, "text")

    def _scan_parquet(self, path: Path) -> Iterator[Hit]:
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        for name in table.column_names:
            col = table.column(name)
            # Any column that can carry text: strings, and nested ones (annotations) as JSON.
            if str(col.type) in ("string", "large_string"):
                cells: Iterable[str] = (c for c in col.to_pylist() if c)
            elif str(col.type).startswith(("list", "struct", "map")):
                cells = (json.dumps(c, ensure_ascii=False) for c in col.to_pylist() if c)
            else:
                continue
            found: set[str] = set()
            for cell in cells:
                found |= self.find(cell)
            for kind in sorted(found):
                yield Hit(str(path), kind, f"column {name}")

    def scan(self, roots: Iterable[str | Path]) -> list[Hit]:
        hits: list[Hit] = []
        for root in roots:
            root = Path(root)
            files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
            for f in files:
                hits.extend(self.scan_file(f))
        return hits


def scan(roots: Iterable[str | Path], values: dict[str, str]) -> list[dict[str, str]]:
    return [asdict(h) for h in Scanner(values).scan(roots)]


class DetectorScanner(Scanner):
    """``Scanner`` with the PII detector in place of known values: ``find`` returns the
    types it detects in a text, ``counts`` how many spans of each type and which sources
    found them."""

    def __init__(self) -> None:
        self.empty = False
        self.counts: dict[tuple[str, str], dict[str, int]] = {}

    def find(self, text: str) -> set[str]:
        from pii import detector as pii

        found = set()
        for line in text.split("\n") if len(text) > 10_000 else (text,):
            for d in pii.detect(line):
                found.add(d.entity)
                key = (d.entity, d.source)
                self._current[key] = self._current.get(key, 0) + 1
        return found

    def scan_file(self, path: Path) -> Iterator[Hit]:
        self._current: dict[tuple[str, str], int] = {}
        yield from super().scan_file(path)
        for (entity, source), n in self._current.items():
            self.counts.setdefault((str(path), entity), {})[source] = n


def detect_scan(roots: Iterable[str | Path]) -> list[dict[str, object]]:
    """Per file and type found by the detector: where (columns or text), how many spans,
    and the sources that found them."""
    scanner = DetectorScanner()
    where: dict[tuple[str, str], set[str]] = {}
    for h in scanner.scan(roots):
        where.setdefault((h.path, h.entity), set()).add(h.where)
    return [
        {"path": p, "entity": e, "where": sorted(where[(p, e)]),
         "count": sum(scanner.counts.get((p, e), {}).values()),
         "sources": scanner.counts.get((p, e), {})}
        for p, e in sorted(where)
    ]  # fmt: skip
