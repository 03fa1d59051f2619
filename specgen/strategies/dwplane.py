"""``dwplane``: depthwise layers in NCHW (MobileNet's and EfficientNet's fp32 models), a
thread taking a run of adjacent outputs of one row of one channel's plane.

A depthwise layer sums a window's taps of one channel: nothing across channels, so
nothing for a tile of maps to share.  ``direct`` and ``tiled`` give a block a tile of a
plane and walk it map by map; on the small planes of a network's last layers (7x7
pixels) a block of 64 threads then holds 49 outputs and the grid a block per plane and
image: mobilenet_v2's 960-channel layer at B=64 launched 61440 blocks and took 0.041 ms
against cuDNN's 0.030 (H200, 2026-11-29).  Here the outputs are one flat run: thread
u takes run u % runs of output row u / runs, the rows of plane (image, channel) after
one another, so a warp's threads take neighbouring runs of one plane (or of two
neighbouring planes) and their loads and stores fall on neighbouring words whatever
the plane's size.  A thread keeps its channel's whole window of weights in registers
(PyTorch's own [C][1][R][S] layout, no packing), and for each window row loads each
input column its run reads once, feeding every output and tap that reads it.  Sums are
fp32; the epilogue (bias, ReLU) is applied on the way out.  Dgrad at stride 1 is the
forward convolution of dy with the flipped windows (``ConvProblem.dgrad_view``),
depthwise again."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import SpecError
from ..plan.common import Launch, Plan, Size, ceil_div, launch_bounds, shape_context, y_args
from ..shapes import Act, Feature, Op
from ..tensors import Role
from ..variants import EPILOGUE, GEOMETRY, Count, Variant, param
from .dwlane import MAX_PIXELS, THREADS, columns, depthwise

MAX_WINDOW = 49  # weights a thread keeps (up to 7x7)


@dataclass(frozen=True, kw_only=True)
class Dwplane(Variant):
    key = "dwplane"
    templates = ("direct/dwplane.cu.j2",)
    family = "direct"
    description = (
        "depthwise layers in NCHW: a thread takes a run of outputs of one row of a "
        "channel's plane, the planes' rows one flat grid, the window's weights in "
        "registers, fp32 sums"
    )
    serves = GEOMETRY | EPILOGUE | {Feature.DTYPE16}
    ops = frozenset({Op.FPROP})  # dgrad at stride 1 through its forward view

    pixels: int = param(2, Count("p"), "dwplane: adjacent outputs of a row a thread takes")
    threads: int = param(256, Count("t"), "dwplane: threads per block")

    def plan(self, problem):
        return plan_dwplane(problem, self)

    @classmethod
    def fit(cls, problem, seed):
        """At stride 1 runs of 4 outputs in blocks of 256 threads on rows wider than 28,
        whole rows up to 8 outputs in blocks of 64 on narrower ones; strided, runs of 2
        (1 on rows of up to 7) in blocks of 128.  mobilenet_v2's fp32 layers at B=64
        (H200, 2026-11-30, tuned over the space): 112- and 56-wide rows p4 t256, 28- and
        14-wide p8 t64, 7-wide p7 t64; strided p2 t128 to 28-wide outputs, p1 t128 at 7."""
        p = problem
        if p.stride == (1, 1):
            wide = p.Wo > 28
            return replace(seed, pixels=4 if wide else min(8, p.Wo), threads=256 if wide else 64)
        return replace(seed, pixels=1 if p.Wo <= 7 else 2, threads=128)

    @classmethod
    def space(cls, problem, precision):
        base = cls.default(problem, precision)
        out = [
            replace(base, pixels=min(pixels, problem.Wo), threads=threads)
            for pixels in (1, 2, 4, 8)
            for threads in THREADS
        ]
        return list(dict.fromkeys(out))


def plan_dwplane(p, v) -> Plan:
    # 1. limits (NHWC is not among what it serves: make_plan refuses it first)
    if not depthwise(p):
        raise SpecError(
            f"dwplane computes depthwise layers (groups = C = M); groups={p.groups}, "
            f"C={p.C}, M={p.M}: use --strategy direct or tiled"
        )
    if p.R * p.S > MAX_WINDOW:
        raise SpecError(
            f"dwplane keeps a channel's window in registers: {p.R}x{p.S} is over "
            f"{MAX_WINDOW} taps; use --strategy direct"
        )
    if not 1 <= v.pixels <= MAX_PIXELS:
        raise SpecError(f"dwplane p{v.pixels}: a run is 1 to {MAX_PIXELS} outputs")
    if v.pixels > p.Wo:
        raise SpecError(f"dwplane p{v.pixels}: a row has only Wo={p.Wo} outputs")
    if v.threads not in THREADS:
        raise SpecError(f"dwplane t{v.threads}: threads per block must be one of {THREADS}")

    # 2. work: a unit is (image, channel, output row, run), runs fastest
    per_row = ceil_div(p.Wo, v.pixels)
    units = p.C * p.Ho * per_row
    (dh, _), (pt, _, _, _) = p.dil, p.pads
    ctx = dict(
        shape_context(p),
        P=v.pixels,
        per_row=per_row,
        units=units,
        threads=v.threads,
        # window row r reads x row oh * sh + (r * dh - pt)
        rows=[(r, r * dh - pt) for r in range(p.R)],
        cols=columns(p, v.pixels),
        ragged=p.Wo % v.pixels != 0,
        bias=p.bias,
        relu=p.act is Act.RELU,
        **launch_bounds(v.threads),
    )
    launch = Launch(
        v.kernel_name(p),
        (Role.X, Role.W, *y_args(p), Role.BATCH),
        (v.threads, 1, 1),
        (1, 1, 1),
        0,
        units,
        v.threads,
    )
    sizes = (
        Size(
            "thread",
            f"{v.pixels} outputs of a row",
            f"{per_row} run(s) a row; {len(ctx['cols'])} input columns a window row",
        ),
        Size("registers", f"{v.pixels} sums + {p.R * p.S} weights", "the channel's window"),
        Size(
            "grid",
            f"{units} threads an image",
            f"C x Ho x runs = {p.C}*{p.Ho}*{per_row}, runs fastest",
        ),
    )
    return Plan(
        shape=p,
        variant=v,
        template="direct/dwplane.cu.j2",
        launches=(launch,),
        static_smem=0,
        dynamic_smem=0,
        const_bytes=0,
        weight_format="f32",
        sizes=sizes,
        context=ctx,
    )
