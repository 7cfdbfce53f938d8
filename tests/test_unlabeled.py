"""Messages without a label: label QA drops the ones that repeat a labelled message,
pre-labels the rest, queues them for review by uncertainty after the suspects, and adds
the reviewed ones to the train split on the next run (its key follows the reviews).

The unlabeled messages are Banking77 test-set messages (written by others, never seen by
the label-QA model, which trains on the builder's items)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
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


def test_the_champion_prelabels_unlabeled_messages_in_the_tasks_the_push_sends(
        tmp_path, monkeypatch, mlflow_server, label_studio, exported, trained):
    """With a champion whose label set is the run's, the push's tasks for messages without
    a label carry the champion's suggestion (what its int8 build predicts), its
    uncertainty as the score, and its version as the prediction's model; a new champion is
    a new push; a champion of another label set leaves label QA's suggestion, saying why."""
    import shutil
    import uuid

    from mlflow.tracking import MlflowClient

    from export import task as export_task
    from export.runtime import OnnxClassifier
    from quality import prelabel, review_stage
    from quality.labelstudio import Client

    url, creds = label_studio
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    monkeypatch.setenv("INTENTOPS_LABEL_STUDIO_URL", url)
    monkeypatch.setenv("INTENTOPS_LABEL_STUDIO_TOKEN", creds.api_token)
    monkeypatch.setenv("INTENTOPS_REVIEWER_KEY", creds.reviewer_key)
    monkeypatch.setenv("INTENTOPS_SERVICES_ROOT", str(tmp_path / "services"))
    classes = sorted(set(trained["labels"]))
    name = f"prelabel-{uuid.uuid4().hex[:8]}"
    cfg = load_config(overrides={"lake_root": str(tmp_path / "lake"), "deploy.root": str(tmp_path / "deploy"),
                                 "training.registered_model": name, "labeling.project": name,
                                 "labeling.batch_size": 10_000}, env={})
    client = MlflowClient(mlflow_server)
    client.create_registered_model(name)
    exp = client.create_experiment(name)

    def register(labels: list[str]) -> str:
        out = tmp_path / f"build-{uuid.uuid4().hex[:6]}"
        shutil.copytree(exported["out"], out)
        rid = client.create_run(exp).info.run_id
        note = tmp_path / "note.txt"
        note.write_text("builds only")
        client.log_artifact(rid, str(note), artifact_path="model")
        mv = client.create_model_version(name, source=f"runs:/{rid}/model", run_id=rid)
        export_task.attach(cfg, name, mv.version, out, exported["report"], key=f"k-{mv.version}")
        client.set_model_version_tag(name, mv.version, "intentops.labels", json.dumps(labels))
        client.set_registered_model_alias(name, "champion", mv.version)
        return str(mv.version)

    # A run of the champion's label set: labelled builder items of those classes, and the
    # export model's own test messages without their labels.
    items, _ = _items_from_build(tmp_path / "raw", 3000, 0.0, seed=8)
    items = items[items.label.map(textnorm.normalize_label).isin(classes)].reset_index(drop=True)
    unl = pd.DataFrame({"record_id": [f"u{i:03d}" for i in range(len(trained["texts"]))],
                        "text": trained["texts"]})
    truth = dict(zip(unl.record_id, trained["labels"], strict=True))
    _fake_desensitize(cfg.lake, "r1", items, unl, classes=classes)
    qa = labelqa_stage.run(cfg, "r1")
    before = review_stage.read_queue(Path(qa.path)).set_index("record_id")
    # the ones label QA queued (repeats of a labelled message or of each other are dropped)
    truth = {r: lab for r, lab in truth.items() if r in before.index}
    unl = unl[unl.record_id.isin(truth)]
    assert len(truth) > 100

    assert prelabel.champion_for(cfg, classes)[0] is None  # no champion yet
    v1 = register(classes)
    assert prelabel.champion_for(cfg, classes) == (v1, f"{name} v{v1} (int8 ONNX build)")
    first = review_stage.run(cfg, "r1")
    stats = first.manifest["stats"]
    assert stats["prelabel"]["champion_version"] == v1 and first.manifest["inputs"]["prelabel_champion"] == {"version": v1}
    sent = pd.read_csv(Path(first.path) / "sent.csv", dtype={"record_id": str}, keep_default_na=False)
    mine = sent[sent.record_id.isin(truth)].set_index("record_id")
    assert len(mine) == len(truth)
    build = OnnxClassifier(tmp_path / "deploy" / cfg.dataset / "builds" / f"v{v1}")
    expected, conf = build.predict(unl.text.tolist(), batch_size=1)
    assert mine.suggested_label[unl.record_id].tolist() == expected
    assert (mine.score[unl.record_id].to_numpy() - (1 - np.asarray(conf))).__abs__().max() < 1e-5
    assert mine.reason.str.startswith(f"no label: champion v{v1} suggests").all()
    champ_hit = (mine.suggested_label[list(truth)] == pd.Series(truth)).mean()
    qa_hit = (before.suggested_label[list(truth)] == pd.Series(truth)).mean()
    print(f"pre-label accuracy on {len(truth)} messages: champion {champ_hit:.2f}, label QA's classifier {qa_hit:.2f}")
    ls = Client(url, creds.api_token)
    tasks = [t for t in ls.tasks(stats["project_id"]) if t["data"]["record_id"] in truth]
    assert len(tasks) == len(truth)
    preds = [p for t in tasks for p in ls.http.get("/api/predictions/", params={"task": t["id"]}).json()]
    assert {p["model_version"] for p in preds} == {f"{name}-v{v1}"}

    # The same champion again: a cache hit. A new champion of another label set: a new
    # push (the key follows the champion) that keeps label QA's suggestion and says why.
    assert review_stage.run(cfg, "r1").cache_hit
    v2 = register(classes[:-1])
    assert prelabel.champion_for(cfg, classes) == (None, f"{name} v{v2} was trained on another label set")
    q, info = review_stage.prelabel_with_champion(cfg, review_stage.read_queue(Path(qa.path)), None,
                                                  prelabel.champion_for(cfg, classes)[1])
    assert info["model"] == "label QA's text classifier" and "another label set" in info["why"]
    assert q.set_index("record_id").suggested_label[list(truth)].tolist() == before.suggested_label[list(truth)].tolist()
    # labeling.prelabel: labelqa never asks the registry.
    off = load_config(overrides={"lake_root": str(tmp_path / "lake"), "labeling.prelabel": "labelqa"}, env={})
    q, info = review_stage.prelabel_with_champion(off, review_stage.read_queue(Path(qa.path)), v1, "")
    assert info["why"] == "labeling.prelabel is labelqa"
    ls.close()
