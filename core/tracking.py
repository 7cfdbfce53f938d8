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
HISTORY_PREFIX = "intentops.alias_history."


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


def actor() -> str:
    """Who acts, for the alias history: ``INTENTOPS_ACTOR`` when the caller set it (the
    DAG's tasks: ``airflow:<dag>/<run id>``), else ``user:<login name>``."""
    from core import audit

    return audit.actor()


def move_alias(client, name: str, alias: str, version: str | None, reason: str,
               by: str | None = None) -> None:
    """Point ``alias`` at ``version`` (``None`` removes it) and record the move: the one way
    the project moves an alias (registration, promotion, rollback, manual moves), so the
    history is complete. A move to where the alias already points records nothing.

    The record is a registered-model tag ``intentops.alias_history.<ms>.<alias>`` = JSON
    {alias, version, previous, reason, by, at}."""
    import json
    import time

    from mlflow.exceptions import MlflowException

    try:
        previous = str(client.get_model_version_by_alias(name, alias).version)
    except MlflowException:
        previous = None
    if previous == (None if version is None else str(version)):
        return
    from core import audit

    audit.check_writable()  # an alias move that cannot be recorded does not happen
    if version is None:
        client.delete_registered_model_alias(name, alias)
    else:
        client.set_registered_model_alias(name, alias, str(version))
    now = time.time()
    entry = {"alias": alias, "version": None if version is None else str(version),
             "previous": previous, "reason": reason, "by": by or actor(),
             "at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now))}
    client.set_registered_model_tag(name, f"{HISTORY_PREFIX}{int(now * 1000):013d}.{alias}",
                                    json.dumps(entry))
    audit.record("alias.move", f"{name}@{alias}", "removed" if version is None else f"v{version}",
                 f"{reason} (was {'v' + previous if previous else 'unset'})", actor_=entry["by"])


def alias_history(client, name: str) -> list[dict[str, Any]]:
    """Every recorded alias move of the registered model, oldest first."""
    import json

    rm = client.get_registered_model(name)
    items = sorted((k, v) for k, v in rm.tags.items() if k.startswith(HISTORY_PREFIX))
    return [json.loads(v) for _, v in items]
