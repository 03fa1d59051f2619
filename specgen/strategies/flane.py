"""``flane``: the forward pass of channels-last layers with few maps (the autoencoder's
256 -> 3 output layer), its reduction over channels spread across a warp's lanes.

In NHWC a pixel's channels are adjacent, so lane l taking channels l, l + 32, ...
reads one pixel's x in coalesced 128-byte loads.  A warp owns a run of ``pixels``
adjacent outputs of one row and keeps, in each lane, the partial sums of every map at
every output of the run over its channels and every tap; the run's x values under the
window come once per tap row (the loads and products planned, padding left out, as in
``wlane``), and the weights sit in shared memory as [tap][channel][4 maps], one 16-byte
read feeding the run's products of every map.  A butterfly of shuffles then adds the
lanes, and the run's maps x pixels outputs leave in one coalesced store with the
epilogue.  Where stream tiles the maps, three maps leave its tiles mostly idle: in
NHWC it ran this layer at 0.20 ms against 0.09 in NCHW (H200)."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import SpecError
from ..plan.common import (
    SMS,
    MAX_BLOCKS_SM,
    STATIC_SMEM_BYTES,
    launch_bounds,
    Launch,
    Plan,
    Size,
    ceil_div,
    shape_context,
    y_args,
)
from ..shapes import Feature, TensorLayout
from ..tensors import Role
from ..variants import EPILOGUE, GEOMETRY, Count, Variant, param
from .wlane import row_runs

MAX_MAPS = 4  # a 16-byte shared-memory read holds every map's weight of a channel and tap
MAX_SUMS = 32  # maps x pixels sums a lane keeps
WARPS = (1, 2, 4, 8)
TARGET_BLOCKS = 528  # four blocks on each of the H200's 132 SMs
MAX_RESIDENT = SMS * MAX_BLOCKS_SM  # more blocks only wait for these to finish


@dataclass(frozen=True, kw_only=True)
class Flane(Variant):
    key = "flane"
    templates = ("direct/flane.cu.j2",)
    family = "direct"
    description = (
        "forward pass of channels-last layers with few maps: the channels across a warp's "
        "lanes, a run of outputs per warp, weights in shared memory, a shuffle sum"
    )
    serves = (GEOMETRY - {Feature.GROUPS}) | EPILOGUE | {Feature.DTYPE16, Feature.NHWC}

    warps: int = param(4, Count("w"), "flane: warps per block, a run each at a time")
    pixels: int = param(8, Count("p"), "flane: adjacent outputs of a row per warp")
    blocks: int = param(528, Count("g"), "flane: blocks of the grid, striding over the runs")

    def plan(self, problem):
        return plan_flane(problem, self)

    @classmethod
    def fit(cls, problem, seed):
        """Runs of up to 8 outputs (fewer where maps x pixels would pass 32 sums), four
        warps a block, four blocks a SM."""
        p = problem
        pixels = max(1, min(8, p.Wo, MAX_SUMS // max(1, p.M)))
        return replace(seed, pixels=pixels, warps=4, blocks=TARGET_BLOCKS)

    @classmethod
    def space(cls, problem, precision):
        base = cls.default(problem, precision)
        out = []
        for warps in (2, 4, 8):
            for pixels in sorted({4, 8, base.pixels}):
                for blocks in (264, 528, 1056):
                    out.append(
                        replace(base, warps=warps, pixels=min(pixels, problem.Wo), blocks=blocks)
                    )
        return list(dict.fromkeys(out))


def plan_flane(p, v: Flane) -> Plan:
    # 1. limits
    if p.layout is not TensorLayout.NHWC:
        raise SpecError(
            "flane reads channels-last tensors (the channels across a warp): use layout=nhwc "
            "in the shape spec, or --strategy stream for NCHW"
        )
    if p.groups != 1:
        raise SpecError("flane sums every channel across one warp: groups are not served")
    if p.M > MAX_MAPS:
        raise SpecError(
            f"flane keeps at most {MAX_MAPS} maps (one 16-byte read of weights); "
            f"M={p.M}: use --strategy stream"
        )
    if v.warps not in WARPS:
        raise SpecError(f"flane w{v.warps}: warps per block must be one of {WARPS}")
    if v.pixels > p.Wo:
        raise SpecError(f"flane p{v.pixels}: a row has only Wo={p.Wo} outputs")
    if v.pixels * p.M > MAX_SUMS:
        raise SpecError(
            f"flane p{v.pixels} keeps {v.pixels * p.M} sums a lane ({p.M} maps), over "
            f"{MAX_SUMS}; choose --pixels {MAX_SUMS // p.M}"
        )
    lanes = ceil_div(p.C, 32)  # channels a lane takes
    smem = p.R * p.S * lanes * 32 * 16
    if smem > STATIC_SMEM_BYTES:
        raise SpecError(
            f"flane keeps every weight in shared memory: {smem} bytes for C={p.C} and a "
            f"{p.R}x{p.S} window, over {STATIC_SMEM_BYTES}; use --strategy stream"
        )
    if v.blocks > MAX_RESIDENT:
        raise SpecError(
            f"flane g{v.blocks}: blocks that stride over the runs need be no more than an "
            f"sm_90 GPU holds at once ({SMS} SMs x {MAX_BLOCKS_SM}); choose --blocks "
            f"{MAX_RESIDENT} or fewer"
        )

    # 2. work
    runs = row_runs(p, v.pixels)
    ctx = dict(
        shape_context(p),
        R=p.R,
        S=p.S,
        threads=32 * v.warps,
        warps=v.warps,
        runs=runs,
        per_row=len(runs),
        lanes=lanes,
        cpad=lanes * 32,
        taps=p.R * p.S,
        tap_rows=[(r, r * p.dil[0] - p.pads[0]) for r in range(p.R)],
        x_image=p.C * p.H * p.W,
        x_row=p.W * p.C,
        y_row=p.Wo * p.M,
        smem_floats=smem // 4,
        w_count=p.M * p.C * p.R * p.S,
        ragged=p.C % 32 != 0,
        **launch_bounds(32 * v.warps),
    )
    launch = Launch(
        v.kernel_name(p),
        (Role.X, Role.W, *y_args(p), Role.BATCH),
        (32 * v.warps, 1, 1),
        (v.blocks, 1, 1),
        0,
        0,
        1,
    )
    sums = v.pixels * p.M
    sizes = (
        Size(
            "block",
            f"{32 * v.warps} threads",
            f"{v.warps} warps, a run of {v.pixels} outputs each at a time; {v.blocks} blocks stride over the runs",
        ),
        Size(
            "lane",
            f"{sums} fp32 sums",
            f"{p.M} maps x {v.pixels} outputs over channels lane, lane + 32, ... ({lanes} of them)",
        ),
        Size(
            "__shared__",
            f"{smem} B",
            f"weights [{p.R * p.S} taps][{lanes * 32} channels][4 maps], zero past C and M",
        ),
    )
    return Plan(
        shape=p,
        variant=v,
        template="direct/flane.cu.j2",
        launches=(launch,),
        static_smem=smem,
        dynamic_smem=0,
        const_bytes=0,
        weight_format="f32",
        sizes=sizes,
        context=ctx,
    )
