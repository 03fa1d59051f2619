"""Write generated sources: atomically, and only when the content changed, so that
files that did not change keep their timestamps."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from .plan import make_plan
from .render import render
from .shapes import ConvShape
from .variants import Variant

GENERATED = Path(__file__).resolve().parent.parent / "generated"


def write_if_different(path: Path, text: str) -> bool:
    """True when the file was (re)written."""
    try:
        if path.read_text() == text:
            return False
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return True


def emit(
    shape: ConvShape, variant: Variant, out: Path = GENERATED, note: str | None = None
) -> tuple[Path, bool]:
    plan = make_plan(shape, variant)
    path = out / shape.slug / f"{plan.name}.cu"
    return path, write_if_different(path, render(plan, note=note))
