"""Airflow plugin: the intentops run report in the Airflow UI.

* A FastAPI app mounted by the API server under ``/intentops``:

  - ``GET /intentops/runs/{run_id}/report``: the run's report
    (``<lake_root>/<dataset>/runs/<run_id>/report.html``, written by the DAG's ``report`` task);
  - ``GET /intentops/runs/{run_id}/files/{stage}/{path}``: the stage files the report
    links (Data Docs, the label-QA report, ...), read-only from the output the run used.
    Only the files in ``ops.report.SERVED_FILES`` are served: nothing of the raw
    zone (clean, dedup), no path outside a stage's output.

  Both need read access to the DAG's runs, checked by Airflow's auth manager (the UI's
  session cookie or a bearer token), like the API's own endpoints.
* A "Run report" tab on each DAG run's page (an external view, ``destination`` dag_run)
  that shows the report inside the Airflow UI.

The lake is the configured root (``lake_root`` in ``configs/pipeline.yaml``,
``INTENTOPS__LAKE_ROOT``); a run is found in whichever dataset's folder holds it.
Enable with ``AIRFLOW__CORE__PLUGINS_FOLDER=<project>/plugins`` (the Makefile sets it);
``airflow plugins`` lists it.
"""

from __future__ import annotations

import mimetypes
from collections.abc import Callable
from pathlib import Path, PurePosixPath

from airflow.plugins_manager import AirflowPlugin
from fastapi import Depends, FastAPI, HTTPException, Request
from fastapi.responses import FileResponse, HTMLResponse

DAG_ID = "intentops_pipeline"
URL_PREFIX = "/intentops"
# The report is self-contained: nothing to load from anywhere but itself.
REPORT_CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; frame-ancestors 'self'"
TEXT_TYPES = {".md": "text/plain", ".jsonl": "text/plain", ".csv": "text/plain"}


async def require_run_access(request: Request) -> None:
    """Airflow's check for reading the DAG's runs (401 without a session, 403 without
    the permission). Imported on use: the auth manager lives in the API server only."""
    from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
    from airflow.api_fastapi.core_api import security
    from starlette.concurrency import run_in_threadpool

    creds = await security.bearer_scheme(request)
    user = await security.get_user(request, None, creds)
    check = security.requires_access_dag("GET", DagAccessEntity.RUN, param_dag_id=DAG_ID)
    await run_in_threadpool(check, request, user)


def _configured_lake() -> Path:
    """The lake root: every dataset's runs are under it (<lake_root>/<dataset>/runs/)."""
    from core.config import load_config

    cfg = load_config()
    return cfg.resolve_path(cfg.lake_root)


def create_app(lake: Path | Callable[[], Path] = _configured_lake) -> FastAPI:
    from core import stage
    from ops.report import REPORT_FILE, servable

    lake_of = lake if callable(lake) else (lambda: lake)
    app = FastAPI(title="intentops run reports", docs_url=None, redoc_url=None, openapi_url=None,
                  dependencies=[Depends(require_run_access)])

    def dataset_lake(run_id: str) -> Path:
        """The dataset lake holding the run: the given folder itself (one dataset's lake) or
        one of its dataset folders (the lake root)."""
        root, safe = lake_of(), stage.safe_run_id(run_id)
        if safe in ("", ".", ".."):
            raise HTTPException(404, f"no run {run_id!r} in the lake")
        datasets = sorted(p for p in root.iterdir() if p.is_dir()) if root.is_dir() else []
        for lake in (root, *datasets):
            if (lake / "runs" / safe).is_dir():
                return lake
        raise HTTPException(404, f"no run {run_id!r} in the lake")

    def run_folder(run_id: str) -> Path:
        return dataset_lake(run_id) / "runs" / stage.safe_run_id(run_id)

    @app.get("/runs/{run_id}/report", response_class=HTMLResponse)
    def report(run_id: str) -> FileResponse:
        page = run_folder(run_id) / REPORT_FILE
        if not page.is_file():
            raise HTTPException(404, f"run {run_id!r} has no report yet (the DAG's report task writes it)")
        return FileResponse(page, media_type="text/html; charset=utf-8",
                            headers={"Content-Security-Policy": REPORT_CSP, "Cache-Control": "no-cache",
                                     "X-Content-Type-Options": "nosniff"})

    @app.get("/runs/{run_id}/files/{stage_name}/{rel:path}")
    def stage_file(run_id: str, stage_name: str, rel: str) -> FileResponse:
        parts = PurePosixPath(rel).parts
        if not parts or rel.startswith("/") or "\\" in rel or any(p in ("..", ".") for p in parts) \
                or not servable(stage_name, rel):
            raise HTTPException(404, "not a file the run report links")
        lake = dataset_lake(run_id)
        pointer = stage.run_pointer(lake, stage.safe_run_id(run_id), stage_name)
        if not pointer.is_file():
            raise HTTPException(404, f"run {run_id!r} has no {stage_name} output")
        out = Path(stage.StageResult.from_file(pointer).path).resolve()
        target = (out / rel).resolve()
        # The pointer must name an output inside the lake, and symlinks may not lead out of it.
        if not out.is_relative_to(lake.resolve()) or not target.is_relative_to(out) \
                or not target.is_file():
            raise HTTPException(404, "not a file the run report links")
        media = TEXT_TYPES.get(target.suffix) or mimetypes.guess_type(target.name)[0] or "application/octet-stream"
        if media.startswith("text/") and "charset" not in media:
            media += "; charset=utf-8"
        return FileResponse(target, media_type=media, headers={"X-Content-Type-Options": "nosniff"})

    return app


app = create_app()


class IntentopsReportsPlugin(AirflowPlugin):
    name = "intentops_reports"
    fastapi_apps = [{"app": app, "url_prefix": URL_PREFIX, "name": "intentops run reports"}]
    external_views = [{
        "name": "Run report",
        # No leading slash: relative to the UI's base URL, so it works behind a proxy prefix.
        "href": f"{URL_PREFIX.lstrip('/')}/runs/{{RUN_ID}}/report",
        "destination": "dag_run",
        "url_route": "intentops_run_report",
    }]
