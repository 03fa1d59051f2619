"""What a whole-model tune lists before its first item, kept from run to run: a model's
conv problems (the trace imports PyTorch and torchvision, 3-9 s) and each search's
candidates (planning and rendering every one of them, about 40 s of CPU for resnet50
at budget 40).  Both follow from specgen's own code alone (and, for the problems, the
installed PyTorch and torchvision), so an entry is keyed by a hash of that code and
never outlives a change to it.  The entries live in ``cache_dir()/listings``, written
atomically; a run that finds none lists as before and stores what it listed."""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import replace
from importlib import metadata
from pathlib import Path

from .compile import cache_dir
from .files import atomic_write
from .shapes import parse_shape


@functools.cache
def code_hash() -> str:
    """A hash of specgen's Python sources and templates."""
    from .render import TEMPLATES

    here = Path(__file__).parent
    h = hashlib.sha256()
    for base, pattern in ((here, "*.py"), (TEMPLATES, "*.j2")):
        for path in sorted(base.rglob(pattern)):
            h.update(str(path.relative_to(base)).encode() + b"\0" + path.read_bytes())
    return h.hexdigest()[:16]


def _folder() -> Path:
    return cache_dir() / "listings"


def _versions() -> str:
    found = []
    for package in ("torch", "torchvision"):
        try:
            found.append(f"{package} {metadata.version(package)}")
        except metadata.PackageNotFoundError:
            found.append(f"no {package}")
    return ", ".join(found)


def _model_path(name: str, batch: int | None, image: int | None) -> Path:
    key = f"{name}\0{batch}\0{image}\0{_versions()}\0{code_hash()}"
    return _folder() / f"model-{hashlib.sha256(key.encode()).hexdigest()[:16]}.txt"


def model_problems(name: str, batch: int | None, image: int | None = None) -> list | None:
    """The problems stored for model ``name`` at ``batch`` (on images of side ``image``
    where given), or None."""
    try:
        lines = _model_path(name, batch, image).read_text(encoding="utf-8").splitlines()
    except OSError:
        return None
    out = []
    for line in lines:
        spec, _, n = line.rpartition(" ")
        out.append(replace(parse_shape(spec), batch=int(n)))
    return out


def store_model_problems(
    name: str, batch: int | None, problems: list, image: int | None = None
) -> None:
    text = "".join(f"{p.spec} {p.batch}\n" for p in problems)
    _store(_model_path(name, batch, image), text.encode())


def _search_key(search: tuple, budget: int | None) -> str:
    p, precision, floor, keep, *named = search
    names = ",".join(v.name for v in keep)
    key = f"{p.spec}|{p.batch}|{precision.value}|{floor}|{names}|{budget}"
    return key + "".join(f"|{n}" for n in named)  # a strategy asked for by name


def _items_path() -> Path:
    return _folder() / f"items-{code_hash()}.jsonl"


def items(searches: list[tuple], budget: int | None) -> dict[tuple, list[tuple[str, str]]]:
    """Of ``searches``, those whose candidates are stored: search -> [(variant, source
    hash)] (none: the planner refused them all)."""
    try:
        text = _items_path().read_text(encoding="utf-8")
    except OSError:
        return {}
    stored = {}
    for line in text.splitlines():
        try:
            entry = json.loads(line)
        except ValueError:  # a line cut short: listed again
            continue
        stored[entry["key"]] = [tuple(pair) for pair in entry["items"]]
    keys = {s: _search_key(s, budget) for s in searches}
    return {s: stored[k] for s, k in keys.items() if k in stored}


def store_items(listed: dict[tuple, list[tuple[str, str]]], budget: int | None) -> None:
    """Add ``listed`` (search -> [(variant, source hash)]) to the stored entries."""
    if not listed:
        return
    path = _items_path()
    try:
        old = path.read_bytes()
    except OSError:
        old = b""
        for stale in _folder().glob("items-*.jsonl"):  # listed by code changed since
            stale.unlink(missing_ok=True)
    old = old[: old.rfind(b"\n") + 1]  # a last line cut short: dropped, listed again
    new = "".join(
        json.dumps(dict(key=_search_key(s, budget), items=pairs)) + "\n"
        for s, pairs in listed.items()
    )
    _store(path, old + new.encode())


def _store(path: Path, data: bytes) -> None:
    """Written whole or not at all; a cache that cannot be written is no error."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, data)
    except OSError:
        pass
