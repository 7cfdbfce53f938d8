"""Files that hold secrets: created with mode 0600 from the first byte, replaced atomically.

``write_text`` followed by ``chmod`` leaves a moment in which the file is readable by
others (and a crash in between leaves it so); here the content goes to a temporary file
opened ``O_EXCL`` with mode 0600 in the same folder, then ``os.replace`` swaps it in, so a
reader sees the old file or the new one, never a half-written or world-readable one.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def _temp_with(path: Path, text: str) -> Path:
    """A complete, fsynced file of mode 0600 beside ``path``, under a temporary name."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return tmp


def write_private(path: Path, text: str) -> None:
    tmp = _temp_with(Path(path), text)
    try:
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def create_private(path: Path, text: str) -> bool:
    """Write ``text`` to ``path`` only if it does not exist yet (True when written): two
    processes creating the same secret at once end with one value, the first one's, and
    nobody reads a half-written file (the complete file is hard-linked into place)."""
    path = Path(path)
    tmp = _temp_with(path, text)
    try:
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        tmp.unlink(missing_ok=True)
