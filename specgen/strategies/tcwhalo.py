"""``tcwhalo``: wgrad of channels-last 16-bit layers on tensor cores, for layers whose
channels or maps are few (the 3-channel first and last layers of an autoencoder).

tcwgrad reads x through the im2col matrix: a block owns some (r, s, c) columns, so x's
pixels are fetched once per tap, and a row of x must hold 8 channels per copy.  Here a
block owns a tile of maps and a tile of channels *with every tap*: each chunk of the
reduction is ``rows`` whole output rows of one image, and the block keeps the input rows
under them (the halo) in shared memory, so each x pixel is fetched once per chunk and
every tap's fragment is the same rows read at a shifted address (``ldmatrix`` takes one
row address per lane).  dy's tile is the chunk's pixels by the block's maps.  An operand
whose channels (or maps) are not a multiple of 8 is gathered element by element through
registers, one chunk ahead; the wide one comes by 16-byte ``cp.async`` with zero-fill.
Products on ``mma.sync`` m16n8k16 with fp32 sums: dy's maps are the m16 side, each tap's
8 channels an n8 fragment.  The batch's chunks are cut into ``splits`` contiguous slices,
one block plane each; the slices' rows are added in order by the kernel tcwgrad uses
(``backward/tc_sums.j2``), so the result is deterministic.  db rides along: dy's
fragments times a fragment of ones, on the warps of the first channel tile.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import SpecError
from ..plan.common import SM_SHARED, Plan, Size, ceil_div
from ..shapes import DType, Feature, Op, TensorLayout
from ..variants import EPILOGUE, GEOMETRY, Count, Pair, Precision, Variant, param
from .mma import ROUNDING
from .tcgemm import MATH, MAX_ACCUMULATORS, STAGE_LIMIT, VECTOR
from .tcwgrad import slice_kernel, slice_sums

MAPS_TILES = (16, 32, 64, 128, 256)
CHANNEL_TILES = (8, 16, 32, 64, 128)
CHUNK_PIXELS = 64  # the default's rows: at most this many pixels a chunk
WARPS = 8
SMS = 132  # the H200's (and H100's) SMs
REGISTERS = 262  # _registers' estimate: ptxas fit up to 261 without spills, spilled from 267
GATHERS = 16  # elements a thread gathers per chunk (ptxas spilled at 24)
SUMS_PER_WARP = 72  # fp32 sums per thread the default's warp tile keeps at most


@dataclass(frozen=True, kw_only=True)
class Tcwhalo(Variant):
    key = "tcwhalo"
    templates = ("backward/tcwhalo.cu.j2",)
    family = "backward"
    description = (
        "wgrad on tensor cores for channels-last 16-bit tensors with few channels or maps: "
        "whole output rows a chunk, the input rows under them kept for every tap, "
        "mma.sync m16n8k16, batch slices added in order"
    )
    serves = GEOMETRY | EPILOGUE | {Feature.DTYPE16, Feature.NHWC}
    precisions = (Precision.BF16, Precision.FP16)
    tensor_core = True
    ops = frozenset({Op.WGRAD})

    blocktile: tuple[int, int] = param(
        (16, 64), Pair("b"), "tcwhalo: the block's maps x channels (with every tap)"
    )
    warpgrid: tuple[int, int] = param((1, 8), Pair("w"), "tcwhalo: warps along maps x channels")
    rows: int = param(2, Count("r"), "tcwhalo: output rows of one image per chunk")
    stages: int = param(4, Count("p"), "tcwhalo: chunks in the shared-memory ring")
    splits: int = param(
        64, Count("s"), "tcwhalo: slices of the batch's chunks, one block plane each"
    )

    def plan(self, problem):
        return plan_tcwhalo(problem, self)

    @classmethod
    def fit(cls, problem, seed):
        """The tensors' own math; the smallest tiles that hold a group's maps and
        channels (up to 128 each), the maps' cut first while a warp would keep more
        than SUMS_PER_WARP sums; up to eight warps, along the channels first (each warp
        reads every tap of its channels), then fewer with more maps each while four
        remain (0.038 against 0.045 ms on ae-enc1's 256 maps, H200); rows for at most 64
        pixels a chunk (the k16 steps of a chunk are unrolled, and their ldmatrix
        addresses held); four stages; slices for one wave of blocks."""
        own = _own(problem)
        if own is not None and seed.precision is not own:
            raise SpecError(
                f"tcwhalo multiplies the tensors' own dtype: {problem.dtype.value} tensors "
                f"take --precision {own.value}"
            )
        bm = next((t for t in MAPS_TILES if t >= min(problem.Mg, 128)), 128)
        bc = next((t for t in CHANNEL_TILES if t >= min(problem.Cg, 128)), 128)
        while True:
            wc = min(WARPS, bc // 8)
            wm = min(WARPS // wc, bm // 16)
            if _accumulators(problem, bm // wm, bc // wc) <= SUMS_PER_WARP:
                break
            if bm // wm > 16:
                bm //= 2
            elif bc // wc > 8:
                bc //= 2
            else:
                break  # a warp's 16 maps x 8 channels hold every tap's sums
        # fewer warps with more maps each while four remain: each warp reads every tap's
        # fragments, so a warp of 32 maps reads them once for twice the products
        while wm * wc > 4 and wm > 1:
            if _accumulators(problem, bm // (wm // 2), bc // wc) > SUMS_PER_WARP:
                break
            wm //= 2
        rows = max(1, min(problem.Ho, CHUNK_PIXELS // max(1, problem.Wo)))
        stages = seed.stages
        while rows > 1 and (
            stages * _stage_bytes(problem, bm, bc, rows) > STAGE_LIMIT
            or _registers(problem, bm, bc, (wm, wc), rows) > REGISTERS
            or _gathers(problem, bm, bc, (wm, wc), rows) > GATHERS
        ):
            rows -= 1
        bm, bc, wm, wc = _held(problem, bm, bc, wm, wc, rows)
        # one block per SM where two do not fit (registers or shared memory), then one
        # wave of blocks: a second wave would pay the ring's start again
        threads = 32 * wm * wc
        regs = min(255, _registers(problem, bm, bc, (wm, wc), rows))
        two = (
            threads * regs <= 32768
            and 2 * stages * _stage_bytes(problem, bm, bc, rows) <= SM_SHARED
        )
        tiles = _tiles(problem, bm, bc)
        splits = max(1, min(SMS * (2 if two else 1) // tiles, 65535))
        return replace(
            seed, blocktile=(bm, bc), warpgrid=(wm, wc), rows=rows, stages=stages, splits=splits
        )

    @classmethod
    def space(cls, problem, precision):
        """Around the default: half and twice the maps or the channels, half and twice the rows,
        2 to 4 stages, as many and twice the slices."""
        base = cls.fit(problem, cls(precision=precision))
        bm, bc = base.blocktile
        out = []
        tiles = [(bm, bc), (bm, min(128, 2 * bc)), (min(256, 2 * bm), bc)]
        tiles += [(bm, max(8, bc // 2)), (max(16, bm // 2), bc)]
        for tile in dict.fromkeys(tiles):
            wc = min(WARPS, tile[1] // 8)
            wm = min(WARPS // wc, tile[0] // 16)
            for rows in sorted({max(1, base.rows // 2), base.rows, base.rows * 2}):
                for stages in (2, 3, 4):
                    for factor in (1, 2):
                        s = max(1, base.splits * factor * bm * bc // (tile[0] * tile[1]))
                        out.append(
                            replace(
                                base,
                                blocktile=tile,
                                warpgrid=(wm, wc),
                                rows=rows,
                                stages=stages,
                                splits=min(s, 65535),
                            )
                        )
        return list(dict.fromkeys(out))


def _held(p, bm: int, bc: int, wm: int, wc: int, rows: int) -> tuple:
    """(bm, bc, wm, wc) whose threads hold a chunk of ``rows`` rows: at most GATHERS
    gathered elements and REGISTERS registers.  Where even one row is too much for them
    (shufflenet_v2's 1x1 layers of 58 and 116 channels and maps over rows of 56, 28 and
    14 pixels), more warps, up to eight, then the larger tile halved."""

    def over():
        warps = (wm, wc)
        return (
            _gathers(p, bm, bc, warps, rows) > GATHERS
            or _registers(p, bm, bc, warps, rows) > REGISTERS
        )

    while over():
        if wm * wc < WARPS and bm // wm >= 32:
            wm *= 2
        elif wm * wc < WARPS and bc // wc >= 16:
            wc *= 2
        elif bm > MAPS_TILES[0] and (bm >= bc or bc == CHANNEL_TILES[0]):
            bm //= 2
            wm = min(WARPS // wc, bm // 16)
        elif bc > CHANNEL_TILES[0]:
            bc //= 2
            wc = min(WARPS, bc // 8)
            wm = min(WARPS // wc, bm // 16)
        else:
            break  # the plan names what a thread would hold
    return bm, bc, wm, wc


def _own(p):
    """The tensors' own 16-bit math (tcgemm's MATH), or None for fp32 tensors, which
    tcwhalo does not take."""
    return None if p.dtype is DType.FP32 else MATH[p.dtype]


def _tiles(p, bm: int, bc: int) -> int:
    return ceil_div(p.Mg, bm) * ceil_div(p.Cg, bc) * p.groups


def _accumulators(p, wm_maps: int, wc_channels: int) -> int:
    return (wm_maps // 16) * (wc_channels // 8) * p.R * p.S * 4


def _halo(p, rows: int) -> tuple[int, int]:
    """Input rows under ``rows`` output rows, and slots (input columns) under a row."""
    (sh, sw), (dh, dw) = p.stride, p.dil
    return (rows - 1) * sh + (p.R - 1) * dh + 1, (p.Wo - 1) * sw + (p.S - 1) * dw + 1


def _per_thread(p, bm: int, bc: int, rows: int, threads: int) -> int:
    """Copies (or gathered elements) a thread issues per chunk, of dy and of x."""
    hin, slots = _halo(p, rows)
    pixels = rows * p.Wo
    if p.Mg % VECTOR:
        dy = ceil_div(pixels * min(bm, p.Mg), threads)
    else:
        dy = ceil_div(pixels, threads // (bm // VECTOR))
    if p.Cg % VECTOR:
        x = ceil_div(hin * slots * min(bc, p.Cg), threads)
    else:
        x = ceil_div(hin * slots, threads // (bc // VECTOR))
    return dy, x


def _gathers(p, bm: int, bc: int, warps: tuple[int, int], rows: int) -> int:
    dy, x = _per_thread(p, bm, bc, rows, 32 * warps[0] * warps[1])
    return (dy if p.Mg % VECTOR else 0) + (x if p.Cg % VECTOR else 0)


def _registers(p, bm: int, bc: int, warps: tuple[int, int], rows: int) -> int:
    """What a thread holds, fitted to ptxas' counts on drawn problems and the
    autoencoder's layers: the sums (db's too), two sets of fragments, the ldmatrix addresses of
    each k16 step (hoisted out of the chunk loop), two registers per 16-byte copy and
    seven per gathered element (value, address, bounds), and 40 more."""
    threads = 32 * warps[0] * warps[1]
    fm, frags = bm // warps[0] // 16, (bc // warps[1] // 8) * p.R * p.S
    ksteps = ceil_div(rows * p.Wo, 32) * 2
    held = fm * frags * 4 + 2 * frags * 2 + 2 * fm * 4 + (fm * 4 if p.bias else 0)
    addresses = ksteps * (ceil_div(frags, 2) + fm)
    dy, x = _per_thread(p, bm, bc, rows, threads)
    copies = (2 if p.Mg % VECTOR == 0 else 7) * dy + (2 if p.Cg % VECTOR == 0 else 7) * x
    return held + addresses + copies + 40


def _stage_bytes(p, bm: int, bc: int, rows: int) -> int:
    hin, slots = _halo(p, rows)
    return ceil_div(rows * p.Wo, 32) * 32 * bm * 2 + hin * slots * bc * 2


def _copies(wide: bool, what: str) -> str:
    return f"{what} by 16-byte cp.async" if wide else f"{what} element by element, a chunk ahead"


def _swizzle(units: int) -> tuple[int, int]:
    """(shift, mask) of the XOR that spreads the 8 rows one ldmatrix reads at the same
    16-byte unit over 8 bank quads, for rows of ``units`` units."""
    if units >= 8:
        return 0, 7
    return {4: (1, 3), 2: (2, 1), 1: (0, 0)}[units]


def halo_tile_limits(p, v, maps_tiles, channel_tiles, max_sums: int) -> tuple:
    """The limits the halo-tile wgrads (tcwhalo, tc3wgrad) share: the block's maps and
    channels among the tiles given, warps of 16 maps and 8 channels, at most
    ``max_sums`` sums a thread and 512 threads, rows within the image, a ring of 2 to 8
    chunks, slices within grid z.  Returns (warp maps, warp channels, m16 fragments,
    8-channel groups, taps, sums, threads)."""
    key = v.key
    bm, bc = v.blocktile
    wm_count, wc_count = v.warpgrid
    if bm not in maps_tiles or bc not in channel_tiles:
        raise SpecError(
            f"{key} b{bm}x{bc}: maps per block must be one of {maps_tiles}, channels one "
            f"of {channel_tiles}"
        )
    if bm % (16 * wm_count) or bc % (8 * wc_count):
        raise SpecError(
            f"{key} b{bm}x{bc} w{wm_count}x{wc_count}: each warp needs a multiple of 16 maps "
            "and 8 channels; choose fewer warps"
        )
    warp_m, warp_c = bm // wm_count, bc // wc_count
    fm, fc = warp_m // 16, warp_c // 8
    taps = p.R * p.S
    sums = fm * fc * taps * 4
    if sums > max_sums:
        raise SpecError(
            f"{key}'s warp tile of {warp_m} maps x {warp_c} channels x {taps} taps needs "
            f"{sums} fp32 sums per thread, over {max_sums}; choose more warps "
            "(--warpgrid) or a smaller --blocktile"
        )
    threads = 32 * wm_count * wc_count
    if threads > 512:
        raise SpecError(f"{key} w{wm_count}x{wc_count}: {threads} threads, over 512")
    if not 1 <= v.rows <= p.Ho:
        raise SpecError(f"{key} r{v.rows}: a chunk is 1 to {p.Ho} output rows (Ho)")
    if not 2 <= v.stages <= 8:
        raise SpecError(f"{key} p{v.stages}: the ring holds 2 to 8 chunks")
    if v.splits > 65535:
        raise SpecError(f"{key} s{v.splits}: at most 65535 slices (grid z)")
    return warp_m, warp_c, fm, fc, taps, sums, threads


def plan_tcwhalo(p, v: Tcwhalo) -> Plan:
    # 1. limits
    if p.layout is not TensorLayout.NHWC or p.dtype is DType.FP32:
        raise SpecError(
            "tcwhalo reads channels-last 16-bit tensors: use dtype=bf16 or fp16 with "
            "layout=nhwc in the shape spec, or --strategy wband"
        )
    own = _own(p)
    if v.precision is not own:
        raise SpecError(
            f"tcwhalo multiplies the tensors' own dtype: {p.dtype.value} tensors take "
            f"--precision {own.value}"
        )
    bm, bc = v.blocktile
    wm_count, wc_count = v.warpgrid
    warp_m, warp_c, fm, fc, taps, sums, threads = halo_tile_limits(
        p, v, MAPS_TILES, CHANNEL_TILES, MAX_ACCUMULATORS
    )
    stage = _stage_bytes(p, bm, bc, v.rows)
    smem = v.stages * stage
    if smem > STAGE_LIMIT:
        fits = STAGE_LIMIT // stage
        raise SpecError(
            f"tcwhalo's ring of {v.stages} chunks of {v.rows} rows needs {smem} B of shared "
            f"memory, over the {STAGE_LIMIT} B a block may opt in to; choose "
            + (f"--stages {fits}" if fits >= 2 else "fewer --rows or a smaller --blocktile")
        )
    gathers = _gathers(p, bm, bc, v.warpgrid, v.rows)
    if gathers > GATHERS:
        raise SpecError(
            f"tcwhalo r{v.rows} w{wm_count}x{wc_count}: a thread would gather {gathers} "
            f"elements a chunk, over {GATHERS} (their values and addresses spill); choose "
            "fewer --rows or more warps"
        )
    need = _registers(p, bm, bc, v.warpgrid, v.rows)
    if need > REGISTERS:
        raise SpecError(
            f"tcwhalo r{v.rows} w{wm_count}x{wc_count}: a thread would hold about {need} "
            f"registers (sums, fragments, the chunk's addresses and copies), over "
            f"{REGISTERS}; choose fewer --rows or more warps"
        )

    # 2. work
    hin, slots = _halo(p, v.rows)
    pixels = v.rows * p.Wo  # a chunk's pixels
    # padded to an even number of k16 steps: the fragments' two register sets alternate
    kc = ceil_div(pixels, 32) * 32
    ua, ub = bm // VECTOR, bc // VECTOR  # 16-byte units per dy row and per x slot
    wide_dy, wide_x = p.Mg % VECTOR == 0, p.Cg % VECTOR == 0
    (sh, sw), (dh, dw) = p.stride, p.dil
    pt, _, pl, _ = p.pads
    row_blocks = ceil_div(p.Ho, v.rows)
    # fragments of a warp: tap-major, then the warp's 8-channel groups
    frags = [(t // p.S, t % p.S, j) for t in range(taps) for j in range(fc)]
    pairs = [(frags[i], frags[min(i + 1, len(frags) - 1)]) for i in range(0, len(frags), 2)]
    a_shift, a_mask = _swizzle(ua)
    b_shift, b_mask = _swizzle(ub)
    mn, cn = min(bm, p.Mg), min(bc, p.Cg)  # elements a narrow copy gathers per row
    CgRS = p.Cg * taps
    name = v.kernel_name(p)
    ctx, workspace, reduce, gemm, scratch = slice_sums(p, name, v.splits)
    ctx.update(
        elem="f16" if p.dtype is DType.FP16 else "bf16",
        mma_shape="m16n8k16",
        BM=bm,
        BC=bc,
        WM=warp_m,
        WC=warp_c,
        warps_m=wm_count,
        FM=fm,
        FC=fc,
        NF=len(frags),
        pairs=[
            dict(
                f0=2 * i,
                f1=2 * i + 1 if 2 * i + 1 < len(frags) else None,
                off0=a[0] * dh * slots + a[1] * dw,
                off1=b[0] * dh * slots + b[1] * dw,
                j0=a[2],
                j1=b[2],
                taps=f"({a[0]}, {a[1]})" + (f" and ({b[0]}, {b[1]})" if a[:2] != b[:2] else ""),
            )
            for i, (a, b) in enumerate(pairs)
        ],
        TH=v.rows,
        KP=pixels,
        KC=kc,
        KSTEPS=kc // 16,
        HIN=hin,
        SL=slots,
        stages=v.stages,
        threads=threads,
        ua=ua,
        ub=ub,
        a_shift=a_shift,
        a_mask=a_mask,
        b_shift=b_shift,
        b_mask=b_mask,
        wide_dy=wide_dy,
        wide_x=wide_x,
        a_step=threads // ua,
        a_rows=ceil_div(pixels, threads // ua),
        a_guard=pixels % (threads // ua) != 0,
        b_step=threads // ub,
        b_rows=ceil_div(hin * slots, threads // ub),
        b_guard=hin * slots % (threads // ub) != 0,
        MN=mn,
        CN=cn,
        na=ceil_div(pixels * mn, threads),
        na_guard=pixels * mn % threads != 0,
        nb=ceil_div(hin * slots * cn, threads),
        nb_guard=hin * slots * cn % threads != 0,
        clear=kc > pixels or not wide_dy or not wide_x,
        a_stage=kc * bm * 2,
        b_stage=hin * slots * bc * 2,
        smem=smem,
        CgRS=CgRS,
        P=p.Ho * p.Wo,
        HB=row_blocks,
        sh=sh,
        sw=sw,
        pt=pt,
        pl=pl,
        map_tiles=ceil_div(p.Mg, bm),
        guard_maps=p.Mg % bm != 0,
        guard_channels=p.Cg % bc != 0,
        min_blocks=max(1, 256 // threads),
        precision_note=ROUNDING[v.precision].replace("x and w", "x and dy"),
    )
    channel_tiles, map_tiles = ceil_div(p.Cg, bc), ceil_div(p.Mg, bm)
    main = slice_kernel(name, threads, (channel_tiles, map_tiles * p.groups, v.splits), smem)
    sizes = (
        gemm,
        Size(
            "block tile",
            f"{bm} maps x {bc} channels x {taps} taps",
            f"{wm_count}x{wc_count} warps of {warp_m} maps x {warp_c} channels: {fm} m16 x "
            f"{len(frags)} n8 fragments, {sums} fp32 sums per thread",
        ),
        Size(
            "chunk",
            f"{v.rows} output rows = {pixels} pixels (k padded to {kc})",
            f"under them {hin} input rows x {slots} columns; "
            f"{_copies(wide_dy, 'dy')}, {_copies(wide_x, 'x')}",
        ),
        Size(
            "__shared__",
            f"{smem} B (dynamic)",
            f"{v.stages} stages x ({kc} pixels x {bm} maps + {hin} x {slots} x {bc} channels) "
            "x 2 B, XOR-swizzled in 16-byte units",
        ),
        Size(
            "grid",
            f"{channel_tiles} x {map_tiles * p.groups} x {v.splits}",
            f"channel tiles x map tiles{' x groups' if p.groups > 1 else ''} x slices of the "
            f"batch's {row_blocks} chunks an image",
        ),
        scratch,
    )
    return Plan(
        shape=p,
        variant=v,
        template="backward/tcwhalo.cu.j2",
        launches=(main, reduce),
        static_smem=0,
        dynamic_smem=smem,
        const_bytes=0,
        weight_format="f32",
        sizes=sizes,
        context=ctx,
        workspace_bytes=workspace,
        # a slice holds at most ceil(batch / splits) images' chunks (db's sums too); then
        # the slices in order
        sum_depth=(row_blocks * pixels, v.splits, v.splits),
    )
