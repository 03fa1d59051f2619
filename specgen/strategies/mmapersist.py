"""``mmapersist``: persist's pipeline feeding tensor cores.

``mmatile`` stages one band per block and exits; each block re-swizzles the weights
and waits for its band with nothing to overlap.  Here, as in ``persist``, a block is
resident for the whole launch: it stages the weights once, already in B-fragment order
and rounded to tf32, then walks the work items (image, band of R output rows) with the
next band's ``cp.async`` copy in flight while the current one is computed.

The GEMM is D[pixel][map] = sum_k A[pixel][k] * B[k][map]: output pixels are the
mma's 16 rows, maps its 8 columns.  Each window row is padded to whole quads of 4 taps
(K=7 -> 8, one zero weight), and a k step of the m16n8k8 mma is two consecutive quads
in (channel, window row, quad) order.

A warp owns P m16 tiles of 16 consecutive output pixels of the band (flat: a tile may
run on into the next row) x NT n8 map tiles.  Lane (g, t) needs tap t of each quad for
pixels g and g+8 of a tile: the band at (pixel base + t) + (the quad's offset), a
register plus a literal, so the window costs no address arithmetic.  Per k step that is
4P shared loads for A and NT 8-byte loads for B feeding P*NT mma.  Rounding the band
to tf32 in place once per item, instead of at every A load, measured no faster
(layer2 0.94 ms, mx-layer2 1.80, H200, 2026-11-21): the pass costs what it saves.

A 'stacked' tile (8 columns x 2 rows, P tiles down the band, each input row loaded once
for every window row it serves) cut the A loads 3x and measured no faster on the H200
(layer2 0.90 ms against 0.89, mx-layer2 1.96 against 1.77, 2026-11-21): its 8-column
strips waste 18% of 34- and 27-wide rows, and it issued more instructions per mma.
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass

import numpy as np

from ..errors import SpecError
from ..plan import tallest
from ..shapes import ConvProblem, DType, Feature
from ..variants import EPILOGUE, Precision, Variant
from .persist import BAND, REGTILE, tallest_band
from ..plan.common import (
    most_distinct,
    OPTIN_SMEM_BYTES,
    Plan,
    Size,
    band_walk_plan,
    ceil_div,
    launch_bounds,
    shape_context,
    thread_registers,
)

MAX_ACCUMULATORS = 64  # fp32 accumulators per thread: P pixel tiles x NT map tiles x 4
MAX_WARPS = 16
MIN_WARPS = 8
# The k steps are straight-line code up to this many; beyond, a loop over channel
# groups whose body is straight-line (NVRTC's time grows fast with the body).  28 is
# layer2's count; 30 (C=19, 3x3) spilled on drawn problems, its loads hoisted too far.
FULL_UNROLL_STEPS = 28
FRAGMENT16 = (Precision.FP16, Precision.BF16)  # m16n8k16 from 16-bit tensors
BLOCKS16 = 2  # blocks an SM the 16-bit kernel is sized for
# The 16-bit kernel's third choice where both bounds spill: at 255 registers ptxas
# hoisted loads until it spilled 8 bytes, at 128 36 (C=8 M=16 21x34 K=7 with a bias,
# fp16, 224 threads; GPU tier's draw, NVRTC 12.9 and 13, 2026-11-29); capped anywhere
# from 144 to 232 it spilled none.
REGISTER_CAP16 = 192


def own_dtype16(key: str, shape: ConvProblem, precision: Precision, planning: bool) -> None:
    """Refuse, in one line, a 16-bit strategy's math other than the tensors' own fp16 or
    bf16: from the planner (``planning``: what to take instead) or from a fit."""
    if shape.dtype is not DType.FP32 and precision.value == shape.dtype.value:
        return
    if planning:
        raise SpecError(
            f"{key} multiplies fp16 or bf16 tensors in their own dtype; for "
            f"{shape.dtype.value} tensors take --precision "
            + ("bf16 on bf16 tensors" if shape.dtype is DType.FP32 else shape.dtype.value)
        )
    raise SpecError(
        f"{key} multiplies fp16 or bf16 tensors in their own dtype, not "
        f"{shape.dtype.value} in {precision.value}"
    )


SLACK = 8  # floats after the last plane: the quad padding of the last row reads there


@functools.lru_cache(maxsize=256)
def _row_stride(iw: int, wo: int) -> tuple[int, int]:
    """(stride, conflict degree): the input row pad, at most 7 floats, that gives the
    fewest bank conflicts over the A loads of the 16-pixel tiles of a band's first rows
    (flat pixel p sits at p // Wo * stride + p % Wo, lane (g, t) reads + t).  Every
    tile and half-warp of a pad at once: axis -1 is the 32 lanes."""
    lane = np.arange(32)
    tiles = np.arange(max(1, ceil_div(4 * wo, 16)))
    p = (
        tiles[:, None, None] * 16 + np.array([0, 8])[None, :, None] + lane // 4
    )  # (tile, half, lane)
    best = None
    for pad in range(8):
        worst = max(1, _worst_bank(p // wo * (iw + pad) + p % wo + lane % 4))
        if best is None or worst < best[1]:
            best = (iw + pad, worst)
    return best


def _warp_grid(
    tiles: int, p: int, map_groups: int, registers: int, blocks: int = 1
) -> tuple[int, int]:
    """(pixel groups per block, passes per item).  The block's warps are map_groups x
    pixel groups.  Each of the 4 schedulers of an SM has 16384 registers and gets every
    4th warp, so at `registers` per thread at most 4 * 16384 // (32 * registers) warps
    fit.  At least MIN_WARPS where the item has the tiles (a warp waits on its shared
    loads and mma; the others fill the gaps); among those, the fewest tile slots
    (passes * groups * P) that cover the item's tiles, then the most warps."""
    fit = 4 * (16384 // (32 * min(255, ceil_div(registers, 8) * 8))) // blocks
    most = max(1, min(MAX_WARPS, fit) // map_groups)
    least = min(most, max(1, ceil_div(MIN_WARPS, map_groups)), ceil_div(tiles, p))
    best = None
    for pg in range(least, most + 1):
        passes = ceil_div(tiles, pg * p)
        key = (passes * pg * p, -pg)
        if best is None or key < best[0]:
            best = (key, pg, passes)
    return best[1], best[2]


def warp_map_tiles(M: int, mw: int, of: str = "") -> int:
    """The n8 map tiles of a warp's ``mw`` maps, which must be whole tiles of M's (``of``:
    what M counts, where it is not the maps)."""
    map_tiles = ceil_div(M, 8)
    if mw < 8 or mw % 8 or mw > 8 * map_tiles:
        choices = ", ".join(str(8 * n) for n in range(1, map_tiles + 1))
        raise SpecError(
            f"register tile maps {mw}: a warp takes whole n8 map tiles of {of or f'M={M}'}; "
            f"choose one of {choices}"
        )
    return mw // 8


def warp_tiles(
    shape: ConvProblem, v: Variant, columns: int = 0, of: str = ""
) -> tuple[int, int, int]:
    """(rows, n8 map tiles, m16 pixel tiles) of a warp of a band-walking tensor-core
    strategy (v.tile output rows a band, v.regtile maps x pixels a warp), checked against
    the problem: its M maps, or ``columns`` of the n side (``of`` saying what they are)
    where a map has several."""
    M, Ho = columns or shape.M, shape.Ho
    rows = v.tile
    mw, pw = v.regtile
    if rows < 1 or rows > Ho:
        raise SpecError(f"{v.key}'s tile is a band of output rows, 1 to Ho={Ho}; got {rows}")
    warp_map_tiles(M, mw, of)
    if pw < 16 or pw % 16:
        raise SpecError(
            f"register tile pixels {pw}: a warp takes whole m16 pixel tiles; choose 16, 32, 48 or 64"
        )
    nt, p = mw // 8, pw // 16
    if 4 * nt * p > MAX_ACCUMULATORS:
        raise SpecError(
            f"register tile {mw}x{pw} = {4 * nt * p} accumulators per thread, over "
            f"{MAX_ACCUMULATORS}; choose fewer maps or pixels per warp"
        )
    return rows, nt, p


def _tf32_steps(C: int, K: int) -> tuple[int, int, int, int]:
    """The tf32 reduction's quads of one channel, channels a whole number of k steps
    takes, the channels padded to them, and the k steps (two quads each)."""
    per_channel = K * ceil_div(K, 4)  # quads of one channel
    group = 1 if per_channel % 2 == 0 else 2
    c_pad = ceil_div(C, group) * group
    return per_channel, group, c_pad, c_pad * per_channel // 2


def plan_mmapersist(shape: ConvProblem, v: Variant) -> Plan:
    if v.precision in FRAGMENT16:
        return plan_mmapersist16(shape, v)
    if shape.dtype is not DType.FP32:
        raise SpecError(
            f"mmapersist's tf32 kernel reads fp32 tensors; for {shape.dtype.value} tensors "
            f"take --precision {shape.dtype.value}"
        )
    C, M, H, K, pad = shape.C, shape.M, shape.H, shape.K, shape.pad
    Ho, Wo = shape.Ho, shape.Wo
    rows, nt, p = warp_tiles(shape, v)
    map_tiles = ceil_div(M, 8)
    quads_per_row = ceil_div(K, 4)
    kx_pad = 4 * quads_per_row
    per_channel, group, c_pad, steps = _tf32_steps(C, K)
    map_groups = ceil_div(map_tiles, nt)
    map_tiles = map_groups * nt  # B holds zero maps up to whole map groups
    pixels = rows * Wo
    tiles = ceil_div(pixels, 16)
    # Registers: accumulators, the A fragments of a step and about 60 for the rest
    # (ptxas, layer2 r16x48: 106).
    pg, passes = _warp_grid(tiles, p, map_groups, 4 * nt * p + 4 * p + 60)
    warps = map_groups * pg
    threads = 32 * warps

    iw, ih = Wo + K - 1, rows + K - 1  # = W + 2*pad columns: the halo is stored
    stride, degree = _row_stride(iw, Wo)
    plane = ih * stride
    band = ceil_div(c_pad * plane + SLACK, 4) * 4
    w_words = steps * map_tiles * 64  # B fragments: [step][map tile][lane][2]

    def smem_bytes(r: int) -> int:
        return 4 * (w_words + 2 * ceil_div(c_pad * (r + K - 1) * stride + SLACK, 4) * 4)

    nbytes = smem_bytes(rows)
    if nbytes > OPTIN_SMEM_BYTES:
        fit = tallest(rows - 1, lambda r: smem_bytes(r) <= OPTIN_SMEM_BYTES)
        hint = f"choose --tile {fit}" if fit else "use --strategy mma (weights stream from L2)"
        raise SpecError(
            f"mmapersist needs {nbytes} bytes of shared memory (B fragments {4 * w_words} B "
            f"+ two bands of {4 * band} B), over the sm_90 limit of {OPTIN_SMEM_BYTES} "
            f"bytes per block; {hint}"
        )

    def quad_offset(q: int) -> int:
        c, rest = divmod(q, per_channel)
        ky, qx = divmod(rest, quads_per_row)
        return c * plane + ky * stride + 4 * qx

    unrolled = steps <= FULL_UNROLL_STEPS
    body_steps = steps if unrolled else group * per_channel // 2
    body = [
        dict(s=s, a=quad_offset(2 * s), b=quad_offset(2 * s + 1), w=s * map_tiles * 32)
        for s in range(body_steps)
    ]
    bands_per_image = ceil_div(Ho, rows)
    ctx = dict(
        shape_context(shape),
        rows=rows,
        ih=ih,
        stage_channels=C,
        stage_rows=ih,
        iw=iw,
        stride=stride,
        plane=plane,
        band=band,
        band_total=C * ih * iw,
        band_pixels=ih * iw,
        zero_total=2 * band,
        w_words=w_words,
        bands_at=w_words,
        quads_per_row=quads_per_row,
        per_channel=per_channel,
        c_pad=c_pad,
        steps=steps,
        unrolled=unrolled,
        body=body,
        iterations=c_pad // group,
        group_plane=group * plane,
        group_w=body_steps * map_tiles * 32,
        map_tiles=map_tiles,
        nt=nt,
        p=p,
        map_groups=map_groups,
        pixel_groups=pg,
        pass_tiles=pg * p,
        warp_maps=8 * nt,
        warp_fragments=32 * nt,  # float2 B fragments of one k step for a warp's maps
        accumulators=4 * nt * p,
        a_registers=4 * p,
        step_words=64 * map_tiles,
        threads=threads,
        **launch_bounds(threads),
        pixels=pixels,
        tiles=tiles,
        bands_per_image=bands_per_image,
        guard_rows=Ho % rows != 0,
        guard_maps=map_groups * nt * 8 != M,
        smem_bytes=nbytes,
        precision_note="x and w rounded to tf32 (cvt.rna), products accumulated in fp32",
    )
    kpad = c_pad * K * kx_pad
    sizes = [
        Size("output", f"{M} x {Ho} x {Wo}", f"Ho = H + 2*pad - K + 1 = {H}+{2 * pad}-{K}+1"),
        Size("fragment", "mma.m16n8k8, tf32", "16 pixels x 8 maps x 8 taps, fp32 accumulators"),
        Size(
            "k padding",
            f"{shape.reduction} -> {kpad} ({100.0 * (kpad - shape.reduction) / kpad:.1f}% zeros)",
            f"window rows padded to {kx_pad} taps"
            + (f", C to {c_pad} (whole k steps)" if c_pad != C else "")
            + f": {steps} k steps",
        ),
        Size(
            "warp",
            f"{p} x {nt} mma per k step",
            f"register tile {16 * p} pixels x {8 * nt} maps = {4 * nt * p} accumulators per thread",
        ),
        Size(
            "block",
            f"{threads} threads",
            f"{map_groups} map group(s) x {pg} pixel group(s) of warps",
        ),
        Size(
            "work item",
            f"{rows} output rows = {pixels} pixels",
            f"{tiles} m16 tiles in {passes} pass(es) of {pg * p} "
            f"({100.0 * (1 - tiles / (passes * pg * p)):.0f}% idle); "
            f"{bands_per_image} item(s) per image",
        ),
        Size(
            "smem B",
            f"{4 * w_words} B",
            f"{steps} k steps x {map_tiles} map tiles x 32 lanes x 2, tf32, staged once",
        ),
        Size(
            "smem bands",
            f"2 x {4 * band} B [{c_pad}][{ih}][{stride}]",
            f"C x (rows+K-1) x (W+2*pad = {iw}, padded to {stride}: {degree}-way bank "
            "conflicts at worst), double-buffered with cp.async",
        ),
    ]
    return band_walk_plan(
        shape, v, "gemm/mmapersist.cu.j2", threads, bands_per_image, nbytes, sizes, ctx
    )


@functools.lru_cache(maxsize=256)
def _row_stride16(iw: int, wo: int) -> tuple[int, int]:
    """(stride, conflict degree) of the 16-bit band: the even row length, iw to iw+14,
    with the fewest bank conflicts over a warp's A loads of a band's first rows.  Lane
    (g, t) reads the word of taps 2t, 2t+1 at its pixel's band offset a + 2t: from the
    even copy at word a/2 + t when a is even, else from the odd copy (16 banks over) at
    (a-1)/2 + t.  Every tile and half-warp of a stride at once: axis -1 is the lanes."""
    lane = np.arange(32)
    tiles = np.arange(max(1, ceil_div(4 * wo, 16)))
    px = tiles[:, None, None] * 16 + np.array([0, 8])[None, :, None] + lane // 4
    best = None
    for stride in range(iw + iw % 2, iw + 16, 2):
        a = px // wo * stride + px % wo
        odd = a % 2
        words = odd * (32 * 2**20 + 16) + (a - odd) // 2 + lane % 4
        worst = max(1, _worst_bank(words))
        if best is None or worst < best[1]:
            best = (stride, worst)
    return best


def _worst_bank(words) -> int:
    """The most distinct words one of the 32 banks serves in any warp access of ``words``."""
    return int(most_distinct(words, lambda w: w % 32, 32).max())


def band16_words(
    shape: ConvProblem, ih: int, elements: int, elem_bytes: int = 2
) -> tuple[int, int, int, int]:
    """Shared words of templates/gemm/band16.j2's buffers: (a channel's raw chunk, a raw
    band, the even copy, the odd copy) for bands of ih input rows whose copies hold
    ``elements`` 16-bit values each.  A chunk starts at the 16-byte boundary at or before
    its channel's first element and is whole 16-byte units (of x's elements of
    ``elem_bytes``); the odd copy starts 16 banks after the even one, so that a warp's
    loads from the two never meet in a bank."""
    unit = 16 // elem_bytes
    chunk_words = ceil_div(ih * shape.W + unit - 1, unit) * 4
    raw_words = ceil_div(shape.C * chunk_words, 4) * 4
    even_words = ceil_div(ceil_div(elements, 2), 32) * 32 + 16
    odd_words = ceil_div(ceil_div(elements, 2) + 1, 4) * 4
    return chunk_words, raw_words, even_words, odd_words


def band16_context(
    shape: ConvProblem,
    ih: int,
    threads: int,
    chunk_words: int,
    spread: bool = True,
    elem_bytes: int = 2,
) -> dict:
    """The numbers templates/gemm/band16.j2's fetch and spread loop over: a warp a row
    of the band's C x ih rows, a lane a column, in passes of 32 columns; ``spread``
    False: the kernel lays the raw band out its own way, and band16 has no spread.
    ``elem_bytes`` 4: x is fp32, fetched the same way, 4 elements a 16-byte unit."""
    iw = shape.W + 2 * shape.pad
    return dict(
        spread_rows=shape.C * ih,
        warps=threads // 32,
        raw_unit=16 // elem_bytes,  # x's elements a 16-byte unit
        raw_bytes=elem_bytes,
        xt="float" if elem_bytes == 4 else "unsigned short",  # x's element type
        chunk_elems=4 // elem_bytes * chunk_words,
        spread_words=ceil_div(iw, 2),  # a lane a word of each copy
        spread_word_passes=ceil_div(ceil_div(iw, 2), 32),
        band16_spread=spread,
    )


def plan_mmapersist16(shape: ConvProblem, v: Variant) -> Plan:
    """The fp16/bf16 kernel: m16n8k16, window rows padded to octets of 8 taps, a k step
    two octets.  A lane's A word is two neighbouring taps of one pixel, which sit at an
    odd 16-bit offset for every other pixel: the band is kept twice, as it is and
    shifted by one element, and each pixel reads the copy where its pair is one aligned
    word.  The input arrives by cp.async in x's own order (a raw band, double-buffered)
    and is spread into the two copies, with the padding, by the block."""
    if shape.dtype.value != v.precision.value:
        raise SpecError(
            f"mmapersist multiplies {v.precision.value} only from {v.precision.value} "
            f"tensors, not {shape.dtype.value}; for these take --precision "
            + ("tf32" if shape.dtype is DType.FP32 else shape.dtype.value)
        )
    C, M, H, W, K, pad = shape.C, shape.M, shape.H, shape.W, shape.K, shape.pad
    Ho, Wo = shape.Ho, shape.Wo
    rows, nt, p = warp_tiles(shape, v)
    octets = ceil_div(K, 8)
    per_channel = K * octets  # octets of one channel, a k step two of them
    slots = C * per_channel
    unrolled = ceil_div(slots, 2) <= FULL_UNROLL_STEPS
    if unrolled:  # an odd count gets one slot of zero weights over finite data
        c_pad, group = C, C
    else:  # a loop over channel groups of whole k steps
        group = 1 if per_channel % 2 == 0 else 2
        c_pad = ceil_div(C, group) * group
    steps = ceil_div(c_pad * per_channel, 2)
    map_tiles = ceil_div(M, 8)
    map_groups = ceil_div(map_tiles, nt)
    map_tiles = map_groups * nt
    pixels = rows * Wo
    tiles = ceil_div(pixels, 16)
    # Two blocks an SM, so that one block's barriers, copies and stores run under the
    # other's multiplies: registers for accumulators, A words, the 2p copy pointers
    # (64-bit) and about 40 for the rest.
    pg, passes = _warp_grid(tiles, p, map_groups, 4 * nt * p + 8 * p + 40, BLOCKS16)
    warps = map_groups * pg
    threads = 32 * warps

    iw, ih = Wo + K - 1, rows + K - 1
    stride, degree = _row_stride16(iw, Wo)
    plane = ih * stride
    slack = 8 * octets + 2  # the last row's octets read past its plane
    # Shared memory in 32-bit words: B fragments [step][map tile][lane] of uint2, two
    # raw bands [C][chunk] in x's order, then the even copy and the odd copy of the band
    # [c_pad][ih][stride], the odd copy 16 banks after the even one.
    b_words = steps * map_tiles * 64
    chunk_words, raw_words, even_words, odd_words = band16_words(shape, ih, c_pad * plane + slack)
    words = b_words + 2 * raw_words + even_words + odd_words
    nbytes = 4 * words
    if nbytes > OPTIN_SMEM_BYTES:
        raise SpecError(
            f"mmapersist needs {nbytes} bytes of shared memory (B fragments {4 * b_words} B, "
            f"two raw bands of {4 * raw_words} B, the band twice in {4 * (even_words + odd_words)} "
            f"B), over the sm_90 limit of {OPTIN_SMEM_BYTES} bytes per block; "
            f"choose --tile {max(1, rows // 2)}"
        )

    def slot_offset(q: int) -> int:
        if q >= c_pad * per_channel:
            return 0  # the padding slot: zero weights over the band's first words
        c, rest = divmod(q, per_channel)
        ky, o = divmod(rest, octets)
        return c * plane + ky * stride + 8 * o

    body_steps = steps if unrolled else group * per_channel // 2
    body = [
        dict(s=s, a=slot_offset(2 * s) // 2, b=slot_offset(2 * s + 1) // 2, w=s * map_tiles * 32)
        for s in range(body_steps)
    ]
    bands_per_image = ceil_div(Ho, rows)
    ctx = dict(
        shape_context(shape),
        **band16_context(shape, ih, threads, chunk_words),
        elem="f16" if shape.dtype is DType.FP16 else "bf16",
        rows=rows,
        ih=ih,
        iw=iw,
        step_words=64 * map_tiles,
        stride=stride,
        plane=plane,
        octets=octets,
        per_channel=per_channel,
        slots=slots,
        c_pad=c_pad,
        steps=steps,
        unrolled=unrolled,
        body=body,
        iterations=c_pad // group,
        group_words=group * plane // 2,
        group_w=body_steps * map_tiles * 32,
        chunk_words=chunk_words,
        copy_words=C * chunk_words,
        band_total=C * ih * iw,
        band_pixels=ih * iw,
        b_words=b_words,
        raw_at=b_words,
        raw_words=raw_words,
        even_at=b_words + 2 * raw_words,
        odd_at=b_words + 2 * raw_words + even_words,
        zero_words=even_words + odd_words,
        map_tiles=map_tiles,
        nt=nt,
        p=p,
        map_groups=map_groups,
        pixel_groups=pg,
        pass_tiles=pg * p,
        warp_maps=8 * nt,
        warp_fragments=32 * nt,
        accumulators=4 * nt * p,
        threads=threads,
        launch_bounds=f"{threads}, {BLOCKS16}",
        # The second choice names one block an SM: with the plain bound ptxas still kept
        # 96 registers and spilled 8 bytes (C=11 M=3 34x40 K=5 fp16, 320 threads, a
        # GPU-tier draw), with one block an SM it took 120 and spilled none.
        launch_bounds_alt=f"{threads}, 1",
        register_cap=min(REGISTER_CAP16, thread_registers(threads, 1)),
        pixels=pixels,
        tiles=tiles,
        bands_per_image=bands_per_image,
        guard_rows=Ho % rows != 0,
        guard_maps=map_tiles * 8 != M,
        smem_bytes=nbytes,
        precision_note=f"{shape.dtype.value} products exact, accumulated in fp32",
    )
    kpad = 2 * steps * 8
    sizes = [
        Size("output", f"{M} x {Ho} x {Wo}", f"Ho = H + 2*pad - K + 1 = {H}+{2 * pad}-{K}+1"),
        Size(
            "fragment",
            f"mma.m16n8k16, {shape.dtype.value}",
            "16 pixels x 8 maps x 16 taps (two window rows of 8), fp32 accumulators",
        ),
        Size(
            "k padding",
            f"{shape.reduction} -> {kpad} ({100.0 * (kpad - shape.reduction) / kpad:.1f}% zeros)",
            f"window rows padded to {8 * octets} taps, two a k step"
            + (f", C to {c_pad}" if c_pad != C else "")
            + f": {steps} k steps",
        ),
        Size(
            "warp",
            f"{p} x {nt} mma per k step",
            f"register tile {16 * p} pixels x {8 * nt} maps = {4 * nt * p} accumulators per thread",
        ),
        Size(
            "block",
            f"{threads} threads",
            f"{map_groups} map group(s) x {pg} pixel group(s) of warps",
        ),
        Size(
            "work item",
            f"{rows} output rows = {pixels} pixels",
            f"{tiles} m16 tiles in {passes} pass(es) of {pg * p} "
            f"({100.0 * (1 - tiles / (passes * pg * p)):.0f}% idle); "
            f"{bands_per_image} item(s) per image",
        ),
        Size(
            "smem B",
            f"{4 * b_words} B",
            f"{steps} k steps x {map_tiles} map tiles x 32 lanes x 8 B",
        ),
        Size(
            "smem raw bands",
            f"2 x {4 * raw_words} B [{C}][{2 * chunk_words}]",
            f"{ih} input rows of {W} per channel as x holds them, by 16-byte cp.async, spread "
            "a word at a time",
        ),
        Size(
            "smem band",
            f"2 copies x [{c_pad}][{ih}][{stride}] {shape.dtype.value}",
            f"as is and shifted by one element, so every tap pair is one aligned word "
            f"({degree}-way bank conflicts at worst)",
        ),
    ]
    return band_walk_plan(
        shape, v, "gemm/mmapersist16.cu.j2", threads, bands_per_image, nbytes, sizes, ctx
    )


@dataclass(frozen=True, kw_only=True)
class Mmapersist(Variant):
    key = "mmapersist"
    templates = ("gemm/mmapersist.cu.j2", "gemm/mmapersist16.cu.j2")
    family = "gemm"
    description = (
        "persistent blocks on tensor cores: tf32 B fragments resident in shared memory, "
        "input bands double-buffered with cp.async, each warp pixel tiles x map tiles of mma.sync"
    )
    serves = EPILOGUE | {Feature.DTYPE16}
    precisions = (Precision.TF32, *FRAGMENT16)
    tensor_core = True

    tile: int = BAND
    regtile: tuple[int, int] = REGTILE

    def plan(self, problem):
        return plan_mmapersist(problem, self)

    @classmethod
    def fit(cls, problem, seed):
        """tf32 for fp32 tensors, the tensors' own dtype for 16-bit ones; up to 3 map
        tiles (24 maps) per warp, pixel tiles up to 32 accumulators per thread, and the
        tallest band that fits."""
        own = Precision.TF32 if problem.dtype is DType.FP32 else Precision(problem.dtype.value)
        if seed.precision is not own:
            raise SpecError(
                f"mmapersist multiplies {problem.dtype.value} tensors in {own.value}: "
                f"take --precision {own.value}"
            )
        nt = min(-(-problem.M // 8), 3)
        # No more pixel tiles a warp than an image fills: with 4 tiles of a 48-pixel image
        # (C=3 M=9 20x7 K=7 pad=1, a GPU-tier draw) ptxas spilled 488 bytes, with 3 none;
        # with 4 of a 50-pixel one (C=14 M=14 12x7 K=3, 21 unrolled tf32 steps), 640
        # bytes at 255 registers, with 3 none (NVRTC 12 and 13).
        fills = problem.Ho * problem.Wo // 16
        p = max(1, min(4, 8 // nt, fills))
        # And one tile where such an image's tf32 steps run longer: 3 tiles of a 55-pixel
        # image over 27 steps (C=17 M=1 7x13 K=3 with a bias, a GPU-tier draw) spilled 20
        # bytes at 255 registers, 2 tiles 24 at the second bound, 1 none (NVRTC 12 and 13).
        if fills < 4 and own is Precision.TF32 and _tf32_steps(problem.C, problem.K)[3] > 21:
            p = 1
        v = cls(regtile=(8 * nt, 16 * p), precision=seed.precision)
        # The tallest band, even where a shorter one would let two blocks share an SM:
        # mx-layer2 in bf16 (B=10000, H200) took 1.13 ms in whole images, one block an
        # SM, and 1.66 in bands of 19 and 8 rows, two.
        return tallest_band(problem, v, problem.Ho)

    @classmethod
    def space(cls, problem, precision):
        """1-4 map tiles by 1-4 pixel tiles per warp (at most 64 accumulators per
        thread), and bands of Ho/k rows."""
        map_tiles = min(4, -(-problem.M // 8))
        rows = sorted({-(-problem.Ho // k) for k in (1, 2, 3, 4, 6, 8)}, reverse=True)
        return [
            cls(tile=r, regtile=(8 * nt, 16 * p), precision=precision)
            for nt, p, r in itertools.product(range(1, map_tiles + 1), range(1, 5), rows)
            if 4 * nt * p <= MAX_ACCUMULATORS
        ]
