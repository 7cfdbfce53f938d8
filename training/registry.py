"""Gated, idempotent registration in the MLflow model registry, with an alias history.

* **Gate.** A trained model becomes a new version with the alias ``challenger`` only when
  it passes the behavioural checks and beats the current ``champion`` on the configured
  metric by ``margin`` (or there is no champion yet). Otherwise the training run is
  tagged ``intentops.registration = rejected`` with the reason, and nothing is registered.
* **Idempotent.** Each registered version carries the run fingerprint (training run id +
  data and config fingerprints) as a tag; a retried or re-run task finds that version
  and reuses it instead of creating a second one.
* **Serialized.** The registry numbers versions by reading the highest one, so two
  concurrent writers can collide. Registrations hold an exclusive file lock (one host;
  the DAG additionally runs the task in an Airflow pool of size 1, which covers workers
  on several hosts).
* **Alias history.** Every alias move goes through ``core.tracking.move_alias``, which
  records it as a registered-model tag (see there), so anyone can see which version was
  champion when (MLflow keeps only the current alias target).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.tracking import HISTORY_PREFIX, alias_history, move_alias  # noqa: F401  (re-exported)

FINGERPRINT_TAG = "intentops.run_fingerprint"
REGISTRATION_TAG = "intentops.registration"
REASON_TAG = "intentops.registration_reason"
LABELS_TAG = "intentops.labels_sha256"


@dataclass
class Decision:
    register: bool
    reason: str
    champion_version: str | None
    champion_value: float | None


@contextlib.contextmanager
def registry_lock(path: str | Path) -> Iterator[None]:
    """Exclusive lock around read-highest-version-then-create (see the module docstring)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def labels_digest(labels: list[str]) -> str:
    import hashlib

    return hashlib.sha256(json.dumps(list(labels)).encode()).hexdigest()


def champion_labels(client, name: str) -> str | None:
    from mlflow.exceptions import MlflowException

    try:
        return client.get_model_version_by_alias(name, "champion").tags.get(LABELS_TAG)
    except MlflowException:
        return None


def champion(client, name: str, metric: str) -> tuple[str | None, float | None]:
    """(version, metric value of its training run) of the ``champion`` alias, if any."""
    from mlflow.exceptions import MlflowException

    try:
        mv = client.get_model_version_by_alias(name, "champion")
    except MlflowException:
        return None, None
    value = None
    if mv.run_id:
        value = client.get_run(mv.run_id).data.metrics.get(metric)
    return str(mv.version), value


def decide(metrics: dict[str, float], checks: dict[str, Any], champ_version: str | None,
           champ_value: float | None, metric: str, margin: float) -> Decision:
    failed = [c["name"] for c in checks.get("checks", []) if not c["passed"]]
    if failed:
        return Decision(False, "behavioural checks failed: " + ", ".join(failed), champ_version, champ_value)
    value = metrics.get(metric)
    if value is None:
        return Decision(False, f"the run has no {metric} metric", champ_version, champ_value)
    if champ_version is None:
        return Decision(True, f"no champion yet; {metric} {value:.4f}", None, None)
    if champ_value is None:
        return Decision(True, f"champion v{champ_version} has no {metric}; {metric} {value:.4f}",
                        champ_version, None)
    if value >= champ_value + margin:
        return Decision(True, f"{metric} {value:.4f} beats champion v{champ_version} ({champ_value:.4f}) "
                              f"by at least {margin}", champ_version, champ_value)
    return Decision(False, f"{metric} {value:.4f} does not beat champion v{champ_version} "
                           f"({champ_value:.4f}) by {margin}", champ_version, champ_value)


def find_version(client, name: str, fingerprint: str):
    from mlflow.exceptions import MlflowException

    try:
        versions = client.search_model_versions(f"name='{name}'")
    except MlflowException:
        return None
    for v in versions:
        if v.tags.get(FINGERPRINT_TAG) == fingerprint:
            return v
    return None


def _wait_ready(client, name: str, version: str, timeout: float = 120.0):
    deadline = time.time() + timeout
    while True:
        mv = client.get_model_version(name, version)
        if mv.status == "READY":
            return mv
        if mv.status == "FAILED_REGISTRATION" or time.time() > deadline:
            raise RuntimeError(f"model version {name} v{version} is {mv.status}: {mv.status_message}")
        time.sleep(0.5)


def register_if_better(
    client,
    name: str,
    model_uri: str,
    run_id: str,
    fingerprint: str,
    metrics: dict[str, float],
    checks: dict[str, Any],
    metric: str,
    margin: float,
    lock_path: str | Path,
    labels: list[str] | None = None,
) -> dict[str, Any]:
    """Apply the gate; register (or find again) the version and move ``challenger``.

    Returns {registered, version, reason, champion_version, champion_value}."""
    with registry_lock(lock_path):
        existing = find_version(client, name, fingerprint)
        if existing is not None:
            return {"registered": True, "version": str(existing.version), "reused": True,
                    "reason": existing.tags.get(REASON_TAG, "registered earlier for this run"),
                    "champion_version": None, "champion_value": None}
        champ_version, champ_value = champion(client, name, metric)
        d = decide(metrics, checks, champ_version, champ_value, metric, margin)
        digest = labels_digest(labels) if labels is not None else None
        champ_digest = champion_labels(client, name) if champ_version else None
        if d.register and digest and champ_digest and digest != champ_digest:
            # Metrics over different label sets are not comparable, and serving would
            # return classes clients do not expect: a person decides.
            d = Decision(False, f"the label set differs from champion v{champ_version}'s; "
                                "compare and promote by hand", champ_version, champ_value)
        if not d.register:
            client.set_tag(run_id, REGISTRATION_TAG, "rejected")
            client.set_tag(run_id, REASON_TAG, d.reason)
            return {"registered": False, "version": None, "reused": False, "reason": d.reason,
                    "champion_version": d.champion_version, "champion_value": d.champion_value}
        from mlflow.exceptions import MlflowException

        try:
            client.get_registered_model(name)
        except MlflowException:
            client.create_registered_model(
                name, description="intentops intent classifier (Banking77 demo); aliases: "
                                  "challenger = passed the registration gate, champion = serving")
        source, model_id = model_uri, None
        if model_uri.startswith("models:/m-"):
            # An MLflow 3 logged model: the registry wants its artifact location as the
            # source and its id, not the models:/ URI (a tracking server rejects that).
            model_id = model_uri.removeprefix("models:/")
            source = client.get_logged_model(model_id).artifact_location
        mv = client.create_model_version(
            name, source=source, run_id=run_id, model_id=model_id,
            tags={FINGERPRINT_TAG: fingerprint, REASON_TAG: d.reason,
                  **({LABELS_TAG: digest} if digest else {}),
                  **{f"metric.{k}": f"{v:.6f}" for k, v in metrics.items()}},
        )
        _wait_ready(client, name, mv.version)
        move_alias(client, name, "challenger", mv.version, d.reason)
        client.set_tag(run_id, REGISTRATION_TAG, "registered")
        client.set_tag(run_id, REASON_TAG, d.reason)
        client.set_tag(run_id, "intentops.model_version", str(mv.version))
        return {"registered": True, "version": str(mv.version), "reused": False, "reason": d.reason,
                "champion_version": d.champion_version, "champion_value": d.champion_value}
