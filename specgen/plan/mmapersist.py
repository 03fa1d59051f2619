"""Planning for ``mmapersist``: persist's pipeline feeding tensor cores.

``mmatile`` stages one band per block and exits; each block re-swizzles the weights
and waits for its band with nothing to overlap.  Here, as in ``persist``, a block is
resident for the whole launch: it stages the weights once, already in B-fragment order
and rounded to tf32, then walks the work items (image, band of R output rows) with the
next band's ``cp.async`` copy in flight while the current one is computed.

The GEMM is D[pixel][map] = sum_k A[pixel][k] * B[k][map]: output pixels are the
mma's 16 rows, maps its 8 columns.  Each window row is padded to whole quads of 4 taps
(K=7 -> 8, one zero weight), and a k step of the m16n8k8 mma is a pair of quads of the
same window row ky (two quads of one channel, or one quad of two channels).

The shape of an m16 pixel tile is what makes it cheap: 8 neighbouring pixels of one
output row (fragment rows g) over the same 8 pixels one row down (rows g+8).  Then
for window row ky the tile's A fragment is input rows y+ky and y+ky+1 at the lane's
column, and a warp that stacks P such tiles (8 columns x 2P output rows) reads each of
its 2P+K-1 input rows once per quad pair: the registers of input row r serve tile i
at window row r-2i and r-2i-1.  That is 2*(2P+K-1) shared loads where a flat tile
needs 4*P*K; the flat version of this kernel was limited by the shared-load queue
(Nsight Compute, layer2, 2026-11-21: MIO throttle 35% of stall cycles, tensor pipe
32% busy).  The B fragments of a quad pair, all K window rows x NT map tiles, are
loaded into registers once and used by every tile of the warp.
"""

from __future__ import annotations

from ..errors import SpecError
from ..shapes import ConvShape
from ..variants import Precision, Variant
from .common import (
    OPTIN_SMEM_BYTES,
    Launch,
    Plan,
    Size,
    ceil_div,
    shape_context,
)

MAX_ACCUMULATORS = 64  # fp32 accumulators per thread: P pixel tiles x NT map tiles x 4
MAX_B_REGISTERS = 64  # B fragments of one quad pair held per thread: K x NT x 2
MAX_WARPS = 16
# Quad pairs are straight-line code up to this many; beyond, a loop over channel
# groups whose body is straight-line (NVRTC's time grows fast with the body).
FULL_UNROLL_PAIRS = 8


def plan_mmapersist(shape: ConvShape, v: Variant) -> Plan:
    if v.precision is not Precision.TF32:
        raise SpecError(
            "mmapersist runs tf32 tensor cores; choose --precision tf32, or "
            "--strategy persist for exact fp32"
        )
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
            f"register tile pixels {pw}: a warp takes whole m16 tiles (8 columns x 2 rows); "
            "choose 16, 32, 48 or 64"
        )
    nt, p = mw // 8, pw // 16
    if 4 * nt * p > MAX_ACCUMULATORS:
        raise SpecError(
            f"register tile {mw}x{pw} = {4 * nt * p} accumulators per thread, over "
            f"{MAX_ACCUMULATORS}; choose fewer maps or pixels per warp"
        )
    if 2 * K * nt > MAX_B_REGISTERS:
        raise SpecError(
            f"a warp holds the B fragments of K={K} window rows x {nt} map tiles = "
            f"{2 * K * nt} registers per thread, over {MAX_B_REGISTERS}; choose fewer maps "
            f"per warp (at most {8 * max(1, MAX_B_REGISTERS // (2 * K))})"
        )
    quads_per_row = ceil_div(K, 4)
    kx_pad = 4 * quads_per_row
    group = 1 if quads_per_row % 2 == 0 else 2  # channels per whole number of quad pairs
    c_pad = ceil_div(C, group) * group
    pairs = c_pad * quads_per_row // 2
    steps = pairs * K
    map_groups = ceil_div(map_tiles, nt)
    map_tiles = map_groups * nt  # B holds zero maps up to whole map groups
    strips = ceil_div(Wo, 8)  # 8-column strips of the band
    row_groups = ceil_div(rows, 2 * p)  # 2P-row groups of the band
    units = map_groups * strips * row_groups  # warp tiles per work item
    # Warps: as many as the registers allow, then the fewest that take the warp tiles
    # in as few rounds.  Each of the 4 schedulers of an SM has 16384 registers and gets
    # every 4th warp of the block, so warps come in fours: 128 registers per thread at
    # 16 warps, 168 at 12, 255 at 8.  A thread needs its accumulators, the B fragments
    # of a quad pair, and about 80 more (ptxas, layer2: 138 at 32 + 28).
    registers = ceil_div(4 * p * nt + 2 * K * nt + 80, 8) * 8
    most = max(1, min(MAX_WARPS, 4 * (16384 // (32 * min(255, registers)))))
    rounds = ceil_div(units, most)
    warps = ceil_div(units, rounds)
    threads = 32 * warps

    iw = Wo + K - 1  # = W + 2*pad columns: the halo is stored
    ih = row_groups * 2 * p + K - 1  # every row a warp tile reads, past the band zeroed
    stride = iw  # a warp's A load reads 11 neighbouring words of one row: no bank conflicts
    # The last strip reads up to 8*strips - 1 + kx_pad - 1 columns; those past the row
    # run into the next row (finite, multiplied by a zero or not stored), those past the
    # last plane into a zeroed slack.
    slack = ceil_div(8 * strips + kx_pad - iw, 4) * 4
    plane = ih * stride
    band = ceil_div(c_pad * plane + slack, 4) * 4
    w_words = steps * map_tiles * 64  # B fragments: [pair][ky][map tile][lane][2]

    def smem_bytes(r: int) -> int:
        rg = ceil_div(r, 2 * p)
        return 4 * (w_words + 2 * ceil_div(c_pad * (rg * 2 * p + K - 1) * stride + slack, 4) * 4)

    nbytes = smem_bytes(rows)
    if nbytes > OPTIN_SMEM_BYTES:
        fit = next((r for r in range(rows - 1, 0, -1) if smem_bytes(r) <= OPTIN_SMEM_BYTES), None)
        hint = f"choose --tile {fit}" if fit else "use --strategy mma (weights stream from L2)"
        raise SpecError(
            f"mmapersist needs {nbytes} bytes of shared memory (B fragments {4 * w_words} B "
            f"+ two bands of {4 * band} B), over the sm_90 limit of {OPTIN_SMEM_BYTES} "
            f"bytes per block; {hint}"
        )

    def quad(qi: int) -> tuple[int, int]:
        """Band offset of quad qi's first tap within a window row, and its channel."""
        c, qx = divmod(qi, quads_per_row)
        return c * plane + 4 * qx, c

    unrolled = pairs <= FULL_UNROLL_PAIRS
    body_pairs = pairs if unrolled else group * quads_per_row // 2

    def row_plan(tp: int) -> list[dict]:
        """The input rows of one quad pair in order for a warp tile of tp m16 tiles;
        after loading row r, tile i takes its window row r-1-2i (input rows r-1 and r
        are its fragment rows g and g+8)."""
        out = []
        for r in range(2 * tp + K - 1):
            uses = [dict(i=i, ky=r - 1 - 2 * i) for i in range(tp) if 0 <= r - 1 - 2 * i < K]
            out.append(dict(r=r, off=r * stride, uses=uses))
        return out

    # A band whose last row group is short gets a second, shorter warp tile for it.
    last = ceil_div(rows - (row_groups - 1) * 2 * p, 2)
    guard_tiles = last < p
    tiles = [dict(p=p, rows=row_plan(p))] + (
        [dict(p=last, rows=row_plan(last))] if guard_tiles else []
    )
    body = []
    for k in range(body_pairs):
        (qa, ca), (qb, cb) = quad(2 * k), quad(2 * k + 1)
        body.append(dict(k=k, a=qa, b=qb, ca=ca, cb=cb, w=k * K * map_tiles * 32))
    bands_per_image = ceil_div(Ho, rows)
    ctx = dict(
        shape_context(shape),
        rows=rows,
        ih=ih,
        iw=iw,
        stride=stride,
        plane=plane,
        band=band,
        band_total=C * (rows + K - 1) * iw,
        band_pixels=(rows + K - 1) * iw,
        stage_rows=rows + K - 1,
        zero_total=2 * band,
        w_words=w_words,
        bands_at=w_words,
        quads_per_row=quads_per_row,
        kx_pad=kx_pad,
        group=group,
        c_pad=c_pad,
        pairs=pairs,
        steps=steps,
        unrolled=unrolled,
        body=body,
        tiles=tiles,
        iterations=c_pad // group,
        group_plane=group * plane,
        group_w=body_pairs * K * map_tiles * 32,
        ky_w=map_tiles * 32,
        map_tiles=map_tiles,
        nt=nt,
        p=p,
        map_groups=map_groups,
        strips=strips,
        row_groups=row_groups,
        units=units,
        warps=warps,
        threads=threads,
        bands_per_image=bands_per_image,
        guard_tiles=guard_tiles,
        guard_rows=Ho % rows != 0 or row_groups * 2 * p != rows,
        guard_cols=strips * 8 != Wo,
        guard_maps=map_groups * nt * 8 != M,
        smem_bytes=nbytes,
        precision_note="x and w rounded to tf32 (cvt.rna), products accumulated in fp32",
    )
    kpad = c_pad * K * kx_pad
    used = Wo * rows
    slots = strips * 8 * rows
    sizes = [
        Size("output", f"{M} x {Ho} x {Wo}", f"Ho = H + 2*pad - K + 1 = {H}+{2 * pad}-{K}+1"),
        Size("fragment", "mma.m16n8k8, tf32", "8 columns x 2 rows of pixels, 8 maps, 8 taps"),
        Size(
            "k padding",
            f"{shape.reduction} -> {kpad} ({100.0 * (kpad - shape.reduction) / kpad:.1f}% zeros)",
            f"window rows padded to {kx_pad} taps"
            + (f", C to {c_pad}" if c_pad != C else "")
            + f": {pairs} quad pair(s) x {K} window rows = {steps} k steps",
        ),
        Size(
            "warp tile",
            f"8 x {2 * p} pixels x {mw} maps",
            f"{p} m16 tile(s) x {nt} n8 tile(s), {4 * nt * p} accumulators per thread; "
            f"{2 * (2 * p + K - 1)} A loads per quad pair for {p * K * nt} mma",
        ),
        Size(
            "work item",
            f"{rows} output rows, {units} warp tiles",
            f"{map_groups} map group(s) x {strips} strips x {row_groups} row group(s); "
            f"{100.0 * (1 - used / slots):.0f}% of the columns past the edge; "
            f"{bands_per_image} item(s) per image",
        ),
        Size("block", f"{threads} threads", f"{warps} warps take the warp tiles in turn"),
        Size(
            "smem B",
            f"{4 * w_words} B",
            f"{pairs} pairs x {K} rows x {map_tiles} map tiles x 32 lanes x 2, tf32, staged once",
        ),
        Size(
            "smem bands",
            f"2 x {4 * band} B [{c_pad}][{ih}][{stride}]",
            f"C x (rows the warp tiles read = {ih}) x (W+2*pad = {iw}"
            "), double-buffered with cp.async",
        ),
    ]
    launch = Launch(
        v.name,
        ("x", "w", "y", "batch"),
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
