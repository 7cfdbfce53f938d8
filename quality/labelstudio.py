"""A small client of Label Studio's REST API (plain HTTP with httpx).

Not ``label-studio-sdk``: its 2.x releases pin ``pyjwt<2.14`` and the pipeline's
constraints hold ``pyjwt==2.15.1`` (pip's resolver refuses the pair), and the few calls the
review loop makes are simple. Checked against Label Studio 1.23.2
(``constraints-label-studio.txt``):

* ``GET  /health``; ``GET /api/projects/?title=`` and ``POST /api/projects/``;
  ``PATCH /api/projects/<id>/`` (the labeling config when the label set changes);
* ``POST /api/projects/<id>/import?return_task_ids=true``: a list of tasks with
  ``predictions`` (the pre-labels) -> ``task_ids``;
* ``GET  /api/tasks/?project=<id>&page=&page_size=``: ``{"tasks": [...], "total": n}``;
* ``GET  /api/projects/<id>/export?exportType=JSON``: finished tasks with their
  annotations (``completed_by`` is the user's numeric id);
* ``POST /api/tasks/<id>/annotations/`` and ``POST /api/users/`` (what a reviewer's UI
  does; the tests use them as a reviewer would).

Authentication: ``Authorization: Token <legacy token>``; `make up` starts the server with
legacy tokens enabled and the generated token (``core/labeling_auth.py``).
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from core.stage import StageError


class LabelStudioError(StageError):
    """Label Studio did not answer or refused a call (transient: the task retries)."""


class Client:
    def __init__(self, url: str, token: str, timeout: float = 30.0, attempts: int = 3) -> None:
        self.url = url.rstrip("/")
        self.attempts = attempts
        self.http = httpx.Client(base_url=self.url, timeout=timeout,
                                 headers={"Authorization": f"Token {token}"})

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, **kw: Any) -> Any:
        """One call, retried on connection errors and 5xx (a few seconds apart): Label
        Studio on SQLite answers 500 'database is locked' now and then under load."""
        last: Exception | None = None
        for attempt in range(self.attempts):
            try:
                r = self.http.request(method, path, **kw)
            except httpx.HTTPError as exc:
                last = exc
            else:
                if r.status_code < 500:
                    if r.status_code >= 400:
                        raise LabelStudioError(f"{method} {path}: HTTP {r.status_code}: {r.text[:300]}")
                    return r.json() if r.content else None
                last = LabelStudioError(f"HTTP {r.status_code}: {r.text[:300]}")
            time.sleep(min(2.0 * (attempt + 1), 5.0))
        raise LabelStudioError(f"Label Studio at {self.url} did not answer {method} {path} "
                               f"after {self.attempts} attempts: {last}")

    def health(self) -> bool:
        try:
            return self.http.get("/health", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    # -- projects --------------------------------------------------------------------

    def find_project(self, title: str) -> dict[str, Any] | None:
        found = [p for p in self._call("GET", "/api/projects/", params={"title": title}).get("results", [])
                 if p.get("title") == title]
        return found[0] if found else None

    def project(self, title: str, label_config: str, description: str = "") -> dict[str, Any]:
        """The project named ``title``, created when missing; its labeling config is
        brought up to ``label_config`` (a new label set) when it differs."""
        p = self.find_project(title)
        if p is None:
            return self._call("POST", "/api/projects/", json={
                "title": title, "label_config": label_config, "description": description})
        if p.get("label_config", "").strip() != label_config.strip():
            p = self._call("PATCH", f"/api/projects/{p['id']}/", json={"label_config": label_config})
        return p

    # -- tasks -----------------------------------------------------------------------

    def tasks(self, project: int, page_size: int = 500) -> list[dict[str, Any]]:
        """Every task of the project (data, id, annotation counts)."""
        out: list[dict[str, Any]] = []
        page = 1
        while True:
            body = self._call("GET", "/api/tasks/", params={
                "project": project, "page": page, "page_size": page_size})
            batch = body.get("tasks", [])
            out += batch
            if not batch or len(out) >= body.get("total", 0):
                return out
            page += 1

    def import_tasks(self, project: int, tasks: list[dict[str, Any]], chunk: int = 500) -> list[int]:
        """Creates the tasks (with their predictions); their ids, in order."""
        ids: list[int] = []
        for i in range(0, len(tasks), chunk):
            body = self._call("POST", f"/api/projects/{project}/import",
                              params={"return_task_ids": "true"}, json=tasks[i:i + chunk])
            got = body.get("task_ids") or []
            if len(got) != len(tasks[i:i + chunk]):
                raise LabelStudioError(f"import into project {project} returned {len(got)} task ids "
                                       f"for {len(tasks[i:i + chunk])} tasks")
            ids += got
        return ids

    def export(self, project: int) -> list[dict[str, Any]]:
        """Finished tasks with their annotations (JSON export, synchronous)."""
        return self._call("GET", f"/api/projects/{project}/export", params={"exportType": "JSON"})

    # -- what a reviewer does (tests, benchmark) -------------------------------------

    def annotate(self, task: int, from_name: str, to_name: str, label: str,
                 user: int | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"result": [{"from_name": from_name, "to_name": to_name, "type": "choices",
                                            "value": {"choices": [label]}}]}
        if user is not None:
            body["completed_by"] = user
        return self._call("POST", f"/api/tasks/{task}/annotations/", json=body)

    def create_user(self, email: str, username: str) -> dict[str, Any]:
        return self._call("POST", "/api/users/", json={"email": email, "username": username})

    def delete_task(self, task: int) -> None:
        self._call("DELETE", f"/api/tasks/{task}/")

    def update_task(self, task: int, data: dict[str, Any]) -> dict[str, Any]:
        return self._call("PATCH", f"/api/tasks/{task}/", json={"data": data})
