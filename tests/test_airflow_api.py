"""The REST client's backfill creation against Airflow's SQLite-lock behaviour.

The lock race cannot be provoked on demand against a real server, so an in-process
transport plays the API server's documented answers (routes/public/backfills.py): the
backfill row is committed, the run creation hits the lock (503), the best-effort clean-up
fails, and the retry meets the orphan (409). The whole flow against a real standalone runs
in tests/test_services.py."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import httpx
import pytest

from ops.airflow_api import AirflowApi


class FakeAirflow:
    def __init__(self, answers: list[int], preexisting: bool = False) -> None:
        self.answers = answers  # status of each POST /backfills until one succeeds
        self.backfills: list[dict] = []
        self.cancelled: list[int] = []
        if preexisting:
            self._add(created="2020-01-01T00:00:00Z")

    def _add(self, created: str | None = None) -> dict:
        b = {"id": len(self.backfills) + 1, "dag_id": "d", "completed_at": None,
             "created_at": created or datetime.now(UTC).isoformat()}
        self.backfills.append(b)
        return b

    def __call__(self, request: httpx.Request) -> httpx.Response:
        path = request.url.path
        if path == "/auth/token":
            return httpx.Response(201, json={"access_token": "t"})
        if path == "/api/v2/backfills" and request.method == "POST":
            if any(b["completed_at"] is None for b in self.backfills):
                return httpx.Response(409, json={"detail": "There is already a running backfill for dag d"})
            status = self.answers.pop(0)
            b = self._add()
            if status == 503:  # committed, then the lock; the clean-up failed too
                return httpx.Response(503, json={"detail": "database is locked"})
            if status == 500:  # the same lock, as Airflow 3 also answers it
                return httpx.Response(500, json={"detail": {"reason": "Database error",
                                                            "statement": "hidden"}})
            return httpx.Response(200, json={**b, **json.loads(request.content)})
        if path == "/api/v2/backfills" and request.method == "GET":
            return httpx.Response(200, json={"backfills": self.backfills})
        if path.endswith("/cancel"):
            bid = int(path.split("/")[-2])
            self.cancelled.append(bid)
            self.backfills[bid - 1]["completed_at"] = datetime.now(UTC).isoformat()
            return httpx.Response(200, json=self.backfills[bid - 1])
        return httpx.Response(404)


def _client(fake: FakeAirflow, monkeypatch) -> AirflowApi:
    monkeypatch.setattr("ops.airflow_api.time.sleep", lambda s: None)
    real = httpx.Client

    def client(*a, **kw):
        return real(*a, transport=httpx.MockTransport(fake), **kw)

    monkeypatch.setattr(httpx, "Client", client)
    monkeypatch.setattr(httpx, "post", lambda url, **kw: client().post(url, **kw))
    return AirflowApi("http://airflow", "admin", "pw")


def test_an_orphan_left_by_a_locked_creation_is_cancelled_and_the_backfill_created(monkeypatch):
    fake = FakeAirflow(answers=[503, 200])
    created = _client(fake, monkeypatch).create_backfill({"dag_id": "d", "reprocess_behavior": "none"})
    assert fake.cancelled == [1]
    assert created["id"] == 2 and created["reprocess_behavior"] == "none"


def test_a_500_database_error_is_retried_like_the_lock(monkeypatch):
    fake = FakeAirflow(answers=[500, 200])
    created = _client(fake, monkeypatch).create_backfill({"dag_id": "d", "reprocess_behavior": "none"})
    assert fake.cancelled == [1]
    assert created["id"] == 2


def test_a_backfill_running_before_the_call_is_a_conflict_not_cancelled(monkeypatch):
    fake = FakeAirflow(answers=[200], preexisting=True)
    with pytest.raises(RuntimeError, match="409 .*already a running backfill"):
        _client(fake, monkeypatch).create_backfill({"dag_id": "d"})
    assert fake.cancelled == []
