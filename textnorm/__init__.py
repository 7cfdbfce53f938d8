"""Reference (pure Python) text normalization, dedup keys and shingling.

The Spark jobs implement the same rules with Spark's native functions (see
``jobs/spark/clean.py`` and ``jobs/spark/dedup.py``); this module is the readable
specification of those rules. The raw-data builder uses it to record the true
Jaccard similarity of each planted near-duplicate, and the tests check that the
Spark implementation agrees with it row for row.
"""

from __future__ import annotations

import json
import os
import re
import unicodedata
from pathlib import Path

from core.errors import StageError

# Format characters (Unicode category Cf) that are invisible but split words:
# zero-width space/joiners, BOM, word joiner, soft hyphen, bidi marks.
_INVISIBLE = "\u200b\u200c\u200d\u2060\ufeff\u00ad\u200e\u200f"
_INVISIBLE_RE = re.compile(f"[{_INVISIBLE}]")
# Hard control characters (C0 except \t \n \r, DEL, C1). Text that carries them was
# corrupted in transit (binary garbage, terminal escapes): such rows are quarantined,
# not repaired, because the surrounding text is no longer trustworthy.
CONTROL_RE = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
# Typical UTF-8-read-as-cp1252/latin-1 sequences ("â€™", "Ã©", "Â£"). A lead byte of a
# two- or three-byte UTF-8 sequence rendered in cp1252, followed by a continuation-byte
# rendering. Real text in the languages we serve practically never contains these pairs.
MOJIBAKE_RE = re.compile(r"(?:â[\u0080-\u00bf€‚ƒ„…†‡ˆ‰Š‹ŒŽ‘’“”•–—˜™š›œžŸ]|Ã[\u0080-\u00bf€‚ƒ„…†‡ˆ‰Š‹ŒŽ‘’“”•–—˜™š›œžŸ]|Â[\u00a0-\u00bf])")
_WS_RE = re.compile(r"\s+")


def normalize_text(text: str) -> str:
    """The clean stage's text normalization: NFKC, invisible characters removed,
    every whitespace run (tabs, newlines, NBSP after NFKC) collapsed to one space, trimmed."""
    text = unicodedata.normalize("NFKC", text)
    text = _INVISIBLE_RE.sub("", text)
    return _WS_RE.sub(" ", text).strip()


def dedup_key(text: str) -> str:
    """Key for exact duplicates: normalized text, lower-cased, punctuation removed.

    Case, punctuation and whitespace variants of a message share a key, so the exact
    pass catches them; only real wording changes are left to MinHash.
    """
    text = normalize_text(text).lower()
    text = "".join(c if (c.isalnum() or c.isspace()) else " " for c in text)
    return _WS_RE.sub(" ", text).strip()


def shingles(text: str, k: int = 5) -> set[bytes]:
    """k-byte shingles of the UTF-8 dedup key (the same as character shingles for ASCII).

    Bytes rather than characters because the Spark job packs each k-byte window into one
    64-bit integer without hashing (collision-free for k <= 8), which is what makes the
    vectorized MinHash fast. Keys shorter than k bytes are one shingle."""
    key = dedup_key(text).encode("utf-8")
    if len(key) <= k:
        return {key}
    return {key[i : i + k] for i in range(len(key) - k + 1)}


def jaccard(a: str, b: str, k: int = 5) -> float:
    sa, sb = shingles(a, k), shingles(b, k)
    if not sa and not sb:
        return 1.0
    return len(sa & sb) / len(sa | sb)


def normalize_label(label: str | None) -> str | None:
    """Labels as exported by a CRM come as "Card Arrival", "card-arrival", " CARD_ARRIVAL ":
    map them onto the canonical snake_case label set."""
    if label is None:
        return None
    out = re.sub(r"[\s\-]+", "_", label.strip().lower())
    return out or None


class LabelSetError(StageError, ValueError):
    """The label file cannot be read or is not a non-empty JSON list of strings."""


def load_label_set(path: str | os.PathLike[str]) -> list[str]:
    """The class list from a JSON file, canonicalized like the labels themselves and sorted.

    Every stage that reads the label set goes through this one function, so a label in the
    data is always findable in the list (Banking77 itself spells one class
    ``Refund_not_showing_up``)."""
    try:
        raw = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise LabelSetError(f"{path}: cannot read the label set: {exc}") from exc
    if not isinstance(raw, list) or not raw or not all(isinstance(x, str) for x in raw):
        raise LabelSetError(f"{path}: the label set must be a non-empty JSON list of strings")
    return sorted({normalize_label(x) for x in raw} - {None})
