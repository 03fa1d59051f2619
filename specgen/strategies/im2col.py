"""``im2col``: an unroll kernel writes the (C*K*K) x (Ho*Wo) matrix of each image to
a workspace, then ``implicit``'s tiled GEMM multiplies it (seed 001's first step)."""

from __future__ import annotations

from dataclasses import dataclass

from ..variants import EPILOGUE
from .implicit import Implicit


@dataclass(frozen=True, kw_only=True)
class Im2col(Implicit):
    key = "im2col"
    templates = ("gemm/im2col.cu.j2",)
    description = (
        "explicit im2col: an unroll kernel writes the (C*K*K) x (Ho*Wo) matrix, "
        "a tiled GEMM multiplies"
    )
    explicit = True
    # its unroll kernel reads fp32 NCHW x at stride 1 with a square window
    serves = EPILOGUE

    @classmethod
    def seeds(cls):
        return [cls(regtile=(4, 4))]
