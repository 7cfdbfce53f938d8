"""Stages as idempotent transactions.

A stage's output lives at ``<lake>/<stage>/<key>/``, where ``key`` is a hash of the
stage's input fingerprints, its resolved config and its code version. ``run_stage``:

* returns at once (a cache hit, no work) when that directory already holds a manifest;
* otherwise writes into ``<lake>/<stage>/.tmp-<key>-<attempt>/``, writes the manifest
  last, and publishes with one ``rename`` -- atomic on a POSIX file system, so readers
  see the whole output or none of it, and a killed attempt leaves only a temp directory
  that the next attempt removes.

Outputs are never modified after publication: a changed input or config gets a new key.
Every run also records which outputs it used in ``<lake>/runs/<run_id>/<stage>.json``
(a pointer, written atomically), which the run summary and the next stage read.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import socket
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from core import __version__

log = logging.getLogger(__name__)

MANIFEST = "_MANIFEST.json"
_CHUNK = 1 << 20


class StageError(RuntimeError):
    """A stage failed for a reason the user can act on (bad input, bad config)."""


class StageVerdict(StageError):
    """The stage ran and its verdict stops the run: a gate failed on the data, a model
    failed its parity check, a rollout was rolled back. A property of the data or the model,
    not a transient error: the DAG fails the task at once instead of retrying it, and the
    CLI exits with status 3."""


def file_fingerprint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Content fingerprint of a file or of every file under a directory.

    Content, not mtime: a copy of the same export is the same input, and a file rewritten
    in place with new rows is a new one.
    """
    root = Path(path)
    if not root.exists():
        raise StageError(f"input not found: {root}")
    files = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    files = [f for f in files if not f.name.startswith((".", "_")) or f.name == MANIFEST]
    digest = hashlib.sha256()
    size = 0
    for f in files:
        if f != root:  # inside a folder the layout matters; a lone file's name does not
            digest.update(str(f.relative_to(root)).encode())
        with f.open("rb") as fh:
            while chunk := fh.read(_CHUNK):
                digest.update(chunk)
                size += len(chunk)
    return {"sha256": digest.hexdigest(), "bytes": size, "files": len(files)}


def stage_key(stage: str, inputs: dict[str, Any], config: dict[str, Any], code: str) -> str:
    blob = json.dumps(
        {"stage": stage, "inputs": inputs, "config": config, "code": code},
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:20]


def atomic_write_text(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with tmp.open("w") as fh:
        fh.write(text)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


@dataclass
class StageResult:
    stage: str
    key: str
    path: str
    cache_hit: bool
    manifest: dict[str, Any] = field(repr=False)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True, default=str)

    @classmethod
    def from_file(cls, path: str | os.PathLike[str]) -> StageResult:
        return cls(**json.loads(Path(path).read_text()))


def read_manifest(output_dir: str | os.PathLike[str]) -> dict[str, Any]:
    path = Path(output_dir) / MANIFEST
    if not path.exists():
        raise StageError(f"{output_dir} is not a published stage output (no {MANIFEST})")
    return json.loads(path.read_text())


def run_stage(
    stage: str,
    lake: Path,
    inputs: dict[str, Any],
    config: dict[str, Any],
    code: str,
    work: Callable[[Path], dict[str, Any]],
    run_id: str | None = None,
) -> StageResult:
    """Run ``work(tmp_dir) -> stats`` as a transaction; see the module docstring.

    ``stats`` (row counts, reasons, ...) goes into the manifest. ``run_id``, when given,
    records a pointer to the output for that pipeline run.
    """
    key = stage_key(stage, inputs, config, code)
    stage_dir = lake / stage
    final = stage_dir / key
    if (final / MANIFEST).exists():
        log.info("%s: cache hit %s", stage, final)
        result = StageResult(stage, key, str(final), True, read_manifest(final))
    else:
        stage_dir.mkdir(parents=True, exist_ok=True)
        # Leftovers of killed attempts at this key. Runs of one DAG are serialized
        # (max_active_runs=1), so no other live attempt writes here.
        for stale in stage_dir.glob(f".tmp-{key}-*"):
            log.warning("%s: removing leftover of an interrupted attempt: %s", stage, stale)
            shutil.rmtree(stale, ignore_errors=True)
        tmp = stage_dir / f".tmp-{key}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        started = time.time()
        try:
            stats = work(tmp)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        manifest = {
            "stage": stage,
            "key": key,
            "inputs": inputs,
            "config": config,
            "code_version": code,
            "package_version": __version__,
            "stats": stats,
            "timings": {"started": started, "seconds": round(time.time() - started, 3)},
            "host": socket.gethostname(),
            "run_id": run_id,
        }
        # The manifest is written last: its presence is the completion marker.
        atomic_write_text(
            tmp / MANIFEST, json.dumps(manifest, indent=2, sort_keys=True, default=str)
        )
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / MANIFEST).exists():
                raise
            # Another attempt published the same key first: identical by construction.
            shutil.rmtree(tmp, ignore_errors=True)
        log.info("%s: published %s in %.1fs", stage, final, time.time() - started)
        result = StageResult(stage, key, str(final), False, read_manifest(final))
    if run_id:
        atomic_write_text(run_pointer(lake, run_id, stage), result.to_json())
    return result


def safe_run_id(run_id: str) -> str:
    # Airflow run ids hold ':' and '+' (manual__2026-12-02T10:00:00+00:00).
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in run_id)


def run_dir(lake: Path, run_id: str) -> Path:
    return lake / "runs" / safe_run_id(run_id)


def run_pointer(lake: Path, run_id: str, stage: str) -> Path:
    return run_dir(lake, run_id) / f"{stage}.json"


def upstream(lake: Path, run_id: str, stage: str) -> StageResult:
    """The output a stage published (or reused) for this run, for the next stage to read."""
    pointer = run_pointer(lake, run_id, stage)
    if not pointer.exists():
        raise StageError(f"run {run_id!r} has no {stage} output yet ({pointer} missing)")
    return StageResult.from_file(pointer)
