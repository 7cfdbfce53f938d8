"""Score the data stages against the raw-data builder's ground truth.

* clean: defective rows that survived (the target is zero) and clean rows wrongly
  quarantined, by defect and by reason;
* dedup: per planted copy, whether it ended in the same cluster as its original
  (recall, by duplicate kind), and per merged row, whether its survivor really is a copy
  of the same original, or a different original at least `threshold` similar to it (a
  ground-truth collision, reported apart), for exact and near merges separately.

    intentops evaluate --run-id RUN --ground-truth var/demo/raw/ground_truth
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from textnorm import jaccard

EXACT_KINDS = ("exact", "case", "punct", "whitespace")
NEAR_KINDS = ("word_swap", "clause_added")


def _ratio(num: int, den: int) -> float | None:
    return round(num / den, 6) if den else None


def evaluate(
    ground_truth: str | Path, clean_dir: str | Path, dedup_dir: str | Path, threshold: float
) -> dict[str, Any]:
    gt = pd.read_parquet(
        Path(ground_truth) / "rows.parquet",
        columns=["ticket_id", "origin_id", "dup_kind", "dup_jaccard", "defect"],
    )
    gt = gt.set_index("ticket_id")
    clean_kept = pd.read_parquet(Path(clean_dir) / "kept", columns=["record_id"]).record_id
    quarantine = pd.read_parquet(Path(clean_dir) / "quarantine", columns=["record_id", "reason"])

    defective = gt[gt.defect.notna()]
    survived = defective.index.intersection(clean_kept)
    clean_rows = gt[gt.defect.isna()]
    wrongly = quarantine[quarantine.record_id.isin(clean_rows.index)]
    out: dict[str, Any] = {
        "clean": {
            "defective_rows": int(len(defective)),
            "defective_survived": int(len(survived)),
            "defective_survived_by_defect": defective.loc[survived].defect.value_counts().to_dict(),
            "clean_rows_quarantined": int(len(wrongly)),
            "clean_rows_quarantined_by_reason": wrongly.reason.value_counts().to_dict(),
        }
    }

    kept = pd.read_parquet(Path(dedup_dir) / "kept", columns=["record_id"]).record_id
    merged = pd.read_parquet(
        Path(dedup_dir) / "merged", columns=["record_id", "survivor_id", "match_type", "text"]
    )
    cluster = pd.concat(
        [
            pd.Series(kept.values, index=kept.values),
            pd.Series(merged.survivor_id.values, index=merged.record_id.values),
        ]
    )
    present = gt[gt.index.isin(cluster.index)]
    copies = present[present.dup_kind.isin(EXACT_KINDS + NEAR_KINDS)]
    # A copy whose original did not reach dedup cannot be scored against it.
    copies = copies[copies.origin_id.isin(cluster.index)]
    same = cluster.loc[copies.index].values == cluster.loc[copies.origin_id].values
    copies = copies.assign(recalled=same)

    def recall(mask: pd.Series) -> dict[str, Any]:
        sub = copies[mask]
        return {
            "planted": int(len(sub)),
            "found": int(sub.recalled.sum()),
            "recall": _ratio(int(sub.recalled.sum()), len(sub)),
        }

    origin = gt.origin_id
    m = merged[merged.record_id.isin(gt.index) & merged.survivor_id.isin(gt.index)]
    m = m.assign(same_origin=origin.loc[m.record_id].values == origin.loc[m.survivor_id].values)
    # The builder keeps distinct originals apart with cheap rules (see rawdata.Composer);
    # at a million rows it runs out of strictly separated compositions and some "distinct"
    # originals really are near each other (Banking77 itself holds close paraphrases). A
    # merge of two different origins whose texts are at least `threshold` similar is what
    # the stage is asked to do, so it is counted as a ground-truth collision, not an error;
    # a merge joined only through a chain of such pairs stays an error.
    survivor_text = pd.read_parquet(Path(dedup_dir) / "kept", columns=["record_id", "text"])
    survivor_text = survivor_text.set_index("record_id").text
    other = m[~m.same_origin & (m.match_type == "near")]
    collision = pd.Series(
        [
            jaccard(a, survivor_text.get(b, "")) >= threshold
            for a, b in zip(other.text, other.survivor_id, strict=True)
        ],
        index=other.index,
        dtype=bool,
    )
    m = m.assign(collision=collision.reindex(m.index, fill_value=False))
    m = m.assign(correct=m.same_origin | m.collision)

    def precision(kind: str) -> dict[str, Any]:
        sub = m[m.match_type == kind]
        return {
            "merged": int(len(sub)),
            "correct": int(sub.correct.sum()),
            "precision": _ratio(int(sub.correct.sum()), len(sub)),
            "same_origin": int(sub.same_origin.sum()),
            "precision_vs_planted_origins": _ratio(int(sub.same_origin.sum()), len(sub)),
            "ground_truth_collisions": int(sub.collision.sum()),
        }

    near_mask = copies.dup_kind.isin(NEAR_KINDS)
    out["dedup"] = {
        "threshold": threshold,
        "exact_recall": recall(copies.dup_kind.isin(EXACT_KINDS)),
        "near_recall": recall(near_mask & (copies.dup_jaccard >= threshold)),
        "near_recall_all_planted": recall(near_mask),
        "recall_by_kind": {k: recall(copies.dup_kind == k) for k in EXACT_KINDS + NEAR_KINDS},
        "exact_precision": precision("exact"),
        "near_precision": precision("near"),
    }
    return out


def locate_spans(
    messages: pd.DataFrame, spans: pd.DataFrame
) -> tuple[pd.DataFrame, dict[str, str]]:
    """Ground-truth spans moved into the clean stage's normalized text.

    ``messages`` has ticket_id and message (raw); the result has ticket_id, text
    (normalized), pii_type, start, end. A value is looked up after the same normalization,
    which only folds characters and collapses whitespace, so it stays a substring."""
    from textnorm import normalize_text

    text = {
        t: normalize_text(m)
        for t, m in zip(messages["ticket_id"], messages["message"], strict=True)
        if isinstance(m, str)
    }
    rows = []
    cursor: dict[str, int] = {}
    for r in spans.sort_values(["ticket_id", "start"]).itertuples():
        t = text.get(r.ticket_id)
        if t is None:
            continue
        v = normalize_text(r.value)
        s = t.find(v, cursor.get(r.ticket_id, 0))
        if s < 0:
            s = t.find(v)
        if s < 0:
            continue
        cursor[r.ticket_id] = s + len(v)
        rows.append((r.ticket_id, r.pii_type, s, s + len(v)))
    return pd.DataFrame(rows, columns=["ticket_id", "pii_type", "start", "end"]), text


def pii_scores(
    texts: dict[str, str],
    truth: pd.DataFrame,
    detections: dict[str, list[tuple[int, int, str]]],
    type_map: dict[str, str],
) -> dict[str, Any]:
    """Per-type recall (a planted span fully inside a detection of its type), precision (a
    detection overlapping a planted span of its type), leaks (planted spans that no
    detection of any type covers) and decoys flagged (decoy spans overlapped)."""
    by_ticket: dict[str, list[tuple[int, int, str]]] = {}
    for r in truth.itertuples():
        by_ticket.setdefault(r.ticket_id, []).append((r.start, r.end, r.pii_type))
    per: dict[str, dict[str, int]] = {}

    def slot(t: str) -> dict[str, int]:
        return per.setdefault(t, {"planted": 0, "found": 0, "detections": 0, "correct": 0})

    leaks = decoys = decoys_flagged = 0
    for tid in texts:
        gts = by_ticket.get(tid, [])
        dets = detections.get(tid, [])
        for s, e, kind in gts:
            if kind.startswith("decoy_"):
                decoys += 1
                decoys_flagged += any(ds < e and s < de for ds, de, _ in dets)
                continue
            ent = type_map[kind]
            slot(ent)["planted"] += 1
            slot(ent)["found"] += any(ds <= s and e <= de and dt == ent for ds, de, dt in dets)
            leaks += not any(ds <= s and e <= de for ds, de, _ in dets)
        for ds, de, dt in dets:
            slot(dt)["detections"] += 1
            slot(dt)["correct"] += any(
                ds < e and s < de and type_map.get(k) == dt for s, e, k in gts
            )
    out = {
        t: {
            "recall": _ratio(v["found"], v["planted"]),
            "precision": _ratio(v["correct"], v["detections"]),
            **v,
        }
        for t, v in sorted(per.items())
    }
    return {
        "per_type": out,
        "leaked_spans": leaks,
        "decoys": decoys,
        "decoys_flagged": decoys_flagged,
    }


def labelqa_scores(ground_truth: str | Path, labelqa_dir: str | Path) -> dict[str, Any]:
    """Score the label-QA stage against the builder's true labels.

    * relabel queue: an item *needs relabeling* when its consensus label is not its true
      label (the error would otherwise reach training) or it has no valid label at all;
      precision and recall of the queue against that;
    * exported-label errors: items whose exported label (the label column) is wrong, and
      whether the stage's suggested label differs from it (the classic label-error task);
    * accuracy of the consensus labels and of the curated training labels.
    """
    from textnorm import normalize_label

    gt = pd.read_parquet(Path(ground_truth) / "rows.parquet", columns=["ticket_id", "true_label"])
    true = gt.set_index("ticket_id").true_label.map(normalize_label)
    cur = pd.read_parquet(Path(labelqa_dir) / "curated")
    queue = pd.read_csv(Path(labelqa_dir) / "relabel_queue.csv", dtype={"record_id": str})
    import json

    m = json.loads((Path(labelqa_dir) / "metrics.json").read_text())
    # Every item is either curated or (excluded as a suspect) in the queue; rebuild the
    # per-item view from both.
    items = pd.concat([
        cur[["record_id", "consensus_label", "given_label"]],
        queue[["record_id", "consensus_label", "given_label"]],
    ]).drop_duplicates("record_id").set_index("record_id")
    t = true.reindex(items.index)
    needs = items.consensus_label.isna() | (items.consensus_label != t)
    queued = items.index.isin(queue.record_id)
    tp = int((needs & queued).sum())
    suggested = queue.set_index("record_id").suggested_label.reindex(items.index)
    exported_wrong = items.given_label.notna() & (items.given_label != t)
    flagged_export = items.given_label.notna() & (
        (items.given_label != items.consensus_label) | (queued & (suggested != items.given_label))
    )
    tp2 = int((exported_wrong & flagged_export).sum())
    return {
        "items": int(len(items)),
        "queue": {
            "queued": int(queued.sum()),
            "needs_relabeling": int(needs.sum()),
            "true_positives": tp,
            "precision": _ratio(tp, int(queued.sum())),
            "recall": _ratio(tp, int(needs.sum())),
        },
        "exported_label_errors": {
            "wrong": int(exported_wrong.sum()),
            "flagged": int(flagged_export.sum()),
            "precision": _ratio(tp2, int(flagged_export.sum())),
            "recall": _ratio(tp2, int(exported_wrong.sum())),
        },
        "consensus_accuracy": _ratio(int((items.consensus_label == t).sum()), len(items)),
        "exported_label_accuracy": _ratio(int((items.given_label == t).sum()), len(items)),
        "curated_label_accuracy": _ratio(
            int((cur.label.to_numpy() == true.reindex(cur.record_id).to_numpy()).sum()), len(cur)
        ),
        "suspect_rate": m["suspect_rate"],
    }


def read_builder(raw_dir: Path):
    """A raw-data builder output (``raw.*`` + ``ground_truth/``): the clean rows'
    normalized texts by ticket id, and their planted spans moved into them (a DataFrame:
    ticket_id, pii_type, start, end; ``locate_spans``)."""
    import pandas as pd

    f = sorted(Path(raw_dir).glob("raw.*"))[0]
    if f.suffix == ".parquet":
        raw = pd.read_parquet(f, columns=["ticket_id", "message"])
    elif f.suffix == ".jsonl":
        raw = pd.read_json(f, lines=True)[["ticket_id", "message"]]
    else:  # malformed records are defects; the lenient reader skips them
        raw = pd.read_csv(f, usecols=["ticket_id", "message"], dtype=str, keep_default_na=False,
                          on_bad_lines="skip", engine="python")
    gt = Path(raw_dir) / "ground_truth"
    rows = pd.read_parquet(gt / "rows.parquet", columns=["ticket_id", "defect"])
    raw = raw[raw["ticket_id"].isin(set(rows.loc[rows["defect"].isna(), "ticket_id"]))]
    return locate_spans(raw, pd.read_parquet(gt / "pii_spans.parquet"))


def load_builder(raw_dir: Path) -> list:
    """``read_builder`` as labeled samples, with our type names (decoys keep their own, so
    a detection on one is a false positive)."""
    from pii import detector as pii
    from pii.evaluation import Sample

    truth, texts = read_builder(raw_dir)
    by: dict[str, list] = {}
    for r in truth.itertuples():
        by.setdefault(r.ticket_id, []).append(
            (r.start, r.end, pii.BUILDER_TYPE_MAP.get(r.pii_type, r.pii_type)))
    return [Sample(t, by.get(tid, []), f"builder-{tid}") for tid, t in texts.items()]
