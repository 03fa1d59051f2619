"""``implicit``: a fused implicit GEMM on CUDA cores; each block gathers its tiles of
the unrolled input matrix straight from x, so that matrix never exists (seed 001)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from ..plan.gemm import plan_cuda_core
from ..variants import EVERY_FEATURE, Count, Variant, param
from .persist import REGTILE

GEMM_TILE = param(64, Count("t"), "im2col, implicit, mma: output pixels per block")


@dataclass(frozen=True, kw_only=True)
class Implicit(Variant):
    key = "implicit"
    templates = ("gemm/implicit.cu.j2",)
    family = "gemm"
    description = "fused implicit GEMM: input tiles gathered straight from x, no unrolled matrix"
    serves = EVERY_FEATURE
    explicit = False  # im2col: an unroll kernel writes the matrix first

    tile: int = GEMM_TILE
    regtile: tuple[int, int] = REGTILE

    def plan(self, problem):
        return plan_cuda_core(problem, self, explicit=self.explicit)

    @classmethod
    def seeds(cls):
        """One pixel per thread (the plain kernel) and a 4x4 register tile."""
        return [cls(regtile=(1, 1)), cls(regtile=(4, 4))]

    @classmethod
    def space(cls, problem, precision):
        tiles, regtiles = (32, 64, 128), ((2, 2), (4, 4), (8, 4))
        return [
            cls(tile=t, regtile=r, precision=precision)
            for t, r in itertools.product(tiles, regtiles)
        ]
