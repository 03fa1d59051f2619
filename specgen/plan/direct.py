"""Planning for the direct family: ``direct``, ``tiled`` and ``split``.

One thread computes a block of cx x cy outputs for cm output maps.  For each input row
it loads cx+K-1 pixels into registers once and feeds every (output row, tap, map)
that uses them, so the emitted code is straight-line FMAs with literal offsets: no loop
over the KxK window survives into the source.
"""

from __future__ import annotations

from ..errors import SpecError
from ..shapes import ConvShape
from ..variants import Layout, Precision, Strategy, Variant, Weights
from .common import (
    CONST_BYTES,
    Launch,
    Plan,
    Size,
    bank_conflict_degree,
    ceil_div,
    check_threads,
    choices,
    divisors,
    launch_bounds,
    shape_context,
    smem_placement,
)

UNROLL_CHANNELS_MAX = 32  # past this, an unrolled channel loop is a wall of code
# NVVM's time grows about quadratically with straight-line code: measured with NVRTC
# 12.9 on layer2, 784 FMAs compile in 0.7 s, 3136 in 17 s, 12544 in 361 s.
MAX_UNROLLED_FMAS = 4096


def unrolled_fmas(shape: ConvShape, v: Variant) -> int:
    cx, cy, cm = v.coarsening
    channels = shape.C // v.splits if v.unroll_channels else 1
    return channels * shape.K * shape.K * cx * cy * cm


def largest_tile(shape: ConvShape) -> int:
    """The largest output tile worth a block: the output's longer edge rounded up to
    a power of two (at least 4, the smallest default)."""
    edge = max(shape.Ho, shape.Wo, 4)
    return 1 << (edge - 1).bit_length()


def _check_variant(shape: ConvShape, v: Variant) -> None:
    cx, cy, cm = v.coarsening
    if v.tile < 1:
        raise SpecError(f"tile must be at least 1, got {v.tile}")
    most = largest_tile(shape)
    if v.tile > most:
        raise SpecError(
            f"tile {v.tile} is larger than the {shape.Ho}x{shape.Wo} output needs; "
            f"choose at most {most}"
        )
    for what, c in (("x", cx), ("y", cy)):
        if c < 1 or v.tile % c:
            raise SpecError(
                f"coarsening {what}{c} must divide the tile {v.tile}; "
                f"choose one of {choices(divisors(v.tile))}"
            )
    if cm < 1 or shape.M % cm:
        raise SpecError(
            f"coarsening m{cm} must divide M={shape.M}; choose one of {choices(divisors(shape.M))}"
        )
    if v.precision is Precision.TF32:
        raise SpecError(
            f"{v.strategy.value} computes with CUDA cores: precision fp32 or fp16, not "
            "tf32 (tf32 is a tensor-core format; use --strategy mma)"
        )
    if v.precision is Precision.FP16 and cx % 2:
        raise SpecError(
            f"fp16 packs two neighbouring outputs in one half2, so coarsening x must be "
            f"even, got x{cx}"
        )
    if v.strategy is Strategy.SPLIT:
        if shape.C < 2:
            raise SpecError(f"split needs at least 2 input channels to split, C={shape.C}")
        if v.splits < 2 or shape.C % v.splits:
            raise SpecError(
                f"split s{v.splits} must divide C={shape.C} into 2 or more groups; "
                f"choose one of {choices(divisors(shape.C)[1:])}"
            )
    if v.unroll_channels and shape.C // v.splits > UNROLL_CHANNELS_MAX:
        raise SpecError(
            f"unrolling {shape.C // v.splits} channels would repeat the window that "
            f"many times; the limit is {UNROLL_CHANNELS_MAX}: use --loop-channels"
        )


def _smem_layout(shape, v, cg, ih, iw, bw):
    """Row (planar) or pixel (interleaved) stride, padded against bank conflicts.

    The pad is the smallest that gives the fewest conflicts for the first warp's
    first load of the compute phase, found by trying each pad from 0 to 31.
    """
    cx, cy, _ = v.coarsening
    lanes = [(t % bw, t // bw) for t in range(32)]
    best = None
    for pad in range(32):
        if v.layout is Layout.PLANAR:
            stride = iw + pad
            addrs = [ty * cy * stride + tx * cx for tx, ty in lanes]
        else:
            stride = cg + pad
            addrs = [(ty * cy * iw + tx * cx) * stride for tx, ty in lanes]
        degree = bank_conflict_degree(addrs)
        if best is None or degree < best[1]:
            best = (pad, degree)
    pad, degree = best
    if v.layout is Layout.PLANAR:
        row, pix, plane = iw + pad, 1, ih * (iw + pad)
        total = cg * plane
    else:
        row, pix, plane = iw * (cg + pad), cg + pad, 1
        total = ih * row
    return dict(pad=pad, degree=degree, row=row, pix=pix, plane=plane, floats=total)


def _fits_tile(shape, v, limit_bytes):
    """The largest tile from the usual choices whose halo tile fits in limit_bytes."""
    cg = shape.C // v.splits
    for t in (32, 16, 8, 4, 2, 1):
        if t % v.coarsening[0] == 0 and t % v.coarsening[1] == 0:
            if 4 * cg * (t + shape.K - 1) ** 2 <= limit_bytes:
                return t
    return None


def _body(shape, v, channels, offsets):
    """The unrolled compute: per (channel, input row), the loads and the FMAs.

    ``offsets(c, ir, j)`` gives the literal element offset of input pixel j of row ir
    of channel c from the thread's base pointer.
    """
    K, KK = shape.K, shape.K * shape.K
    C = shape.C
    cx, cy, cm = v.coarsening
    fp16 = v.precision is Precision.FP16
    blocks = []
    for c in channels:
        for ir in range(cy + K - 1):
            loads = [(j, offsets(c, ir, j)) for j in range(cx + K - 1)]
            uses = []
            for oy in range(max(0, ir - K + 1), min(cy - 1, ir) + 1):
                p = ir - oy
                for m in range(cm):
                    wrow = (m * C + c) * KK + p * K
                    if fp16:
                        for ox in range(0, cx, 2):
                            uses.append(
                                dict(m=m, oy=oy, ox=ox, taps=[(ox + q, wrow + q) for q in range(K)])
                            )
                    else:
                        for q in range(K):
                            for ox in range(cx):
                                uses.append(dict(m=m, oy=oy, ox=ox, j=ox + q, w=wrow + q))
            rows = [oy for oy in range(cy) if 0 <= ir - oy < K]
            blocks.append(dict(c=c, ir=ir, loads=loads, uses=uses, rows=rows))
    return blocks


def plan_direct(shape: ConvShape, v: Variant) -> Plan:
    _check_variant(shape, v)
    fmas = unrolled_fmas(shape, v)
    if fmas > MAX_UNROLLED_FMAS:
        raise SpecError(
            f"{v.name} unrolls {fmas} FMAs into one kernel, over specgen's limit of "
            f"{MAX_UNROLLED_FMAS} (NVRTC's time grows with the square of that); "
            "use --loop-channels or less coarsening"
        )
    C, M, H, W, K, pad = shape.C, shape.M, shape.H, shape.W, shape.K, shape.pad
    Ho, Wo, KK = shape.Ho, shape.Wo, K * K
    cx, cy, cm = v.coarsening
    tile = v.tile
    bw, bh = tile // cx, tile // cy
    block = (bw, bh, 1)
    check_threads(block, f"choose a smaller tile or more coarsening than x{cx}y{cy}")
    tiles_x, tiles_y = ceil_div(Wo, tile), ceil_div(Ho, tile)
    map_groups = M // cm
    splits = v.splits if v.strategy is Strategy.SPLIT else 1
    cg = C // splits
    ih, iw = tile + K - 1, tile + K - 1
    fp16 = v.precision is Precision.FP16

    const = v.weights is Weights.CONST
    const_bytes = 4 * M * C * KK if const else 0
    if const_bytes > CONST_BYTES:
        raise SpecError(
            f"constant weights need {const_bytes} bytes (M*C*K*K = {M}*{C}*{KK} floats), "
            f"over the {CONST_BYTES}-byte constant bank; use --weights global"
        )

    # Outputs past the image edge exist only when the tiles overhang it; halo reads
    # leave the image only then or with padding.  Neither check is emitted otherwise.
    overhang = Wo % tile != 0 or Ho % tile != 0
    guard_loads = pad > 0 or overhang
    sizes = [
        Size("output", f"{M} x {Ho} x {Wo}", f"Ho = H + 2*pad - K + 1 = {H}+{2*pad}-{K}+1"),
        Size("reduction", f"{C * KK}", f"C*K*K = {C}*{KK} multiply-adds per output"),
        Size(
            "block",
            f"{bw} x {bh} = {bw * bh} threads",
            f"tile {tile} / coarsening x{cx} y{cy}",
        ),
        Size(
            "grid",
            f"{tiles_x * tiles_y} x {map_groups} x B*{splits}",
            f"ceil({Wo}/{tile})*ceil({Ho}/{tile}) tiles, M/cm = {M}/{cm} map groups, "
            f"{splits} channel group(s) per image",
        ),
        Size(
            "registers",
            f"{cm * cy * cx} accumulators + {cx + K - 1} pixels",
            f"cm*cy*cx = {cm}*{cy}*{cx}; cx+K-1 = {cx}+{K}-1",
        ),
    ]
    if const:
        sizes.append(Size("__constant__", f"{const_bytes} B", f"M*C*K*K = {M * C * KK} floats"))

    ctx = dict(
        shape_context(shape),
        tile=tile,
        cx=cx,
        cy=cy,
        cm=cm,
        bw=bw,
        bh=bh,
        threads=bw * bh,
        # Tried first: one block per SM for blocks under a warp (else ptxas capped one
        # at 128 registers and spilled, C=8 M=1 K=5, 4 threads), the plain bound
        # otherwise (layer1's 32-thread winner: 128 registers, 162 with the explicit
        # one).  The other is the fallback: 64-thread blocks spilled under the plain
        # bound (C=1 M=7 K=3 fp16) and under one per SM (mx-layer2 m8) alike.
        **launch_bounds(bw * bh, one_per_sm_first=bw * bh < 32),
        tiles_x=tiles_x,
        tiles_y=tiles_y,
        map_groups=map_groups,
        splits=splits,
        cg=cg,
        ih=ih,
        iw=iw,
        const=const,
        weight_count=M * C * KK,
        fp16=fp16,
        guard_loads=guard_loads,
        guard_stores=overhang,
        unroll=v.unroll_channels,
        smem=None,
        atomic=v.strategy is Strategy.SPLIT,
        wstride_group=cm * C * KK,
        npix=cx + K - 1,
        nh2=cx + K - 2,
        half_math=True,
        out_plane=Ho * Wo,
        halo_plane=ih * iw,
        group_in=cg * H * W,
        group_w=cg * KK,
        group_out=cm * Ho * Wo,
        stores=[
            dict(m=m, oy=oy, ox=ox, off=m * Ho * Wo + oy * Wo + ox)
            for m in range(cm)
            for oy in range(cy)
            for ox in range(cx)
        ],
    )

    static_smem = dynamic_smem = 0
    if v.strategy is Strategy.DIRECT:

        def offsets(c, ir, j):
            return c * H * W + ir * W + j

    else:
        lay = _smem_layout(shape, v, cg, ih, iw, bw)
        nbytes = 4 * lay["floats"]
        fit = _fits_tile(shape, v, 232448)
        hint = f"choose --tile {fit}" if fit else "use --strategy direct or implicit"
        static_smem, dynamic_smem = smem_placement(
            nbytes, f"the {v.layout.value} halo tile of {cg} channels", hint
        )
        planar = v.layout is Layout.PLANAR
        ctx["smem"] = dict(
            lay,
            planar=planar,
            total=cg * ih * iw,
            dynamic=dynamic_smem > 0,
            row_step=cy * lay["row"],
            col_step=cx * lay["pix"],
        )
        shape_txt = (
            f"[{cg}][{ih}][{iw}+{lay['pad']}]" if planar else f"[{ih}][{iw}][{cg}+{lay['pad']}]"
        )
        sizes.append(
            Size(
                "__shared__",
                f"{nbytes} B = {lay['floats']} floats {shape_txt}",
                f"halo tile (tile+K-1)^2 = {ih}^2 pixels x {cg} channels, "
                f"pad {lay['pad']} -> {lay['degree']}-way bank conflicts at worst",
            )
        )

        def offsets(c, ir, j):
            return c * lay["plane"] + ir * lay["row"] + j * lay["pix"]

    channels = range(cg) if v.unroll_channels else [0]
    ctx["body"] = _body(shape, v, channels, offsets)

    launches = []
    symbol = v.name
    if ctx["atomic"]:
        zero_block = 256
        launches.append(
            Launch(
                f"{symbol}_zero",
                ("y", "batch"),
                (zero_block, 1, 1),
                (0, 1, 1),
                0,
                M * Ho * Wo,
                zero_block * 4,
            )
        )
        ctx["zero_per_thread"] = 4
        ctx["zero_block"] = zero_block
    args = ("x", "y") if const else ("x", "w", "y")
    launches.append(
        Launch(symbol, args, block, (tiles_x * tiles_y, map_groups, 0), 2, splits, 1, dynamic_smem)
    )
    return Plan(
        shape=shape,
        variant=v,
        template="direct/conv.cu.j2",
        launches=tuple(launches),
        static_smem=static_smem,
        dynamic_smem=dynamic_smem,
        const_bytes=const_bytes,
        weight_format="h2dup" if fp16 else "f32",
        sizes=tuple(sizes),
        context=ctx,
    )
