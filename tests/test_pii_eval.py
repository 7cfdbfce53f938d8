"""The PII detector on text nobody here wrote for it (data/pii_eval/SOURCE.md): the
held-back halves of the independent evaluation sets, per phrasing tables, false detections
on real Banking77 messages, and determinism.

The held-back halves were never tuned on. The floors below are the issue's targets where
the detector meets them; where it does not yet (see docs/BENCHMARKS.md, "PII on text
nobody here wrote"), the floor is the figure measured when the detector was last trained,
less a small margin, so that a regression fails the suite and the gap stays visible.
"""

from __future__ import annotations

import pytest

from pipeline import pii
from pipeline import pii_eval as E

TYPES = ("PERSON", "ADDRESS", "PHONE", "CARD", "EMAIL", "IBAN", "US_SSN", "IP_ADDRESS")
TARGET = {"PERSON": (0.95, 0.95), "ADDRESS": (0.90, 0.95), "PHONE": (0.95, 0.95),
          "CARD": (0.95, 0.95)}  # fmt: skip
TARGET_OTHER = (0.99, 0.99)  # EMAIL, IBAN, US_SSN, IP_ADDRESS


def detect(text: str) -> list[tuple[int, int, str]]:
    return [(d.start, d.end, d.entity) for d in pii.detect(text)]


@pytest.fixture(scope="module")
def heldback() -> dict[str, list[E.Sample]]:
    return {
        "presidio": E.load_presidio(E.EVAL_DIR / "presidio_heldback.jsonl"),
        "casual": E.load_casual(E.EVAL_DIR / "casual_heldback.tsv"),
    }


def test_the_halves_are_apart() -> None:
    """No template, phrasing or message of a held-back half is in its tuned half."""
    for a, b, load in (("presidio_tuned.jsonl", "presidio_heldback.jsonl", E.load_presidio),
                       ("casual_tuned.tsv", "casual_heldback.tsv", E.load_casual)):
        tuned, held = load(E.EVAL_DIR / a), load(E.EVAL_DIR / b)
        assert not {s.group for s in tuned} & {s.group for s in held}
        assert not {s.text for s in tuned} & {s.text for s in held}
    casual = E.load_casual(E.EVAL_DIR / "casual_heldback.tsv")
    assert len(casual) >= 200 and len({s.group for s in casual}) >= 15


# Floors per (set, case, type): the target, or the figure measured on the held-back half
# less a margin where the target is not met (those are listed in docs/BENCHMARKS.md).
FLOORS: dict[tuple[str, str, str], tuple[float, float]] = {}


def floor(source: str, case: str, ent: str) -> tuple[float, float]:
    return FLOORS.get((source, case, ent), TARGET.get(ent, TARGET_OTHER))


@pytest.mark.parametrize("case", E.CASES)
@pytest.mark.parametrize("source", ["presidio", "casual"])
def test_heldback_recall_and_precision(heldback, source: str, case: str) -> None:
    scores = E.score(E.case_variant(heldback[source], case), detect, TYPES)
    failed = []
    for ent, v in scores.items():
        if not v["labeled"]:
            continue
        min_r, min_p = floor(source, case, ent)
        if v["recall"] < min_r or (v["precision"] or 0) < min_p:
            failed.append((ent, v["recall"], v["precision"], min_r, min_p))
    assert not failed, failed


@pytest.mark.parametrize("case", ["cased", "lower"])
def test_false_detections_on_real_banking77_messages(case: str) -> None:
    """At most 1 per 1,000 held-out (test split) messages, as written and lower-cased."""
    texts = E.load_banking77("test")
    if case == "lower":
        texts = [t.lower() for t in texts]
    fp = E.false_positives(texts, detect, examples=10)
    assert fp["per_1000"] <= 1.0, fp


def test_detections_are_deterministic(heldback) -> None:
    texts = [s.text for s in heldback["presidio"][:500]] + [s.text for s in heldback["casual"]]
    first = [pii.detect(t) for t in texts]
    pii._token_model.cache_clear()  # a fresh model load gives the same answers
    assert [pii.detect(t) for t in texts] == first
    assert [pii.detect(t) for t in reversed(texts)] == first[::-1]
