"""Feedback labels of served predictions as training data: label QA adds them to the train
split only (never next to a validation or test message), its key follows them, and an
asset-triggered run with new feedback but an export already read trains instead of
ending as "no new data"."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
from test_labelqa import _fake_desensitize, _items_from_build

from core.config import load_config
from deploy import predlog
from quality import feedback, labelqa_stage


def _curated() -> pd.DataFrame:
    rows = [("a1", "where is my new card", "card_arrival", "train"),
            ("a2", "how do i top up", "top_up_by_card_charge", "train"),
            ("a3", "my card got stolen", "lost_or_stolen_card", "test"),
            ("a4", "what is the exchange rate", "exchange_rate", "val")]
    return pd.DataFrame({"record_id": [r[0] for r in rows], "text": [r[1] for r in rows],
                         "label": [r[2] for r in rows], "weight": 1.0, "consensus_label": [r[2] for r in rows],
                         "given_label": [r[2] for r in rows], "suspect": False, "label_quality": 0.99,
                         "item_agreement": 1.0, "n_annotations": 3, "cluster_id": [r[0] for r in rows],
                         "label_source": "consensus", "split": [r[3] for r in rows]})


def _log(lake: Path, rows: list[tuple[str, str | None, str, str, float]]) -> None:
    """Served predictions (id, masked text, predicted) and their feedback (label, time)."""
    con = predlog.connect(feedback.log_path(lake))
    with predlog.transaction(con):
        con.executemany(f"INSERT OR REPLACE INTO predictions ({', '.join(predlog.COLUMNS)}) VALUES "
                        f"({', '.join('?' * len(predlog.COLUMNS))})",
                        [(pid, ts - 10, text, pred, 0.5, 0, 0, "1", 4.0, "stable") for pid, text, pred, _, ts in rows])
    for pid, _, pred, label, ts in rows:
        predlog.record_feedback(con, pid, label, pred, "1", "operator", now=ts)
    con.close()


CLASSES = ["card_arrival", "top_up_by_card_charge", "lost_or_stolen_card", "exchange_rate", "card_linking"]


def test_feedback_joins_the_train_split_only_and_says_what_it_left_out(tmp_path):
    lake = tmp_path / "lake"
    _log(lake, [
        ("p1", "can i link my card to the app", "card_arrival", "card_linking", 100.0),      # added
        ("p2", "My card got STOLEN!", "card_arrival", "lost_or_stolen_card", 101.0),         # a test message
        ("p3", "where is my new card?", "card_arrival", "card_arrival", 102.0),              # a train message
        ("p4", "i want a pony", "exchange_rate", "pony", 103.0),                              # outside the set
        ("p5", None, "exchange_rate", "exchange_rate", 104.0),                                # logged without text
        ("p6", "how do i link a card", "card_arrival", "card_arrival", 105.0),               # superseded by p7
        ("p7", "How do I link a card", "card_arrival", "card_linking", 106.0),
    ])
    rows = feedback.load(lake)
    assert list(rows.prediction_id) == ["p1", "p2", "p3", "p4", "p5", "p6", "p7"]
    cur, info = feedback.merge(_curated(), rows, CLASSES)
    assert info == {"feedback_rows": 7, "added": 2, "no_text": 1, "outside_label_set": 1,
                    "overlaps_evaluation": 1, "duplicate_of_training": 1, "superseded": 1,
                    "added_by_class": {"card_linking": 2}}
    added = cur[cur.label_source == "feedback"]
    assert list(added.record_id) == ["feedback:p1", "feedback:p7"] and set(added.split) == {"train"}
    assert list(added.label) == ["card_linking", "card_linking"] and list(added.weight) == [1.0, 1.0]
    assert cur.split.value_counts().to_dict() == {"train": 4, "test": 1, "val": 1}
    assert list(cur.columns) == list(_curated().columns)
    # new or corrected feedback changes the version label QA's key includes
    version = feedback.fingerprint(rows)
    _log(lake, [("p1", "can i link my card to the app", "card_arrival", "card_arrival", 107.0)])
    assert feedback.fingerprint(feedback.load(lake)) not in (None, version)
    assert feedback.fingerprint(feedback.load(tmp_path / "no-lake")) is None


def test_label_qa_trains_on_feedback_and_a_triggered_run_sees_new_labels(tmp_path, monkeypatch, mlflow_server):
    from core import runs
    from ops import triggers

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    found, true = _items_from_build(tmp_path / "raw", 600, 0.05, seed=3)
    export = tmp_path / "export.csv"
    export.write_text("ticket_id,message,intent\n1,where is my card,card_arrival\n")
    cfg = load_config(overrides={"lake_root": str(tmp_path / "lake"), "input.path": str(export)}, env={})
    _fake_desensitize(cfg.lake, "r1", found)
    first = labelqa_stage.run(cfg, "r1")
    assert "feedback_labels" not in first.manifest["inputs"]
    assert triggers.unread_labels(cfg) == []

    label = str(pd.read_parquet(Path(first.path) / "curated").label.iloc[0])
    _log(cfg.lake, [(f"q{i}", f"a message served in production number {i} about my account", None, label,
                     200.0 + i) for i in range(5)])
    assert triggers.unread_labels(cfg) == ["feedback labels (5 in the prediction log)"]

    _fake_desensitize(cfg.lake, "r2", found)
    second = labelqa_stage.run(cfg, "r2")
    assert not second.cache_hit and second.manifest["key"] != first.manifest["key"]
    cur = pd.read_parquet(Path(second.path) / "curated")
    fb = cur[cur.label_source == "feedback"]
    assert len(fb) == 5 and set(fb.split) == {"train"} and set(fb.label) == {label}
    m = json.loads((Path(second.path) / "metrics.json").read_text())
    assert m["feedback"]["added"] == 5 and second.manifest["stats"]["feedback_rows_added"] == 5
    assert triggers.unread_labels(cfg) == []  # this label-QA output read them

    # the same feedback again: a triggered run with nothing new ends as "no new data"
    from core.stage import MANIFEST, file_fingerprint

    out = cfg.lake / "clean" / "read"
    out.mkdir(parents=True)
    (out / MANIFEST).write_text(json.dumps({"inputs": {"raw": file_fingerprint(export) | {"format": "csv"}}}))
    monkeypatch.setenv("INTENTOPS__LAKE_ROOT", str(tmp_path / "lake"))
    monkeypatch.setenv("INTENTOPS__INPUT__PATH", str(export))
    trigger = [{"asset": "intentops_new_labels", "extra": {"feedback_labels": 6}}]
    with pytest.raises(runs.NoNewData, match="no new feedback or reviewed labels"):
        triggers.resolve_triggered_run("asset_triggered__a", {}, trigger)
    _log(cfg.lake, [("q9", "one more served message about my account balance", None, label, 300.0)])
    _, note = triggers.resolve_triggered_run("asset_triggered__b", {}, trigger)
    assert "new feedback labels (6 in the prediction log)" in note


def test_the_qa_report_says_what_feedback_did():
    from quality.qareport import _feedback_section

    assert "No feedback labels" in _feedback_section({})
    page = _feedback_section({"feedback_rows": 7, "added": 2, "overlaps_evaluation": 1, "duplicate_of_training": 1,
                              "outside_label_set": 1, "no_text": 1, "superseded": 1,
                              "added_by_class": {"card_linking": 2}})
    assert "2 of 7 labelled predictions added to the train split (by class: card_linking 2)" in page
    assert "1 equal to a validation or test message" in page
