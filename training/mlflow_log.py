"""Worker-side MLflow logging: rank 0 of a training run logs params, per-step metrics and
the output files into the MLflow run the Airflow task created, every call retried with
exponential backoff (``Tracker``); ``TrackingError`` when the server stays unreachable."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

log = logging.getLogger("intentops.training")

T = TypeVar("T")
# Output files logged as artifacts (under ``training/``) at the end of a run, when present.
ARTIFACTS = ("config.json", "metrics.json", "classification_report.json", "confusion_matrix.png")


class TrackingError(RuntimeError):
    """The MLflow tracking server stayed unreachable through every retry."""


class Tracker:
    """MLflow logging into an existing run, rank 0 only, every call retried.

    Per-step metrics are buffered and flushed right before each checkpoint is written, so
    a resumed run neither loses the steps it keeps nor re-logs many it repeats. MLflow's
    own HTTP retries (up to minutes of backoff by default) are turned down so that this
    class's few exponential-backoff attempts decide when the server counts as down."""

    ATTEMPTS = 5
    BASE_DELAY_S = 1.0

    def __init__(self, run_id: str, uri: str) -> None:
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "30")
        import mlflow
        from mlflow import MlflowClient

        self.run_id = run_id
        self.uri = uri
        self._mlflow = mlflow
        self.client = MlflowClient(tracking_uri=uri)
        self._pending: list[Any] = []
        mlflow.set_tracking_uri(uri)
        self.call("open run", self.client.get_run, run_id)
        # The fluent run drives MLflow's system-metrics thread (CPU, memory, disk, network).
        self.call("start run", mlflow.start_run, run_id=run_id, log_system_metrics=True)

    def call(self, what: str, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        delay = self.BASE_DELAY_S
        for attempt in range(1, self.ATTEMPTS + 1):
            try:
                return fn(*args, **kwargs)
            except Exception as exc:
                if not _transient(exc) or attempt == self.ATTEMPTS:
                    raise TrackingError(
                        f"MLflow tracking server {self.uri}: {what} failed "
                        f"(attempt {attempt}/{self.ATTEMPTS}): {exc}") from exc
                log.warning("MLflow %s failed (%s), retrying in %.0fs", what, exc, delay)
                time.sleep(delay)
                delay *= 2
        raise AssertionError("unreachable")

    def log_params(self, params: Mapping[str, Any]) -> None:
        from mlflow.entities import Param

        logged = self.call("read run", self.client.get_run, self.run_id).data.params
        fresh = [Param(k, str(v)[:6000]) for k, v in params.items() if k not in logged]
        for i in range(0, len(fresh), 100):
            self.call("log params", self.client.log_batch, self.run_id, params=fresh[i:i + 100])

    def metric(self, key: str, value: float, step: int) -> None:
        from mlflow.entities import Metric

        self._pending.append(Metric(key, float(value), int(time.time() * 1000), int(step)))

    def flush(self) -> None:
        while self._pending:
            chunk = self._pending[:1000]
            self.call("log metrics", self.client.log_batch, self.run_id, metrics=chunk)
            del self._pending[:1000]

    def artifact(self, path: Path, artifact_path: str = "training") -> None:
        self.call(f"log artifact {path.name}", self.client.log_artifact, self.run_id, str(path),
                  artifact_path)

    def close(self, status: str = "FINISHED") -> None:
        with contextlib.suppress(Exception):
            self.flush()
        with contextlib.suppress(Exception):
            self._mlflow.end_run(status=status)


def _transient(exc: BaseException) -> bool:
    """Whether retrying can help: everything except a server's definite 4xx answer (a
    missing run, a bad parameter), which no amount of waiting changes. With MLflow's own
    retries off, an unreachable server surfaces as a plain MlflowException or a requests
    error, both retried."""
    from mlflow.exceptions import RestException

    if isinstance(exc, RestException):
        code = int(exc.get_http_status_code())
        return code >= 500 or code == 429
    return isinstance(exc, Exception)


def open_tracker(run_id: str, params: Mapping[str, Any]) -> Tracker:
    """A ``Tracker`` on ``MLFLOW_TRACKING_URI`` with the run's params logged (those not
    logged yet: a resumed attempt adds nothing)."""
    uri = os.environ.get("MLFLOW_TRACKING_URI")
    if not uri:
        raise TrackingError("--mlflow-run-id needs MLFLOW_TRACKING_URI in the environment")
    tracker = Tracker(run_id, uri)
    tracker.log_params(params)
    return tracker


def log_outputs(tracker: Tracker, test: Mapping[str, Any] | None, step: int, out: Path) -> None:
    """The test metrics, the remaining buffered metrics and the output files."""
    if test is not None:
        tracker.metric("test_accuracy", test["accuracy"], step)
        tracker.metric("test_macro_f1", test["macro_f1"], step)
    tracker.flush()
    for name in ARTIFACTS:
        if (out / name).exists():
            tracker.artifact(out / name)
