"""``tiled``: the block stages a halo tile of every input channel in shared memory,
then each thread computes its coarsened outputs from it (seed 002)."""

from __future__ import annotations

from dataclasses import dataclass

from ..plan.direct_family import DirectFamily
from ..variants import Choice, Layout, Precision, Weights, param
from .direct import COARSENING, TILE, UNROLL, WEIGHTS

LAYOUT = param(
    Layout.PLANAR,
    Choice(Layout, "layout"),
    "tiled, split: shared tile layout, planar (a plane per channel) or inter "
    "(a pixel's channels side by side)",
)


@dataclass(frozen=True, kw_only=True)
class Tiled(DirectFamily):
    key = "tiled"
    templates = ("direct/conv.cu.j2",)
    description = "direct convolution on a shared-memory halo tile of all input channels"

    tile: int = TILE
    coarsening: tuple[int, int, int] = COARSENING
    layout: Layout = LAYOUT
    weights: Weights = WEIGHTS
    unroll: bool = UNROLL

    @property
    def staging(self) -> Layout:
        return self.layout

    @classmethod
    def seeds(cls):
        """Both layouts, global weights, and fp16 half2 products."""
        return [
            cls(layout=Layout.PLANAR),
            cls(layout=Layout.INTERLEAVED),
            cls(weights=Weights.GLOBAL),
            cls(precision=Precision.FP16),
        ]

    @classmethod
    def variations(cls):
        return [cls(layout=layout) for layout in Layout]
