"""``wgnchw``: wgrad (and db) of fp32 NCHW layers on Hopper's warpgroup tensor cores
(sm_90a), in tf32 or at fp32 accuracy in three tf32 products.

The product is wgwgrad's, dw[m][(r, s, c)] = sum over the batch's pixels p of dy[m][p] *
x[c][p's tap (r, s)], a warpgroup multiplying 64 maps by up to 256 channels of one tap on
``wgmma.mma_async``.  wgmma takes tf32 operands K-major only (no transpose flags), and in
NCHW the reduction's axis, the pixels, is the one along which each map's dy and each
channel's x lie: a chunk of 32 pixels is one 128-byte row a map and a row a channel, in
the 128-byte swizzle, and the descriptors are wgmma's forward pass's.  A warp copies rows
with 4-byte ``cp.async``, lane l the chunk's pixel l, so each copy instruction reads
one map's or channel's run of pixels (split where the tap's row ends) and writes one
128-byte line of shared memory; a tap that leaves the image, and pixels past the slice,
are the copies' zero-fill.  In tf32 math the fp32 words are read as tf32 with no cvt on
the way (``tf32_truncated``), as wgmma's tf32 forward pass reads them.  In fp32 math
(3xTF32, tc3wgrad's split) each thread splits the words it copied, once they have
landed: hi, the word rounded to tf32, in place, and lo = v - hi into a second tile of the
stage; a chunk's products lo x hi, hi x lo and hi x hi start from zero on the tensor cores
and are added to the thread's sums in fp32, as the tensor cores' own sums truncate.

The batch's pixels are cut into ``splits`` contiguous slices, one block plane each; a
block writes its fp32 sums to its slice's workspace row and ``backward/tc_sums.j2`` adds
the rows in order, so the result is deterministic.  db rides along on the blocks of the
first column tile: dy times a shared 8 x 32 tile of ones on an m64n8k8 wgmma.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import SpecError
from ..plan.common import Plan, Size
from ..shapes import DType, Op, TensorLayout
from ..variants import EPILOGUE, GEOMETRY, Count, Pair, Precision, Variant, param
from .tcgemm import STAGE_LIMIT
from .tcwgrad import slice_kernel, slice_sums
from .wgwgrad import CHANNEL_TILES, MAP_TILES, MOST_SUMS, SMS, grid_size, ring_limits
from .wgwgrad import (
    reduction_chunks,
    sliced_plan,
    slices_for,
    tile_count,
    tile_limits,
    tiled_space,
)

CHUNK = 32  # pixels a stage: a 128-byte row of fp32 words, four k8 steps
ROW_BYTES = 128
ONES_BYTES = 1024  # db's tile of ones: one 8-row group of 128 bytes


@dataclass(frozen=True, kw_only=True)
class Wgnchw(Variant):
    key = "wgnchw"
    templates = ("backward/wgnchw.cu.j2",)
    family = "backward"
    description = (
        "wgrad of fp32 NCHW tensors on Hopper's warpgroup tensor cores (sm_90a), in tf32 "
        "or in 3xTF32 (fp32 accuracy): pixels as the reduction, K-major rows of 32 pixels "
        "in a 128B-swizzled cp.async ring, wgmma.mma_async, batch slices added in order"
    )
    serves = GEOMETRY | EPILOGUE
    precisions = (Precision.TF32, Precision.FP32)
    tensor_core = True
    tf32_truncated = True  # in tf32 math, fp32 words read as tf32 with no cvt: truncated
    ops = frozenset({Op.WGRAD})

    blocktile: tuple[int, int] = param(
        (128, 128), Pair("b"), "wgnchw: the block's tile of dw, maps x channels of one tap"
    )
    stages: int = param(6, Count("p"), "wgnchw: chunks of 32 pixels in the shared-memory ring")
    splits: int = param(8, Count("s"), "wgnchw: slices of the batch's pixels, one block plane each")

    def plan(self, problem):
        return plan_wgnchw(problem, self)

    @classmethod
    def fit(cls, problem, seed):
        """The widest tile of channels that divides a group's, then the widest of maps
        that does with at most 128 x 256 sums a block; the most stages that fit, up to 8;
        slices for one block an SM."""
        p = problem
        bn = max((d for d in CHANNEL_TILES if p.Cg % d == 0), default=seed.blocktile[1])
        three = seed.precision is Precision.FP32
        if three:
            bn = max((d for d in CHANNEL_TILES if p.Cg % d == 0 and d <= 128), default=bn)
        bm = max(
            (d for d in MAP_TILES if p.Mg % d == 0 and _sums_fit(d, bn, three)),
            default=seed.blocktile[0],
        )
        stages = max(2, min(8, _most_stages(bm, bn, three)))
        tiles = tile_count(p, bm, bn)  # none where no tile divides: the plan says why
        splits = slices_for(SMS, tiles, reduction_chunks(p, CHUNK)) if tiles else seed.splits
        return replace(seed, blocktile=(bm, bn), stages=stages, splits=splits)

    @classmethod
    def space(cls, problem, precision):
        """Every tile that divides the group's maps and channels, with 4 and the most
        stages up to 8 that fit, and slices for one and two blocks an SM."""
        if precision not in cls.precisions or problem.dtype is not DType.FP32:
            return []
        three = precision is Precision.FP32
        if problem.layout is not TensorLayout.NCHW:
            return []
        return tiled_space(
            cls,
            problem,
            precision,
            lambda bm, bn: _most_stages(bm, bn, three),
            lambda most: {4, min(8, most)},
            CHUNK,
            fits=lambda bm, bn: _sums_fit(bm, bn, three),
        )


def _stage_bytes(bm: int, bn: int, three: bool) -> int:
    """A chunk's rows, and in 3xTF32 as many again for the lo words."""
    return (bm + bn) * ROW_BYTES * (2 if three else 1)


def _most_stages(bm: int, bn: int, three: bool) -> int:
    """The most chunks whose ring fits beside db's ones and the alignment slack."""
    return (STAGE_LIMIT - 1024 - ONES_BYTES) // _stage_bytes(bm, bn, three)


def _sums_fit(bm: int, bn: int, three: bool) -> bool:
    """Whether a thread's sums leave registers for the rest: bn / 2 a thread, at most
    128 x 256 a block (the register file's share of a thread falls with the block's
    threads); in 3xTF32 a chunk's products are kept apart too, twice the registers a
    sum, so half that, and at most 128 channels (255 registers a thread)."""
    if three:
        return bn <= 128 and 2 * bm * bn <= MOST_SUMS
    return bm * bn <= MOST_SUMS


def plan_wgnchw(p, v: Wgnchw) -> Plan:
    # 1. limits
    if p.layout is not TensorLayout.NCHW:
        raise SpecError(
            "wgnchw reads NCHW tensors (rows of pixels, one a map and a channel): use "
            "layout=nchw, or --strategy tcwgrad for channels-last ones"
        )
    if p.dtype is not DType.FP32 or v.precision not in Wgnchw.precisions:
        raise SpecError(
            "wgnchw multiplies fp32 tensors, in tf32 or in three tf32 products: use "
            "dtype=fp32 and --precision tf32 or fp32"
        )
    three = v.three_tf32
    bm, bn = v.blocktile
    tile_limits(p, v, "tc3wgrad")
    if not _sums_fit(bm, bn, three):
        most = "128 x 128 in fp32 math" if three else "128 x 256 or 256 x 128"
        raise SpecError(
            f"wgnchw b{bm}x{bn}: {bm * bn // (128 * bm // 64)} sums a thread"
            + (", and as many of a chunk's products," if three else "")
            + f" leave no registers for the rest; at most {most}"
        )
    ring_limits(v)
    words = 2 if three else 1  # hi and lo tiles a stage in 3xTF32
    a_stage, b_stage = words * bm * ROW_BYTES, words * bn * ROW_BYTES
    ring = v.stages * (a_stage + b_stage)
    smem = ring + (ONES_BYTES if p.bias else 0) + 1024  # and the slack to align to 1024 B
    if smem > STAGE_LIMIT:
        most = (STAGE_LIMIT - 1024 - (ONES_BYTES if p.bias else 0)) // (a_stage + b_stage)
        raise SpecError(
            f"wgnchw's ring of {v.stages} chunks needs {smem} B of shared memory, over the "
            f"{STAGE_LIMIT} B a block may opt in to; choose --stages {most} or a smaller tile"
        )

    # 2. work
    warpgroups = bm // 64
    threads = 128 * warpgroups
    warps = threads // 32
    CgRS = p.Cg * p.R * p.S
    col_tiles, map_tiles = p.R * p.S * (p.Cg // bn), p.Mg // bm
    P = p.Ho * p.Wo
    name = v.kernel_name(p)
    ctx, workspace, reduce, gemm, scratch = slice_sums(p, name, v.splits)
    (sh, sw), (pt, _, pl, _) = p.stride, p.pads
    ctx.update(
        BM=bm,
        BN=bn,
        BK=CHUNK,
        NACC=bn // 2,
        a_op=bn // 2,  # wgmma_step's asm operands after the sums: A, B and whether to add
        b_op=bn // 2 + 1,
        add_op=bn // 2 + 2,
        stages=v.stages,
        threads=threads,
        warps=warps,
        warpgroups=warpgroups,
        a_rows=bm // warps,
        b_rows=bn // warps,
        a_stage=a_stage,
        b_stage=b_stage,
        three=three,
        a_half=bm * ROW_BYTES,
        b_half=bn * ROW_BYTES,
        ones_at=ring,
        a_ring=v.stages * a_stage,
        c_tiles=p.Cg // bn,
        CgRS=CgRS,
        P=P,
        # the copies' strides, in words: an image of dy and of x, a map's or a channel's
        # plane, and the planes a warp's next row is on
        dy_image=p.M * P,
        x_image=p.C * p.H * p.W,
        x_plane=p.H * p.W,
        dy_rows=warps * P,
        x_rows=warps * p.H * p.W,
        ahead=v.stages - 1,  # chunks in flight before the first multiply
        waits=v.stages - 2,  # copy groups left pending when a chunk is needed
        fragments=bn // 8,  # m64n8 fragments of a warpgroup's row of sums
        next_row=8 * CgRS,  # a thread's second map of a fragment, 8 rows of dw on
        sh=sh,
        sw=sw,
        pt=pt,
        pl=pl,
        map_tiles=map_tiles,
        precision_note=(
            "x and dy split into tf32 hi + lo, lo x hi + hi x lo + hi x hi a chunk from "
            "zero, added to the sums in fp32"
            if three
            else "x and dy read as tf32 (their fp32 words truncated), products accumulated "
            "in fp32"
        ),
    )
    main = slice_kernel(name, threads, (col_tiles, map_tiles * p.groups, v.splits), smem)
    sizes = (
        gemm,
        Size(
            "block tile",
            f"{bm} maps x {bn} channels of one tap",
            f"{warpgroups} warpgroup(s) of m64n{bn}k8, {bn // 2} fp32 sums per thread"
            + (f" and {bn // 2} of a chunk's three products" if three else ""),
        ),
        Size(
            "__shared__",
            f"{smem} B (dynamic)",
            f"{v.stages} stages x ({bm} map + {bn} channel) rows of {CHUNK} pixels x 4 B"
            + (", hi and lo" if three else "")
            + ", 128B-swizzled"
            + (f"; {ONES_BYTES} B of ones for db" if p.bias else "")
            + "; 1024 B of slack to align the ring",
        ),
        Size(
            "copies",
            f"{bm // warps + bn // warps} 4-byte cp.async per thread per chunk",
            "lane l the chunk's pixel l of a row: one 128-byte line of shared memory a copy",
        ),
        grid_size(p, v, col_tiles, map_tiles),
        scratch,
    )
    return sliced_plan(p, v, (main, reduce), smem, sizes, ctx, workspace, CHUNK)
