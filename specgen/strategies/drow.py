"""``drow``: fp32 dgrad of narrow layers at stride 1, a lane a dx row, every multiply useful.

The forward view of dgrad (dy padded by the window minus one, the weights flipped)
multiplies zeros wherever the window hangs past dy: 13% to 33% of the multiply-adds on
the 7x7 layers, whose dx is 6 rows and columns wider than dy.  Through ``stream`` and
``persist`` their fp32 dgrad ran 1.6 to 1.8 times over its targets (H200, B=10000).

Here the walk goes over dy's rows, and dx's rows come out of it in rotation.  A block
owns ``images`` images; each (image, dx channel) is a column of R lanes, and lane l of
a column keeps, in registers, one whole dx row: the row u with (u + pt) % R == l that
dy row i reaches through window row r = (l - i) mod R.  At dy row i every lane adds,
for each map m of the stage, dy[m][i][j] * w[m][c][r][s] into its row's column
j + s - pl, the R x S taps unrolled with literal offsets and none emitted past the
row's ends; the lane whose r is 0 then holds a finished row, stores it and starts on
the row R further down.  A dy row is read once for every lane of its image (one
16-byte shared load feeds 4 x S FMAs), a lane's weights are S consecutive floats (two
16-byte loads a map), and dx is written once.  No multiply meets a zero: a dx row gets
exactly the dy rows its window reaches, and a column exactly the dy columns.

Lanes are laid out with the columns fastest (``t = l * columns + column``), so where a
block's columns fill whole warps all lanes of a warp share l, store in the same step,
and branch together.  dy arrives a stage at a time (``maps`` maps of one row of every
image of the block) by 16-, 8- or 4-byte cp.async into a ring of ``stages`` buffers,
one barrier a stage; the weights sit in shared memory for the whole launch, and the
blocks are persistent over the batch's groups of images.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from ..errors import SpecError
from ..plan.common import (
    REGISTER_FILE,
    MAX_REGISTERS,
    OPTIN_SMEM_BYTES,
    Launch,
    Plan,
    Size,
    ceil_div,
    choices,
    divisors,
    quad_stride,
    smem_placement,
)
from ..shapes import Feature, Op
from ..tensors import Role
from ..variants import Count, Switch, Variant, param

MAX_THREADS = 1024
MAX_ROW = 128  # dx columns a lane keeps (its accumulators); past this ptxas spills
LANE_REGISTERS = 32  # at least what a lane needs beside its row (taps, addresses, the ring)
MAX_STAGE_FMAS = 2304  # a lane's unrolled FMAs a stage (maps x S x Wo) where its row is short
TWO_BLOCKS_SMEM = 113 * 1024  # the fit's ring and weights: two blocks an SM


def _layout(p, v) -> dict:
    """Shared memory in floats: the weights [C][M][R][Sp] (a channel's block padded to an
    odd number of 16-byte units), then the ring: stages x [maps][images][pitch]."""
    sp = ceil_div(p.S, 4) * 4
    c_stride = quad_stride(p.M * p.R * sp, 4) if p.C > 1 else p.M * p.R * sp
    pitch = quad_stride(p.Wo, 4)  # 8 images' rows in 8 bank quads
    stage = v.maps * v.images * pitch
    ring_at = ceil_div(p.C * c_stride, 4) * 4
    words = ring_at + v.stages * stage
    return dict(
        sp=sp,
        c_stride=c_stride,
        pitch=pitch,
        stage=stage,
        ring_at=ring_at,
        words=words,
        nbytes=4 * words,
    )


def _copies(p, v, threads: int) -> dict:
    """A stage's rows (maps x images) cut into copies of ``g`` floats (``g`` divides Wo:
    no copy leaves its row), dealt to the threads in rounds."""
    g = next(n for n in (4, 2, 1) if p.Wo % n == 0)
    copies = v.maps * v.images * (p.Wo // g)
    rounds = ceil_div(copies, threads)
    return dict(
        g=g,
        copy_bytes=4 * g,
        chunks_per_row=p.Wo // g,
        copy_rows=v.maps * v.images,
        copy_rounds=rounds,
        copy_tail=copies % threads != 0,
        tail_threads=copies - threads * (rounds - 1),
    )


@dataclass(frozen=True, kw_only=True)
class Drow(Variant):
    key = "drow"
    templates = ("backward/drow.cu.j2",)
    family = "backward"
    description = (
        "fp32 dgrad walking dy's rows: a lane keeps one dx row in registers, the window's "
        "rows in rotation, no multiply past the edges"
    )
    serves = frozenset(
        {Feature.RECT, Feature.UNEQUAL_PAD, Feature.WIDE_PAD, Feature.BIAS, Feature.ACT}
    )
    ops = frozenset({Op.DGRAD})

    images: int = param(9, Count("n"), "drow: images a block (a column of R lanes each dx channel)")
    maps: int = param(2, Count("m"), "drow: dy maps a stage (one row of each, every image)")
    stages: int = param(3, Count("q"), "drow: staged buffers in the ring (cp.async depth + 1)")
    parts: int = param(1, Count("x"), "drow: pieces a dx row is cut into, a lane (and a warp) each")
    blocks: int = param(1, Count("b"), "drow: blocks an SM the registers are capped for")
    gather: bool = param(
        True,
        Switch("gc", "gl", ("gather-columns", "gather-lanes")),
        "drow: a warp's lanes are the R lanes of a few columns (their dy loads broadcast, "
        "their stores diverge), or one lane of 32 columns",
    )

    def plan(self, problem):
        return plan_drow(problem, self)

    @classmethod
    def fit(cls, problem, seed):
        """The fewest images whose columns' R x images x C lanes fill 95% of their warps (9
        images of 7 x 1 lanes: 63 of 64), a row in one part up to MAX_ROW columns, and the
        most maps a stage within ``_stage_fmas``, three stages, the columns' lanes side by
        side.  fp32 dgrad at B=10000 (H200, 2026-11-24): layer1 0.744 ms with 9 images
        and 2 maps (4 maps: 0.983, 248 registers), layer2 1.577 (9 x 8; 16 maps 1.676),
        mx-layer1 1.413 (9 x 2 or 3; 4 maps 1.506), mx-layer2 4.836 (3 x 12; 6 images
        4.797; 24 maps 5.333).  After the copies' byte offsets: layer1 0.733, layer2
        1.547, mx-layer1 1.305 with 3 maps (2 maps 1.377), mx-layer2 4.849 (6 images
        4.788)."""
        p = problem
        lanes = p.R * p.C
        if lanes > MAX_THREADS:
            raise SpecError(
                f"drow: a block's one image is {p.R} x {p.C} = {lanes} lanes (R x C), over "
                f"{MAX_THREADS} threads; use --strategy phased or stream"
            )
        fill = {
            n: lanes * n / (ceil_div(lanes * n, 32) * 32)
            for n in range(1, MAX_THREADS // lanes + 1)
        }
        images = min((n for n, f in fill.items() if f >= 0.95), default=max(fill, key=fill.get))
        v = replace(seed, images=images, parts=ceil_div(p.W, MAX_ROW), stages=3, gather=True)
        while v.images > 1 and _lane_registers(p, v)[0] > _lane_registers(p, v)[1]:
            v = replace(v, images=v.images - 1)  # wide rows: fewer lanes, more registers
        budget = _stage_fmas(p)
        mb = max(d for d in divisors(p.M) if d == 1 or d * p.S * p.Wo <= budget)
        while mb > 1 and _layout(p, replace(v, maps=mb))["nbytes"] > TWO_BLOCKS_SMEM:
            mb = max(d for d in divisors(p.M) if d < mb)
        return replace(v, maps=mb)

    @classmethod
    def space(cls, problem, precision):
        """Around the fit: its images, twice and half of them; maps a stage from the
        divisors of M up to twice the fit's FMA budget; two or three stages; either lane
        order; registers for one block an SM or two."""
        p = problem
        base = cls.default(problem, precision)
        out = []
        for images in sorted({base.images, 2 * base.images, max(1, base.images // 2)}):
            for mb in divisors(p.M):
                if mb > 1 and mb * p.S * p.Wo > 2 * _stage_fmas(p):
                    continue
                for stages, gather, blocks in itertools.product((2, 3), (True, False), (1, 2)):
                    out.append(
                        replace(
                            base,
                            images=images,
                            maps=mb,
                            stages=stages,
                            gather=gather,
                            blocks=blocks,
                        )
                    )
        return out


def _stage_fmas(p) -> int:
    """A lane's unrolled FMAs a stage: where its row holds more than 64 accumulators,
    ptxas runs out of registers sooner (layer1's 86 columns took 248 registers at 2240
    FMAs a stage, and 152 at 1120)."""
    return MAX_STAGE_FMAS if p.W <= 64 else MAX_STAGE_FMAS * 5 // 8


def _part(p, x0: int, x1: int) -> dict:
    """dx columns [x0, x1): the 16-byte dy loads that reach them and, for each dy column
    of those, (tap, column in the part) for every tap that lands in it."""
    pl = p.pads[2]
    lo = max(0, x0 + pl - (p.S - 1))  # the dy columns whose taps reach the part
    hi = min(p.Wo, x1 + pl)
    chunks = []
    for q in range(lo // 4, ceil_div(hi, 4)):
        cols = []
        for jj in range(4):
            j = 4 * q + jj
            taps = [(s, j + s - pl - x0) for s in range(p.S) if x0 <= j + s - pl < x1]
            if lo <= j < hi and taps:
                cols.append((jj, taps))
        chunks.append(dict(q=q, at=4 * q, cols=cols))  # at: the chunk's first dy column
    return dict(x0=x0, x1=x1, n=x1 - x0, chunks=chunks)


def _block(p, v) -> tuple[int, int, int]:
    """(threads, dx columns a lane keeps, columns a store): R x images x C lanes a part,
    each part starting on a warp."""
    threads = v.parts * ceil_div(p.R * v.images * p.C, 32) * 32
    out_vec = next(n for n in (4, 2, 1) if p.W % n == 0)
    return threads, ceil_div(ceil_div(p.W, v.parts), out_vec) * out_vec, out_vec


def _lane_registers(p, v) -> tuple[int, int]:
    """(registers a lane needs, registers the block leaves it)."""
    threads, width, _ = _block(p, v)
    return width + LANE_REGISTERS, min(MAX_REGISTERS, REGISTER_FILE // threads // 8 * 8)


def plan_drow(p, v: Drow) -> Plan:
    # 1. limits
    if p.M % v.maps:
        raise SpecError(
            f"drow m{v.maps} must divide the {p.M} maps; choose one of {choices(divisors(p.M))}"
        )
    if v.stages < 2:
        raise SpecError(f"drow q{v.stages}: the ring needs at least 2 stages; choose --stages 2")
    columns = v.images * p.C
    threads, width, out_vec = _block(p, v)
    if v.parts < 1 or (v.parts - 1) * width >= p.W:
        raise SpecError(
            f"drow x{v.parts}: a row of W={p.W} cuts into at most "
            f"{ceil_div(p.W, out_vec)} pieces of {out_vec}; choose --parts 1 or 2"
        )
    if width > MAX_ROW:
        raise SpecError(
            f"drow keeps {width} of dx's W={p.W} columns in a lane's registers, over "
            f"{MAX_ROW}; choose --parts {ceil_div(p.W, MAX_ROW)} or use --strategy phased"
        )
    if threads > MAX_THREADS:
        most = MAX_THREADS // v.parts // 32 * 32 // (p.R * p.C)  # a part's lanes, whole warps
        raise SpecError(
            f"drow n{v.images} makes {p.R} x {columns} = {p.R * columns} lanes (R x images x C)"
            + (f" in each of {v.parts} parts, {threads} threads" if v.parts > 1 else "")
            + f", over {MAX_THREADS} threads; "
            + (f"choose --images {most}" if most else "use --strategy phased")
        )
    span = 4 * v.images * p.M * p.Ho * p.Wo  # a stage's copies' byte offsets reach into dy
    if span > 2**32:
        raise SpecError(
            f"drow n{v.images} copies from {span} bytes of dy ({v.images} images), over the "
            f"2^32 its 32-bit offsets reach; choose --images {max(1, 2**32 // (span // v.images))}"
        )
    fmas = v.maps * p.S * p.Wo
    lay = _layout(p, v)
    if 4 * lay["ring_at"] > OPTIN_SMEM_BYTES:
        raise SpecError(
            f"drow keeps all {p.C} x {p.M} x {p.R} x {p.S} weights in shared memory, "
            f"{4 * lay['ring_at']} bytes, over the sm_90 limit of {OPTIN_SMEM_BYTES} bytes per "
            "block; use --strategy stream or phased"
        )
    static, dynamic = smem_placement(
        lay["nbytes"],
        f"drow's weights and {v.stages} stages of {v.maps} map(s) x {v.images} image(s)",
        "choose fewer --maps, --images or --stages",
    )
    # A lane keeps its row piece in registers, and the block's threads share the SM's
    # register file: past what it leaves a lane beyond LANE_REGISTERS, ptxas spills
    # (a 1024-wide image in 8 parts of 512 threads, 128 columns at 128 registers, spilled
    # 2400 bytes; 128 columns at 144 registers 960; ae-dec3's 32 at 80 none).
    need, cap = _lane_registers(p, v)
    if need > cap:
        raise SpecError(
            f"drow keeps {width} dx columns a lane, and a block of {threads} threads leaves "
            f"a lane {cap} registers, {LANE_REGISTERS} of them for its taps and addresses; "
            "choose fewer --images or use --strategy phased"
        )
    warps = threads // 32

    # 2. the walk: blocks stride over the batch's groups of images
    name = v.kernel_name(p)
    launch = Launch(
        name,
        (Role.DY, Role.W, Role.DX, Role.BATCH),
        (threads, 1, 1),
        (0, 1, 1),
        0,
        1,
        v.images,
        dynamic,
        persistent=True,
    )
    uniform = columns % 32 == 0
    pt, _, pl, _ = p.pads
    ctx = dict(
        lay,
        **_copies(p, v, threads),
        launch_bounds=f"{threads}, {v.blocks}",
        launch_bounds_alt=f"{threads}, 1" if v.blocks > 1 else f"{threads}",
        name=name,
        C=p.C,
        M=p.M,
        H=p.H,
        W=p.W,
        R=p.R,
        S=p.S,
        Ho=p.Ho,
        Wo=p.Wo,
        pt=pt,
        pl=pl,
        HoWo=p.Ho * p.Wo,
        HW=p.H * p.W,
        dy_image=p.M * p.Ho * p.Wo,
        dx_image=p.C * p.H * p.W,
        images=v.images,
        mb=v.maps,
        units=p.M // v.maps,
        stages=v.stages,
        columns=columns,
        lanes=p.R * columns,
        threads=threads,
        warps=warps,
        uniform=uniform,
        gather=v.gather,
        # rows a lane may hold that are not dx's: only where padding moves them past it
        rows_checked=pt > 0 or p.Ho + p.R - 1 - pt > p.H,
        # each dy column j and tap s: the dx column it adds to, where that is in the row
        parts=[_part(p, x0, min(x0 + width, p.W)) for x0 in range(0, p.W, width)],
        width=width,
        part_threads=threads // v.parts,
        out_vec=out_vec,
        dynamic=dynamic > 0,
        smem_words=lay["words"],
        # the weights' words: all, a dx channel's, a map's (its R rows of sp)
        weight_words=p.C * p.M * p.R * lay["sp"],
        channel_words=p.M * p.R * lay["sp"],
        map_words=p.R * lay["sp"],
        unit_rows=v.maps * p.R,  # the weight rows of a stage's maps
        stage_bytes=4 * lay["stage"],
        map_rows_words=v.images * lay["pitch"],  # a stage's rows of one map
    )
    ctx["last_copy"] = ctx["copy_rows"] * ctx["chunks_per_row"] - 1
    useful = p.Ho * p.Wo * p.R * p.S
    sizes = (
        Size(
            "lane",
            f"one dx row, {p.W} floats" if v.parts == 1 else f"{width} of a dx row's {p.W} floats",
            f"the row u with (u + {pt}) % {p.R} == l; dy row i reaches it through window row "
            f"(l - i) mod {p.R}",
        ),
        Size(
            "column",
            f"{p.R} lanes",
            f"one (image, dx channel): {p.R} rows in flight, one finished a dy row",
        ),
        Size(
            "block",
            f"{threads} threads",
            f"{p.R} x {columns} column lanes ({v.images} image(s) x {p.C} channel(s))"
            + (
                f", a column's lanes side by side (a warp: ~{ceil_div(32, p.R)} columns)"
                if v.gather
                else ", the columns side by side"
                + ("" if uniform else " (a warp's lanes in two rotations)")
            )
            + f"; {100 * p.R * columns / threads:.0f}% of the lanes busy",
        ),
        Size(
            "stage",
            f"{v.maps} map(s) of a dy row",
            f"{fmas} FMAs a lane unrolled, {ceil_div(p.Wo, 4)} 16-byte dy loads and "
            f"{lay['sp'] // 4} weight loads a map",
        ),
        Size(
            "multiplies",
            f"{useful} a (map, channel)",
            f"Ho x Wo x R x S, every one useful (the forward view: " f"{p.H * p.W * p.R * p.S})",
        ),
        Size(
            "__shared__",
            f"{lay['nbytes']} B",
            f"weights [{p.C}][{p.M}][{p.R}][{lay['sp']}] and {v.stages} stages of "
            f"[{v.maps}][{v.images}][{lay['pitch']}]",
        ),
    )
    return Plan(
        shape=p,
        variant=v,
        template="backward/drow.cu.j2",
        launches=(launch,),
        static_smem=static,
        dynamic_smem=dynamic,
        const_bytes=0,
        weight_format="f32",
        sizes=sizes,
        context=ctx,
    )
