"""Inter-annotator agreement on nominal labels.

Input is a long table of annotations (``item``, ``annotator``, ``label``); items may have
one or many annotations and annotators may label any subset of items (real exports do).

* per-item agreement: the share of annotation pairs on the item that agree (Fleiss' P_i),
  undefined (NaN) for an item with a single annotation;
* Cohen's kappa for each annotator pair over the items both labeled (scikit-learn);
* Fleiss' kappa (statsmodels) over the items with the most common number of annotations,
  since Fleiss' statistic assumes every item has the same number; overall and per class
  (the class against all others, which is Fleiss' 1971 per-category kappa);
* Krippendorff's alpha (nominal, closed form checked against the ``krippendorff``
  package), which handles any number of annotations per item; overall and per class (binarized the same way);
* per-annotator accuracy against the consensus label.

Only independent annotators count toward agreement: ``pseudo`` names sources that are not
annotators (in label QA the export's label column and dedup's copies of a message), whose
votes enter the per-annotator accuracy but never alpha, kappa or item agreement. The
statistics are computed only when at least ``min_items`` items have two or more
independent annotations, and skipped with a note otherwise.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from itertools import combinations
from typing import Any

import numpy as np
import pandas as pd


def count_matrix(ann: pd.DataFrame, n_items: int, classes: list[str]) -> np.ndarray:
    """items x classes: how many annotations put each item in each class."""
    col = pd.Categorical(ann.label, categories=classes).codes
    m = np.zeros((n_items, len(classes)), dtype=np.int64)
    np.add.at(m, (ann["item"].to_numpy(), col), 1)
    return m


def item_agreement(counts: np.ndarray) -> np.ndarray:
    n = counts.sum(1).astype(np.float64)
    pairs = (counts * (counts - 1)).sum(1)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n >= 2, pairs / (n * (n - 1)), np.nan)


def _nan_to_none(x: float) -> float | None:
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else round(float(x), 6)


def fleiss(counts: np.ndarray) -> float:
    """Fleiss' kappa of an items x categories table with equal row sums (NaN if undefined:
    fewer than two items, or chance agreement of 1, as with a single category)."""
    from statsmodels.stats.inter_rater import fleiss_kappa

    if len(counts) < 2:
        return math.nan
    p = counts.sum(0) / counts.sum()
    if np.isclose((p**2).sum(), 1.0):
        return math.nan
    return float(fleiss_kappa(counts))


def kripp_alpha(counts: np.ndarray) -> float:
    """Krippendorff's alpha (nominal) from an items x categories count table; items with
    fewer than two annotations carry no pairable values and are ignored by the method.

    Written out in closed form on the count table instead of calling the ``krippendorff``
    package for every class: the package builds a coincidence tensor per call (0.4 s on
    100,000 items, 30 s for 77 per-class alphas), while the nominal statistic needs only
    these sums. tests/test_agreement.py checks it against the package on random tables.
    """
    pairable = counts[counts.sum(1) >= 2].astype(np.float64)
    if len(pairable) == 0 or (pairable.sum(0) > 0).sum() < 2:
        # One observed category: the expected disagreement is zero and alpha undefined.
        return math.nan
    m = pairable.sum(1)
    n_c = pairable.sum(0)
    n = n_c.sum()
    observed_same = (pairable * (pairable - 1)).sum(1) / (m - 1)
    d_o = n - observed_same.sum()
    d_e = (n * n - (n_c**2).sum()) / (n - 1)
    return float(1.0 - d_o / d_e)


def _binarize(counts: np.ndarray, j: int) -> np.ndarray:
    return np.stack([counts[:, j], counts.sum(1) - counts[:, j]], axis=1)


def cohen_pairs(ann: pd.DataFrame, min_common: int) -> list[dict[str, Any]]:
    """Cohen's kappa for every annotator pair with at least ``min_common`` shared items."""
    from sklearn.metrics import cohen_kappa_score

    wide = ann.drop_duplicates(["item", "annotator"]).pivot(
        index="item", columns="annotator", values="label"
    )
    out = []
    for a, b in combinations(sorted(wide.columns), 2):
        both = wide[[a, b]].dropna()
        if len(both) < min_common:
            continue
        if both[a].nunique() == 1 and both[b].nunique() == 1:
            k = 1.0 if both[a].iloc[0] == both[b].iloc[0] else 0.0
        else:
            k = float(cohen_kappa_score(both[a], both[b]))
        out.append(
            {
                "a": a,
                "b": b,
                "items": int(len(both)),
                "kappa": _nan_to_none(k),
                "observed": round(float((both[a] == both[b]).mean()), 6),
            }
        )
    return out


def independent(ann: pd.DataFrame, pseudo: Collection[str] = ()) -> pd.DataFrame:
    """The annotations by independent annotators (everyone not in ``pseudo``)."""
    return ann[~ann.annotator.isin(list(pseudo))] if len(pseudo) else ann


def skip_note(n_items: int, min_items: int, setting: str = "min_items") -> str:
    """Why agreement was skipped: too few items with two or more independent annotators."""
    note = (f"skipped: {n_items:,} item{'' if n_items == 1 else 's'} with two or more independent "
            f"annotators, fewer than {setting} {min_items}")
    if n_items < 2:
        note += " (agreement is undefined without two such items)"
    return note


def agreement(
    ann: pd.DataFrame,
    n_items: int,
    classes: list[str],
    consensus: pd.Series,
    min_common: int = 20,
    *,
    pseudo: Collection[str] = (),
    min_items: int = 2,
    min_items_setting: str = "min_items",
) -> dict[str, Any]:
    """All agreement figures; ``consensus`` maps item -> consensus label (or missing).

    Agreement is over the annotations of independent annotators (not in ``pseudo``) on the
    items that have two or more of them. With fewer than ``min_items`` (at least 2) such
    items, the result says why in ``note`` and carries no statistics instead of failing
    the stage; ``min_items_setting`` names the setting in that note.
    """
    indep = independent(ann, pseudo)
    counts = count_matrix(indep, n_items, classes)
    n_per_item = counts.sum(1)
    multi = n_per_item >= 2
    per_item = item_agreement(counts)
    acc = (
        ann.assign(consensus=consensus.reindex(ann["item"]).to_numpy())
        .dropna(subset=["consensus"])
        .assign(correct=lambda d: d.label == d.consensus)
        .groupby("annotator")
        .agg(annotations=("label", "size"), accuracy=("correct", "mean"))
    )
    pseudo_set = set(pseudo)
    annotators = [
        {"annotator": a, "annotations": int(r.annotations), "accuracy": round(float(r.accuracy), 6)}
        | ({"pseudo": True} if a in pseudo_set else {})
        for a, r in acc.iterrows()
    ]
    all_per_item = count_matrix(ann, n_items, classes).sum(1)
    out: dict[str, Any] = {
        "items": int(n_items),
        "annotations": int(len(ann)),
        "annotators": int(indep.annotator.nunique()),
        "independent_annotations": int(len(indep)),
        "pseudo_annotators": sorted(pseudo_set & set(ann.annotator)),
        "items_with_multiple_annotations": int((all_per_item >= 2).sum()),
        # The items agreement is computed over: two or more independent annotators.
        "agreement_items": int(multi.sum()),
        "min_agreement_items": int(max(min_items, 2)),
        "annotations_per_item": {str(k): int(v) for k, v in pd.Series(all_per_item).value_counts().sort_index().items()},
        "per_annotator": annotators,
    }
    if multi.sum() < max(min_items, 2):
        out["note"] = skip_note(int(multi.sum()), max(min_items, 2), min_items_setting)
        return out | {"fleiss_kappa": None, "krippendorff_alpha": None, "cohen_kappa": [],
                      "mean_item_agreement": None, "per_class": []}
    modal = int(pd.Series(n_per_item[multi]).mode().iloc[0])
    full = counts[n_per_item == modal]
    per_class = []
    for j, c in enumerate(classes):
        if counts[:, j].sum() == 0:
            continue
        per_class.append(
            {
                "label": c,
                "annotations": int(counts[:, j].sum()),
                "fleiss_kappa": _nan_to_none(fleiss(_binarize(full, j))),
                "krippendorff_alpha": _nan_to_none(kripp_alpha(_binarize(counts, j))),
                # Of the items where anyone chose this class, how often did everyone?
                "unanimous_share": _nan_to_none(
                    float(np.mean(counts[multi & (counts[:, j] > 0), j]
                                  == n_per_item[multi & (counts[:, j] > 0)]))
                    if (multi & (counts[:, j] > 0)).any() else math.nan
                ),
            }
        )
    return out | {
        "mean_item_agreement": _nan_to_none(float(np.nanmean(per_item))),
        "fleiss_kappa": _nan_to_none(fleiss(full)),
        "fleiss_items": int(len(full)),
        "fleiss_annotations_per_item": modal,
        "krippendorff_alpha": _nan_to_none(kripp_alpha(counts)),
        "cohen_kappa": cohen_pairs(indep, min_common),
        "per_class": per_class,
    }
