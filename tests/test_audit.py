"""The audit log: append-only records of a fixed list of actions, read back with filters;
an action whose record cannot be written does not happen."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from conftest import ROOT

from core import audit


def test_records_append_read_back_and_filter(tmp_path):
    p = tmp_path / "a" / "audit.jsonl"
    audit.record("rollout", "m v2", "promoted", "every check passed", actor_="user:ann", p=p)
    audit.record("alias.move", "m@champion", "v2", "promoted", actor_="airflow:dag/run1", p=p)
    audit.record("server.reload", "models:/m/2", "refused", "no gate status", actor_="key:abc", role="operator", p=p)
    assert oct(p.stat().st_mode & 0o777) == "0o600"
    lines = p.read_text().splitlines()
    assert len(lines) == 3 and all(json.loads(x)["at"].endswith("Z") for x in lines)
    assert [r["action"] for r in audit.read(p)] == ["rollout", "alias.move", "server.reload"]
    assert [r["actor"] for r in audit.read(p, action="alias.move")] == ["airflow:dag/run1"]
    assert list(audit.read(p, since="2999-01-01")) == [] and len(list(audit.read(p, until="2999"))) == 3
    with pytest.raises(ValueError, match="unknown audit action"):
        audit.record("model.delete", "m", "done", p=p)


def test_an_unwritable_log_fails_the_action(tmp_path):
    blocked = tmp_path / "blocked"
    blocked.write_text("a file where the log's folder should be")
    with pytest.raises(audit.AuditError, match="cannot be written"):
        audit.check_writable(blocked / "audit.jsonl")
    with pytest.raises(audit.AuditError):
        audit.record("rollback", "m v1", "done", p=blocked / "audit.jsonl")


def test_cli_prints_and_filters(tmp_path):
    p = tmp_path / "audit.jsonl"
    audit.record("registration", "m (training run r1)", "registered v3", "beats champion", actor_="u", p=p)
    audit.record("dag.trigger", "intentops_pipeline/manual__1", "triggered", "{}", actor_="u", p=p)
    env = dict(os.environ, INTENTOPS_AUDIT_LOG=str(p), PYTHONPATH=str(ROOT))
    out = subprocess.run([sys.executable, "-m", "ops.cli", "audit", "--action", "registration"], env=env,
                         cwd=ROOT, capture_output=True, text=True, check=True)
    assert "registered v3" in out.stdout and "dag.trigger" not in out.stdout
    out = subprocess.run([sys.executable, "-m", "ops.cli", "audit", "--json"], env=env, cwd=ROOT,
                         capture_output=True, text=True, check=True)
    assert [json.loads(x)["action"] for x in out.stdout.splitlines()] == ["registration", "dag.trigger"]
    bad = subprocess.run([sys.executable, "-m", "ops.cli", "audit", "--action", "nope"], env=env, cwd=ROOT,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown action" in bad.stderr
