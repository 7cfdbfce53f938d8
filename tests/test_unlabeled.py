"""Messages without a label: label QA drops the ones that repeat a labelled message,
pre-labels the rest, queues them for review by uncertainty after the suspects, and adds
the reviewed ones to the train split on the next run (its key follows the reviews).

The unlabeled messages are Banking77 test-set messages (written by others, never seen by
the label-QA model, which trains on the builder's items)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
from conftest import ROOT
from test_labelqa import CLASSES, _fake_desensitize, _items_from_build

import textnorm
from core.config import load_config
from quality import labelqa_stage, review


def test_unlabeled_rows_are_prelabeled_queued_by_uncertainty_and_reviews_train(tmp_path, monkeypatch,
                                                                                mlflow_server):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    items, _ = _items_from_build(tmp_path / "raw", 1500, 0.05, seed=4)
    test = pd.read_csv(ROOT / "data" / "banking77" / "test.csv").sample(n=60, random_state=1)
    truth = dict(zip([f"u{i:03d}" for i in range(60)], test.category.map(textnorm.normalize_label), strict=True))
    unl = pd.DataFrame({"record_id": list(truth), "text": test.text.to_list()})
    unl = pd.concat([unl, pd.DataFrame({  # two repeats of labelled messages, one of an unlabeled one
        "record_id": ["x1", "x2", "x3"],
        "text": [items.text.iloc[0].upper(), items.text.iloc[1] + " ", unl.text.iloc[0]]})], ignore_index=True)
    cfg = load_config(overrides={"lake_root": str(tmp_path / "lake")}, env={})
    _fake_desensitize(cfg.lake, "r1", items, unl)
    first = labelqa_stage.run(cfg, "r1")
    out = Path(first.path)
    m = json.loads((out / "metrics.json").read_text())["unlabeled"]
    assert (m["rows"], m["duplicate_of_labelled"], m["duplicate"], m["queued"], m["reviewed"]) == (63, 2, 1, 60, 0)
    pre = pd.read_parquet(out / "unlabeled.parquet")
    assert sorted(pre.record_id) == sorted(truth) and set(pre.suggested_label) <= set(CLASSES)
    assert pre.confidence.between(0, 1).all()
    hit = (pre.set_index("record_id").suggested_label == pd.Series(truth)).mean()
    print(f"pre-label accuracy on 60 Banking77 test messages: {hit:.2f}")
    assert hit > 1 / len(CLASSES) * 5  # far above chance (1/77), from 1,500 builder items

    queue = pd.read_csv(out / "relabel_queue.csv", dtype={"record_id": str})
    mine = queue[queue.record_id.isin(truth)]
    assert len(mine) == 60 and mine.given_label.isna().all()
    assert list(queue["rank"]) == list(range(1, len(queue) + 1))
    assert mine.index.min() == len(queue) - 60  # after the suspects
    assert mine.score.is_monotonic_decreasing  # least certain first
    assert mine.reason.str.startswith("no label: pre-labeled").all()
    assert first.manifest["stats"]["unlabeled_queued"] == 60

    # Reviewers label five of them (one outside the label set: kept out).
    reviewed = list(truth)[:5]
    ann = pd.DataFrame({"record_id": reviewed, "project": 1, "task_id": range(1, 6), "annotation_id": range(1, 6),
                        "reviewer": "rev-1", "label": [truth[r] for r in reviewed[:4]] + ["not_a_label"],
                        "suggested_label": None, "round": 1, "created_at": "2026-12-06T01:00:00Z",
                        "updated_at": "2026-12-06T01:00:00Z"})
    review.ReviewStore(cfg.lake).merge(ann)
    _fake_desensitize(cfg.lake, "r2", items, unl)
    second = labelqa_stage.run(cfg, "r2")
    assert not second.cache_hit and second.key != first.key
    cur = pd.read_parquet(Path(second.path) / "curated")
    added = cur[cur.record_id.isin(truth)]
    assert sorted(added.record_id) == sorted(reviewed[:4]) and set(added.split) == {"train"}
    assert (added.set_index("record_id").label == pd.Series(truth)[added.record_id]).all()
    assert set(added.label_source) == {"reviewer"}
    q2 = pd.read_csv(Path(second.path) / "relabel_queue.csv", dtype={"record_id": str})
    assert set(q2.record_id) & set(reviewed[:4]) == set() and reviewed[4] in set(q2.record_id)
