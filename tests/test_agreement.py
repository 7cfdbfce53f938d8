"""Agreement statistics against hand-computed and published tables, and the degenerate
cases (perfect agreement, one class, one annotator)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from quality import agreement


def _long_from_counts(counts: np.ndarray, classes: list[str]) -> pd.DataFrame:
    """Annotations of an items x classes count table, annotators r0, r1 ... per item."""
    rows = []
    for i, row in enumerate(counts):
        labels = [c for c, n in zip(classes, row, strict=True) for _ in range(int(n))]
        rows += [(i, f"r{j}", lab) for j, lab in enumerate(labels)]
    return pd.DataFrame(rows, columns=["item", "annotator", "label"])


def _long(table: list[list[str | None]], annotators: list[str]) -> pd.DataFrame:
    """Units x annotators (None = not labeled) to the long form."""
    rows = [(i, a, v) for i, r in enumerate(table) for a, v in zip(annotators, r, strict=True) if v is not None]
    return pd.DataFrame(rows, columns=["item", "annotator", "label"])


# Fleiss (1971) as worked on Wikipedia: 10 subjects, 14 raters, 5 categories, kappa 0.210.
FLEISS = np.array([
    [0, 0, 0, 0, 14], [0, 2, 6, 4, 2], [0, 0, 3, 5, 6], [0, 3, 9, 2, 0], [2, 2, 8, 1, 1],
    [7, 7, 0, 0, 0], [3, 2, 6, 3, 0], [2, 5, 3, 2, 2], [6, 5, 2, 1, 0], [0, 2, 2, 3, 7],
])


def test_fleiss_kappa_matches_the_worked_example():
    classes = list("abcde")
    ann = _long_from_counts(FLEISS, classes)
    out = agreement.agreement(ann, len(FLEISS), classes, pd.Series(dtype=object))
    assert out["fleiss_kappa"] == pytest.approx(0.20993, abs=5e-5)
    # P_i of the first subject: all 14 agree; of the second: (2*1+6*5+4*3+2*1)/(14*13).
    per_item = agreement.item_agreement(FLEISS)
    assert per_item[0] == 1.0
    assert per_item[1] == pytest.approx(46 / 182)
    assert out["mean_item_agreement"] == pytest.approx(0.37802, abs=5e-5)


# Krippendorff (2011), "Computing Krippendorff's alpha-reliability", 4 observers x 12
# units with missing values; nominal alpha = 0.743.
K_TABLE = [
    ["1", "1", None, "1"], ["2", "2", "3", "2"], ["3", "3", "3", "3"], ["3", "3", "3", "3"],
    ["2", "2", "2", "2"], ["1", "2", "3", "4"], ["4", "4", "4", "4"], ["1", "1", "2", "1"],
    ["2", "2", "2", "2"], [None, "5", "5", "5"], [None, None, "1", "1"], [None, "3", None, None],
]


def test_krippendorff_alpha_matches_the_published_example():
    classes = ["1", "2", "3", "4", "5"]
    ann = _long(K_TABLE, ["A", "B", "C", "D"])
    out = agreement.agreement(ann, len(K_TABLE), classes, pd.Series(dtype=object))
    assert out["krippendorff_alpha"] == pytest.approx(0.743, abs=5e-4)


def test_closed_form_alpha_equals_the_krippendorff_package():
    import krippendorff

    rng = np.random.default_rng(0)
    for _ in range(20):
        t = rng.integers(0, 4, size=(60, 5))
        t[rng.random(60) < 0.2] = 0
        ref = krippendorff.alpha(value_counts=t[t.sum(1) >= 2], level_of_measurement="nominal")
        assert agreement.kripp_alpha(t) == pytest.approx(ref, abs=1e-12)


def test_cohen_kappa_for_a_pair_matches_the_hand_computation():
    # 50 items: both yes 20, A yes / B no 5, A no / B yes 10, both no 15.
    # p_o = 35/50 = 0.7; p_e = 0.5*0.6 + 0.5*0.4 = 0.5; kappa = 0.4.
    pairs = [("yes", "yes")] * 20 + [("yes", "no")] * 5 + [("no", "yes")] * 10 + [("no", "no")] * 15
    ann = _long([list(p) for p in pairs], ["A", "B"])
    out = agreement.agreement(ann, 50, ["no", "yes"], pd.Series(dtype=object))
    (pair,) = out["cohen_kappa"]
    assert (pair["a"], pair["b"], pair["items"]) == ("A", "B", 50)
    assert pair["kappa"] == pytest.approx(0.4)
    assert pair["observed"] == pytest.approx(0.7)


def test_perfect_agreement_is_one_everywhere():
    table = [["x", "x", "x"], ["y", "y", "y"], ["z", "z", "z"], ["x", "x", "x"]]
    ann = _long(table, ["A", "B", "C"])
    cons = pd.Series(["x", "y", "z", "x"])
    out = agreement.agreement(ann, 4, ["x", "y", "z"], cons)
    assert out["fleiss_kappa"] == pytest.approx(1.0)
    assert out["krippendorff_alpha"] == pytest.approx(1.0)
    assert out["mean_item_agreement"] == 1.0
    assert all(p["kappa"] == pytest.approx(1.0) for p in out["cohen_kappa"])
    assert all(c["krippendorff_alpha"] == pytest.approx(1.0) for c in out["per_class"])
    assert all(a["accuracy"] == 1.0 for a in out["per_annotator"])


def test_one_class_leaves_chance_corrected_agreement_undefined_not_a_crash():
    table = [["x", "x"], ["x", "x"], ["x", "x"]]
    out = agreement.agreement(_long(table, ["A", "B"]), 3, ["x", "y"], pd.Series(["x"] * 3))
    assert out["fleiss_kappa"] is None
    assert out["krippendorff_alpha"] is None
    assert out["mean_item_agreement"] == 1.0


def test_one_annotator_per_item_skips_agreement_with_a_note():
    table = [["x"], ["y"], ["x"]]
    out = agreement.agreement(_long(table, ["A"]), 3, ["x", "y"], pd.Series(["x", "y", "x"]))
    assert out["note"].startswith("skipped: 0 items with two or more independent annotators")
    assert "undefined" in out["note"]
    assert out["krippendorff_alpha"] is None and out["fleiss_kappa"] is None
    assert out["cohen_kappa"] == []
    assert out["per_annotator"] == [{"annotator": "A", "annotations": 3, "accuracy": 1.0}]


def test_per_annotator_accuracy_against_the_consensus():
    table = [["x", "x", "y"], ["y", "y", "y"], ["x", "x", "x"], ["y", "y", "x"]]
    out = agreement.agreement(_long(table, ["A", "B", "C"]), 4, ["x", "y"], pd.Series(["x", "y", "x", "y"]))
    acc = {a["annotator"]: a["accuracy"] for a in out["per_annotator"]}
    assert acc == {"A": 1.0, "B": 1.0, "C": 0.5}
    # Fleiss over the 4 items with 3 annotations each, by hand:
    # P_i = 1/3, 1, 1, 1/3 -> P = 2/3; p_x = 6/12, p_y = 6/12 -> P_e = 0.5; kappa = 1/3.
    assert out["fleiss_kappa"] == pytest.approx(1 / 3)


def test_pseudo_annotators_never_count_toward_agreement():
    # Items 0-3: A and B (agree on 3 of 4). Items 4-7: A and a pseudo-annotator that
    # always disagrees (a copy of the message with another label, say).
    table = [["x", "x", None], ["y", "y", None], ["x", "x", None], ["y", "x", None],
             ["x", None, "y"], ["y", None, "x"], ["x", None, "y"], ["y", None, "x"]]
    ann = _long(table, ["A", "B", "_copy"])
    cons = pd.Series(["x", "y", "x", "y"] * 2)
    out = agreement.agreement(ann, 8, ["x", "y"], cons, min_common=2, pseudo=["_copy"])
    only_ab = agreement.agreement(ann[ann.annotator != "_copy"], 8, ["x", "y"], cons, min_common=2)
    everyone = agreement.agreement(ann, 8, ["x", "y"], cons, min_common=2)
    for key in ("krippendorff_alpha", "fleiss_kappa", "mean_item_agreement", "cohen_kappa", "per_class"):
        assert out[key] == only_ab[key], key
    assert out["krippendorff_alpha"] != everyone["krippendorff_alpha"]
    assert out["mean_item_agreement"] == pytest.approx(0.75)
    assert out["agreement_items"] == 4 and out["items_with_multiple_annotations"] == 8
    assert out["annotators"] == 2 and out["pseudo_annotators"] == ["_copy"]
    # The pseudo-annotator still has an accuracy against the consensus, marked as such.
    acc = {a["annotator"]: a for a in out["per_annotator"]}
    assert acc["_copy"] == {"annotator": "_copy", "annotations": 4, "accuracy": 0.0, "pseudo": True}
    assert "pseudo" not in acc["A"]


def test_too_few_items_with_independent_annotators_skip_agreement_with_the_count():
    table = [["x", "x"], ["y", "y"], ["x", "y"], ["y", None]]
    ann = _long(table, ["A", "B"])
    out = agreement.agreement(ann, 4, ["x", "y"], pd.Series(["x", "y", "x", "y"]), min_items=4,
                              min_items_setting="labelqa.min_agreement_items")
    assert out["note"] == ("skipped: 3 items with two or more independent annotators, fewer than "
                           "labelqa.min_agreement_items 4")
    assert out["krippendorff_alpha"] is None and out["fleiss_kappa"] is None
    assert out["mean_item_agreement"] is None and out["cohen_kappa"] == [] and out["per_class"] == []
    assert agreement.agreement(ann, 4, ["x", "y"], pd.Series(["x", "y", "x", "y"]),
                               min_items=3)["krippendorff_alpha"] is not None
