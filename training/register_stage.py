"""The registration stage: behavioural checks on the test split, then the registry gate
(``training.registry``). Published as a stage keyed by the training output, so a rerun for
the same training run returns the same decision and never adds a version. The DAG runs it
in the one-slot pool ``intentops_registry`` (and the gate takes a file lock)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pandas as pd

from core import stage, stages, tracking
from core.config import PipelineConfig
from training import behaviour, registry
from training.predictor import Predictor

log = logging.getLogger(__name__)
REGISTER = "register"
TRAIN = "train"


def run(cfg: PipelineConfig, run_id: str) -> stage.StageResult:
    tr = stage.upstream(cfg.lake, run_id, TRAIN)
    qa = stage.upstream(cfg.lake, run_id, "labelqa")
    t = cfg.training
    inputs = {"train": {"key": tr.manifest["key"]}}
    stage_cfg = {"model": t.registered_model, "metric": t.metric, "margin": t.margin,
                 "min_invariance": t.min_invariance, "min_functionality": t.min_functionality,
                 "behaviour_sample": t.behaviour_sample}
    code = stages.code_version(REGISTER)

    def work(out: Path) -> dict[str, Any]:
        stats = tr.manifest["stats"]
        predictor = Predictor(Path(tr.path) / "model")
        cur = pd.read_parquet(Path(qa.path) / "curated", columns=["text", "split"])
        test = cur[cur.split == "test"].text
        sample = test.sample(min(len(test), t.behaviour_sample), random_state=0).tolist()
        checks = behaviour.run_checks(predictor.labels_of, sample, predictor.labels,
                                      t.min_invariance, t.min_functionality)
        (out / "behaviour.json").write_text(json.dumps(checks, indent=2))
        client = tracking.mlflow_client(cfg)
        rid = stats["mlflow_run_id"]
        for c in checks["checks"]:
            client.log_metric(rid, f"check_{c['name']}", c["rate"])
        client.log_artifact(rid, str(out / "behaviour.json"))
        metrics = {k: stats[k] for k in ("test_accuracy", "test_macro_f1") if stats.get(k) is not None}
        decision = registry.register_if_better(
            client, t.registered_model, stats["model_uri"], rid,
            fingerprint=f"{tr.manifest['key']}:{rid}", metrics=metrics, checks=checks,
            metric=t.metric, margin=t.margin, lock_path=cfg.lake / ".registry.lock",
            labels=predictor.labels)
        (out / "decision.json").write_text(json.dumps(decision, indent=2))
        log.info("registration: %s", decision["reason"])
        return {"rows_in": None, "kept": None, **decision, "checks_passed": checks["passed"]}

    return stage.run_stage(REGISTER, cfg.lake, inputs, stage_cfg, code, work, run_id)


def check(cfg: PipelineConfig, result: stage.StageResult) -> str:
    s = result.manifest["stats"]
    if s["registered"]:
        return f"registered {s['version']} as challenger: {s['reason']}"
    return f"not registered (run tagged rejected): {s['reason']}"
