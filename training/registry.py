"""Gated, idempotent registration in the MLflow model registry, with an alias history.

* **Gate.** A trained model becomes a new version with the alias ``challenger`` only when
  it passes the behavioural checks and beats the current ``champion`` on the configured
  metric by ``margin`` (or there is no champion yet). Otherwise the training run is
  tagged ``intentops.registration = rejected`` with the reason, and nothing is registered.
* **Label set.** Each version records its label list (tag ``intentops.labels``, or an
  artifact of the run when the list is too long for a tag; plus ``intentops.labels_sha256``).
  A challenger whose label set differs from the champion's is refused here, and the train
  stage refuses such a run before it trains (``champion_label_change``).
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
# The full label list (JSON) on each version; when it does not fit a tag, an artifact of
# the training run whose path the second tag names.
LABEL_LIST_TAG = "intentops.labels"
LABEL_ARTIFACT_TAG = "intentops.labels_artifact"
LABEL_ARTIFACT = "registration/labels.json"
# MLflow 3 accepts 100,000 characters in a model-version tag, earlier versions 5,000:
# what fits in 5,000 is a tag everywhere (Banking77's 77 labels take ~1,900).
MAX_TAG_VALUE = 5000


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


def label_tags(labels: list[str]) -> dict[str, str]:
    """Version tags for a label list: the digest, and the JSON list when it fits a tag."""
    value = json.dumps(list(labels))
    tags = {LABELS_TAG: labels_digest(labels)}
    if len(value) <= MAX_TAG_VALUE:
        tags[LABEL_LIST_TAG] = value
    return tags


def _read_json_artifact(download) -> Any:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        return json.loads(Path(download(tmp)).read_text())


def version_labels(client, mv, tracking_uri: str | None = None) -> list[str] | None:
    """A model version's label list: its ``intentops.labels`` tag, else the artifact the
    ``intentops.labels_artifact`` tag names, else the ``labels.json`` inside its model
    artifacts (versions registered before the list was recorded). None when none is there."""
    import logging

    tags = mv.tags or {}
    if tags.get(LABEL_LIST_TAG):
        return list(json.loads(tags[LABEL_LIST_TAG]))
    attempts = []
    if tags.get(LABEL_ARTIFACT_TAG) and mv.run_id:
        attempts.append(lambda tmp: client.download_artifacts(mv.run_id, tags[LABEL_ARTIFACT_TAG], tmp))

    def from_model(tmp: str) -> str:
        import mlflow.artifacts

        root = client.get_model_version_download_uri(mv.name, mv.version).rstrip("/")
        # The pyfunc model carries the training output folder as artifact "model_dir".
        return mlflow.artifacts.download_artifacts(
            artifact_uri=f"{root}/artifacts/model_dir/labels.json", dst_path=tmp,
            tracking_uri=tracking_uri or client.tracking_uri)

    attempts.append(from_model)
    for attempt in attempts:
        try:
            got = _read_json_artifact(attempt)
        except Exception as exc:  # noqa: BLE001 - any failure means "not there"; fall back
            logging.getLogger(__name__).debug("labels of %s v%s: %s", mv.name, mv.version, exc)
            continue
        if isinstance(got, list) and all(isinstance(x, str) for x in got):
            return got
    return None


def _shown(names: set[str], n: int = 5) -> str:
    items = sorted(names)
    return ", ".join(items[:n]) + (f", ... ({len(items) - n} more)" if len(items) > n else "")


def describe_label_change(old: list[str], new: list[str]) -> str | None:
    """None when the two label sets are equal; else what changed, with the first names."""
    a, b = set(old), set(new)
    if a == b:
        return None
    added, removed = b - a, a - b
    parts = [f"{len(added)} label{'s' * (len(added) != 1)} added" + (f" ({_shown(added)})" if added else ""),
             f"{len(removed)} removed" + (f" ({_shown(removed)})" if removed else "")]
    return f"{', '.join(parts)}; {len(b)} labels now, {len(a)} in the champion"


@dataclass
class LabelChange:
    champion_version: str
    description: str


def champion_label_change(client, name: str, labels: list[str],
                          tracking_uri: str | None = None) -> LabelChange | None:
    """How ``labels`` differ from the label set of ``name``'s champion; None when the model
    has no champion, the sets are equal, or the champion's set is not recorded at all.

    The champion's list comes from :func:`version_labels`; when only its digest is known
    (``intentops.labels_sha256``), a differing digest is reported without names."""
    from mlflow.exceptions import MlflowException

    try:
        mv = client.get_model_version_by_alias(name, "champion")
    except MlflowException:
        return None
    old = version_labels(client, mv, tracking_uri)
    if old is not None:
        desc = describe_label_change(old, list(labels))
        return LabelChange(str(mv.version), desc) if desc else None
    digest = (mv.tags or {}).get(LABELS_TAG)
    if digest and digest not in (labels_digest(labels), labels_digest(sorted(labels))):
        return LabelChange(str(mv.version), f"its label-set digest differs ({len(labels)} labels now; "
                                            "the champion's list is not recorded)")
    return None


OOS_METRIC = "test_oos_recall"


def champion(client, name: str, metric: str) -> tuple[str | None, float | None]:
    """(version, metric value of its training run) of the ``champion`` alias, if any."""
    version, metrics = champion_metrics(client, name)
    return version, metrics.get(metric)


def champion_metrics(client, name: str) -> tuple[str | None, dict[str, float]]:
    """(version, every metric of its training run) of the ``champion`` alias, if any."""
    from mlflow.exceptions import MlflowException

    try:
        mv = client.get_model_version_by_alias(name, "champion")
    except MlflowException:
        return None, {}
    return str(mv.version), dict(client.get_run(mv.run_id).data.metrics) if mv.run_id else {}


def decide(metrics: dict[str, float], checks: dict[str, Any], champ_version: str | None,
           champ_value: float | None, metric: str, margin: float,
           champ_oos_recall: float | None = None, max_oos_recall_drop: float | None = None) -> Decision:
    """Behavioural checks, then out-of-scope recall (when both models have it: the
    challenger may lose at most ``max_oos_recall_drop``), then ``metric`` by ``margin``."""
    failed = [c for c in checks.get("checks", []) if not c["passed"]]
    if failed:
        return Decision(False, "behavioural checks failed: " + ", ".join(
            f"{c['name']} {c['rate']:.3f} < {c['threshold']}" if c.get("rate") is not None
            and c.get("threshold") is not None else c["name"] for c in failed), champ_version, champ_value)
    recall = metrics.get(OOS_METRIC)
    if (max_oos_recall_drop is not None and recall is not None and champ_oos_recall is not None
            and recall < champ_oos_recall - max_oos_recall_drop - 1e-9):
        return Decision(False, f"out-of-scope recall {recall:.4f} is more than {max_oos_recall_drop} "
                               f"below champion v{champ_version}'s ({champ_oos_recall:.4f})",
                        champ_version, champ_value)
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


def _log_labels_artifact(client, run_id: str, labels: list[str]) -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / Path(LABEL_ARTIFACT).name
        path.write_text(json.dumps(list(labels), indent=1))
        client.log_artifact(run_id, str(path), str(Path(LABEL_ARTIFACT).parent))


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
    tracking_uri: str | None = None,
    max_oos_recall_drop: float | None = None,
) -> dict[str, Any]:
    """Apply the gate; register (or find again) the version and move ``challenger``.

    ``labels``: the model's label list, recorded on the version (:func:`label_tags`; an
    artifact of the run when it does not fit a tag) and compared with the champion's.
    Returns {registered, version, reason, champion_version, champion_value}."""
    with registry_lock(lock_path):
        existing = find_version(client, name, fingerprint)
        if existing is not None:
            return {"registered": True, "version": str(existing.version), "reused": True,
                    "reason": existing.tags.get(REASON_TAG, "registered earlier for this run"),
                    "champion_version": None, "champion_value": None}
        champ_version, champ_metrics = champion_metrics(client, name)
        champ_value = champ_metrics.get(metric)
        d = decide(metrics, checks, champ_version, champ_value, metric, margin,
                   champ_metrics.get(OOS_METRIC), max_oos_recall_drop)
        change = (champion_label_change(client, name, labels, tracking_uri)
                  if d.register and labels is not None and champ_version else None)
        if change is not None:
            # Metrics over different label sets are not comparable, and serving would
            # return classes clients do not expect: a person decides.
            d = Decision(False, f"the label set differs from champion v{change.champion_version}'s "
                                f"({change.description}); compare and promote by hand",
                         champ_version, champ_value)
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
                name, description="intentops intent classifier; aliases: "
                                  "challenger = passed the registration gate, champion = serving")
        source, model_id = model_uri, None
        if model_uri.startswith("models:/m-"):
            # An MLflow 3 logged model: the registry wants its artifact location as the
            # source and its id, not the models:/ URI (a tracking server rejects that).
            model_id = model_uri.removeprefix("models:/")
            source = client.get_logged_model(model_id).artifact_location
        tags = {FINGERPRINT_TAG: fingerprint, REASON_TAG: d.reason,
                **{f"metric.{k}": f"{v:.6f}" for k, v in metrics.items()}}
        if labels is not None:
            tags.update(label_tags(labels))
            if LABEL_LIST_TAG not in tags:  # too long for a tag: an artifact of the run
                _log_labels_artifact(client, run_id, labels)
                tags[LABEL_ARTIFACT_TAG] = LABEL_ARTIFACT
        mv = client.create_model_version(name, source=source, run_id=run_id, model_id=model_id, tags=tags)
        _wait_ready(client, name, mv.version)
        move_alias(client, name, "challenger", mv.version, d.reason)
        client.set_tag(run_id, REGISTRATION_TAG, "registered")
        client.set_tag(run_id, REASON_TAG, d.reason)
        client.set_tag(run_id, "intentops.model_version", str(mv.version))
        return {"registered": True, "version": str(mv.version), "reused": False, "reason": d.reason,
                "champion_version": d.champion_version, "champion_value": d.champion_value}
