"""The review loop's data: which queue items a round sends, the reviewer annotations the
lake keeps, and how label QA applies them. Pure functions and the lake store; the Label
Studio calls are in ``quality/review_stage.py``.

**Value of a review.** A round sends the ``labeling.batch_size`` queue items whose review
is worth most: ``score`` (1 - label quality, the chance the current label is wrong) times
``1 + class_balance_weight * rarity``, where rarity is 1 minus the suggested class's size
over the largest class's in the curated set: a fix in a small class moves the model more.

**The reviewer source** lives at ``<lake>/annotations/reviewer/``: immutable versions
``v-<hash>.parquet`` (one row per Label Studio annotation: record_id, task and annotation
ids, the pseudonymized reviewer, the label, the suggestion it was shown, its round, its
times), ``CURRENT.json`` naming the version in force (replaced atomically), and
``tasks.json``, the tasks the pushes created (task id -> record id, round, suggestion).
A pull merges what Label Studio holds into the previous version: an annotation edited
there replaces its row (newest ``updated_at``); one whose task was deleted there stays
(nothing already pulled is lost).

**Applying reviews** (label QA, :func:`resolve`): labels outside the label set are kept out
and counted; per item, each reviewer's latest annotation counts once; the majority of
reviewers wins; a tie (two reviewers, two labels) is not resolved: the item keeps its
consensus, stays a suspect with the reason "reviewers disagree" and waits in Label Studio
for a third review. A resolved review wins over the consensus (``label_source`` =
``reviewer``); reviewer labels never enter the agreement statistics, which measure the
original annotators.
"""

from __future__ import annotations

import hashlib
import io
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

import textnorm
from core.stage import atomic_write_text

COLUMNS = ["record_id", "project", "task_id", "annotation_id", "reviewer", "label",
           "suggested_label", "round", "created_at", "updated_at"]


# --------------------------------------------------------------------------- rounds


def order_by_value(queue: pd.DataFrame, class_counts: dict[str, int], weight: float) -> pd.DataFrame:
    """The queue with a ``review_value`` column, most valuable first (ties: rank)."""
    q = queue.copy()
    biggest = max(class_counts.values(), default=0)
    rarity = q.suggested_label.map(
        lambda c: 1.0 - class_counts.get(c, 0) / biggest if biggest and isinstance(c, str) and c else 0.0)
    q["review_value"] = (q.score.astype(float) * (1.0 + weight * rarity.astype(float))).round(6)
    return q.sort_values(["review_value", "rank"], ascending=[False, True]).reset_index(drop=True)


def select_round(queue: pd.DataFrame, in_label_studio: set[str], reviewed: set[str],
                 batch_size: int) -> tuple[pd.DataFrame, dict[str, int]]:
    """The items this round sends: not already a task there, never reviewed, at most
    ``batch_size``, in the queue's order."""
    rid = queue.record_id.astype(str)
    already = rid.isin(in_label_studio)
    done = rid.isin(reviewed) & ~already
    fresh = queue[~already & ~done]
    return fresh.head(batch_size), {"already_in_label_studio": int(already.sum()),
                                    "already_reviewed": int(done.sum()),
                                    "left_for_next_rounds": int(max(len(fresh) - batch_size, 0))}


# --------------------------------------------------------------------------- the store


class ReviewStore:
    def __init__(self, lake: Path) -> None:
        self.root = Path(lake) / "annotations" / "reviewer"

    @property
    def current_file(self) -> Path:
        return self.root / "CURRENT.json"

    @property
    def tasks_file(self) -> Path:
        return self.root / "tasks.json"

    def current(self) -> dict[str, Any] | None:
        return json.loads(self.current_file.read_text()) if self.current_file.exists() else None

    def annotations(self) -> pd.DataFrame:
        cur = self.current()
        if cur is None:
            return pd.DataFrame(columns=COLUMNS)
        return pd.read_parquet(self.root / cur["file"])

    def fingerprint(self) -> str | None:
        """The version in force (its content hash): label QA's key follows it."""
        cur = self.current()
        return cur["sha"] if cur else None

    def task_map(self) -> dict[str, dict[str, Any]]:
        return json.loads(self.tasks_file.read_text()) if self.tasks_file.exists() else {}

    def add_tasks(self, rows: dict[str, dict[str, Any]]) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.tasks_file, json.dumps(self.task_map() | rows, indent=1, sort_keys=True))

    def merge(self, pulled: pd.DataFrame) -> dict[str, int]:
        """Merge a pull into the store; a new version only when something changed."""
        old = self.annotations()
        both = pd.concat([old, pulled[COLUMNS]], ignore_index=True) if len(old) else pulled[COLUMNS].copy()
        both = (both.sort_values(["project", "annotation_id", "updated_at"])
                .drop_duplicates(["project", "annotation_id"], keep="last")
                .sort_values(["project", "annotation_id"]).reset_index(drop=True))
        key = {(int(p), int(a)): u for p, a, u in zip(old.project, old.annotation_id, old.updated_at,
                                                       strict=True)} if len(old) else {}
        new = sum((int(p), int(a)) not in key for p, a in zip(pulled.project, pulled.annotation_id,
                                                              strict=True))
        edited = sum((int(p), int(a)) in key and key[(int(p), int(a))] != u
                     for p, a, u in zip(pulled.project, pulled.annotation_id, pulled.updated_at, strict=True))
        stats = {"new_annotations": int(new), "edited_annotations": int(edited), "stored": len(both)}
        if new or edited:
            buf = io.BytesIO()
            both.astype({"project": "int64", "task_id": "int64", "annotation_id": "int64",
                         "round": "int64"}).to_parquet(buf, index=False)
            sha = hashlib.sha256(both.to_csv(index=False).encode()).hexdigest()[:16]
            self.root.mkdir(parents=True, exist_ok=True)
            path = self.root / f"v-{sha}.parquet"
            if not path.exists():
                tmp = path.with_suffix(".tmp")
                tmp.write_bytes(buf.getvalue())
                tmp.rename(path)
            atomic_write_text(self.current_file, json.dumps({"file": path.name, "sha": sha, "rows": len(both)}))
        return stats


# --------------------------------------------------------------------------- applying


def resolve(reviews: pd.DataFrame, classes: list[str]) -> tuple[pd.DataFrame, dict[str, Any]]:
    """Per reviewed record: ``reviewed_label`` (None for a tie), the reviewers' labels, the
    suggestion shown and the round. Labels outside ``classes`` are kept out and counted."""
    info: dict[str, Any] = {"reviewer_annotations": int(len(reviews)), "outside_label_set": 0,
                            "outside_label_set_examples": []}
    if reviews.empty:
        return pd.DataFrame(columns=["record_id", "reviewed_label", "reviewer_labels", "suggested_label",
                                     "round", "reviewers"]), info
    r = reviews.copy()
    r["norm"] = r.label.map(textnorm.normalize_label)
    bad = ~r.norm.isin(set(classes))
    info["outside_label_set"] = int(bad.sum())
    info["outside_label_set_examples"] = sorted({str(x) for x in r.label[bad]})[:10]
    r = r[~bad]
    # Each reviewer's latest word on an item counts once.
    r = r.sort_values("updated_at").drop_duplicates(["record_id", "reviewer"], keep="last")
    rows = []
    for rid, g in r.groupby("record_id", sort=True):
        counts = g.norm.value_counts()
        top = counts[counts == counts.max()]
        rows.append({"record_id": rid, "reviewed_label": top.index[0] if len(top) == 1 else None,
                     "reviewer_labels": "; ".join(f"{a}: {b}" for a, b in zip(g.reviewer, g.norm, strict=True)),
                     "suggested_label": g.suggested_label.iloc[-1], "round": int(g["round"].min()),
                     "reviewers": int(len(g))})
    return pd.DataFrame(rows), info


def apply(items: pd.DataFrame, resolved: pd.DataFrame) -> pd.DataFrame:
    """A reviewed label wins over the consensus: the item is no longer a suspect, its
    label source is ``reviewer``. A tie keeps the item a suspect with its reason."""
    d = items.copy()
    d["label_source"] = np.where(d.consensus.notna(), "consensus", None)
    d["reviewed_label"] = None
    if resolved.empty:
        return d
    m = d[["record_id"]].merge(resolved, on="record_id", how="left")
    ok = m.reviewed_label.notna().to_numpy()
    tie = (m.reviewers.fillna(0).to_numpy() > 0) & ~ok
    d["consensus_before_review"] = d.consensus
    d.loc[ok, "consensus"] = m.reviewed_label[ok].to_numpy()
    d.loc[ok, "suggested"] = m.reviewed_label[ok].to_numpy()
    d.loc[ok, "reviewed_label"] = m.reviewed_label[ok].to_numpy()
    d.loc[ok, "label_source"] = "reviewer"
    d.loc[ok, "suspect"] = False
    d.loc[ok, "reason"] = None
    d.loc[ok, "score"] = 0.0
    d.loc[ok, "label_quality"] = 1.0
    d.loc[tie, "suspect"] = True
    d.loc[tie, "reason"] = ["reviewers disagree (" + s + "): waiting for another review"
                            for s in m.reviewer_labels[tie]]
    return d


def rounds(items: pd.DataFrame, resolved: pd.DataFrame) -> list[dict[str, Any]]:
    """Per review round: items reviewed, the share where the reviewers took the suggestion,
    the labels they changed (from the consensus before review) by class."""
    if resolved.empty:
        return []
    m = resolved.merge(items[["record_id", "consensus_before_review"]], on="record_id", how="left")
    out = []
    for rnd, g in m.groupby("round", sort=True):
        done = g[g.reviewed_label.notna()]
        changed = done[done.reviewed_label != done.consensus_before_review]
        out.append({
            "round": int(rnd), "items_reviewed": int(len(g)), "resolved": int(len(done)),
            "unresolved_ties": int(len(g) - len(done)),
            "agreed_with_suggestion": round(float((done.reviewed_label == done.suggested_label).mean()), 4)
            if len(done) else None,
            "labels_changed": int(len(changed)),
            "changed_by_class": {str(k): int(v) for k, v in
                                 changed.consensus_before_review.fillna("<none>").value_counts().items()},
        })
    return out


def accuracy_after_rounds(published: list[dict[str, Any]], trainings: list[dict[str, Any]],
                          ) -> tuple[dict[int, dict[str, Any]], dict[str, Any] | None]:
    """The model's test accuracy after each review round, and before the first.

    ``published``: label QA outputs (``key``, ``last_round``: the newest review round they
    applied, 0 for none). ``trainings``: training runs (``labelqa_key``, ``start``,
    ``test_accuracy``, ``run_id``). After round r: the first training on a label-QA output
    whose newest round is r (the model trained on that round's labels, before the next);
    before reviews: the last training on an output with none."""
    last_round = {p["key"]: int(p["last_round"]) for p in published}
    runs = sorted((t for t in trainings if t.get("labelqa_key") in last_round
                   and t.get("test_accuracy") is not None), key=lambda t: t["start"])
    after: dict[int, dict[str, Any]] = {}
    before = None
    for t in runs:
        r = last_round[t["labelqa_key"]]
        row = {"test_accuracy": round(float(t["test_accuracy"]), 4), "training_run": t["run_id"]}
        if r == 0:
            before = row
        else:
            after.setdefault(r, row)
    return after, before
