"""What the GEMM family shares (``im2col``, ``implicit``, ``mma``), and the CUDA-core
GEMM planner of ``im2col`` and ``implicit``.

Convolution as a matrix product: Y[m][col] = sum_k W[m][k] * X[k][col] with
k = (c, p, q) over C*K*K and col = (n, oh, ow) over B*Ho*Wo.  ``im2col`` writes X to a
workspace first; ``implicit`` and ``mma`` gather each X tile straight from x.
"""

from __future__ import annotations

from ..errors import SpecError
from ..shapes import ConvProblem
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
    K, C = shape.K, shape.C
    return [
        Size(
            "output",
            f"{shape.M} x {shape.Ho} x {shape.Wo}",
            f"Ho = H + 2*pad - K + 1 = {shape.H}+{2 * shape.pad}-{K}+1",
        ),
        Size(
            "GEMM",
            f"{shape.M} x {C * K * K} . {C * K * K} x (B*{shape.Ho * shape.Wo})",
            "M x C*K*K weights times C*K*K x B*Ho*Wo gathered input",
        ),
    ]


def k_tables(shape: ConvProblem, kpad: int) -> dict:
    """Row k of the unrolled matrix is input pixel (c, p, q) of the window: its offset
    from the window's top-left pixel, and for padded shapes its (p-pad, q-pad) packed
    as two 16-bit halves for the bounds check.  Rows past C*K*K are padding (-1)."""
    K, KK = shape.K, shape.K * shape.K
    offsets, dyx = [], []
    for k in range(kpad):
        if k >= shape.reduction:
            offsets.append(-1)
            dyx.append(0)
            continue
        c, p, q = k // KK, k % KK // K, k % K
        offsets.append(c * shape.H * shape.W + p * shape.W + q)
        dyx.append(((p - shape.pad) << 16) | ((q - shape.pad) & 0xFFFF))
    nbytes = 4 * kpad * (2 if shape.pad else 1)
    if nbytes > 64 * 1024:
        raise SpecError(
            f"the gather tables need {nbytes} bytes of __constant__ memory (C*K*K = "
            f"{shape.reduction} rows), over the 65536-byte bank; use a direct-family strategy"
        )
    return dict(koff=offsets, kdyx=dyx if shape.pad else None, ktab_bytes=nbytes)


def index_ctx(shape: ConvProblem) -> dict:
    return dict(shape_context(shape), guard_pad=shape.pad > 0)


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
    bm = min(64, ceil_div(shape.M, r) * r)
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
        ws_stride=ws_stride,
        xs_stride=xs_stride,
        chunks=ceil_div(shape.reduction, bk),
        m_blocks=ceil_div(shape.M, bm),
        explicit=explicit,
        unroll_threads=UNROLL_THREADS,
    )
    ctx.update(
        w_tile_elems=bm * bk, x_tile_elems=bk * bn, kspan=ctx["chunks"] * bk, CK=shape.C * shape.K
    )
    ctx.update(k_tables(shape, ctx["chunks"] * bk))
    sizes = common_sizes(shape) + [
        Size("block tile", f"{bm} maps x {bn} pixels", f"min(64, M rounded to r={r}) x tile"),
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
