"""Behavioural checks a model must pass before registration (CheckList-style: Ribeiro et
al., 2020): invariance tests on the dataset's own messages and a minimum-functionality
table of probes the user supplies.

* **PII-placeholder invariance**: masked personal data carries no intent. Swapping one
  placeholder for another (``<PERSON>`` -> ``<EMAIL>``) or appending a masked sign-off
  ("Thanks, <PERSON>") must not change the prediction. Run only when the training split
  holds placeholders in enough rows (``training.min_placeholder_share``): a model that
  never saw them had no way to learn they carry no intent.
* **Casing invariance**: customers write in any case; lower- and upper-casing a message
  must not change the prediction.
* **Minimum functionality**: short, unambiguous messages with one right intent each, from
  ``training.probes_file`` (CSV ``text,label``; the demo's is ``data/banking77/probes.csv``).

The invariances run on a sample of the curated **val** split (the test split stays for the
metric). A check that does not apply to the dataset is listed under ``skipped`` with the
reason instead of being run; each check that ran reports its rate and threshold, and a
model passes when every check that ran does.
"""

from __future__ import annotations

import csv
import re
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from core.stage import StageVerdict
from textnorm import normalize_label

ENTITIES = ("PERSON", "EMAIL", "PHONE", "CARD", "IBAN", "US_SSN", "PRC_ID", "ADDRESS", "IP_ADDRESS")
# A typed placeholder (<EMAIL>) or a keyed pseudonym (<EMAIL_3f9a0c17d2>), as pii.mask writes them.
PLACEHOLDER_RE = re.compile(r"<(" + "|".join(ENTITIES) + r")(_[0-9a-f]{6,64})?>")
SWAP = {"PERSON": "EMAIL", "EMAIL": "PHONE", "PHONE": "PERSON", "CARD": "IBAN", "IBAN": "CARD",
        "US_SSN": "PRC_ID", "PRC_ID": "US_SSN", "ADDRESS": "PERSON", "IP_ADDRESS": "EMAIL"}
SIGN_OFFS = (" Thanks, <PERSON>", " You can reach me at <EMAIL>.", " My number is <PHONE>.")

PII_CHECK = "invariance_pii_placeholders"
CASING_CHECKS = ("invariance_lowercase", "invariance_uppercase")
FUNCTIONALITY_CHECK = "minimum_functionality"
SHOWN = 5  # names listed in a message before "..."


class ProbesError(StageVerdict, ValueError):
    """The probes file cannot be read, is malformed, or names labels the model lacks: the
    run cannot pass registration, and retrying the task does not change that."""


def _pct(x: float) -> str:
    return f"{x * 100:.2g}%"


def _rate(before: Sequence[str], after: Sequence[str]) -> float:
    return sum(a == b for a, b in zip(before, after, strict=True)) / max(len(before), 1)


def _names(items: Iterable[str], sort: bool = True) -> str:
    items = sorted(items) if sort else list(items)
    more = f", ... ({len(items) - SHOWN} more)" if len(items) > SHOWN else ""
    return ", ".join(items[:SHOWN]) + more


# -- which checks apply ---------------------------------------------------------------


def placeholder_share(texts: Iterable[str]) -> tuple[int, int]:
    """(rows holding at least one placeholder or pseudonym, rows)."""
    n = hits = 0
    for t in texts:
        n += 1
        hits += bool(PLACEHOLDER_RE.search(t or ""))
    return hits, n


def placeholder_skip_note(train_texts: Iterable[str], min_share: float) -> str | None:
    """None when the PII-placeholder invariance applies to a model trained on
    ``train_texts``; else the note saying why it is skipped."""
    hits, n = placeholder_share(train_texts)
    share = hits / n if n else 0.0
    if n and share >= min_share:
        return None
    return (f"skipped: {_pct(share)} of training rows hold a placeholder ({hits:,} of {n:,}), "
            f"below training.min_placeholder_share {_pct(min_share)}")


# -- probes ---------------------------------------------------------------------------


def load_probes(path: str | Path) -> list[tuple[str, str]]:
    """(text, label) pairs from a CSV with columns ``text,label`` (other columns ignored);
    labels are canonicalized like the data's (``Card Arrival`` -> ``card_arrival``)."""
    path = Path(path)
    try:
        with path.open(newline="", encoding="utf-8-sig") as fh:
            reader = csv.DictReader(fh)
            cols = [c.strip().lower() for c in reader.fieldnames or []]
            if "text" not in cols or "label" not in cols:
                raise ProbesError(f"training.probes_file {path}: needs the columns text,label; "
                                  f"the header is {','.join(reader.fieldnames or []) or '(empty)'}")
            reader.fieldnames = cols
            rows = list(reader)
    except OSError as exc:
        raise ProbesError(f"training.probes_file {path}: cannot read it: {exc}") from exc
    except (csv.Error, UnicodeDecodeError) as exc:
        raise ProbesError(f"training.probes_file {path}: not a readable CSV: {exc}") from exc
    probes, bad = [], []
    for line, row in enumerate(rows, start=2):
        text, label = (row.get("text") or "").strip(), normalize_label(row.get("label") or "")
        if not text or not label:
            bad.append(str(line))
            continue
        probes.append((text, label))
    if bad:
        raise ProbesError(f"training.probes_file {path}: empty text or label on line(s) "
                          f"{_names(bad, sort=False)}")
    if not probes:
        raise ProbesError(f"training.probes_file {path}: no probes (set training.probes_file "
                          "to an empty string to skip the minimum-functionality check)")
    return probes


def check_probe_labels(probes: Sequence[tuple[str, str]], classes: Iterable[str],
                       path: str | Path = "training.probes_file") -> None:
    """Every probe's label must be one the model predicts: a probe it cannot get right
    measures the file, not the model."""
    known = set(classes)
    unknown = {y for _, y in probes if y not in known}
    if unknown:
        n = sum(y in unknown for _, y in probes)
        raise ProbesError(
            f"{path}: {n} of {len(probes)} probes have a label outside the model's label set "
            f"({len(known)} labels): {_names(unknown)}. Fix the labels in the probes file, or "
            "point training.probes_file at probes for this dataset (empty skips the check)")


# -- the checks -----------------------------------------------------------------------


def pii_variants(texts: Sequence[str]) -> list[str]:
    """One variant per text: placeholders swapped when it has any, else a masked sign-off."""
    out = []
    for i, t in enumerate(texts):
        if PLACEHOLDER_RE.search(t):
            out.append(PLACEHOLDER_RE.sub(lambda m: f"<{SWAP[m.group(1)]}{m.group(2) or ''}>", t))
        else:
            out.append(t.rstrip() + SIGN_OFFS[i % len(SIGN_OFFS)])
    return out


def run_checks(
    predict: Callable[[list[str]], list[str]],
    texts: Sequence[str],
    classes: Sequence[str],
    *,
    probes: Sequence[tuple[str, str]] | None = None,
    min_invariance: float = 0.95,
    min_functionality: float = 0.8,
    skip: dict[str, str] | None = None,
) -> dict[str, Any]:
    """Run every check that applies.

    ``texts``: a sample of the dataset's (masked) val messages, for the invariances;
    ``probes``: (text, label) pairs for minimum functionality (None or empty: skipped);
    ``skip``: {check name: note} for checks that do not apply to this dataset (see
    :func:`placeholder_skip_note`). Returns {passed, checks, skipped}."""
    texts = list(texts)
    skipped = [{"name": k, "note": v} for k, v in (skip or {}).items()]
    skip_names = set(skip or {})
    checks = []
    variants = {PII_CHECK: pii_variants, CASING_CHECKS[0]: lambda ts: [t.lower() for t in ts],
                CASING_CHECKS[1]: lambda ts: [t.upper() for t in ts]}
    todo = [n for n in variants if n not in skip_names]
    if todo and not texts:
        skipped += [{"name": n, "note": "skipped: no val messages to check"} for n in todo]
        todo = []
    if todo:
        base = predict(texts)
        for name in todo:
            rate = _rate(base, predict(variants[name](texts)))
            checks.append({"name": name, "rate": round(rate, 6), "threshold": min_invariance,
                           "passed": rate >= min_invariance, "items": len(texts)})
    if FUNCTIONALITY_CHECK not in skip_names:
        if not probes:
            skipped.append({"name": FUNCTIONALITY_CHECK,
                            "note": "skipped: no probes (training.probes_file is empty)"})
        else:
            check_probe_labels(probes, classes)
            got = predict([t for t, _ in probes])
            rate = _rate([y for _, y in probes], got)
            failures = [{"text": t, "expected": y, "got": g}
                        for (t, y), g in zip(probes, got, strict=True) if g != y]
            checks.append({"name": FUNCTIONALITY_CHECK, "rate": round(rate, 6),
                           "threshold": min_functionality, "passed": rate >= min_functionality,
                           "items": len(probes), "failures": failures})
    return {"passed": all(c["passed"] for c in checks), "checks": checks, "skipped": skipped}


def check_dataset(
    predict: Callable[[list[str]], list[str]],
    curated: Any,
    classes: Sequence[str],
    *,
    probes: Sequence[tuple[str, str]] | None = None,
    sample: int = 500,
    min_placeholder_share: float = 0.01,
    min_invariance: float = 0.95,
    min_functionality: float = 0.8,
) -> dict[str, Any]:
    """The checks for a model trained on ``curated`` (the label-QA curated set: columns
    ``text`` and ``split``): the invariances on a seeded sample of ``sample`` val messages
    (test stays for the metric), the PII-placeholder one only when the train split holds
    enough placeholders; the probes for minimum functionality."""
    val = curated[curated.split == "val"].text
    texts = val.sample(min(len(val), sample), random_state=0).tolist()
    skip = {}
    note = placeholder_skip_note(curated[curated.split == "train"].text, min_placeholder_share)
    if note:
        skip[PII_CHECK] = note
    out = run_checks(predict, texts, classes, probes=probes, min_invariance=min_invariance,
                     min_functionality=min_functionality, skip=skip)
    out["sample"] = {"split": "val", "items": len(texts), "of": len(val)}
    return out

