"""Defects and noise: benign Unicode/whitespace noise that ``normalize_text`` undoes,
labels spelled the way CRMs export them, and the defective rows the clean stage must
reject (empty, whitespace-only, control characters, mojibake, too long, bad labels,
malformed records).
"""

from __future__ import annotations

import random
import re

from demo.common import DEFECT_KINDS, TOO_LONG_CHARS, _check
from demo.parts import _SPACE_RE, _WORD_RE, Part, _edit_plain
from textnorm import MOJIBAKE_RE, normalize_label

_FW_ASCII = {c: c + 0xFEE0 for c in range(0x21, 0x7F)}
_INNER_RE = re.compile(r"[A-Za-z](?=[A-Za-z])")


def apply_noise(parts: list[Part], kind: str, rng: random.Random) -> list[Part] | None:
    """Benign noise that normalize_text undoes; None if the message offers no place for it."""
    if kind == "nbsp":
        return _edit_plain(parts, rng, _SPACE_RE, lambda m: "\u00a0")
    if kind == "tabs":
        return _edit_plain(parts, rng, _SPACE_RE, lambda m: "\t")
    if kind == "zero_width":
        return _edit_plain(parts, rng, _INNER_RE, lambda m: m.group() + "\u200b")
    if kind == "fullwidth":
        return _edit_plain(parts, rng, _WORD_RE, lambda m: m.group().translate(_FW_ASCII))
    raise ValueError(kind)


def label_variant(label: str, rng: random.Random) -> str:
    """The label as a CRM exports it; textnorm.normalize_label maps it back."""
    words = label.split("_")
    variants = (
        " ".join(w.capitalize() for w in words),
        "-".join(words),
        f" {label.upper()} ",
        "_".join(w.capitalize() for w in words),
        " ".join(words),
        f"{label} ",
    )
    v = rng.choice([x for x in variants if x != label])
    _check(normalize_label(v) == label, f"label variant {v!r} does not normalize to {label!r}")
    return v


def _mojibake(text: str) -> str:
    # Make sure there is a non-ASCII character to mangle, then read UTF-8 as cp1252.
    if "'" in text:
        text = text.replace("'", "’")
    elif text.isascii():
        text += " I’m still waiting."
    raw = text.encode("utf-8")
    try:
        out = raw.decode("cp1252")
    except UnicodeDecodeError:  # bytes cp1252 leaves undefined: latin-1 like most tools
        out = "".join(bytes([b]).decode("cp1252", errors="ignore") or chr(b) for b in raw)
    _check(MOJIBAKE_RE.search(out) is not None, f"mojibake not detectable: {out!r}")
    return out


def make_defect(kind: str, text: str, rng: random.Random) -> str:
    if kind == "empty_text":
        return ""
    if kind == "whitespace_text":
        return rng.choice(("   \t ", " ", "\t\t", "    ", " \t"))
    if kind == "control_chars":
        ch = rng.choice([chr(c) for c in range(0x00, 0x09)] + ["\x1b", "\x1b[31m"])
        cuts = [m.start() for m in _SPACE_RE.finditer(text)] or [len(text)]
        cut = rng.choice(cuts)
        return text[:cut] + ch + text[cut:]
    if kind == "mojibake":
        return _mojibake(text)
    if kind == "too_long":
        return " ".join([text] * (TOO_LONG_CHARS // (len(text) + 1) + 2))
    return text  # labels and malformed records keep a normal message


def _defect_kinds(n: int, fmt: str, rng: random.Random) -> list[str]:
    # Parquet has no physical record to break: its share goes to the other kinds.
    kinds = [k for k in DEFECT_KINDS if not (fmt == "parquet" and k == "malformed_record")]
    out = [kinds[i % len(kinds)] for i in range(n)]
    rng.shuffle(out)
    return out
