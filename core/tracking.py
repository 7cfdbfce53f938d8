"""MLflow plumbing shared by the stages that log to it.

The tracking URI is ``MLFLOW_TRACKING_URI`` when set, else ``tracking.uri`` from the
config, else a local SQLite store under ``var/mlflow`` (what ``make mlflow`` serves with
the UI). Runs are found again by a tag holding the stage's content key, so a retried or
re-run task updates the run it already made instead of adding a second one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from core.config import PipelineConfig

STAGE_KEY_TAG = "intentops.stage_key"


def tracking_uri(cfg: PipelineConfig) -> str:
    uri = os.environ.get("MLFLOW_TRACKING_URI") or cfg.tracking.uri
    if uri:
        return uri
    root = cfg.resolve_path("var/mlflow")
    Path(root).mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{Path(root) / 'mlflow.db'}"


def mlflow_client(cfg: PipelineConfig):
    from mlflow.tracking import MlflowClient

    return MlflowClient(tracking_uri=tracking_uri(cfg))


def experiment_id(cfg: PipelineConfig, name: str) -> str:
    client = mlflow_client(cfg)
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    uri = tracking_uri(cfg)
    kwargs: dict[str, Any] = {}
    if uri.startswith("sqlite:"):
        # A local store keeps its artifacts beside the database, not in the working dir.
        kwargs["artifact_location"] = (Path(uri.removeprefix("sqlite:///")).parent / "artifacts").as_uri()
    try:
        return client.create_experiment(name, **kwargs)
    except Exception:  # created concurrently by another task
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


def find_or_create_run(cfg: PipelineConfig, experiment: str, stage_key: str, run_name: str,
                       tags: dict[str, str] | None = None) -> str:
    """The MLflow run of this stage output (found by its content key), created if absent."""
    client = mlflow_client(cfg)
    exp_id = experiment_id(cfg, experiment)
    found = client.search_runs([exp_id], filter_string=f"tags.`{STAGE_KEY_TAG}` = '{stage_key}'",
                               max_results=1)
    if found:
        return found[0].info.run_id
    run = client.create_run(exp_id, run_name=run_name, tags={STAGE_KEY_TAG: stage_key, **(tags or {})})
    return run.info.run_id


def log_stage_run(
    cfg: PipelineConfig,
    experiment: str,
    stage_key: str,
    run_name: str,
    params: dict[str, Any],
    metrics: dict[str, float],
    tags: dict[str, str],
    artifacts: list[Path],
) -> dict[str, str]:
    """Create (or find again by ``stage_key``) an MLflow run and log into it."""
    import time

    from mlflow.entities import Metric, Param, RunTag

    client = mlflow_client(cfg)
    rid = find_or_create_run(cfg, experiment, stage_key, run_name)
    run = client.get_run(rid)
    now = int(time.time() * 1000)
    existing = set(run.data.params)
    client.log_batch(
        rid,
        metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items() if v is not None],
        params=[Param(k, str(v)[:6000]) for k, v in params.items() if k not in existing],
        tags=[RunTag(k, str(v)) for k, v in tags.items()],
    )
    for path in artifacts:
        client.log_artifact(rid, str(path))
    client.set_terminated(rid, "FINISHED")
    return {"run_id": rid, "experiment_id": run.info.experiment_id, "experiment": experiment}
