"""The Alertmanager receiver: every alert lands in the audit log, and chosen alerts
trigger an Airflow DAG.

    python -m ops.monitoring.receiver [--host 127.0.0.1] [--port 9095]

Alertmanager posts its webhook payload (version 4) to ``POST /alerts``; each alert in it,
firing or resolved, becomes one audit record (action ``alert``, actor ``alertmanager``,
target the alert name and its instance or run, outcome ``firing``/``resolved``, reason
the summary and the runbook line). ``GET /alerts`` lists the last alerts received (for
people and tests). ``INTENTOPS_ALERT_DAG_TRIGGERS`` maps alert names to DAG ids (JSON, e.g.
``{"IntentopsChampionTooOld": "intentops_pipeline"}``): a firing alert of that name
triggers the DAG through Airflow's REST API (``INTENTOPS_AIRFLOW_URL``, user
``INTENTOPS_AIRFLOW_USER``, password from ``INTENTOPS_AIRFLOW_PASSWORD_FILE``, the JSON
file Airflow's simple auth manager writes), with the alert in the run's conf, once per
alert fingerprint and firing. The trigger itself is audited by the Airflow client
(``dag.trigger``). An alert whose record cannot be written answers 503, so Alertmanager
sends it again.

Written by hand: a webhook that writes to this project's audit log and calls its Airflow
client is a few lines; no receiver package installs here.
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
from pathlib import Path
from typing import Any

from fastapi import FastAPI, HTTPException, Request

log = logging.getLogger("intentops.alerts")


def _target(labels: dict[str, str]) -> str:
    where = labels.get("instance") or labels.get("run") or labels.get("run_id") or labels.get("registered_model")
    return labels.get("alertname", "?") + (f" {where}" if where else "")


def create_app(triggers: dict[str, str] | None = None) -> FastAPI:
    from core import audit

    triggers = triggers if triggers is not None else json.loads(os.environ.get("INTENTOPS_ALERT_DAG_TRIGGERS") or "{}")
    recent: collections.deque[dict[str, Any]] = collections.deque(maxlen=500)
    triggered: set[str] = set()
    app = FastAPI(title="intentops alert receiver")

    def trigger(alert: dict[str, Any], dag_id: str) -> str:
        from ops.airflow_api import AirflowApi

        pw_file = os.environ.get("INTENTOPS_AIRFLOW_PASSWORD_FILE", "")
        user = os.environ.get("INTENTOPS_AIRFLOW_USER", "admin")
        password = json.loads(Path(pw_file).read_text())[user] if pw_file else os.environ["INTENTOPS_AIRFLOW_PASSWORD"]
        api = AirflowApi(os.environ["INTENTOPS_AIRFLOW_URL"], user, password, timeout=30)
        conf = {"trigger_alert": {"alertname": alert["labels"].get("alertname"), "startsAt": alert.get("startsAt")}}
        return api.trigger(conf, dag_id=dag_id)

    @app.post("/alerts")
    async def alerts(request: Request) -> dict[str, Any]:
        try:
            payload = await request.json()
            items = list(payload["alerts"])
        except (ValueError, KeyError, TypeError):
            raise HTTPException(422, "not an Alertmanager webhook payload") from None
        try:
            audit.check_writable()
        except audit.AuditError as exc:
            log.error("%s", exc)
            raise HTTPException(503, "the audit log cannot be written") from None
        done = []
        for a in items:
            labels, notes = a.get("labels") or {}, a.get("annotations") or {}
            status = a.get("status", payload.get("status", "firing"))
            reason = "; ".join(x for x in (notes.get("summary"), f"runbook: {notes['runbook']}"
                                           if notes.get("runbook") else None) if x)
            audit.record("alert", _target(labels), status, reason, actor_="alertmanager")
            entry = {"status": status, "labels": labels, "annotations": notes, "startsAt": a.get("startsAt"),
                     "fingerprint": a.get("fingerprint")}
            dag = triggers.get(labels.get("alertname", ""))
            key = f"{a.get('fingerprint')}@{a.get('startsAt')}"
            if dag and status == "firing" and key not in triggered:
                triggered.add(key)
                try:
                    entry["triggered_run"] = trigger(a, dag)
                except Exception as exc:  # the alert is recorded either way
                    entry["trigger_error"] = f"{type(exc).__name__}: {exc}"[:300]
                    log.error("alert %s: triggering %s failed: %s", _target(labels), dag, exc)
            recent.append(entry)
            done.append(_target(labels))
            log.info("alert %s %s", status, _target(labels))
        return {"recorded": done}

    @app.get("/alerts")
    async def listed() -> dict[str, Any]:
        return {"alerts": list(recent)}

    @app.get("/health/ready")
    async def ready() -> dict[str, str]:
        return {"status": "ready"}

    return app


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=9095)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    uvicorn.run(create_app(), host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
