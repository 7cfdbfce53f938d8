"""The data-stage scorer: precision separates wrong merges from ground-truth collisions."""

from __future__ import annotations

import pandas as pd

from demo.groundtruth import evaluate

A = "How do I reset the passcode of my card in the app?"
A_COPY = "How do I reset the passcode of my card in the app please?"
B_CLOSE = "How do I reset the passcode of my card in the app??"  # distinct origin, ~same text
C_FAR = "Why was my transfer to a friend declined yesterday?"


def _write(tmp_path, merged_rows):
    gt = tmp_path / "gt"
    gt.mkdir()
    pd.DataFrame(
        {
            "ticket_id": ["a", "a2", "b", "c"],
            "origin_id": ["a", "a", "b", "c"],
            "dup_kind": [None, "clause_added", None, None],
            "dup_jaccard": [None, 0.85, None, None],
            "defect": [None, None, None, None],
        }
    ).to_parquet(gt / "rows.parquet")
    clean = tmp_path / "clean"
    clean.mkdir()
    pd.DataFrame({"record_id": ["a", "a2", "b", "c"]}).to_parquet(clean / "kept", index=False)
    pd.DataFrame({"record_id": pd.Series([], dtype=str), "reason": pd.Series([], dtype=str)}).to_parquet(
        clean / "quarantine", index=False
    )
    dedup = tmp_path / "dedup"
    dedup.mkdir()
    merged_ids = {r[0] for r in merged_rows}
    texts = {"a": A, "a2": A_COPY, "b": B_CLOSE, "c": C_FAR}
    pd.DataFrame(
        {"record_id": [k for k in texts if k not in merged_ids],
         "text": [v for k, v in texts.items() if k not in merged_ids]}
    ).to_parquet(dedup / "kept", index=False)
    pd.DataFrame(
        {
            "record_id": [r[0] for r in merged_rows],
            "survivor_id": [r[1] for r in merged_rows],
            "match_type": ["near"] * len(merged_rows),
            "text": [texts[r[0]] for r in merged_rows],
        }
    ).to_parquet(dedup / "merged", index=False)
    return gt, clean, dedup


def test_similar_distinct_originals_are_collisions_not_errors(tmp_path):
    gt, clean, dedup = _write(tmp_path, [("a2", "a"), ("b", "a")])
    p = evaluate(gt, clean, dedup, 0.8)["dedup"]["near_precision"]
    assert p["merged"] == 2
    assert p["same_origin"] == 1
    assert p["ground_truth_collisions"] == 1
    assert p["precision"] == 1.0
    assert p["precision_vs_planted_origins"] == 0.5


def test_dissimilar_merge_is_an_error(tmp_path):
    gt, clean, dedup = _write(tmp_path, [("a2", "a"), ("c", "a")])
    p = evaluate(gt, clean, dedup, 0.8)["dedup"]["near_precision"]
    assert p["ground_truth_collisions"] == 0
    assert p["precision"] == 0.5
