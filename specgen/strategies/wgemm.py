"""``wgemm``: wgrad (and db) of wide layers as an implicit GEMM on the CUDA cores.

Per group, dw is a matrix product: dw[m][col] = sum over k of dy[m][k] * X[col][k], the
maps m as rows, the columns col = (c * R + r) * S + s of the implicit im2col matrix X,
and the reduction k over every image and output pixel.  A block owns a BM x BN tile of
dw and walks the pixels of its slice of the batch BK at a time.  fp32 tensors are
copied by ``cp.async`` straight into a ring of three shared buffers (a zero-fill where
the window meets the padding), chunk j + 2 in flight while chunk j is multiplied;
16-bit tensors go through registers, widened to fp32 on their way to one of two
buffers.  A thread keeps an 8 x 8 register tile of sums, fed by four 16-byte shared
loads per pixel for 64 FMAs.  Each slice writes a workspace row; the second kernel
(``backward/reduce.j2``) adds the slices in order, so results are deterministic.  With a
bias, db comes from a small kernel of its own (one block per map and slice): summed in
the main kernel its registers cost a block per SM.

fp32 NHWC tensors are read in place: a copy takes 4 maps of dy or 4 channels of one tap of
x (16 bytes) where the channel counts keep every pixel's group aligned, else one; the
im2col columns run (r, s, c), the reduce kernel (``backward/tc_sums.j2``) turns them back
into [M][C/g][R][S], and db sums 32 maps a block, one a lane, so a warp reads 128
contiguous bytes of each pixel.

Where ``wsplit`` gives each thread a few maps and taps and so reloads dy and x per
FMA-handful, this reuses every value loaded into shared memory 64 times from registers:
it is the strategy for layers whose weights are many (C*R*S and M in the hundreds).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import SpecError
from ..plan.common import Launch, Plan, Size, ceil_div
from ..shapes import DType, Feature, Op
from ..shapes import TensorLayout as Layout
from ..tensors import Role
from ..variants import EPILOGUE, GEOMETRY, Count, Pair, Variant, param
from .wsplit import TC_SUMS, per_slice, sums_context

MICRO = 8  # a thread's register tile: 8 maps x 8 columns
DB_THREADS = 128
DB_LANES = 32  # NHWC db: maps a block, one a lane (a warp reads 128 contiguous bytes)
MAX_THREADS = 512
TARGET_BLOCKS = 528  # about 4 blocks of work for each of the H200's 132 SMs
SMEM_LIMIT = 48 * 1024  # static shared memory


@dataclass(frozen=True, kw_only=True)
class Wgemm(Variant):
    key = "wgemm"
    templates = ("backward/wgemm.cu.j2",)
    family = "backward"
    description = (
        "wgrad as an implicit GEMM on the CUDA cores: 8x8 register tiles, multi-buffered "
        "shared tiles of dy and im2col(x), split over the batch, an ordered second pass"
    )
    serves = GEOMETRY | EPILOGUE | {Feature.DTYPE16, Feature.NHWC}
    ops = frozenset({Op.WGRAD})

    blocktile: tuple[int, int] = param(
        (128, 128), Pair("b"), "wgemm: the block's tile of dw, maps x im2col columns (MxN)"
    )
    chunk: int = param(8, Count("k"), "wgemm: pixels per shared-memory chunk")
    splits: int = param(16, Count("s"), "wgemm: slices of the batch, one block plane each")

    def plan(self, problem):
        return plan_wgemm(problem, self)

    @classmethod
    def fit(cls, problem, seed):
        """A tile no larger than the problem needs (64 where a group has 64 maps or
        fewer), and as many slices as fill the GPU about four blocks per SM deep."""
        bm = 64 if problem.Mg <= 64 else seed.blocktile[0]
        bn = 64 if problem.Cg * problem.R * problem.S <= 64 else seed.blocktile[1]
        tiles = _tiles(problem, bm, bn)
        splits = max(1, min(TARGET_BLOCKS // tiles, 65535))
        return replace(seed, blocktile=(bm, bn), splits=splits)

    @classmethod
    def space(cls, problem, precision):
        out = []
        for bm in (64, 128, 256):
            for bn in (64, 128, 256):
                if bm * bn > MICRO * MICRO * MAX_THREADS:
                    continue
                for chunk in (8, 16):
                    base = cls.fit(
                        problem, cls(blocktile=(bm, bn), chunk=chunk, precision=precision)
                    )
                    for factor in (1, 2, 4):
                        s = max(1, base.splits * factor // 2)
                        out.append(replace(base, blocktile=(bm, bn), splits=s))
        return out


def _tiles(p, bm: int, bn: int) -> int:
    return ceil_div(p.Cg * p.R * p.S, bn) * ceil_div(p.Mg, bm) * p.groups


def plan_wgemm(p, v: Wgemm) -> Plan:
    # 1. limits
    bm, bn = v.blocktile
    nhwc = p.layout is Layout.NHWC
    if nhwc and p.dtype is not DType.FP32:
        raise SpecError(
            f"wgemm reads NHWC tensors in fp32 only; {p.dtype.value} channels-last layers go "
            "on the tensor cores: choose tcwgrad or tcwhalo"
        )
    for what, n in (("maps", bm), ("columns", bn)):
        if n not in (32, 64, 128, 256):
            raise SpecError(f"wgemm b{bm}x{bn}: {what} per block must be 32, 64, 128 or 256")
    threads = (bm // MICRO) * (bn // MICRO)
    if threads > MAX_THREADS:
        raise SpecError(
            f"wgemm b{bm}x{bn} needs {threads} threads of 8x8 sums, over {MAX_THREADS} (the "
            "registers of one SM at 128 each); choose a tile of at most 32768 sums"
        )
    if v.chunk not in (4, 8, 16, 32) or threads % v.chunk:
        raise SpecError(
            f"wgemm k{v.chunk}: pixels per chunk must be 4, 8, 16 or 32 and divide the "
            f"{threads} threads"
        )
    # NHWC: a copy takes VA maps of dy or VB channels of x, 16 bytes where the channels'
    # counts keep every pixel's group aligned; each thread keeps one group, so a tile's
    # groups must divide the threads and a chunk's copies be a multiple of them.
    VA = 4 if nhwc and p.M % 4 == 0 and p.Mg % 4 == 0 else 1
    VB = 4 if nhwc and p.C % 4 == 0 and p.Cg % 4 == 0 else 1
    if nhwc:
        for what, n, vec in (("maps", bm, VA), ("columns", bn, VB)):
            groups_ = n // vec
            if threads % groups_ or (v.chunk * groups_) % threads:
                raise SpecError(
                    f"wgemm b{bm}x{bn} k{v.chunk} on NHWC: {groups_} copies of {vec} {what} a "
                    f"pixel do not share out over {threads} threads; choose a chunk of "
                    f"{max(1, threads // groups_)} pixels or more, or a squarer tile"
                )
    if v.splits > 65535:
        raise SpecError(f"wgemm s{v.splits}: at most 65535 slices of the batch (grid z)")
    # fp32 tensors copy into a ring of three buffers with cp.async; 16-bit ones go through
    # registers (widened on the way) into two.
    async_copy = p.dtype is DType.FP32
    stages = 3 if async_copy else 2
    smem = stages * v.chunk * (bm + 4 + bn + 4) * 4
    if smem > SMEM_LIMIT:
        raise SpecError(
            f"wgemm b{bm}x{bn} k{v.chunk} needs {smem} B of shared memory, over "
            f"{SMEM_LIMIT}; choose a smaller chunk"
        )

    # 2. work
    CgRS = p.Cg * p.R * p.S
    col_blocks, map_blocks = ceil_div(CgRS, bn), ceil_div(p.Mg, bm)
    P = p.Ho * p.Wo
    with_db = p.bias
    ctx = sums_context(p, 1, v.splits, False, with_db)
    row = ctx["row"]
    workspace = 4 * v.splits * row
    name = v.kernel_name(p)
    main = Launch(
        name,
        (Role.X, Role.DY, Role.WORKSPACE, Role.BATCH),
        (threads, 1, 1),
        (col_blocks, map_blocks * p.groups, v.splits),
        2,
        0,
        1,
    )
    outs = (Role.DW, *((Role.DB,) if with_db else ()))
    # db from a kernel of its own (in the main one its registers cost a block per SM):
    # one block per map and slice, into the slice rows after dw.
    db = Launch(
        f"{name}_db",
        (Role.DY, Role.WORKSPACE, Role.BATCH),
        (DB_THREADS, 1, 1),
        (ceil_div(p.M, DB_LANES) if nhwc else p.M, v.splits, 1),
        1,
        0,
        1,
    )
    reduce = per_slice(name, row, "reduce", (Role.WORKSPACE, *outs), v.splits)
    launches = (main, db, reduce) if with_db else (main, reduce)
    min_blocks = max(1, 512 // threads)
    if nhwc:
        ctx.update(
            second_pass=TC_SUMS,
            VA=VA,
            VB=VB,
            a_rows=threads // (bm // VA),
            b_rows=threads // (bn // VB),
            db_lanes=DB_LANES,
        )
    ctx.update(
        nhwc=nhwc,
        BM=bm,
        BN=bn,
        BK=v.chunk,
        stages=stages,
        async_copy=async_copy,
        TX=bn // MICRO,
        threads=threads,
        EA=bm * v.chunk // threads // (VA if nhwc else 1),
        EB=bn * v.chunk // threads // (VB if nhwc else 1),
        rows_per_pass=threads // v.chunk,
        CgRS=CgRS,
        P=P,
        cpi=ceil_div(P, v.chunk),
        map_blocks=map_blocks,
        launch_bounds=f"{threads}, {min_blocks}",
        launch_bounds_alt=f"{threads}",
        guard_pix=P % v.chunk != 0,
        guard_maps=p.Mg % bm != 0,
        guard_cols=CgRS % bn != 0,
        db_threads=DB_THREADS,
    )
    sizes = (
        Size(
            "block tile",
            f"{bm} maps x {bn} columns of dw",
            f"columns (c, r, s) of the implicit im2col matrix: {CgRS} per group",
        ),
        Size(
            "thread",
            f"{MICRO} x {MICRO} fp32 sums",
            "4 16-byte shared loads per pixel feed 64 FMAs",
        ),
        Size(
            "shared",
            f"{smem} B",
            f"{stages} buffers x {v.chunk} pixels x ({bm} + 4 maps of dy, {bn} + 4 columns of x)"
            + (", filled by cp.async" if async_copy else ""),
        ),
        Size(
            "grid",
            f"{col_blocks} x {map_blocks * p.groups} x {v.splits}",
            f"column tiles x map tiles{' x groups' if p.groups > 1 else ''} x slices of the "
            f"batch (slice k: images k, k+{v.splits}, ...)",
        ),
        Size(
            "workspace",
            f"{workspace} B",
            f"{v.splits} slices x {row} partial sums; the second kernel adds the slices in order",
        ),
    )
    return Plan(
        shape=p,
        variant=v,
        template="backward/wgemm.cu.j2",
        launches=launches,
        static_smem=smem,
        dynamic_smem=0,
        const_bytes=0,
        weight_format="f32",
        sizes=sizes,
        context=ctx,
        workspace_bytes=workspace,
        # a thread's pixels of each image of its slice in order, then the slices; db's
        # (a stride of the pixels, 5 shuffles, the warps) is never longer
        sum_depth=(P, v.splits, v.splits + 5 + DB_THREADS // 32),
    )
