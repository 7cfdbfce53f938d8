"""Atomic, resumable training checkpoints.

A checkpoint is everything needed to continue a killed run as if it had never stopped:
model, optimizer and LR-scheduler state, the RNG states of every rank (dropout masks depend
on them), the next global step, the epoch and the number of micro-batches already consumed
in it, the early-stopping state, and the resolved training config with its fingerprint.

Files are ``step-<8 digits>.pt`` plus ``best.pt`` (the best model so far, which the final
``model.pt`` is taken from even when the run was resumed after the best epoch). Each one is
written to a temporary file in the same folder, fsynced and renamed over the final name
(``os.replace`` is atomic within a file system), so a SIGKILL or a full disk leaves either
the previous checkpoint or the new one, never a truncated file under a checkpoint's name.
Loading uses ``torch.load(weights_only=True)``: everything stored is tensors and plain
Python values, so a tampered file cannot run code.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import random
import re
import tempfile
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
BEST_NAME = "best.pt"
KEEP_LAST = 2
_STEP_RE = re.compile(r"^step-(\d{8})\.pt$")
_TMP_PREFIX = ".tmp-"


class CheckpointError(RuntimeError):
    """A checkpoint cannot be used; the message says which and why."""


class ConfigMismatchError(CheckpointError):
    """The checkpoint was written under a different training config."""

    def __init__(self, path: Path, differing: list[str], details: list[str]) -> None:
        self.differing = differing
        super().__init__(
            f"{path}: checkpoint was written with a different training config; differing "
            f"key(s): {', '.join(details)}. Resuming would silently mix two runs: restore the "
            "original config or train into a new output folder"
        )


def _canonical(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)


def config_fingerprint(config: Mapping[str, Any]) -> str:
    """SHA-256 of the config as canonical JSON (key order and whitespace do not matter)."""
    return hashlib.sha256(_canonical(config).encode("utf-8")).hexdigest()


def _flatten(obj: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in obj.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out |= _flatten(value, f"{name}.")
        else:
            out[name] = value
    return out


def config_diff(stored: Mapping[str, Any], current: Mapping[str, Any]) -> list[tuple[str, Any, Any]]:
    """(key, stored value, current value) for every flattened key that differs."""
    a, b = _flatten(stored), _flatten(current)
    missing = object()
    diffs = []
    for key in sorted(a.keys() | b.keys()):
        va, vb = a.get(key, missing), b.get(key, missing)
        if _canonical(va if va is not missing else "<absent>") != _canonical(vb if vb is not missing else "<absent>"):
            diffs.append((key, "<absent>" if va is missing else va, "<absent>" if vb is missing else vb))
    return diffs


def atomic_save(obj: Any, path: Path) -> None:
    """``torch.save`` to a temp file beside ``path``, fsync, rename over ``path``, fsync the
    folder (so the rename itself survives a power cut). The temp file is removed on failure."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f"{_TMP_PREFIX}{path.name}.", dir=path.parent)
    tmp = Path(tmp_name)
    try:
        os.fchmod(fd, 0o644)  # mkstemp's 0600 would hide checkpoints from other task users
        with os.fdopen(fd, "wb") as fh:
            torch.save(obj, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def is_complete(path: Path) -> bool:
    """A readable torch zip archive: the central directory sits at the end of the file, so a
    truncated or half-copied file fails this cheaply without loading any tensor."""
    try:
        with zipfile.ZipFile(path) as zf:
            return any(name.endswith("/data.pkl") for name in zf.namelist())
    except (OSError, zipfile.BadZipFile):
        return False


def step_checkpoints(folder: Path) -> list[tuple[int, Path]]:
    """(step, path) of the step checkpoints in ``folder``, oldest first."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = []
    for p in folder.iterdir():
        m = _STEP_RE.match(p.name)
        if m:
            found.append((int(m.group(1)), p))
    return sorted(found)


def latest(folder: Path) -> Path | None:
    """The newest complete step checkpoint in ``folder``, or None.

    Temporary files of an interrupted write never match the name pattern; a named file that
    is still not a complete archive (copied in by hand, disk corruption) is skipped with a
    warning in favour of the one before it."""
    for _, path in reversed(step_checkpoints(folder)):
        if is_complete(path):
            return path
        log.warning("%s: incomplete checkpoint, falling back to an older one", path)
    return None


def origin_world_size(folder: Path) -> int | None:
    """The world size the run in ``folder`` started at (its newest checkpoint's identity), or
    None without a readable checkpoint (``load`` then says what is wrong with it)."""
    path = latest(folder)
    if path is None:
        return None
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
        return int(data["config"]["world_size"])
    except Exception:  # noqa: BLE001 - load() reports it properly
        return None


def remove_stale_temps(folder: Path) -> int:
    """Delete temp files left by writes that a kill interrupted; returns how many."""
    folder = Path(folder)
    if not folder.is_dir():
        return 0
    stale = [p for p in folder.iterdir() if p.name.startswith(_TMP_PREFIX)]
    for p in stale:
        p.unlink(missing_ok=True)
    return len(stale)


def save(folder: Path, state: dict[str, Any], keep: int = KEEP_LAST) -> Path:
    """Write ``state`` as ``step-<global_step>.pt`` and prune all but the ``keep`` newest."""
    for key in ("global_step", "config", "config_fingerprint"):
        if key not in state:
            raise CheckpointError(f"checkpoint state lacks {key!r}")
    folder = Path(folder)
    path = folder / f"step-{int(state['global_step']):08d}.pt"
    atomic_save({"format_version": FORMAT_VERSION, **state}, path)
    for _, old in step_checkpoints(folder)[:-keep]:
        old.unlink(missing_ok=True)
    return path


def _check_fingerprint(path: Path, data: Mapping[str, Any], config: Mapping[str, Any]) -> None:
    if data.get("config_fingerprint") == config_fingerprint(config):
        return
    diffs = config_diff(data.get("config", {}), config)
    if not diffs:  # fingerprint differs only through a serialization change
        raise ConfigMismatchError(path, ["<fingerprint>"], ["<fingerprint only>"])
    details = [f"{k} (checkpoint {old!r}, now {new!r})" for k, old, new in diffs]
    raise ConfigMismatchError(path, [k for k, _, _ in diffs], details)


def load(path: Path, config: Mapping[str, Any]) -> dict[str, Any]:
    """A step checkpoint, after checking it was written under ``config``."""
    path = Path(path)
    try:
        data = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise CheckpointError(f"{path}: cannot read checkpoint: {exc}") from exc
    if data.get("format_version") != FORMAT_VERSION:
        raise CheckpointError(f"{path}: checkpoint format {data.get('format_version')!r}, "
                              f"this code reads {FORMAT_VERSION}")
    _check_fingerprint(path, data, config)
    return data


def save_best(folder: Path, model_state: Mapping[str, torch.Tensor], info: Mapping[str, Any]) -> Path:
    """The best model so far with its epoch, step and metric (``best.pt``)."""
    path = Path(folder) / BEST_NAME
    atomic_save({"format_version": FORMAT_VERSION, "model": dict(model_state), **info}, path)
    return path


def load_best(folder: Path, config: Mapping[str, Any]) -> dict[str, Any] | None:
    path = Path(folder) / BEST_NAME
    if not path.exists():
        return None
    data = torch.load(path, map_location="cpu", weights_only=True)
    _check_fingerprint(path, data, config)
    return data


def capture_rng() -> dict[str, Any]:
    """This process's Python, NumPy and torch RNG states, as weights_only-loadable values."""
    np_state = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": {"name": np_state[0], "keys": torch.from_numpy(np_state[1].astype(np.int64)),
                  "pos": int(np_state[2]), "has_gauss": int(np_state[3]),
                  "cached_gaussian": float(np_state[4])},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: Mapping[str, Any]) -> None:
    py = state["python"]
    random.setstate((py[0], tuple(py[1]), py[2]))
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy().astype(np.uint32), n["pos"],
                         n["has_gauss"], n["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
