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
tested at run time.

Narrow groups (ResNeXt's 3x3 layers of 4 or 8 channels a group, whose GEMMs leave a
tensor-core tile's maps mostly empty): a thread's ``vec`` maps lie in one group, and at
each input pixel it loads the group's channels in one word (4 to 16 bytes) and adds
each one's products into all its maps' sums; a window row's weights are [tap][channel
of the group][map], the maps adjacent (``ckkm``).  Dgrad at stride 1 runs so on its
forward view; the gather past it takes a thread's dx channels in one group and loads
the group's dy maps in one word, the weights [map][row][tap][channel of the group]
(``mrsc.fp32``), a tap's channels adjacent."""

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


def sides(p) -> tuple[int, int, int, int]:
    """(channels written, of them a group's, channels read, of them a group's): the
    forward pass writes maps from channels, the gather dx's channels from dy's maps."""
    if gathers(p):
        return p.C, p.Cg, p.M, p.Mg
    return p.M, p.Mg, p.C, p.Cg


def narrow_groups(p) -> bool:
    """Groups of a few channels (not depthwise) that a thread loads in one word at a
    pixel (``group_word``): dwlane's grouped form."""
    return p.groups > 1 and not depthwise(p) and group_word(p) is not None


def group_word(p) -> dict | None:
    """How a group's channels read load at a pixel (``channel_words``): 4, 8 or 16
    bytes of them; None where they are not such a word (fp32's 1, 2 or 4 channels,
    16-bit's 2, 4 or 8)."""
    widths = (1, 2, 4) if p.dtype is DType.FP32 else (2, 4, 8)
    read = sides(p)[3]
    return channel_words(p.dtype, read) if read in widths else None


def served_words(p) -> int:
    """What a thread's channel vector must divide: a depthwise layer's channels, a
    grouped one's channels written a group (a thread's lie in one group)."""
    written, group, _, _ = sides(p)
    return group if narrow_groups(p) else written


@dataclass(frozen=True, kw_only=True)
class Dwlane(Variant):
    key = "dwlane"
    templates = ("direct/dwlane.cu.j2",)
    family = "direct"
    description = (
        "depthwise layers and groups of a few channels in channels-last: a thread takes "
        "adjacent channels (maps of one group) of a run of outputs, a warp whole words at "
        "consecutive addresses, fp32 sums"
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
        """The widest channel vector C (a group's maps) allows whose sums and window row
        fit the registers, runs of up to 4 outputs (fewer where the window is wide), 128
        threads a block."""
        p = problem
        cg, step = group_channels(p), run_step(p)
        fits = [v for v in vector_widths(p.dtype) if served_words(p) % v == 0]
        if not fits:
            what = "a group's maps" if narrow_groups(p) else "C"
            raise SpecError(
                f"dwlane takes channels in pairs at least: {what}={served_words(p)} is odd"
            )
        # the widest vector whose sums and window row fit (the plan says why where none does)
        vec = next((v for v in fits if kept(v, step, p.S, cg) <= MAX_KEPT), fits[-1])
        pixels = max(step, 4 // step * step)
        while pixels > step and kept(vec, pixels, p.S, cg) > MAX_KEPT:
            pixels -= step
        return replace(seed, vec=vec, pixels=min(pixels, out_width(p)), threads=128)

    @classmethod
    def space(cls, problem, precision):
        base = cls.default(problem, precision)
        widths = [v for v in vector_widths(problem.dtype) if served_words(problem) % v == 0]
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


def kept(vec: int, pixels: int, S: int, Cg: int = 1) -> int:
    """fp32 values a thread keeps at once: its sums and one window row's weights (of
    each of a group's ``Cg`` channels)."""
    return vec * (pixels + S * Cg)


def group_channels(p) -> int:
    """The channels a thread reads at a pixel for each one it writes: a narrow group's,
    else one (depthwise)."""
    return sides(p)[3] if narrow_groups(p) else 1


def window_row_loads(p, v, r: int, grouped: bool) -> list[tuple[str, int, str, int]]:
    """Window row r's weights of a thread, loaded 4, 2 or 1 floats at a time: (the
    registers' row ``wr[s]``, or ``wr[s][i]`` for a narrow group's channel read i; its
    first float q; the address; the floats).  Depthwise ([row][tap][channel], ckkm) from
    ``w`` at the thread's first channel c0; grouped from its weights ``wg``, the forward
    pass's [channel read][row][tap][map] (ckkm) and the gather's [map][row][tap][channel
    of the group] (mrsc), the thread's adjacent."""
    runs = [(q, min(4, v.vec - q)) for q in range(0, v.vec, 4)]
    if not grouped:
        return [
            (f"wr[{s}]", q, f"w + {(r * p.S + s) * p.C + q} + c0", n)
            for s in range(p.S)
            for q, n in runs
        ]
    stride = p.Cg if gathers(p) else p.M  # between adjacent taps' weights
    return [
        (f"wr[{s}][{i}]", q, f"wg + {((i * p.R + r) * p.S + s) * stride + q}", n)
        for s in range(p.S)
        for i in range(sides(p)[3])
        for q, n in runs
    ]


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
    grouped = narrow_groups(p)
    if not depthwise(p) and not grouped:
        raise SpecError(
            f"dwlane computes depthwise layers (groups = C = M) and groups of a few "
            f"channels (a 4- to 16-byte word of them); groups={p.groups}, C={p.C}, "
            f"M={p.M}: use --strategy tcgemm or tiled"
        )
    widths = vector_widths(p.dtype)
    if v.vec not in widths:
        raise SpecError(
            f"dwlane v{v.vec}: a thread takes {', '.join(map(str, widths))} channels of "
            f"{p.dtype.value} (16, 8 or 4 bytes)"
        )
    written, out_g, read, in_g = sides(p)
    if grouped and out_g % v.vec:
        raise SpecError(
            f"dwlane v{v.vec}: a thread's channels lie in one group; the {out_g} it writes "
            "a group are no multiple of them: choose a --vec that divides them"
        )
    if written % v.vec:
        raise SpecError(f"dwlane v{v.vec}: C={written} is no multiple of it; choose --vec 2")
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
    cg = group_channels(p)
    if kept(v.vec, v.pixels, p.S, cg) > MAX_KEPT:
        raise SpecError(
            f"dwlane v{v.vec} p{v.pixels}: {kept(v.vec, v.pixels, p.S, cg)} sums and weights "
            f"a thread for a {p.S}-wide window{f' of {cg} channels' if grouped else ''}, "
            f"over {MAX_KEPT}; choose fewer --pixels{' or a narrower --vec' if grouped else ''}"
        )
    if v.threads not in THREADS:
        raise SpecError(f"dwlane t{v.threads}: threads per block must be one of {THREADS}")

    # 2. work: a unit is (image, output row, run, channel vector), channels fastest
    gather = gathers(p)
    out_h, out_w = (p.H, p.W) if gather else (p.Ho, p.Wo)
    in_h, in_w = (p.Ho, p.Wo) if gather else (p.H, p.W)
    per_row = ceil_div(out_w, v.pixels)
    vectors = written // v.vec
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
        x_image=in_h * in_w * read,
        in_row=in_w * read,
        in_C=read,
        out_row=out_w * written,
        out_C=written,
        grouped=grouped,
        out_g=out_g,
        in_g=in_g,
        # a group's channels read at a pixel: one load of this word (grouped)
        group=group_word(p) if grouped else None,
        # grouped: where the thread's weights start, from its first channel written c0
        # (ckkm's [channel][row][tap][map] forward, the gather's [map][row][tap][channel
        # of the group], mrsc)
        w_base=f"c0 / {out_g} * {p.Mg * p.R * p.S * p.Cg} + c0 % {out_g}" if gather else "c0",
        # the gather's first dy column of a run: the run's first dx column / sw
        iw_per_run=v.pixels // p.stride[1] if per_row > 1 else 0,
        in_rows_span=p.stride[0] * in_h,  # the gather's row numerators below this divide in
        # each window row's weight loads: (the registers' row, its first float q, the
        # address, floats 4, 2 or 1)
        w_loads=[window_row_loads(p, v, r, grouped) for r in range(p.R)],
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
            f"{v.pixels * v.vec} sums + {p.S * cg * v.vec} weights",
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
        weight_format="mrsc.fp32" if grouped and gather else "ckkm",
        sizes=sizes,
        context=ctx,
    )


# dwrows' bands: output rows a thread takes, in the tune space
BANDS = (2, 3, 4)


@dataclass(frozen=True, kw_only=True)
class Dwrows(Dwlane):
    """``dwlane`` for depthwise layers with each thread taking ``rows`` output rows of its
    run (a band): an input row of the band's reach is loaded once for every output row
    and window row that reads it, where ``dwlane`` loads it again for each output row.
    A 3x3 window at stride 1 then loads (rows + 2) input rows for ``rows`` output rows
    instead of 3 each; the whole window's weights stay in registers.  On the H200
    ``dwlane``'s 3x3 bf16 forward pass of mobilenet_v2's first depthwise layer was bound
    by the L1 cache's throughput (75% of its peak, the DRAM at 29%; Nsight Compute), its
    input loaded 6 times for each output pixel at 2 outputs a run.  Depthwise only (no
    narrow groups), forward and the stride-1 dgrad's forward view; the strided dgrad's
    gather stays ``dwlane``'s."""

    key = "dwrows"
    templates = ("direct/dwrows.cu.j2",)
    description = (
        "depthwise layers in channels-last, a thread taking a band of output rows of a run "
        "of outputs: each input row the band reads loaded once, the window's weights in "
        "registers, fp32 sums"
    )

    rows: int = param(2, Count("r"), "dwrows: output rows a thread takes (a band)")

    def plan(self, problem):
        return plan_dwrows(problem, self)

    @classmethod
    def fit(cls, problem, seed):
        """dwlane's vector and threads; two rows a band, and runs of up to 4 outputs
        (fewer where the sums and the window's weights would pass the registers)."""
        if not depthwise(problem) or gathers(problem):
            return replace(seed, rows=2)  # the plan says why not
        fits = [v for v in vector_widths(problem.dtype) if problem.C % v == 0]
        vec = next((v for v in fits if band_kept(problem, v, 2, 1) <= MAX_KEPT), None)
        if vec is None:
            return replace(seed, rows=2)
        pixels = 4
        while pixels > 1 and band_kept(problem, vec, 2, pixels) > MAX_KEPT:
            pixels -= 1
        return replace(seed, vec=vec, pixels=min(pixels, problem.Wo), threads=128, rows=2)

    @classmethod
    def space(cls, problem, precision):
        base = cls.default(problem, precision)
        widths = [v for v in vector_widths(problem.dtype) if problem.C % v == 0]
        out = [
            replace(base, vec=vec, pixels=min(pixels, problem.Wo), threads=threads, rows=rows)
            for vec in widths[:2]
            for pixels in (1, 2, 4)
            for rows in BANDS
            for threads in THREADS
            if band_kept(problem, vec, rows, pixels) <= MAX_KEPT
        ]
        return list(dict.fromkeys(out))


def band_kept(p, vec: int, rows: int, pixels: int) -> int:
    """fp32 values a dwrows thread keeps at once: its band's sums and the whole window's
    weights (``kept`` for dwlane's one window row)."""
    return kept(vec, rows * pixels, p.R * p.S)


def band_rows(p, rows: int) -> list[tuple[int, list[tuple[int, int]]]]:
    """A band's input rows, each as (its offset from oh0 * sh, the band's first output
    row at the stride, and the (output row, window row) pairs that read it), in order:
    output row q's window row r reads input row oh0 * sh + q * sh + r * dh - pt."""
    (sh, _), (dh, _), pt = p.stride, p.dil, p.pads[0]
    users: dict[int, list[tuple[int, int]]] = {}
    for q in range(rows):
        for r in range(p.R):
            users.setdefault(q * sh + r * dh - pt, []).append((q, r))
    return sorted(users.items())


def plan_dwrows(p, v) -> Plan:
    # 1. limits: dwlane's, then the band's own
    if not depthwise(p) or gathers(p):
        why = (
            "the strided dgrad gathers (choose --strategy dwlane)"
            if gathers(p)
            else f"it computes depthwise layers (groups = C = M), not groups={p.groups}, "
            f"C={p.C}, M={p.M} (choose --strategy dwlane)"
        )
        raise SpecError(f"dwrows: {why}")
    lane = Dwlane(vec=v.vec, pixels=v.pixels, threads=v.threads, precision=v.precision)
    base = plan_dwlane(p, lane)  # its limits and its context, which the band's extends
    if not 2 <= v.rows <= p.Ho:
        raise SpecError(f"dwrows r{v.rows}: a band is 2 to Ho={p.Ho} output rows (one is dwlane's)")
    window = p.R * p.S
    if band_kept(p, v.vec, v.rows, v.pixels) > MAX_KEPT:
        raise SpecError(
            f"dwrows v{v.vec} p{v.pixels} r{v.rows}: {v.vec * v.rows * v.pixels} sums and "
            f"{v.vec * window} weights a thread, over {MAX_KEPT}; choose fewer --rows or "
            "--pixels, or a narrower --vec"
        )
    # 2. work: a unit is (image, band, run, channel vector), channels fastest
    ctx = base.context
    bands = ceil_div(p.Ho, v.rows)
    units = bands * ctx["per_row"] * ctx["vectors"]
    ctx = dict(
        ctx,
        Q=v.rows,
        bands=bands,
        units=units,
        in_rows=band_rows(p, v.rows),
        ragged_rows=p.Ho % v.rows != 0,
        w_loads=[
            (dst.replace("wr[", f"wr[{r}][", 1), q, at, n)
            for r in range(p.R)
            for dst, q, at, n in window_row_loads(p, v, r, False)
        ],
    )
    launch = replace(base.launches[0], kernel=v.kernel_name(p), per_image=units)
    sizes = (
        Size(
            "thread",
            f"{v.vec} channels x {v.rows} rows x {v.pixels} outputs",
            f"one {v.vec * p.dtype.bytes}-byte word a pixel; {ctx['per_row']} run(s) and "
            f"{bands} band(s) an image's rows, {ctx['vectors']} words a pixel",
        ),
        Size(
            "registers",
            f"{v.rows * v.pixels * v.vec} sums + {window * v.vec} weights",
            f"the window's weights at once; {len(ctx['in_rows'])} input rows a band, "
            f"{len(ctx['cols'])} input columns a row",
        ),
        Size(
            "grid",
            f"{units} threads an image",
            f"bands x runs x words = {bands}*{ctx['per_row']}*{ctx['vectors']}",
        ),
    )
    return replace(
        base,
        variant=v,
        template="direct/dwrows.cu.j2",
        launches=(launch,),
        sizes=sizes,
        context=ctx,
    )
