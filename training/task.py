"""The training and registration stages as the DAG runs them.

``train``: resolves the curated split of the run's label-QA output, creates (or finds
again, by the stage key) the MLflow run with the lineage tags, and launches
``torchrun ... -m training.train`` as a real process group. Checkpoints live in a work
folder keyed like the stage (``<lake>/train/.work-<key>``) that survives failed attempts,
so a ``torchrun --max-restarts`` restart or an Airflow retry resumes instead of starting
over. When the group finishes, the model is logged to the run (pyfunc, with signature
and input example) and the outputs are published as the stage's output.

``register``: behavioural checks on the test split, then the registry gate
(``training.registry``). Published as a stage keyed by the training output, so a rerun
for the same training run returns the same decision and never adds a version.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from core import stage, tracking
from core.config import PROJECT_ROOT, PipelineConfig

log = logging.getLogger(__name__)
TRAIN, REGISTER = "train", "register"
TRAINING_SOURCES = ("train.py", "data.py", "models.py", "checkpoint.py", "predictor.py", "task.py")


def _code() -> str:
    here = Path(__file__).parent
    return stage.code_version([here / f for f in TRAINING_SOURCES] + [tracking, stage])


def _lineage(cfg: PipelineConfig, run_id: str) -> dict[str, str]:
    """Tags pointing back to every upstream stage output and the data-quality record."""
    tags = {"intentops.pipeline_run_id": run_id}
    for name in ("clean", "dedup", "desensitize", "validate", "labelqa"):
        with contextlib.suppress(stage.StageError):
            tags[f"intentops.data.{name}_key"] = stage.upstream(cfg.lake, run_id, name).manifest["key"]
    qa = stage.upstream(cfg.lake, run_id, "labelqa")
    tags["intentops.data_quality_run_id"] = str(qa.manifest["stats"].get("mlflow_run_id"))
    fp = stage.file_fingerprint(Path(qa.path) / "curated")
    tags["intentops.data.curated_fingerprint"] = json.dumps(fp, sort_keys=True)[:5000]
    return tags


def torchrun_command(cfg: PipelineConfig, curated: Path, labels: Path, out: Path, config: Path,
                     mlflow_run_id: str) -> list[str]:
    t = cfg.training
    cmd = [str(Path(sys.executable).parent / "torchrun"), "--nnodes", str(t.nnodes),
           "--nproc-per-node", str(t.nproc_per_node), "--max-restarts", str(t.max_restarts)]
    if t.nnodes > 1:
        if not t.rdzv_endpoint:
            raise stage.StageError("training.nnodes > 1 needs training.rdzv_endpoint (host:port)")
        cmd += ["--rdzv-backend", "c10d", "--rdzv-endpoint", t.rdzv_endpoint]
    else:
        cmd += ["--standalone"]
    return cmd + ["-m", "training.train", "--curated", str(curated), "--labels", str(labels),
                  "--out", str(out), "--config", str(config), "--mlflow-run-id", mlflow_run_id]


def _log_model(cfg: PipelineConfig, mlflow_run_id: str, model_dir: Path) -> str:
    """Log the model to its training run as a pyfunc (once: found again by a run tag)."""
    import mlflow
    import pandas as pd
    from mlflow.models import infer_signature

    from training.predictor import IntentClassifierModel, Predictor

    client = tracking.mlflow_client(cfg)
    existing = client.get_run(mlflow_run_id).data.tags.get("intentops.model_uri")
    if existing:
        return existing
    mlflow.set_tracking_uri(tracking.tracking_uri(cfg))
    example = pd.DataFrame({"text": ["I still have not received my new card", "How do I change my PIN?"]})
    labels, scores = Predictor(model_dir).predict(example.text.tolist())
    signature = infer_signature(example, pd.DataFrame({"label": labels, "score": scores}))
    with mlflow.start_run(run_id=mlflow_run_id):
        info = mlflow.pyfunc.log_model(
            name="model",
            python_model=IntentClassifierModel(),
            artifacts={"model_dir": str(model_dir)},
            signature=signature,
            input_example=example,
            code_paths=[str(PROJECT_ROOT / "training")],
        )
    client.set_tag(mlflow_run_id, "intentops.model_uri", info.model_uri)
    return info.model_uri


def train(cfg: PipelineConfig, run_id: str) -> stage.StageResult:
    from training.train import TrainConfig

    qa = stage.upstream(cfg.lake, run_id, "labelqa")
    try:
        hp = TrainConfig(**cfg.training.hparams)
    except Exception as exc:  # pydantic's message names the bad key
        raise stage.StageError(f"training.hparams: {exc}") from exc
    labels_file = cfg.resolve_path(cfg.clean.labels_file)
    t = cfg.training
    inputs = {"labelqa": {"key": qa.manifest["key"]}}
    stage_cfg = {"hparams": hp.model_dump(), "nproc_per_node": t.nproc_per_node, "nnodes": t.nnodes,
                 "labels": Path(labels_file).read_text()}
    code = _code()
    key = stage.stage_key(TRAIN, inputs, stage_cfg, code)
    work_dir = cfg.lake / TRAIN / f".work-{key}"

    def work(out: Path) -> dict[str, Any]:
        work_dir.mkdir(parents=True, exist_ok=True)
        rid = tracking.find_or_create_run(cfg, t.experiment, key, f"train-{stage.safe_run_id(run_id)}",
                                          _lineage(cfg, run_id))
        config_file = work_dir / "hparams.json"
        config_file.write_text(json.dumps(hp.model_dump(), indent=2))
        cmd = torchrun_command(cfg, Path(qa.path) / "curated", Path(labels_file), work_dir,
                               config_file, rid)
        env = dict(os.environ, MLFLOW_TRACKING_URI=tracking.tracking_uri(cfg),
                   PYTHONPATH=os.pathsep.join(filter(None, [str(PROJECT_ROOT), os.environ.get("PYTHONPATH")])))
        log.info("launching: %s", " ".join(cmd))
        proc = subprocess.run(cmd, env=env, cwd=PROJECT_ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
        sys.stdout.write(proc.stdout[-20000:])
        if proc.returncode != 0:
            tail = "\n".join(proc.stdout.strip().splitlines()[-15:])
            raise stage.StageError(f"torchrun exited with {proc.returncode}; last lines:\n{tail}")
        model_uri = _log_model(cfg, rid, work_dir / "model")
        for name in ("model", "metrics.json", "history.jsonl", "confusion_matrix.png",
                     "classification_report.json", "config.json"):
            src = work_dir / name
            if src.is_dir():
                shutil.copytree(src, out / name)
            elif src.exists():
                shutil.copy2(src, out / name)
        m = json.loads((work_dir / "metrics.json").read_text())
        (out / "mlflow.json").write_text(json.dumps({"run_id": rid, "model_uri": model_uri}))
        return {
            "rows_in": None,
            "kept": None,
            "test_rows": m.get("test_rows"),
            "test_accuracy": m.get("test_accuracy"),
            "test_macro_f1": m.get("test_macro_f1"),
            "steps": m.get("steps"),
            "train_samples_per_s": m.get("train_samples_per_s"),
            "world_size": m.get("world_size"),
            "mlflow_run_id": rid,
            "model_uri": model_uri,
        }

    result = stage.run_stage(TRAIN, cfg.lake, inputs, stage_cfg, code, work, run_id)
    if not result.cache_hit:
        shutil.rmtree(work_dir, ignore_errors=True)  # published: checkpoints no longer needed
    return result


def register(cfg: PipelineConfig, run_id: str) -> stage.StageResult:
    import pandas as pd

    from training import behaviour, registry
    from training.predictor import Predictor

    tr = stage.upstream(cfg.lake, run_id, TRAIN)
    qa = stage.upstream(cfg.lake, run_id, "labelqa")
    t = cfg.training
    inputs = {"train": {"key": tr.manifest["key"]}}
    stage_cfg = {"model": t.registered_model, "metric": t.metric, "margin": t.margin,
                 "min_invariance": t.min_invariance, "min_functionality": t.min_functionality,
                 "behaviour_sample": t.behaviour_sample}
    code = stage.code_version([Path(__file__), registry, behaviour, stage])

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
