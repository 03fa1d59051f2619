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

import itertools
from dataclasses import dataclass

from ..errors import SpecError
from ..shapes import ConvProblem
from ..tensors import Role
from ..variants import EPILOGUE, Precision, Variant
from .persist import BAND, REGTILE, tallest_band
from ..plan.common import (
    y_args,
    Launch,
    OPTIN_SMEM_BYTES,
    Plan,
    Size,
    bank_conflict_degree,
    ceil_div,
    launch_bounds,
    shape_context,
)

MAX_ACCUMULATORS = 64  # fp32 accumulators per thread: P pixel tiles x NT map tiles x 4
MAX_WARPS = 16
MIN_WARPS = 8
# The k steps are straight-line code up to this many; beyond, a loop over channel
# groups whose body is straight-line (NVRTC's time grows fast with the body).  28 is
# layer2's count; 30 (C=19, 3x3) spilled on drawn problems, its loads hoisted too far.
FULL_UNROLL_STEPS = 28
SLACK = 8  # floats after the last plane: the quad padding of the last row reads there


def _row_stride(iw: int, wo: int) -> tuple[int, int]:
    """(stride, conflict degree): the input row pad, at most 7 floats, that gives the
    fewest bank conflicts over the A loads of the 16-pixel tiles of a band's first rows
    (flat pixel p sits at p // Wo * stride + p % Wo, lane (g, t) reads + t)."""
    best = None
    for pad in range(8):
        stride = iw + pad
        worst = 1
        for tile in range(max(1, ceil_div(4 * wo, 16))):
            for half in (0, 8):
                addrs = []
                for lane in range(32):
                    p = tile * 16 + half + lane // 4
                    addrs.append(p // wo * stride + p % wo + lane % 4)
                worst = max(worst, bank_conflict_degree(addrs))
        if best is None or worst < best[1]:
            best = (stride, worst)
    return best


def _warp_grid(tiles: int, p: int, map_groups: int, registers: int) -> tuple[int, int]:
    """(pixel groups per block, passes per item).  The block's warps are map_groups x
    pixel groups.  Each of the 4 schedulers of an SM has 16384 registers and gets every
    4th warp, so at `registers` per thread at most 4 * 16384 // (32 * registers) warps
    fit.  At least MIN_WARPS where the item has the tiles (a warp waits on its shared
    loads and mma; the others fill the gaps); among those, the fewest tile slots
    (passes * groups * P) that cover the item's tiles, then the most warps."""
    fit = 4 * (16384 // (32 * min(255, ceil_div(registers, 8) * 8)))
    most = max(1, min(MAX_WARPS, fit) // map_groups)
    least = min(most, max(1, ceil_div(MIN_WARPS, map_groups)), ceil_div(tiles, p))
    best = None
    for pg in range(least, most + 1):
        passes = ceil_div(tiles, pg * p)
        key = (passes * pg * p, -pg)
        if best is None or key < best[0]:
            best = (key, pg, passes)
    return best[1], best[2]


def plan_mmapersist(shape: ConvProblem, v: Variant) -> Plan:
    C, M, H, W, K, pad = shape.C, shape.M, shape.H, shape.W, shape.K, shape.pad
    Ho, Wo = shape.Ho, shape.Wo
    rows = v.tile
    mw, pw = v.regtile
    if rows < 1 or rows > Ho:
        raise SpecError(f"mmapersist's tile is a band of output rows, 1 to Ho={Ho}; got {rows}")
    map_tiles = ceil_div(M, 8)
    if mw < 8 or mw % 8 or mw > 8 * map_tiles:
        choices = ", ".join(str(8 * n) for n in range(1, map_tiles + 1))
        raise SpecError(
            f"register tile maps {mw}: a warp takes whole n8 map tiles of M={M}; "
            f"choose one of {choices}"
        )
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
    quads_per_row = ceil_div(K, 4)
    kx_pad = 4 * quads_per_row
    per_channel = K * quads_per_row  # quads of one channel
    group = 1 if per_channel % 2 == 0 else 2  # channels per whole number of k steps
    c_pad = ceil_div(C, group) * group
    steps = c_pad * per_channel // 2
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
        fit = next((r for r in range(rows - 1, 0, -1) if smem_bytes(r) <= OPTIN_SMEM_BYTES), None)
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
            f"register tile {pw} pixels x {mw} maps = {4 * nt * p} accumulators per thread",
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
    launch = Launch(
        v.kernel_name(shape),
        (Role.X, Role.W, *y_args(shape), Role.BATCH),
        (threads, 1, 1),
        (0, 1, 1),
        0,
        bands_per_image,
        1,
        nbytes,
        persistent=True,
    )
    return Plan(
        shape=shape,
        variant=v,
        template="gemm/mmapersist.cu.j2",
        launches=(launch,),
        static_smem=0,
        dynamic_smem=nbytes,
        const_bytes=0,
        weight_format="f32",
        sizes=tuple(sizes),
        context=ctx,
    )


@dataclass(frozen=True, kw_only=True)
class Mmapersist(Variant):
    key = "mmapersist"
    family = "gemm"
    description = (
        "persistent blocks on tensor cores: tf32 B fragments resident in shared memory, "
        "input bands double-buffered with cp.async, each warp pixel tiles x map tiles of mma.sync"
    )
    serves = EPILOGUE
    precisions = (Precision.TF32,)
    tensor_core = True

    tile: int = BAND
    regtile: tuple[int, int] = REGTILE

    def plan(self, problem):
        return plan_mmapersist(problem, self)

    @classmethod
    def fit(cls, problem, seed):
        """Up to 3 map tiles (24 maps) per warp, pixel tiles up to 32 accumulators per
        thread, and the tallest band that fits."""
        nt = min(-(-problem.M // 8), 3)
        p = max(1, min(4, 8 // nt))
        v = cls(regtile=(8 * nt, 16 * p), precision=seed.precision)
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
