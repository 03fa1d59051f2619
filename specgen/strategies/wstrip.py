"""``wstrip``: wgrad on fp16/bf16 tensor cores for narrow NCHW layers (the 7x7 presets).

dw[m][c][r][s] is a sum over every image and dy pixel of dy[m][p][q] * x[c][p+r][q+s]:
a GEMM of taps x maps whose reduction runs along the pixels.  Here the m16 side of each
``mma.m16n8k16`` is two window rows of one octet of taps (rows (r, s) and (r + 1, s) of
fragment rows g and g + 8), the n8 side eight maps, and the k16 side sixteen pixels of
one dy row.  A lane's A word for window row r is x's pair at columns q + s, q + s + 1 of
input row p + r: the same word serves window row r at dy row p and window row r + 1 at
dy row p - 1.  So each warp walks a strip of dy rows of one 16-column chunk and keeps
the input rows under it in registers: each input row is loaded once (two words a lane
for a 7-tap row) and feeds every window row that reads it, and a dy row's B words are
loaded once for all of its window rows: about (R + K - 1) * 2 + 2 * R * (maps / 8)
loads for R * ceil(K/2) * (maps / 8) mma.

x's band is mmastrip's (templates/gemm/band16.j2: fetched in x's order by 4-byte
cp.async and spread into two copies, as is and shifted by one element, so that every
pair is an aligned word; a lane of odd g reads the shifted copy).  dy's rows go to
shared memory by 4-byte cp.async, padded with zeros to whole chunks, so that pixels past
the row meet zeros (dy rows of odd length arrive in dy's order and are spread, as x's).

With an odd window the last pair's second row is past it: its A words are bf16 (fp16)
ones, and its sums are the dy sums db needs, for free.  Each warp keeps its window
rows' sums over its blocks' whole share of the batch; the block adds its warps in
order, writes one slice row, and a second kernel adds the slices in order.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from ..errors import SpecError
from ..plan import tallest
from ..plan.common import OPTIN_SMEM_BYTES, Launch, Plan, Size, ceil_div, smem_blocks
from ..shapes import DType, Feature, Op, TensorLayout
from ..tensors import Role
from ..variants import Count, Pair, Variant, param
from .mmapersist import FRAGMENT16, band16_context, band16_words, warp_map_tiles
from .mmastrip import _rows_per_strip
from .wsplit import second_pass, sums_context

MAX_ACCUMULATORS = 64  # fp32 sums a thread keeps: 4 x tiles x map tiles
MAX_WARPS = 16  # a warp per (channel, map group), times the strip groups
BLOCK_WARPS = 8  # the warps a block is given where channels and map groups leave room
SMS = 132  # the H200's (and H100's) SMs
ONES = {DType.BF16: "0x3f803f80u", DType.FP16: "0x3c003c00u"}


@dataclass(frozen=True, kw_only=True)
class Wstrip(Variant):
    key = "wstrip"
    templates = ("backward/wstrip.cu.j2",)
    family = "backward"
    description = (
        "wgrad on fp16/bf16 tensor cores for few channels: window rows x taps against maps, "
        "each warp a strip of dy rows with the input rows under it loaded once"
    )
    serves = frozenset({Feature.BIAS, Feature.DTYPE16})
    precisions = FRAGMENT16
    tensor_core = True
    ops = frozenset({Op.WGRAD})

    tile: int = param(16, Count("t"), "wstrip: dy rows per staged band")
    regtile: tuple[int, int] = param(
        (8, 8), Pair("r"), "wstrip: maps x dy rows of a warp's strip (16 columns wide)"
    )
    splits: int = param(264, Count("s"), "wstrip: blocks, each a slice of the batch's bands")

    def plan(self, problem):
        return plan_wstrip(problem, self)

    @classmethod
    def fit(cls, problem, seed):
        """The tensors' own dtype; up to three map tiles a warp (fewer where the sums
        would pass MAX_ACCUMULATORS), strips of 8 dy rows (or the rows there are), the
        tallest band that lets two blocks share an SM (else one), two (or one) blocks
        on each SM."""
        _check_dtype(problem, seed)
        tiles = _tiles(problem)
        nt = max(1, min(ceil_div(problem.M, 8), 3, MAX_ACCUMULATORS // (4 * len(tiles))))
        K = problem.K
        most = 8  # rows a strip: its input rows' quads and dy words stay in registers

        def variant(rows, blocks):
            r = _rows_per_strip(rows, most, K)
            return replace(seed, tile=rows, regtile=(8 * nt, r), splits=SMS * blocks)

        for blocks in (2, 1):

            def resident_enough(rows):
                try:
                    return resident(plan_wstrip(problem, variant(rows, blocks))) >= blocks
                except SpecError:
                    return False

            rows = tallest(problem.Ho, resident_enough)
            if rows is not None:
                # the same number of bands an image, cut evenly
                return variant(ceil_div(problem.Ho, ceil_div(problem.Ho, rows)), blocks)
        raise SpecError("wstrip: no band of this problem fits in shared memory")

    @classmethod
    def space(cls, problem, precision):
        """1-3 map tiles a warp, strips of 4 to 12 dy rows, bands of Ho/k rows, one to
        three blocks an SM.  A strip of r rows loads r + K - 1 input rows; strips no
        taller than half the window (2r <= K), whose outputs are a third of the rows they
        load or fewer, are left out: with 12 warps a block, capped at 168 registers, two
        such spilled on drawn problems (K=9 and K=8, strips of 4 rows; NVRTC 12, sm_90)."""
        bands = sorted({ceil_div(problem.Ho, k) for k in (1, 2, 3, 4)}, reverse=True)
        return [
            cls(tile=b, regtile=(8 * nt, r), splits=SMS * k, precision=precision)
            for nt, r, b, k in itertools.product((1, 2, 3), (4, 6, 8, 10, 12), bands, (1, 2, 3))
            if r <= b and 2 * r > problem.K
        ]


def min_blocks(warps: int) -> int:
    """The blocks an SM the launch bounds ask ptxas to fit (registers capped to match):
    sixteen warps an SM, at most four blocks (a block of two warps held to 128 registers
    spilled on a drawn problem, NVRTC 12)."""
    return max(1, min(4, 16 // warps))


def resident(plan: Plan) -> int:
    """Blocks of the plan an SM holds at once: its launch bound, and its shared memory."""
    return min(min_blocks(plan.context["threads"] // 32), smem_blocks(plan.dynamic_smem))


def _check_dtype(p, v) -> None:
    if p.dtype is DType.FP32 or p.layout is not TensorLayout.NCHW:
        raise SpecError(
            "wstrip reads fp16 or bf16 tensors in NCHW: for channels-last 16-bit tensors "
            "use --strategy tcwhalo or tcwgrad, for fp32 ones --strategy wband"
        )
    if v.precision.value != p.dtype.value:
        raise SpecError(
            f"wstrip multiplies the tensors' own dtype: {p.dtype.value} tensors take "
            f"--precision {p.dtype.value}"
        )


def _tiles(p) -> list[dict]:
    """The m16 tiles of the window: window rows 2a and 2a + 1 (fragment rows g and g + 8)
    of taps 8o .. 8o + 7, each A fragment a register quad of two input rows' words; a
    pair that runs past the window reads the next input row into sums no one keeps.
    db: with one octet of fewer than 8 taps, lane g = 7's words are ones (tap 7 is past
    the window) and every tile's fragment row 7 sums dy; else, with a bias, one more
    tile of ones."""
    octets, pairs = ceil_div(p.S, 8), ceil_div(p.R, 2)
    out = [dict(a=a, o=o, ones=False) for a in range(pairs) for o in range(octets)]
    if p.bias and not _lane_ones(p):
        out.append(dict(a=0, o=0, ones=True))
    for i, t in enumerate(out):
        t["i"] = i
        t["ra"] = 2 * t["a"]
        t["s0"] = 8 * t["o"]  # the octet's first tap
        t["one_row"] = t["ra"] + 1 >= p.R  # the pair's second row is past the window
    return out


def _lane_ones(p) -> bool:
    """Whether lane g = 7 reads ones (tap 7 of a single octet is past the window)."""
    return p.S < 8


def plan_wstrip(p, v: Wstrip) -> Plan:
    # 1. limits
    _check_dtype(p, v)
    C, M, W, K, pad = p.C, p.M, p.W, p.K, p.pad
    P, Q = p.Ho, p.Wo
    rows = v.tile
    mw, rs = v.regtile
    if not 1 <= rows <= P:
        raise SpecError(f"wstrip's tile is a band of dy rows, 1 to Ho={P}; got {rows}")
    nt = warp_map_tiles(M, mw)
    map_tiles = ceil_div(M, 8)
    tiles = _tiles(p)
    sums = 4 * len(tiles) * nt
    if sums > MAX_ACCUMULATORS:
        raise SpecError(
            f"register tile {mw} maps keeps {sums} fp32 sums a thread ({len(tiles)} window "
            f"tiles x {nt} map tiles x 4), over {MAX_ACCUMULATORS}; choose "
            f"{8 * max(1, MAX_ACCUMULATORS // (4 * len(tiles)))} maps or fewer"
        )
    if not 1 <= rs <= rows:
        raise SpecError(f"register tile rows {rs}: a strip is 1 to the band's {rows} dy rows")
    map_groups = ceil_div(map_tiles, nt)
    map_tiles = map_groups * nt
    if C * map_groups > MAX_WARPS:
        raise SpecError(
            f"wstrip gives a warp to each channel and map group: {C} channels x "
            f"{map_groups} map groups = {C * map_groups} warps, over {MAX_WARPS}; "
            f"choose more maps a warp or --strategy wband"
        )
    if v.splits > 65535:
        raise SpecError(f"wstrip s{v.splits}: at most 65535 blocks (grid x)")
    octets = ceil_div(K, 8)
    pairs = ceil_div(K, 2)
    nj = ceil_div(Q, 16)  # 16-column chunks of a dy row
    row_groups = ceil_div(rows, rs)
    dy_rows = row_groups * rs  # the last strip may run past the band: zeros there
    units = nj * row_groups
    pg = max(1, min(units, BLOCK_WARPS // (C * map_groups)))
    warps = C * map_groups * pg
    threads = 32 * warps

    # 2. shared memory, in 32-bit words
    span = rs + 2 * pairs  # input rows under a strip, the last pair's second row included
    ih, ih_alloc = rows + K - 1, dy_rows + 2 * pairs
    iw = W + 2 * pad
    stride = iw + iw % 2
    plane = ih_alloc * stride
    # A lane reads columns up to 16 * nj + 8 * octets + 6 of a row: past the row, into
    # the next (against dy's zero columns) or, in the last plane, into this slack.
    slack = 16 * nj + 8 * octets + 8
    chunk_words, raw_words, even_words, odd_words = band16_words(p, ih, C * plane + slack)
    # dy: each map's rows of the band are one run of dy, copied in 16-byte units from the
    # 16-byte boundary at or before its start (the units past its end are zeros: rows past
    # the band or the image).  With Wo even every pair of a row is a word of the run,
    # read in place (pixels past Wo, the next row's, are masked); with Wo odd the run is
    # spread into rows of whole chunks, zeros past Wo.
    in_place = Q % 2 == 0
    run_elems = 8 + (dy_rows - 1) * Q + 16 * nj  # the skew, and the last chunk's reads
    run_words = ceil_div(run_elems, 8) * 4
    run_words += (4 - run_words) % 8  # 4 mod 8 words apart: a warp's 8 maps spread on banks
    dy_raw_words = ceil_div(M * run_words, 4) * 4
    dy_row_words = 8 * nj
    dy_plane = dy_rows * dy_row_words
    dy_plane += (4 - dy_plane) % 8
    dy_words = 0 if in_place else ceil_div(M * dy_plane, 4) * 4
    # lane 7's words, where it reads ones: a plane of them, read at the band's offsets
    ones_words = ceil_div(plane + slack, 8) * 4 if _lane_ones(p) else 0
    raw_at = 4  # after a word the spread may read (and mask) before the first raw band
    even_at = raw_at + 2 * raw_words
    odd_at = even_at + even_words
    ones_at = odd_at + odd_words
    dy_raw_at = ones_at + ones_words
    dy_at = dy_raw_at + 2 * dy_raw_words
    band_words = dy_at + dy_words
    ctx = sums_context(p, 1, v.splits, False, p.bias)
    row = ctx["row"]
    part_words = pg * row  # the block's warps' sums, after the bands
    words = max(band_words, part_words)
    nbytes = 4 * words
    if nbytes > OPTIN_SMEM_BYTES:
        raise SpecError(
            f"wstrip needs {nbytes} bytes of shared memory (x's band twice and its raw "
            f"copies {4 * (2 * raw_words + even_words + odd_words)} B, dy's "
            f"{4 * (band_words - dy_raw_at)} B), over the sm_90 limit of {OPTIN_SMEM_BYTES} "
            f"bytes per block; choose --tile {max(1, rows // 2)}"
        )

    bands_per_image = ceil_div(P, rows)
    ctx.update(
        band16_context(p, ih, threads, chunk_words),
        elem="f16" if p.dtype is DType.FP16 else "bf16",
        ones=ONES[p.dtype],
        lane_ones=_lane_ones(p),
        P=P,
        Q=Q,
        PQ=P * Q,
        rows=rows,
        ih=ih,
        ih_alloc=ih_alloc,
        iw=iw,
        stride=stride,
        row_words=stride // 2,
        plane=plane,
        octets=octets,
        tiles=tiles,
        db_tile=next((t["i"] for t in tiles if t["ones"]), None),
        nt=nt,
        mw=mw,
        map_groups=map_groups,
        RS_rows=rs,
        span=span,
        sums=sums,
        last_map=M - 1,
        row_word_count=octets + 1,  # words of an input row a lane reads
        run_elems=2 * run_words,
        dy_row_elems=2 * dy_row_words,
        dy_plane_elems=2 * dy_plane,
        strip_rows_at=[k * row for k in range(1, pg)],  # the strip groups' rows of sums
        quads=span - 1,
        quads_ahead=span - 1 - rs,  # quads built before a strip's first dy row
        quad_uses=len(tiles) // octets,
        nj=nj,
        units=units,
        pg=pg,
        warps_cm=C * map_groups,
        threads=threads,
        chunk_words=chunk_words,
        copy_words=C * chunk_words,
        raw_at=raw_at,
        raw_words=raw_words,
        even_at=even_at,
        odd_at=odd_at,
        zero_words=even_words + odd_words,
        ones_at=ones_at,
        ones_words=ones_words,
        in_place=in_place,
        masked=in_place and Q % 16 != 0,
        dy_raw_at=dy_raw_at,
        dy_raw_words=dy_raw_words,
        run_words=run_words,
        run_units=run_words // 4,
        dy_image_mod8=(M * P * Q) % 8,
        pq_mod8=(P * Q) % 8,
        q_mod8=Q % 8,
        b_row=Q // 2 if in_place else dy_row_words,
        dy_at=dy_at,
        dy_rows=dy_rows,
        dy_row_words=dy_row_words,
        dy_plane=dy_plane,
        dy_spread_rows=M * dy_rows,
        dy_spread_passes=ceil_div(16 * nj, 32),
        bands_per_image=bands_per_image,
        smem_bytes=nbytes,
        launch_bounds=f"{threads}, {min_blocks(warps)}",
        launch_bounds_alt=f"{threads}, 1",
        precision_note=f"{p.dtype.value} x and dy, products exact, accumulated in fp32",
    )
    name = v.kernel_name(p)
    main = Launch(
        name,
        (Role.X, Role.DY, Role.WORKSPACE, Role.BATCH),
        (threads, 1, 1),
        (v.splits, 1, 1),
        0,
        0,
        1,
        nbytes,
    )
    reduce = second_pass(name, row, v.splits, p.bias)
    loads = 4 * octets * (span - 1) + 2 * rs * nt
    mmas = rs * len(tiles) * nt
    kpad = 16 * nj
    sizes = (
        Size(
            "GEMM",
            f"({p.R} x {8 * octets}) taps x {M} maps x (B*{P}*{kpad})",
            f"window rows in pairs x taps padded to {8 * octets}, maps, and every dy pixel "
            f"(rows padded to {kpad} columns, {100.0 * (kpad - Q) / kpad:.1f}% zeros)",
        ),
        Size(
            "fragment",
            f"mma.m16n8k16, {p.dtype.value}",
            f"window rows 2a, 2a+1 x 8 taps by 8 maps by 16 pixels of a dy row; "
            f"{len(tiles)} tiles, each A a register quad of two input rows' words"
            + (
                ""
                if not p.bias
                else (
                    "; db in fragment row 7 (lane 7's words are ones)"
                    if _lane_ones(p)
                    else "; db in a tile of ones"
                )
            ),
        ),
        Size(
            "warp",
            f"strip of {rs} dy rows x 16 columns x {mw} maps",
            f"{sums} fp32 sums kept over the slice; {loads} shared loads for {mmas} mma "
            f"({loads / mmas:.2f} a mma)",
        ),
        Size(
            "block",
            f"{threads} threads",
            f"{C} channel(s) x {map_groups} map group(s) x {pg} strip group(s) of warps",
        ),
        Size(
            "work item",
            f"{rows} dy rows of an image",
            f"{row_groups} row group(s) x {nj} column chunk(s) = {units} strips; "
            f"{bands_per_image} item(s) an image, item i to block i % {v.splits}",
        ),
        Size(
            "smem x band",
            f"2 copies x [{C}][{ih_alloc}][{stride}] {p.dtype.value}",
            f"as is and shifted by one element; two raw bands of {4 * raw_words} B",
        ),
        Size(
            "smem dy band",
            f"2 x [{M}][{run_words} words]" + ("" if in_place else f" + [{M}][{dy_plane} words]"),
            f"each map's {dy_rows} rows one run of dy from a 16-byte boundary, "
            + (
                "read in place" + (f", pixels past Wo={Q} masked" if Q % 16 else "")
                if in_place
                else f"spread into rows of {2 * dy_row_words} (Wo={Q} is odd), zeros past Wo"
            ),
        ),
        Size(
            "workspace",
            f"{4 * v.splits * row} B",
            f"{v.splits} slices x {row} sums; the second kernel adds the slices in order",
        ),
    )
    return Plan(
        shape=p,
        variant=v,
        template="backward/wstrip.cu.j2",
        launches=(main, reduce),
        static_smem=0,
        dynamic_smem=nbytes,
        const_bytes=0,
        weight_format="f32",
        sizes=sizes,
        context=ctx,
        workspace_bytes=4 * v.splits * row,
        # a block's items: at most ceil(batch * bands / splits) bands of rows x 16 nj
        # pixels each; then the strip groups and the slices, in order
        sum_depth=(bands_per_image * rows * kpad, v.splits, pg + v.splits),
    )
