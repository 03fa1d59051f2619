"""``mmatile``: tensor cores on a shared-memory band of the input.

The implicit GEMM of ``mma`` gathers every input pixel K*K times from global memory.
Here a block stages a band of output rows' whole input window once, as tf32 with the
zero padding written in, and every B fragment element is one shared load at
(pixel base + tap offset).  The tap offsets depend on the lane only through
t = lane % 4, so a small table gives each thread both of its offsets per k step in
one 8-byte load.  A (the weights) is stored pre-swizzled in fragment order, so a
thread's four A registers for one fragment are one 16-byte load.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import SpecError
from ..shapes import ConvProblem
from ..tensors import Role
from ..plan import tallest, tallest_planned
from ..variants import EPILOGUE, Precision, Variant
from .persist import BAND
from ..plan.common import (
    y_args,
    Launch,
    OPTIN_SMEM_BYTES,
    Plan,
    Size,
    ceil_div,
    launch_bounds,
    shape_context,
    smem_placement,
)

KSTEP = 8  # mma.m16n8k8 with tf32 inputs
# Unroll the k steps fully up to this many; beyond, by 8 (NVRTC took 15.7 s on 196
# fully unrolled steps, C=32 K=7, against 0.5 s for layer2's 25).
FULL_UNROLL_STEPS = 32
MAX_ACCUMULATORS = 32  # fp32 accumulators per thread: fm m16 fragments x fn n8 groups x 4


def _band_bytes(shape: ConvProblem, rows: int, row_stride: int, steps: int, fm: int) -> int:
    tile = (shape.C + 1) * (rows + shape.K - 1) * row_stride  # + one plane of zeros
    a = steps * fm * 32 * 4
    table = steps * 4 * 2
    return 4 * (tile + a + table)


def plan_mmatile(shape: ConvProblem, v: Variant) -> Plan:
    if shape.M < 16:
        raise SpecError(
            f"mmatile fragments are 16 output maps tall; M={shape.M} would leave "
            f"{100 - 100 * shape.M // 16}% of each fragment idle: use a direct-family strategy"
        )
    C, M, K, pad = shape.C, shape.M, shape.K, shape.pad
    Ho, Wo = shape.Ho, shape.Wo
    rows = v.tile
    if rows < 1 or rows > Ho:
        raise SpecError(f"mmatile's tile is a band of output rows, 1 to Ho={Ho}; got {rows}")
    ckk = shape.reduction
    kpad = ceil_div(ckk, KSTEP) * KSTEP
    steps = kpad // KSTEP
    fm = ceil_div(M, 16)
    # Pixel groups per warp pass: more amortize each A load, fewer keep registers.
    fn = max(1, min(4, MAX_ACCUMULATORS // (4 * fm)))
    wp = shape.W + 2 * pad  # padded row: the zero halo is stored, so no bounds checks
    row_stride = wp + (1 if wp % 32 == 0 else 0)
    hp = rows + K - 1
    plane = hp * row_stride
    nbytes = _band_bytes(shape, rows, row_stride, steps, fm)
    fit = tallest(Ho, lambda r: _band_bytes(shape, r, row_stride, steps, fm) <= OPTIN_SMEM_BYTES)
    hint = f"choose --tile {fit}" if fit else "C*H*W is too large for one band: use mma"
    static, dynamic = smem_placement(nbytes, f"the band of {rows} output rows", hint)
    warps = 8 if dynamic else 4
    threads = 32 * warps
    pixels = rows * Wo
    groups = ceil_div(pixels, 8)
    bands = ceil_div(Ho, rows)
    # Padding rows of k read plane C, all zeros: base + C*plane stays inside it for
    # every pixel base, so the pad is exactly zero in B as in A.
    zero = C * plane

    def koff(k):
        if k >= ckk:
            return zero
        c, p, q = k // (K * K), k % (K * K) // K, k % K
        return c * plane + p * row_stride + q

    ktab = [(koff(s * KSTEP + t), koff(s * KSTEP + t + 4)) for s in range(steps) for t in range(4)]
    ctx = dict(
        shape_context(shape),
        kpad=kpad,
        steps=steps,
        unroll_steps=steps if steps <= FULL_UNROLL_STEPS else 8,
        ktab_len=steps * 4,
        kt_byte=4 * steps * fm * 128,
        xs_byte=4 * steps * fm * 128 + 32 * steps,
        a_step=128 * fm,
        pass_groups=warps * fn,
        fm=fm,
        fn=fn,
        warps=warps,
        threads=threads,
        **launch_bounds(threads),
        rows=rows,
        bands=bands,
        wp=wp,
        hp=hp,
        band_plane=hp * wp,
        row_stride=row_stride,
        plane=plane,
        tile_words=(C + 1) * plane,
        zero=zero,
        pixels=pixels,
        groups=groups,
        a_words=steps * fm * 32 * 4,
        ktab=ktab,
        dynamic=dynamic > 0,
        smem_bytes=nbytes,
        load_total=C * hp * wp,
        a_total=steps * fm * 32 * 4,
        precision_note="x and w rounded to tf32 (cvt.rna), products accumulated in fp32",
    )
    sizes = [
        Size("output", f"{M} x {Ho} x {Wo}", f"Ho = H + 2*pad - K + 1 = {shape.H}+{2 * pad}-{K}+1"),
        Size("fragment", "16x16x8 as 2 x mma.m16n8k8", "tf32 inputs, fp32 accumulators"),
        Size(
            "k padding",
            f"{ckk} -> {kpad} ({100.0 * (kpad - ckk) / kpad:.1f}% zeros)",
            f"C*K*K rounded up to {KSTEP}; padding rows read a zero word",
        ),
        Size(
            "band",
            f"{rows} output rows = {pixels} pixels",
            f"{groups} groups of 8, {bands} band(s) per image",
        ),
        Size(
            "input band",
            f"{C} x {hp} x {row_stride} floats",
            f"C x (rows+K-1) x (W+2*pad{'+1' if row_stride != wp else ''}), zero halo stored, + 1 zero plane",
        ),
        Size(
            "A, swizzled",
            f"{steps * fm * 32 * 4} floats",
            f"{steps} k steps x {fm} m16 fragments x 32 lanes x 4",
        ),
        Size(
            "__shared__",
            f"{nbytes} B",
            "band + zero plane + A + tap table (int2 per step and lane group)",
        ),
        Size(
            "block",
            f"{threads} threads",
            f"{warps} warps, each {fn} n8 groups x {fm} m16 fragments per pass",
        ),
    ]
    launch = Launch(
        v.kernel_name(shape),
        (Role.X, Role.W, *y_args(shape)),
        (threads, 1, 1),
        (bands, 1, 0),
        2,
        1,
        1,
        dynamic,
    )
    return Plan(
        shape=shape,
        variant=v,
        template="gemm/mmatile.cu.j2",
        launches=(launch,),
        static_smem=static,
        dynamic_smem=dynamic,
        const_bytes=0,
        weight_format="f32",
        sizes=tuple(sizes),
        context=ctx,
    )


@dataclass(frozen=True, kw_only=True)
class Mmatile(Variant):
    key = "mmatile"
    templates = ("gemm/mmatile.cu.j2",)
    family = "gemm"
    description = (
        "tensor cores (mma.sync) reading B fragments straight from a shared-memory band "
        "of the input"
    )
    # Its stores load the bias once per fragment row: loaded per store, ptxas spilled
    # the kernel (C=20 M=20 K=3 bias relu: 255 registers and 24 B spilled, 95 without).
    serves = EPILOGUE
    precisions = (Precision.TF32,)
    tensor_core = True

    tile: int = BAND

    def plan(self, problem):
        return plan_mmatile(problem, self)

    @classmethod
    def fit(cls, problem, seed):
        """The tallest band that fits."""
        return tallest_planned(problem, lambda r: replace(seed, tile=r), problem.Ho)

    @classmethod
    def build(cls, problem, precision, given):
        if "tile" in given:  # the search for a band that fits is only for a default
            return cls(precision=precision or cls.precisions[0], **given)
        return super().build(problem, precision, given)

    @classmethod
    def space(cls, problem, precision):
        Ho = problem.Ho
        rows = sorted({Ho, -(-Ho // 2), -(-Ho // 3), -(-Ho // 4), 8, 4})
        return [cls(tile=r, precision=precision) for r in rows]
