"""
### intentops monitoring: served traffic against the champion's training data

Hourly. `check` reads the prediction log's last `monitoring.window_hours` (the window
ends at the run's data interval end) and compares it with the curated training split
the champion was trained on (`ops/monitor.py`): a domain classifier on MiniLM sentence
embeddings, predicted-label shares, confidence and out-of-scope rate against the same
version's earlier traffic, and live accuracy where feedback exists. Figures go to
`<lake>/<dataset>/monitoring/<check>/check.json`, to the MLflow experiment
`intentops-<dataset>-monitoring` and to the Pushgateway (the `IntentopsDriftDetected`
alert). A window with fewer than `monitoring.min_predictions` predictions says "too
little traffic" and emits nothing.

Then one task per Airflow Asset, each skipped when its condition does not hold (a skipped
task emits no event):

| task | asset | when | event extra |
|---|---|---|---|
| `emit_drift` | `intentops_drift_detected` | the check found drift | figures, reasons, window, sample path |
| `emit_new_labels` | `intentops_new_labels` | `monitoring.min_new_labels` feedback labels since the last event | count, window, log path |
| `emit_review` | `intentops_review_traffic` | `monitoring.min_review_rows` unlabeled out-of-scope predictions | count, window, log path |

The pipeline DAG `intentops_pipeline` runs on drift **or** new labels (or its daily
time); review traffic is for people (the review queue), not a retraining trigger.

**Trigger** by hand: `airflow dags trigger intentops_monitoring`; the settings come from
the config (`configs/pipeline.yaml`, `INTENTOPS__MONITORING__...`).
"""

from __future__ import annotations

from datetime import timedelta

import pendulum
from airflow.sdk import Asset, dag, task

from core import assets

DRIFT = Asset(name=assets.DRIFT[0], uri=assets.DRIFT[1])
NEW_LABELS = Asset(name=assets.NEW_LABELS[0], uri=assets.NEW_LABELS[1])
REVIEW = Asset(name=assets.REVIEW[0], uri=assets.REVIEW[1])

default_args = {
    "owner": "intentops",
    "retries": 2,
    "retry_delay": timedelta(seconds=30),
    "retry_exponential_backoff": True,
    "max_retry_delay": timedelta(minutes=5),
    "execution_timeout": timedelta(minutes=30),
}


def _check_result(path: str) -> dict:
    import json
    from pathlib import Path

    return json.loads(Path(path).read_text())


@dag(
    dag_id="intentops_monitoring",
    doc_md=__doc__,
    schedule="@hourly",
    start_date=pendulum.datetime(2026, 11, 1, tz="UTC"),
    catchup=False,
    # Each check reads the log up to its own time; two at once would only repeat work.
    max_active_runs=1,
    default_args=default_args,
    dagrun_timeout=timedelta(hours=1),
    tags=["intentops", "monitoring"],
)
def intentops_monitoring():
    @task
    def check(run_id: str, data_interval_end=None) -> str:
        """One monitoring check of the window ending at the run's data interval end."""
        from core.config import load_config
        from ops import monitor

        cfg = load_config()
        end = data_interval_end.timestamp() if data_interval_end is not None else None
        result = monitor.check(cfg, end=end, check_id=run_id)
        print(f"monitoring: {result['status']}: {result.get('note') or '; '.join(result['reasons']) or 'no test shifted'}"
              f"; {result['path']}")
        return result["path"]

    @task(outlets=[DRIFT])
    def emit_drift(path: str, outlet_events=None) -> None:
        from airflow.sdk.exceptions import AirflowSkipException

        from ops import monitor

        r = _check_result(path)
        if not r["drift"]:
            raise AirflowSkipException(f"no drift event: {r['status']}")
        outlet_events[DRIFT].extra = {
            "reason": "drift", "check": r["check_id"], "reasons": r["reasons"],
            "figures": monitor.figures(r), "window": r["window"], "sample": r["sample"],
            "reference": r.get("reference", {}).get("what"), "report": r["path"]}

    @task(outlets=[NEW_LABELS])
    def emit_new_labels(path: str, outlet_events=None) -> None:
        from airflow.sdk.exceptions import AirflowSkipException

        from core.config import load_config
        from ops import monitor

        r = _check_result(path)
        p = (r.get("pending") or {}).get("new_labels")
        if not p or not p["enough"]:
            raise AirflowSkipException(f"no new-labels event: {p['count'] if p else 0} feedback labels "
                                       f"since the last one ({p['needed'] if p else '-'} needed)")
        outlet_events[NEW_LABELS].extra = {
            "reason": "new_labels", "check": r["check_id"], "feedback_labels": p["count"],
            "since": p["since"], "until": r["window"]["end"], "log": str(monitor.log_path(load_config()))}
        monitor.mark_emitted(load_config(), "new_labels", r["window"]["end"])

    @task(outlets=[REVIEW])
    def emit_review(path: str, outlet_events=None) -> None:
        from airflow.sdk.exceptions import AirflowSkipException

        from core.config import load_config
        from ops import monitor

        r = _check_result(path)
        p = (r.get("pending") or {}).get("review")
        if not p or not p["enough"]:
            raise AirflowSkipException(f"no review event: {p['count'] if p else 0} unlabeled out-of-scope "
                                       f"predictions since the last one ({p['needed'] if p else '-'} needed)")
        outlet_events[REVIEW].extra = {
            "reason": "review", "check": r["check_id"], "rows": p["count"], "since": p["since"],
            "until": r["window"]["end"], "log": str(monitor.log_path(load_config()))}
        monitor.mark_emitted(load_config(), "review", r["window"]["end"])

    result = check()
    emit_drift(result)
    emit_new_labels(result)
    emit_review(result)


intentops_monitoring()
