"""Messages as parts: a message is a list of (text, span type or None) pieces, so that
PII and decoy values keep exact span offsets through every later edit (copies, noise).

Also the patterns and helpers the editing modules share (plain-part edits, spaces, words,
lower-casing a message's first letter).
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Sequence

# A message is a list of parts (text, span type or None); typed parts are the recorded
# PII/decoy values. Edits touch plain parts only (a re-sent ticket keeps its PII values),
# and rendering recomputes every span offset.
Part = tuple[str, str | None]
Span = tuple[str, int, int]


def render(parts: Sequence[Part]) -> tuple[str, list[Span]]:
    out, spans, pos = [], [], 0
    for text, kind in parts:
        if not text:
            continue
        if kind is not None:
            spans.append((kind, pos, pos + len(text)))
        out.append(text)
        pos += len(text)
    return "".join(out), spans


def to_parts(text: str, spans: Sequence[Span] | None) -> list[Part]:
    if not spans:
        return [(text, None)]
    parts: list[Part] = []
    pos = 0
    for kind, start, end in sorted(spans, key=lambda s: s[1]):
        parts.append((text[pos:start], None))
        parts.append((text[start:end], kind))
        pos = end
    parts.append((text[pos:], None))
    return [p for p in parts if p[0]]


def _edit_plain(parts: list[Part], rng: random.Random, pattern: re.Pattern[str],
                edit: Callable[[re.Match[str]], str]) -> list[Part] | None:
    """Apply ``edit`` to one random match of ``pattern`` inside a plain part; None if none."""
    hits = [(i, m) for i, (t, k) in enumerate(parts) if k is None for m in pattern.finditer(t)]
    if not hits:
        return None
    i, m = rng.choice(hits)
    t = parts[i][0]
    return [*parts[:i], (t[: m.start()] + edit(m) + t[m.end():], None), *parts[i + 1:]]


_SPACE_RE = re.compile(r" ")
# A word not glued to an apostrophe or a digit: replacing it keeps its neighbours intact.
_WORD_RE = re.compile(r"(?<![\w'’])[A-Za-z]{2,}(?![\w'’])")


def _lower_first(text: str) -> str:
    if text[:2] in ("I ", "I'") or not text[:1].isupper():
        return text
    return text[0].lower() + text[1:]
