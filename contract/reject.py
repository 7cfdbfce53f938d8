"""The reject rule: when the model's answer is "none of my intents".

The score is the **maximum softmax probability** (MSP; Hendrycks and Gimpel, 2017) of the
model's own answer. Why MSP rather than a Mahalanobis distance on the embeddings: it needs
nothing but the logits every build already outputs (the int8 build keeps it without a
second graph output), and it is a probability in [0, 1] that the answer already carries
as ``score``. The energy score (logsumexp of the logits) needs nothing more and, measured
side by side on Banking77 with held-back intents, caught more of them at the same in-scope
keep rate (0.78 against 0.73; docs/BENCHMARKS.md, issue 22): it is the candidate for a
second ``score`` of this rule, not yet built.

The threshold is calibrated on the validation split for a target **in-scope recall**: the
share of in-scope messages the model must still answer in scope (default 0.97). Messages
the model already assigns to the out-of-scope label count against that share first; the
threshold then rejects the least confident answers up to the remaining allowance. Too few
in-scope validation messages give no threshold (with the reason), never a guessed one.

An answer is ``{"label", "score", "oos"}``: out of scope (``oos`` true) when the model's
top label is the out-of-scope label, or its score is below the threshold; ``label`` is then
the out-of-scope label, or ``None`` with ``"abstain": true`` when the label set has none.

numpy only: the model server imports this module.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

SCORE = "max_softmax"


@dataclass(frozen=True)
class RejectRule:
    threshold: float | None  # None: nothing below a score is rejected
    oos_label: str | None
    target_in_scope_recall: float
    calibration_rows: int  # in-scope validation messages it was calibrated on
    note: str  # how it was chosen, or why there is no threshold
    score: str = SCORE

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any] | None) -> RejectRule:
        """The rule a build carries; a build without one rejects nothing."""
        if not d:
            return cls(None, None, 1.0, 0, "no reject rule in the build")
        if d.get("score", SCORE) != SCORE:
            raise ValueError(f"unknown reject score {d.get('score')!r}; this runtime knows {SCORE!r}")
        return cls(d.get("threshold"), d.get("oos_label"), float(d.get("target_in_scope_recall", 1.0)),
                   int(d.get("calibration_rows", 0)), str(d.get("note", "")))


def softmax(logits: np.ndarray) -> np.ndarray:
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def calibrate(probs: np.ndarray, y_true: Sequence[str], labels: Sequence[str], oos_label: str | None,
              target: float, min_rows: int) -> RejectRule:
    """The reject rule for ``probs`` (rows of class probabilities in ``labels`` order) of
    the validation messages whose true labels are ``y_true``."""
    labels = list(labels)
    if oos_label is not None and oos_label not in labels:
        raise ValueError(f"oos label {oos_label!r} is not in the model's label set")
    truth = np.asarray(list(y_true), dtype=object)
    in_scope = truth != oos_label if oos_label is not None else np.ones(len(truth), dtype=bool)
    n = int(in_scope.sum())
    if n < min_rows:
        return RejectRule(None, oos_label, target, n,
                          f"no threshold: the validation split has {n} in-scope messages, "
                          f"calibration needs at least {min_rows} (oos.min_calibration_rows)")
    p = probs[in_scope]
    top = p.argmax(axis=1)
    score = p.max(axis=1)
    by_label = top == labels.index(oos_label) if oos_label is not None else np.zeros(n, dtype=bool)
    allowance = int(np.floor(n * (1 - target) + 1e-9)) - int(by_label.sum())
    if allowance <= 0:
        return RejectRule(0.0, oos_label, target, n,
                          f"threshold 0: the model already answers {int(by_label.sum())} of {n} "
                          f"in-scope validation messages with the out-of-scope label, the target "
                          f"{target} allows {int(np.floor(n * (1 - target) + 1e-9))}")
    answered = np.sort(score[~by_label])
    if allowance >= len(answered):
        return RejectRule(1.0, oos_label, target, n, "every in-scope answer may be rejected")
    # Midway between the last rejected and the first kept score: a build whose scores move
    # a little (int8) makes the same decisions.
    t = float((answered[allowance - 1] + answered[allowance]) / 2)
    kept = float(((score >= t) & ~by_label).mean())
    return RejectRule(round(t, 6), oos_label, target, n,
                      f"max-softmax threshold {t:.4f}: {kept:.4f} of {n} in-scope validation "
                      f"messages answered in scope (target {target})")


def decide(probs: np.ndarray, labels: Sequence[str], rule: RejectRule) -> list[dict[str, Any]]:
    """One answer per row of ``probs``."""
    top = probs.argmax(axis=1)
    out = []
    for k, i in enumerate(top.tolist()):
        score = float(probs[k, i])
        label = labels[i]
        if rule.oos_label is not None and label == rule.oos_label:
            out.append({"label": label, "score": score, "oos": True})
        elif rule.threshold is not None and score < rule.threshold:
            if rule.oos_label is not None:
                out.append({"label": rule.oos_label, "score": score, "oos": True})
            else:
                out.append({"label": None, "score": score, "oos": True, "abstain": True})
        else:
            out.append({"label": label, "score": score, "oos": False})
    return out


def oos_metrics(y_true: Sequence[str], answers: Sequence[dict[str, Any]],
                oos_label: str | None) -> dict[str, float | int | None]:
    """In-scope accuracy (an in-scope message answered out of scope counts as wrong), the
    share of in-scope messages rejected, and, when the label set has the out-of-scope label,
    out-of-scope precision and recall."""
    truth = list(y_true)
    is_oos = [oos_label is not None and t == oos_label for t in truth]
    said = [bool(a["oos"]) for a in answers]
    ins = [i for i, o in enumerate(is_oos) if not o]
    out: dict[str, float | int | None] = {
        "in_scope_rows": len(ins),
        "in_scope_accuracy": (sum(1 for i in ins if not said[i] and answers[i]["label"] == truth[i]) / len(ins)
                              if ins else None),
        "in_scope_rejected": sum(1 for i in ins if said[i]) / len(ins) if ins else None,
    }
    if oos_label is not None:
        n_oos = sum(is_oos)
        n_said = sum(said)
        hit = sum(1 for o, s in zip(is_oos, said, strict=True) if o and s)
        out |= {"oos_rows": n_oos, "oos_recall": hit / n_oos if n_oos else None,
                "oos_precision": hit / n_said if n_said else None}
    return out


def decision_agreement(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]]) -> float:
    """Share of rows on which two builds make the same out-of-scope decision."""
    if not a:
        return 1.0
    return sum(1 for x, y in zip(a, b, strict=True) if x["oos"] == y["oos"]) / len(a)
