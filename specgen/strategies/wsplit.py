"""``wsplit``: wgrad (and db) as a reduction over the batch, split over blocks.

Each weight dw[m][c][p][q] is a sum over every image and output pixel, 64 million terms
per weight for layer1 at B=10000.  The work item of a warp (or of several) is one
tap row p of one input channel c for a block of maps: each thread walks its share of
the output pixels of its slice of the images, loads dy of its maps once and the row of
x under the window once, and keeps maps x S partial sums in registers.  Lanes are then
summed by a butterfly of warp shuffles, the warps of an item in shared memory, and the
block's sums go to its slice's row of a workspace; a second kernel adds the slices in
a fixed order, so every run gives the same bits.  The atomic variant (``--atomic``)
skips the workspace: a first kernel clears dw and db and the blocks atomicAdd into them,
in an order that varies from run to run (fp32 tensors only).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import SpecError
from ..plan.common import (
    Launch,
    Plan,
    Size,
    ceil_div,
    choices,
    divisors,
    launch_bounds,
    shape_context,
)
from ..shapes import DType, Op
from ..tensors import Role
from ..variants import EVERY_FEATURE, Count, Switch, Variant, param

BLOCK_WARPS = 8
TARGET_BLOCKS = 1024  # about 8 resident blocks on each of the H200's 132 SMs
REDUCE_BLOCK = 256
MANY_SLICES = 64  # from here on, several threads may add one column's slices
SUM_THREADS = 65536  # and as many as keep the second pass within this many threads
MAX_ACCUMULATORS = 64


@dataclass(frozen=True, kw_only=True)
class Wsplit(Variant):
    key = "wsplit"
    templates = ("backward/wgrad.cu.j2",)
    family = "backward"
    description = (
        "wgrad and db split over the batch: register partial sums, shuffle and shared-memory "
        "trees in the block, a second pass over the slices"
    )
    serves = EVERY_FEATURE
    ops = frozenset({Op.WGRAD, Op.BGRAD})

    maps: int = param(4, Count("m"), "wsplit: maps per thread, each x load feeds them all")
    warps: int = param(1, Count("w"), "wsplit: warps per work item, sharing its pixels")
    splits: int = param(64, Count("s"), "wsplit: slices of the batch, one block row each")
    atomic: bool = param(
        False,
        Switch("at", "sl", ("atomic", "slices")),
        "wsplit: blocks atomicAdd into fp32 dw/db (the order varies run to run), or write "
        "slices that a second kernel adds in order",
    )

    def plan(self, problem):
        return plan_wsplit(problem, self)

    @classmethod
    def seeds(cls):
        """The ordered two-pass sum, and the atomic one."""
        return [cls(), cls(atomic=True)]

    @classmethod
    def fit(cls, problem, seed):
        """The most maps per thread (up to the seed's) that divide a group's, then as
        many warps per item and slices as fill the GPU about eight blocks per SM deep."""
        maps = max(d for d in divisors(problem.Mg) if d <= seed.maps)
        items = _items(problem, maps)
        warps = max(
            w for w in (1, 2, 4, 8) if items * w <= 4 * TARGET_BLOCKS * BLOCK_WARPS or w == 1
        )
        blocks = ceil_div(items, BLOCK_WARPS // warps)
        # Not capped by the problem's default batch (an inline spec's is 1): the kernel
        # runs at any batch, and a slice without images adds zeros.
        splits = max(1, min(TARGET_BLOCKS // blocks, 65535))
        return replace(seed, maps=maps, warps=warps, splits=splits)

    @classmethod
    def space(cls, problem, precision):
        out = []
        base = cls.default(problem, precision)
        for maps in (1, 2, 4, 8):
            for warps in (1, 2, 4, 8):
                for factor in (1, 4):
                    s = max(1, base.splits * factor // 2)
                    for atomic in (False, True):
                        out.append(
                            cls(
                                maps=maps, warps=warps, splits=s, atomic=atomic, precision=precision
                            )
                        )
        return out


def slice_ways(splits: int, row: int) -> int:
    """Warps that share 32 columns of the second pass, each adding every ways-th slice:
    one thread a column where there are fewer than ``MANY_SLICES`` slices, else the
    largest power of two up to 32 that keeps the pass within ``SUM_THREADS`` threads.
    Timed alone (Nsight Compute, H200, 2026-11-30), one thread walking 1056 slices of
    320 sums took 12.6 us and 32 ways 2.9; 3136 sums of 132 slices 3.2 and 2.3 at 16
    ways; past 65536 threads the ways cost more than they gave (36864 sums of 66
    slices: 3.6 us alone, 5.1 at 32 ways; 589824 sums: 39 and 84)."""
    if splits < MANY_SLICES:
        return 1
    return max((w for w in (2, 4, 8, 16, 32) if row * w <= SUM_THREADS), default=1)


def sum_block(splits: int, row: int) -> int:
    """The second pass's block: ``REDUCE_BLOCK`` columns of one thread, or 32 columns of
    ``slice_ways`` warps."""
    ways = slice_ways(splits, row)
    return REDUCE_BLOCK if ways == 1 else 32 * ways


def per_slice(name: str, row: int, kind: str, args, splits: int) -> Launch:
    """The kernel that runs over a slice row: ``_reduce`` adds the ``splits`` slices of
    each partial sum in a fixed order, its threads sharing a column as ``slice_ways`` says;
    ``_zero`` clears dw and db before atomic adds, one thread a sum."""
    ways = slice_ways(splits, row) if kind == "reduce" else 1
    columns = REDUCE_BLOCK if ways == 1 else 32
    return Launch(
        f"{name}_{kind}",
        tuple(args),
        (columns * ways, 1, 1),
        (ceil_div(row, columns), 1, 1),
        1,
        0,
        1,
    )


def second_pass(name: str, row: int, splits: int, with_db: bool) -> Launch:
    """A wgrad's ``_reduce`` (``per_slice``): the workspace's slices added into dw, and
    into db where the layer has a bias."""
    return per_slice(
        name, row, "reduce", (Role.WORKSPACE, Role.DW, *((Role.DB,) if with_db else ())), splits
    )


# The second pass that ``backward/tc_sums.j2`` renders: where a plan's context names it
# (``second_pass``), the PyTorch operator may render that pass with dw and db in fp32,
# dw in the weights' own memory format (its ``grads32``).
TC_SUMS = "tc_sums"


def with_fp32_grads(plan, grads32: str):
    """``plan`` (a wgrad's) with its second pass writing dw and db in fp32, dw laid out
    as ``grads32``: "mcrs", PyTorch's contiguous [M][C/g][R][S], or "mrsc", its
    channels_last [M][R][S][C/g]; None where that pass is not ``backward/tc_sums.j2``.
    The PyTorch operator's, under autocast: the fp32 parameters take the sums as they
    are, with no rounding to 16 bits and no cast or copy after.  A window of one tap
    lays both orders out alike, [M][C/g], and is written as "mrsc", whose adjacent
    channels go in one 8-byte store: a 1x1 layer's weights read as contiguous to the
    operator, and resnet50's 1x1 wgrads of 7x7 maps took 0.0142 ms with mcrs's scalar
    stores against 0.0118 (H200, 2026-11-30)."""
    if grads32 not in ("mcrs", "mrsc"):
        raise ValueError(f"grads32 is 'mcrs' or 'mrsc', got {grads32!r}")
    if plan.shape.op is not Op.WGRAD or plan.context.get("second_pass") != TC_SUMS:
        return None
    if plan.shape.R * plan.shape.S == 1:
        grads32 = "mrsc"
    return replace(plan, context=dict(plan.context, grads32=grads32))


def sums_context(p, maps: int, splits: int, bgrad: bool, with_db: bool) -> dict:
    """What both wgrad templates read about the sums a thread keeps and how a slice row
    of them is laid out (dw as [M][C/groups][R][S], then db), for backward/reduce.j2 too."""
    weights = 0 if bgrad else p.weight_count
    row = weights + (p.M if with_db else 0)
    ways = slice_ways(splits, row)
    return dict(
        shape_context(p),
        bgrad=bgrad,
        with_db=with_db,
        mb=maps,
        mbs=p.Mg // maps,
        Mg=p.Mg,
        Cg=p.Cg,
        R=p.R,
        S=p.S,
        RS=p.R * p.S,
        dh=p.dil[0],
        dw=p.dil[1],
        splits=splits,
        row=row,
        weights=weights,
        reduce_block=REDUCE_BLOCK,
        sum_ways=ways,
        sum_block=sum_block(splits, row),
        sum_steps=ceil_div(splits, ways),  # the slices each way adds
        sum_unroll=0 if ceil_div(splits, ways) <= 64 else 16,  # 0: the whole loop
        sum_guard=splits % ways != 0,  # the last step's ways past the slices
        x_image=p.C * p.H * p.W,
        dy_image=p.M * p.Ho * p.Wo,
    )


def _items(p, maps: int) -> int:
    if p.op is Op.BGRAD:
        return p.M // maps
    return p.groups * (p.Mg // maps) * p.Cg * p.R


def plan_wsplit(p, v: Wsplit) -> Plan:
    # 1. limits
    if p.Mg % v.maps:
        raise SpecError(
            f"wsplit m{v.maps} must divide the {p.Mg} maps of a group; choose one of "
            f"{choices(divisors(p.Mg))}"
        )
    if BLOCK_WARPS % v.warps:
        raise SpecError(
            f"wsplit w{v.warps}: warps per item must divide {BLOCK_WARPS}: 1, 2, 4 or 8"
        )
    if v.splits > 65535:
        raise SpecError(f"wsplit s{v.splits}: at most 65535 slices of the batch (grid y)")
    bgrad = p.op is Op.BGRAD
    taps = 1 if bgrad else p.S
    accumulators = v.maps * taps + (v.maps if p.bias and not bgrad else 0)
    if accumulators > MAX_ACCUMULATORS:
        raise SpecError(
            f"wsplit m{v.maps} keeps {accumulators} sums per thread (maps x {taps} taps), over "
            f"{MAX_ACCUMULATORS}; choose fewer maps"
        )

    # 2. work: items of (group, map block, channel, tap row), blocks of items
    items = _items(p, v.maps)
    per_block = BLOCK_WARPS // v.warps
    blocks = ceil_div(items, per_block)
    P = p.Ho * p.Wo
    lanes = 32 * v.warps
    pixels_per_thread = ceil_div(P, lanes)
    with_db = bgrad or p.bias
    ctx = sums_context(p, v.maps, v.splits, bgrad, with_db)
    row = ctx["row"]  # one slice's partial sums
    workspace = 4 * v.splits * row

    name = v.kernel_name(p)
    outs = (*(() if bgrad else (Role.DW,)), *((Role.DB,) if with_db else ()))
    if v.atomic:
        if p.dtype is not DType.FP32:
            raise SpecError(
                f"wsplit atomic adds into fp32 dw and db; {p.dtype.value} tensors would round "
                "every block's sum: choose --slices"
            )
        workspace = 0
    main = Launch(
        name,
        (*(() if bgrad else (Role.X,)), Role.DY, *(outs if v.atomic else (Role.WORKSPACE,)))
        + (Role.BATCH,),
        (32 * BLOCK_WARPS, 1, 1),
        (blocks, v.splits, 1),
        1,
        0,
        1,
    )
    if v.atomic:
        launches = (per_slice(name, row, "zero", outs, v.splits), main)
    else:
        launches = (main, per_slice(name, row, "reduce", (Role.WORKSPACE, *outs), v.splits))
    ctx.update(
        taps=taps,
        items=items,
        per_block=per_block,
        warps=v.warps,
        lanes=lanes,
        threads=32 * BLOCK_WARPS,
        **launch_bounds(32 * BLOCK_WARPS, one_per_sm_first=False),
        P=P,
        atomic=v.atomic,
        guard_rows=p.pads[0] > 0 or p.pads[1] > 0,
        guard_cols=p.pads[2] > 0 or p.pads[3] > 0,
    )
    what = "db" if bgrad else ("dw and db" if with_db else "dw")
    sizes = (
        Size(
            "work item",
            "maps block" if bgrad else f"{v.maps} maps x 1 channel x tap row, {taps} taps",
            f"{items} items: " + ("M/maps" if bgrad else "groups x M/groups/maps x C/groups x R"),
        ),
        Size(
            "thread",
            f"{accumulators} fp32 sums",
            f"{v.maps} dy loads + {taps} x loads per pixel feed {v.maps * taps} FMAs",
        ),
        Size(
            "block",
            f"{32 * BLOCK_WARPS} threads = {per_block} item(s)",
            f"{v.warps} warp(s) per item: {lanes} lanes over the {P} output pixels, {pixels_per_thread} each",
        ),
        Size(
            "grid",
            f"{blocks} x {v.splits}",
            f"item blocks x slices of the batch (slice k: images k, k+{v.splits}, ...)",
        ),
        Size(
            "workspace",
            f"{workspace} B",
            (
                f"none: each block atomicAdds its sums into {what}, cleared by the first kernel"
                if v.atomic
                else f"{v.splits} slices x {row} partial sums of {what}; the second kernel adds "
                "the slices in order"
            ),
        ),
    )
    return Plan(
        shape=p,
        variant=v,
        template="backward/wgrad.cu.j2",
        launches=launches,
        static_smem=4 * per_block * v.warps * accumulators if v.warps > 1 else 0,
        dynamic_smem=0,
        const_bytes=0,
        weight_format="f32",
        sizes=sizes,
        context=ctx,
        workspace_bytes=workspace,
        # a thread's pixels of each image of its slice, 5 shuffle levels, the warps of
        # an item, the slices
        sum_depth=(pixels_per_thread, v.splits, 5 + v.warps + v.splits),
    )
