"""``dwlane``: depthwise layers in channels-last (MobileNet's and EfficientNet's 3x3 and
5x5 windows, ConvNeXt's 7x7): each channel convolved with a window of its own, nothing
summed across channels.

A planar kernel given NHWC tensors reads one channel's pixels C values apart: a
2-byte word of every 32-byte sector it fetches (``tiled`` in bf16 NHWC).  Here a thread
takes ``vec`` adjacent channels (16 bytes where C allows: 8 16-bit values or 4 fp32) of
a run of ``pixels`` adjacent outputs of one row, and the threads beside it take the
next channels of the same run, so that a warp loads and stores whole words at
consecutive addresses.  For each window row the run's input columns are loaded once
each and feed every output and tap that reads them (``pixels`` + the window's reach,
at the stride); the weights come as [tap][channel] in fp32 (``ckkm``), a tap's
channels of the thread in 16-byte loads that the block's threads share in L1.  Sums
are fp32; the epilogue (bias, ReLU) is applied on the way out.  Dgrad at stride 1 is
the forward convolution of dy with the flipped windows (``ConvProblem.dgrad_view``),
depthwise again; at a larger stride each dx pixel gathers the dy pixels whose taps
reach it, with no inserted zeros: a run starts at a multiple of the stride, so which
of its outputs a tap reaches is known to the planner, and only the row's phase is
tested at run time."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import SpecError
from ..plan.common import Launch, Plan, Size, ceil_div, launch_bounds, shape_context, y_args
from ..shapes import Act, DType, Feature, Op, TensorLayout
from ..tensors import Role
from ..variants import EPILOGUE, GEOMETRY, Count, Variant, param

THREADS = (64, 128, 256)
MAX_PIXELS = 8
# fp32 values a thread keeps: the run's sums and one window row's weights (ptxas
# holds the rest in a few more); past this the sums would spill
MAX_KEPT = 160


def vector_widths(dtype: DType) -> tuple[int, ...]:
    """Channels a thread may take, widest first: 16, 8 or 4 bytes of them."""
    return (4, 2, 1) if dtype is DType.FP32 else (8, 4, 2)


def channel_words(dtype: DType, vec: int) -> dict:
    """How a word of ``vec`` channels loads (common/vec_load.j2): the 32-bit words in it
    (``words``) and its type (``wtype``)."""
    if dtype is DType.FP32:
        return dict(words=vec, wtype="float" if vec == 1 else f"float{vec}")
    words = max(1, vec // 2)  # 16-bit values two a 32-bit word
    return dict(words=words, wtype={1: "unsigned", 2: "uint2", 4: "uint4"}[words])


def depthwise(p) -> bool:
    """One channel a group and one map a channel: what dwlane computes."""
    return p.groups == p.C == p.M


@dataclass(frozen=True, kw_only=True)
class Dwlane(Variant):
    key = "dwlane"
    templates = ("direct/dwlane.cu.j2",)
    family = "direct"
    description = (
        "depthwise layers in channels-last: a thread takes adjacent channels of a run of "
        "outputs, a warp whole words at consecutive addresses, fp32 sums"
    )
    serves = GEOMETRY | EPILOGUE | {Feature.DTYPE16, Feature.NHWC}

    vec: int = param(8, Count("v"), "dwlane: adjacent channels a thread takes")
    pixels: int = param(4, Count("p"), "dwlane: adjacent outputs of a row a thread takes")
    threads: int = param(128, Count("t"), "dwlane: threads per block")

    ops = frozenset({Op.FPROP, Op.DGRAD})

    def plan(self, problem):
        return plan_dwlane(problem, self)

    @classmethod
    def problem_for(cls, problem):
        """dgrad at stride 1 through its forward view, where it has one; else itself
        (the gather)."""
        if problem.op is Op.DGRAD and problem.stride == (1, 1):
            try:
                return problem.dgrad_view()
            except SpecError:  # padding past the window's reach: the gather takes it
                return problem
        return super().problem_for(problem)

    @classmethod
    def fit(cls, problem, seed):
        """The widest channel vector C allows, runs of up to 4 outputs (fewer where the
        window is wide), 128 threads a block."""
        p = problem
        vec = next((v for v in vector_widths(p.dtype) if p.C % v == 0), None)
        if vec is None:
            raise SpecError(f"dwlane takes channels in pairs at least: C={p.C} is odd")
        step = run_step(p)
        pixels = max(step, 4 // step * step)
        while pixels > step and kept(vec, pixels, p.S) > MAX_KEPT:
            pixels -= step
        return replace(seed, vec=vec, pixels=min(pixels, out_width(p)), threads=128)

    @classmethod
    def space(cls, problem, precision):
        base = cls.default(problem, precision)
        widths = [v for v in vector_widths(problem.dtype) if problem.C % v == 0]
        step = run_step(problem)
        out = []
        for vec in widths[:2]:
            for pixels in sorted({1, 2, 4, 8, base.pixels}):
                pixels = min(max(step, pixels // step * step), out_width(problem))
                for threads in THREADS:
                    out.append(replace(base, vec=vec, pixels=pixels, threads=threads))
        return list(dict.fromkeys(out))


def gathers(p) -> bool:
    """Whether the planned problem is dgrad computed as a gather (not a forward view)."""
    return p.op is Op.DGRAD


def out_width(p) -> int:
    """The width of the rows the kernel writes: y's, or dx's for the gather."""
    return p.W if gathers(p) else p.Wo


def run_step(p) -> int:
    """What a run's length is a multiple of: the gather's runs start at a multiple of
    the column stride, so that the taps reaching each output are the planner's."""
    return p.stride[1] if gathers(p) else 1


def kept(vec: int, pixels: int, S: int) -> int:
    """fp32 values a thread keeps at once: its sums and one window row's weights."""
    return vec * (pixels + S)


def columns(p, pixels: int) -> list[tuple[int, list[tuple[int, int]]]]:
    """A run's input columns of one window row, each as (its offset from the run's
    first, the (output, tap) pairs that read it), in order.  Forward: output j's tap s
    reads x column j * sw + s * dw of the run's reach.  Gather: dx column j (of a run
    starting at a multiple of sw) takes tap s from dy column (j + pl - s * dw) / sw past
    the run's first, where that divides; the offset may be negative."""
    (_, sw), (_, dw), pl = p.stride, p.dil, p.pads[2]
    users: dict[int, list[tuple[int, int]]] = {}
    for j in range(pixels):
        for s in range(p.S):
            if not gathers(p):
                users.setdefault(j * sw + s * dw, []).append((j, s))
            elif (j + pl - s * dw) % sw == 0:
                users.setdefault((j + pl - s * dw) // sw, []).append((j, s))
    return sorted(users.items())


def plan_dwlane(p, v) -> Plan:
    # 1. limits
    if p.layout is not TensorLayout.NHWC:
        raise SpecError(
            "dwlane reads channels-last tensors (adjacent channels a thread): use "
            "layout=nhwc in the shape spec, or --strategy tiled for NCHW"
        )
    if not depthwise(p):
        raise SpecError(
            f"dwlane computes depthwise layers (groups = C = M); groups={p.groups}, "
            f"C={p.C}, M={p.M}: use --strategy tcgemm or tiled"
        )
    widths = vector_widths(p.dtype)
    if v.vec not in widths:
        raise SpecError(
            f"dwlane v{v.vec}: a thread takes {', '.join(map(str, widths))} channels of "
            f"{p.dtype.value} (16, 8 or 4 bytes)"
        )
    if p.C % v.vec:
        raise SpecError(f"dwlane v{v.vec}: C={p.C} is no multiple of it; choose --vec 2")
    if not 1 <= v.pixels <= MAX_PIXELS:
        raise SpecError(f"dwlane p{v.pixels}: a run is 1 to {MAX_PIXELS} outputs")
    if v.pixels > out_width(p):
        raise SpecError(
            f"dwlane p{v.pixels}: a row has only {'W' if gathers(p) else 'Wo'}="
            f"{out_width(p)} outputs"
        )
    if v.pixels % run_step(p) and v.pixels < out_width(p):
        raise SpecError(
            f"dwlane p{v.pixels}: dgrad's runs are multiples of the column stride "
            f"{run_step(p)}; choose --pixels {run_step(p) * max(1, v.pixels // run_step(p))}"
        )
    if kept(v.vec, v.pixels, p.S) > MAX_KEPT:
        raise SpecError(
            f"dwlane v{v.vec} p{v.pixels}: {kept(v.vec, v.pixels, p.S)} sums and weights a "
            f"thread for a {p.S}-wide window, over {MAX_KEPT}; choose fewer --pixels"
        )
    if v.threads not in THREADS:
        raise SpecError(f"dwlane t{v.threads}: threads per block must be one of {THREADS}")

    # 2. work: a unit is (image, output row, run, channel vector), channels fastest
    gather = gathers(p)
    out_h, out_w = (p.H, p.W) if gather else (p.Ho, p.Wo)
    in_h, in_w = (p.Ho, p.Wo) if gather else (p.H, p.W)
    per_row = ceil_div(out_w, v.pixels)
    vectors = p.C // v.vec
    units = out_h * per_row * vectors
    (dh, _), (pt, _, pl, _) = p.dil, p.pads
    ctx = dict(
        shape_context(p),
        R=p.R,
        S=p.S,
        vec=v.vec,
        P=v.pixels,
        per_row=per_row,
        vectors=vectors,
        units=units,
        threads=v.threads,
        # forward: window row r reads x row ho * sh + (r * dh - pt); gather: dx row hi
        # takes dy row (hi + pt - r * dh) / sh where that divides
        rows=[(r, pt - r * dh if gather else r * dh - pt) for r in range(p.R)],
        cols=columns(p, v.pixels),
        pl=pl,
        gather=gather,
        bias=p.bias and not gather,  # dgrad has no epilogue
        relu=p.act is Act.RELU and not gather,
        out_h=out_h,
        out_w=out_w,
        in_h=in_h,
        in_w=in_w,
        ragged=out_w % v.pixels != 0,
        x_image=in_h * in_w * p.C,
        in_row=in_w * p.C,
        out_row=out_w * p.C,
        # the gather's first dy column of a run: the run's first dx column / sw
        iw_per_run=v.pixels // p.stride[1] if per_row > 1 else 0,
        in_rows_span=p.stride[0] * in_h,  # the gather's row numerators below this divide in
        # each window row's weight loads: (tap s, first channel q, offset, floats 4, 2 or 1)
        w_loads=[
            [
                (s, q, (r * p.S + s) * p.C + q, min(4, v.vec - q))
                for s in range(p.S)
                for q in range(0, v.vec, 4)
            ]
            for r in range(p.R)
        ],
        # a thread's channels at a pixel: one load and one store of this type
        **channel_words(p.dtype, v.vec),
        elem={DType.FP16: "f16", DType.BF16: "bf16"}.get(p.dtype, ""),
        **launch_bounds(v.threads),
    )
    roles = (Role.DY, Role.W, Role.DX) if gather else (Role.X, Role.W, *y_args(p))
    launch = Launch(
        v.kernel_name(p),
        (*roles, Role.BATCH),
        (v.threads, 1, 1),
        (1, 1, 1),
        0,
        units,
        v.threads,
    )
    nbytes = v.vec * p.dtype.bytes
    sizes = (
        Size(
            "thread",
            f"{v.vec} channels x {v.pixels} outputs",
            f"one {nbytes}-byte word a pixel; {per_row} run(s) a row, {vectors} words a pixel",
        ),
        Size(
            "registers",
            f"{v.pixels * v.vec} sums + {p.S * v.vec} weights",
            f"a window row's weights at a time; {len(ctx['cols'])} input columns a row",
        ),
        Size(
            "grid",
            f"{units} threads an image",
            f"{'H' if gather else 'Ho'} x runs x words = {out_h}*{per_row}*{vectors}",
        ),
    )
    if gather:
        sizes = (
            Size(
                "dgrad",
                f"gather at stride {p.stride[0]}x{p.stride[1]}",
                "dx pixel (hi, wi) takes dy (hi + pt - r*dh, wi + pl - s*dw) / stride where "
                "both divide: no inserted zeros",
            ),
            *sizes,
        )
    return Plan(
        shape=p,
        variant=v,
        template="direct/dwlane.cu.j2",
        launches=(launch,),
        static_smem=0,
        dynamic_smem=0,
        const_bytes=0,
        weight_format="ckkm",
        sizes=sizes,
        context=ctx,
    )
