"""``mma``: the fused implicit GEMM on tensor cores.  Each block gathers its B tile
straight from x into shared memory and four warps multiply it with ``mma.sync``
fragments (tf32 m16n8k8 or fp16 m16n8k16), accumulating in fp32 (seed 001)."""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import SpecError
from ..plan.common import (
    Launch,
    Plan,
    Size,
    ceil_div,
    launch_bounds,
    smem_placement,
    y_args,
)
from ..plan.gemm import check_tile, common_sizes, index_ctx, k_tables, map_blocks, pad_for
from ..shapes import ConvProblem, DType
from ..tensors import Role
from ..variants import EVERY_FEATURE, Precision, Variant
from .implicit import GEMM_TILE

MMA_WARPS = 4
# Tensor-core fragments: (k per mma instruction, bytes per element, the PTX shape)
FRAGMENTS = {
    Precision.TF32: dict(kstep=8, elem="tf32", ptx="m16n8k8", wmma="16x16x8", pack=None),
    Precision.FP16: dict(kstep=16, elem="f16", ptx="m16n8k16", wmma="16x16x16", pack="pack_half2"),
    Precision.BF16: dict(
        kstep=16, elem="bf16", ptx="m16n8k16", wmma="16x16x16", pack="pack_bf16x2"
    ),
}
ROUNDING = {
    Precision.TF32: "x and w rounded to tf32 (cvt.rna), products accumulated in fp32",
    Precision.FP16: "x and w rounded to fp16 (round to nearest), products accumulated in fp32",
    Precision.BF16: "x and w rounded to bf16 (round to nearest even), products accumulated in fp32",
}


def plan_mma(shape: ConvProblem, v: Variant) -> Plan:
    check_tile(v)
    if shape.Mg < 16:
        maps = f"M={shape.M}" if shape.groups == 1 else f"{shape.Mg} maps per group"
        raise SpecError(
            f"mma fragments are 16 output maps tall; {maps} would leave "
            f"{100 - 100 * shape.Mg // 16}% of each fragment idle: use a direct-family strategy"
        )
    if v.precision is Precision.FP16 and shape.dtype is DType.BF16:
        raise SpecError(
            "fp16 tensor cores would lose bf16's range (bf16 tensors reach 3e38, fp16 "
            "65504): use --precision bf16 or tf32"
        )
    frag = FRAGMENTS[v.precision]
    kstep, pairs = frag["kstep"], frag["pack"] is not None
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
    bm = min(64, ceil_div(shape.Mg, 16) * 16)
    fm, fn = bm // 16, warp_n // 8
    words = 2 if pairs else 1  # elements per 32-bit shared word along k
    kw = bk // words  # 32-bit words per row along k
    # A is [m][k]; B is [k][n] for tf32 (columns contiguous for the gather) and
    # [n][k] for 16-bit math (k pairs packed in one word, as the fragment wants them).
    a_pad, a_deg = pad_for(lambda g, t, p: g * (kw + p) + t)
    if pairs:
        b_pad, b_deg = pad_for(lambda g, t, p: g * (kw + p) + t)
        b_stride, b_rows = kw + b_pad, bn
    else:
        b_pad, b_deg = pad_for(lambda g, t, p: t * (bn + p) + g)
        b_stride, b_rows = bn + b_pad, bk
    a_stride = kw + a_pad
    smem = 4 * (bm * a_stride + b_rows * b_stride)
    static, dynamic = smem_placement(smem, "the mma tiles", "choose a smaller tile")
    threads = 32 * MMA_WARPS
    ctx = index_ctx(shape)
    ctx.update(
        fp16=v.precision is Precision.FP16,
        bf16=v.precision is Precision.BF16,
        pairs=pairs,
        elem=frag["elem"],
        pack=frag["pack"],
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
        **launch_bounds(threads, one_per_sm_first=False),
        a_stride=a_stride,
        b_stride=b_stride,
        a_words=bm * a_stride,
        ptx=frag["ptx"],
        **map_blocks(shape, bm),
        words=words,
        rows_per_pass=threads // bn,
    )
    ctx.update(a_tile_words=bm * kw, step_words=kstep // words, warps=MMA_WARPS)
    ctx.update(k_tables(shape, kpad))
    ctx["precision_note"] = ROUNDING[v.precision]
    waste = 100.0 * (kpad - ckk) / kpad
    sizes = common_sizes(shape) + [
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
    if shape.Mg % 16:
        what = "M" if shape.groups == 1 else "M/groups"
        sizes.append(
            Size(
                f"{what} padding",
                f"{shape.Mg} -> {ceil_div(shape.Mg, 16) * 16}",
                f"rows past {what} are zero and never stored",
            )
        )
    launch = Launch(
        v.kernel_name(shape),
        (Role.X, Role.W, *y_args(shape), Role.BATCH),
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


@dataclass(frozen=True, kw_only=True)
class Mma(Variant):
    key = "mma"
    templates = ("gemm/mma.cu.j2",)
    family = "gemm"
    description = "fused implicit GEMM on tensor cores (mma.sync), fp32 accumulation"
    serves = EVERY_FEATURE
    precisions = (Precision.TF32, Precision.FP16, Precision.BF16)
    tensor_core = True

    tile: int = GEMM_TILE

    def plan(self, problem):
        return plan_mma(problem, self)

    @classmethod
    def space(cls, problem, precision):
        return [cls(tile=t, precision=precision) for t in (32, 64, 128)]
