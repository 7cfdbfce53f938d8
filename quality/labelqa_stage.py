"""Label QA as a pipeline stage: the pure analysis of ``quality.labelqa`` run on the
desensitized rows, its outputs published, its metrics logged to MLflow, and its gate.

The stage publishes the QA report, the relabel queue and the curated split first and
then fails (``QAGateFailed``) when label quality is below the bar, so people can act on
what it found.

    intentops labelqa --run-id RUN
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pandas as pd

from core import runs, stage, stages, tracking
from core.config import PipelineConfig
from quality import feedback, qareport, review, unlabeled
from quality.labelqa import (
    QAGateFailed,
    analyze,
    curated,
    describe_failure,
    gate_checks,
    label_studio_config,
    label_studio_tasks,
    metrics,
    relabel_queue,
)

log = logging.getLogger(__name__)
STAGE = "labelqa"


def run(cfg: PipelineConfig, run_id: str) -> stage.StageResult:
    """Read desensitize's kept rows, publish the QA outputs, log to MLflow."""
    src = stage.upstream(cfg.lake, run_id, "desensitize")
    classes = runs.run_labels(cfg.lake, run_id)
    qa = cfg.labelqa
    inputs = {"desensitize": {"key": src.manifest["key"]}}
    # Reviewed labels from Label Studio (the ``reviewer`` source): a new pull changes the key.
    store = review.ReviewStore(cfg.lake)
    if store.fingerprint():
        inputs["reviewer_annotations"] = {"version": store.fingerprint()}
    # Feedback labels of served predictions (the ``feedback`` source): new ones change the key.
    fb_rows = feedback.load(cfg.lake) if qa.feedback == "train" else pd.DataFrame(columns=feedback.COLUMNS)
    if feedback.fingerprint(fb_rows):
        inputs["feedback_labels"] = {"version": feedback.fingerprint(fb_rows)}
    stage_cfg = {"labelqa": qa.model_dump(), "labels": classes}
    code = stages.code_version(STAGE)
    key = stage.stage_key(STAGE, inputs, stage_cfg, code)

    def work(out: Path) -> dict[str, Any]:
        cols = ["record_id", "text", "label", "annotations", "cluster_labels", "label_conflict"]
        items = pd.read_parquet(Path(src.path) / "kept", columns=cols)
        # Each kept row is a dedup survivor standing for its whole cluster.
        items["cluster_id"] = items.record_id
        a = analyze(items, classes, qa)
        resolved, review_info = review.resolve(store.annotations(), classes)
        a.items = review.apply(a.items, resolved)
        # Messages without a label (clean.unlabeled: review): pre-labeled, queued by
        # uncertainty after the suspects; the reviewed ones join the train split.
        unl, unl_info = unlabeled.prepare(unlabeled.load(Path(src.path)), a.items, qa, resolved)
        cur, fb_info = feedback.merge(unlabeled.reviewed_rows(unl, curated(a, qa)), fb_rows, classes)
        queue = relabel_queue(a)
        m = metrics(a, cur, queue) | {"consensus_method": qa.consensus, "feedback": fb_info,
                                      "unlabeled": unl_info}
        queue = pd.concat([queue, unlabeled.queue_rows(unl, len(queue) + 1)], ignore_index=True)
        unl.to_parquet(out / "unlabeled.parquet", index=False)
        m["review"] = review_info | {
            "items_reviewed": int(len(resolved)),
            "applied": int((a.items.label_source == "reviewer").sum()),
            "unresolved_ties": int(resolved.reviewed_label.isna().sum()) if len(resolved) else 0,
            "rounds": review.rounds(a.items, resolved),
        }
        # The model's accuracy after each round: the training that followed it (MLflow);
        # the newest round's model is this run's own training, not trained yet.
        after, before = _accuracy_after_rounds(cfg) if m["review"]["rounds"] else ({}, None)
        for r in m["review"]["rounds"]:
            r["model_test_accuracy_after"] = (after.get(r["round"]) or {}).get("test_accuracy")
        m["review"]["model_test_accuracy_before_reviews"] = (before or {}).get("test_accuracy")
        gate = gate_checks(m, qa)
        m["gate"] = gate
        (out / "curated").mkdir()
        cur.to_parquet(out / "curated" / "part-0.parquet", index=False)
        queue.to_csv(out / "relabel_queue.csv", index=False)
        (out / "relabel_queue.json").write_text(json.dumps(label_studio_tasks(queue), indent=1))
        (out / "label_studio_config.xml").write_text(label_studio_config(classes))
        (out / "qa_report.html").write_text(qareport.render(a.items, a.ann, m, queue, gate, run_id))
        (out / "metrics.json").write_text(json.dumps(m, indent=2, default=str))
        ag = m["agreement"]
        flat = {
            "items": m["items"], "suspects": m["suspects"], "suspect_rate": m["suspect_rate"],
            "cleanlab_issues": m["cleanlab_issues"], "curated_rows": m["curated_rows"],
            "krippendorff_alpha": ag.get("krippendorff_alpha"), "fleiss_kappa": ag.get("fleiss_kappa"),
            "mean_item_agreement": ag.get("mean_item_agreement"),
            "agreement_items": ag.get("agreement_items"), "conflict_rate": m["conflict_rate"],
            "consensus_changed_exported_label": m["consensus_changed_exported_label"],
            "model_agrees_with_consensus": m["model_agrees_with_consensus"],
            "gate_passed": float(gate["passed"]), "feedback_rows_added": fb_info["added"],
            "unlabeled_rows": unl_info["rows"], "unlabeled_queued": unl_info["queued"],
        }
        for split, n in m["curated_by_split"].items():
            flat[f"curated_{split}_rows"] = n
        run = tracking.log_stage_run(
            cfg, cfg.tracking.data_quality_experiment, key, f"labelqa-{stage.safe_run_id(run_id)}",
            params={f"labelqa.{k}": v for k, v in qa.model_dump().items()},
            metrics=flat,
            tags={"intentops.stage": STAGE, "intentops.pipeline_run_id": run_id,
                  "intentops.desensitize_key": src.manifest["key"], "gate": "passed" if gate["passed"] else "failed"}
            | ({"intentops.agreement_note": m["agreement_note"]} if m["agreement_note"] else {}),
            artifacts=[out / "qa_report.html", out / "metrics.json", out / "relabel_queue.csv"],
        )
        (out / "mlflow_run.json").write_text(json.dumps(run))
        log.info("label QA: %d items, %d suspects, alpha %s, conflict rate %s, MLflow run %s",
                 m["items"], m["suspects"], m["agreement_note"] or ag.get("krippendorff_alpha"),
                 m["conflict_rate"], run["run_id"])
        return {
            "rows_in": m["items"], "kept": m["curated_rows"], "suspects": m["suspects"],
            "suspect_rate": m["suspect_rate"], "krippendorff_alpha": ag.get("krippendorff_alpha"),
            # Why alpha is None (agreement skipped or undefined); None when there is an alpha.
            "agreement_note": m["agreement_note"], "agreement_items": ag.get("agreement_items"),
            "conflict_rate": m["conflict_rate"],
            "gate_passed": gate["passed"], "mlflow_run_id": run["run_id"],
            "mlflow_experiment_id": run["experiment_id"], "curated_by_split": m["curated_by_split"],
            "report": "qa_report.html", "queue": "relabel_queue.csv", "feedback_rows_added": fb_info["added"],
            "unlabeled": unl_info["rows"], "unlabeled_queued": unl_info["queued"],
            "unlabeled_reviewed": unl_info["reviewed"],
        }

    return stage.run_stage(STAGE, cfg.lake, inputs, stage_cfg, code, work, run_id)


def _accuracy_after_rounds(cfg: PipelineConfig) -> tuple[dict[int, dict[str, Any]], dict[str, Any] | None]:
    """The model's test accuracy after each earlier review round (training runs in MLflow
    tagged with the label-QA output they trained on; quality/review.accuracy_after_rounds)."""
    published = []
    for m_file in (cfg.lake / STAGE).glob("*/metrics.json"):
        rounds = (json.loads(m_file.read_text()).get("review") or {}).get("rounds") or []
        published.append({"key": m_file.parent.name, "last_round": max((r["round"] for r in rounds), default=0)})
    if not published:
        return {}, None
    client = tracking.mlflow_client(cfg)
    exp = client.get_experiment_by_name(cfg.training.experiment)
    if exp is None:
        return {}, None
    # the newest 1,000 trainings (the rounds a report shows are recent ones)
    found = client.search_runs([exp.experiment_id], filter_string="tags.`intentops.data.labelqa_key` != ''",
                               max_results=1000, order_by=["attributes.start_time DESC"])
    trainings = [{"labelqa_key": r.data.tags.get("intentops.data.labelqa_key"), "start": r.info.start_time,
                  "test_accuracy": r.data.metrics.get("test_accuracy"), "run_id": r.info.run_id} for r in found]
    return review.accuracy_after_rounds(published, trainings)


def check(cfg: PipelineConfig, result: stage.StageResult) -> str:
    """Raise QAGateFailed with a readable reason when the published result failed its gate;
    otherwise say where the report, the queue and the curated set are."""
    m = json.loads((Path(result.path) / "metrics.json").read_text())
    if not m["gate"]["passed"]:
        raise QAGateFailed(describe_failure(m["gate"], result.path))
    return (f"label QA passed: report, relabel queue and curated set in {result.path}; "
            f"MLflow data-quality run {result.manifest['stats'].get('mlflow_run_id')}")
