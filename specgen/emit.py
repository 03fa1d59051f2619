"""Generated sources: where each goes and what it holds.  The CLI writes them with
``files.write_if_different``: atomically, and only when the content changed, so that
files that did not change keep their timestamps."""

from __future__ import annotations

from pathlib import Path

from .plan import make_plan
from .render import render
from .shapes import ConvProblem
from .variants import Variant

# Relative: an installed specgen writes into the folder it is run from.
GENERATED = Path("generated")


def source_file(
    shape: ConvProblem, variant: Variant, out: Path = GENERATED, note: str | None = None
) -> tuple[Path, str]:
    """Where the variant's source goes and what it holds."""
    plan = make_plan(shape, variant)
    return out / shape.slug / f"{plan.name}.cu", render(plan, note=note)
