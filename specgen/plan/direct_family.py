"""The direct family's shared variant base: ``direct``, ``tiled`` and ``split`` differ
in where a thread's pixels come from, not in what a thread computes, so they share the
planner (``plan/direct.py``) and the defaults here: how many outputs a thread
coarsens, where the weights live, whether the channel loop is unrolled."""

from __future__ import annotations

import itertools
from dataclasses import replace

from ..shapes import ConvProblem
from ..variants import EVERY_FEATURE, Precision, Variant, Weights
from . import first_planned
from .common import divisors
from .direct import UNROLL_CHANNELS_MAX, footprint, plan_direct, unrolled_fmas

# Default unrolled body: big enough for ILP, small enough to compile in seconds.
DEFAULT_FMAS = 1600
# ...and, from shared memory, few enough loads: ptxas hoists an unrolled body's loads
# ahead of its FMAs, so registers grow with them (tiled, a dilated 5x5 window over 4
# channels, 240 pixels for 400 FMAs, took 254 registers and spilled; NVRTC 12.9).  The
# presets' unrolled defaults load at most 70.  direct keeps the unrolled body: its
# channel loop reads constant weights at a run-time index, a register each (C=3 M=4
# K=6 dil 1x2 at x2 m4: 230 registers unrolled, 255 and spills with the loop).
UNROLL_LOADS = 128
# `direct` reads its pixels from global memory, and ptxas hoists a channel's loads
# ahead of its FMAs for latency, so the registers grow with the FMAs per channel
# (cm*K*K*cx) and, with global weights, with the weights a thread reads (cm*K*K).
# Past these it spilled on sm_90 at 255 registers (NVRTC 12.9: C=25 M=14 K=7 pad=1 at
# m7 with global weights; C=27 M=5 K=7 at x4 m5 = 980 FMAs with constant weights,
# 146 registers at x2 m5); layer2's x4 m4 (196 weights, 784 FMAs) takes 96 registers.
# The shared-memory strategies at m7 and m8 did not spill.
GLOBAL_WEIGHTS_PER_CHANNEL = 196
DIRECT_FMAS_PER_CHANNEL = 800
# ...and across the unrolled channels, direct's global loads: 6 channels x 4 rows x 14
# columns (C=18 M=3 groups=3, K=4, stride 3x2, dil 3, bf16 NHWC, x4) spilled at 255
# registers under NVRTC 13 on the H200 (GPU tier, 2026-11-22), where layer1's dgrad view
# (4 x 7 x 10 = 280) fits; with the channel loop kept, each channel's loads come and go.
DIRECT_UNROLL_LOADS = 300
# ...and with global weights, a channel's weights and pixel loads together: a 9x9 window
# at x2 m2 (162 weights and 9 rows x 10 columns) took 255 registers and spilled 24 B
# (C=13 M=30 pad 3, bf16 NCHW; GPU tier's draw, NVRTC 13, 2026-11-24).
GLOBAL_LOADS_PER_CHANNEL = 240
# ...and with spread pixels under a kept channel loop, fewer weighted FMAs a channel
# (default_coarsening says which draw spilled).
SPREAD_LOOPED_FMAS_PER_CHANNEL = 600
TUNE_MAX_FMAS = 3200  # keeps each tune candidate's compile under ~20 s


class DirectFamily(Variant):
    """No fields of its own: each member declares its parameters in name order."""

    family = "direct"
    serves = EVERY_FEATURE
    precisions = (Precision.FP32, Precision.FP16)
    staging = None  # the shared halo tile's Layout; None reads x directly
    channel_splits = 1  # channel groups per image, each a block (split)

    def plan(self, problem: ConvProblem):
        return plan_direct(problem, self)

    @classmethod
    def tiles(cls, problem: ConvProblem) -> tuple[int, ...]:
        """Tiles of 16, 8, 4 no larger than the output needs: a 16x16 tile over a 3x3
        output idles 28 of 32 threads (and on a random 7x7, K=5 shape, ptxas spilled it)."""
        edge = max(problem.Ho, problem.Wo)
        return tuple(t for t in (16, 8, 4) if t // 2 < edge) or (4,)

    @classmethod
    def build(cls, problem, precision, given):
        """Given fields kept; the tile, coarsening, weights and unrolling the others
        imply filled in, in that order (the coarsening depends on the tile)."""
        precision = precision or Precision.FP32
        tile = given.get("tile") or cls.tiles(problem)[0]
        v = cls(tile=tile, precision=precision, **_own(cls, given))
        weights = given.get("weights")
        cz = given.get("coarsening") or default_coarsening(problem, v, weights)
        return complete(problem, replace(v, coarsening=cz), given.get("unroll"), weights)

    @classmethod
    def fit(cls, problem: ConvProblem, v: "DirectFamily") -> "DirectFamily":
        """v at the first of ``tiles`` whose plan fits, with that tile's defaults."""
        weights = None if v.weights is Weights.CONST else v.weights

        def at(tile):
            t = replace(v, tile=tile)
            t = replace(t, coarsening=default_coarsening(problem, t, weights))
            return complete(problem, t, None, weights)

        return first_planned(problem, (at(t) for t in cls.tiles(problem)))

    @classmethod
    def seeds(cls):
        return [cls()]

    @classmethod
    def space(cls, problem, precision):
        """Tiles 8-32, 2-8 outputs along the row, 1-4 rows, map groups up to 24, both
        weight placements; bodies over TUNE_MAX_FMAS and constant weights read at a
        run-time index are left out."""
        maps = [d for d in divisors(problem.Mg) if d <= 24]
        out = []
        for variant in cls.variations():
            for tile, cx, cy, cm, weights in itertools.product(
                (8, 16, 32), (2, 4, 8), (1, 2, 4), maps, tuple(Weights)
            ):
                v = replace(
                    variant,
                    tile=tile,
                    coarsening=(cx, cy, cm),
                    weights=weights,
                    precision=precision,
                )
                v = complete(problem, v, None, weights)
                if unrolled_fmas(problem, v) <= TUNE_MAX_FMAS and not runtime_indexed_constant(
                    problem, v
                ):
                    out.append(v)
        return out

    @classmethod
    def variations(cls) -> list["DirectFamily"]:
        """The member's own axes of the search space (tiled: both layouts)."""
        return [cls()]


def _own(cls, given: dict) -> dict:
    """The given fields that ``build`` does not derive."""
    return {k: v for k, v in given.items() if k not in ("tile", "coarsening", "weights", "unroll")}


def runtime_indexed_constant(problem: ConvProblem, v: DirectFamily) -> bool:
    """Constant weights read at a run-time index (several map groups, or a channel
    loop) were 2-4x slower than global weights on the H200 (2026-11-21, layer2:
    18.6 ms against 4.4 ms); only literal constant offsets are worth timing."""
    if v.weights is not Weights.CONST:
        return False
    return v.coarsening[2] != problem.M or not v.unroll


def default_weights(problem: ConvProblem, asked: Weights | None = None) -> Weights:
    """Constant memory when the weights fit its 64 KiB bank, unless the caller chose."""
    if asked is not None:
        return asked
    return Weights.CONST if 4 * problem.weight_count <= 64 * 1024 else Weights.GLOBAL


def default_coarsening(
    shape: ConvProblem, v: DirectFamily, weights: Weights | None = None
) -> tuple[int, int, int]:
    """(x, 1, maps) outputs per thread: the most outputs (x along the row times maps, a
    divisor of M, at most 16) whose unrolled body stays small enough.  On a tie the
    shared-memory strategies take more along the row, ``direct`` more maps: there a
    map costs a weight (a constant operand) and a pixel along the row a global load
    (mx-layer2, constant weights: x4 m4 spilled at 255 registers, x2 m8 took 127)."""
    kk = shape.R * shape.S
    xs = [c for c in (4, 2, 1) if v.tile % c == 0]
    if v.precision is Precision.FP16:
        xs = [c for c in xs if c % 2 == 0] or [2]
    direct = v.staging is None
    global_weights = direct and default_weights(shape, weights) is Weights.GLOBAL

    def fits(cx: int, cm: int) -> bool:
        if cm > 16 or cm * kk * cx > DEFAULT_FMAS:
            return False
        if global_weights and cm * kk > GLOBAL_WEIGHTS_PER_CHANNEL:
            return False
        if global_weights and cm * kk + shape.R * (cx + shape.S - 1) > GLOBAL_LOADS_PER_CHANNEL:
            return False
        if not direct:
            return True
        # A stride or dilation along W spreads a thread's pixels: each column beyond the
        # dense cx+S-1 costs like the FMAs it feeds (C=3 M=5 K=6x5 stride 1x2 at x4 m5:
        # 11 columns, 255 registers and spills; 140 registers at stride 1).  Spread
        # pixels and a kept channel loop (constant weights at a run-time index, a
        # register each) spilled past 196 weights too (C=4 M=6 K=6 dil 1x2 at x2 m6),
        # and past 196 weighted by the spread (C=6 M=5 K=6 stride 3x2 dil 2x3, bf16
        # NHWC, x2 m5: 180 weights over 12 columns for 7, 72 B spilled under NVRTC 13;
        # GPU tier, 2026-11-24).
        spread = len(footprint(shape, (cx, 1, cm))[1]) / (cx + shape.S - 1)
        # The channel loop as ``complete`` will keep it: for the FMAs or for the loads
        # (C=16 groups=4 M=12 K=7 stride 1x2 dil 1x3 at x2 m3: 392 loads kept the loop,
        # the spread rules below went unasked, and ptxas spilled 16 B at 255 registers;
        # GPU tier's draw, NVRTC 13, 2026-11-29).
        looped = not unrolls(shape, replace(v, coarsening=(cx, 1, cm)))
        if spread > 1 and looped and cm * kk * spread > GLOBAL_WEIGHTS_PER_CHANNEL:
            return False
        # Four columns of a 7x7 window under a kept channel loop spilled at 255
        # registers whatever the channels or bias (x4 m4: C=4 and C=12 M=4, mx-layer2);
        # x2 m4 took 111, x4 m2 40 (NVRTC 12.9).
        if looped and cx >= 4 and kk >= 49:
            return False
        # Spread pixels under a kept channel loop: C=6 M=4 K=6 stride 1x2 dil 2x1 at x4 m4
        # (12 columns for 9, 144 weights, 768 weighted FMAs) took 255 registers and spilled
        # 72 B (bf16 NHWC; GPU tier's draw, NVRTC 13 and 12.9, 2026-11-24).
        if looped and spread > 1:
            return cm * kk * cx * spread <= SPREAD_LOOPED_FMAS_PER_CHANNEL
        return cm * kk * cx * spread <= DIRECT_FMAS_PER_CHANNEL

    best = None
    for cx in xs:
        cm = max(d for d in divisors(shape.Mg) if d == 1 or fits(cx, d))
        if best is None or cx * cm > best[0] * best[1] or (direct and cx * cm == best[0] * best[1]):
            best = (cx, cm)
    return (best[0], 1, best[1])


def complete(
    shape: ConvProblem, v: DirectFamily, unroll: bool | None, weights: Weights | None
) -> DirectFamily:
    """Fill in what depends on the shape: weight placement (constant memory when the
    weights fit, unless the caller chose), unrolling of the channel loop."""
    v = replace(v, weights=default_weights(shape, weights))
    return replace(v, unroll=unrolls(shape, v) if unroll is None else unroll)


def unrolls(shape: ConvProblem, v: DirectFamily) -> bool:
    """Whether the default unrolls v's channel loop: few channels, a small body, and
    few loads in it."""
    cx, cy, cm = v.coarsening
    channels = shape.Cg // v.channel_splits
    body = channels * shape.R * shape.S * cx * cy * cm
    if channels > UNROLL_CHANNELS_MAX or body > DEFAULT_FMAS:
        return False
    rows, cols = footprint(shape, v.coarsening)
    most = UNROLL_LOADS if v.staging is not None else DIRECT_UNROLL_LOADS
    return channels * len(rows) * len(cols) <= most
