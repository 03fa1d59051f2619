"""``split``: ``tiled`` with the input channels split over blocks, each adding its
partial sums into y with atomicAdd after a kernel zeroes it (seed 002)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import SpecError
from ..plan.common import choices, divisors
from ..plan.direct import plan_direct
from ..plan.direct_family import DirectFamily
from ..variants import GEOMETRY, Count, Layout, Weights, param
from ..shapes import Feature
from .direct import COARSENING, TILE, UNROLL, WEIGHTS
from .tiled import LAYOUT

SPLITS = param(2, Count("s"), "split: how many channel groups, each a block")


@dataclass(frozen=True, kw_only=True)
class Split(DirectFamily):
    key = "split"
    templates = ("direct/conv.cu.j2",)
    description = (
        "tiled direct convolution, input channels split over blocks, atomicAdd of partial sums"
    )
    # atomicAdd sums fp32 partial sums into y, which its first kernel sets to the bias.
    # No block sees a finished sum, so none can apply an activation; 16-bit y has no
    # atomicAdd as fast as fp32's.
    serves = GEOMETRY | {Feature.NHWC, Feature.BIAS}

    tile: int = TILE
    coarsening: tuple[int, int, int] = COARSENING
    layout: Layout = LAYOUT
    weights: Weights = WEIGHTS
    splits: int = SPLITS
    unroll: bool = UNROLL

    @property
    def staging(self) -> Layout:
        return self.layout

    @property
    def channel_splits(self) -> int:
        return self.splits

    def plan(self, problem):
        channels = (
            f"C={problem.C}" if problem.groups == 1 else f"the {problem.Cg} channels of a group"
        )
        if problem.Cg < 2:
            raise SpecError(f"split needs at least 2 input channels to split, {channels}")
        if self.splits < 2 or problem.Cg % self.splits:
            raise SpecError(
                f"split s{self.splits} must divide {channels} into 2 or more groups; "
                f"choose one of {choices(divisors(problem.Cg)[1:])}"
            )
        return plan_direct(problem, self)

    @classmethod
    def fit(cls, problem, v):
        """The fewest channel groups that leave at most 64 channels to each."""
        s = next((d for d in divisors(problem.Cg) if d >= 2 and problem.Cg // d <= 64), 0)
        if not s:
            raise SpecError(f"split needs at least 2 input channels to split, C={problem.C}")
        return super().fit(problem, replace(v, splits=s))

    @classmethod
    def variations(cls):
        return []  # split is in the default set, not in tune's space (nor was it before)
