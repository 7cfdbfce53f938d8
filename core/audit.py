"""The audit log: one append-only JSON line per action that changes what is served.

Each record is ``{"at", "actor", "role", "action", "target", "outcome", "reason"}``. The
actions are a fixed list (``ACTIONS``); a record of any other name is a programming error.
The file is ``INTENTOPS_AUDIT_LOG`` when set, else ``var/audit/audit.jsonl`` in the
project; it is created with mode 0600 and only ever appended to (``O_APPEND``: each record
is one ``write`` of one line, so concurrent writers on one host never interleave within a
line), and every record is flushed to disk before the call returns.

An action whose record cannot be written fails: ``check_writable`` is called before the
action and ``record`` after it, and both raise ``AuditError``.

Standard library only: the model server and the router (serving image) write here too.
"""

from __future__ import annotations

import getpass
import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# The documented action names (README, "Audit log").
ACTIONS = {
    "alias.move": "a registry alias (challenger, champion, previous) pointed at a version or removed",
    "registration": "the registration gate's decision on a trained model (registered or rejected)",
    "rollout": "a canary rollout's decision (promoted, rolled_back, refused)",
    "rollback": "a manual rollback to the previous version",
    "server.reload": "a model server asked to load another build (done or refused)",
    "router.routes": "the router's upstreams or weights changed (done or refused)",
    "dag.trigger": "a pipeline run triggered through the project's Airflow client",
    "keys.create": "a client key made by the admin role (its fingerprint, never the key)",
    "keys.revoke": "a client key revoked by the admin role (done or refused)",
    "scale": "the stable variant's replica count changed (by the autoscaler or by hand), with the signals",
    "alert": "an alert from Alertmanager reached the project's receiver (firing or resolved)",
    "training.preempt": "the preemption controller stopped a training for a waiting one of higher priority",
}
DEFAULT = Path(__file__).resolve().parent.parent / "var" / "audit" / "audit.jsonl"


class AuditError(RuntimeError):
    """The audit log cannot be written: the action it would record must not happen."""


def path() -> Path:
    return Path(os.environ.get("INTENTOPS_AUDIT_LOG") or DEFAULT)


def actor() -> str:
    """``INTENTOPS_ACTOR`` when the caller set it (the DAG's tasks), else ``user:<login>``."""
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no login name (a container user without passwd entry)
        user = str(os.getuid())
    return os.environ.get("INTENTOPS_ACTOR") or f"user:{user}"


def _open(p: Path) -> int:
    p.parent.mkdir(parents=True, exist_ok=True)
    return os.open(p, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)


def check_writable(p: Path | None = None) -> None:
    p = p or path()
    try:
        os.close(_open(p))
    except OSError as exc:
        raise AuditError(f"the audit log {p} cannot be written ({exc.strerror}); refusing the action") from None


def record(action: str, target: str, outcome: str, reason: str = "", *, actor_: str | None = None,
           role: str | None = None, p: Path | None = None) -> dict[str, Any]:
    if action not in ACTIONS:
        raise ValueError(f"unknown audit action {action!r}; known: {sorted(ACTIONS)}")
    rec = {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()) , "actor": actor_ or actor(),
           "role": role, "action": action, "target": target, "outcome": outcome, "reason": reason[:2000]}
    line = (json.dumps(rec, sort_keys=False) + "\n").encode()
    p = p or path()
    try:
        fd = _open(p)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        raise AuditError(f"the audit log {p} cannot be written ({exc.strerror})") from None
    return rec


def read(p: Path | None = None, action: str | None = None, since: str | None = None,
         until: str | None = None) -> Iterator[dict[str, Any]]:
    """Records in order, filtered by action and by time (ISO 8601 UTC strings compare in
    time order: ``2026-12-05`` or ``2026-12-05T14:00:00Z``)."""
    p = p or path()
    if not p.exists():
        return
    with p.open() as fh:
        for line in fh:
            if not line.strip():
                continue
            rec = json.loads(line)
            if action and rec["action"] != action:
                continue
            if since and rec["at"] < since:
                continue
            if until and rec["at"] > until:
                continue
            yield rec
