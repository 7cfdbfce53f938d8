"""The registration stage: behavioural checks (``training.behaviour``) on the dataset's own
val messages and the user's probes, then the registry gate (``training.registry``).
Published as a stage keyed by the training output, so a rerun for the same training run
returns the same decision and never adds a version. The DAG runs it in the one-slot pool
``intentops_registry`` (and the gate takes a file lock). A model that is not registered
(a check failed, or it did not beat the champion) is the stage's verdict: ``check`` raises
``StageVerdict`` with the reason, so the run does not end green without a model."""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

import pandas as pd

from core import audit, stage, stages, tracking
from core.config import PipelineConfig
from training import behaviour, registry
from training.predictor import Predictor

log = logging.getLogger(__name__)
REGISTER = "register"
TRAIN = "train"


def load_probes(cfg: PipelineConfig) -> list[tuple[str, str]] | None:
    """The configured minimum-functionality probes; None when ``training.probes_file`` is empty."""
    f = cfg.training.probes_file.strip()
    return behaviour.load_probes(cfg.resolve_path(f)) if f else None


def _probes_digest(cfg: PipelineConfig) -> str | None:
    """Content hash of the probes file for the stage key (an edited file is a new decision)."""
    f = cfg.training.probes_file.strip()
    if not f:
        return None
    try:
        return hashlib.sha256(cfg.resolve_path(f).read_bytes()).hexdigest()
    except OSError:
        return "unreadable"  # load_probes raises with the reason


def run(cfg: PipelineConfig, run_id: str) -> stage.StageResult:
    tr = stage.upstream(cfg.lake, run_id, TRAIN)
    qa = stage.upstream(cfg.lake, run_id, "labelqa")
    t = cfg.training
    inputs = {"train": {"key": tr.manifest["key"]}}
    stage_cfg = {"model": t.registered_model, "metric": t.metric, "margin": t.margin,
                 "min_invariance": t.min_invariance, "min_functionality": t.min_functionality,
                 "behaviour_sample": t.behaviour_sample, "min_placeholder_share": t.min_placeholder_share,
                 "probes_file": t.probes_file, "probes_sha256": _probes_digest(cfg),
                 "max_oos_recall_drop": cfg.oos.max_recall_drop}
    code = stages.code_version(REGISTER)

    def work(out: Path) -> dict[str, Any]:
        stats = tr.manifest["stats"]
        probes = load_probes(cfg)  # a malformed file fails here, before the model loads
        predictor = Predictor(Path(tr.path) / "model")
        if probes:
            behaviour.check_probe_labels(probes, predictor.labels, t.probes_file)
        # Invariances on the val split (test stays for the metric); whether the placeholder
        # invariance applies is decided by the train split the model learned from.
        cur = pd.read_parquet(Path(qa.path) / "curated", columns=["text", "split"])
        checks = behaviour.check_dataset(
            predictor.labels_of, cur, predictor.labels, probes=probes, sample=t.behaviour_sample,
            min_placeholder_share=t.min_placeholder_share, min_invariance=t.min_invariance,
            min_functionality=t.min_functionality)
        for s in checks["skipped"]:
            log.info("behavioural check %s %s", s["name"], s["note"])
        (out / "behaviour.json").write_text(json.dumps(checks, indent=2))
        client = tracking.mlflow_client(cfg)
        rid = stats["mlflow_run_id"]
        for c in checks["checks"]:
            client.log_metric(rid, f"check_{c['name']}", c["rate"])
        client.log_artifact(rid, str(out / "behaviour.json"))
        metrics = {k: stats[k] for k in ("test_accuracy", "test_macro_f1", "test_in_scope_accuracy",
                                         registry.OOS_METRIC) if stats.get(k) is not None}
        decision = registry.register_if_better(
            client, t.registered_model, stats["model_uri"], rid,
            fingerprint=f"{tr.manifest['key']}:{rid}", metrics=metrics, checks=checks,
            metric=t.metric, margin=t.margin, lock_path=cfg.lake / ".registry.lock",
            labels=predictor.labels, tracking_uri=tracking.tracking_uri(cfg),
            max_oos_recall_drop=cfg.oos.max_recall_drop)
        (out / "decision.json").write_text(json.dumps(decision, indent=2))
        audit.record("registration", f"{t.registered_model} (training run {rid})",
                     f"registered v{decision['version']}" if decision["registered"] else "rejected",
                     decision["reason"])
        log.info("registration: %s", decision["reason"])
        return {"rows_in": None, "kept": None, **decision, "checks_passed": checks["passed"],
                "checks_skipped": [f"{s['name']}: {s['note']}" for s in checks["skipped"]]}

    return stage.run_stage(REGISTER, cfg.lake, inputs, stage_cfg, code, work, run_id)


def check(cfg: PipelineConfig, result: stage.StageResult) -> str:
    """One line when the model was registered; else ``StageVerdict`` with the reason."""
    s = result.manifest["stats"]
    skipped = s.get("checks_skipped") or []
    note = f" (checks skipped: {'; '.join(skipped)})" if skipped else ""
    if s["registered"]:
        return f"registered {s['version']} as challenger: {s['reason']}{note}"
    raise stage.StageVerdict(
        f"model not registered (training run tagged rejected): {s['reason']}{note}; "
        f"checks and decision in {result.path}")
