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
are the copies' zero-fill.  A 1x1 layer at stride 1 without padding, whose images' pixels
are a multiple of 4, reads x at dy's own pixel: there a thread copies 16 bytes, four
pixels of a row, as wgwino does (``_vec4``).  In tf32 math the fp32 words are read as tf32 with no cvt on
the way (``tf32_truncated``), as wgmma's tf32 forward pass reads them.  In fp32 math
(3xTF32, tc3wgrad's split) each thread splits the words it copied, once they have
landed: hi, the word rounded to tf32, in place, and lo = v - hi into a second tile of the
stage; a chunk's products lo x hi, hi x lo and hi x hi start from zero on the tensor cores
and are added to the thread's sums in fp32, as the tensor cores' own sums truncate.

A tile's maps need not divide the group's: the last tile's rows past them are copied as
zeros (the copies' zero-fill) and never stored, so mobilenet's 24, 96 or 144 maps take
one to three warpgroups of 64.  Its channels are any multiple of 8 from 16 to 256 that
divides the group's (wgmma's N): 24, 96 or 144 channels are a tile of their own.

The batch's pixels are cut into ``splits`` contiguous slices, one block plane each; a
block writes its fp32 sums to its slice's workspace row and ``backward/tc_sums.j2`` adds
the rows in order, so the result is deterministic.  db rides along on the blocks of the
first column tile: dy times a shared 8 x 32 tile of ones on an m64n8k8 wgmma.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import SpecError
from ..plan.common import Plan, Size, choices
from ..shapes import DType, Op, TensorLayout
from ..variants import EPILOGUE, GEOMETRY, Count, Pair, Precision, Variant, param
from .tcgemm import STAGE_LIMIT, flat_pixels
from .tcwgrad import slice_kernel, slice_sums
from .wgwgrad import CHANNEL_TILES, MAP_TILES, MOST_SUMS, SMS, grid_size, ring_limits
from .wgwgrad import reduction_chunks, sliced_plan, slices_for

CHUNK = 32  # pixels a stage: a 128-byte row of fp32 words, four k8 steps
ROW_BYTES = 128
ONES_BYTES = 1024  # db's tile of ones: one 8-row group of 128 bytes
RAGGED_MAP_TILES = (64, 128, 192, 256)  # where none of MAP_TILES divides a group's maps


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
        that does with at most 128 x 256 sums a block (where none does, the fewest maps
        that hold the group's); the most stages that fit, up to 8; slices for one block
        an SM."""
        p = problem
        three = seed.precision is Precision.FP32
        widest = 128 if three else 256
        channels = channel_tiles(p, widest)
        bn = max((d for d in channels if d in CHANNEL_TILES), default=None)
        bn = bn or max(channels, default=seed.blocktile[1])
        maps = dividing_map_tiles(p)
        bm = max((d for d in maps if _sums_fit(d, bn, three)), default=None)
        if not maps:
            ragged = [
                d for d in ragged_map_tiles(p) if _sums_fit(d, bn, three) and bn % _warps(d) == 0
            ]
            bm = min((d for d in ragged if d >= p.Mg), default=max(ragged, default=None))
        bm = bm or seed.blocktile[0]
        stages = max(2, min(8, _most_stages(bm, bn, three)))
        tiles = _tile_count(p, bm, bn)  # none where no tile fits: the plan says why
        splits = slices_for(SMS, tiles, reduction_chunks(p, CHUNK)) if tiles else seed.splits
        return replace(seed, blocktile=(bm, bn), stages=stages, splits=splits)

    @classmethod
    def space(cls, problem, precision):
        """Every tile of the maps (those of MAP_TILES that divide the group's, else the
        ragged ones) and channels (those of CHANNEL_TILES that divide the group's, and the
        widest multiple of 8 that does), with 4 and the most stages up to 8 that fit, and
        slices for one and two blocks an SM."""
        if precision not in cls.precisions or problem.dtype is not DType.FP32:
            return []
        three = precision is Precision.FP32
        if problem.layout is not TensorLayout.NCHW:
            return []
        out = []
        for bm, bn in _space_tiles(problem, three):
            most, tiles = _most_stages(bm, bn, three), _tile_count(problem, bm, bn)
            for stages in sorted(s for s in {4, min(8, most)} if s <= most):
                for blocks in (SMS, 2 * SMS):
                    splits = slices_for(blocks, tiles, reduction_chunks(problem, CHUNK))
                    out.append(
                        cls(blocktile=(bm, bn), stages=stages, splits=splits, precision=precision)
                    )
        return list(dict.fromkeys(out))


def channel_tiles(p, widest: int = 256) -> list[int]:
    """A tile's channels: wgmma's N, a multiple of 8 from 16 up to ``widest``, dividing
    the group's channels (a tile of 8 would leave the tensor cores idle on m64n8)."""
    return [d for d in range(16, widest + 1, 8) if p.Cg % d == 0]


def dividing_map_tiles(p) -> list[int]:
    """The tiles of MAP_TILES that divide a group's maps; none where its maps are ragged
    (mobilenet's 24, 96 or 144)."""
    return [d for d in MAP_TILES if p.Mg % d == 0]


def map_tiles(p) -> list[int]:
    """The space's tiles of maps: those that divide the group's, else the ragged ones."""
    return dividing_map_tiles(p) or ragged_map_tiles(p)


def ragged_map_tiles(p) -> list[int]:
    """Where no tile of MAP_TILES divides a group's maps, and they are a multiple of 8
    from 16 (fewer would leave a warpgroup's 64 rows mostly zeros): the tiles of
    RAGGED_MAP_TILES whose last one holds some of them in every warpgroup (fewer than
    64 padding rows)."""
    if p.Mg % 8 or p.Mg < 16:
        return []
    return [d for d in RAGGED_MAP_TILES if d < p.Mg + 64]


def _space_tiles(p, three: bool) -> list[tuple[int, int]]:
    """The tune space's tiles (maps x channels): MAP_TILES that divide the group's maps,
    else the ragged ones; CHANNEL_TILES that divide its channels and the widest multiple
    of 8 that does (up to 128 in 3xTF32); those whose sums fit and whose channel rows
    split evenly among the warps."""
    widest = 128 if three else 256
    channels = channel_tiles(p, widest)
    bns = [d for d in CHANNEL_TILES if d in channels] + channels[-1:]
    return [
        (bm, bn)
        for bm in map_tiles(p)
        for bn in dict.fromkeys(bns)
        if _sums_fit(bm, bn, three) and bn % _warps(bm) == 0
    ]


def _warps(bm: int) -> int:
    """A block's warps: a warpgroup of four for each 64 maps."""
    return bm // 16


def _tile_count(p, bm: int, bn: int) -> int:
    """The blocks of one slice: a tile of bm maps (the last one ragged) x bn channels of
    each tap and group; none where the channels do not divide."""
    if p.Cg % bn:
        return 0
    return p.R * p.S * (p.Cg // bn) * -(-p.Mg // bm) * p.groups


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


def _tile_limits(p, v: Wgnchw) -> None:
    """bm maps (a multiple of 64 up to 256) x bn channels (a multiple of 8 up to 256 that
    divides the group's, and the warps' rows of it)."""
    bm, bn = v.blocktile
    at = f"wgnchw b{bm}x{bn}"
    if bm not in RAGGED_MAP_TILES:
        raise SpecError(f"{at}: a warpgroup multiplies 64 maps; choose 64, 128, 192 or 256")
    if p.Mg % bm and bm not in ragged_map_tiles(p):
        fits = map_tiles(p)
        raise SpecError(
            f"{at}: {bm} maps must divide the {p.Mg} maps of a group, or hold a multiple of "
            "8 from 16 with fewer than 64 to spare; "
            + (f"choose one of {choices(fits)} maps" if fits else "use --strategy tc3wgrad")
        )
    if bn % 8 or not 8 <= bn <= 256:
        raise SpecError(f"{at}: the channels of a tile are wgmma's N, a multiple of 8 up to 256")
    if p.Cg % bn:
        fits = channel_tiles(p)
        raise SpecError(
            f"{at}: {bn} channels must divide the {p.Cg} channels of a group (a tile is one "
            "tap's); "
            + (f"choose one of {choices(fits)} channels" if fits else "use --strategy tc3wgrad")
        )
    if bn % _warps(bm):
        raise SpecError(
            f"{at}: the tile's {bn} channel rows split among its {_warps(bm)} warps; "
            f"choose a multiple of {_warps(bm)} channels or fewer maps"
        )


def _vec4(p, bm: int, bn: int) -> bool:
    """Whether a thread copies 16 bytes (4 pixels of a row) at a time: where a 1x1
    window at stride 1 without padding reads x at dy's own pixel, no 4 pixels cross an
    image (the slices' ends are whole chunks) and a warp's channel rows come in fours
    (its map rows are 16: a warpgroup's 64 maps over its 4 warps).  With one
    4-byte word a lane, resnet50's 1x1 tf32 wgrad of 512 channels into 256 maps at 28x28
    (B=32, H200) waited on the queue of its 48 copies a thread a chunk (ncu: 2.0 TB/s
    from memory, 0.049 ms against cuDNN's 0.036); with 16 bytes it ran 0.0404 ms in the
    layer table against cuDNN's 0.0426, where it had run 0.0547."""
    return flat_pixels(p) and (p.Ho * p.Wo) % 4 == 0 and (bn // _warps(bm)) % 4 == 0


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
    _tile_limits(p, v)
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
    col_tiles, map_tiles = p.R * p.S * (p.Cg // bn), -(-p.Mg // bm)
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
        guard_maps=p.Mg % bm != 0,  # the last tile's rows past the group's maps
        precision_note=(
            "x and dy split into tf32 hi + lo, lo x hi + hi x lo + hi x hi a chunk from "
            "zero, added to the sums in fp32"
            if three
            else "x and dy read as tf32 (their fp32 words truncated), products accumulated "
            "in fp32"
        ),
    )
    vec4 = _vec4(p, bm, bn)
    if vec4:
        ctx.update(
            vec4=True,
            a_units=bm // warps // 4,  # a thread's 16-byte units of a chunk: 4 pixels of a row
            b_units=bn // warps // 4,
            unit_rows=4 * warps,  # rows apart of a thread's units: a warp copies 4 rows
            dy_units=4 * warps * P,  # words from a thread's row of dy to its next
            x_units=4 * warps * P,  # x's planes are dy's pixels
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
            (
                f"{(bm + bn) // warps // 4} 16-byte cp.async per thread per chunk"
                if vec4
                else f"{bm // warps + bn // warps} 4-byte cp.async per thread per chunk"
            ),
            (
                "lanes 8r.. four pixels each of row r: a warp's copy four 128-byte lines"
                if vec4
                else "lane l the chunk's pixel l of a row: one 128-byte line of shared memory a copy"
            ),
        ),
        grid_size(p, v, col_tiles, map_tiles),
        scratch,
    )
    return sliced_plan(p, v, (main, reduce), smem, sizes, ctx, workspace, CHUNK)
