"""``tcwgrad``: wgrad (and db) of channels-last layers on tensor cores: 16-bit tensors
in their own dtype, fp32 tensors in tf32 or (``--precision fp32``) in three tf32 products.

Per group dw is one matrix product whose reduction runs over every output pixel of the
batch: dw[m][(r, s, c)] = sum over p of dy[p][m] * X[p][(r, s, c)], X the implicit
im2col matrix of x.  With NHWC tensors both operands are rows of the pixels: dy's row
holds the maps, X's row of one tap holds the channels, so 16-byte ``cp.async`` copies
fill both tiles (a zero-fill where the tap leaves the image) in a ring of ``stages``
chunks of pixels.  The reduction runs down the tiles' rows, so the fragments are read
transposed: ``ldmatrix.trans`` for 16-bit elements, one 32-bit load a word for fp32
(rounded to tf32), the rows XOR-swizzled in 16-byte units; the warps multiply on
``mma.sync`` (m16n8k16, or m16n8k8 in tf32) with fp32 sums.  The batch's pixels are cut
into ``splits`` contiguous slices, one block plane each; every slice writes its fp32
sums to a workspace row and ``backward/tc_sums.j2`` adds the rows in order, so the
result is deterministic.  db rides along: dy's fragments times a fragment of ones, on
the warps of the first column tile.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import SpecError
from ..plan.common import Launch, Plan, Size, ceil_div
from ..shapes import DType, Feature, Op, TensorLayout
from ..tensors import Role
from ..variants import EPILOGUE, GEOMETRY, Count, Pair, Precision, Variant, param
from .mma import ROUNDING
from .tcgemm import MATH, MAX_ACCUMULATORS, STAGE_LIMIT, maths_of
from .wsplit import TC_SUMS, second_pass, sums_context

TARGET_BLOCKS = 2 * 132  # about two blocks on each of the H200's SMs


@dataclass(frozen=True, kw_only=True)
class Tcwgrad(Variant):
    key = "tcwgrad"
    templates = ("backward/tcwgrad.cu.j2",)
    family = "backward"
    description = (
        "wgrad on tensor cores for channels-last tensors: pixels as the reduction, cp.async "
        "ring, transposed fragment reads, mma.sync in the tensors' 16-bit dtype or tf32, "
        "batch slices added in order"
    )
    serves = GEOMETRY | EPILOGUE | {Feature.DTYPE16, Feature.NHWC}
    precisions = (Precision.BF16, Precision.FP16, Precision.TF32, Precision.FP32)
    tensor_core = True
    ops = frozenset({Op.WGRAD})

    blocktile: tuple[int, int] = param(
        (128, 128), Pair("b"), "tcwgrad: the block's tile of dw, maps x (r, s, c) columns"
    )
    warpgrid: tuple[int, int] = param((2, 2), Pair("w"), "tcwgrad: warps along maps x columns")
    chunk: int = param(32, Count("k"), "tcwgrad: pixels per pipeline stage")
    stages: int = param(4, Count("p"), "tcwgrad: chunks in the shared-memory ring")
    splits: int = param(
        16, Count("s"), "tcwgrad: slices of the batch's pixels, one block plane each"
    )

    def plan(self, problem):
        return plan_tcwgrad(problem, self)

    @classmethod
    def fit(cls, problem, seed):
        """The tensors' own math; tiles of 64 where a group's maps or columns are 64 or
        fewer; as many slices as give the GPU about two blocks per SM."""
        own = MATH[problem.dtype]
        if seed.precision not in maths_of(problem.dtype):
            raise SpecError(
                f"tcwgrad multiplies {problem.dtype.value} tensors in {own.value}: take "
                f"--precision {own.value}"
            )
        bm = 64 if problem.Mg <= 64 else seed.blocktile[0]
        bn = 64 if problem.Cg * problem.R * problem.S <= 64 else seed.blocktile[1]
        # warps of 64x64 (tf32: 64x32, whose word-by-word reads need more registers: a
        # 64x64 warp took 254 of them with db)
        warps = (max(1, bm // 64), max(1, bn // (32 if own is Precision.TF32 else 64)))
        if seed.precision is Precision.FP32:  # the split words besides: 32x32 warps
            warps = (max(1, bm // 32), max(1, bn // 32))
        if warps[0] * warps[1] < 4:
            warps = (max(1, bm // 32), warps[1])  # two warps' copy addresses spill
        tiles = _tiles(problem, bm, bn)
        splits = max(1, min(TARGET_BLOCKS // tiles, 65535))
        if (
            seed.precision is Precision.FP32
            and bn == 128
            and TARGET_BLOCKS // 2 < tiles <= TARGET_BLOCKS
        ):
            # More tiles than SMs, fewer than two an SM: one slice each left the SMs'
            # second blocks idle.  Tiles half as wide in two slices were the fastest the
            # tunes timed on all three such layers (C=M=512 3x3), where these took
            # 1.44-1.54x as long (nvidia-h200, 2026-11-29, ``docs/measurements/
            # tcwgrad-fp32-wide-layers-from-tunes-2026-11-29.log``)
            bn, warps, splits = 64, (warps[0], max(1, warps[1] // 2)), 2
        stages = seed.stages
        if (
            own is Precision.TF32
            and seed.precision is Precision.TF32
            and wide_tf32(problem, bm, bn)
        ):
            # 64x64 warps and three stages: the fastest the tunes timed on all 13 such
            # layers of vgg11 (B=32) and resnet18 at 224 (B=64), where 64x32 warps and four
            # stages took 1.15-1.72x as long (nvidia-h200, 2026-11-29, ``docs/
            # measurements/tcwgrad-tf32-fit-from-tunes-2026-11-29.log``).  The slices
            # above, four times as many where they are 3 or fewer (72 tiles and more,
            # which leave a wave short): on the 12 layers timed again, 1.00-1.02x the
            # fastest, where twice the slices everywhere took up to 1.21x (``docs/
            # measurements/tcwgrad-tf32-slices-from-tunes-2026-11-29.log``)
            warps, stages = (2, 2), 3
            splits = 4 * splits if splits <= 3 else splits
        return replace(seed, blocktile=(bm, bn), warpgrid=warps, stages=stages, splits=splits)

    @classmethod
    def space(cls, problem, precision):
        if precision not in maths_of(problem.dtype):
            return []
        out = []
        for bm, bn, wm, wn in ((128, 128, 2, 2), (64, 128, 2, 2), (128, 64, 2, 2), (64, 64, 2, 1)):
            for stages in (3, 4):
                base = cls.fit(
                    problem,
                    cls(blocktile=(bm, bn), warpgrid=(wm, wn), stages=stages, precision=precision),
                )
                for factor in (1, 2, 4):
                    s = max(1, base.splits * factor // 2)
                    # fp32's three products keep fit's 32x32 warps
                    grid = base.warpgrid if precision is Precision.FP32 else (wm, wn)
                    out.append(replace(base, blocktile=(bm, bn), warpgrid=grid, splits=s))
        return out


def wide_tf32(p, bm: int, bn: int) -> bool:
    """A tf32 wgrad whose tunes favour 64x64 warps: 128x128 tiles, a window past 1x1 (the
    1x1 layers timed took other tiles and fewer slices)."""
    return (bm, bn) == (128, 128) and p.R * p.S > 1


def slice_sums(p, name: str, splits: int):
    """What the tensor-core wgrads share about their slices of the batch: the sums'
    context (``sums_context``, db fused where the layer has a bias), the workspace's
    bytes, the second kernel that adds the slices in order (``backward/tc_sums.j2``), and
    the plan's lines for the GEMM and the workspace."""
    ctx = dict(sums_context(p, 1, splits, False, p.bias), second_pass=TC_SUMS)
    row = ctx["row"]
    workspace = 4 * splits * row
    reduce = second_pass(name, row, splits, p.bias)
    gemm = Size(
        "GEMM",
        f"{p.Mg} x {p.Cg * p.R * p.S} x (B*{p.Ho * p.Wo})"
        + (f", {p.groups} groups" if p.groups > 1 else ""),
        "maps x (r, s, c) columns of im2col(x) x every output pixel of the batch",
    )
    scratch = Size(
        "workspace",
        f"{workspace} B",
        f"{splits} slices x {row} fp32 partial sums; the reduce kernel adds them in order",
    )
    return ctx, workspace, reduce, gemm, scratch


def slice_kernel(name: str, threads: int, grid: tuple, smem: int) -> Launch:
    """The tensor-core wgrads' first kernel: x and dy to the workspace, a block plane a
    slice (grid z), ``smem`` bytes of dynamic shared memory."""
    return Launch(
        name, (Role.X, Role.DY, Role.WORKSPACE, Role.BATCH), (threads, 1, 1), grid, 2, 0, 1, smem
    )


def _tiles(p, bm: int, bn: int) -> int:
    return ceil_div(p.Cg * p.R * p.S, bn) * ceil_div(p.Mg, bm) * p.groups


def plan_tcwgrad(p, v: Tcwgrad) -> Plan:
    # 1. limits
    if p.layout is not TensorLayout.NHWC:
        raise SpecError(
            "tcwgrad reads channels-last tensors (16-byte copies along the channels and "
            "maps): use layout=nhwc in the shape spec, or --strategy wgemm"
        )
    own = MATH[p.dtype]
    if v.precision not in maths_of(p.dtype):
        raise SpecError(
            f"tcwgrad multiplies {p.dtype.value} tensors in {own.value}: take --precision "
            f"{own.value}"
        )
    size = p.dtype.bytes
    vec = 16 // size  # elements per 16-byte copy
    if p.Cg % vec or p.Mg % vec:
        raise SpecError(
            f"tcwgrad copies {vec} channels and {vec} maps at a time: a group's {p.Cg} "
            f"channels and {p.Mg} maps must be multiples of {vec}; use --strategy tcwhalo "
            "or wsplit"
        )
    bm, bn = v.blocktile
    wm_count, wn_count = v.warpgrid
    for what, n in (("maps", bm), ("columns", bn)):
        if n not in (64, 128, 256):
            raise SpecError(
                f"tcwgrad b{bm}x{bn}: {what} per block must be 64, 128 or 256 (rows of at "
                "least 128 bytes keep the swizzle within a row)"
            )
    if bm % (16 * wm_count) or bn % (16 * wn_count):
        raise SpecError(
            f"tcwgrad b{bm}x{bn} w{wm_count}x{wn_count}: each warp's tile must be a multiple "
            "of 16 maps and 16 columns; choose fewer warps"
        )
    warp_m, warp_n = bm // wm_count, bn // wn_count
    fm, fn = warp_m // 16, warp_n // 8
    if fm * fn * 4 > MAX_ACCUMULATORS:
        raise SpecError(
            f"tcwgrad's warp tile {warp_m}x{warp_n} needs {fm * fn * 4} fp32 sums per thread, "
            f"over {MAX_ACCUMULATORS}; choose more warps (--warpgrid)"
        )
    threads = 32 * wm_count * wn_count
    if threads > 512:
        raise SpecError(f"tcwgrad w{wm_count}x{wn_count}: {threads} threads, over 512")
    if v.chunk not in (32, 64):
        raise SpecError(
            f"tcwgrad k{v.chunk}: a chunk is 32 or 64 pixels (an even number of k16 steps: "
            "the fragments' two register sets alternate across chunks)"
        )
    ua, ub = bm // vec, bn // vec  # 16-byte units per tile row
    for what, units in (("dy", ua), ("x", ub)):
        if threads % units or v.chunk * units % threads:
            raise SpecError(
                f"tcwgrad b{bm}x{bn} k{v.chunk}: the {v.chunk} x {units} copies of the {what} "
                f"tile do not divide among {threads} threads; choose another chunk or warp grid"
            )
    if not 2 <= v.stages <= 8:
        raise SpecError(f"tcwgrad p{v.stages}: the ring holds 2 to 8 chunks")
    if v.splits > 65535:
        raise SpecError(f"tcwgrad s{v.splits}: at most 65535 slices (grid z)")
    a_stage, b_stage = v.chunk * bm * size, v.chunk * bn * size
    smem = v.stages * (a_stage + b_stage)
    if smem > STAGE_LIMIT:
        raise SpecError(
            f"tcwgrad's ring of {v.stages} chunks needs {smem} B of shared memory, over the "
            f"{STAGE_LIMIT} B a block may opt in to; choose --stages "
            f"{STAGE_LIMIT // (a_stage + b_stage)} or a smaller tile"
        )

    # 2. work
    CgRS = p.Cg * p.R * p.S
    col_tiles, map_tiles = ceil_div(CgRS, bn), ceil_div(p.Mg, bm)
    P = p.Ho * p.Wo
    name = v.kernel_name(p)
    ctx, workspace, reduce, gemm, scratch = slice_sums(p, name, v.splits)
    (sh, sw), (pt, _, pl, _) = p.stride, p.pads
    tf32 = p.dtype is DType.FP32
    split = v.precision is Precision.FP32
    ctx.update(
        split=split,
        elem={DType.FP16: "f16", DType.BF16: "bf16", DType.FP32: "tf32"}[p.dtype],
        mma_shape="m16n8k8" if tf32 else "m16n8k16",
        tf32=tf32,
        io="float" if tf32 else "unsigned short",
        vec=vec,
        ksteps=v.chunk // (8 if tf32 else 16),
        BM=bm,
        BN=bn,
        BK=v.chunk,
        WM=warp_m,
        WN=warp_n,
        warps_m=wm_count,
        FM=fm,
        FN=fn,
        stages=v.stages,
        threads=threads,
        ua=ua,
        ub=ub,
        a_rows=v.chunk * ua // threads,
        b_rows=v.chunk * ub // threads,
        a_step=threads // ua,
        b_step=threads // ub,
        a_stage=a_stage,
        b_stage=b_stage,
        CgRS=CgRS,
        P=P,
        sh=sh,
        sw=sw,
        pt=pt,
        pl=pl,
        map_tiles=map_tiles,
        guard_maps=p.Mg % bm != 0,
        guard_cols=CgRS % bn != 0,
        min_blocks=max(1, 256 // threads),
        precision_note=(
            "x and dy split into tf32 hi + lo, lo x hi + hi x lo + hi x hi per k step, sums in fp32"
            if split
            else ROUNDING[v.precision].replace("x and w", "x and dy")
        ),
    )
    main = slice_kernel(name, threads, (col_tiles, map_tiles * p.groups, v.splits), smem)
    sizes = (
        gemm,
        Size(
            "block tile",
            f"{bm} maps x {bn} columns",
            f"{wm_count}x{wn_count} warps of {warp_m}x{warp_n}: {fm} m16 x {fn} n8 fragments, "
            f"{fm * fn * 4} fp32 sums per thread",
        ),
        Size(
            "__shared__",
            f"{smem} B (dynamic)",
            f"{v.stages} stages x {v.chunk} pixels x ({bm} maps + {bn} columns) x {size} B, "
            "XOR-swizzled in 16-byte units",
        ),
        Size(
            "grid",
            f"{col_tiles} x {map_tiles * p.groups} x {v.splits}",
            f"column tiles x map tiles{' x groups' if p.groups > 1 else ''} x slices of the "
            "batch's pixels (contiguous, chunk-aligned)",
        ),
        scratch,
    )
    return Plan(
        shape=p,
        variant=v,
        template="backward/tcwgrad.cu.j2",
        launches=(main, reduce),
        static_smem=0,
        dynamic_smem=smem,
        const_bytes=0,
        weight_format="f32",
        sizes=sizes,
        context=ctx,
        workspace_bytes=workspace,
        # a slice holds at most ceil(batch / splits) images' pixels plus a chunk; then
        # the slices in order (db sums along with dw)
        # (three additions a product in fp32's three tf32 products)
        sum_depth=(P * (3 if split else 1), v.splits, v.splits + v.chunk * (3 if split else 1)),
    )
