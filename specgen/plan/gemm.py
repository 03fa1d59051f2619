"""Planning for the GEMM family: ``im2col``, ``implicit`` and ``mma``.

Convolution as a matrix product: Y[m][col] = sum_k W[m][k] * X[k][col] with
k = (c, p, q) over C*K*K and col = (n, oh, ow) over B*Ho*Wo.  ``im2col`` writes X to a
workspace first; ``implicit`` and ``mma`` gather each X tile straight from x.
"""

from __future__ import annotations

from ..errors import SpecError
from ..shapes import ConvProblem
from ..variants import Precision, Strategy, Variant
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
MMA_WARPS = 4
# Tensor-core fragments: (k per mma instruction, bytes per element, the PTX shape)
FRAGMENTS = {
    Precision.TF32: dict(kstep=8, elem=4, ptx="m16n8k8", wmma="16x16x8"),
    Precision.FP16: dict(kstep=16, elem=2, ptx="m16n8k16", wmma="16x16x16"),
}


def _lanes():
    return [(lane >> 2, lane & 3) for lane in range(32)]  # (groupID, thread in group)


def _pad_for(addr_of) -> tuple[int, int]:
    """Smallest row pad (in 4-byte words) giving the fewest bank conflicts."""
    best = None
    for pad in range(0, 33):
        degree = bank_conflict_degree([addr_of(g, t, pad) for g, t in _lanes()])
        if best is None or degree < best[1]:
            best = (pad, degree)
    return best


def _common_sizes(shape: ConvProblem) -> list[Size]:
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


def _k_tables(shape: ConvProblem, kpad: int) -> dict:
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


def _index_ctx(shape: ConvProblem) -> dict:
    return dict(shape_context(shape), guard_pad=shape.pad > 0)


def _plan_cuda_core(shape: ConvProblem, v: Variant) -> Plan:
    if v.precision is not Precision.FP32:
        raise SpecError(
            f"{v.strategy.value} multiplies on CUDA cores in fp32; for {v.precision.value} "
            "use --strategy mma (tensor cores) or a direct-family strategy"
        )
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
    ctx = _index_ctx(shape)
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
        explicit=v.strategy is Strategy.IM2COL,
        unroll_threads=UNROLL_THREADS,
    )
    ctx.update(
        w_tile_elems=bm * bk, x_tile_elems=bk * bn, kspan=ctx["chunks"] * bk, CK=shape.C * shape.K
    )
    ctx.update(_k_tables(shape, ctx["chunks"] * bk))
    sizes = _common_sizes(shape) + [
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
    symbol = v.name
    workspace = 0
    if v.strategy is Strategy.IM2COL:
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
                ("x", "xu", "batch"),
                (UNROLL_THREADS, 1, 1),
                (0, shape.C * shape.K, 1),
                0,
                shape.Ho * shape.Wo,
                UNROLL_THREADS,
            )
        )
        args = ("w", "xu", *y_args(shape), "batch")
    else:
        args = ("x", "w", *y_args(shape), "batch")
    launches.append(
        Launch(symbol, args, block, (0, ctx["m_blocks"], 1), 0, shape.Ho * shape.Wo, bn, dynamic)
    )
    return Plan(
        shape=shape,
        variant=v,
        template=f"gemm/{v.strategy.value}.cu.j2",
        launches=tuple(launches),
        static_smem=static,
        dynamic_smem=dynamic,
        const_bytes=0,
        weight_format="f32",
        sizes=tuple(sizes),
        context=ctx,
        workspace_per_image=workspace,
    )


def _plan_mma(shape: ConvProblem, v: Variant) -> Plan:
    if v.precision not in FRAGMENTS:
        raise SpecError(
            "mma runs on tensor cores, which take tf32 or fp16 inputs: choose "
            "--precision tf32 or fp16 (fp32 is never silently lowered)"
        )
    if shape.M < 16:
        raise SpecError(
            f"mma fragments are 16 output maps tall; M={shape.M} would leave "
            f"{100 - 100 * shape.M // 16}% of each fragment idle: use a direct-family strategy"
        )
    frag = FRAGMENTS[v.precision]
    kstep, fp16 = frag["kstep"], v.precision is Precision.FP16
    ckk = shape.reduction
    kpad = ceil_div(ckk, kstep) * kstep
    steps = kpad // kstep
    per_chunk = max(s for s in range(1, 7) if steps % s == 0)
    bk = per_chunk * kstep
    bn = v.tile
    warp_n = bn // MMA_WARPS
    if bn not in (32, 64, 128):
        raise SpecError(
            f"mma's tile is 32, 64 or 128 pixels ({MMA_WARPS} warps x n8 fragments, one "
            f"gathered column per thread), got {bn}"
        )
    bm = min(64, ceil_div(shape.M, 16) * 16)
    fm, fn = bm // 16, warp_n // 8
    words = 1 if not fp16 else 2  # elements per 32-bit shared word along k
    kw = bk // words  # 32-bit words per row along k
    # A is [m][k]; B is [k][n] for tf32 (columns contiguous for the gather) and
    # [n][k] for fp16 (k pairs packed in one word, as the fragment wants them).
    a_pad, a_deg = _pad_for(lambda g, t, p: g * (kw + p) + t)
    if fp16:
        b_pad, b_deg = _pad_for(lambda g, t, p: g * (kw + p) + t)
        b_stride, b_rows = kw + b_pad, bn
    else:
        b_pad, b_deg = _pad_for(lambda g, t, p: t * (bn + p) + g)
        b_stride, b_rows = bn + b_pad, bk
    a_stride = kw + a_pad
    smem = 4 * (bm * a_stride + b_rows * b_stride)
    static, dynamic = smem_placement(smem, "the mma tiles", "choose a smaller tile")
    threads = 32 * MMA_WARPS
    ctx = _index_ctx(shape)
    ctx.update(
        fp16=fp16,
        half_math=False,
        bm=bm,
        bn=bn,
        bk=bk,
        kw=kw,
        kstep=kstep,
        kpad=kpad,
        chunks=kpad // bk,
        steps_per_chunk=per_chunk,
        fm=fm,
        fn=fn,
        warp_n=warp_n,
        threads=threads,
        a_stride=a_stride,
        b_stride=b_stride,
        a_words=bm * a_stride,
        ptx=frag["ptx"],
        m_blocks=ceil_div(shape.M, bm),
        words=words,
        rows_per_pass=threads // bn,
    )
    ctx.update(a_tile_words=bm * kw, step_words=kstep // words, warps=MMA_WARPS)
    ctx.update(_k_tables(shape, kpad))
    ctx["precision_note"] = (
        "x and w rounded to fp16 (round to nearest), products accumulated in fp32"
        if fp16
        else "x and w rounded to tf32 (cvt.rna), products accumulated in fp32"
    )
    waste = 100.0 * (kpad - ckk) / kpad
    sizes = _common_sizes(shape) + [
        Size(
            "fragment",
            f"{frag['wmma']} as 2 x mma.{frag['ptx']}",
            f"{v.precision.value} inputs, fp32 accumulators",
        ),
        Size(
            "k padding",
            f"{ckk} -> {kpad} ({waste:.1f}% zeros)",
            f"C*K*K rounded up to the fragment depth {kstep}; the pad is zero in W and X",
        ),
        Size(
            "block tile",
            f"{bm} maps x {bn} pixels",
            f"{fm} m16 x {fn} n8 fragments per warp, {MMA_WARPS} warps side by side",
        ),
        Size(
            "k chunk",
            f"{bk} = {per_chunk} x {kstep}",
            f"{kpad // bk} chunks; {per_chunk} divides the {steps} fragment steps",
        ),
        Size(
            "__shared__",
            f"{smem} B",
            f"A {bm}x{a_stride} words, B {b_rows}x{b_stride} words; pads {a_pad}/{b_pad} -> {max(a_deg, b_deg)}-way conflicts at worst",
        ),
        Size(
            "registers", f"{fm * fn * 4} accumulators", f"{fm}*{fn} fragments x 4 floats per thread"
        ),
    ]
    if shape.M % 16:
        sizes.append(
            Size(
                "M padding",
                f"{shape.M} -> {ceil_div(shape.M, 16) * 16}",
                "rows past M are zero and never stored",
            )
        )
    launch = Launch(
        v.name,
        ("x", "w", *y_args(shape), "batch"),
        (threads, 1, 1),
        (0, ctx["m_blocks"], 1),
        0,
        shape.Ho * shape.Wo,
        bn,
        dynamic,
    )
    return Plan(
        shape=shape,
        variant=v,
        template="gemm/mma.cu.j2",
        launches=(launch,),
        static_smem=static,
        dynamic_smem=dynamic,
        const_bytes=0,
        weight_format="f32",
        sizes=tuple(sizes),
        context=ctx,
    )


def plan_gemm(shape: ConvProblem, v: Variant) -> Plan:
    if v.tile < 1:
        raise SpecError(f"tile must be at least 1, got {v.tile}")
    if v.strategy is Strategy.MMA:
        return _plan_mma(shape, v)
    return _plan_cuda_core(shape, v)
