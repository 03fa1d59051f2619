"""``inputtile``: the block is the input tile (seed 004's "strategy 2").

A block has one thread per pixel of the input tile, halo included: (tile-1)*s +
(R-1)*d + 1 rows and columns.  Every thread copies its own pixel of each staged
channel into shared memory (one load each, no loop over the halo), and only the inner
tile x tile threads compute, one output pixel for ``maps`` output maps each; the
halo threads idle through the compute.  Channels are staged ``chunk`` at a time; the
window over a chunk is straight-line FMAs with literal shared-memory offsets.

``tiled`` instead sizes the block by the output and loops its threads over the halo;
this strategy trades idle threads for a load phase without index arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import SpecError
from ..plan.common import (
    CONST_BYTES,
    MAX_THREADS,
    Launch,
    Plan,
    Size,
    bank_conflict_degree,
    ceil_div,
    choices,
    divisors,
    launch_bounds,
    shape_context,
    smem_placement,
    y_args,
)
from ..plan.direct import MAX_UNROLLED_FMAS, halo, largest_tile, problem_sizes
from ..plan.direct_family import DEFAULT_FMAS, default_weights
from ..shapes import ConvProblem, DType, Feature, TensorLayout
from ..tensors import Role
from ..variants import EVERY_FEATURE, Count, Variant, Weights, param
from .direct import WEIGHTS

TILES = (16, 8, 4)


@dataclass(frozen=True, kw_only=True)
class Inputtile(Variant):
    key = "inputtile"
    templates = ("direct/inputtile.cu.j2",)
    family = "direct"
    description = (
        "the block is the input tile with its halo: every thread stages one pixel per "
        "channel, the inner tile x tile threads compute"
    )
    serves = EVERY_FEATURE

    tile: int = param(16, Count("t"), "inputtile: output tile edge (the inner threads)")
    maps: int = param(4, Count("m"), "inputtile: output maps per thread (and block)")
    chunk: int = param(4, Count("c"), "inputtile: input channels staged per step")
    weights: Weights = WEIGHTS

    def plan(self, problem: ConvProblem) -> Plan:
        limits = self._check(problem)
        layout = self._layout(problem, *limits)
        return self._plan(problem, layout)

    # 1. limits
    def _check(self, p: ConvProblem) -> tuple[int, int]:
        most = largest_tile(p)
        if self.tile > most:
            raise SpecError(
                f"tile {self.tile} is larger than the {p.Ho}x{p.Wo} output needs; "
                f"choose at most {most}"
            )
        ih, iw = halo(p, self.tile)
        if ih * iw > MAX_THREADS:
            fit = [t for t in range(1, self.tile) if _threads(p, t) <= MAX_THREADS]
            hint = f"choose --tile {max(fit)} or less" if fit else "use --strategy tiled"
            raise SpecError(
                f"inputtile's block is the {ih}x{iw} input tile = {ih * iw} threads, over "
                f"the limit of {MAX_THREADS} threads per block; {hint}"
            )
        if p.Mg % self.maps:
            raise SpecError(
                f"inputtile m{self.maps} must divide the {p.Mg} maps of a group; "
                f"choose one of {choices(divisors(p.Mg))}"
            )
        if p.Cg % self.chunk:
            raise SpecError(
                f"inputtile c{self.chunk} must divide the {p.Cg} input channels of a group; "
                f"choose one of {choices(divisors(p.Cg))}"
            )
        fmas = self.maps * self.chunk * p.R * p.S
        if fmas > MAX_UNROLLED_FMAS:
            raise SpecError(
                f"{self.kernel_name(p)} unrolls {fmas} FMAs per chunk, over specgen's limit "
                f"of {MAX_UNROLLED_FMAS}; choose fewer --maps or a smaller --chunk"
            )
        if self.weights is Weights.CONST and 4 * p.weight_count > CONST_BYTES:
            raise SpecError(
                f"constant weights need {4 * p.weight_count} bytes, over the "
                f"{CONST_BYTES}-byte constant bank; use --weights global"
            )
        return ih, iw

    # 2. memory: the staged chunk, rows padded against bank conflicts
    def _layout(self, p: ConvProblem, ih: int, iw: int) -> dict:
        sh, sw = p.stride
        inner = [(t % self.tile, t // self.tile) for t in range(32)]  # the first computing lanes
        # The block is iw threads wide, so the first warp's inner lanes are those of
        # its first rows; the pad is the one with the fewest conflicts on their reads.
        lanes = [(t % iw, t // iw) for t in range(32)]
        lanes = [(x, y) for x, y in lanes if x < self.tile and y < self.tile] or inner
        best = min(
            range(32),
            key=lambda pad: (
                bank_conflict_degree([y * sh * (iw + pad) + x * sw for x, y in lanes]),
                pad,
            ),
        )
        row = iw + best
        degree = bank_conflict_degree([y * sh * row + x * sw for x, y in lanes])
        floats = self.chunk * ih * row
        hint = "choose a smaller --chunk or --tile"
        static, dynamic = smem_placement(4 * floats, f"{self.chunk} staged channel(s)", hint)
        return dict(
            ih=ih,
            iw=iw,
            row=row,
            pad=best,
            degree=degree,
            plane=ih * row,
            floats=floats,
            static=static,
            dynamic=dynamic,
        )

    # 3. the template's context and the launch
    def _plan(self, p: ConvProblem, lay: dict) -> Plan:
        ih, iw, row, plane = lay["ih"], lay["iw"], lay["row"], lay["plane"]
        (dh, dw), RS = p.dil, p.R * p.S
        tiles_x, tiles_y = ceil_div(p.Wo, self.tile), ceil_div(p.Ho, self.tile)
        map_groups = p.M // self.maps
        const = self.weights is Weights.CONST
        nhwc = p.layout is TensorLayout.NHWC
        steps = p.Cg // self.chunk
        # per staged channel c and tap (r, s): the pixel's offset from the thread's
        # corner of the chunk, and the weight's from the thread's first weight
        taps = [
            dict(c=c, r=r, s=s, x=c * plane + r * dh * row + s * dw, w=c * RS + r * p.S + s)
            for c in range(self.chunk)
            for r in range(p.R)
            for s in range(p.S)
        ]
        ctx = dict(
            shape_context(p),
            **launch_bounds(ih * iw),
            dtype=p.dtype.value,
            xtype="float" if p.dtype is DType.FP32 else "unsigned short",
            nhwc=nhwc,
            tile=self.tile,
            maps=self.maps,
            chunk=self.chunk,
            steps=steps,
            ih=ih,
            iw=iw,
            row=row,
            plane=plane,
            floats=lay["floats"],
            dynamic=lay["dynamic"] > 0,
            tiles_x=tiles_x,
            map_groups=map_groups,
            map_groups_per_group=p.Mg // self.maps,
            const=const,
            weight_count=p.weight_count,
            wstride_map=p.Cg * RS,
            guard_loads=max(p.pads) > 0 or p.Wo % self.tile != 0 or p.Ho % self.tile != 0,
            guard_stores=p.Wo % self.tile != 0 or p.Ho % self.tile != 0,
            x_plane=1 if nhwc else p.H * p.W,  # steps of x between channels
            x_pixel=p.C if nhwc else 1,  # and between pixels of a row
            group_x=p.Cg * (1 if nhwc else p.H * p.W),
            taps=taps,
            epilogue_note=_epilogue_note(p),
        )
        sizes = [
            *problem_sizes(p),
            Size(
                "block",
                f"{iw} x {ih} = {iw * ih} threads",
                f"the input tile: (tile-1)*s + (K-1)*d + 1 = {iw} x {ih}; the inner "
                f"{self.tile} x {self.tile} compute",
            ),
            Size(
                "grid",
                f"{tiles_x * tiles_y} x {map_groups} x B",
                f"ceil({p.Wo}/{self.tile})*ceil({p.Ho}/{self.tile}) tiles, "
                f"M/maps = {p.M}/{self.maps} map groups",
            ),
            Size(
                "__shared__",
                f"{4 * lay['floats']} B = [{self.chunk}][{ih}][{iw}+{lay['pad']}] floats",
                f"{self.chunk} channel(s) per step, {steps} step(s); pad {lay['pad']} -> "
                f"{lay['degree']}-way bank conflicts at worst",
            ),
            Size(
                "registers",
                f"{self.maps} accumulators",
                f"one output pixel x {self.maps} maps per inner thread",
            ),
        ]
        if const:
            sizes.append(Size("__constant__", f"{4 * p.weight_count} B", "the whole weight tensor"))
        args = (Role.X,) + (() if const else (Role.W,)) + y_args(p)
        launch = Launch(
            self.kernel_name(p),
            args,
            (iw, ih, 1),
            (tiles_x * tiles_y, map_groups, 0),
            2,
            1,
            1,
            lay["dynamic"],
        )
        return Plan(
            shape=p,
            variant=self,
            template="direct/inputtile.cu.j2",
            launches=(launch,),
            static_smem=lay["static"],
            dynamic_smem=lay["dynamic"],
            const_bytes=4 * p.weight_count if const else 0,
            weight_format="f32",
            sizes=tuple(sizes),
            context=ctx,
        )

    # defaults and search space
    @classmethod
    def fit(cls, problem: ConvProblem, seed: "Inputtile") -> "Inputtile":
        """The largest of TILES whose input tile fits a block; up to 8 maps per thread
        and the most channels per step whose straight-line body stays within
        DEFAULT_FMAS; constant weights when they fit the bank and are read at literal
        offsets."""
        RS = problem.R * problem.S
        tiles = [t for t in TILES if _threads(problem, t) <= MAX_THREADS]
        tiles = [t for t in tiles if t <= largest_tile(problem)] or tiles[-1:]
        if not tiles:
            raise SpecError(
                f"inputtile: even a 4x4 tile's input tile is over {MAX_THREADS} threads"
            )
        maps = max(d for d in divisors(problem.Mg) if d == 1 or (d <= 8 and d * RS <= 400))
        chunk = max(d for d in divisors(problem.Cg) if d == 1 or d * maps * RS <= DEFAULT_FMAS)
        # Constant weights only at literal offsets: read at a run-time index (several
        # map groups or channel steps) they were 3-4x slower than global weights on the
        # H200 (2026-11-22, layer2 m8 c4: 28.4 ms; mx-layer2: 37.6 ms against 8.6 ms for
        # tiled with global weights), as in the direct family.
        literal = maps == problem.M and chunk == problem.Cg
        weights = default_weights(problem) if literal else Weights.GLOBAL
        return cls(tile=tiles[0], maps=maps, chunk=chunk, weights=weights, precision=seed.precision)

    @classmethod
    def space(cls, problem, precision):
        RS = problem.R * problem.S
        out = []
        for tile in (32, 16, 8, 4):
            for maps in (d for d in divisors(problem.Mg) if d <= 16):
                for chunk in (d for d in divisors(problem.Cg) if d * maps * RS <= 3200):
                    for weights in Weights:
                        out.append(
                            cls(
                                tile=tile,
                                maps=maps,
                                chunk=chunk,
                                weights=weights,
                                precision=precision,
                            )
                        )
        return out


def _epilogue_note(p: ConvProblem) -> str:
    steps = (["plus the bias"] if p.bias else []) + (
        ["relu"] if p.features().get(Feature.ACT) else []
    )
    if p.dtype is not DType.FP32:
        steps.append(f"rounded to {p.dtype.value}")
    return ": " + ", then ".join(steps) if steps else ""


def _threads(problem: ConvProblem, tile: int) -> int:
    ih, iw = halo(problem, tile)
    return ih * iw
