"""Scoring the PII detector on labeled text nobody here wrote for it.

Sources (``data/pii_eval/SOURCE.md`` says where each comes from):

* ``presidio_tuned.jsonl`` / ``presidio_heldback.jsonl``: presidio-evaluator's generated
  sentences (its templates, Faker values), split by template; scored as written and in
  lower and upper case (``case_variant``);
* ``casual_tuned.tsv`` / ``casual_heldback.tsv``: hand-labeled casual messages, split by
  phrasing (a phrasing is in one file only); ``casual_fresh.tsv``: a second held-back set
  of other phrasings, written later by another hand, for judging new candidates;
* Banking77's real messages (``data/banking77``) as a false-positive corpus: they hold
  almost no personal data, so every detection there is counted per 1,000 messages.

A labeled span counts as found when a detection of the same type covers at least half of
its characters; a detection is correct when it overlaps a labeled span of its type.
Labeled types outside ours (dates, organizations, places, titles) are kept as labels only:
a detection on one of them is a false positive.
"""

from __future__ import annotations

import csv
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EVAL_DIR = ROOT / "data" / "pii_eval"
BANKING77_DIR = ROOT / "data" / "banking77"

# presidio-evaluator's entity types -> ours; the rest are not scored as entities.
PRESIDIO_TYPE_MAP = {
    "PERSON": "PERSON", "STREET_ADDRESS": "ADDRESS", "EMAIL_ADDRESS": "EMAIL",
    "PHONE_NUMBER": "PHONE", "CREDIT_CARD": "CARD", "IBAN_CODE": "IBAN", "US_SSN": "US_SSN",
    "IP_ADDRESS": "IP_ADDRESS",
}  # fmt: skip
# "sentence": lower case with a capital at each sentence's and line's start and on "I", as a
# phone's keyboard types it ("Hi, my name is john smith"): names are not capitalized.
CASES = ("cased", "lower", "upper", "sentence")

Detector = Callable[[str], Iterable[tuple[int, int, str]]]


@dataclass
class Sample:
    text: str
    spans: list[tuple[int, int, str]]  # (start, end, our type or the source's own)
    group: str = ""  # template id or phrasing


@dataclass
class TypeScore:
    labeled: int = 0
    found: int = 0
    detections: int = 0
    correct: int = 0
    missed: list[str] = field(default_factory=list)
    false: list[str] = field(default_factory=list)

    def as_dict(self, examples: int = 0) -> dict:
        d = {
            "recall": round(self.found / self.labeled, 4) if self.labeled else None,
            "precision": round(self.correct / self.detections, 4) if self.detections else None,
            "labeled": self.labeled, "found": self.found,
            "detections": self.detections, "correct": self.correct,
        }  # fmt: skip
        if examples:
            d["missed_examples"] = self.missed[:examples]
            d["false_examples"] = self.false[:examples]
        return d


def _same_length_case(text: str, fn: Callable[[str], str]) -> str:
    # Offsets must survive: characters whose case form is longer ("ß" -> "SS") stay.
    out = fn(text)
    if len(out) == len(text):
        return out
    return "".join(c2 if len(c2 := fn(c)) == 1 else c for c in text)


_SENTENCE_START_RE = re.compile(r"(?:^|[.!?]\s+|\n\s*)([^\W\d_])")
_I_RE = re.compile(r"(?<![\w'’])i(?=['’](?:m|ve|d|ll)\b|(?![\w'’-]))")


def sentence_case(text: str) -> str:
    """``text`` lower-cased, then a capital at each sentence's and line's first letter and
    on the pronoun "I" ("I'm", "I've"): how a phone's keyboard capitalizes. Same length."""
    low = _same_length_case(text, str.lower)
    chars = list(low)
    for m in _SENTENCE_START_RE.finditer(low):
        up = chars[m.start(1)].upper()
        if len(up) == 1:
            chars[m.start(1)] = up
    for m in _I_RE.finditer(low):
        chars[m.start()] = "I"
    return "".join(chars)


def case_variant(samples: list[Sample], case: str) -> list[Sample]:
    if case == "cased":
        return samples
    if case == "sentence":
        return [Sample(sentence_case(s.text), s.spans, s.group) for s in samples]
    fn = str.lower if case == "lower" else str.upper
    return [Sample(_same_length_case(s.text, fn), s.spans, s.group) for s in samples]


def load_presidio(path: Path) -> list[Sample]:
    out = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            spans = [(s["start"], s["end"], PRESIDIO_TYPE_MAP.get(s["type"], s["type"]))
                     for s in r["spans"]]  # fmt: skip
            out.append(Sample(r["text"], spans, r["template_id"]))
    return out


_MARK_RE = re.compile(r"\[\[(.+?)(?:\|([A-Z_]+))?\]\]")


def parse_marked(marked: str) -> tuple[str, list[tuple[int, int, str]]]:
    """``"call me [[sarah]]"`` -> the text and its labeled spans (``[[x|TYPE]]``; PERSON
    when no type is given)."""
    text, spans, last = [], [], 0
    pos = 0
    for m in _MARK_RE.finditer(marked):
        text.append(marked[last : m.start()])
        pos += m.start() - last
        value = m.group(1)
        spans.append((pos, pos + len(value), m.group(2) or "PERSON"))
        text.append(value)
        pos += len(value)
        last = m.end()
    text.append(marked[last:])
    return "".join(text), spans


def load_casual(path: Path) -> list[Sample]:
    """``phrasing<TAB>marked text`` lines; ``#`` starts a comment line."""
    out = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        phrasing, marked = line.split("\t", 1)
        text, spans = parse_marked(marked)
        out.append(Sample(text, spans, phrasing))
    return out


def load_banking77(split: str = "test") -> list[str]:
    with open(BANKING77_DIR / f"{split}.csv", encoding="utf-8", newline="") as f:
        return [r["text"] for r in csv.DictReader(f)]


def score(samples: list[Sample], detect: Detector, types: Iterable[str], examples: int = 0) -> dict:
    """Per type: recall (labeled spans at least half covered by a detection of the type),
    precision (detections overlapping a labeled span of their type)."""
    types = tuple(types)
    per = {t: TypeScore() for t in types}
    for s in samples:
        dets = [d for d in detect(s.text) if d[2] in per]
        for ls, le, lt in s.spans:
            if lt not in per:
                continue
            sc = per[lt]
            sc.labeled += 1
            need = (le - ls) / 2
            if any(dt == lt and min(le, de) - max(ls, ds) >= need for ds, de, dt in dets):
                sc.found += 1
            elif len(sc.missed) < 200:
                sc.missed.append(f"{s.text[ls:le]!r} in {s.text!r}")
        for ds, de, dt in dets:
            sc = per[dt]
            sc.detections += 1
            if any(lt == dt and ds < le and ls < de for ls, le, lt in s.spans):
                sc.correct += 1
            elif len(sc.false) < 200:
                sc.false.append(f"{s.text[ds:de]!r} in {s.text!r}")
    return {t: v.as_dict(examples) for t, v in per.items() if v.labeled or v.detections}


def false_positives(texts: list[str], detect: Detector, examples: int = 0) -> dict:
    """Detections per 1,000 messages on a corpus that holds (almost) no personal data."""
    n_det, by_type, ex = 0, {}, []
    for t in texts:
        for s, e, ty in detect(t):
            n_det += 1
            by_type[ty] = by_type.get(ty, 0) + 1
            if len(ex) < examples:
                ex.append(f"{ty} {t[s:e]!r} in {t!r}")
    out = {"messages": len(texts), "detections": n_det,
           "per_1000": round(1000 * n_det / max(len(texts), 1), 3), "by_type": by_type}  # fmt: skip
    if examples:
        out["examples"] = ex
    return out
