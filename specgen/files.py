"""Writing files so that a crash never leaves half of one: a temporary name in the
same folder, then an atomic rename.  The result has the mode an ordinary write would
give it (the umask, or the mode of the file it replaces), and temporary files that a
killed run left behind are removed by the next write to the same name."""

from __future__ import annotations

import glob
import os
import tempfile
import time
from pathlib import Path

# A temporary file lives for the milliseconds of one write; one this old was left
# by a process that died between writing and renaming.
STALE_TMP_SECONDS = 600


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _mode_for(path: Path) -> int:
    """The mode of the file being replaced, else what open() would create."""
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        return 0o666 & ~_umask()


def _remove_stale_temporaries(path: Path) -> None:
    pattern = str(path.parent / f".{glob.escape(path.name)}.*.tmp")
    now = time.time()
    for stale in glob.glob(pattern):
        try:
            if now - os.stat(stale).st_mtime > STALE_TMP_SECONDS:
                os.unlink(stale)
        except OSError:
            pass  # another process removed or renamed it first


def atomic_write(path: Path, data: bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    mode = _mode_for(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    _remove_stale_temporaries(path)


def write_if_different(path: Path, text: str) -> bool:
    """Write only when the content changed, so unchanged files keep their timestamps.
    True when the file was (re)written.  An existing file is compared byte for byte,
    so one that is not UTF-8 is simply replaced."""
    data = text.encode()
    try:
        if path.read_bytes() == data:
            return False
    except OSError:
        pass
    atomic_write(path, data)
    return True
