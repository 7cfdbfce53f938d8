"""Stages as idempotent transactions.

A stage's output lives at ``<lake>/<stage>/<key>/``, where ``key`` is a hash of the
stage's input fingerprints, its resolved config and its code version. ``run_stage``:

* returns at once (a cache hit, no work) when that directory already holds a manifest;
* otherwise writes into ``<lake>/<stage>/.tmp-<key>-<attempt>/``, writes the manifest
  last, and publishes with one ``rename`` -- atomic on a POSIX file system, so readers
  see the whole output or none of it, and a killed attempt leaves only a temp directory
  that the next attempt removes.

Outputs are never modified after publication: a changed input or config gets a new key.
The manifest also records the resources the work used (``resources``: CPU core-seconds of
its process tree, GPU-seconds, peak memory, bytes stored and read; see
:class:`ResourceMeter`), which ``core.cost`` prices. They are not part of the key.
Every run also records which outputs it used in ``<lake>/runs/<run_id>/<stage>.json``
(a pointer, written atomically), which the run summary and the next stage read.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from core import __version__
from core.errors import StageDeferred, StageError, StagePreempted, StageSkipped, StageVerdict  # noqa: F401 (re-exported: stages raise them from here)

log = logging.getLogger(__name__)

MANIFEST = "_MANIFEST.json"
_CHUNK = 1 << 20


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
    from core import (
        pushmetrics,  # not at the top: the serving image carries this module, not that one
    )

    key = stage_key(stage, inputs, config, code)
    stage_dir = lake / stage
    final = stage_dir / key
    t0 = time.monotonic()
    if (final / MANIFEST).exists():
        log.info("%s: cache hit %s", stage, final)
        result = StageResult(stage, key, str(final), True, read_manifest(final))
        pushmetrics.stage(stage, lake.name, "cache_hit", time.monotonic() - t0)
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
        meter = ResourceMeter()
        try:
            stats = work(tmp)
        except BaseException:
            meter.stop()
            shutil.rmtree(tmp, ignore_errors=True)
            pushmetrics.stage(stage, lake.name, "failed", time.monotonic() - t0)
            raise
        resources = meter.stop() | {"bytes_stored": tree_bytes(tmp),
                                    "bytes_read": inputs_bytes(lake, inputs)}
        manifest = {
            "stage": stage,
            "key": key,
            "inputs": inputs,
            "config": config,
            "code_version": code,
            "package_version": __version__,
            "stats": stats,
            "timings": {"started": started, "seconds": round(time.time() - started, 3)},
            "resources": resources,
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
        pushmetrics.stage(stage, lake.name, "published", time.monotonic() - t0)
        result = StageResult(stage, key, str(final), False, read_manifest(final))
    if run_id:
        atomic_write_text(run_pointer(lake, run_id, stage), result.to_json())
    return result


# --------------------------------------------------------------------------- resource use


def tree_bytes(path: str | os.PathLike[str]) -> int:
    """Bytes of every file under ``path`` (the manifest is written after this is taken)."""
    total = 0
    for root, _dirs, files in os.walk(path):
        for f in files:
            with contextlib.suppress(OSError):  # removed while walking
                total += os.lstat(os.path.join(root, f)).st_size
    return total


def inputs_bytes(lake: Path, inputs: dict[str, Any]) -> int | None:
    """Bytes the stage read, where its inputs say: a file fingerprint's ``bytes``, and for
    an upstream stage output (``{"stage": {"key": ...}}``) the size of that whole published
    folder (an upper bound: a stage may read only part of it). None when no input is
    known (e.g. a model read from the registry)."""
    def walk(name: str, value: Any, top: bool) -> int | None:
        if not isinstance(value, dict):
            return None
        if isinstance(value.get("bytes"), int):  # a file fingerprint
            return value["bytes"]
        if top and isinstance(value.get("key"), str):  # a published upstream output
            folder = lake / name / value["key"]
            if not (folder / MANIFEST).is_file():
                return None
            stored = (read_manifest(folder).get("resources") or {}).get("bytes_stored")
            return stored if isinstance(stored, int) else tree_bytes(folder)
        found = [n for k, v in value.items() if (n := walk(k, v, False)) is not None]
        return sum(found) if found else None  # e.g. the fingerprints of date partitions

    found = [n for k, v in inputs.items() if (n := walk(k, v, True)) is not None]
    return sum(found) if found else None


def _visible_gpus() -> int:
    """GPUs this process may use: torch's count when torch is already imported (a stage
    process that does not use torch does not pay for importing it), else the NVIDIA
    driver's device list narrowed by CUDA_VISIBLE_DEVICES."""
    torch = sys.modules.get("torch")
    if torch is not None:
        try:
            return torch.cuda.device_count() if torch.cuda.is_available() else 0
        except Exception:
            return 0
    try:
        n = len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return 0
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [v for v in visible.split(",") if v.strip() and not v.strip().startswith("-")]
        n = min(n, len(ids))
    return n


class ResourceMeter:
    """Resource use of a stage's work, from construction to :meth:`stop`.

    * ``cpu_seconds``: user + system CPU time of the stage's process tree, as a difference
      of cumulative counters: each live process's own time plus the time of the children
      it reaped (so torchrun's workers and a local Spark session's JVM and Python workers
      count, whether they end during the stage or outlive it). Under spark-submit the tree
      is the spark-submit JVM that started this driver, with its executors' threads and
      Python workers. Executors on other machines (a cluster master) are not measured.
    * ``peak_rss_bytes``: the largest resident memory of the tree, sampled every
      ``interval`` seconds, and at least this process's own peak (VmHWM, reset at start).
    * ``gpus`` / ``gpu_seconds``: the GPUs the process sees, held for the work's wall
      time; ``gpu_seconds`` is None on a machine without a GPU.
    """

    def __init__(self, interval: float = 0.5):
        self.interval = interval
        self.started = time.time()
        self.root = self._root()
        self.peak = 0
        self._self_hwm_reset = self._reset_hwm()
        self.cpu0 = self._tree_cpu()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="resource-meter", daemon=True)
        self._thread.start()

    @staticmethod
    def _root():
        """The process whose tree the stage runs in: this one, or the spark-submit JVM
        that runs this Python driver (pyspark then finds its gateway in the environment)."""
        try:
            import psutil
        except ImportError:
            return None
        me = psutil.Process()
        if "PYSPARK_GATEWAY_PORT" in os.environ:
            try:
                parent = me.parent()
                if parent is not None and parent.name().startswith("java"):
                    return parent
            except psutil.Error:
                pass
        return me

    def _procs(self) -> list[Any]:
        import psutil

        try:
            return [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            return []

    def _tree_cpu(self) -> float:
        if self.root is None:
            import resource

            s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
            return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime
        import psutil

        total = 0.0
        for p in self._procs():
            try:
                t = p.cpu_times()
                total += t.user + t.system + getattr(t, "children_user", 0.0) + getattr(t, "children_system", 0.0)
            except psutil.Error:  # ended between listing and reading: its reaper counts it
                pass
        return total

    def _tree_rss(self) -> int:
        if self.root is None:
            return 0
        import psutil

        total = 0
        for p in self._procs():
            with contextlib.suppress(psutil.Error):  # ended meanwhile
                total += p.memory_info().rss
        return total

    @staticmethod
    def _reset_hwm() -> bool:
        try:  # "5" resets this process's peak RSS (Linux >= 4.0)
            with open("/proc/self/clear_refs", "w") as fh:
                fh.write("5")
            return True
        except OSError:
            return False

    @staticmethod
    def _self_hwm() -> int:
        try:
            with open("/proc/self/status") as fh:
                for line in fh:
                    if line.startswith("VmHWM:"):
                        return int(line.split()[1]) * 1024
        except (OSError, ValueError, IndexError):
            pass
        return 0

    def _sample(self) -> None:
        while True:
            self.peak = max(self.peak, self._tree_rss())
            if self._done.wait(self.interval):
                return

    def stop(self) -> dict[str, Any]:
        self._done.set()
        self._thread.join()
        wall = time.time() - self.started
        self.peak = max(self.peak, self._tree_rss(), self._self_hwm() if self._self_hwm_reset else 0)
        gpus = _visible_gpus()
        return {
            "wall_seconds": round(wall, 3),
            "cpu_seconds": round(max(0.0, self._tree_cpu() - self.cpu0), 3),
            "gpus": gpus,
            "gpu_seconds": round(wall * gpus, 3) if gpus else None,
            "peak_rss_bytes": self.peak or None,
            "cores": os.cpu_count(),
            "measured": ("process tree of the spark-submit JVM" if self.root is not None
                         and self.root.pid != os.getpid() else "process tree of the stage"),
        }


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
