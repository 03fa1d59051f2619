"""``wlane``: wgrad of channels-last layers with few maps a group (the autoencoder's
256 -> 3 output layer), one input channel a lane.

In NHWC a pixel's channels are adjacent, so a warp of 32 consecutive channels reads
one pixel's x in a single coalesced load, and every lane of a group reads the same dy
values (one broadcast).  Each thread keeps the sums of its channel for every map of its
group and every tap (maps x R x S in registers) over its slice of the (image, output
row) walk; a row is cut into runs of ``pixels`` adjacent outputs, unrolled with literal
offsets, so that the x values under a run's window are loaded once per tap row and
feed maps x S x pixels FMAs.  Loads that fall in the padding are not emitted.  A wide
row's middle runs, which read no padding, are one loop (``UNROLLED_ROW_MAX``).  The
slices' partial sums are added in order by the kernel wband and wsplit use
(``backward/reduce.j2``), so the result is deterministic; db rides along, kept by the
first channel of each group.

Depthwise layers (one channel and one map a group: MobileNet's and EfficientNet's) may
take ``vec`` adjacent channels a thread, as dwlane does forward: a warp's loads of x and
of dy are then words of 16, 8 or 4 bytes a lane at consecutive addresses, where one
channel a lane moves 2 bytes a lane in bf16.  The words are in the tune space only: on
most of efficientnet_b0's depthwise wgrads they ran slower (``Wlane.fit``).

wband, which owns one channel a block, reads a channels-last x one element every C;
wgemm's smallest map tile is 32.  Neither suits three maps in NHWC, where the operator
copied both tensors to NCHW for wband (0.33 ms of wband and a tenth of the fp32 step's
copies, H200)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from ..errors import SpecError
from ..plan.common import Launch, Plan, Size, ceil_div, launch_bounds
from ..shapes import Op, TensorLayout
from ..tensors import Role
from ..variants import EVERY_FEATURE, Count, Variant, param
from .dwlane import channel_words, depthwise, vector_widths
from .wsplit import second_pass, sums_context

TARGET_BLOCKS = 1056  # eight blocks on each of the H200's 132 SMs
MAX_ACCUMULATORS = 64  # maps x R x S sums a thread keeps (db's beside them)
MAX_RUN_VALUES = 32  # dy values of a run held at once (maps x pixels)
# The products a row's code holds unrolled (maps x outputs x taps, a word's channels aside)
# past which the runs of its middle, those whose window stays off the padding, are one
# loop: convnext_tiny's 96-channel 56x56 7x7 depthwise wgrad, 2744 of them, took NVRTC
# 39-41 s to compile unrolled on one core of a CPU and 75 s in a bench on an H200's
# host, 7 s looped, both 0.17 ms at B=32 (its 28x28 one, 1372, 8-10 s).  Every shipped
# wlane winner's rows hold at most 2016.
UNROLLED_ROW_MAX = 2048
THREADS = (32, 64, 128, 256)


@dataclass(frozen=True, kw_only=True)
class Wlane(Variant):
    key = "wlane"
    templates = ("backward/wlane.cu.j2",)
    family = "backward"
    description = (
        "wgrad of channels-last layers with few maps: one input channel a lane, every map "
        "and tap of it in registers over a slice of the rows, runs of outputs unrolled"
    )
    serves = EVERY_FEATURE
    ops = frozenset({Op.WGRAD})

    threads: int = param(128, Count("t"), "wlane: threads (channels) per block")
    pixels: int = param(8, Count("p"), "wlane: adjacent outputs of a row per unrolled run")
    splits: int = param(
        64, Count("s"), "wlane: slices of the (image, row) walk, one block row each"
    )
    vec: int = param(1, Count("v"), "wlane: adjacent channels a thread takes (depthwise layers)")

    def plan(self, problem):
        return plan_wlane(problem, self)

    @classmethod
    def fit(cls, problem, seed):
        """A block of the channels up to 64 (a warp at least: its tune on the autoencoder's
        256 -> 3 layer, B=128, found 64 0.126 ms against 128's 0.129, H200); runs of up to
        8 outputs, fewer where the maps would hold over 32 dy values; slices for eight
        blocks a SM.  One channel a lane, depthwise layers too: beside each shipped winner
        of six of efficientnet_b0's depthwise wgrads (bf16, B=64, H200), words of
        channels ran 1.1-2.1x slower on four, equal on one, and 15% faster on one (96
        channels at stride 2); the tune space holds them."""
        p = problem
        threads = words_block(p.C)
        pixels = max(1, min(8, p.Wo, MAX_RUN_VALUES // max(1, p.Mg)))
        tiles = ceil_div(p.C, threads)
        # Not capped by the problem's default batch: an inline spec's is 1, and the same
        # kernel runs at any batch (a slice without rows adds zeros).
        splits = max(1, min(TARGET_BLOCKS // tiles, 65535))
        return replace(seed, threads=threads, pixels=pixels, splits=splits, vec=1)

    @classmethod
    def space(cls, problem, precision):
        base = cls.default(problem, precision)
        out = []
        for vec in word_widths(problem)[:2] if _words_allowed(problem) else [1]:
            # one channel a lane and the widest word; a word's block holds its words up to 64
            blocks = {64, 128, base.threads if vec == 1 else words_block(problem.C // vec)}
            for threads in sorted(blocks):
                for pixels in sorted({4, 8, base.pixels}):
                    pixels = min(pixels, problem.Wo, MAX_RUN_VALUES // max(1, problem.Mg * vec))
                    for splits in sorted({base.splits // 2, base.splits, base.splits * 2}):
                        v = replace(base, threads=threads, pixels=max(1, pixels), vec=vec)
                        out.append(replace(v, splits=max(1, min(splits, 65535))))
        return list(dict.fromkeys(out))


def _words_allowed(p) -> bool:
    """Channel words serve depthwise layers without a bias (db is kept a channel a lane)."""
    return depthwise(p) and not p.bias


def word_widths(p) -> list[int]:
    """The channels a thread may take for ``p``: one, then the widest word that divides
    C and whose sums (taps a channel) fit the registers, then narrower ones."""
    taps = p.R * p.S
    fits = [w for w in vector_widths(p.dtype) if p.C % w == 0 and w * taps <= MAX_ACCUMULATORS]
    return [1] + [w for w in fits if w > 1]


def words_block(words: int) -> int:
    """The threads of a block for ``words`` channel words: up to 64 of them, a warp at least."""
    return next((t for t in THREADS if t >= min(words, 64)), 64)


def row_runs(p, pixels: int) -> list[dict]:
    """Each unrolled run of a row: its first output ``w0``, its ``count`` outputs, the
    x values it loads under its window (``loads``: (q, offset from the row's first
    pixel), q = j * sw + s * dw for output j and tap column s) and the products that
    read them (``fmas``: (j, s, q)); a column in the padding is neither loaded nor
    multiplied."""
    (sw, dw), out = (p.stride[1], p.dil[1]), []
    for w0 in range(0, p.Wo, pixels):
        count = min(pixels, p.Wo - w0)
        left = w0 * sw - p.pads[2]  # the input column of q = 0
        fmas = [
            (j, s, j * sw + s * dw)
            for j in range(count)
            for s in range(p.S)
            if 0 <= left + j * sw + s * dw < p.W
        ]
        loads = [(q, (left + q) * p.C) for q in sorted({q for _, _, q in fmas})]
        out.append(dict(w0=w0, count=count, dy_at=w0 * p.M, loads=loads, fmas=fmas))
    return out


def middle_runs(p, runs: list[dict]) -> tuple[int, int] | None:
    """The first and the count of a row's longest stretch of whole runs that read no
    padding (two or more), where the row's unrolled products pass
    ``UNROLLED_ROW_MAX``; else None.  Such runs differ only by where they start: one
    loop emits them."""
    if p.Mg * p.Wo * p.R * p.S <= UNROLLED_ROW_MAX:
        return None
    full = runs[0]["count"]
    whole = [r["count"] == full and len(r["fmas"]) == full * p.S for r in runs]
    best, at = None, 0
    for is_whole, stretch in itertools.groupby(whole):
        n = len(list(stretch))
        if is_whole and n >= 2 and (best is None or n > best[1]):
            best = (at, n)
        at += n
    return best


def row_pieces(p, runs: list[dict], middle: tuple[int, int] | None) -> list[dict]:
    """What the template emits for a row: each run with its offsets as literals, but
    ``middle``'s runs as one piece of ``times`` iterations whose offsets follow the
    loop's first output ``wl`` (x's first pixel ``xo``).  Offsets are text: the dy
    value of output j (``dy_at`` + j * M; ``dy_ats`` one a j) and each load's x."""
    out = []
    for i, run in enumerate(runs):
        if middle and middle[0] < i < sum(middle):
            continue
        if middle and i == middle[0]:
            out.append(
                dict(
                    run,
                    times=middle[1],
                    stop=run["w0"] + middle[1] * run["count"],
                    xo=f"wl * {p.stride[1] * p.C} - {p.pads[2] * p.C}",
                    dy_at=f"wl * {p.M}",
                    dy_ats=[f"wl * {p.M} + {j * p.M}" for j in range(run["count"])],
                    loads=[(q, f"xo + {q * p.C}") for q, _ in run["loads"]],
                )
            )
            continue
        dy_ats = [str(run["dy_at"] + j * p.M) for j in range(run["count"])]
        out.append(
            dict(
                run,
                times=1,
                dy_at=str(run["dy_at"]),
                dy_ats=dy_ats,
                loads=[(q, str(at)) for q, at in run["loads"]],
            )
        )
    return out


def plan_wlane(p, v: Wlane) -> Plan:
    # 1. limits
    if p.layout is not TensorLayout.NHWC:
        raise SpecError(
            "wlane reads channels-last tensors (a lane a channel): use layout=nhwc in the shape spec, or "
            "--strategy wband for NCHW"
        )
    if v.threads not in THREADS:
        raise SpecError(f"wlane t{v.threads}: threads per block must be one of {THREADS}")
    if v.vec > 1:
        if not _words_allowed(p):
            raise SpecError(
                f"wlane v{v.vec}: channel words serve depthwise layers without a bias "
                "(one channel and one map a group); choose --vec 1"
            )
        if v.vec not in vector_widths(p.dtype) or p.C % v.vec:
            widths = [w for w in vector_widths(p.dtype) if p.C % w == 0] + [1]
            raise SpecError(
                f"wlane v{v.vec}: a word of {p.dtype.value} channels that divides C={p.C} is "
                f"one of {widths}"
            )
    taps = p.R * p.S
    sums = p.Mg * taps * v.vec
    if sums > MAX_ACCUMULATORS:
        raise SpecError(
            f"wlane keeps {sums} sums per thread ({v.vec} channel(s) x {p.Mg} maps x {taps} "
            f"taps), over {MAX_ACCUMULATORS}; "
            + ("choose a smaller --vec" if v.vec > 1 else "use --strategy wgemm or wsplit")
        )
    if v.pixels > p.Wo:
        raise SpecError(f"wlane p{v.pixels}: a row has only Wo={p.Wo} outputs")
    held = v.pixels * p.Mg * v.vec
    if held > MAX_RUN_VALUES:
        raise SpecError(
            f"wlane p{v.pixels} holds {held} dy values a run ({p.Mg} maps x {v.vec} "
            f"channel(s)), over {MAX_RUN_VALUES}; choose --pixels "
            f"{max(1, MAX_RUN_VALUES // (p.Mg * v.vec))}"
        )
    if v.splits > 65535:
        raise SpecError(f"wlane s{v.splits}: at most 65535 slices (grid y)")

    # 2. work
    tiles = ceil_div(p.C // v.vec, v.threads)  # a channel word a thread
    ctx = sums_context(p, p.Mg, v.splits, bgrad=False, with_db=p.bias)
    row = ctx["row"]
    workspace = 4 * v.splits * row
    dw, sw = p.dil[1], p.stride[1]
    nx = (v.pixels - 1) * sw + (p.S - 1) * dw + 1
    runs = row_runs(p, v.pixels)
    middle = middle_runs(p, runs)
    name = v.kernel_name(p)
    launches = (
        Launch(
            name,
            (Role.X, Role.DY, Role.WORKSPACE, Role.BATCH),
            (v.threads, 1, 1),
            (tiles, v.splits, 1),
            1,
            0,
            1,
        ),
        second_pass(name, row, v.splits, p.bias),
    )
    ctx.update(
        threads=v.threads,
        **launch_bounds(v.threads, one_per_sm_first=False),
        runs=runs,
        pieces=row_pieces(p, runs, middle),
        looped=middle[1] if middle else 0,
        # tap row r reads input row ho * sh + r * dh - pt
        tap_rows=[(r, r * p.dil[0] - p.pads[0]) for r in range(p.R)],
        x_row=p.W * p.C,
        dy_row=p.Wo * p.M,
        last_channel=p.C - v.vec,  # a thread past C reads the last word
        vec=v.vec,
        depthwise=depthwise(p),  # channel c's one map is map c
        **channel_words(p.dtype, v.vec),
    )
    sizes = (
        Size(
            "block",
            f"{v.threads} threads",
            (
                f"a word of {v.vec} channels a thread ({v.vec * p.dtype.bytes} bytes a load): "
                if v.vec > 1
                else "one input channel a thread: "
            )
            + f"{tiles} block(s) across C={p.C}, x {v.splits} slices",
        ),
        Size(
            "thread",
            f"{sums + (p.Mg if p.bias else 0)} fp32 sums",
            (f"{v.vec} channels x " if v.vec > 1 else "")
            + f"{p.Mg} maps x {taps} taps"
            + (" + db" if p.bias else "")
            + ", kept over its slice",
        ),
        Size(
            "run",
            f"{v.pixels} adjacent outputs",
            f"{nx} x loads a tap row and {v.pixels * p.Mg} dy loads feed "
            f"{v.pixels * sums} FMAs" + (f", each load a word of {v.vec}" if v.vec > 1 else ""),
        ),
        Size(
            "workspace",
            f"{workspace} B",
            f"{v.splits} slices x {row} sums; the second kernel adds the slices in order",
        ),
    )
    return Plan(
        shape=p,
        variant=v,
        template="backward/wlane.cu.j2",
        launches=launches,
        static_smem=0,
        dynamic_smem=0,
        const_bytes=0,
        weight_format="f32",
        sizes=sizes,
        context=ctx,
        workspace_bytes=workspace,
        # a slice's rows are contiguous in the (image, row) walk: at most Ho of them per
        # image it covers, each Wo terms; then the slices added in order
        sum_depth=(p.Ho * p.Wo, v.splits, v.splits),
    )
