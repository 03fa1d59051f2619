"""What the GEMM family shares (``im2col``, ``implicit``, ``mma``), and the CUDA-core
GEMM planner of ``im2col`` and ``implicit``.

Convolution as a matrix product: Y[m][col] = sum_k W[m][k] * X[k][col] with
k = (c, p, q) over C/groups*R*S and col = (n, oh, ow) over B*Ho*Wo, one GEMM per group
of maps.  ``im2col`` writes X to a workspace first; ``implicit`` and ``mma`` gather
each X tile straight from x: column (n, oh, ow) reads its window's corner, row k adds
the literal offset of tap (c, p, q) from a table, in either layout of x.
"""

from __future__ import annotations

from ..errors import SpecError
from ..shapes import ConvProblem, DType, TensorLayout
from ..tensors import Role
from ..variants import Variant
from .common import (
    y_args,
    Launch,
    Plan,
    Size,
    bank_conflict_degree,
    ceil_div,
    check_threads,
    launch_bounds,
    smem_placement,
    shape_context,
)

GEMM_BK = 16  # reduction chunk of the CUDA-core GEMMs
UNROLL_THREADS = 256


def lanes():
    return [(lane >> 2, lane & 3) for lane in range(32)]  # (groupID, thread in group)


def pad_for(addr_of) -> tuple[int, int]:
    """Smallest row pad (in 4-byte words) giving the fewest bank conflicts."""
    best = None
    for pad in range(0, 33):
        degree = bank_conflict_degree([addr_of(g, t, pad) for g, t in lanes()])
        if best is None or degree < best[1]:
            best = (pad, degree)
    return best


def common_sizes(shape: ConvProblem) -> list[Size]:
    from .direct import problem_sizes

    output = problem_sizes(shape)[0]
    red, cols = shape.reduction, shape.Ho * shape.Wo
    if not shape.unusual():
        K, C = shape.K, shape.C
        return [
            output,
            Size(
                "GEMM",
                f"{shape.M} x {C * K * K} . {C * K * K} x (B*{cols})",
                "M x C*K*K weights times C*K*K x B*Ho*Wo gathered input",
            ),
        ]
    per = f"{shape.groups} x ({shape.Mg} x {red} . {red} x (B*{cols}))"
    return [
        output,
        Size(
            "GEMM",
            per if shape.groups > 1 else f"{shape.M} x {red} . {red} x (B*{cols})",
            "per group: M/groups x C/groups*R*S weights times the gathered input",
        ),
    ]


def k_tables(shape: ConvProblem, kpad: int) -> dict:
    """Row k of the unrolled matrix is input pixel (c, p, q) of the window: its offset
    from the window's corner in x's layout and, where x is padded, its (p*dh - pt,
    q*dw - pl) packed as two 16-bit halves for the bounds check.  Rows past
    C/groups*R*S are padding (-1)."""
    R, S, RS = shape.R, shape.S, shape.R * shape.S
    (dh, dw), (pt, _, pl, _) = shape.dil, shape.pads
    H, W, C = shape.H, shape.W, shape.C
    nhwc = shape.layout is TensorLayout.NHWC
    guard = max(shape.pads) > 0
    offsets, dyx = [], []
    for k in range(kpad):
        if k >= shape.reduction:
            offsets.append(-1)
            dyx.append(0)
            continue
        c, p, q = k // RS, k % RS // S, k % S
        tap = p * dh * W + q * dw
        offsets.append(tap * C + c if nhwc else c * H * W + tap)
        dy, dx = p * dh - pt, q * dw - pl
        if guard and not (-(2**15) <= min(dy, dx) and max(dy, dx) < 2**15):
            raise SpecError(
                f"a tap {dy}, {dx} pixels from the window's corner does not fit the gather "
                "table's 16-bit halves; use a direct-family strategy"
            )
        dyx.append((dy << 16) | (dx & 0xFFFF))
    nbytes = 4 * kpad * (2 if guard else 1)
    if nbytes > 64 * 1024:
        raise SpecError(
            f"the gather tables need {nbytes} bytes of __constant__ memory (C/groups*R*S = "
            f"{shape.reduction} rows), over the 65536-byte bank; use a direct-family strategy"
        )
    if not shape.unusual():
        K = shape.K
        notes = [
            f"Row k of the unrolled matrix is window pixel (c, p, q), k = (c*{K} + p)*{K} + q:",
            f"its offset c*{H * W} + p*{W} + q from the window's top-left pixel, -1 past C*K*K.",
            "(p - pad, q - pad) of row k as two 16-bit halves, for the zero-padding bounds check.",
        ]
    else:
        tap = f"p*{dh * W} + q*{dw}" if dh * W != W or dw != 1 else f"p*{W} + q"
        off = f"({tap})*{C} + c" if nhwc else f"c*{H * W} + {tap}"
        notes = [
            f"Row k of the unrolled matrix is window pixel (c, p, q), k = (c*{R} + p)*{S} + q:",
            f"its offset {off} from the window's corner, -1 past C/groups*R*S.",
            f"(p*{dh} - {pt}, q*{dw} - {pl}) of row k as two 16-bit halves, for the bounds check.",
        ]
    return dict(koff=offsets, kdyx=dyx if guard else None, ktab_bytes=nbytes, knotes=notes)


def index_ctx(shape: ConvProblem) -> dict:
    """How column (n, oh, ow) addresses x, y and its group: C expressions of literals.
    ``x_corner``: the offset of its window's corner (padding included) in the image."""
    (sh, sw), (pt, _, pl, _) = shape.stride, shape.pads
    nhwc = shape.layout is TensorLayout.NHWC
    oh = "oh" if sh == 1 else f"oh * {sh}"
    ow = "ow" if sw == 1 else f"ow * {sw}"
    if not shape.unusual():
        p = shape.pad
        corner = f"(oh - {p}) * {shape.W} + (ow - {p})" if p else f"oh * {shape.W} + ow"
    else:
        pix = f"({oh} - {pt}) * {shape.W} + ({ow} - {pl})"
        corner = f"({pix}) * {shape.C}" if nhwc else pix
    return dict(
        shape_context(shape),
        guard_pad=max(shape.pads) > 0,
        oh_in=oh,
        ow_in=ow,
        x_corner=corner,
        nhwc=nhwc,
        dtype=shape.dtype.value,
        xtype="float" if shape.dtype is DType.FP32 else "unsigned short",
        Mg=shape.Mg,
        m_end="m_end" if shape.groups > 1 else shape.M,  # the first map past this block's group
        group_x=shape.Cg * (1 if nhwc else shape.H * shape.W),
    )


def map_blocks(shape: ConvProblem, bm: int) -> dict:
    """Blocks of bm maps, never straddling two groups: ceil(M/groups / bm) per group."""
    per_group = ceil_div(shape.Mg, bm)
    return dict(blocks_per_group=per_group, m_blocks=shape.groups * per_group)


def check_tile(v: Variant) -> None:
    if v.tile < 1:
        raise SpecError(f"tile must be at least 1, got {v.tile}")


def plan_cuda_core(shape: ConvProblem, v: Variant, explicit: bool) -> Plan:
    """``explicit``: im2col's unroll kernel writes the matrix to a workspace first."""
    check_tile(v)
    r, c = v.regtile
    bn = v.tile
    if r < 1 or c < 1 or bn % c:
        raise SpecError(
            f"register tile {r}x{c}: its {c} pixels per thread must divide the tile of {bn} "
            f"pixels per block; choose a tile that is a multiple of {c}"
        )
    bm = min(64, ceil_div(shape.Mg, r) * r)
    tx, ty = bn // c, bm // r
    block = (tx, ty, 1)
    check_threads(block, f"choose a larger register tile than {r}x{c} or a smaller tile")
    bk = GEMM_BK
    ws_stride, xs_stride = bm + (1 if bm % 32 == 0 else 0), bn
    smem = 4 * bk * (ws_stride + xs_stride)
    static, dynamic = smem_placement(smem, "the GEMM tiles", "choose a smaller tile")
    ctx = index_ctx(shape)
    ctx.update(
        bm=bm,
        bn=bn,
        bk=bk,
        r=r,
        c=c,
        tx_n=tx,
        ty_n=ty,
        threads=tx * ty,
        **launch_bounds(tx * ty, one_per_sm_first=False),
        ws_stride=ws_stride,
        xs_stride=xs_stride,
        chunks=ceil_div(shape.reduction, bk),
        **map_blocks(shape, bm),
        explicit=explicit,
        unroll_threads=UNROLL_THREADS,
    )
    ctx.update(
        w_tile_elems=bm * bk, x_tile_elems=bk * bn, kspan=ctx["chunks"] * bk, CK=shape.C * shape.K
    )
    ctx.update(k_tables(shape, ctx["chunks"] * bk))
    sizes = common_sizes(shape) + [
        Size(
            "block tile",
            f"{bm} maps x {bn} pixels",
            f"min(64, {'M' if shape.groups == 1 else 'M/groups'} rounded to r={r}) x tile",
        ),
        Size(
            "block",
            f"{tx} x {ty} = {tx * ty} threads",
            f"tile/c = {bn}/{c}, block maps/r = {bm}/{r}",
        ),
        Size("registers", f"{r * c} accumulators", f"register tile {r} maps x {c} pixels"),
        Size(
            "__shared__",
            f"{smem} B",
            f"W tile {bk}x{ws_stride} + X tile {bk}x{xs_stride} floats, k chunk {bk}",
        ),
        Size(
            "k chunks",
            f"{ctx['chunks']}",
            f"ceil(C*K*K / {bk}) = ceil({shape.reduction}/{bk}), the last one zero-filled",
        ),
    ]
    launches = []
    symbol = v.kernel_name(shape)
    workspace = 0
    if explicit:
        workspace = 4 * shape.reduction * shape.Ho * shape.Wo
        sizes.append(
            Size(
                "workspace",
                f"{workspace} B per image",
                f"C*K*K x Ho*Wo = {shape.reduction} x {shape.Ho * shape.Wo} floats; images per segment from the budget",
            )
        )
        launches.append(
            Launch(
                f"{symbol}_unroll",
                (Role.X, Role.WORKSPACE, Role.BATCH),
                (UNROLL_THREADS, 1, 1),
                (0, shape.C * shape.K, 1),
                0,
                shape.Ho * shape.Wo,
                UNROLL_THREADS,
            )
        )
        args = (Role.W, Role.WORKSPACE, *y_args(shape), Role.BATCH)
    else:
        args = (Role.X, Role.W, *y_args(shape), Role.BATCH)
    launches.append(
        Launch(symbol, args, block, (0, ctx["m_blocks"], 1), 0, shape.Ho * shape.Wo, bn, dynamic)
    )
    return Plan(
        shape=shape,
        variant=v,
        template=f"gemm/{v.key}.cu.j2",
        launches=tuple(launches),
        static_smem=static,
        dynamic_smem=dynamic,
        const_bytes=0,
        weight_format="f32",
        sizes=tuple(sizes),
        context=ctx,
        workspace_per_image=workspace,
    )
