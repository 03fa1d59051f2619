"""The variant model: which strategy, tile, coarsening, layout, weight placement and
precision a kernel uses.  One frozen dataclass; its canonical name is derived from its
fields and is at once the file name, the kernel symbol and part of the cache key.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, replace

from .errors import SpecError
from .shapes import Feature


class Strategy(enum.Enum):
    DIRECT = "direct"  # one thread per output block, loads through the read-only cache
    TILED = "tiled"  # shared-memory halo tile of all C channels
    SPLIT = "split"  # tiled, input channels split over blocks, atomicAdd partial sums
    IM2COL = "im2col"  # explicit unroll kernel + tiled shared-memory GEMM
    IMPLICIT = "implicit"  # fused implicit GEMM, the unrolled matrix never exists
    MMA = "mma"  # fused implicit GEMM on tensor-core fragments (mma.sync)
    MMATILE = "mmatile"  # tensor cores reading a shared-memory band of the input
    PERSIST = "persist"  # persistent blocks, weights resident, maps x row-segment outer products
    MMAPERSIST = "mmapersist"  # persist's pipeline with tensor cores: warps of mma fragments
    STREAM = "stream"  # weights and input streamed by channel chunks, persist's outer products

    @property
    def family(self) -> str:
        """direct: coarsened outputs per thread; gemm: a matrix product; outer: the
        register-tiled outer product of ``persist``, named like the GEMMs by its tile."""
        if self in GEMM_FAMILY:
            return "gemm"
        return "outer" if self in OUTER_FAMILY else "direct"


GEMM_FAMILY = (
    Strategy.IM2COL,
    Strategy.IMPLICIT,
    Strategy.MMA,
    Strategy.MMATILE,
    Strategy.MMAPERSIST,
)
OUTER_FAMILY = (Strategy.PERSIST, Strategy.STREAM)
# The problem features each strategy serves; make_plan refuses the rest in one line,
# so default_set and tune skip a strategy that cannot serve a problem.
GEOMETRY = frozenset(
    {
        Feature.RECT,
        Feature.STRIDE,
        Feature.DILATION,
        Feature.UNEQUAL_PAD,
        Feature.WIDE_PAD,
        Feature.GROUPS,
    }
)
EVERY_FEATURE = frozenset(Feature)
EPILOGUE = frozenset({Feature.BIAS, Feature.ACT})
SERVES = {
    Strategy.DIRECT: EVERY_FEATURE,
    Strategy.TILED: EVERY_FEATURE,
    # atomicAdd sums fp32 partial sums into y: no epilogue, no 16-bit y
    Strategy.SPLIT: GEOMETRY | {Feature.NHWC},
    # mmatile's template applies the epilogue, but with it ptxas spilled the kernel
    # (C=20 M=20 K=3 bias relu: 255 registers and 24 B spilled, 95 without), so it
    # does not serve it until its stores load the bias once per fragment row
    Strategy.MMATILE: frozenset(),
    # the others apply the epilogue to their fp32 NCHW stride-1 sums before the store
    **{
        s: EPILOGUE
        for s in (
            Strategy.IM2COL,
            Strategy.IMPLICIT,
            Strategy.MMA,
            Strategy.PERSIST,
            Strategy.MMAPERSIST,
            Strategy.STREAM,
        )
    },
}
TENSOR_CORE = (Strategy.MMA, Strategy.MMATILE, Strategy.MMAPERSIST)
# Strategies whose name carries no register tile: their fragments are fixed.
FIXED_FRAGMENT = (Strategy.MMA, Strategy.MMATILE)


# The variant options (as the CLI names them) that each strategy's code reads; an
# option a strategy does not read is refused, not ignored.
_SHARED = ("tile", "precision")
_DIRECT = _SHARED + ("coarsening", "weights", "unroll")
OPTIONS = {
    Strategy.DIRECT: _DIRECT,
    Strategy.TILED: _DIRECT + ("layout",),
    Strategy.SPLIT: _DIRECT + ("layout", "splits"),
    Strategy.IM2COL: _SHARED + ("regtile",),
    Strategy.IMPLICIT: _SHARED + ("regtile",),
    Strategy.MMA: _SHARED,
    Strategy.MMATILE: _SHARED,
    Strategy.PERSIST: _SHARED + ("regtile",),
    Strategy.MMAPERSIST: _SHARED + ("regtile",),
    Strategy.STREAM: _SHARED + ("regtile", "maps", "chunk"),
}


class Layout(enum.Enum):
    """How the shared-memory halo tile is laid out (tiled and split only)."""

    NONE = "none"
    PLANAR = "planar"  # xs[c][row][col]: one plane per channel
    INTERLEAVED = "inter"  # xs[row][col][c]: a pixel's channels side by side


class Weights(enum.Enum):
    CONST = "wconst"  # __constant__ array sized M*C*K*K, warp-uniform broadcast
    GLOBAL = "wglobal"  # global memory through the read-only cache


class Precision(enum.Enum):
    FP32 = "fp32"  # fp32 inputs, products and sums: exact fp32 arithmetic
    TF32 = "tf32"  # tensor cores: tf32 inputs, fp32 accumulation
    FP16 = "fp16"  # fp16 inputs (tensor cores) or half2 products (direct family)


def _enum(cls, text: str, what: str):
    for member in cls:
        if text in (member.value, member.name.lower()):
            return member
    choices = ", ".join(m.value for m in cls if m.value != "none")
    raise SpecError(f"unknown {what} '{text}'; choose one of {choices}")


def parse_strategy(text: str) -> Strategy:
    return _enum(Strategy, text, "strategy")


def parse_layout(text: str) -> Layout:
    return _enum(Layout, text, "layout")


def parse_weights(text: str) -> Weights:
    spelled = {"const": "wconst", "global": "wglobal"}
    if spelled.get(text, text) not in {w.value for w in Weights}:
        raise SpecError(f"unknown weights '{text}'; choose const or global")
    return Weights(spelled.get(text, text))


def parse_precision(text: str) -> Precision:
    return _enum(Precision, text, "precision")


_COARSENING = re.compile(r"^x([0-9]{1,9})y([0-9]{1,9})m([0-9]{1,9})$")
_REGTILE = re.compile(r"^([0-9]{1,9})x([0-9]{1,9})$")


def parse_coarsening(text: str) -> tuple[int, int, int]:
    """``x4y2m4``: 4 outputs along the row, 2 rows, 4 output maps per thread."""
    m = _COARSENING.match(text.strip())
    if not m or any(int(g) < 1 for g in m.groups()):
        raise SpecError(
            f"malformed coarsening '{text}'; write xAyBmC with counts of at least 1, for "
            "example x4y1m4 (4 outputs along the row, 1 row, 4 output maps per thread)"
        )
    return tuple(int(g) for g in m.groups())


def parse_regtile(text: str) -> tuple[int, int]:
    """``4x4``: each thread accumulates 4 output maps x 4 pixels in registers."""
    m = _REGTILE.match(text.strip())
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        raise SpecError(
            f"malformed register tile '{text}'; write RxC with both at least 1, for example 4x4"
        )
    return int(m.group(1)), int(m.group(2))


@dataclass(frozen=True)
class Variant:
    strategy: Strategy = Strategy.TILED
    tile: int = 16
    coarsening: tuple[int, int, int] = (1, 1, 1)  # (x, y, maps) outputs per thread
    layout: Layout = Layout.PLANAR
    weights: Weights = Weights.CONST
    precision: Precision = Precision.FP32
    unroll_channels: bool = True
    regtile: tuple[int, int] = (1, 1)  # GEMM family: maps x pixels per thread
    splits: int = 1  # split: how many channel groups
    maps: int = 0  # stream: output maps per block (0 where the strategy has no such field)
    chunk: int = 0  # stream: input channels per pipeline stage (0 likewise)

    @property
    def name(self) -> str:
        """Canonical name: only the fields that shape this strategy's code appear."""
        s = self.strategy
        parts = [s.value, f"t{self.tile}"]
        if s.family == "direct":
            cx, cy, cm = self.coarsening
            parts.append(f"x{cx}y{cy}m{cm}")
            if s is not Strategy.DIRECT:
                parts.append(self.layout.value)
            parts.append(self.weights.value)
            if s is Strategy.SPLIT:
                parts.append(f"s{self.splits}")
            parts.append("uc" if self.unroll_channels else "lc")
        elif s not in FIXED_FRAGMENT:
            if s is Strategy.STREAM:
                parts += [f"m{self.maps}", f"c{self.chunk}"]
            parts.append(f"r{self.regtile[0]}x{self.regtile[1]}")
        parts.append(self.precision.value)
        return "_".join(parts)

    def canonical(self) -> "Variant":
        """The same kernel with the fields its strategy ignores set to their defaults,
        so that two spellings of one kernel compare equal."""
        d = Variant()
        if self.strategy.family != "direct":
            return replace(
                self,
                coarsening=d.coarsening,
                layout=Layout.NONE,
                weights=Weights.GLOBAL,
                unroll_channels=d.unroll_channels,
                splits=1,
                regtile=d.regtile if self.strategy in FIXED_FRAGMENT else self.regtile,
                maps=self.maps if self.strategy is Strategy.STREAM else d.maps,
                chunk=self.chunk if self.strategy is Strategy.STREAM else d.chunk,
            )
        layout = Layout.NONE if self.strategy is Strategy.DIRECT else self.layout
        if self.strategy is not Strategy.DIRECT and layout is Layout.NONE:
            layout = Layout.PLANAR
        splits = self.splits if self.strategy is Strategy.SPLIT else 1
        return replace(
            self, layout=layout, regtile=d.regtile, splits=splits, maps=d.maps, chunk=d.chunk
        )


def parse_variant_name(name: str) -> Variant:
    """Inverse of ``Variant.name``: every generated file name parses back."""
    parts = name.split("_")
    try:
        strategy = parse_strategy(parts[0])
        tile = int(parts[1][1:]) if parts[1].startswith("t") else None
        precision = parse_precision(parts[-1])
        fields = dict(strategy=strategy, tile=tile, precision=precision)
        rest = parts[2:-1]
        if strategy.family == "direct":
            fields["coarsening"] = parse_coarsening(rest.pop(0))
            fields["unroll_channels"] = {"uc": True, "lc": False}[rest.pop()]
            if strategy is Strategy.SPLIT:
                fields["splits"] = int(rest.pop()[1:])
            fields["weights"] = parse_weights(rest.pop())
            fields["layout"] = parse_layout(rest.pop()) if rest else Layout.NONE
        elif strategy not in FIXED_FRAGMENT:
            if strategy is Strategy.STREAM:
                fields["maps"] = int(rest.pop(0)[1:])
                fields["chunk"] = int(rest.pop(0)[1:])
            fields["regtile"] = parse_regtile(rest.pop(0)[1:])
        if tile is None or rest:
            raise ValueError
    except (IndexError, KeyError, ValueError, SpecError):
        raise SpecError(f"malformed variant name '{name}'") from None
    variant = Variant(**fields).canonical()
    if variant.name != name:
        raise SpecError(f"malformed variant name '{name}' (canonical: {variant.name})")
    return variant
