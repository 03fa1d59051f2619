"""``tc3wgrad``: fp32 wgrad of NCHW layers on tensor cores, each product as three tf32
products (3xTF32), so that the result keeps fp32's accuracy.

Per group dw is one matrix product whose reduction runs over every output pixel of the
batch: dw[m][(r, s, c)] = sum over p of dy[m][p] * x[c][p's tap (r, s)].  In NCHW both
operands run along the pixels, the reduction's own axis, so a block stages whole output
rows of one image (a chunk) as they lie: dy's rows for its maps, and for its channels
the input rows under them (the halo), from which every tap's operand is the same rows
read at a shifted address.  Rows are copied 16 bytes at a time by ``cp.async`` into a
ring of ``stages`` chunks; padding is zeros written once, rows past the image are the
copies' zero-fill.

Each fp32 word read for a fragment is split into a tf32 ``hi`` (its bits rounded to
nearest, ties away: two integer operations) and the rest ``lo = v - hi`` (exact in fp32;
the tensor cores read its leading 10 mantissa bits), and the warp multiplies on
``mma.sync`` m16n8k8 in tf32 three times a k8 step, lo x hi, hi x lo and hi x hi, from
zero; the step's sums are then added to the thread's in fp32, rounded to nearest.  The
tensor cores' own sums truncate: chained over a whole slice they drifted toward zero,
2e-5 of dw on ae-enc2 at B=128, where a step's chain leaves 4e-7 (relative L2 from
float64; wtap 6e-7, cuDNN fp32 7e-6; ``scripts/wgrad_accuracy.py``, H200).  The dropped
lo x lo and the truncation of lo leave about 5 x 2^-22 of each product
(``reference.error_coefficient``), below what the fp32 sums of a long reduction add, so
the kernel serves fp32 math.  In tf32 math (``--precision tf32``) each word is rounded
to tf32 the same way and multiplied once, a step's sum still added in fp32: tf32 in
place on NCHW tensors, which tune searches (the planner's tf32 pick for an NCHW layer is
tcwgrad's in NHWC).  It spends three tensor-core products where tf32 spends one,
and the tensor cores have rate enough for them on wide layers, where fp32 FMAs bound
every other fp32 wgrad (the autoencoder's 3x3 layers: wtap runs FFMA at nearly full
issue).

A lane's fragment words sit at one address per lane plus constants of the step and the
tap, with each map's and channel's stride 4 words past a multiple of 8, so the 32 lanes
of a load fall in 32 banks.  The batch's chunks are cut into ``splits`` contiguous
slices, one block plane each, whose sums ``backward/tc_sums.j2`` adds in order, so the
result is deterministic; db is summed from dy's words as they are read, in fp32, by the
warps of the first channel tile.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import SpecError
from ..plan.common import SM_SHARED, Plan, Size, ceil_div
from ..shapes import DType, Op, TensorLayout
from ..variants import EPILOGUE, GEOMETRY, Count, Pair, Precision, Variant, param
from .tcgemm import STAGE_LIMIT
from .tcwgrad import slice_kernel, slice_sums
from .tcwhalo import halo_tile_limits

MAPS_TILES = (16, 32, 64, 128)
CHANNEL_TILES = (8, 16, 32, 64)
MAX_SUMS = 96  # fp32 sums a thread keeps (144, a warp of 64 maps, spilled at 255 registers)
CHUNK_PIXELS = 64  # the fit's rows: at most this many (padded) pixels a chunk
SMS = 132  # the H200's (and H100's) SMs
COPIES = 24  # 16-byte copies a thread issues a chunk (33 spilled past 255 registers)
# _registers' limits: the plan's (ptxas spilled past estimates of about 240 on drawn
# problems), and the fit's, which keeps a margin (NVRTC 12 and 13 allocate differently)
REGISTERS = 232
FIT_REGISTERS = 216
WORD = 4  # bytes of an fp32
UNIT = 4  # fp32 words per 16-byte copy


@dataclass(frozen=True, kw_only=True)
class Tc3wgrad(Variant):
    key = "tc3wgrad"
    templates = ("backward/tc3wgrad.cu.j2",)
    family = "backward"
    description = (
        "wgrad of fp32 NCHW layers on tensor cores, in 3xTF32 (fp32 accuracy: mma.sync "
        "m16n8k8 three times a product) or in tf32 (once): whole output rows a chunk with "
        "the input rows under them, every tap a shifted read, batch slices added in order"
    )
    serves = GEOMETRY | EPILOGUE
    precisions = (Precision.FP32, Precision.TF32)
    tensor_core = True
    ops = frozenset({Op.WGRAD})

    blocktile: tuple[int, int] = param(
        (64, 32), Pair("b"), "tc3wgrad: the block's maps x channels (with every tap)"
    )
    warpgrid: tuple[int, int] = param((2, 4), Pair("w"), "tc3wgrad: warps along maps x channels")
    rows: int = param(2, Count("r"), "tc3wgrad: output rows of one image per chunk")
    stages: int = param(4, Count("p"), "tc3wgrad: chunks in the shared-memory ring")
    splits: int = param(
        16, Count("s"), "tc3wgrad: slices of the batch's chunks, one block plane each"
    )

    def plan(self, problem):
        return plan_tc3wgrad(problem, self)

    @classmethod
    def fit(cls, problem, seed):
        """Warps of 32 maps x 8 channels (72 sums on a 3x3 window: the most products per
        shared load that the registers hold), 16 maps where the window is larger, the
        group's maps are 16 or fewer, or a chunk of one row would still spill; blocks of
        up to 2 x 4 such warps, no larger than a group's maps and channels (17 to 24
        channels: a 32-channel tile over 2 warps of 16, or 4 of 8 where those spill, not
        3 warps that no tile divides); rows for at most 64 pixels a chunk (ae-enc2 at
        B=128, H200: 4 rows 0.292 ms, 2 rows 0.305, 1 row 0.316); slices for two blocks
        an SM where they fit, else one."""
        p = problem
        taps = p.R * p.S
        wc = max(1, min(4, ceil_div(p.Cg, 8)))
        bc = next(t for t in CHANNEL_TILES if t >= min(wc * 8, 64))
        # 3 warps along the channels: 2 of 16 channels, else 4 of 8
        channel_warps = [wc] if bc % (8 * wc) == 0 else [bc // 16, bc // 8]
        shapes = []  # (warps along the channels, maps a warp), the first that fits
        for wc in channel_warps:
            fc = bc // wc // 8
            if 2 * fc * taps * 4 <= MAX_SUMS and p.Mg > 16:
                shapes.append((wc, 32))
            if fc * taps * 4 <= MAX_SUMS:
                shapes.append((wc, 16))
        if not shapes:
            raise SpecError(
                f"tc3wgrad keeps {taps * 4} sums a thread for each 16 maps x 8 channels of a "
                f"{p.R}x{p.S} window, over {MAX_SUMS}; use --strategy wtap"
            )
        for wc, wmaps in shapes:
            v = _rows_and_stages(p, seed, wmaps, bc, wc)
            if _registers(p, v) <= REGISTERS and _copies(p, v) <= COPIES:
                break
        bm, _ = v.blocktile
        wm, _ = v.warpgrid
        threads = 32 * wm * wc
        two = (
            2 * threads * _registers(p, v) <= 65536
            and 2 * v.stages * _stage_bytes(p, v) <= SM_SHARED
        )
        tiles = _tiles(p, bm, bc)
        splits = max(1, min(SMS * (2 if two else 1) // tiles, 65535))
        return replace(v, splits=splits)

    @classmethod
    def space(cls, problem, precision):
        """Around the default: half and twice the maps or the channels, the warps along
        each halved, half and twice the rows, 3 or 4 stages, half, as many and twice the
        slices."""
        if precision not in (Precision.FP32, Precision.TF32):
            return []
        try:
            base = cls.fit(problem, cls(precision=precision))
        except SpecError:
            return []  # a window whose sums no warp holds
        bm, bc = base.blocktile
        wm, wc = base.warpgrid
        shapes = [((bm, bc), (wm, wc)), ((bm, bc), (max(1, wm // 2), wc))]
        shapes += [((bm, bc), (wm, max(1, wc // 2)))]
        shapes += [((min(128, 2 * bm), bc), (wm, wc)), ((bm, min(64, 2 * bc)), (wm, wc))]
        shapes += [((max(16, bm // 2), bc), (max(1, wm // 2), wc))]
        out = []
        for tile, warps in dict.fromkeys(shapes):
            for rows in sorted({max(1, base.rows // 2), base.rows, base.rows * 2}):
                for stages in (3, 4):
                    for factor in (1, 2, 4):
                        s = base.splits * factor * bm * bc // (2 * tile[0] * tile[1])
                        out.append(
                            replace(
                                base,
                                blocktile=tile,
                                warpgrid=warps,
                                rows=rows,
                                stages=stages,
                                splits=max(1, min(s, 65535)),
                            )
                        )
        return list(dict.fromkeys(out))


def _rows_and_stages(p, seed, wmaps: int, bc: int, wc: int):
    """Up to 2 warps of ``wmaps`` maps along the maps beside ``wc`` along ``bc``
    channels; as many rows as fit the chunk's pixels, the registers and the copies; as
    many stages as fit the shared memory."""
    wm = max(1, min(2, ceil_div(p.Mg, wmaps)))
    bm = next(t for t in MAPS_TILES if t >= min(wm * wmaps, 128))
    bm = max(bm, 16 * wm)
    rows = max(1, min(p.Ho, CHUNK_PIXELS // _padded_width(p)))
    v = replace(seed, blocktile=(bm, bc), warpgrid=(wm, wc), rows=rows, stages=seed.stages)
    while v.rows > 1 and (_registers(p, v) > FIT_REGISTERS or _copies(p, v) > COPIES):
        v = replace(v, rows=v.rows - 1)
    while v.stages > 2 and v.stages * _stage_bytes(p, v) > STAGE_LIMIT:
        v = replace(v, stages=v.stages - 1)
    return v


def _tiles(p, bm: int, bc: int) -> int:
    return ceil_div(p.Mg, bm) * ceil_div(p.Cg, bc) * p.groups


def _padded_width(p) -> int:
    """A dy row's pixels in shared memory: Wo rounded up to the k8 steps."""
    return ceil_div(p.Wo, 8) * 8


def _geometry(p, rows: int) -> dict:
    """Where things lie in a stage (in fp32 words): dy's map rows of ``KC`` pixels (the
    chunk's rows, each padded to the k8 steps) ``MS`` apart; x's channels ``CS`` apart,
    each ``HIN`` input rows of ``XS`` words, the row's pixels from word ``X0`` (16-byte
    aligned, left of it the padding's zeros).  MS and CS are 4 past a multiple of 8: the
    8 maps (channels) x 4 pixels a fragment load reads fall in 32 banks."""
    (sh, sw), (dh, dw) = p.stride, p.dil
    pl = p.pads[2]
    wop = _padded_width(p)
    kc = rows * wop
    hin = (rows - 1) * sh + (p.R - 1) * dh + 1
    x0 = ceil_div(pl, UNIT) * UNIT
    last = x0 - pl + (wop - 1) * sw + (p.S - 1) * dw  # the rightmost word a tap reads
    xs = ceil_div(max(x0 + p.W, last + 1), UNIT) * UNIT
    cs = hin * xs
    cs += 4 if cs % 8 == 0 else 0
    return dict(WOP=wop, KC=kc, MS=kc + 4, HIN=hin, X0=x0, XS=xs, CS=cs)


def _stage_bytes(p, v) -> int:
    g = _geometry(p, v.rows)
    bm, bc = v.blocktile
    return WORD * (bm * g["MS"] + bc * g["CS"])


def _copies(p, v) -> int:
    """The 16-byte copies of dy's and x's rows a thread issues per chunk."""
    threads = 32 * v.warpgrid[0] * v.warpgrid[1]
    dy = ceil_div(v.blocktile[0] * v.rows * (p.Wo // UNIT), threads)
    x = ceil_div(v.blocktile[1] * _geometry(p, v.rows)["HIN"] * (p.W // UNIT), threads)
    return dy + x


def _registers(p, v) -> int:
    """A thread's sums, its A fragments' hi and lo words, db's sums, 4 a 16-byte copy
    of a chunk and 88 more (addresses, B fragments, the steps' sums in flight): an
    estimate, not ptxas' count (ae-enc2's 4 and 8 rows: 204 and 228 against 220 and 250)."""
    fm = v.blocktile[0] // v.warpgrid[0] // 16
    fc = v.blocktile[1] // v.warpgrid[1] // 8
    sums = fm * fc * p.R * p.S * 4
    return sums + fm * 8 + (fm * 4 if p.bias else 0) + 4 * _copies(p, v) + 88


def plan_tc3wgrad(p, v: Tc3wgrad) -> Plan:
    # 1. limits
    if p.dtype is not DType.FP32 or p.layout is not TensorLayout.NCHW:
        raise SpecError(
            "tc3wgrad computes fp32 NCHW tensors; for 16-bit or channels-last layers use "
            "--strategy tcwgrad or tcwhalo"
        )
    if v.precision not in (Precision.FP32, Precision.TF32):
        raise SpecError(
            "tc3wgrad computes fp32 math (three tf32 products each) or tf32: take "
            "--precision fp32 or tf32"
        )
    if p.W % UNIT or p.Wo % UNIT:
        raise SpecError(
            f"tc3wgrad copies rows of x and dy 16 bytes at a time: W={p.W} and Wo={p.Wo} "
            f"must be multiples of {UNIT}; use --strategy wtap"
        )
    bm, bc = v.blocktile
    wm_count, wc_count = v.warpgrid
    warp_m, warp_c, fm, fc, taps, sums, threads = halo_tile_limits(
        p, v, MAPS_TILES, CHANNEL_TILES, MAX_SUMS
    )
    geo = _geometry(p, v.rows)
    ksteps = geo["KC"] // 8
    row_steps = geo["WOP"] // 8  # the k8 steps of one output row
    stage = _stage_bytes(p, v)
    smem = v.stages * stage
    if smem > STAGE_LIMIT:
        fits = STAGE_LIMIT // stage
        raise SpecError(
            f"tc3wgrad's ring of {v.stages} chunks of {v.rows} rows needs {smem} B of shared "
            f"memory, over the {STAGE_LIMIT} B a block may opt in to; choose "
            + (f"--stages {fits}" if fits >= 2 else "fewer --rows or a smaller --blocktile")
        )
    copies = _copies(p, v)
    if copies > COPIES:
        raise SpecError(
            f"tc3wgrad r{v.rows} w{wm_count}x{wc_count}: a thread would issue {copies} "
            f"16-byte copies a chunk, over {COPIES} (their addresses spill); choose fewer "
            "--rows or more warps"
        )
    need = _registers(p, v)
    if need > REGISTERS or threads * need > 65536:
        raise SpecError(
            f"tc3wgrad b{bm}x{bc} w{wm_count}x{wc_count} r{v.rows}: {threads} threads of about "
            f"{need} registers, over the SM's 65536 or {REGISTERS} a thread (where ptxas "
            "spills); choose "
            + ("fewer warps" if need <= REGISTERS else "fewer --rows or more warps")
        )

    # 2. work
    (sh, sw), (dh, dw) = p.stride, p.dil
    pt, _, pl, _ = p.pads
    hb = ceil_div(p.Ho, v.rows)  # chunks an image
    dy_units = bm * v.rows * (p.Wo // UNIT)
    x_units = bc * geo["HIN"] * (p.W // UNIT)
    frags = [(t // p.S, t % p.S, j) for t in range(taps) for j in range(fc)]
    # The words of a chunk's first k8 step (pixels 0..7 of its first output row); step
    # kk of row rr reads the same words rr * WOP + 8 * kk on in dy and rr * sh * XS + 8 *
    # kk * sw on in x.
    step = dict(
        # dy: words e of fragment i at the lane's address plus this
        a=[
            [i * 16 * geo["MS"] + e % 2 * 8 * geo["MS"] + e // 2 * 4 for e in range(4)]
            for i in range(fm)
        ],
        # x: words e of fragment f (tap (r, s), channels 8j..) likewise
        b=[
            [
                j * 8 * geo["CS"] + r * dh * geo["XS"] + geo["X0"] - pl + 4 * e * sw + s * dw
                for e in range(2)
            ]
            for r, s, j in frags
        ],
    )
    CgRS = p.Cg * taps
    name = v.kernel_name(p)
    ctx, workspace, reduce, gemm, scratch = slice_sums(p, name, v.splits)
    regs = _registers(p, v)
    products = 3 if v.three_tf32 else 1
    ctx.update(
        geo,
        three=v.three_tf32,
        elem="tf32",
        mma_shape="m16n8k8",
        BM=bm,
        BC=bc,
        WM=warp_m,
        WC=warp_c,
        warps_m=wm_count,
        FM=fm,
        FC=fc,
        NF=len(frags),
        frag_taps=[f"({r}, {s})" for r, s, _ in frags],
        step=step,
        row_steps=row_steps,
        TH=v.rows,
        HB=hb,
        stages=v.stages,
        threads=threads,
        dy_units=dy_units,
        x_units=x_units,
        dy_copies=ceil_div(dy_units, threads),
        x_copies=ceil_div(x_units, threads),
        dy_guard=dy_units % threads != 0,
        x_guard=x_units % threads != 0,
        a_stage=bm * geo["MS"],
        b_stage=bc * geo["CS"],
        smem=smem,
        CgRS=CgRS,
        sh=sh,
        sw=sw,
        pt=pt,
        pl=pl,
        map_tiles=ceil_div(p.Mg, bm),
        guard_maps=p.Mg % bm != 0,
        guard_channels=p.Cg % bc != 0,
        # two blocks an SM where the estimate says they fit; one where that spills
        launch_bounds=f"{threads}, {2 if 2 * threads * regs <= 65536 else 1}",
        launch_bounds_alt=f"{threads}, 1",
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
            f"{v.rows} output rows = {v.rows * p.Wo} pixels (k padded to {geo['KC']})",
            f"under them {geo['HIN']} input rows; {ksteps} k8 steps of {products} x "
            f"{fm * len(frags)} mma a warp, one at a time",
        ),
        Size(
            "__shared__",
            f"{smem} B (dynamic)",
            f"{v.stages} stages x (dy [{bm}][{geo['MS']}] + x [{bc}][{geo['CS']}]) x 4 B: "
            f"rows of {geo['WOP']} and {geo['XS']} words",
        ),
        Size(
            "grid",
            f"{channel_tiles} x {map_tiles * p.groups} x {v.splits}",
            f"channel tiles x map tiles{' x groups' if p.groups > 1 else ''} x slices of the "
            f"batch's {hb} chunks an image",
        ),
        scratch,
    )
    return Plan(
        shape=p,
        variant=v,
        template="backward/tc3wgrad.cu.j2",
        launches=(main, reduce),
        static_smem=0,
        dynamic_smem=smem,
        const_bytes=0,
        weight_format="f32",
        sizes=sizes,
        context=ctx,
        workspace_bytes=workspace,
        # a slice holds at most ceil(batch / splits) images' chunks, three tf32 products
        # a pixel into the same sums in fp32 math, one in tf32 (db's sums fewer); then
        # the slices in order
        sum_depth=(products * hb * geo["KC"], v.splits, v.splits),
    )
