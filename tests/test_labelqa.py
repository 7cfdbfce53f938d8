"""Label QA on small builds: detection finds planted errors, the split keeps clusters
whole, the queue is valid Label Studio input, bad input is handled, the gate passes and
fails on purpose, and the stage logs to a real MLflow server idempotently."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import numpy as np
import pandas as pd
import pytest
from conftest import ROOT

import textnorm
from core import stage
from core.config import LabelQAConfig, load_config
from demo import builder as rawdata
from quality import labelqa, labelqa_stage

CLASSES = sorted(
    {textnorm.normalize_label(x) for x in json.loads((ROOT / "data" / "banking77" / "categories.json").read_text())}
)


def _items_from_build(out, rows: int, rate: float, seed: int = 5, annotators: int = 3) -> tuple[pd.DataFrame, np.ndarray]:
    rawdata.main(["--out", str(out), "--rows", str(rows), "--seed", str(seed), "--format", "parquet",
                  "--label-error-rate", str(rate), "--annotators-per-item", str(annotators)])
    raw = pd.read_parquet(out / "raw.parquet")
    gt = pd.read_parquet(out / "ground_truth" / "rows.parquet").set_index("ticket_id").loc[raw.ticket_id]
    keep = gt.defect.isna().to_numpy() & gt.dup_kind.isna().to_numpy()  # what dedup would keep
    r = raw[keep]
    items = pd.DataFrame({
        "record_id": r.ticket_id.to_numpy(), "text": r.message.to_numpy(), "label": r.intent.to_numpy(),
        "annotations": [json.loads(a) if a else None for a in r.annotations],
    })
    true = gt.true_label[keep].map(textnorm.normalize_label).to_numpy()
    return items, true


@pytest.fixture(scope="module")
def noisy(tmp_path_factory):
    items, true = _items_from_build(tmp_path_factory.mktemp("b") / "raw", 6000, 0.10)
    return items, true, labelqa.analyze(items, CLASSES, LabelQAConfig())


def test_detection_finds_the_planted_errors(noisy):
    items, true, a = noisy
    d = a.items
    needs = d.consensus.to_numpy() != true
    queued = d.suspect.to_numpy()
    assert needs.sum() > 30  # the build planted errors that survive the consensus
    precision = (needs & queued).sum() / queued.sum()
    recall = (needs & queued).sum() / needs.sum()
    assert precision >= 0.7 and recall >= 0.85, (precision, recall)
    # Consensus repairs most of the exported labels' errors; the queue's suggestions fix
    # most of what is left.
    assert (d.consensus.to_numpy() == true).mean() > (d.given.to_numpy() == true).mean() + 0.05
    sugg = d.suggested.to_numpy()[queued & needs]
    assert (sugg == true[queued & needs]).mean() >= 0.7
    # Ranked: the score is the probability that the consensus label is wrong.
    q = labelqa.relabel_queue(a)
    assert q.score.is_monotonic_decreasing and list(q["rank"]) == list(range(1, len(q) + 1))


def test_curated_modes(noisy):
    _, _, a = noisy
    n_sus = int((a.items.suspect & a.items.consensus.notna()).sum())
    ex = labelqa.curated(a, LabelQAConfig(suspects="exclude"))
    rel = labelqa.curated(a, LabelQAConfig(suspects="relabel"))
    down = labelqa.curated(a, LabelQAConfig(suspects="downweight", downweight=0.25))
    assert len(rel) == len(down) == len(ex) + n_sus
    assert not ex.suspect.any() and (ex.weight == 1.0).all()
    changed = rel[rel.suspect & (rel.label != rel.consensus_label)]
    assert len(changed) > 0
    assert set(down[down.suspect].weight) == {0.25}
    assert set(ex.split) == {"train", "val", "test"}
    shares = ex.split.value_counts(normalize=True)
    assert shares["train"] == pytest.approx(0.8, abs=0.03) and shares["test"] == pytest.approx(0.1, abs=0.03)


def test_split_never_separates_a_cluster_and_stratifies():
    rng = np.random.default_rng(1)
    n_groups = 3000
    sizes = rng.integers(1, 6, n_groups)
    groups = np.repeat(np.arange(n_groups), sizes)
    labels = np.repeat(rng.choice(["a", "b", "c", "rare"], n_groups, p=[0.5, 0.3, 0.18, 0.02]), sizes)
    split = labelqa.split_groups(pd.Series(labels), pd.Series(groups), (0.8, 0.1, 0.1), seed=3)
    df = pd.DataFrame({"g": groups, "s": split, "y": labels})
    assert (df.groupby("g").s.nunique() == 1).all()
    for _, sub in df.groupby("y"):
        shares = sub.s.value_counts(normalize=True)
        assert shares.get("test", 0) == pytest.approx(0.1, abs=0.05)
        assert shares.get("val", 0) == pytest.approx(0.1, abs=0.05)
    # Deterministic for a seed.
    again = labelqa.split_groups(pd.Series(labels), pd.Series(groups), (0.8, 0.1, 0.1), seed=3)
    assert (again == split).all()


LABEL_STUDIO_TASK = {
    "type": "array",
    "items": {
        "type": "object",
        "required": ["data"],
        "properties": {
            "data": {"type": "object", "required": ["text"], "properties": {"text": {"type": "string"}}},
            "predictions": {
                "type": "array",
                "items": {
                    "type": "object",
                    "required": ["result"],
                    "properties": {
                        "model_version": {"type": "string"},
                        "score": {"type": "number"},
                        "result": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "required": ["from_name", "to_name", "type", "value"],
                                "properties": {
                                    "type": {"const": "choices"},
                                    "value": {
                                        "type": "object",
                                        "required": ["choices"],
                                        "properties": {"choices": {"type": "array", "items": {"type": "string"},
                                                                   "minItems": 1}},
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}


def test_queue_is_valid_label_studio_import(noisy):
    import jsonschema

    _, _, a = noisy
    tasks = json.loads(json.dumps(labelqa.label_studio_tasks(labelqa.relabel_queue(a))))
    jsonschema.validate(tasks, LABEL_STUDIO_TASK)
    assert tasks and all("predictions" in t for t in tasks if t["data"]["consensus_label"])
    view = ET.fromstring(labelqa.label_studio_config(CLASSES))
    text = view.find("Text")
    choices = view.find("Choices")
    assert text.get("value") == "$text" and choices.get("toName") == text.get("name")
    allowed = {c.get("value") for c in choices.findall("Choice")}
    assert allowed == set(CLASSES)
    for t in tasks:
        for p in t.get("predictions", []):
            for r in p["result"]:
                assert r["from_name"] == choices.get("name") and r["to_name"] == text.get("name")
                assert set(r["value"]["choices"]) <= allowed


def test_single_annotator_export_skips_agreement_with_a_note(tmp_path):
    items, true = _items_from_build(tmp_path / "raw", 3000, 0.05, annotators=1)
    items["annotations"] = None  # a plain export: one label column, no annotator list
    a = labelqa.analyze(items, CLASSES, LabelQAConfig())
    assert "undefined" in a.agreement["note"]
    assert a.agreement["krippendorff_alpha"] is None
    assert (a.items.consensus == a.items.given).all()
    assert a.items.suspect.any()  # the model still finds labels to question
    m = labelqa.metrics(a, labelqa.curated(a, LabelQAConfig()), labelqa.relabel_queue(a))
    gate = labelqa.gate_checks(m, LabelQAConfig(max_suspect_rate=1.0))
    assert gate["passed"] and gate["checks"][0]["passed"] is None


def test_no_valid_label_goes_to_the_queue_and_a_tiny_class_is_reported():
    texts = [f"where is my new card number {i}" for i in range(40)] + [
        f"my transfer {i} was declined again" for i in range(40)]
    items = pd.DataFrame({
        "record_id": [f"r{i}" for i in range(83)],
        "text": texts + ["what is this", "exchange rate please", "exchange rates?"],
        "label": ["card_arrival"] * 40 + ["declined_transfer"] * 40 + ["not a label", "exchange_rate", "exchange_rate"],
        "annotations": [None] * 80 + [[{"annotator": "a1", "label": "bogus"}], None, None],
    })
    a = labelqa.analyze(items, CLASSES, LabelQAConfig())
    row = a.items.set_index("record_id").loc["r80"]
    assert row.suspect and row.reason == "no valid label" and row.consensus is None
    assert np.isnan(row.item_agreement)
    assert a.info["classes_too_small_for_cv"] == ["exchange_rate"]
    assert a.info["invalid_annotations_dropped"] == 1
    cur = labelqa.curated(a, LabelQAConfig(suspects="relabel"))
    assert "r80" not in set(cur.record_id)
    q = labelqa.relabel_queue(a)
    assert "r80" in set(q.record_id)


def test_gate_checks_and_message():
    m = {"agreement": {"krippendorff_alpha": 0.62}, "suspect_rate": 0.12, "curated_rows": 10}
    gate = labelqa.gate_checks(m, LabelQAConfig(min_alpha=0.8, max_suspect_rate=0.05))
    assert not gate["passed"]
    msg = labelqa.describe_failure(gate, "LAKE/labelqa/KEY")
    assert "krippendorff_alpha >= min_alpha: 0.62 (threshold 0.8)" in msg
    assert "suspect_rate <= max_suspect_rate: 0.12 (threshold 0.05)" in msg
    assert "LAKE/labelqa/KEY" in msg
    assert labelqa.gate_checks(m, LabelQAConfig(min_alpha=0.6, max_suspect_rate=0.2))["passed"]


# --------------------------------------------------------------------------- the stage


def _fake_desensitize(lake, run_id: str, items: pd.DataFrame) -> None:
    """Publish a desensitize output for `run_id` through the stage framework (what the
    Spark job does), so the label-QA stage has a real upstream to read."""
    def work(out):
        kept = items.assign(cluster_labels=[[x] for x in items.label], label_conflict=False)
        (out / "kept").mkdir()
        kept.to_parquet(out / "kept" / "part-0.parquet", index=False)
        return {"rows_in": len(kept), "kept": len(kept)}

    stage.run_stage("desensitize", lake, {"test": len(items)}, {}, "test", work, run_id)


def test_stage_publishes_logs_to_mlflow_and_reruns_idempotently(tmp_path, mlflow_server, monkeypatch, noisy):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    items, _, _ = noisy
    cfg = load_config(overrides={"lake_root": str(tmp_path / "lake")}, env={})
    _fake_desensitize(cfg.lake, "r1", items)
    res = labelqa_stage.run(cfg, "r1")
    for f in ("qa_report.html", "relabel_queue.csv", "relabel_queue.json", "label_studio_config.xml",
              "metrics.json", "curated"):
        assert (tmp_path / "lake" / "labelqa" / res.key / f).exists(), f
    html = (tmp_path / "lake" / "labelqa" / res.key / "qa_report.html").read_text()
    assert html.count("data:image/png;base64,") >= 3  # annotators, confusion, per class, suspects
    labelqa_stage.check(cfg, res)  # default bar passes
    client = MlflowClient(mlflow_server)
    exp = client.get_experiment_by_name("intentops-data-quality")
    # The server is shared by the session: look at this stage output's runs only.
    mine = f"tags.`intentops.stage_key` = '{res.key}'"
    runs = client.search_runs([exp.experiment_id], filter_string=mine)
    assert len(runs) == 1 and runs[0].info.run_id == res.manifest["stats"]["mlflow_run_id"]
    r = runs[0]
    assert r.data.metrics["suspects"] == res.manifest["stats"]["suspects"]
    assert r.data.tags["intentops.stage_key"] == res.key
    assert {a.path for a in client.list_artifacts(r.info.run_id)} >= {"qa_report.html", "metrics.json",
                                                                       "relabel_queue.csv"}
    # A second pipeline run over the same data: a cache hit, and no second MLflow run.
    _fake_desensitize(cfg.lake, "r2", items)
    second = labelqa_stage.run(cfg, "r2")
    assert second.cache_hit and second.path == res.path
    assert len(client.search_runs([exp.experiment_id], filter_string=mine)) == 1


def test_stage_gate_failure_keeps_report_and_queue(tmp_path, mlflow_server, monkeypatch, noisy):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    items, _, _ = noisy
    cfg = load_config(overrides={"lake_root": str(tmp_path / "lake"), "labelqa.min_alpha": 0.99,
                                 "labelqa.max_suspect_rate": 0.001}, env={})
    _fake_desensitize(cfg.lake, "r1", items)
    res = labelqa_stage.run(cfg, "r1")
    with pytest.raises(labelqa.QAGateFailed, match="krippendorff_alpha >= min_alpha") as exc:
        labelqa_stage.check(cfg, res)
    assert "suspect_rate <= max_suspect_rate" in str(exc.value)
    assert res.path in str(exc.value)
    assert (tmp_path / "lake" / "labelqa" / res.key / "qa_report.html").exists()
    assert len(pd.read_csv(f"{res.path}/relabel_queue.csv")) == res.manifest["stats"]["suspects"]
    assert "FAILED" in (tmp_path / "lake" / "labelqa" / res.key / "qa_report.html").read_text()


def test_per_item_agreement_is_published(noisy):
    _, _, a = noisy
    cur = labelqa.curated(a, LabelQAConfig())
    multi = cur[cur.n_annotations >= 2]
    assert len(multi) and multi.item_agreement.between(0, 1).all()
    assert cur[cur.n_annotations == 1].item_agreement.isna().all()
    # Three annotators agreeing -> 1.0; two of three -> 1/3.
    assert set(multi[multi.n_annotations == 3].item_agreement.round(4)) <= {1.0, 0.3333, 0.0}


def test_dedup_label_conflicts_add_the_copies_label_as_a_vote():
    items = pd.DataFrame({
        "record_id": ["s1", "s2"], "text": ["where is my card", "my card is lost"],
        "label": ["card_arrival", "lost_or_stolen_card"],
        "annotations": [[{"annotator": "a1", "label": "card_arrival"}], None],
        "cluster_labels": [["card_arrival", "card_delivery_estimate"], ["lost_or_stolen_card"]],
        "label_conflict": [True, False],
    }).assign(given=["card_arrival", "lost_or_stolen_card"])
    ann, _ = labelqa.annotations_long(items, CLASSES)
    ann, n = labelqa._dedup_votes(items, ann, CLASSES)
    assert n == 1
    extra = ann[ann.annotator == labelqa.DEDUP_ANNOTATOR]
    assert extra[["item", "label"]].values.tolist() == [[0, "card_delivery_estimate"]]
