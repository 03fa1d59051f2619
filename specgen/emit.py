"""Write generated sources: atomically, and only when the content changed, so that
files that did not change keep their timestamps."""

from __future__ import annotations

from pathlib import Path

from .files import write_if_different
from .plan import make_plan
from .render import render
from .shapes import ConvShape
from .variants import Variant

GENERATED = Path(__file__).resolve().parent.parent / "generated"


def emit(
    shape: ConvShape, variant: Variant, out: Path = GENERATED, note: str | None = None
) -> tuple[Path, bool]:
    plan = make_plan(shape, variant)
    path = out / shape.slug / f"{plan.name}.cu"
    return path, write_if_different(path, render(plan, note=note))
