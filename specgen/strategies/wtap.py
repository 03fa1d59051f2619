"""``wtap``: fp32 wgrad of narrow layers with a lane per (channel, map, window row).

wband gives each lane its own run of pixels, so every lane's shared loads are its own:
on the 7x7 layers (a dy value feeds maps x S FMAs, an x value S) 26 loads fed 112 FMAs,
the shared-memory pipe ran as busy as the FMA pipe, and fp32 wgrad held at a third of
the FMA rate (H200, B=10000).

Here the lanes of a warp walk the same pixels of the same output row, and each lane
keeps the S sums of one (channel, map, window row): it adds dy[m][p] * x[c][r + row]
[p + s] into its s-th sum.  A step of P pixels is then one vector load of the lane's
map's dy and one of its window row's x, and 1 + P*sw new x values slide the window,
for P x S FMAs; the loads are the same for every lane of a map (dy) or of a window row
(x), so a warp's load touches a few rows and maps, not 32 runs: a few broadcast
wavefronts for 32 x P x S FMAs.  The block's sums are laid over its lanes in order (the
window row fastest), so a warp's lanes are all busy where the sums fill it (layer2's
4 x 16 x 7 = 448 sums are 14 warps); where the layer has a bias, one lane a map more
sums dy against a row of ones: db.

A lane may keep ``regtile`` maps x window rows (r2x1 on the 7x7 layers, r4x3 on 3x3
windows of many channels): a step then loads that many maps' dy and rows' x for
maps x rows x S x P FMAs, so each shared load feeds more of them (a 3x3 window's lane
of one map and row did 12 FMAs for two loads, one of 4 maps and 3 rows does 144 for
seven).

A block owns ``chans`` input channels and ``maps`` maps of a group for a slice of the
batch.  Its sums are split ``warps`` ways over the rows of a band, a lane a (split,
sum), so that 28 sums x 8 splits fill 7 warps where a warp per split left 4 lanes of
each idle.  It stages each band's x and dy rows by cp.async, in two buffers behind one
barrier a band or in a ring of ``stages`` buffers whose mbarriers say when a buffer is
full and when every thread is done with it (a warp that is ahead goes on into the next
band), and keeps its sums in registers over the whole slice; the row splits meet in
shared memory and a second kernel adds the slices in order (``backward/reduce.j2``),
so the result is deterministic.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from ..errors import SpecError
from ..plan import tallest
from ..plan.common import (
    OPTIN_SMEM_BYTES,
    Launch,
    Plan,
    Size,
    ceil_div,
    choices,
    divisors,
    smem_blocks,
    smem_placement,
)
from ..shapes import DType, Op, TensorLayout
from ..tensors import Role
from ..variants import EVERY_FEATURE, Count, Pair, Variant, param
from .bands import copies, layout
from .wsplit import second_pass, sums_context

TARGET_BLOCKS = 1056  # eight blocks on each of the H200's 132 SMs
FIT_WARPS = 16  # the fit's blocks: at most 512 threads, two an SM
MAX_SPLITS = 4  # the fit's row splits
MAX_WARPS = 24  # 1024 threads spilled at 64 registers a thread (layer2, H200)
SMALL_BLOCK_SMEM = 64 * 1024  # the fit's buffers for blocks of up to 8 warps: three an SM
MAX_RESIDENT = 4  # the most blocks an SM the launch bound asks for
MAX_UNROLLED = 4096  # FMAs of a row's unrolled steps (S x Wo rounded up to the steps)
MAX_LANE_SUMS = 72  # a lane's sums in registers (maps x window rows x S)
TILED_CHANS, TILED_MAPS = 16, 32  # lane_tiled's block: 16 channels x 32 maps, 4 a lane
TILED_ROWS = 8  # and its band


def lane_tiled(p) -> bool:
    """Whether the fit gives a lane 4 maps x every window row: small windows (R x S of
    at most 9) over channels and maps enough for blocks of 16 x 32 (the autoencoder's
    wide layers in NCHW: 0.45 ms against wgemm's 0.58, H200)."""
    return p.R * p.S <= 9 and p.Cg >= TILED_CHANS and p.Mg >= TILED_MAPS and p.Mg % 4 == 0


def pairs(p, v) -> int:
    """The block's lanes of sums: (channel, maps, window rows), ``regtile`` maps x window
    rows of S sums each, and a lane's maps' db (their sums against a row of ones) where
    the layer has a bias."""
    lm, lr = v.regtile
    groups = v.maps // lm
    return v.chans * groups * (p.R // lr) + (groups if p.bias else 0)


@dataclass(frozen=True, kw_only=True)
class Wtap(Variant):
    key = "wtap"
    templates = ("backward/wtap.cu.j2",)
    family = "backward"
    description = (
        "fp32 wgrad with a lane per (map, window row): a warp walks the same pixels, its x "
        "and dy loads broadcast, S sums a lane in registers over a slice of the batch"
    )
    serves = EVERY_FEATURE
    ops = frozenset({Op.WGRAD})

    tile: int = param(16, Count("t"), "wtap: output rows per staged band")
    maps: int = param(4, Count("m"), "wtap: maps per block")
    chans: int = param(1, Count("c"), "wtap: input channels per block")
    pixels: int = param(4, Count("p"), "wtap: outputs of a row per step (one vector load)")
    regtile: tuple[int, int] = param(
        (1, 1), Pair("r"), "wtap: maps x window rows a lane keeps, S sums each"
    )
    warps: int = param(1, Count("w"), "wtap: row splits of a band, each a lane a sum")
    stages: int = param(
        2,
        Count("q"),
        "wtap: band buffers in the ring (2: one barrier a band; 3 or 4: under mbarriers)",
    )
    splits: int = param(64, Count("s"), "wtap: slices of the batch, one block row each")

    def plan(self, problem):
        return plan_wtap(problem, self)

    @classmethod
    def fit(cls, problem, seed):
        """The (channels, maps) block that reads x and dy the fewest times with at most
        16 warps of sums, runs of 4 pixels, and ``_fit_band``'s row splits, band and
        slices. fp32 wgrad at B=10000 (H200, 2026-11-24, after the lean copies): layer1
        0.757 ms (its shipped winner, 8 row splits, 0.722), layer2 2.055 in whole images
        (bands of 12: 1.974), mx-layer1 1.705 with 12 maps a block (4 maps, three blocks
        an SM: 1.527); the shipped winners carry the better ones."""
        p = problem
        pixels = min(4, p.Wo)
        if lane_tiled(p):
            # ae-enc2 fp32 wgrad at B=128 (H200, 2026-11-24): 32 maps x 16 channels a
            # block in two buffers 0.453 ms (three: 0.449), 16 x 32 0.450, bands of 4
            # rows 0.460, 8 maps x 3 rows a lane 0.606 (168 registers); wgemm 0.579
            mb = max(d for d in divisors(p.Mg) if d <= TILED_MAPS and d % 4 == 0)
            cb = max(d for d in divisors(p.Cg) if d <= TILED_CHANS)
            items = p.groups * (p.Mg // mb) * (p.Cg // cb)
            return replace(
                seed,
                maps=mb,
                chans=cb,
                pixels=pixels,
                regtile=(4, p.R),
                tile=ceil_div(p.Ho, ceil_div(p.Ho, TILED_ROWS)),
                warps=1,
                stages=2,
                splits=max(1, min(TARGET_BLOCKS // items, 65535)),
            )
        best = None
        for cb in divisors(p.Cg):
            for mb in divisors(p.Mg):
                warps = block_warps(p, replace(seed, chans=cb, maps=mb, warps=1))
                if warps > FIT_WARPS:
                    continue
                # x is read once per map block, dy once per channel block
                reads = p.Mg // mb * p.Cg * p.H * p.W + p.Cg // cb * p.Mg * p.Ho * p.Wo
                key = (reads, warps)
                if best is None or key < best[0]:
                    best = (key, cb, mb, warps)
        if best is None:
            raise SpecError(f"wtap: one map and channel's R={p.R} sums are over {FIT_WARPS} warps")
        _, cb, mb, _ = best
        # Blocks of several channels take lanes of 2 maps (fp32 wgrad at B=10000, H200,
        # 2026-11-24, the fit's own blocks: layer2 1.855 ms against 1.979, mx-layer2 4.698
        # against 5.003); one channel's blocks keep a map a lane (layer1 0.808 against
        # 0.796, mx-layer1 1.699 against 1.602).
        tile = (2, 1) if cb > 1 and mb % 2 == 0 else (1, 1)
        return _fit_band(p, replace(seed, maps=mb, chans=cb, pixels=pixels, regtile=tile))

    @classmethod
    def space(cls, problem, precision):
        """Around the fit's block and blocks of fewer warps (the maps of one warp a
        channel, half the maps, half the channels), each with the fit's lane tile and with
        lanes of one map and row, of 2 maps, and (where the fit tiles lanes) of 2 maps x R
        rows, each with its own fitted band: 1 to 16 row splits, the band and its half,
        half and twice the slices, two buffers or a ring of three."""
        p = problem
        base = cls.default(problem, precision)
        blocks = {
            (base.chans, base.maps),
            (base.chans, base.maps // 2),
            (base.chans // 2, base.maps),
        }
        blocks.add((base.chans, max(d for d in divisors(p.Mg) if d * p.R <= 32 or d == 1)))
        out = []
        tiles = {base.regtile, (1, 1), (2, 1)} | ({(2, p.R)} if lane_tiled(p) else set())
        for (cb, mb), (lm, lr) in itertools.product(sorted(blocks), sorted(tiles)):
            if not cb or not mb or p.Cg % cb or p.Mg % mb or mb % lm:
                continue
            fit = _fit_band(p, replace(base, chans=cb, maps=mb, regtile=(lm, lr)))
            for warps, tile, k, stages in itertools.product(
                (1, 2, 4, 8, 16), sorted({fit.tile, ceil_div(fit.tile, 2)}), (1, 2, 4), (2, 3)
            ):
                splits = max(1, min(fit.splits * k // 2, 65535))
                out.append(replace(fit, warps=warps, tile=tile, splits=splits, stages=stages))
        return list(dict.fromkeys(out))


def _fit_band(p, v: Wtap) -> Wtap:
    """A block's row splits (at most 4, and 16 warps), the tallest band of whole row
    splits that fits three blocks an SM where they have at most 8 warps, else one (cut
    evenly), and slices for eight blocks an SM."""
    warps = block_warps(p, replace(v, warps=1))
    split = max(1, min(MAX_SPLITS, FIT_WARPS // warps, p.Ho))
    v = replace(v, warps=split, tile=p.Ho)
    budget = SMALL_BLOCK_SMEM if block_warps(p, v) <= 8 else OPTIN_SMEM_BYTES
    # the tallest band that fits (its buffers grow with it), in whole row splits
    tile = tallest(p.Ho, lambda t: _smem_bytes(p, replace(v, tile=t))[0] <= budget) or 1
    if tile > split:
        tile -= tile % split
    tile = ceil_div(p.Ho, ceil_div(p.Ho, tile))
    items = p.groups * (p.Mg // v.maps) * (p.Cg // v.chans)
    splits = max(1, min(TARGET_BLOCKS // items, 65535))
    return replace(v, tile=tile, warps=min(split, tile), splits=splits)


def block_warps(p, v) -> int:
    """The warps of the block's sums x row splits, a lane each."""
    return ceil_div(pairs(p, v) * v.warps, 32)


def _smem_bytes(p, v) -> tuple[int, dict]:
    """The buffers, the row of ones and the ring's mbarriers (two of 8 bytes a buffer),
    or the row splits' sums where they need more (they meet in the same memory after
    the last band)."""
    lay = layout(p, v)
    sums = 32 * block_warps(p, v) * p.S * v.regtile[0] * v.regtile[1] if v.warps > 1 else 0
    bars = 4 * v.stages if v.stages > 2 else 0
    return 4 * max(v.stages * lay["buffer"] + lay["ones_words"] + bars, sums), lay


def plan_wtap(p, v: Wtap) -> Plan:
    # 1. limits
    if p.dtype is not DType.FP32:
        raise SpecError(
            f"wtap sums fp32 tensors; for {p.dtype.value} use --strategy wstrip (tensor "
            "cores) or wband"
        )
    if p.layout is not TensorLayout.NCHW:
        raise SpecError("wtap reads NCHW tensors; for nhwc use --strategy wlane or wgemm")
    if p.Mg % v.maps:
        raise SpecError(
            f"wtap m{v.maps} must divide the {p.Mg} maps of a group; choose one of "
            f"{choices(divisors(p.Mg))}"
        )
    if p.Cg % v.chans:
        raise SpecError(
            f"wtap c{v.chans} must divide the {p.Cg} channels of a group; choose one of "
            f"{choices(divisors(p.Cg))}"
        )
    lm, lr = v.regtile
    mg, rl = v.maps // lm, p.R // lr  # a channel's lanes of maps and of window rows
    if v.maps % lm:
        raise SpecError(
            f"wtap r{lm}x{lr}: {lm} maps a lane must divide the block's {v.maps}; choose one "
            f"of {choices(divisors(v.maps))}"
        )
    if p.R % lr:
        raise SpecError(
            f"wtap r{lm}x{lr}: {lr} window rows a lane must divide R={p.R}; choose one of "
            f"{choices(divisors(p.R))}"
        )
    if lm * lr * p.S > MAX_LANE_SUMS:
        raise SpecError(
            f"wtap r{lm}x{lr} keeps {lm} x {lr} x {p.S} sums a lane, over {MAX_LANE_SUMS} "
            "registers; choose fewer maps or window rows a lane"
        )
    sums = pairs(p, v)
    warps = block_warps(p, v)
    if warps > MAX_WARPS:
        most = 32 * MAX_WARPS // sums
        raise SpecError(
            f"wtap c{v.chans} m{v.maps} w{v.warps} makes {32 * warps} threads ({sums} lanes of "
            f"sums x {v.warps} row split(s)), over {32 * MAX_WARPS} (where ptxas "
            "spills); " + (f"choose --warps {most}" if most else "choose fewer --chans or --maps")
        )
    if not 2 <= v.stages <= 4:
        raise SpecError(f"wtap q{v.stages}: the band ring has 2, 3 or 4 buffers; choose --stages 3")
    if v.tile > p.Ho:
        raise SpecError(f"wtap t{v.tile}: the band is at most Ho={p.Ho} rows")
    if v.warps > v.tile:
        raise SpecError(f"wtap w{v.warps} splits a band of {v.tile} rows; choose --warps {v.tile}")
    if v.pixels > p.Wo:
        raise SpecError(f"wtap p{v.pixels}: a row has only Wo={p.Wo} outputs")
    if v.splits > 65535:
        raise SpecError(f"wtap s{v.splits}: at most 65535 slices of the batch (grid y)")
    nbytes, lay = _smem_bytes(p, v)
    staging = copies(p, v, lay, warps)
    if lm * lr * p.S * lay["dy_cols"] > MAX_UNROLLED:
        raise SpecError(
            f"wtap unrolls a row's {lm * lr * p.S} x {lay['dy_cols']} FMAs, over {MAX_UNROLLED}; "
            + ("choose --regtile 1x1" if lm * lr > 1 else "use --strategy wband")
        )
    threads = 32 * warps
    # The bound asks for as many blocks an SM as shared memory and the warps allow (up to
    # 4): ptxas then keeps the registers to what they leave.
    resident = max(1, min(MAX_RESIDENT, smem_blocks(nbytes), 64 // warps))
    static, dynamic = smem_placement(
        nbytes,
        f"wtap's {v.stages} buffers of {v.tile}-row bands",
        "choose a smaller --tile or --stages",
    )

    # 2. work
    items = p.groups * (p.Mg // v.maps) * (p.Cg // v.chans)
    bands = ceil_div(p.Ho, v.tile)
    ctx = sums_context(p, v.maps, v.splits, bgrad=False, with_db=p.bias)
    row = ctx["row"]
    workspace = 4 * v.splits * row
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
    bars_at = v.stages * lay["buffer"] + lay["ones_words"]  # the ring's mbarriers (words)
    ctx.update(
        lay,
        **staging,
        pairs=sums,
        ring=v.stages > 2,
        q=v.stages,
        bars_at=bars_at,
        bars_bytes=4 * bars_at,  # full[q] there, then
        empty_at=8 * v.stages,  # empty[q] this many bytes on
        tap_pairs=v.chans * mg * rl,
        channel_pairs=mg * rl,
        idle_lanes=threads - sums * v.warps,  # the last split's lanes past its sums
        LM=lm,
        LR=lr,
        RL=rl,
        MG=mg,
        LS=lm * lr * p.S,  # a lane's sums
        cb=v.chans,
        cbs=p.Cg // v.chans,
        x_band_rows=v.chans * lay["x_rows"],
        dy_band_rows=v.maps * v.tile,
        map_sums=p.Cg * p.R * p.S,
        rows=v.tile,
        bands=bands,
        splits_rows=v.warps,
        P=v.pixels,
        last_outs=p.Wo - v.pixels * (lay["steps"] - 1),  # the last step's outputs in the row
        threads=threads,
        warps=warps,
        ones_at=v.stages * lay["buffer"],
        dynamic=dynamic > 0,
        smem_bytes=nbytes,
        smem_words=nbytes // 4,
        launch_bounds=f"{threads}, {resident}",
        launch_bounds_alt=f"{threads}, 1",
        lane_rows_words=lr * lay["x_tap_step"],  # from a lane's window rows to the next lane's
        lane_map_sums=lr * p.S,  # a lane's sums of one map
        lane_map_step=mg * lay["dy_plane"],  # from a lane's map to its next, in dy
        lane_map_step_dw=mg * p.Cg * p.R * p.S,  # and in dw
    )
    sizes = (
        Size(
            "lane",
            f"{sums} lanes x {v.warps} row split(s)",
            (
                f"a lane keeps dy[m] x x[c][row + r] for one (c, m, r), S={p.S} columns"
                if lm * lr == 1
                else f"a lane keeps dy[m] x x[c][row + r] for one c, {lm} m and {lr} r, "
                f"{lm * lr * p.S} sums"
            )
            + (" (or dy[m] x 1: db)" if p.bias else "")
            + f", over one row split; {100 * sums * v.warps / threads:.0f}% of the lanes busy",
        ),
        Size(
            "block",
            f"{threads} threads",
            f"{v.chans} channel(s) x {v.maps} map(s): {items} blocks per slice",
        ),
        Size(
            "step",
            f"{v.pixels} outputs",
            f"{lm} {lay['vd']}-wide dy load(s) and {lr} x {lay['shift']} new x values "
            f"({lay['vx']} a load) feed {v.pixels * p.S * lm * lr} FMAs a lane",
        ),
        Size(
            "band",
            f"{v.tile} rows, {bands} an image",
            f"{lay['steps']} steps a row, unrolled; rows split {v.warps} way(s); "
            + (
                f"a ring of {v.stages} buffers under mbarriers"
                if v.stages > 2
                else "two buffers, one barrier a band"
            ),
        ),
        Size(
            "__shared__",
            f"{nbytes} B",
            f"{v.stages} buffers of x [{v.chans}][{lay['x_rows']}][{lay['x_stride']}] and dy "
            f"[{v.maps}][{v.tile}][{lay['dy_stride']}] (planes of {lay['dy_plane']}), "
            "x's padding written in as zeros" + ("; a row of ones for db" if p.bias else ""),
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
        template="backward/wtap.cu.j2",
        launches=launches,
        static_smem=static,
        dynamic_smem=dynamic,
        const_bytes=0,
        weight_format="f32",
        sizes=sizes,
        context=ctx,
        workspace_bytes=workspace,
        # a lane's sum: its rows of each band (a split's share) x the steps' outputs,
        # image by image of its slice; then the row splits and the slices in order
        sum_depth=(
            bands * ceil_div(v.tile, v.warps) * lay["dy_cols"],
            v.splits,
            v.warps + v.splits,
        ),
    )
