"""``phased``: dgrad for every problem, one kernel per stride phase.

dx[n][c][h][w] sums dy[n][m][i][j] * w[m][c][p][q] over the taps whose forward read
landed on (h, w): h = i*sh + p*dh - pt.  For a row h, the taps p that can reach it are
those with (h + pt - p*dh) divisible by sh, and that set depends only on the phase
h mod sh.  So the rows (and the columns) of dx fall into sh x sw phases; each phase is
its own kernel whose taps are a fixed list with literal offsets, i = h/sh + (a + pt -
p*dh)/sh for phase a, and no multiply ever meets a zero inserted by the stride.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import SpecError
from ..plan.common import (
    CONST_BYTES,
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
from ..variants import EVERY_FEATURE, Count, Variant, Weights, param
from .direct import WEIGHTS

COLUMNS = 32  # a warp spans 32 columns of a phase: coalesced dy loads and dx stores
MAX_FMAS = 4096  # unrolled multiply-adds per m step, past which the m loop is not unrolled
# With 16-bit dy, each load is widened before its FMAs: the unrolled m loop of the
# mx-layer1 bf16 dgrad view (12 maps x 49 taps = 588 loads) spilled 16 bytes (NVRTC 12),
# and a drawn one of 3 maps x 2 channels x 49 taps (294) 8 bytes (NVRTC 12 and 13).
MAX_FMAS_16 = 256


def _phase_taps(a: int, pad: int, dil: int, stride: int, taps: int) -> list[tuple[int, int]]:
    """(tap, offset) for phase a: the taps that reach rows a, a + stride, ..., and the
    dy row each reads for phase row 0."""
    return [
        (p, (a + pad - p * dil) // stride) for p in range(taps) if (a + pad - p * dil) % stride == 0
    ]


@dataclass(frozen=True, kw_only=True)
class Phased(Variant):
    key = "phased"
    templates = ("backward/dgrad.cu.j2",)
    family = "backward"
    description = "dgrad gathered per stride phase: each phase a kernel over its own taps"
    serves = EVERY_FEATURE
    ops = frozenset({Op.DGRAD})

    tile: int = param(4, Count("t"), "phased: rows of a phase per block (32 columns each)")
    maps: int = param(4, Count("m"), "phased: dx channels per thread, all fed by each dy load")
    weights: Weights = WEIGHTS

    def plan(self, problem):
        return plan_phased(problem, self)

    @classmethod
    def fit(cls, problem, seed):
        """The most channels per thread, up to the seed's, that divide a group's, and
        the weights in constant memory when they fit."""
        maps = max(d for d in divisors(problem.Cg) if d <= seed.maps)
        fits = 4 * problem.weight_count <= CONST_BYTES
        return cls(
            tile=seed.tile,
            maps=maps,
            weights=Weights.CONST if fits else Weights.GLOBAL,
            precision=seed.precision,
        )

    @classmethod
    def space(cls, problem, precision):
        out = []
        for maps in (1, 2, 4, 8):
            for tile in (2, 4, 8):
                for weights in (Weights.CONST, Weights.GLOBAL):
                    out.append(cls(tile=tile, maps=maps, weights=weights, precision=precision))
        return out


def plan_phased(p, v: Phased) -> Plan:
    # 1. limits
    if p.Cg % v.maps:
        raise SpecError(
            f"phased m{v.maps} must divide the {p.Cg} channels of a group; choose one of "
            f"{choices(divisors(p.Cg))}"
        )
    if v.tile * COLUMNS > 1024:
        raise SpecError(f"phased t{v.tile} makes {v.tile * COLUMNS} threads, over 1024")
    const = v.weights is Weights.CONST
    if const and 4 * p.weight_count > CONST_BYTES:
        raise SpecError(
            f"the weights are {4 * p.weight_count} B, over the {CONST_BYTES} B constant bank; "
            "choose --weights global"
        )
    (sh, sw), (dh, dw) = p.stride, p.dil
    pt, _, pl, _ = p.pads

    # 2. the phases: rows a (mod sh) x columns b (mod sw), each with its taps
    phases = []
    for a in range(sh):
        for b in range(sw):
            Hq, Wq = ceil_div(p.H - a, sh), ceil_div(p.W - b, sw)
            if Hq < 1 or Wq < 1:
                continue  # the image is smaller than the stride
            rows = _phase_taps(a, pt, dh, sh, p.R)
            cols = _phase_taps(b, pl, dw, sw, p.S)
            phases.append(
                dict(
                    a=a,
                    b=b,
                    Hq=Hq,
                    Wq=Wq,
                    tiles_x=ceil_div(Wq, COLUMNS),
                    tiles_y=ceil_div(Hq, v.tile),
                    taps=[
                        dict(r=r, s=s, oy=oy, ox=ox, w=r * p.S + s)
                        for r, oy in rows
                        for s, ox in cols
                    ],
                )
            )
    name = v.kernel_name(p)
    for i, ph in enumerate(phases):
        ph["kernel"] = name if i == 0 else f"{name}_p{i}"
    most = max(len(ph["taps"]) for ph in phases)

    # 3. launches: one per phase, images on z
    args = (Role.DY,) + (() if const else (Role.W,)) + (Role.DX,)
    threads = COLUMNS * v.tile
    launches = tuple(
        Launch(
            ph["kernel"],
            args,
            (COLUMNS, v.tile, 1),
            (ph["tiles_x"] * ph["tiles_y"], p.C // v.maps, 0),
            2,
            1,
            1,
        )
        for ph in phases
    )
    ctx = dict(
        shape_context(p),
        phases=phases,
        cm=v.maps,
        cms=p.Cg // v.maps,  # channel blocks per group
        Mg=p.Mg,
        Cg=p.Cg,
        RS=p.R * p.S,
        S=p.S,
        const=const,
        weight_count=p.weight_count,
        threads=threads,
        **launch_bounds(threads, one_per_sm_first=False),
        rows=v.tile,
        unroll_m=most * v.maps * p.Mg <= (MAX_FMAS if p.dtype is DType.FP32 else MAX_FMAS_16),
        dy_image=p.M * p.Ho * p.Wo,
        dx_image=p.C * p.H * p.W,
    )
    sizes = (
        Size(
            "phases",
            f"{len(phases)} of {sh} x {sw}",
            "dx rows h = a (mod sh), columns w = b (mod sw); one kernel each",
        ),
        Size(
            "taps",
            " / ".join(str(len(ph["taps"])) for ph in phases),
            f"of the {p.R}x{p.S} window, per phase: those with (a + pt - p*dh) % sh == 0",
        ),
        Size(
            "thread",
            f"{v.maps} dx channel(s)",
            f"one dx pixel; each dy load feeds {v.maps} FMAs; the {p.Mg} dy maps of its group looped",
        ),
        Size("block", f"{COLUMNS} x {v.tile} = {threads}", "phase columns x phase rows"),
        Size(
            "weights",
            f"{4 * p.weight_count} B {'__constant__' if const else 'global'}",
            "w[M][C/groups][R][S] as fp32, a warp reads one weight at a time",
        ),
    )
    return Plan(
        shape=p,
        variant=v,
        template="backward/dgrad.cu.j2",
        launches=launches,
        static_smem=0,
        dynamic_smem=0,
        const_bytes=4 * p.weight_count if const else 0,
        weight_format="f32",
        sizes=sizes,
        context=ctx,
    )
