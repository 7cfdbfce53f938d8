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


def test_a_class_with_a_single_example_trains_and_is_not_lost():
    """A class with one message (a label file naming a rare intent) goes to train: a model
    can learn it, and no empty test class skews the metrics; nothing is dropped."""
    labels = ["a"] * 50 + ["b"] * 50 + ["lonely"]
    split = labelqa.split_groups(pd.Series(labels), pd.Series(range(101)), (0.8, 0.1, 0.1), seed=0)
    assert len(split) == 101 and split[-1] == "train"


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
    assert a.agreement["note"].startswith("skipped: 0 items with two or more independent annotators")
    assert "undefined" in a.agreement["note"]
    assert a.agreement["krippendorff_alpha"] is None
    assert (a.items.consensus == a.items.given).all()
    assert a.items.suspect.any()  # the model still finds labels to question
    m = labelqa.metrics(a, labelqa.curated(a, LabelQAConfig()), labelqa.relabel_queue(a))
    gate = labelqa.gate_checks(m, LabelQAConfig(max_suspect_rate=1.0))
    assert gate["passed"] and gate["checks"][0]["passed"] is None
    assert gate["checks"][0]["note"] == a.agreement["note"] == m["agreement_note"]


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
    m = {"agreement": {"krippendorff_alpha": 0.62}, "suspect_rate": 0.12, "curated_rows": 10,
         "conflict_rate": 0.01}
    gate = labelqa.gate_checks(m, LabelQAConfig(min_alpha=0.8, max_suspect_rate=0.05))
    assert not gate["passed"]
    msg = labelqa.describe_failure(gate, "LAKE/labelqa/KEY")
    assert "krippendorff_alpha >= min_alpha: 0.62 (threshold 0.8)" in msg
    assert "suspect_rate <= max_suspect_rate: 0.12 (threshold 0.05)" in msg
    assert "LAKE/labelqa/KEY" in msg
    assert labelqa.gate_checks(m, LabelQAConfig(min_alpha=0.6, max_suspect_rate=0.2))["passed"]
    assert "conflict_rate" not in msg  # 0.01 is under the default max_conflict_rate


# --------------------------------------------------------------------------- independent annotators


# Five intents with words of their own (and shared filler), so the out-of-fold model is
# sure of every label and the only question left is agreement and conflicts.
SYNTH = {
    "card_arrival": ["card", "arrive", "arrived", "post", "mail", "delivery", "waiting", "yet"],
    "exchange_rate": ["exchange", "rate", "euro", "dollar", "convert", "currency", "pound", "quote"],
    "lost_or_stolen_card": ["lost", "stolen", "thief", "missing", "wallet", "robbed", "freeze", "block"],
    "top_up_failed": ["top", "up", "topup", "failed", "reload", "add", "funds", "error"],
    "declined_transfer": ["transfer", "declined", "rejected", "recipient", "iban", "sending", "payee", "refused"],
}
FILLER = ["please", "help", "my", "the", "today", "why", "is", "hi"]


def _synthetic_export(per_class: int, seed: int = 0) -> pd.DataFrame:
    """A plain single-label export as dedup leaves it: no annotations, every cluster with
    one label (``label_conflict`` False)."""
    rng = np.random.default_rng(seed)
    rows = []
    for c, words in SYNTH.items():
        for _ in range(per_class):
            toks = list(rng.choice(words, 4)) + list(rng.choice(FILLER, 2))
            rng.shuffle(toks)
            rows.append((" ".join(toks), c))
    df = pd.DataFrame(rows, columns=["text", "label"]).sample(frac=1.0, random_state=seed).reset_index(drop=True)
    df.insert(0, "record_id", [f"t{i:05d}" for i in range(len(df))])
    return df.assign(annotations=None, cluster_labels=[[x] for x in df.label], label_conflict=False)


def _plant_conflicts(items: pd.DataFrame, rows, other=lambda lab: "card_delivery_estimate") -> pd.DataFrame:
    """Mark ``rows`` as dedup clusters whose merged copies carried another label."""
    items = items.copy()
    for i in rows:
        lab = items.at[i, "label"]
        items.at[i, "cluster_labels"] = sorted([lab, other(lab)])
        items.at[i, "label_conflict"] = True
    return items


@pytest.fixture(scope="module")
def single_label_export():
    items = _plant_conflicts(_synthetic_export(160), range(0, 800, 80))  # 10 conflicts in 800 items
    return items, labelqa.analyze(items, CLASSES, LabelQAConfig())


def test_single_label_export_with_a_few_dedup_conflicts_passes_with_agreement_skipped(single_label_export):
    # The user's report: one label per message, a handful of dedup conflicts. The conflict
    # copies gave 10 items a second "annotation" and an alpha over those 10 failed the gate.
    items, a = single_label_export
    assert a.info["dedup_conflict_votes"] == 10
    assert set(a.ann.annotator) == {labelqa.EXPORT_ANNOTATOR, labelqa.DEDUP_ANNOTATOR}
    # What the old code measured: with the pseudo-annotators counted there are 10 items
    # with two "annotations" and an alpha (far below min_alpha).
    naive = labelqa.agreement.agreement(a.ann, len(items), CLASSES, a.items.consensus)
    assert naive["items_with_multiple_annotations"] == 10 and naive["krippendorff_alpha"] < 0.8
    ag = a.agreement
    assert ag["agreement_items"] == 0 and ag["krippendorff_alpha"] is None and ag["fleiss_kappa"] is None
    assert ag["mean_item_agreement"] is None and ag["cohen_kappa"] == []
    assert ag["note"] == ("skipped: 0 items with two or more independent annotators, fewer than "
                          "labelqa.min_agreement_items 200 (agreement is undefined without two such items)")
    assert ag["pseudo_annotators"] == [labelqa.DEDUP_ANNOTATOR, labelqa.EXPORT_ANNOTATOR]
    assert a.items.item_agreement.isna().all()  # export + dedup copy is not two annotators
    # Confident learning still ran on the single labels.
    assert a.items.model_label.notna().all() and "cleanlab_issue" in a.items
    m = labelqa.metrics(a, labelqa.curated(a, LabelQAConfig()), labelqa.relabel_queue(a))
    assert m["agreement_note"] == ag["note"]
    assert m["dedup_label_conflict_items"] == 10 and m["conflict_rate"] == pytest.approx(10 / 800)
    gate = labelqa.gate_checks(m, LabelQAConfig())  # the default bar
    assert gate["passed"], gate
    alpha_check, *_ = gate["checks"]
    assert alpha_check["passed"] is None and alpha_check["note"] == ag["note"]
    conflict_check = next(c for c in gate["checks"] if c["name"] == "conflict_rate <= max_conflict_rate")
    assert conflict_check["passed"] is True and conflict_check["value"] == pytest.approx(0.0125)
    # The note reaches the QA report.
    from quality import qareport

    html = qareport.render(a.items, a.ann, m | {"consensus_method": "dawid_skene"}, labelqa.relabel_queue(a),
                           gate, "r1")
    assert "PASSED" in html and "labelqa.min_agreement_items 200" in html
    assert "dedup conflict rate" in html and "card_delivery_estimate" in html


def test_conflict_rate_gate_fails_above_its_threshold_and_passes_below(single_label_export):
    items, a = single_label_export
    m = labelqa.metrics(a, labelqa.curated(a, LabelQAConfig()), labelqa.relabel_queue(a))
    assert m["conflict_rate"] == pytest.approx(0.0125)
    loose = LabelQAConfig(max_conflict_rate=0.02, max_suspect_rate=1.0)
    strict = LabelQAConfig(max_conflict_rate=0.01, max_suspect_rate=1.0)
    assert labelqa.gate_checks(m, loose)["passed"]
    gate = labelqa.gate_checks(m, strict)
    assert not gate["passed"]
    assert [c["name"] for c in gate["checks"] if c["passed"] is False] == ["conflict_rate <= max_conflict_rate"]
    assert "conflict_rate <= max_conflict_rate: 0.0125 (threshold 0.01)" in labelqa.describe_failure(gate, "OUT")
    # A genuinely inconsistent export: a fifth of the clusters disagree -> the default fails.
    bad = _plant_conflicts(items, range(0, 800, 5))
    rate = labelqa.conflict_rates(bad.assign(given=bad.label))["conflict_rate"]
    assert rate == pytest.approx(0.2)
    assert not labelqa.gate_checks(m | {"conflict_rate": rate}, LabelQAConfig(max_suspect_rate=1.0))["passed"]


def test_per_class_conflict_rates():
    items = pd.DataFrame({
        "label": ["card_arrival"] * 10 + ["exchange_rate"] * 4 + ["top_up_failed"] * 6 + ["not a label"],
        "cluster_labels": (
            [["card_arrival", "card_delivery_estimate"]] * 3 + [["card_arrival"]] * 7
            + [["exchange_rate", "top_up_failed"]] + [["exchange_rate"]] * 3
            + [["top_up_failed"]] * 6 + [["card_arrival", "exchange_rate"]]
        ),
    })
    items["label_conflict"] = items.cluster_labels.map(len) > 1
    items["given"] = items.label.map(textnorm.normalize_label).where(lambda s: s.isin(CLASSES), None)
    out = labelqa.conflict_rates(items)
    assert out["conflict_items"] == 5 and out["conflict_rate"] == pytest.approx(5 / 21)
    by = {r["label"]: (r["items"], r["conflicts"], r["rate"]) for r in out["conflict_rate_by_class"]}
    # An item counts toward every label its cluster carries, whichever copy dedup kept.
    assert by == {
        "card_delivery_estimate": (3, 3, 1.0),
        "card_arrival": (11, 4, pytest.approx(4 / 11)),
        "exchange_rate": (5, 2, pytest.approx(0.4)),
        "top_up_failed": (7, 1, pytest.approx(1 / 7)),
    }
    assert [r["label"] for r in out["conflict_rate_by_class"]] == [
        "card_delivery_estimate", "exchange_rate", "card_arrival", "top_up_failed"]
    assert len(labelqa.conflict_rates(items, top=2)["conflict_rate_by_class"]) == 2
    # No dedup columns: no conflicts.
    plain = labelqa.conflict_rates(items[["label", "given"]].assign(label_conflict=False))
    assert plain["conflict_rate"] == 0.0 and plain["conflict_rate_by_class"] == []


def _two_annotator_export(n_two: int, n_one: int, seed: int = 1) -> pd.DataFrame:
    """``n_two`` items labeled by a1 and a2 (a2 wrong on every 8th), then ``n_one`` by a1
    only, whose dedup copies disagree on every other one."""
    items = _synthetic_export(60, seed=seed).head(n_two + n_one)
    wrong = {c: o for c, o in zip(SYNTH, list(SYNTH)[1:] + list(SYNTH)[:1], strict=True)}
    anns = []
    for i, lab in enumerate(items.label):
        a1 = {"annotator": "a1", "label": lab}
        if i < n_two:
            anns.append([a1, {"annotator": "a2", "label": wrong[lab] if i % 8 == 0 else lab}])
        else:
            anns.append([a1])
    items = items.assign(annotations=anns)
    return _plant_conflicts(items, range(n_two, n_two + n_one, 2), other=lambda lab: wrong[lab])


def test_agreement_counts_independent_annotators_only():
    items = _two_annotator_export(n_two=220, n_one=80)
    cfg = LabelQAConfig(min_agreement_items=200)
    a = labelqa.analyze(items, CLASSES, cfg)
    assert a.info["dedup_conflict_votes"] == 40  # they vote in the consensus ...
    ag = a.agreement
    # ... but agreement is over the 220 items with a1 and a2: 28 of them disagree.
    real = a.ann[a.ann.annotator.isin(["a1", "a2"])]
    counts = labelqa.agreement.count_matrix(real, len(items), CLASSES)
    expected = labelqa.agreement.kripp_alpha(counts)
    assert ag["agreement_items"] == 220 and "note" not in ag
    assert ag["krippendorff_alpha"] == pytest.approx(expected, abs=1e-6)
    # Counting the dedup copies as an annotator would have changed it (40 more pairs, all
    # disagreeing), and so would the label column.
    with_copies = labelqa.agreement.kripp_alpha(labelqa.agreement.count_matrix(a.ann, len(items), CLASSES))
    assert abs(with_copies - expected) > 0.05
    assert ag["fleiss_items"] == 220 and ag["fleiss_annotations_per_item"] == 2
    assert [(p["a"], p["b"], p["items"]) for p in ag["cohen_kappa"]] == [("a1", "a2", 220)]
    assert ag["mean_item_agreement"] == pytest.approx(1 - 28 / 220, abs=1e-6)
    # Per item: the a1 + dedup copy items have no agreement; a1 + a2 items do.
    assert a.items.item_agreement[220:].isna().all()
    assert a.items.item_agreement[:220].notna().all()
    pseudo = {r["annotator"] for r in ag["per_annotator"] if r.get("pseudo")}
    assert pseudo == {labelqa.DEDUP_ANNOTATOR}
    # Above the item count the same data skips agreement, with the count in the note.
    skipped = labelqa.agreement.agreement(
        a.ann, len(items), CLASSES, a.items.consensus, pseudo=labelqa.PSEUDO_ANNOTATORS,
        min_items=221, min_items_setting="labelqa.min_agreement_items")
    assert skipped["krippendorff_alpha"] is None
    assert skipped["note"] == ("skipped: 220 items with two or more independent annotators, fewer than "
                               "labelqa.min_agreement_items 221")
    m = labelqa.metrics(a, labelqa.curated(a, cfg), labelqa.relabel_queue(a))
    assert m["agreement_note"] is None
    assert labelqa.gate_checks(m, cfg)["checks"][0]["passed"] is (ag["krippendorff_alpha"] >= cfg.min_alpha)


# --------------------------------------------------------------------------- the stage


def _fake_desensitize(lake, run_id: str, items: pd.DataFrame, unlabeled: pd.DataFrame | None = None,
                      classes: list[str] = CLASSES) -> None:
    """Publish a clean output with the run's label set and a desensitize output for
    `run_id` through the stage framework (what the Spark jobs do), so the label-QA stage
    has real upstreams to read."""
    def labels(out):
        (out / "labels.json").write_text(json.dumps(classes))
        return {}

    stage.run_stage("clean", lake, {"test": len(classes), "classes": classes}, {}, "test", labels, run_id)

    def work(out):
        kept = items if "label_conflict" in items else items.assign(
            cluster_labels=[[x] for x in items.label], label_conflict=False)
        (out / "kept").mkdir()
        kept.to_parquet(out / "kept" / "part-0.parquet", index=False)
        if unlabeled is not None:  # rows without a label (clean.unlabeled: review)
            (out / "unlabeled").mkdir()
            unlabeled.to_parquet(out / "unlabeled" / "part-0.parquet", index=False)
        return {"rows_in": len(kept), "kept": len(kept)}

    stage.run_stage("desensitize", lake, {"test": len(items), "unlabeled": None if unlabeled is None
                                          else len(unlabeled)}, {}, "test", work, run_id)


def test_stage_publishes_logs_to_mlflow_and_reruns_idempotently(tmp_path, mlflow_server, monkeypatch, noisy):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    items, _, _ = noisy
    cfg = load_config(overrides={"lake_root": str(tmp_path / "lake")}, env={})
    _fake_desensitize(cfg.lake, "r1", items)
    res = labelqa_stage.run(cfg, "r1")
    for f in ("qa_report.html", "relabel_queue.csv", "relabel_queue.json", "label_studio_config.xml",
              "metrics.json", "curated"):
        assert (cfg.lake / "labelqa" / res.key / f).exists(), f
    html = (cfg.lake / "labelqa" / res.key / "qa_report.html").read_text()
    assert html.count("data:image/png;base64,") >= 3  # annotators, confusion, per class, suspects
    labelqa_stage.check(cfg, res)  # default bar passes
    client = MlflowClient(mlflow_server)
    exp = client.get_experiment_by_name("intentops-banking77-data-quality")
    # The server is shared by the session: look at this stage output's runs only.
    mine = f"tags.`intentops.stage_key` = '{res.key}'"
    runs = client.search_runs([exp.experiment_id], filter_string=mine)
    assert len(runs) == 1 and runs[0].info.run_id == res.manifest["stats"]["mlflow_run_id"]
    r = runs[0]
    assert r.data.metrics["suspects"] == res.manifest["stats"]["suspects"]
    # Three annotators per item: agreement is computed, so there is no note.
    assert res.manifest["stats"]["agreement_note"] is None
    assert r.data.metrics["krippendorff_alpha"] == res.manifest["stats"]["krippendorff_alpha"]
    assert r.data.metrics["conflict_rate"] == res.manifest["stats"]["conflict_rate"] == 0.0
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
    assert (cfg.lake / "labelqa" / res.key / "qa_report.html").exists()
    assert len(pd.read_csv(f"{res.path}/relabel_queue.csv")) == res.manifest["stats"]["suspects"]
    assert "FAILED" in (cfg.lake / "labelqa" / res.key / "qa_report.html").read_text()


def test_stage_stats_carry_the_agreement_note_of_a_single_label_export(tmp_path, mlflow_server, monkeypatch,
                                                                      single_label_export):
    from mlflow.tracking import MlflowClient

    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server)
    items, a = single_label_export
    cfg = load_config(overrides={"lake_root": str(tmp_path / "lake")}, env={})
    _fake_desensitize(cfg.lake, "r1", items)
    res = labelqa_stage.run(cfg, "r1")
    assert labelqa_stage.check(cfg, res).startswith("label QA passed")  # the default bar
    stats = res.manifest["stats"]
    assert stats["krippendorff_alpha"] is None and stats["agreement_items"] == 0
    assert stats["agreement_note"] == a.agreement["note"]
    assert "labelqa.min_agreement_items 200" in stats["agreement_note"]
    assert stats["conflict_rate"] == pytest.approx(0.0125) and stats["gate_passed"] is True
    m = json.loads((cfg.lake / "labelqa" / res.key / "metrics.json").read_text())
    assert m["agreement_note"] == stats["agreement_note"] and m["conflict_rate_by_class"]
    run = MlflowClient(mlflow_server).get_run(stats["mlflow_run_id"])
    assert run.data.tags["intentops.agreement_note"] == stats["agreement_note"]
    assert "krippendorff_alpha" not in run.data.metrics and run.data.metrics["conflict_rate"] == 0.0125


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
