"""Writing files so that a crash never leaves half of one: a temporary name in the
same folder, then an atomic rename."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_if_different(path: Path, text: str) -> bool:
    """Write only when the content changed, so unchanged files keep their timestamps.
    True when the file was (re)written."""
    try:
        if path.read_text() == text:
            return False
    except OSError:
        pass
    atomic_write(path, text.encode())
    return True
