"""The variant space: defaults for fields the user leaves out, the default set that
``generated/`` and ``verify --all`` cover, and the search space of ``tune``."""

from __future__ import annotations

from dataclasses import replace

from .errors import SpecError
from .plan import make_plan
from .plan.common import divisors
from .plan.direct import UNROLL_CHANNELS_MAX, footprint
from .shapes import ConvProblem
from .variants import Layout, Precision, Strategy, Variant, Weights

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
# stream's default chunk: the most channels whose FMAs per thread stay within this
# (ae-enc2 8x8: 0.426 / 0.415 / 0.407 / 0.417 ms with 2 / 4 / 8 / 16 channels of 576
# FMAs; ae-dec1 and ae-dec2 alike, H200, 2026-11-21).
STREAM_CHUNK_FMAS = 4608


def default_weights(shape: ConvProblem, asked: Weights | None = None) -> Weights:
    """Constant memory when the weights fit its 64 KiB bank, unless the caller chose."""
    if asked is not None:
        return asked
    return Weights.CONST if 4 * shape.weight_count <= 64 * 1024 else Weights.GLOBAL


def default_coarsening(
    shape: ConvProblem,
    tile: int,
    precision: Precision,
    weights: Weights | None = None,
    strategy: Strategy = Strategy.DIRECT,
) -> tuple:
    """(x, 1, maps) outputs per thread: the most outputs (x along the row times maps, a
    divisor of M, at most 16) whose unrolled body stays small enough.  On a tie the
    shared-memory strategies take more along the row, ``direct`` more maps: there a
    map costs a weight (a constant operand) and a pixel along the row a global load
    (mx-layer2, constant weights: x4 m4 spilled at 255 registers, x2 m8 took 127)."""
    kk = shape.R * shape.S
    xs = [c for c in (4, 2, 1) if tile % c == 0]
    if precision is Precision.FP16:
        xs = [c for c in xs if c % 2 == 0] or [2]
    direct = strategy is Strategy.DIRECT
    global_weights = direct and default_weights(shape, weights) is Weights.GLOBAL

    def fits(cx: int, cm: int) -> bool:
        if cm > 16 or cm * kk * cx > DEFAULT_FMAS:
            return False
        if global_weights and cm * kk > GLOBAL_WEIGHTS_PER_CHANNEL:
            return False
        if not direct:
            return True
        # A stride or dilation along W spreads a thread's pixels: each column beyond the
        # dense cx+S-1 costs like the FMAs it feeds (C=3 M=5 K=6x5 stride 1x2 at x4 m5:
        # 11 columns, 255 registers and spills; 140 registers at stride 1).  Spread
        # pixels and a kept channel loop (constant weights at a run-time index, a
        # register each) spilled past 196 weights too (C=4 M=6 K=6 dil 1x2 at x2 m6).
        spread = len(footprint(shape, (cx, 1, cm))[1]) / (cx + shape.S - 1)
        looped = shape.Cg * cm * kk * cx > DEFAULT_FMAS
        if spread > 1 and looped and cm * kk > GLOBAL_WEIGHTS_PER_CHANNEL:
            return False
        # Four columns of a 7x7 window under a kept channel loop spilled at 255
        # registers whatever the channels or bias (x4 m4: C=4 and C=12 M=4, mx-layer2);
        # x2 m4 took 111, x4 m2 40 (NVRTC 12.9).
        if looped and cx >= 4 and kk >= 49:
            return False
        return cm * kk * cx * spread <= DIRECT_FMAS_PER_CHANNEL

    best = None
    for cx in xs:
        cm = max(d for d in divisors(shape.Mg) if d == 1 or fits(cx, d))
        if best is None or cx * cm > best[0] * best[1] or (direct and cx * cm == best[0] * best[1]):
            best = (cx, cm)
    return (best[0], 1, best[1])


def complete(
    shape: ConvProblem, v: Variant, *, unroll: bool | None = None, weights: Weights | None = None
) -> Variant:
    """Fill in what depends on the shape: weight placement (constant memory when the
    weights fit, unless the caller chose), unrolling of the channel loop."""
    if v.strategy.family == "direct":
        v = replace(v, weights=default_weights(shape, weights))
        if unroll is None:
            cx, cy, cm = v.coarsening
            channels = shape.Cg // v.splits
            body = channels * shape.R * shape.S * cx * cy * cm
            unroll = channels <= UNROLL_CHANNELS_MAX and body <= DEFAULT_FMAS
            if unroll and v.strategy is not Strategy.DIRECT:  # the body is small: cx too
                rows, cols = footprint(shape, v.coarsening)
                unroll = channels * len(rows) * len(cols) <= UNROLL_LOADS
        v = replace(v, unroll_channels=unroll)
    return v.canonical()


def fitting_tile(shape: ConvProblem, v: Variant, choices=(16, 8, 4)) -> Variant:
    """The first tile from ``choices`` whose plan fits; the last error if none does."""
    error = None
    for tile in choices:
        candidate = replace(v, tile=tile)
        if v.strategy.family == "direct":
            weights = None if v.weights is Weights.CONST else v.weights
            cz = default_coarsening(shape, tile, v.precision, weights, v.strategy)
            candidate = complete(shape, replace(candidate, coarsening=cz), weights=weights)
        try:
            make_plan(shape, candidate)
            return candidate
        except SpecError as e:
            error = e
    raise error


def direct_tiles(shape: ConvProblem) -> tuple[int, ...]:
    """Tiles of 16, 8, 4 no larger than the output needs: a 16x16 tile over a 3x3
    output idles 28 of 32 threads (and on a random 7x7, K=5 shape, ptxas spilled it)."""
    edge = max(shape.Ho, shape.Wo)
    fits = tuple(t for t in (16, 8, 4) if t // 2 < edge)
    return fits or (4,)


def _tallest_band(shape: ConvProblem, v: Variant, most: int) -> Variant:
    """v with the tallest band of at most `most` output rows that the planner accepts;
    the planner's error for one row if none is."""
    error = None
    for rows in range(min(shape.Ho, most), 0, -1):
        candidate = replace(v, tile=rows).canonical()
        try:
            make_plan(shape, candidate)
            return candidate
        except SpecError as e:
            error = e
    raise error


def default_persist(shape: ConvProblem) -> Variant:
    """A persist variant without tuning: 4 maps (or fewer) by a row segment of at most
    12 pixels, and the tallest band whose buffers fit in a block of at most 512
    threads (so that ptxas may use 128 registers without spilling)."""
    tm = max(d for d in divisors(shape.M) if d <= 4)
    segs = -(-shape.Wo // 12)  # the fewest row segments of at most 12 pixels
    tx = -(-shape.Wo // segs)
    most = max(1, 512 // (shape.M // tm * segs))
    return _tallest_band(shape, Variant(strategy=Strategy.PERSIST, regtile=(tm, tx)), most)


def default_mmapersist(shape: ConvProblem) -> Variant:
    """An mmapersist variant without tuning: up to 3 map tiles (24 maps) per warp, pixel
    tiles up to 32 accumulators per thread, and the tallest band that fits."""
    nt = min(-(-shape.M // 8), 3)
    p = max(1, min(4, 8 // nt))
    v = Variant(strategy=Strategy.MMAPERSIST, regtile=(8 * nt, 16 * p), precision=Precision.TF32)
    return _tallest_band(shape, v, shape.Ho)


def default_stream(shape: ConvProblem) -> Variant:
    """A stream variant without tuning: 8 maps (or fewer) by a row segment of at most 8
    pixels per thread, up to 128 maps per block, the tallest band that keeps the block
    within 256 threads (two blocks per SM), and chunks of about STREAM_CHUNK_FMAS."""
    tm = max(d for d in divisors(shape.M) if d <= 8)
    bm = max(d for d in divisors(shape.M) if d <= 128 and d % tm == 0)
    segs = -(-shape.Wo // 8)  # the fewest row segments of at most 8 pixels
    tx = -(-shape.Wo // segs)
    per_channel = shape.K * shape.K * tm * tx
    cb = max(d for d in divisors(shape.C) if d == 1 or d * per_channel <= STREAM_CHUNK_FMAS)
    most = max(1, 256 // (bm // tm * segs))
    v = Variant(strategy=Strategy.STREAM, maps=bm, chunk=cb, regtile=(tm, tx))
    return _tallest_band(shape, v, most)


# The defaults of these strategies depend on the shape as a whole, not on a tile.
SHAPE_DEFAULTS = {
    Strategy.PERSIST: default_persist,
    Strategy.MMAPERSIST: default_mmapersist,
    Strategy.STREAM: default_stream,
}


def default_set(shape: ConvProblem) -> list[Variant]:
    """One of each strategy and precision that can serve the shape, and for a preset
    the winners that ``tune`` found on the GPUs of ``SHIPPED_WINNERS``, so that the
    kernels worth reading are in generated/ and covered by ``verify --all``."""
    wanted = [
        Variant(strategy=Strategy.DIRECT),
        Variant(strategy=Strategy.TILED, layout=Layout.PLANAR),
        Variant(strategy=Strategy.TILED, layout=Layout.INTERLEAVED),
        Variant(strategy=Strategy.TILED, weights=Weights.GLOBAL),
        Variant(strategy=Strategy.TILED, precision=Precision.FP16),
        Variant(strategy=Strategy.SPLIT, splits=2),
        Variant(strategy=Strategy.IM2COL, tile=64, regtile=(4, 4)),
        Variant(strategy=Strategy.IMPLICIT, tile=64, regtile=(1, 1)),
        Variant(strategy=Strategy.IMPLICIT, tile=64, regtile=(4, 4)),
        Variant(strategy=Strategy.MMA, tile=64, precision=Precision.TF32),
        Variant(strategy=Strategy.MMA, tile=64, precision=Precision.FP16),
        Variant(strategy=Strategy.MMATILE, tile=shape.Ho, precision=Precision.TF32),
        Variant(strategy=Strategy.PERSIST),
        Variant(strategy=Strategy.STREAM),
        Variant(strategy=Strategy.MMAPERSIST, precision=Precision.TF32),
    ]
    out: list[Variant] = []
    for v in wanted:
        try:
            if v.strategy.family == "direct":
                if v.strategy is Strategy.SPLIT:
                    s = next((d for d in divisors(shape.Cg) if d >= 2 and shape.Cg // d <= 64), 0)
                    if not s:
                        continue  # C=1: nothing to split
                    v = replace(v, splits=s)
                v = fitting_tile(shape, v, choices=direct_tiles(shape))
            elif v.strategy is Strategy.MMATILE:
                v = fitting_tile(shape, v, choices=range(shape.Ho, 0, -1))
            elif v.strategy in SHAPE_DEFAULTS:
                v = SHAPE_DEFAULTS[v.strategy](shape)
            else:
                make_plan(shape, v)
        except SpecError:
            continue  # this strategy cannot serve this shape; the planner said why
        v = v.canonical()
        if v not in out:
            out.append(v)
    from .tune import SHIPPED_WINNERS
    from .variants import parse_variant_name

    for table in SHIPPED_WINNERS.values():
        for name in table.get(shape.slug, []) if shape.name else []:
            v = parse_variant_name(name)
            if v not in out:
                out.append(v)
    return out
