"""``persist``: persistent blocks, each thread an outer product.

The direct family reloads its weights for every tile and, when they live in constant
memory, serializes a warp on every distinct address.  Here a block is resident for the
whole launch: it stages all M*C*K*K weights in shared memory once, transposed so that
one thread's TM maps of one tap are adjacent (one 16-byte load), then walks the work
items (image, band of R output rows) that the grid stride gives it.  Each item's input
band is copied with ``cp.async`` into one of two buffers while the other is computed.

A thread owns TM output maps x TX neighbouring pixels of one output row.  Per input
channel and window row it loads TX+K-1 pixels into registers once; every tap of the
row is then TM weights x TX pixels = TM*TX FMAs from registers.  With TM=4, TX=17 that
is 23 + 7 shared loads for 476 FMAs, so the FMA pipe, not shared memory, is the limit.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from ..errors import SpecError
from ..shapes import ConvProblem, DType, Feature, TensorLayout
from ..plan import tallest, tallest_planned
from ..variants import EPILOGUE, Count, Pair, Variant, param
from ..plan.common import (
    MAX_THREADS,
    OPTIN_SMEM_BYTES,
    Plan,
    Size,
    band_walk_plan,
    bank_conflict_degree,
    ceil_div,
    check_threads,
    choices,
    divisors,
    launch_bounds,
    shape_context,
)

MAX_ACCUMULATORS = 128  # TM*TX fp32 accumulators; past this ptxas spills at 255 registers
# The KxK taps are emitted as straight-line code up to this many FMAs per channel;
# beyond, the window rows become a loop (NVRTC's time grows with the square of the body).
MAX_WINDOW_FMAS = 2048


VECTOR_TYPES = {4: "float4", 2: "float2", 1: "float"}


def _loader(n: int, vec: int) -> dict:
    """n floats into registers, vec at a time (one vector load each)."""
    return dict(n=n, vec=vec, type=VECTOR_TYPES[vec], count=n // vec, fields="xyzw"[:vec])


def _vector(tx: int) -> int:
    """Floats per shared load of an input row: a segment starts at a multiple of TX."""
    return next(n for n in (4, 2, 1) if tx % n == 0)


def _row_stride(iw: int, rows: int, segs: int, tx: int) -> tuple[int, int]:
    """(stride, conflict degree): the smallest pad of an input row, at most 7 floats
    and keeping rows aligned for vector loads, that gives the first warp's first load
    of the compute loop the fewest bank conflicts.  Input loads are a few percent of
    the shared traffic, so a larger pad would cost more (two bands of it) than the
    conflicts it saves."""
    lanes = [(t % (rows * segs)) for t in range(32)]
    best = None
    for pad in range(8):
        stride = iw + pad
        if stride % _vector(tx):
            continue
        addrs = [r // segs * stride + r % segs * tx for r in lanes]
        degree = bank_conflict_degree(addrs)
        if best is None or degree < best[1]:
            best = (stride, degree)
    return best


def outer_context(
    K: int,
    tm: int,
    tx: int,
    maps_vec: int,
    stride: int,
    map_stride: int,
    rows: int,
    segs: int,
    groups: int,
) -> dict:
    """What templates/common/outer.j2 and the compute loop of persist and stream need:
    the register tile, its loaders, and the unrolled window (input row offsets in the
    band, and each tap's offset in a weight layout with `map_stride` floats per tap)."""
    in_vec = _vector(tx)
    nv = ceil_div(tx + K - 1, in_vec) * in_vec
    threads = groups * rows * segs
    window = [
        dict(
            ky=ky,
            x_off=ky * stride,
            taps=[dict(kx=kx, w_off=(ky * K + kx) * map_stride) for kx in range(K)],
        )
        for ky in range(K)
    ]
    return dict(
        tm=tm,
        tx=tx,
        npix=tx + K - 1,
        nv=nv,
        row_load=_loader(nv, in_vec),
        maps_load=_loader(tm, maps_vec),
        window=window,
        w_row_step=K * map_stride,
        groups=groups,
        segs=segs,
        rows=rows,
        threads=threads,
        row_threads=rows * segs,
        **launch_bounds(threads),
    )


def plan_persist(shape: ConvProblem, v: Variant) -> Plan:
    C, M, H, K, pad = shape.C, shape.M, shape.H, shape.K, shape.pad
    Ho, Wo, KK = shape.Ho, shape.Wo, K * K
    rows = v.tile
    tm, tx = v.regtile
    if rows < 1 or rows > Ho:
        raise SpecError(f"persist's tile is a band of output rows, 1 to Ho={Ho}; got {rows}")
    if tm < 1 or M % tm:
        raise SpecError(
            f"register tile maps {tm} must divide M={M}; choose one of {choices(divisors(M))}"
        )
    if tx < 1 or tx > Wo:
        raise SpecError(f"register tile pixels {tx} must be 1 to Wo={Wo}")
    if tm * tx > MAX_ACCUMULATORS:
        raise SpecError(
            f"register tile {tm}x{tx} = {tm * tx} accumulators per thread, over "
            f"{MAX_ACCUMULATORS} (the rest of the kernel needs registers too); "
            "choose fewer maps or pixels"
        )
    groups = M // tm
    segs = ceil_div(Wo, tx)
    threads = groups * rows * segs
    most = MAX_THREADS // (groups * segs)
    check_threads(
        (threads, 1, 1),
        f"{groups} map groups x {rows} rows x {segs} row segments; "
        + (f"choose --tile {most} or fewer" if most else "choose a larger register tile"),
    )
    iw = segs * tx + K - 1  # staged columns: every segment's window, zeros past the edge
    wn = M * C * KK
    # Outputs leave through shared memory, one map of every group per round, so that
    # the global stores are whole rows (a thread's own pixels are TX apart from its
    # neighbour's).  Two round buffers: one barrier per round.  (All maps in one round
    # measured no faster on layer2, 2026-11-21, and needs far more shared memory.)
    out_vec = next(n for n in (4, 2, 1) if (Ho * Wo) % n == 0 and (rows * Wo) % n == 0)
    # 16-bit or NHWC outputs: each thread stores its own, converted, without the rounds.
    direct_store = shape.dtype is not DType.FP32 or shape.layout is TensorLayout.NHWC

    def layout(r: int) -> dict:
        """Shared memory for bands of r rows: weights, two bands, two output rounds,
        each 16-byte aligned for vector reads."""
        stride, degree = _row_stride(iw, r, segs, tx)
        band = C * (r + K - 1) * stride
        bands_at = ceil_div(wn, 4) * 4
        out_at = ceil_div(bands_at + 2 * band, 4) * 4
        scratch = 0 if direct_store else groups * r * Wo
        return dict(
            stride=stride,
            degree=degree,
            band=band,
            bands_at=bands_at,
            out_at=out_at,
            scratch=scratch,
            nbytes=4 * (out_at + 2 * scratch),
        )

    lay = layout(rows)
    nbytes, band, scratch = lay["nbytes"], lay["band"], lay["scratch"]
    stride, degree = lay["stride"], lay["degree"]
    ih = rows + K - 1
    if nbytes > OPTIN_SMEM_BYTES:
        fit = tallest(rows - 1, lambda r: layout(r)["nbytes"] <= OPTIN_SMEM_BYTES)
        hint = f"choose --tile {fit}" if fit else "use --strategy tiled or implicit"
        raise SpecError(
            f"persist needs {nbytes} bytes of shared memory (weights {4 * wn} B + two "
            f"bands of {4 * band} B + two output rounds of {4 * scratch} B), over the "
            f"sm_90 limit of {OPTIN_SMEM_BYTES} bytes per block; {hint}"
        )
    vec = next(n for n in (4, 2, 1) if tm % n == 0 and M % n == 0)
    bands_per_image = ceil_div(Ho, rows)
    unroll_window = KK * tm * tx <= MAX_WINDOW_FMAS

    sizes = [
        Size("output", f"{M} x {Ho} x {Wo}", f"Ho = H + 2*pad - K + 1 = {H}+{2 * pad}-{K}+1"),
        Size("reduction", f"{C * KK}", f"C*K*K = {C}*{KK} multiply-adds per output"),
        Size(
            "thread",
            f"{tm} x {tx} acc + {tx + K - 1} inputs",
            f"register tile: {tm} maps x {tx} pixels, and the TX+K-1 = {tx}+{K}-1 inputs of a row",
        ),
        Size(
            "block",
            f"{threads} threads",
            f"{groups} map groups x {rows} rows x {segs} segments of {tx} "
            f"({segs * tx - Wo} pixel(s) past the edge)",
        ),
        Size(
            "work item",
            f"{rows} output rows, {bands_per_image} per image",
            f"blocks stride over B*{bands_per_image} items; the grid is what fits on the device",
        ),
        Size(
            "smem weights",
            f"{4 * wn} B [{C}][{K}][{K}][{M}]",
            f"M*C*K*K, staged once per block, maps innermost ({vec} per load)",
        ),
        Size(
            "smem bands",
            f"2 x {4 * band} B [{C}][{ih}][{stride}]",
            f"C x (rows+K-1) x (segments*TX+K-1 = {iw}, padded to {stride}: "
            f"{degree}-way bank conflicts at worst), double-buffered",
        ),
    ]
    if not direct_store:
        sizes.append(
            Size(
                "smem out",
                f"2 x {4 * scratch} B [{groups}][{rows}][{Wo}]",
                f"map m of each of the {groups} groups per round, {tm} rounds, "
                f"stored {out_vec} float(s) at a time",
            )
        )
    ctx = dict(
        shape_context(shape),
        **lay,
        **outer_context(K, tm, tx, vec, stride, M, rows, segs, groups),
        iw=iw,
        ih=ih,
        stage_channels=C,
        stage_rows=ih,
        plane=ih * stride,
        band_total=C * ih * iw,
        band_pixels=ih * iw,
        wn=wn,
        w_channel=KK * M,
        bands_per_image=bands_per_image,
        smem_bytes=nbytes,
        unroll_window=unroll_window,
        guard_rows=Ho % rows != 0,
        guard_cols=segs * tx != Wo,
        direct_store=direct_store,
        out_vec=out_vec,
        out_type=VECTOR_TYPES[out_vec],
        out_vecs=scratch // out_vec,
        row_vecs=rows * Wo // out_vec,
        group_out=tm * Ho * Wo,
        out_steps=ceil_div(scratch // out_vec, threads),
        out_tail=(scratch // out_vec) % threads != 0,
    )
    return band_walk_plan(
        shape, v, "direct/persist.cu.j2", threads, bands_per_image, nbytes, sizes, ctx
    )


BAND = param(8, Count("t"), "persist, mmapersist, stream, mmatile: output rows per band")
REGTILE = param(
    (4, 4), Pair("r"), "register tile RxC: output maps x pixels per thread (mmapersist: per warp)"
)


def even_segments(width: int, most: int) -> set[int]:
    """Segment lengths of at most ``most`` pixels that split a row of ``width`` into
    ceil(width / segments) pieces: tx is one when ceil(width / ceil(width / tx)) == tx."""
    return {tx for tx in range(1, min(most, width) + 1) if -(-width // -(-width // tx)) == tx}


def tallest_band(problem: ConvProblem, v: Variant, most: int) -> Variant:
    """v with the tallest band of at most ``most`` output rows that the planner accepts."""
    return tallest_planned(problem, lambda r: replace(v, tile=r), min(problem.Ho, most))


@dataclass(frozen=True, kw_only=True)
class Persist(Variant):
    key = "persist"
    templates = ("direct/persist.cu.j2",)
    family = "outer"
    description = (
        "persistent blocks: weights resident in shared memory, input bands double-buffered "
        "with cp.async, each thread an outer product of maps x a row segment"
    )
    serves = EPILOGUE | {Feature.DTYPE16, Feature.NHWC}

    tile: int = BAND
    regtile: tuple[int, int] = REGTILE

    def plan(self, problem):
        return plan_persist(problem, self)

    @classmethod
    def fit(cls, problem, seed):
        """4 maps (or fewer) by a row segment of at most 12 pixels, and the tallest band
        whose buffers fit in a block of at most 512 threads (so that ptxas may use 128
        registers without spilling), 256 for 16-bit tensors: their widening copies
        need a few more (C=1 M=18 7x7 fp16 spilled 350 bytes at 504 threads, where fp32
        took 122 registers; a GPU-tier draw, 2026-11-23)."""
        tm = max(d for d in divisors(problem.M) if d <= 4)
        segs = -(-problem.Wo // 12)  # the fewest row segments of at most 12 pixels
        tx = -(-problem.Wo // segs)
        threads = 512 if problem.dtype is DType.FP32 else 256
        most = max(1, threads // (problem.M // tm * segs))
        return tallest_band(problem, cls(regtile=(tm, tx), precision=seed.precision), most)

    @classmethod
    def space(cls, problem, precision):
        """Register tiles of up to 16 maps by row segments that waste at most a sixth
        of a row, and bands of Ho/k rows."""
        maps = [d for d in divisors(problem.M) if d <= 16]
        even = even_segments(problem.Wo, 34)
        even |= {-(-tx // 4) * 4 for tx in even}  # whole float4 loads of a row
        Wo = problem.Wo
        pixels = sorted(
            (tx for tx in even if 3 <= tx <= min(34, Wo) and -(-Wo // tx) * tx - Wo <= Wo / 6),
            reverse=True,
        )
        rows = sorted({-(-problem.Ho // k) for k in (1, 2, 3, 4, 6, 8, 12)}, reverse=True)
        out = []
        for tm, tx, r in itertools.product(maps, pixels, rows):
            threads = problem.M // tm * r * -(-Wo // tx)
            if tm * tx <= MAX_ACCUMULATORS and 64 <= threads <= 1024 and tm * tx >= 16:
                out.append(cls(tile=r, regtile=(tm, tx), precision=precision))
        return out
