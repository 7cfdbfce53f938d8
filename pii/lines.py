"""Line-oriented PII detection and masking, as ``intentops pii detect`` runs it.

``detect_lines`` reads bytes, one text per line, and writes one JSON object of spans per
line (``pii_spans``), or with ``mask`` the line masked; ``DETECT_HELP`` is the command's
help text. Offsets are code points of the line as given: a line that is not
NFKC-normalized is detected in its normalized form and the spans mapped back
(``nfkc_map``).
"""

from __future__ import annotations

import bisect
import sys
import unicodedata
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["DETECT_HELP", "detect_lines", "nfkc_map", "pii_spans"]

DETECT_HELP = """\
Find personal data in text, one text per line: run it on a sample of your own export
before the pipeline to see what would be masked.

Reads UTF-8 text on stdin, one text per line (lines end at "\\n" only), and writes one
JSON object per input line, in order:

    {"spans": [{"type": "CARD", "start": 11, "end": 30, "source": "card-pattern+luhn"}]}

type is one of PERSON, ADDRESS, EMAIL, PHONE, CARD, IBAN, US_SSN, PRC_ID, IP_ADDRESS;
start/end are code-point offsets into that input line (end exclusive); source is the rule
or model that found the span. The values themselves are never printed. A line that is
not valid UTF-8 gives {"spans": [], "error": "invalid UTF-8 at byte N"}.

With --mask, each line is printed with its spans replaced (<CARD>, <EMAIL>, ...), in the
NFKC-normalized form the pipeline masks.

    intentops pii detect < sample.txt
    head -n 1000 export.txt | intentops pii detect --mask
"""


def nfkc_map(text: str) -> tuple[str, Callable[[int, int], tuple[int, int]]]:
    """``text`` NFKC-normalized, and a function from a span ``(start, end)`` of the
    normalized text to the span of ``text`` it came from (code points, end exclusive).

    ``text`` is cut into pieces that normalize on their own: a character, or a character
    with what normalization joins to it (combining marks, Hangul jamo, ...). A span's start
    goes to the start of the piece whose output holds it, its end to the end of the piece
    whose output holds ``end - 1``. So "ﬁ" (one character, "fi" normalized) maps back
    whole, and a full-width digit to itself.
    """
    norm = unicodedata.normalize("NFKC", text)
    pieces: list[tuple[int, tuple[int, int]]] = []  # (where its output starts, (start, end))
    for fine in (True, False):
        pieces, outs, pos = [], [], 0
        for s, e in _nfkc_pieces(text, fine):
            outs.append(unicodedata.normalize("NFKC", text[s:e]))
            pieces.append((pos, (s, e)))
            pos += len(outs[-1])
        if "".join(outs) == norm:  # the cut is exact (always so with fine=False)
            break
    else:  # not reached
        pieces = []
    if not pieces:  # empty text (or no exact cut): one piece
        pieces = [(0, (0, len(text)))]
    keys = [k for k, _ in pieces]

    def to_original(start: int, end: int) -> tuple[int, int]:
        first = pieces[max(bisect.bisect_right(keys, start) - 1, 0)][1]
        last = pieces[max(bisect.bisect_right(keys, max(end - 1, start)) - 1, 0)][1]
        return first[0], last[1]

    return norm, to_original


def _nfkc_pieces(text: str, fine: bool) -> list[tuple[int, int]]:
    """Cut ``text`` into pieces that should normalize independently (see ``nfkc_map``).

    ``fine``: a cut before every starter that normalization does not join to the piece
    before it (checked on at most the piece's last 32 characters; ``nfkc_map`` checks the
    whole). Otherwise cut only before ASCII characters: nothing composes with a following
    ASCII character and nothing is reordered across one, so those cuts are always exact.
    """
    if not text:
        return []
    bounds = [0]
    start = 0
    for i in range(1, len(text)):
        c = text[i]
        if c < "\x80":
            bounds.append(i)
            start = i
        # A combining mark (or a character that decomposes into them) stays with its base.
        elif fine and not unicodedata.combining(unicodedata.normalize("NFKD", c)[0]):
            seg = text[max(start, i - 32) : i]
            if unicodedata.normalize("NFKC", seg + c) == unicodedata.normalize(
                "NFKC", seg
            ) + unicodedata.normalize("NFKC", c):
                bounds.append(i)
                start = i
    bounds.append(len(text))
    return list(zip(bounds, bounds[1:], strict=False))


def pii_spans(line: str) -> list[dict]:
    """The PII spans of one line, offsets into ``line``; never the values themselves."""
    from pii import detector as pii

    if unicodedata.is_normalized("NFKC", line):
        norm, to_original = line, None
    else:
        norm, to_original = nfkc_map(line)
    spans = []
    for d in pii.detect(norm):
        start, end = to_original(d.start, d.end) if to_original else (d.start, d.end)
        spans.append({"type": d.entity, "start": start, "end": end, "source": d.source})
    spans.sort(key=lambda sp: (sp["start"], sp["end"]))
    return spans


def detect_lines(stdin, stdout, stderr, mask: bool = False) -> int:
    """``intentops pii detect``: stdin bytes in, one JSON object (or masked line) per line."""
    import json

    from pii import detector as pii

    try:
        for n, raw in enumerate(stdin, 1):
            chunk = raw[:-1] if raw.endswith(b"\n") else raw
            if chunk.endswith(b"\r"):
                chunk = chunk[:-1]
            try:
                line = chunk.decode("utf-8", errors="strict")
            except UnicodeDecodeError as exc:
                if mask:
                    stdout.write(b"\n")
                    print(f"line {n}: invalid UTF-8", file=stderr)
                else:
                    obj = {"spans": [], "error": f"invalid UTF-8 at byte {exc.start}"}
                    stdout.write(json.dumps(obj, ensure_ascii=False).encode() + b"\n")
                continue
            try:
                if mask:
                    out = pii.mask(line)[0]
                else:
                    out = json.dumps({"spans": pii_spans(line)}, ensure_ascii=False)
            except Exception as exc:  # one bad line must not stop the rest
                name = type(exc).__name__
                if mask:
                    out = ""
                    print(f"line {n}: {name}", file=stderr)
                else:
                    out = json.dumps({"spans": [], "error": name}, ensure_ascii=False)
            stdout.write(out.encode("utf-8", errors="surrogatepass") + b"\n")
        stdout.flush()
    except BrokenPipeError:  # e.g. `| head`: the reader is gone, which is not an error
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0
