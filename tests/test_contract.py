"""The build's contract: the reject rule (calibration, decisions, figures) and the request
preprocessing, and the gates that read them (registry, int8 export)."""

from __future__ import annotations

import numpy as np
import pytest

from contract import preprocess, reject
from contract.preprocess import PreprocessingError, Preprocessor
from export import onnx_build
from training import registry

LABELS = ["balance", "card", "oos", "transfer"]


def _probs(top: list[int], scores: list[float], n_classes: int = 4) -> np.ndarray:
    """Rows whose argmax is ``top`` with probability ``score``, the rest spread evenly."""
    p = np.zeros((len(top), n_classes))
    for i, (k, s) in enumerate(zip(top, scores, strict=True)):
        p[i, :] = (1 - s) / (n_classes - 1)
        p[i, k] = s
    return p


def test_calibration_keeps_the_target_share_of_in_scope_messages():
    # 100 in-scope messages answered in scope with scores 0.505, 0.51, ..., 1.0, and 20
    # out-of-scope ones: at target 0.97 the 3 least confident in-scope answers go.
    scores = [0.5 + 0.005 * (i + 1) for i in range(100)]
    probs = np.vstack([_probs([0] * 100, scores), _probs([2] * 20, [0.9] * 20)])
    truth = ["balance"] * 100 + ["oos"] * 20
    rule = reject.calibrate(probs, truth, LABELS, "oos", target=0.97, min_rows=50)
    assert rule.threshold == pytest.approx((0.515 + 0.52) / 2)
    assert rule.calibration_rows == 100
    answers = reject.decide(probs, LABELS, rule)
    kept = [not a["oos"] for a in answers[:100]]
    assert sum(kept) == 97 and kept[:3] == [False] * 3
    assert all(a["oos"] and a["label"] == "oos" for a in answers[100:])


def test_messages_answered_with_the_oos_label_count_against_the_allowance():
    scores = [0.5 + 0.005 * (i + 1) for i in range(100)]
    top = [2] * 2 + [0] * 98  # the model already sends 2 in-scope messages to "oos"
    rule = reject.calibrate(_probs(top, scores), ["balance"] * 100, LABELS, "oos", 0.97, 50)
    assert rule.threshold == pytest.approx((scores[2] + scores[3]) / 2)  # one more rejected
    over = reject.calibrate(_probs([2] * 5 + [0] * 95, scores), ["balance"] * 100, LABELS, "oos", 0.97, 50)
    assert over.threshold == 0.0 and "already answers 5" in over.note


def test_too_small_a_validation_split_gives_no_threshold_and_an_unknown_oos_label_fails():
    rule = reject.calibrate(_probs([0] * 30, [0.9] * 30), ["balance"] * 30, LABELS, None, 0.97, 200)
    assert rule.threshold is None and "needs at least 200" in rule.note
    answers = reject.decide(_probs([0], [0.3]), LABELS, rule)
    assert answers == [{"label": "balance", "score": pytest.approx(0.3), "oos": False}]
    with pytest.raises(ValueError, match="'chitchat' is not in the model's label set"):
        reject.calibrate(_probs([0], [0.9]), ["balance"], LABELS, "chitchat", 0.97, 1)


def test_without_an_oos_label_a_low_score_abstains():
    rule = reject.RejectRule(0.6, None, 0.97, 300, "test")
    low, high = reject.decide(_probs([1, 1], [0.59, 0.61]), LABELS, rule)
    assert low == {"label": None, "score": pytest.approx(0.59), "oos": True, "abstain": True}
    assert high == {"label": "card", "score": pytest.approx(0.61), "oos": False}
    assert reject.RejectRule.from_dict(rule.to_dict()) == rule
    with pytest.raises(ValueError, match="unknown reject score"):
        reject.RejectRule.from_dict(rule.to_dict() | {"score": "energy"})


def test_figures_count_rejected_in_scope_messages_as_wrong():
    rule = reject.RejectRule(0.5, "oos", 0.97, 300, "test")
    probs = _probs([0, 0, 1, 2, 0, 2], [0.9, 0.4, 0.9, 0.9, 0.45, 0.8])
    truth = ["balance", "balance", "transfer", "oos", "oos", "card"]
    m = reject.oos_metrics(truth, reject.decide(probs, LABELS, rule), "oos")
    # in scope: right, rejected, wrong label, answered oos -> 1 of 4
    assert m["in_scope_accuracy"] == 0.25 and m["in_scope_rejected"] == 0.5
    # oos: both caught (one by label, one by threshold); 4 oos answers, 2 right
    assert m["oos_recall"] == 1.0 and m["oos_precision"] == 0.5


def test_registry_refuses_a_challenger_that_loses_oos_recall():
    checks = {"checks": []}
    lost = registry.decide({"test_macro_f1": 0.95, "test_oos_recall": 0.70}, checks, "3", 0.90,
                           "test_macro_f1", 0.0, champ_oos_recall=0.80, max_oos_recall_drop=0.02)
    assert not lost.register and "out-of-scope recall 0.7000" in lost.reason and "v3" in lost.reason
    kept = registry.decide({"test_macro_f1": 0.95, "test_oos_recall": 0.79}, checks, "3", 0.90,
                           "test_macro_f1", 0.0, champ_oos_recall=0.80, max_oos_recall_drop=0.02)
    assert kept.register
    # a champion without the figure (no oos label) is judged on the metric alone
    assert registry.decide({"test_macro_f1": 0.95, "test_oos_recall": 0.1}, checks, "3", 0.90,
                           "test_macro_f1", 0.0, None, 0.02).register


def test_int8_gate_checks_out_of_scope_decisions():
    ok, why = onnx_build.int8_gate(0.9, 0.9, 0.995, 0.005, 0.99, oos_agreement=0.995, min_oos_agreement=0.99)
    assert ok and "out-of-scope decisions 99.50%" in why
    ok, why = onnx_build.int8_gate(0.9, 0.9, 0.995, 0.005, 0.99, oos_agreement=0.97, min_oos_agreement=0.99)
    assert not ok and "out-of-scope decisions agree with fp32 on 97.00%" in why


def test_preprocessing_masks_like_the_desensitize_stage():
    from pii.detector import mask
    from textnorm import normalize_text

    pre = Preprocessor(preprocess.spec("placeholder", None))
    raw = "hi,\u00a0my name is Sarah Connor and my card 4111 1111 1111 1111 was declined"
    assert pre(raw) == mask(normalize_text(raw))[0]
    assert "Sarah" not in pre(raw) and "<PERSON>" in pre(raw) and "<CARD>" in pre(raw)
    assert pre("sarah.connor@example.com") == "<EMAIL>"  # all personal data: masked, still text


def test_preprocessing_refuses_what_it_cannot_reproduce():
    with pytest.raises(PreprocessingError, match="records no text preprocessing"):
        Preprocessor(None)
    drifted = preprocess.spec("placeholder", None) | {"version": "0123456789abcdef"}
    with pytest.raises(PreprocessingError, match="--allow-preprocessing-drift"):
        Preprocessor(drifted)
    assert Preprocessor(drifted, allow_version_drift=True).drift
    from pii.pseudonyms import key_id

    key = b"k" * 32
    spec = preprocess.spec("pseudonym", key_id(key))
    with pytest.raises(PreprocessingError, match="needs the same key"):
        Preprocessor(spec)
    with pytest.raises(PreprocessingError, match="not the key the training text"):
        Preprocessor(spec, key=b"x" * 32)
    pre = Preprocessor(spec, key=key)
    assert pre("email me at a@b.example.com").startswith("email me at <EMAIL_")
