"""Planning for the direct family: ``direct``, ``tiled`` and ``split``.

One thread computes a block of cx x cy outputs for cm output maps.  For each input row
it loads cx+K-1 pixels into registers once and feeds every (output row, tap, map)
that uses them, so the emitted code is straight-line FMAs with literal offsets: no loop
over the KxK window survives into the source.
"""

from __future__ import annotations

from ..errors import SpecError
from ..shapes import ConvProblem, DType, TensorLayout
from ..tensors import Role
from ..variants import Layout, Precision, Variant, Weights
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
    y_args,
)

UNROLL_CHANNELS_MAX = 32  # past this, an unrolled channel loop is a wall of code
# NVVM's time grows about quadratically with straight-line code: measured with NVRTC
# 12.9 on layer2, 784 FMAs compile in 0.7 s, 3136 in 17 s, 12544 in 361 s.
MAX_UNROLLED_FMAS = 4096


def unrolled_fmas(shape: ConvProblem, v: Variant) -> int:
    cx, cy, cm = v.coarsening
    channels = shape.Cg // v.channel_splits if v.unroll else 1
    return channels * shape.R * shape.S * cx * cy * cm


def largest_tile(shape: ConvProblem) -> int:
    """The largest output tile worth a block: the output's longer edge rounded up to
    a power of two (at least 4, the smallest default)."""
    edge = max(shape.Ho, shape.Wo, 4)
    return 1 << (edge - 1).bit_length()


def _check_variant(shape: ConvProblem, v: Variant) -> None:
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
    if cm < 1 or shape.Mg % cm:
        maps = f"M={shape.M}" if shape.groups == 1 else f"the {shape.Mg} maps of a group"
        raise SpecError(
            f"coarsening m{cm} must divide {maps}; choose one of {choices(divisors(shape.Mg))}"
        )
    if v.precision is Precision.FP16 and cx % 2:
        raise SpecError(
            f"fp16 packs two neighbouring outputs in one half2, so coarsening x must be "
            f"even, got x{cx}"
        )
    if v.precision is Precision.FP16 and (
        (shape.stride[1], shape.dil[1]) != (1, 1) or shape.dtype is DType.BF16
    ):
        raise SpecError(
            "fp16 half2 arithmetic pairs the neighbouring pixels of neighbouring outputs: "
            "it needs stride 1 and dilation 1 along W and no bf16 tensors; use --precision fp32"
        )
    if v.unroll and shape.Cg // v.channel_splits > UNROLL_CHANNELS_MAX:
        raise SpecError(
            f"unrolling {shape.Cg // v.channel_splits} channels would repeat the window that "
            f"many times; the limit is {UNROLL_CHANNELS_MAX}: use --loop-channels"
        )


def _smem_layout(shape, v, cg, ih, iw, bw):
    """Row (planar) or pixel (interleaved) stride, padded against bank conflicts.

    The pad is the smallest that gives the fewest conflicts for the first warp's
    first load of the compute phase, found by trying each pad from 0 to 31.
    """
    cx, cy, _ = v.coarsening
    sh, sw = shape.stride
    lanes = [(t % bw, t // bw) for t in range(32)]
    best = None
    for pad in range(32):
        if v.staging is Layout.PLANAR:
            stride = iw + pad
            addrs = [ty * cy * sh * stride + tx * cx * sw for tx, ty in lanes]
        else:
            stride = cg + pad
            addrs = [(ty * cy * sh * iw + tx * cx * sw) * stride for tx, ty in lanes]
        degree = bank_conflict_degree(addrs)
        if best is None or degree < best[1]:
            best = (pad, degree)
    pad, degree = best
    if v.staging is Layout.PLANAR:
        row, pix, plane = iw + pad, 1, ih * (iw + pad)
        total = cg * plane
    else:
        row, pix, plane = iw * (cg + pad), cg + pad, 1
        total = ih * row
    return dict(pad=pad, degree=degree, row=row, pix=pix, plane=plane, floats=total)


def halo(shape: ConvProblem, tile: int) -> tuple[int, int]:
    """Input rows and columns that a tile x tile block of outputs reads: (tile-1)*s +
    (R-1)*d + 1, which is tile+K-1 at stride and dilation 1."""
    (sh, sw), (dh, dw) = shape.stride, shape.dil
    return (tile - 1) * sh + (shape.R - 1) * dh + 1, (tile - 1) * sw + (shape.S - 1) * dw + 1


def _fits_tile(shape, v, limit_bytes):
    """The largest tile from the usual choices whose halo tile fits in limit_bytes."""
    cg = shape.Cg // v.channel_splits
    for t in (32, 16, 8, 4, 2, 1):
        if t % v.coarsening[0] == 0 and t % v.coarsening[1] == 0:
            ih, iw = halo(shape, t)
            if 4 * cg * ih * iw <= limit_bytes:
                return t
    return None


def footprint(shape: ConvProblem, coarsening) -> tuple[list[int], list[int]]:
    """The input rows and columns, from a thread's corner, that its cy x cx outputs
    read: oy*sh + p*dh and ox*sw + q*dw."""
    cx, cy, _ = coarsening
    (sh, sw), (dh, dw) = shape.stride, shape.dil
    rows = sorted({oy * sh + p * dh for oy in range(cy) for p in range(shape.R)})
    cols = sorted({ox * sw + q * dw for ox in range(cx) for q in range(shape.S)})
    return rows, cols


def _body(shape, v, channels, offsets):
    """The unrolled compute: per (channel, input row), the loads and the FMAs.

    A thread's outputs (cy rows x cx columns) read input rows oy*sh + p*dh and columns
    ox*sw + q*dw from its corner; each distinct one is loaded once.  ``offsets(c, r,
    col)`` gives the literal element offset of that pixel from the thread's base
    pointer.  At stride and dilation 1 these are rows 0..cy+R-2 and columns 0..cx+S-2.
    Returns the blocks and the loaded columns.
    """
    R, S, RS, Cg = shape.R, shape.S, shape.R * shape.S, shape.Cg
    (sh, sw), (dh, dw) = shape.stride, shape.dil
    cx, cy, cm = v.coarsening
    fp16 = v.precision is Precision.FP16
    rows_in, cols = footprint(shape, v.coarsening)
    j_of = {col: j for j, col in enumerate(cols)}
    blocks = []
    for c in channels:
        for ir in rows_in:
            loads = [(j, offsets(c, ir, col)) for j, col in enumerate(cols)]
            taps = [(oy, (ir - oy * sh) // dh) for oy in range(cy)]
            taps = [(oy, p) for oy, p in taps if 0 <= p < R and oy * sh + p * dh == ir]
            uses = []
            for oy, p in taps:
                for m in range(cm):
                    wrow = (m * Cg + c) * RS + p * S
                    if fp16:
                        for ox in range(0, cx, 2):
                            uses.append(
                                dict(m=m, oy=oy, ox=ox, taps=[(ox + q, wrow + q) for q in range(S)])
                            )
                    else:
                        for q in range(S):
                            for ox in range(cx):
                                j = j_of[ox * sw + q * dw]
                                uses.append(dict(m=m, oy=oy, ox=ox, j=j, w=wrow + q))
            blocks.append(dict(c=c, ir=ir, loads=loads, uses=uses, taps=taps))
    return blocks, cols


def problem_sizes(shape: ConvProblem) -> list[Size]:
    """The banner's output and reduction rows, in the simplest terms the problem allows."""
    M, Ho, Wo = shape.M, shape.Ho, shape.Wo
    if not shape.unusual():
        H, K, pad, C, KK = shape.H, shape.K, shape.pad, shape.C, shape.K * shape.K
        return [
            Size("output", f"{M} x {Ho} x {Wo}", f"Ho = H + 2*pad - K + 1 = {H}+{2*pad}-{K}+1"),
            Size("reduction", f"{C * KK}", f"C*K*K = {C}*{KK} multiply-adds per output"),
        ]
    (pt, pb, _, _), sh, dh = shape.pads, shape.stride[0], shape.dil[0]
    return [
        Size(
            "output",
            f"{M} x {Ho} x {Wo}",
            f"Ho = (H + pt + pb - dh*(R-1) - 1)/sh + 1 = ({shape.H}+{pt}+{pb}-{dh}*{shape.R - 1}-1)/{sh}+1",
        ),
        Size(
            "reduction",
            f"{shape.reduction}",
            f"C/groups*R*S = {shape.Cg}*{shape.R}*{shape.S} multiply-adds per output",
        ),
    ]


def _epilogue_context(shape: ConvProblem, v: Variant, cm: int) -> dict:
    """Tensor types, the output's addressing and what happens to each sum on its way
    out: bias, activation, rounding to the output dtype."""
    Ho, Wo, M = shape.Ho, shape.Wo, shape.M
    nhwc = shape.layout is TensorLayout.NHWC
    cx, cy, _ = v.coarsening

    def out_offset(m, oy, ox):
        return (oy * Wo + ox) * M + m if nhwc else m * Ho * Wo + oy * Wo + ox

    return dict(
        dtype=shape.dtype.value,
        xtype="float" if shape.dtype is DType.FP32 else "unsigned short",
        nhwc=nhwc,
        stores=[
            dict(m=m, oy=oy, ox=ox, off=out_offset(m, oy, ox))
            for m in range(cm)
            for oy in range(cy)
            for ox in range(cx)
        ],
    )


def plan_direct(shape: ConvProblem, v: Variant) -> Plan:
    # 1. limits
    _check_variant(shape, v)
    fmas = unrolled_fmas(shape, v)
    if fmas > MAX_UNROLLED_FMAS:
        raise SpecError(
            f"{v.kernel_name(shape)} unrolls {fmas} FMAs into one kernel, over specgen's limit of "
            f"{MAX_UNROLLED_FMAS} (NVRTC's time grows with the square of that); "
            "use --loop-channels or less coarsening"
        )
    C, M, H, W, K = shape.C, shape.M, shape.H, shape.W, shape.K
    Ho, Wo, RS = shape.Ho, shape.Wo, shape.R * shape.S
    nhwc = shape.layout is TensorLayout.NHWC
    cx, cy, cm = v.coarsening
    tile = v.tile
    bw, bh = tile // cx, tile // cy
    block = (bw, bh, 1)
    check_threads(block, f"choose a smaller tile or more coarsening than x{cx}y{cy}")
    tiles_x, tiles_y = ceil_div(Wo, tile), ceil_div(Ho, tile)
    map_groups = M // cm
    splits = v.channel_splits
    cg = shape.Cg // splits
    ih, iw = halo(shape, tile)
    fp16 = v.precision is Precision.FP16
    const = v.weights is Weights.CONST
    const_bytes = 4 * shape.weight_count if const else 0
    if const_bytes > CONST_BYTES:
        raise SpecError(
            f"constant weights need {const_bytes} bytes ({shape.weight_count} floats), "
            f"over the {CONST_BYTES}-byte constant bank; use --weights global"
        )

    # 2. memory: where a thread's pixels come from (global memory, or a shared halo tile)
    # Outputs past the image edge exist only when the tiles overhang it; halo reads
    # leave the image only then or with padding.  Neither check is emitted otherwise.
    overhang = Wo % tile != 0 or Ho % tile != 0
    guard_loads = max(shape.pads) > 0 or overhang
    static_smem = dynamic_smem = 0
    smem, smem_size = None, None
    plane, pix = (1, C) if nhwc else (H * W, 1)  # x's steps between channels and pixels
    if v.staging is None:

        def offsets(c, r, col):
            return c * plane + (r * W + col) * pix

    else:
        lay = _smem_layout(shape, v, cg, ih, iw, bw)
        nbytes = 4 * lay["floats"]
        fit = _fits_tile(shape, v, 232448)
        hint = f"choose --tile {fit}" if fit else "use --strategy direct or implicit"
        static_smem, dynamic_smem = smem_placement(
            nbytes, f"the {v.staging.value} halo tile of {cg} channels", hint
        )
        planar = v.staging is Layout.PLANAR
        smem = dict(
            lay,
            planar=planar,
            total=cg * ih * iw,
            dynamic=dynamic_smem > 0,
            row_step=cy * shape.stride[0] * lay["row"],
            col_step=cx * shape.stride[1] * lay["pix"],
            # a block's first input row and column: its output tile times the stride
            tile_step_y=tile * shape.stride[0],
            tile_step_x=tile * shape.stride[1],
            halo_row=cg * iw,  # NHWC staging: the channels of one halo row
        )
        shape_txt = (
            f"[{cg}][{ih}][{iw}+{lay['pad']}]" if planar else f"[{ih}][{iw}][{cg}+{lay['pad']}]"
        )
        smem_size = Size(
            "__shared__",
            f"{nbytes} B = {lay['floats']} floats {shape_txt}",
            (
                f"halo tile (tile+K-1)^2 = {ih}^2 pixels"
                if ih == iw == tile + K - 1
                else f"halo tile (tile-1)*s + (K-1)*d + 1 = {ih} x {iw} pixels"
            )
            + f" x {cg} channels, pad {lay['pad']} -> {lay['degree']}-way bank conflicts at worst",
        )

        def offsets(c, r, col):
            return c * lay["plane"] + r * lay["row"] + col * lay["pix"]

    channels = range(cg) if v.unroll else [0]
    body, cols = _body(shape, v, channels, offsets)

    # 3. the banner's sizes and the template's context
    plain_columns = cols == list(range(cx + K - 1))
    sizes = [
        *problem_sizes(shape),
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
            f"{cm * cy * cx} accumulators + {len(cols)} pixels",
            f"cm*cy*cx = {cm}*{cy}*{cx}; "
            + (
                f"cx+K-1 = {cx}+{K}-1"
                if plain_columns
                else f"columns ox*{shape.stride[1]} + q*{shape.dil[1]} for ox < {cx}, q < {shape.S}"
            ),
        ),
    ]
    if const:
        count = "M*C*K*K" if not shape.unusual() else "M*C/groups*R*S"
        sizes.append(
            Size("__constant__", f"{const_bytes} B", f"{count} = {shape.weight_count} floats")
        )
    if smem_size:
        sizes.append(smem_size)

    ctx = dict(
        shape_context(shape),
        **_epilogue_context(shape, v, cm),
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
        weight_count=shape.weight_count,
        fp16=fp16,
        guard_loads=guard_loads,
        guard_stores=overhang,
        unroll=v.unroll,
        smem=smem,
        atomic=splits > 1,
        wstride_group=cm * shape.reduction,
        npix=len(cols),
        cols=cols,
        plain_columns=plain_columns,
        nh2=len(cols) - 1,
        half_math=True,
        out_plane=Ho * Wo,
        halo_plane=ih * iw,
        group_in=cg * plane,
        group_w=cg * RS,
        group_out=cm * Ho * Wo,
        # groups: the input channels of the thread's maps start at channel
        # (mg / map_groups_per_group) * C/groups
        map_groups_per_group=shape.Mg // cm,
        group_x=shape.Cg * plane,
        x_plane=plane,
        body=body,
    )

    # 4. launches
    launches = []
    symbol = v.kernel_name(shape)
    if ctx["atomic"]:
        zero_block = 256
        launches.append(
            Launch(
                f"{symbol}_zero",
                (*y_args(shape), Role.BATCH),
                (zero_block, 1, 1),
                (0, 1, 1),
                0,
                M * Ho * Wo,
                zero_block * 4,
            )
        )
        ctx["zero_per_thread"] = 4
        ctx["zero_block"] = zero_block
    # With channel groups the first kernel writes the bias, so the sums go in as they are.
    args = (Role.X,) + (() if const else (Role.W,)) + ((Role.Y,) if splits > 1 else y_args(shape))
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
