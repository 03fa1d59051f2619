"""The GPU ceilings ``bench.ceilings`` measured on this machine, one entry a device
name in the cache's ``ceilings.json``: read here without a GPU (the operator's layout
choice prices its moves with the copy rate) and written by ``bench`` once measured."""

from __future__ import annotations

import json
from pathlib import Path

from .compile import cache_dir
from .files import atomic_write

RATES = ("copy_bytes_per_s", "fp32_flops_per_s")


def _path() -> Path:
    return cache_dir() / "ceilings.json"


_READ: dict[tuple, dict] = {}  # (path, mtime, size) -> what it held: read once


def _all() -> dict:
    """Device name -> its entry, as the file holds them; nothing where it is missing or
    damaged.  Read again only when the file changed: the operator's layout choice asks
    once a layer, and a whole-model plan once a problem."""
    path = _path()
    try:
        st = path.stat()
    except OSError:
        return {}
    key = (str(path), st.st_mtime_ns, st.st_size)
    if key not in _READ:
        try:
            known = json.loads(path.read_text())
        except (OSError, ValueError, RecursionError):  # damaged or nested too deep
            known = {}
        _READ.clear()
        _READ[key] = known if isinstance(known, dict) else {}
    return _READ[key]


def ceilings(gpu: str) -> dict | None:
    """The ceilings measured for ``gpu``, None where there are none or the entry is
    damaged (a rate that is not a positive number)."""
    entry = _all().get(gpu)
    if isinstance(entry, dict) and all(
        isinstance(entry.get(k), (int, float)) and entry[k] > 0 for k in RATES
    ):
        return entry
    return None


def record(gpu: str, entry: dict) -> None:
    """``entry`` as ``gpu``'s, the others kept; the file written whole."""
    atomic_write(_path(), json.dumps(dict(_all(), **{gpu: entry}), indent=1).encode())
    _READ.clear()
