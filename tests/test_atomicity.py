"""A stage killed in the middle of writing leaves the published output intact, and the
retry succeeds without manual clean-up. Uses real spark-submit processes."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import time
from pathlib import Path

import pandas as pd
from conftest import ROOT

from core import stage


def _export(path: Path, n: int, suffix: str) -> None:
    src = pd.read_csv(ROOT / "data" / "banking77" / "train.csv")
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["ticket_id", "created_at", "channel", "message", "intent", "annotations"])
        for i in range(n):
            r = src.iloc[i % len(src)]
            text = " ".join(r.text.split())  # one record per line, as the reader expects
            w.writerow([f"T{i}", "2026-11-01T10:00:00Z", "chat", f"{text} {suffix}{i}", r.category, "[]"])


def _submit(path: Path, lake: Path, run_id: str, env: dict[str, str]) -> subprocess.Popen:
    # C1 only, as the suite's pipeline runs (conftest.FAST_PIPELINE_ENV): the JIT's optimizing
    # compiler is most of a short job's CPU.
    cmd = ["spark-submit", "--master", "local[2]", "--conf",
           "spark.driver.extraJavaOptions=-XX:TieredStopAtLevel=1", str(ROOT / "jobs" / "spark" / "clean.py"),
           "--set", f"input.path={path}", "--set", f"lake_root={lake.parent}", "--run-id", run_id]
    return subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True)


def test_killed_mid_write_leaves_previous_output_and_retry_succeeds(tmp_path, project_env):
    root = tmp_path / "lake"
    lake = root / "banking77"  # <lake_root>/<dataset>
    first, second = tmp_path / "a.csv", tmp_path / "b.csv"
    _export(first, 2000, "a")
    _export(second, 60000, "b")

    assert _submit(first, lake, "run-1", project_env).wait(timeout=300) == 0
    published = stage.upstream(lake, "run-1", "clean")
    before = stage.file_fingerprint(published.path)

    proc = _submit(second, lake, "run-2", project_env)
    deadline = time.time() + 300
    killed_during_write = False
    while time.time() < deadline and proc.poll() is None:
        tmp_dirs = list((lake / "clean").glob(".tmp-*"))
        if any((d / "kept").exists() for d in tmp_dirs):  # Spark has started writing
            os.killpg(proc.pid, signal.SIGKILL)
            killed_during_write = True
            break
        time.sleep(0.02)
    proc.wait(timeout=60)
    assert killed_during_write, "the job finished before it could be killed mid-write"

    # The published output is untouched; nothing of the killed attempt is visible.
    assert stage.file_fingerprint(published.path) == before
    visible = [p.name for p in (lake / "clean").iterdir() if not p.name.startswith(".")]
    assert visible == [published.key]
    assert not stage.run_pointer(lake, "run-2", "clean").exists()
    assert list((lake / "clean").glob(".tmp-*")), "expected the killed attempt's temp folder"

    # The retry (what Airflow does) succeeds and cleans up after the killed attempt.
    assert _submit(second, lake, "run-2", project_env).wait(timeout=300) == 0
    retried = stage.upstream(lake, "run-2", "clean")
    assert not retried.cache_hit and retried.manifest["stats"]["rows_in"] == 60000
    assert not list((lake / "clean").glob(".tmp-*"))
    assert stage.file_fingerprint(published.path) == before
