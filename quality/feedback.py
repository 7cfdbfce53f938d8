"""Feedback labels from served traffic as training data (the ``feedback`` source).

The prediction log (``deploy.predlog``) keeps, for each served request, its masked text
(masked by the model server with the same detector the pipeline's desensitize stage
uses) and, once an operator or client sent one, its true label. Label QA reads those
labelled predictions of its dataset's log and adds them to the curated set:

- only to the **train** split: the validation and test splits stay what the export gave,
  so a model's figures stay comparable from run to run, and no served message can end up
  on both sides;
- a feedback message whose normalized text (``textnorm.dedup_key``) equals a validation
  or test message is left out (``overlaps_evaluation``); one equal to a training message
  is left out as a duplicate (``duplicate_of_training``); of several feedback rows with
  one text, the latest counts;
- a label outside the run's label set is left out and counted (``outside_label_set``);
  a prediction logged without its text (``serving.log_text`` off) cannot train
  (``no_text``);
- each added row has ``label_source`` ``feedback`` and ``record_id``
  ``feedback:<prediction id>``; who sent the feedback is not carried.

:func:`fingerprint` is the version label QA's stage key includes, so new or corrected
feedback changes the key and training follows; ``core.runs`` compares it with the
versions earlier label-QA outputs read to tell an asset-triggered run whether labels
arrived.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import pandas as pd

import textnorm

SOURCE = "feedback"
COLUMNS = ["prediction_id", "ts", "label", "text"]


def log_path(lake: Path) -> Path:
    """The dataset's prediction log (what its model servers write)."""
    return Path(lake) / "predictions" / "predictions.db"


def load(lake: Path) -> pd.DataFrame:
    """Every feedback row of the dataset's prediction log with its prediction's masked text
    (empty when there is no log or no feedback), ordered by prediction id."""
    import sqlite3

    path = log_path(lake)
    if not path.exists():
        return pd.DataFrame(columns=COLUMNS)
    # Read-only, with the busy timeout the servers' writers use (WAL mode: readers do not
    # block them). The schema is deploy.predlog's; quality does not import deploy.
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=30)
    try:
        rows = con.execute("SELECT f.prediction_id, f.ts, f.label, p.text FROM feedback f "
                           "JOIN predictions p ON p.id = f.prediction_id ORDER BY f.prediction_id").fetchall()
    finally:
        con.close()
    return pd.DataFrame(rows, columns=COLUMNS)


def fingerprint(rows: pd.DataFrame) -> str | None:
    """Content version of the feedback rows (ids, labels, times); None when there are none."""
    if not len(rows):
        return None
    h = hashlib.sha256()
    for r in rows[["prediction_id", "label", "ts"]].itertuples(index=False):
        h.update(f"{r.prediction_id}\x1f{r.label}\x1f{float(r.ts):.6f}\n".encode())
    return h.hexdigest()[:20]


def merge(curated: pd.DataFrame, rows: pd.DataFrame, classes: list[str]) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The curated set with the usable feedback rows appended to its train split, and the
    counts of what was added and what was left out (and why)."""
    info: dict[str, Any] = {"feedback_rows": int(len(rows)), "added": 0, "no_text": 0,
                            "outside_label_set": 0, "overlaps_evaluation": 0,
                            "duplicate_of_training": 0, "superseded": 0, "added_by_class": {}}
    if not len(rows):
        return curated, info
    fb = rows.copy()
    fb["label"] = fb.label.map(textnorm.normalize_label)
    has_text = fb.text.notna() & (fb.text.astype(str).str.strip() != "")
    info["no_text"] = int((~has_text).sum())
    fb = fb[has_text]
    valid = fb.label.isin(set(classes))
    info["outside_label_set"] = int((~valid).sum())
    fb = fb[valid].copy()
    fb["key"] = fb.text.astype(str).map(textnorm.dedup_key)
    latest = fb.sort_values(["ts", "prediction_id"]).drop_duplicates("key", keep="last")
    info["superseded"] = int(len(fb) - len(latest))
    keys = curated.text.astype(str).map(textnorm.dedup_key)
    evaluation = set(keys[curated.split != "train"])
    training = set(keys[curated.split == "train"])
    in_eval = latest.key.isin(evaluation)
    in_train = latest.key.isin(training) & ~in_eval
    info["overlaps_evaluation"] = int(in_eval.sum())
    info["duplicate_of_training"] = int(in_train.sum())
    add = latest[~in_eval & ~in_train].sort_values("prediction_id")
    info["added"] = int(len(add))
    info["added_by_class"] = {str(k): int(v) for k, v in add.label.value_counts().sort_index().items()}
    if not len(add):
        return curated, info
    rid = "feedback:" + add.prediction_id.astype(str)
    new = pd.DataFrame({
        "record_id": rid.to_numpy(), "text": add.text.astype(str).to_numpy(), "label": add.label.to_numpy(),
        "weight": 1.0, "consensus_label": add.label.to_numpy(), "given_label": add.label.to_numpy(),
        "suspect": False, "label_quality": float("nan"), "item_agreement": float("nan"),
        "n_annotations": 1, "cluster_id": rid.to_numpy(), "label_source": SOURCE, "split": "train",
    })
    return pd.concat([curated, new[[c for c in curated.columns if c in new.columns]]],
                     ignore_index=True), info
