"""``direct``: one thread per block of outputs, input pixels read from global memory
through the read-only cache (seed 002's baseline, coarsened)."""

from __future__ import annotations

from dataclasses import dataclass

from ..plan.direct_family import DirectFamily
from ..variants import Coarsening, Choice, Count, Switch, Weights, param

TILE = param(16, Count("t"), "direct family: output tile edge (a block covers tile x tile)")
COARSENING = param(
    (1, 1, 1),
    Coarsening(),
    "direct family: outputs per thread xAyBmC (along the row, rows, output maps)",
)
WEIGHTS = param(
    Weights.CONST,
    Choice(Weights, "weights", (("const", "wconst"), ("global", "wglobal"))),
    "direct family: weights in constant memory (const) or global memory (global)",
)
UNROLL = param(
    True,
    Switch("uc", "lc", ("unroll-channels", "loop-channels")),
    "direct family: unroll the loop over input channels or keep it",
)


@dataclass(frozen=True, kw_only=True)
class Direct(DirectFamily):
    key = "direct"
    templates = ("direct/conv.cu.j2",)
    description = "direct convolution, input pixels read from global memory"

    tile: int = TILE
    coarsening: tuple[int, int, int] = COARSENING
    weights: Weights = WEIGHTS
    unroll: bool = UNROLL
