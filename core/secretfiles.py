"""Files that hold secrets: created with mode 0600 from the first byte, replaced atomically.

``write_text`` followed by ``chmod`` leaves a moment in which the file is readable by
others (and a crash in between leaves it so); here the content goes to a temporary file
opened ``O_EXCL`` with mode 0600 in the same folder, then ``os.replace`` swaps it in, so a
reader sees the old file or the new one, never a half-written or world-readable one.
"""

from __future__ import annotations

import contextlib
import os
import secrets
from pathlib import Path


def write_private(path: Path, text: str) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def create_private(path: Path, text: str) -> bool:
    """Write ``text`` to ``path`` only if it does not exist yet (True when written): two
    processes creating the same secret at once end with one value, the first one's, and
    nobody reads a half-written file (the complete file is hard-linked into place)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
