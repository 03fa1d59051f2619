"""``stream``: persist's outer products for layers too wide to keep resident.

``persist`` holds all M*C*K*K weights in shared memory, which the autoencoder's middle
layers (128-256 channels, 0.6-1.2 MB of weights) cannot.  Here a block owns BM output
maps of one band of R output rows of one image, and streams the reduction through
shared memory a chunk of CB input channels at a time: the chunk's weights (BM maps x
CB*K*K taps, from a copy of w transposed on the host to [C][K][K][M], 16-byte
``cp.async``) and its input band (CB x (R+K-1) rows with the halo, zero outside the
image, 4-byte ``cp.async``).  Two chunk buffers: chunk k+1 is in flight while chunk k
is computed, one barrier per chunk.

A thread owns TM maps x TX neighbouring pixels of one output row, as in persist: per
channel and window row it loads TX+K-1 pixels once and every tap is TM*TX FMAs from
registers.  At 8 x 8 and K=3 that is 3 + 6 sixteen-byte shared loads per 192 FMAs.
The accumulators stay in registers for the whole reduction and are stored once.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from ..errors import SpecError
from ..shapes import ConvProblem, DType, Feature, TensorLayout
from ..tensors import Role
from ..variants import EPILOGUE, Count, Variant, param
from ..plan.common import (
    y_args,
    MAX_THREADS,
    OPTIN_SMEM_BYTES,
    Launch,
    Plan,
    Size,
    ceil_div,
    check_threads,
    choices,
    divisors,
    shape_context,
)
from .persist import (
    BAND,
    MAX_ACCUMULATORS,
    MAX_WINDOW_FMAS,
    REGTILE,
    VECTOR_TYPES,
    _row_stride,
    even_segments,
    outer_context,
    tallest_band,
)

# The channel loop of a chunk is straight-line code up to this many FMAs per thread.
# Longer bodies overflow the instruction cache: ae-enc2's 8x8 tile with whole chunks
# of 4 / 8 / 16 channels unrolled took 0.438 / 0.586 / 1.015 ms, and 0.407 with chunks
# of 8 unrolled 2 at a time (H200, 2026-11-21).  Shorter ones starve small blocks of
# ILP: ae-dec3's 3x8 tile (216 FMAs per channel, one 4-warp block per SM) took 0.174
# ms with 8 channels unrolled and 0.255 with 4.
UNROLL_FMAS = 2048
UNROLL_LOADS = 480
# ... and at most this many channels: 1x1 layers' short bodies let 24 and 32 channels
# through both limits, and every such default of C=24-32 channels into 24-512 maps
# over 7x7 to 56x56 spilled 696-1944 bytes at 255 registers (NVRTC, sm_90a), where 12
# and 16 took 128 without a spill (googlenet's and mnasnet's fp32 dgrads, 2026-11-28).
UNROLL_CHANNELS = 16
# A thread keeps the addresses of its band pixels in registers (two per pixel) up to
# this many pixels; past it (small blocks over wide bands: layer1's 250 threads over
# 31 x 82 pixels spilled) it recomputes them for every chunk.
FIXED_SLOTS = 4
UNROLLED_COPIES = 16  # weight copies per thread and chunk emitted as straight-line code
# The fit's chunk: at most this many weight copies per thread.  A block of 4 threads
# (28 maps of 1x1 pixels: efficientnet_b0's squeeze layers) over 336 channels made 588
# and spilled 3896 bytes at 255 registers; 84 (48 channels) took 168 without a spill.
COPY_SLOTS = 96
# The default chunk: the most channels whose FMAs per thread stay within this
# (ae-enc2 8x8: 0.426 / 0.415 / 0.407 / 0.417 ms with 2 / 4 / 8 / 16 channels of 576
# FMAs; ae-dec1 and ae-dec2 alike, H200, 2026-11-21).
CHUNK_FMAS = 4608


def plan_stream(shape: ConvProblem, v: Variant) -> Plan:
    C, M, H, W, K, pad = shape.C, shape.M, shape.H, shape.W, shape.K, shape.pad
    Ho, Wo, KK = shape.Ho, shape.Wo, K * K
    rows, bm, cb = v.tile, v.maps, v.chunk
    tm, tx = v.regtile
    if rows < 1 or rows > Ho:
        raise SpecError(f"stream's tile is a band of output rows, 1 to Ho={Ho}; got {rows}")
    if bm < 1 or M % bm:
        raise SpecError(
            f"maps per block {bm} must divide M={M}; choose one of {choices(divisors(M))}"
        )
    if tm < 1 or bm % tm:
        raise SpecError(
            f"register tile maps {tm} must divide the block's {bm} maps; "
            f"choose one of {choices(divisors(bm))}"
        )
    if tx < 1 or tx > Wo:
        raise SpecError(f"register tile pixels {tx} must be 1 to Wo={Wo}")
    if cb < 1 or C % cb:
        raise SpecError(
            f"chunk of {cb} channels must divide C={C}; choose one of {choices(divisors(C))}"
        )
    if tm * tx > MAX_ACCUMULATORS:
        raise SpecError(
            f"register tile {tm}x{tx} = {tm * tx} accumulators per thread, over "
            f"{MAX_ACCUMULATORS} (the rest of the kernel needs registers too); "
            "choose fewer maps or pixels"
        )
    groups = bm // tm
    segs = ceil_div(Wo, tx)
    threads = groups * rows * segs
    most = MAX_THREADS // (groups * segs)
    check_threads(
        (threads, 1, 1),
        f"{groups} map groups x {rows} rows x {segs} row segments; "
        + (f"choose --tile {most} or fewer" if most else "choose fewer --maps per block"),
    )
    chunks = C // cb
    iw = segs * tx + K - 1  # staged columns: every segment's window, zeros past the edge
    ih = rows + K - 1
    stride, degree = _row_stride(iw, rows, segs, tx)
    band = cb * ih * stride
    wchunk = cb * KK * bm
    bands_at = ceil_div(2 * wchunk, 4) * 4
    nbytes = 4 * (bands_at + 2 * band)
    if nbytes > OPTIN_SMEM_BYTES:
        raise SpecError(
            f"stream needs {nbytes} bytes of shared memory (two chunks of {cb} channel(s): "
            f"weights {4 * wchunk} B + band {4 * band} B each), over the sm_90 limit of "
            f"{OPTIN_SMEM_BYTES} bytes per block; choose a smaller --chunk, fewer --maps "
            "or a smaller --tile"
        )
    map_blocks = M // bm
    bands_per_image = ceil_div(Ho, rows)
    maps_vec = next(n for n in (4, 2, 1) if tm % n == 0)
    w_vec = 4 if bm % 4 == 0 and M % 4 == 0 else 1  # 16-byte copies need aligned map runs
    # Weight copies: w_row_copies runs of w_vec floats per tap of the chunk.  When the
    # block's threads are a multiple of the runs, a thread keeps its run for good and
    # steps through the taps (one base address, literal offsets); otherwise it walks
    # the chunk's copies with a stride of the block.
    w_row_copies = bm // w_vec
    w_regular = threads % w_row_copies == 0
    w_tap_step = threads // w_row_copies if w_regular else 0
    w_copies = cb * KK * w_row_copies
    w_slots = ceil_div(cb * KK, w_tap_step) if w_regular else ceil_div(w_copies, threads)
    band_slots = ceil_div(ih * iw, threads)
    out_vec = next(n for n in (4, 2, 1) if tx % n == 0 and Wo % n == 0)
    guard_cols = segs * tx != Wo
    if guard_cols or shape.dtype is not DType.FP32 or shape.layout is TensorLayout.NHWC:
        out_vec = 1  # vector stores of whole fp32 rows only
    per_channel = KK * tm * tx
    # Channels of the chunk unrolled together: the most (a divisor of the chunk) within
    # UNROLL_FMAS.  Blocks under a warp keep the loop: with the chunk unrolled they
    # spilled at 255 registers (C=5 M=6 K=5, 6 threads, NVRTC 12.9; 48 with the loop).
    # ... and within UNROLL_LOADS shared loads (a row's TX+K-1 inputs per window row and
    # the tile's weights per channel): a 1x5 tile unrolled over 8 channels of a 5x5
    # window (560 loads, 1000 FMAs) spilled at 255 registers, over 4 it took 48;
    # ae-dec3's 3x8 tile over 8 channels (456 loads) is the fast one above.
    loads = K * (tx + K - 1) + ceil_div(tm * KK, 4 if tm % 4 == 0 else 1)
    unroll = max(
        d
        for d in divisors(cb)
        if d == 1
        or (d * per_channel <= UNROLL_FMAS and d * loads <= UNROLL_LOADS and d <= UNROLL_CHANNELS)
    )
    if threads < 32:
        unroll = 1
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
            f"{threads} threads, {bm} maps",
            f"{groups} map groups x {rows} rows x {segs} segments of {tx} "
            f"({segs * tx - Wo} pixel(s) past the edge)",
        ),
        Size(
            "grid",
            f"B x {bands_per_image} x {map_blocks} blocks",
            f"image x band of {rows} rows (Ho = {Ho}) x map block of {bm} (M = {M})",
        ),
        Size(
            "chunk",
            f"{cb} channel(s), {chunks} per output",
            f"{cb * per_channel} FMAs per thread between barriers; {unroll} channel(s) "
            f"unrolled together ({unroll * per_channel} FMAs of straight-line code)",
        ),
        Size(
            "smem weights",
            f"2 x {4 * wchunk} B [{cb}][{K}][{K}][{bm}]",
            f"the chunk's taps of the block's maps, maps innermost ({maps_vec} per load), "
            f"from w transposed to [C][K][K][M] on the host",
        ),
        Size(
            "smem bands",
            f"2 x {4 * band} B [{cb}][{ih}][{stride}]",
            f"chunk x (rows+K-1) x (segments*TX+K-1 = {iw}, padded to {stride}: "
            f"{degree}-way bank conflicts at worst)",
        ),
    ]
    ctx = dict(
        shape_context(shape),
        **outer_context(K, tm, tx, maps_vec, stride, bm, rows, segs, groups),
        bm=bm,
        map_blocks=map_blocks,
        cb=cb,
        chunks=chunks,
        iw=iw,
        ih=ih,
        stride=stride,
        plane=ih * stride,
        band=band,
        band_pixels=ih * iw,
        wchunk=wchunk,
        bands_at=bands_at,
        w_vec=w_vec,
        w_row_copies=w_row_copies,
        w_regular=w_regular,
        w_tap_step=w_tap_step,
        w_copies=w_copies,
        w_slots=w_slots,
        w_tail=w_slots * w_tap_step != cb * KK if w_regular else w_slots * threads != w_copies,
        band_slots=band_slots,
        band_fixed=band_slots <= FIXED_SLOTS,
        w_unroll=w_slots <= UNROLLED_COPIES,
        band_tail=band_slots * threads != ih * iw,
        w_chunk_stride=cb * KK * M,
        x_chunk_stride=cb * (1 if shape.layout is TensorLayout.NHWC else H * W),
        chunk_taps=cb * KK,
        w_channel=KK * bm,
        bands_per_image=bands_per_image,
        smem_bytes=nbytes,
        unroll=unroll,
        unroll_window=unroll_window,
        guard_rows=Ho % rows != 0,
        guard_cols=guard_cols,
        out_vec=out_vec,
        out_type=VECTOR_TYPES[out_vec],
    )
    launch = Launch(
        v.kernel_name(shape),
        (Role.X, Role.W, *y_args(shape), Role.BATCH),
        (threads, 1, 1),
        (0, 1, 1),
        0,
        bands_per_image * map_blocks,
        1,
        nbytes,
    )
    return Plan(
        shape=shape,
        variant=v,
        template="direct/stream.cu.j2",
        launches=(launch,),
        static_smem=0,
        dynamic_smem=nbytes,
        const_bytes=0,
        weight_format="ckkm",
        sizes=tuple(sizes),
        context=ctx,
    )


@dataclass(frozen=True, kw_only=True)
class Stream(Variant):
    key = "stream"
    templates = ("direct/stream.cu.j2",)
    family = "outer"
    description = (
        "weights and input bands streamed through shared memory a chunk of channels at a "
        "time (cp.async, double-buffered), each thread an outer product of maps x a row segment"
    )
    serves = EPILOGUE | {Feature.DTYPE16, Feature.NHWC}

    tile: int = BAND
    maps: int = param(128, Count("m"), "stream: output maps per block")
    chunk: int = param(8, Count("c"), "stream: input channels per pipeline stage")
    regtile: tuple[int, int] = REGTILE

    def plan(self, problem):
        return plan_stream(problem, self)

    @classmethod
    def fit(cls, problem, seed):
        """8 maps (or fewer) by a row segment of at most 8 pixels per thread, up to 128
        maps per block, the tallest band that keeps the block within 256 threads (two
        blocks per SM), and chunks of about CHUNK_FMAS."""
        M = problem.M
        if problem.layout is TensorLayout.NHWC and problem.C < 8 and M % 16 == 0:
            # A few channels in NHWC: 2 maps by 16 pixels a thread, 16 maps and 4 rows a
            # block, one channel a stage.  The tune of the autoencoder's first layer (3
            # channels, 256 maps, 32x32, B=128, H200) found it at 0.118 ms, where the
            # rule below gives 0.350 (m128, c3, 8x8 a thread).
            segs = -(-problem.Wo // 16)
            v = cls(maps=16, chunk=1, regtile=(2, -(-problem.Wo // segs)), precision=seed.precision)
            return tallest_band(problem, v, 4)
        tm = max(d for d in divisors(M) if d <= 8)
        bm = max(d for d in divisors(M) if d <= 128 and d % tm == 0)
        segs = -(-problem.Wo // 8)  # the fewest row segments of at most 8 pixels
        tx = -(-problem.Wo // segs)
        per_channel = problem.R * problem.S * tm * tx
        # One map a thread of many (M with no divisor from 2 to 8, a prime such as 29):
        # one channel a chunk.  With 5 channels of 5x5 taps unrolled, C=5 M=29 spilled
        # 568 bytes (NVRTC 12 and 13; a GPU-tier draw, 2026-11-23).
        cb = max(
            d
            for d in divisors(problem.C)
            if d == 1 or (d * per_channel <= CHUNK_FMAS and (tm > 1 or M <= 8))
        )
        most = max(1, 256 // (bm // tm * segs))
        v = tallest_band(
            problem, cls(maps=bm, chunk=cb, regtile=(tm, tx), precision=seed.precision), most
        )
        for d in sorted(divisors(cb), reverse=True):  # the widest chunk within COPY_SLOTS
            try:
                if plan_stream(problem, replace(v, chunk=d)).context["w_slots"] <= COPY_SLOTS:
                    return replace(v, chunk=d)
            except SpecError:
                continue
        return v

    @classmethod
    def space(cls, problem, precision):
        """Register tiles of 32 to 128 accumulators (or all M maps by at least 8
        pixels), up to 16 maps by row segments of up to 16 pixels that waste at most a
        sixth of a row; 4 to 32 map groups per block (or all of M); bands of Ho/k rows;
        64 to 512 threads; chunks of 1152 to 9216 FMAs per thread."""
        M, Wo, Ho, KK = problem.M, problem.Wo, problem.Ho, problem.R * problem.S
        even = even_segments(Wo, 16)
        even |= {-(-tx // 4) * 4 for tx in even}
        pixels = [
            tx for tx in sorted(even) if 4 <= tx <= min(16, Wo) and -(-Wo // tx) * tx - Wo <= Wo / 6
        ]
        rows = sorted({-(-Ho // k) for k in (1, 2, 3, 4, 6, 8)}, reverse=True)
        channel_divisors = divisors(problem.C)
        out = []
        for tm in (d for d in divisors(M) if d <= 16):
            blocks = {
                bm
                for bm in range(tm, M + 1, tm)
                if M % bm == 0 and (bm // tm in (4, 8, 16, 32) or bm == M)
            }
            for bm, tx, r in itertools.product(sorted(blocks), pixels, rows):
                threads = bm // tm * r * -(-Wo // tx)
                big = 32 <= tm * tx <= MAX_ACCUMULATORS or (tm == M and tx >= 8)
                if not (big and 64 <= threads <= 512):
                    continue
                per_channel = KK * tm * tx
                chunks = [
                    d for d in channel_divisors if 1152 <= d * per_channel <= 9216
                ] or channel_divisors[:1]
                for cb in chunks:
                    out.append(
                        cls(tile=r, maps=bm, chunk=cb, regtile=(tm, tx), precision=precision)
                    )
        return out
