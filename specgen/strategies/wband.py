"""``wband``: wgrad for narrow layers (few channels, wide windows, huge batches).

A block owns every tap of one input channel for a block of maps, (maps x R x S)
weights, and keeps their partial sums in registers across its whole slice of the
batch: warp r holds tap row r.  Image by image, band by band, the block stages the
band's dy rows and the x rows under them (zero padding written in) in shared memory;
each lane then walks runs of ``pixels`` adjacent outputs of one row, so that the x
values under the window slide through registers: (pixels-1)*sw + (S-1)*dw + 1 x loads
and maps x pixels dy loads feed maps x S x pixels FMAs.  At the end, shuffles and
shared memory sum the block, and a second kernel adds the slices in order, as in
``wsplit``.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import SpecError
from ..plan.common import (
    Launch,
    Plan,
    Size,
    bank_conflict_degree,
    ceil_div,
    choices,
    divisors,
    smem_placement,
)
from ..shapes import Op
from ..tensors import Role
from ..variants import EVERY_FEATURE, Count, Variant, param
from .wsplit import second_pass, sums_context

TARGET_BLOCKS = 1056  # eight blocks on each of the H200's 132 SMs
MAX_ACCUMULATORS = 64
MAX_UNROLLED = 512  # FMAs of one unit (maps x S x pixels), unrolled
SMEM_BUDGET = 96 * 1024  # both band buffers: two blocks fit an SM


@dataclass(frozen=True, kw_only=True)
class Wband(Variant):
    key = "wband"
    templates = ("backward/wband.cu.j2",)
    family = "backward"
    description = (
        "wgrad with every tap of a channel per block: sums in registers over its slice of the "
        "batch, bands staged in shared memory, x sliding along each run of pixels"
    )
    serves = EVERY_FEATURE
    ops = frozenset({Op.WGRAD})

    tile: int = param(16, Count("t"), "wband: output rows per staged band")
    maps: int = param(4, Count("m"), "wband: maps per block, each x load feeds them all")
    pixels: int = param(4, Count("p"), "wband: adjacent outputs of a row per lane step")
    warps: int = param(1, Count("w"), "wband: warps per tap row, sharing the band's pixels")
    splits: int = param(64, Count("s"), "wband: slices of the batch, one block row each")

    def plan(self, problem):
        return plan_wband(problem, self)

    @classmethod
    def fit(cls, problem, seed):
        """The most maps (up to 8) that keep the sums in registers, the tallest band
        that fits 48 KiB, runs of up to 4 pixels, and slices enough to fill the GPU."""
        p = problem
        maps = max(d for d in divisors(p.Mg) if d <= 8 and d * p.S <= MAX_ACCUMULATORS - 8)
        pixels = min(4, p.Wo)
        while pixels > 1 and maps * p.S * pixels > MAX_UNROLLED:
            pixels -= 1
        warps = 1  # two warps per tap row lost on every narrow preset (H200, 2026-11-22)
        tile = p.Ho
        while tile > 1 and _smem_bytes(p, tile, maps, pixels)[0] > SMEM_BUDGET:
            tile = ceil_div(tile, 2) if tile > 8 else tile - 1
        items = p.groups * (p.Mg // maps) * p.Cg
        # Not capped by the problem's default batch: an inline spec's is 1, and the same
        # kernel runs at any batch (a slice without images adds zeros).
        splits = max(1, min(TARGET_BLOCKS // items, 65535))
        return replace(seed, tile=tile, maps=maps, pixels=pixels, warps=warps, splits=splits)

    @classmethod
    def space(cls, problem, precision):
        base = cls.default(problem, precision)
        out = []
        for maps in sorted({1, 2, 4, 8, base.maps}):
            for pixels in sorted({2, 4, 8, base.pixels}):
                for warps in (1, 2):
                    for tile in sorted({base.tile, ceil_div(base.tile, 2)}):
                        out.append(replace(base, tile=tile, maps=maps, pixels=pixels, warps=warps))
        return out


def _layout(p, rows: int, maps: int, pixels: int):
    """Shared-memory strides of the x band and the dy band, padded so that the 32
    lanes of a warp (units of consecutive index) meet each bank at most once where a
    pad can do it."""
    segs = ceil_div(p.Wo, pixels)
    wo_pad = segs * pixels
    (sh, sw), (dh, dw) = p.stride, p.dil
    x_cols = (wo_pad - 1) * sw + (p.S - 1) * dw + 1
    x_rows = (rows - 1) * sh + (p.R - 1) * dh + 1
    units = [(u % rows, u // rows) for u in range(min(32, rows * segs))]  # (row, run)

    def best(width, addr):
        return min(
            range(width, width + 33),
            key=lambda st: (bank_conflict_degree([addr(st, r, s) for r, s in units]), st),
        )

    x_stride = best(x_cols, lambda st, r, s: r * sh * st + s * pixels * sw)
    dy_stride = best(wo_pad, lambda st, r, s: r * st + s * pixels)
    return dict(
        segs=segs,
        wo_pad=wo_pad,
        x_cols=x_cols,
        x_rows=x_rows,
        x_stride=x_stride,
        dy_stride=dy_stride,
        x_degree=bank_conflict_degree([r * sh * x_stride + s * pixels * sw for r, s in units]),
        dy_degree=bank_conflict_degree([r * dy_stride + s * pixels for r, s in units]),
    )


def _smem_bytes(p, rows, maps, pixels):
    """Bytes of the two band buffers, each part a whole number of 16-byte words."""
    lay = _layout(p, rows, maps, pixels)
    lay["x_band"] = ceil_div(lay["x_rows"] * lay["x_stride"], 4) * 4
    lay["dy_band"] = ceil_div(maps * rows * lay["dy_stride"], 4) * 4
    return 8 * (lay["x_band"] + lay["dy_band"]), lay


def plan_wband(p, v: Wband) -> Plan:
    # 1. limits
    if p.Mg % v.maps:
        raise SpecError(
            f"wband m{v.maps} must divide the {p.Mg} maps of a group; choose one of "
            f"{choices(divisors(p.Mg))}"
        )
    threads = 32 * p.R * v.warps
    if threads > 1024:
        raise SpecError(
            f"wband w{v.warps} makes {threads} threads (32 x R={p.R} tap rows x warps), over "
            f"1024; choose --warps {max(1, 1024 // (32 * p.R))}"
            if p.R <= 32
            else f"wband needs a warp per tap row, and R={p.R} rows are over 32 warps"
        )
    accumulators = v.maps * p.S + (v.maps if p.bias else 0)
    if accumulators > MAX_ACCUMULATORS:
        raise SpecError(
            f"wband m{v.maps} keeps {accumulators} sums per thread (maps x S={p.S}), over "
            f"{MAX_ACCUMULATORS}; choose fewer maps"
        )
    if v.maps * p.S * v.pixels > MAX_UNROLLED:
        raise SpecError(
            f"wband m{v.maps} p{v.pixels} unrolls {v.maps * p.S * v.pixels} FMAs per step, over "
            f"{MAX_UNROLLED}; choose fewer pixels"
        )
    if v.pixels > p.Wo:
        raise SpecError(f"wband p{v.pixels}: a row has only Wo={p.Wo} outputs")
    if v.tile > p.Ho:
        raise SpecError(f"wband t{v.tile}: the band is at most Ho={p.Ho} rows")
    if v.splits > 65535:
        raise SpecError(f"wband s{v.splits}: at most 65535 slices of the batch (grid y)")
    nbytes, lay = _smem_bytes(p, v.tile, v.maps, v.pixels)
    static, dynamic = smem_placement(
        nbytes, f"wband's two buffers of {v.tile}-row bands", "choose a smaller --tile"
    )
    if v.warps > 1 and 4 * (threads // 32) * ceil_div(accumulators, 4) * 4 > nbytes:
        raise SpecError("wband's block sums do not fit in its band buffers; choose --warps 1")

    # 2. work
    items = p.groups * (p.Mg // v.maps) * p.Cg
    bands = ceil_div(p.Ho, v.tile)
    units = v.tile * lay["segs"]
    lanes = 32 * v.warps
    ctx = sums_context(p, v.maps, v.splits, bgrad=False, with_db=p.bias)
    row = ctx["row"]
    workspace = 4 * v.splits * row
    sw, dw = p.stride[1], p.dil[1]
    nx = (v.pixels - 1) * sw + (p.S - 1) * dw + 1
    name = v.kernel_name(p)
    launches = (
        Launch(
            name,
            (Role.X, Role.DY, Role.WORKSPACE, Role.BATCH),
            (threads, 1, 1),
            (items, v.splits, 1),
            1,
            0,
            1,
            dynamic,
        ),
        second_pass(name, row, v.splits, p.bias),
    )
    ctx.update(
        lay,
        taps=p.S,
        rows=v.tile,
        bands=bands,
        units=units,
        lanes=lanes,
        warps=v.warps,
        L=v.pixels,
        nx=nx,
        threads=threads,
        dy_plane=v.tile * lay["dy_stride"],
        nacc_pad=ceil_div(accumulators, 4) * 4,
        x_load=lay["x_rows"] * lay["x_cols"],
        dy_load=v.maps * v.tile * lay["wo_pad"],
        dynamic=dynamic > 0,
        smem_bytes=nbytes,
        # two blocks per SM first (a register cap of 65536 / (2 x threads)), so that one
        # block's staging overlaps the other's sums; one if that spills
        launch_bounds=f"{threads}, 2",
        launch_bounds_alt=f"{threads}, 1",
    )
    per_image = bands * ceil_div(units, lanes) * v.pixels
    sizes = (
        Size(
            "block",
            f"{threads} threads = {p.R} x {v.warps} warp(s)",
            f"warp r*{v.warps}+k holds tap row r of {v.maps} map(s) x 1 channel: {items} blocks per slice",
        ),
        Size(
            "thread",
            f"{accumulators} fp32 sums",
            f"{v.maps} maps x S={p.S}"
            + (" + db" if p.bias else "")
            + ", kept over the whole slice",
        ),
        Size(
            "unit",
            f"{v.pixels} adjacent outputs",
            f"{nx} x loads and {v.maps * v.pixels} dy loads feed {v.maps * p.S * v.pixels} FMAs",
        ),
        Size(
            "band",
            f"{v.tile} rows x {lay['segs']} units",
            f"{bands} band(s) per image; {units} units over {lanes} lanes of each tap row",
        ),
        Size(
            "__shared__",
            f"{nbytes} B",
            f"x [{lay['x_rows']}][{lay['x_stride']}] ({lay['x_degree']}-way) + dy [{v.maps}][{v.tile}][{lay['dy_stride']}]"
            f" ({lay['dy_degree']}-way), zero padding written in",
        ),
        Size(
            "workspace",
            f"{workspace} B",
            f"{v.splits} slices x {row} sums; the second kernel adds the slices in order",
        ),
    )
    return Plan(
        shape=p,
        variant=v,
        template="backward/wband.cu.j2",
        launches=launches,
        static_smem=static,
        dynamic_smem=dynamic,
        const_bytes=0,
        weight_format="f32",
        sizes=sizes,
        context=ctx,
        workspace_bytes=workspace,
        sum_depth=(per_image, v.splits, 5 + v.warps + v.splits),
    )
