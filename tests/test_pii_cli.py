"""``intentops pii detect``: the real command as a subprocess, one call per test.

PERSON results depend on the name model, which is retrained now and then, so nothing
here asserts on them."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest

from pii.lines import detect_lines, nfkc_map

ROOT = Path(__file__).resolve().parent.parent
TYPES = {"PERSON", "ADDRESS", "EMAIL", "PHONE", "CARD", "IBAN", "US_SSN", "PRC_ID", "IP_ADDRESS"}

CARD = "4111 1111 1111 1111"
EMAIL = "jo@example.com"
WIDE_CARD = "４１１１ １１１１ １１１１ １１１１"


def _run(data: bytes, *extra: str) -> subprocess.CompletedProcess[bytes]:
    proc = subprocess.run(
        [sys.executable, "-m", "ops.cli", "pii", "detect", *extra],
        input=data,
        capture_output=True,
        cwd=ROOT,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    return proc


def _objects(stdout: bytes) -> list[dict]:
    assert stdout.endswith(b"\n")
    return [json.loads(line) for line in stdout.decode("utf-8").split("\n")[:-1]]


def _check_spans(obj: dict, line: str) -> None:
    spans = obj["spans"]
    assert [(s["start"], s["end"]) for s in spans] == sorted((s["start"], s["end"]) for s in spans)
    for s in spans:
        assert set(s) == {"type", "start", "end", "source"}
        assert s["type"] in TYPES
        assert isinstance(s["source"], str) and s["source"]
        assert 0 <= s["start"] < s["end"] <= len(line)


def _only(obj: dict, type_: str) -> dict:
    found = [s for s in obj["spans"] if s["type"] == type_]
    assert len(found) == 1, obj
    return found[0]


def test_one_object_per_line_with_exact_offsets() -> None:
    lines = [
        f"my card is {CARD}",
        "",
        f"mail {EMAIL} now",
        None,  # invalid UTF-8 in the middle of the input
        f"ﬁle card {WIDE_CARD}",  # not NFKC: the ligature and full-width digits
        "one\u2028line\x0bwith odd\x00separators, card " + CARD,
        f"windows line end {EMAIL}",
    ]
    raw = [
        b"bad \xff\xfe bytes" if line is None else line.encode("utf-8") for line in lines
    ]
    raw[-1] += b"\r"
    proc = _run(b"\n".join(raw) + b"\n")
    out = _objects(proc.stdout)
    assert len(out) == len(lines)

    assert out[1] == {"spans": []}
    assert out[3] == {"spans": [], "error": "invalid UTF-8 at byte 4"}
    for obj, line in zip(out, lines, strict=True):
        if line is not None:
            assert "error" not in obj, obj
            _check_spans(obj, line)

    card = _only(out[0], "CARD")
    assert (card["start"], card["end"]) == (11, 30)
    assert lines[0][card["start"] : card["end"]] == CARD
    email = _only(out[2], "EMAIL")
    assert lines[2][email["start"] : email["end"]] == EMAIL
    wide = _only(out[4], "CARD")
    assert lines[4][wide["start"] : wide["end"]] == WIDE_CARD
    card = _only(out[5], "CARD")
    assert lines[5][card["start"] : card["end"]] == CARD
    email = _only(out[6], "EMAIL")
    assert lines[6][email["start"] : email["end"]] == EMAIL

    # The values themselves are never printed.
    for value in (CARD, CARD.replace(" ", ""), EMAIL, WIDE_CARD):
        assert value.encode() not in proc.stdout


def test_no_final_newline_and_huge_token() -> None:
    huge = "x7" * 100_000  # one 200,000-character token
    proc = _run(f"{huge}\nlast {EMAIL}".encode())
    out = _objects(proc.stdout)
    assert len(out) == 2
    assert "error" not in out[0]
    _check_spans(out[0], huge)
    assert _only(out[1], "EMAIL")["start"] == 5


def test_mask() -> None:
    data = f"my card is {CARD}\n".encode() + b"\xff\n" + f"mail {EMAIL} now\n\n".encode()
    proc = _run(data, "--mask")
    assert proc.stdout.decode("utf-8").split("\n") == [
        "my card is <CARD>",
        "",
        "mail <EMAIL> now",
        "",
        "",
    ]
    assert b"line 2: invalid UTF-8" in proc.stderr
    assert b"\xff" not in proc.stderr


def test_help_says_what_it_is_for() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "ops.cli", "pii", "detect", "--help"],
        capture_output=True,
        cwd=ROOT,
        timeout=60,
    )
    assert proc.returncode == 0
    assert b"sample of your own export" in proc.stdout


@pytest.mark.parametrize(
    ("text", "value"),
    [
        (f"ﬁle card {WIDE_CARD}", WIDE_CARD),  # ligature before: lengths change
        ("ﬃﬃ ｊｏ＠ｅｘａｍｐｌｅ．ｃｏｍ", "ｊｏ＠ｅｘａｍｐｌｅ．ｃｏｍ"),
        ("cafe\u0301 ①② x", "①②"),  # combining accent composes, circled digits
        ("\u1100\u1161\u11a8 ㍀ end", "㍀"),  # Hangul jamo compose; one char -> 5
        ("ｶﾞ ﬁ", "ﬁ"),  # half-width kana and voiced mark compose
    ],
)
def test_nfkc_map(text: str, value: str) -> None:
    norm, to_original = nfkc_map(text)
    assert norm == unicodedata.normalize("NFKC", text)
    target = unicodedata.normalize("NFKC", value)
    start = norm.index(target)
    assert to_original(start, start + len(target)) == (
        text.index(value),
        text.index(value) + len(value),
    )
    # A span inside one character's output maps to that whole character.
    if value == "ﬁ":
        assert to_original(start, start + 1) == to_original(start + 1, start + 2)


def test_nfkc_map_covers_every_span() -> None:
    text = "a\u0316\u0301 \u0f73\u0301 ｶﾞ \u1100\u1161 ﬁ ①"  # reordering and composition
    norm, to_original = nfkc_map(text)
    assert norm == unicodedata.normalize("NFKC", text)
    for a in range(len(norm)):
        for b in range(a + 1, len(norm) + 1):
            s, e = to_original(a, b)
            assert 0 <= s < e <= len(text)
            assert (s, e) == (to_original(a, a + 1)[0], to_original(b - 1, b)[1])
    assert nfkc_map("")[0] == ""


def test_a_failing_line_gives_the_exception_name(monkeypatch: pytest.MonkeyPatch) -> None:
    from pii import detector as pii

    def boom(text: str) -> list:
        if "boom" in text:
            raise RuntimeError(f"secret {text}")
        return []

    monkeypatch.setattr(pii, "detect", boom)
    out, err = io.BytesIO(), io.StringIO()
    assert detect_lines(io.BytesIO(b"a boom 4111\nfine\n"), out, err) == 0
    assert out.getvalue() == b'{"spans": [], "error": "RuntimeError"}\n{"spans": []}\n'
    out = io.BytesIO()
    assert detect_lines(io.BytesIO(b"a boom 4111\nfine\n"), out, err, mask=True) == 0
    assert out.getvalue() == b"\nfine\n"
    assert err.getvalue() == "line 1: RuntimeError\n"
