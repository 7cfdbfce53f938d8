"""A small client of Airflow's REST API v2, as a user scripts it: a JWT from
``POST /auth/token`` (simple auth manager), then the public API. Used by the services
test and the whole-run benchmark; the official ``apache-airflow-client`` would do too, but
its generated models add little for the four calls needed here."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx

DAG = "intentops_pipeline"
ENDED = ("success", "failed")


def _epoch(iso: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


class AirflowApi:
    def __init__(self, url: str, username: str, password: str, timeout: float = 60) -> None:
        tok = httpx.post(f"{url}/auth/token", json={"username": username, "password": password}, timeout=timeout)
        if tok.status_code >= 300:
            raise RuntimeError(f"POST {url}/auth/token: {tok.status_code} {tok.text[:300]}")
        self.http = httpx.Client(base_url=f"{url}/api/v2", timeout=timeout,
                                 headers={"Authorization": f"Bearer {tok.json()['access_token']}"})

    def __call__(self, method: str, path: str, retries: int = 10, **kw: Any) -> dict[str, Any]:
        r = self.http.request(method, path, **kw)
        # 503 is Airflow's "try again": on SQLite (standalone) creating a backfill while the
        # scheduler writes answers "Database is locked".
        for attempt in range(retries):
            if r.status_code != 503:
                break
            time.sleep(min(2 + 2 * attempt, 10))
            r = self.http.request(method, path, **kw)
        if r.status_code >= 300:
            raise RuntimeError(f"{method} {path}: {r.status_code} {r.text[:800]}")
        return r.json()

    def wait_dag(self, dag_id: str = DAG, timeout: float = 180) -> None:
        """Until the dag-processor has parsed the DAG."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.http.get(f"/dags/{dag_id}").status_code == 200:
                return
            time.sleep(2)
        raise TimeoutError(f"{dag_id} did not show up in the API within {timeout:.0f}s")

    def unpause_without_the_scheduled_run(self, dag_id: str = DAG, timeout: float = 120) -> list[str]:
        """Unpause the DAG and mark failed the scheduled run the scheduler then creates for
        its latest interval (a test's or benchmark's own trigger is the run it measures;
        with max_active_runs=1 the scheduled one would go first). The failed run ids."""
        self("PATCH", f"/dags/{dag_id}", json={"is_paused": False})
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            runs = self("GET", f"/dags/{dag_id}/dagRuns", params={"run_type": "scheduled"})["dag_runs"]
            if runs:
                for r in runs:
                    self("PATCH", f"/dags/{dag_id}/dagRuns/{r['dag_run_id']}", json={"state": "failed"})
                return [r["dag_run_id"] for r in runs]
            time.sleep(2)
        return []

    def trigger(self, conf: dict[str, Any], dag_id: str = DAG) -> str:
        from core import audit

        audit.check_writable()
        run_id = self("POST", f"/dags/{dag_id}/dagRuns", json={"logical_date": None, "conf": conf})["dag_run_id"]
        audit.record("dag.trigger", f"{dag_id}/{run_id}", "triggered", json.dumps(conf, sort_keys=True)[:500])
        return run_id

    def create_backfill(self, body: dict[str, Any], retries: int = 10) -> dict[str, Any]:
        """``POST /backfills``, safe to retry on SQLite's "database is locked" (answered 503,
        or 500 with the reason "Database error" and the statement hidden).

        Airflow commits the backfill row before it creates its runs; when a lock then answers
        503, its clean-up of that row is best-effort (and takes the same lock), so the retry
        can meet 409 "already a running backfill" from its own orphan. The orphan has no runs
        (their transaction was rolled back), so it is cancelled and the creation retried. An
        active backfill that predates this call is a real conflict and is reported."""
        started = time.time()
        locked = False
        for attempt in range(retries + 1):
            r = self.http.post("/backfills", json=body)
            if r.status_code < 300:
                return r.json()
            if r.status_code == 503 or (r.status_code == 500 and "Database error" in r.text):
                locked = True  # the lock, as 503 or (seen 2026-12-06) as a 500 "Database error"
            elif r.status_code == 409 and locked:
                orphans = [b for b in self("GET", "/backfills", params={"dag_id": body["dag_id"], "limit": 100})["backfills"]
                           if b["completed_at"] is None and _epoch(b["created_at"]) >= started - 1]
                if not orphans:
                    break
                for b in orphans:
                    self.http.put(f"/backfills/{b['id']}/cancel")  # 409 if the scheduler closed it first
            else:
                break
            time.sleep(min(2 + 2 * attempt, 10))
        raise RuntimeError(f"POST /backfills: {r.status_code} {r.text[:800]}")

    def wait_runs(self, run_ids: list[str], dag_id: str = DAG, timeout: float = 1800,
                  poll: float = 5) -> dict[str, dict[str, Any]]:
        deadline = time.monotonic() + timeout
        runs: dict[str, dict[str, Any]] = {}
        while time.monotonic() < deadline:
            runs = {r: self("GET", f"/dags/{dag_id}/dagRuns/{r}") for r in run_ids}
            if all(r["state"] in ENDED for r in runs.values()):
                return runs
            time.sleep(poll)
        raise TimeoutError(f"runs not finished after {timeout:.0f}s: { {r: v['state'] for r, v in runs.items()} }")

    def task_instances(self, run_id: str, dag_id: str = DAG) -> dict[str, dict[str, Any]]:
        tis = self("GET", f"/dags/{dag_id}/dagRuns/{run_id}/taskInstances")["task_instances"]
        return {t["task_id"]: t for t in tis}

    def task_states(self, run_id: str, dag_id: str = DAG) -> dict[str, str]:
        return {k: v["state"] for k, v in self.task_instances(run_id, dag_id).items()}
