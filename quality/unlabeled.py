"""Messages without a label: pre-labeled by the machine, queued for people by uncertainty.

With ``clean.unlabeled: review`` (the default) a message whose one finding is a missing
label is not quarantined: clean writes it to ``unlabeled/``, dedup passes it on and
desensitize masks it like every other message. Label QA then

1. drops the ones whose normalized text (``textnorm.dedup_key``) repeats a labelled
   message (``duplicate_of_labelled``: that message already carries the label) or an
   earlier unlabeled one (``duplicate``);
2. pre-labels the rest with a text classifier fitted on every labelled item's current
   label (TF-IDF word 1-2-grams and logistic regression, the settings of label QA's own
   cross-validated model): the suggested label and its probability;
3. appends them to the relabel queue after the suspects, with ``score`` = 1 - that
   probability (the uncertainty), so the review loop's value order (``quality/review.py``)
   sends the ones the machine is least sure of first, as tasks with the suggestion as a
   prediction;
4. adds the ones reviewers labelled (the ``reviewer`` source, by the same rule as any
   review) to the curated **train** split with ``label_source`` ``reviewer``; validation
   and test stay what the labelled export gave.

Label QA pre-labels with its own classifier: it exists on the first run and sees the same
masked text. When the queue goes to Label Studio (the review push), the registry's
champion, when there is one with the run's label set (``labeling.prelabel: champion``),
pre-labels these messages again with its int8 build (``quality/prelabel.py``): its
suggestion and confidence replace the classifier's, and the uncertainty order follows.
The push records which model suggested; a new champion changes the push's key, so its
suggestions reach the items not yet sent. Training never depends on who suggested.
Output: ``unlabeled.parquet`` (record id, masked text, suggestion, confidence, reviewed
label) in label QA's folder.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import textnorm
from core.config import LabelQAConfig

COLUMNS = ["record_id", "text", "suggested_label", "confidence", "reviewed_label"]


def load(desensitized: Path) -> pd.DataFrame:
    """The masked unlabeled rows of a desensitize output (empty when it has none)."""
    folder = Path(desensitized) / "unlabeled"
    if not folder.exists():
        return pd.DataFrame(columns=["record_id", "text"])
    return pd.read_parquet(folder, columns=["record_id", "text"]).sort_values("record_id").reset_index(drop=True)


def prelabel(train_texts: pd.Series, train_labels: pd.Series, texts: pd.Series, cfg: LabelQAConfig,
             ) -> tuple[np.ndarray, np.ndarray]:
    """(suggested label, probability) per text from a classifier fitted on the labelled
    items; (None, NaN) everywhere when fewer than two labels have items."""
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.linear_model import LogisticRegression

    none = np.full(len(texts), None, dtype=object), np.full(len(texts), np.nan)
    ok = train_labels.notna().to_numpy()
    if not len(texts) or len(set(train_labels[ok])) < 2:
        return none
    vec = TfidfVectorizer(ngram_range=(1, 2), min_df=2, sublinear_tf=True, max_features=cfg.max_features)
    x = vec.fit_transform(train_texts[ok].fillna("").to_numpy())
    clf = LogisticRegression(C=10.0, solver="saga", max_iter=cfg.max_iter, tol=1e-3, random_state=cfg.seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # a few saga epochs, as label QA's own model
        clf.fit(x, train_labels[ok].to_numpy())
    p = clf.predict_proba(vec.transform(texts.fillna("").to_numpy()))
    return clf.classes_[p.argmax(1)].astype(object), p.max(1)


def prepare(rows: pd.DataFrame, items: pd.DataFrame, cfg: LabelQAConfig,
            resolved: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The unlabeled rows worth a review, pre-labeled, with the reviewed label where one
    was resolved; and counts. ``items`` are label QA's items (``text``, ``consensus``)."""
    info: dict[str, Any] = {"rows": int(len(rows)), "duplicate_of_labelled": 0, "duplicate": 0,
                            "queued": 0, "reviewed": 0, "prelabel_model": "label QA's text classifier"}
    if not len(rows):
        return pd.DataFrame({"record_id": pd.Series(dtype=str), "text": pd.Series(dtype=str),
                             "suggested_label": pd.Series(dtype=object),
                             "confidence": pd.Series(dtype=float), "reviewed_label": pd.Series(dtype=object)}), info
    key = rows.text.astype(str).map(textnorm.dedup_key)
    labelled = key.isin(set(items.text.astype(str).map(textnorm.dedup_key)))
    repeat = key.duplicated() & ~labelled
    info["duplicate_of_labelled"], info["duplicate"] = int(labelled.sum()), int(repeat.sum())
    out = rows[~labelled & ~repeat].reset_index(drop=True)
    label, conf = prelabel(items.text, items.consensus, out.text, cfg)
    out = out.assign(suggested_label=label, confidence=np.round(conf.astype(float), 6))
    got = resolved.set_index("record_id").reviewed_label if len(resolved) else pd.Series(dtype=object)
    out["reviewed_label"] = out.record_id.astype(str).map(got).where(lambda s: s.notna(), None)
    info["reviewed"] = int(out.reviewed_label.notna().sum())
    info["queued"] = int(out.reviewed_label.isna().sum())
    return out[COLUMNS], info


def queue_rows(prepared: pd.DataFrame, first_rank: int) -> pd.DataFrame:
    """Relabel-queue rows (the suspects' columns) for the unlabeled rows not yet reviewed,
    least certain first."""
    d = prepared[prepared.reviewed_label.isna()].copy()
    d["confidence"] = d.confidence.astype(float)
    d["score"] = (1.0 - d.confidence.fillna(0.0)).round(6)
    d = d.sort_values(["score", "record_id"], ascending=[False, True])
    reason = [f"no label: pre-labeled {lab} ({c:.0%} sure)" if isinstance(lab, str) else "no label"
              for lab, c in zip(d.suggested_label, d.confidence.fillna(0.0), strict=True)]
    return pd.DataFrame({
        "rank": np.arange(first_rank, first_rank + len(d)), "record_id": d.record_id.to_numpy(),
        "text": d.text.to_numpy(), "given_label": None, "annotations": "", "consensus_label": None,
        "item_agreement": np.nan, "suggested_label": d.suggested_label.to_numpy(),
        "score": d.score.to_numpy(), "reason": reason, "dedup_label_conflict": False,
    })


def reviewed_rows(prepared: pd.DataFrame, curated: pd.DataFrame) -> pd.DataFrame:
    """The curated set with the reviewed unlabeled rows added to its train split."""
    d = prepared[prepared.reviewed_label.notna()]
    if not len(d):
        return curated
    new = pd.DataFrame({
        "record_id": d.record_id.to_numpy(), "text": d.text.to_numpy(), "label": d.reviewed_label.to_numpy(),
        "weight": 1.0, "consensus_label": d.reviewed_label.to_numpy(), "given_label": None, "suspect": False,
        "label_quality": 1.0, "item_agreement": np.nan, "n_annotations": 0, "cluster_id": d.record_id.to_numpy(),
        "label_source": "reviewer", "split": "train",
    })
    return pd.concat([curated, new[[c for c in curated.columns if c in new.columns]]], ignore_index=True)

