"""``mmarows``: fp16/bf16 tensor cores for one output map, the window's rows on the n side.

A layer with one channel (the seeds' first 7x7 layers) has dgrad views with one map: dx
from dy's 4 or 12 maps.  An implicit GEMM's n side then holds that one map in an n8
tile, and the strategies before this one filled it with neighbouring output columns
(mmahwc's shifts, mmatoep's Toeplitz B), where only K of every K + 7 taps are real: 48%
of mx-layer1's multiplies met a tap, and its bf16 dgrad view took 0.94 ms (H200,
B=10000).

Here the n side is the window's rows instead.  For input row iy and output column x,
column r of the product is

    Z[iy][x][r] = sum over window columns s and channels c of in[c][iy][x + s - pl] * w[c][r][s],

one input row's part of output row iy + pt - r.  Its k side is (s, c), 16 at a time: four
window columns (s = 4h .. 4h + 3) by four channels (4q .. 4q + 3), so that the two A words
a lane needs for one row of its fragment are one pixel's four channels, one aligned
8-byte shared load, and nothing pads but the window's columns to a multiple of 4 and the
channels to a multiple of 4 (mx-layer1's view: 7 of 8 rows and columns, 12 of 12
channels, 77% of the multiplies real).

Each warp owns 16 output columns (or 8 columns of two images) and walks the input rows
down the image; an input row is read once, for all R window rows at once.  Lane (g, t)
holds window rows 2t and 2t + 1 of its fragment rows g and g + 8, so the R parts of an
output row lie in the four lanes of a quad, two steps of the walk apart from lane to
lane: lane t adds its two parts of row iy + pt - 2t - 1 (one from this step, one kept
from the last), takes lane t - 1's sum of that row from two steps ago by one
``shfl.up``, and passes its own on.  Lane 3 then holds output row iy + pt - 7 whole, in
fp32, and stores it.  There is no halo: an input row feeds every output row it touches
in the one step that reads it, and a block walks whole images.

The rows arrive into a two-stage ring in shared memory, a pixel's channels side by side
(padded to 4, and to a pixel pitch of 2 mod 4 words, so that the 11 pixels a warp's
8-byte loads touch fall in distinct bank pairs), through registers: every thread loads
its part of the next stage's rows (NCHW: two pixels of every channel a 32-bit word, paired
into pixel words by byte permutes; NHWC: 8-byte pieces) before the warps multiply this
stage's, and stores it after; one barrier a stage.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import SpecError
from ..plan.common import (
    OPTIN_SMEM_BYTES,
    STATIC_SMEM_BYTES,
    Launch,
    Plan,
    Size,
    ceil_div,
    shape_context,
    smem_blocks,
    y_args,
)
from ..shapes import DType, Feature, TensorLayout
from ..tensors import Role
from ..variants import EPILOGUE, Count, Variant, param
from .mmapersist import FRAGMENT16, own_dtype16

# The n side is one n8 tile of window rows, four lanes of two rows each: the walk's
# quad pipeline is 8 rows deep whatever R is.
MAX_ROWS = 8
PIPELINE = 8
# k steps a thread keeps B fragments for (two words each): ceil(S/4) x ceil(C/4).
MAX_KSTEPS = 16
# Warps a block: one per group of output columns.
MAX_WARPS = 32
IMAGES = (1, 2)  # images a warp tile covers: 16 columns of one, or 8 of two
STAGE_ROWS = (1, 2, 4, 8)
# The fit's stages: the most rows whose mma (rows x k steps) are at most this many.
FIT_STAGE_MMA = 24


def pixel_words(chans: int) -> int:
    """A pixel's pitch in shared words for ``chans`` channels padded to 4: even (8-byte
    loads) and 2 mod 4, so that 16 consecutive pixels start in 16 distinct bank pairs."""
    words = ceil_div(chans, 4) * 2
    return words + (2 - words % 4) % 4


def column_groups(wo: int, images: int) -> int:
    return ceil_div(wo, 16 // images)


def fill_mode(p) -> str:
    """How a stage's rows are loaded: 8-byte pieces of NHWC pixels, or from NCHW planes
    two pixels a 32-bit word (rows of even width start on words) or one at a time."""
    if p.layout is TensorLayout.NHWC:
        return "nhwc"
    return "pairs" if p.W % 2 == 0 else "pixels"


def _offset(n: int) -> str:
    """`` + n``, `` - |n|`` or nothing: a constant added in the source as a person writes it."""
    return f" + {n}" if n > 0 else (f" - {-n}" if n < 0 else "")


def plan_mmarows(p, v) -> Plan:
    # 1. limits
    key = v.key
    own_dtype16(key, p, v.precision, planning=True)
    if p.M != 1:
        raise SpecError(
            f"{key} puts one map's window rows on the n side: M=1 only, not {p.M}; use "
            "--strategy mmahwc"
        )
    if p.R > MAX_ROWS:
        raise SpecError(
            f"{key} holds the window's rows in one n8 tile: R at most {MAX_ROWS}, not {p.R}; "
            "use --strategy mmahwc"
        )
    pt, _, pl, _ = p.pads
    if pt >= PIPELINE:
        raise SpecError(
            f"{key} emits output row iy + pt - {PIPELINE - 1} at input row iy: top padding "
            f"at most {PIPELINE - 1}, not {pt}; use --strategy mmahwc"
        )
    mode = fill_mode(p)
    if mode == "nhwc" and p.C % 4:
        raise SpecError(
            f"{key} copies NHWC pixels 4 channels (8 bytes) at a time: {p.C} channels are "
            "not a multiple of 4; use layout=nchw in the shape spec or --strategy mmahwc"
        )
    s_steps, c_quads = ceil_div(p.S, 4), ceil_div(p.C, 4)
    ksteps = s_steps * c_quads
    if ksteps > MAX_KSTEPS:
        raise SpecError(
            f"{key} keeps a window row's B fragments in registers: ceil(S/4) x ceil(C/4) = "
            f"{ksteps} k steps, over {MAX_KSTEPS}; use --strategy mmahwc"
        )
    if v.images not in IMAGES:
        raise SpecError(
            f"{key} i{v.images}: a warp's 16 fragment rows are 16 columns of one image or "
            "8 of two (--images 1 or 2)"
        )
    if v.rows not in STAGE_ROWS:
        raise SpecError(f"{key} r{v.rows}: a stage is {', '.join(map(str, STAGE_ROWS))} input rows")
    cols = 16 // v.images
    warps = column_groups(p.Wo, v.images)
    if warps > MAX_WARPS:
        raise SpecError(
            f"{key} gives each group of {cols} output columns a warp: Wo={p.Wo} needs "
            f"{warps}, over {MAX_WARPS}; use --strategy mmahwc"
        )
    threads = 32 * warps

    # 2. memory: a stage is rows x images input rows, each `row_words` of pixels padded
    # left by pl (the window's reach), wide enough for the last group's last column tap.
    pw = pixel_words(p.C)
    span = max(warps * cols + 4 * s_steps - 1, pl + p.W)
    row_words = span * pw
    stage_words = v.rows * v.images * row_words
    ring = 2 * stage_words * 4
    if ring > OPTIN_SMEM_BYTES:
        raise SpecError(
            f"{key} r{v.rows} i{v.images} needs {ring} B of shared memory (two stages of "
            f"{v.rows} x {v.images} rows of {row_words * 4} B), over the {OPTIN_SMEM_BYTES} "
            "B a block may opt in to; choose fewer --rows"
        )
    steps = p.Ho + PIPELINE - 1 - pt  # output row Ho - 1 is whole after input row steps - 1
    stages = ceil_div(steps, v.rows)
    per_row = {"nhwc": p.W * (p.C // 4), "pairs": p.W // 2, "pixels": p.W}[mode]
    items = v.rows * v.images * per_row
    per_thread = ceil_div(items, threads)
    item_words = {"nhwc": 2, "pairs": p.C, "pixels": ceil_div(p.C, 2)}[mode]
    staged = per_thread * item_words
    # Registers: B fragments, the staged rows and a 64-bit address for each staged item, a
    # stage's sums (4 a row), the pipeline's 6, and about 34 for addresses and the walk.
    need = 2 * ksteps + staged + 2 * per_thread + 4 * v.rows + 6 + 34
    if need > 255:
        raise SpecError(
            f"{key} r{v.rows} i{v.images}: about {need} registers a thread (the stage's "
            f"{staged} staged words), over 255; choose fewer --rows"
        )
    blocks = max(1, min(smem_blocks(ring), 65536 // (ceil_div(warps, 4) * 128 * need), 8))

    dynamic = ring > STATIC_SMEM_BYTES
    # Byte offsets in the ring: a k step's load from a lane's pixel (window columns 4h on,
    # channels 4q on), fragment row g + 8's pixel from row g's, a stage row, a stage.
    kstep_list = [
        dict(i=h * c_quads + q, s=4 * h, c=4 * q, at=4 * (4 * h * pw + 2 * q))
        for h in range(s_steps)
        for q in range(c_quads)
    ]
    hi_bytes = 4 * (8 * pw if v.images == 1 else row_words)
    shift = pt - (PIPELINE - 1)  # lane 3 holds output row iy + shift whole
    ctx = shape_context(p)
    ctx.update(
        elem="f16" if p.dtype is DType.FP16 else "bf16",
        R=p.R,
        S=p.S,
        images=v.images,
        cols=cols,
        warps=warps,
        threads=threads,
        rows=v.rows,
        steps=steps,
        stages=stages,
        kstep_list=kstep_list,
        hi_bytes=hi_bytes,
        row_bytes=4 * v.images * row_words,
        stage_bytes=4 * stage_words,
        shift=shift,
        row_shift=_offset(shift),  # "iy + shift", spelled
        out_shift=_offset(shift * p.Wo),
        s_steps=s_steps,
        c_quads=c_quads,
        ksteps=ksteps,
        pw=pw,
        row_words=row_words,
        stage_words=stage_words,
        ring_words=2 * stage_words,
        dynamic=dynamic,
        mode=mode,
        per_row=per_row,
        items=items,
        per_thread=per_thread,
        item_words=item_words,
        chan_words=p.H * p.W // 2,  # a channel plane in 32-bit words (pairs mode)
        image_elems=p.C * p.H * p.W,
        row_guard=steps % v.rows != 0,
        launch_bounds=f"{threads}, {blocks}",
        # A bare __launch_bounds__(threads) let ptxas cap a drawn fp16 NHWC kernel at 128
        # registers and spill; with one block an SM named it took the 164 it wanted.
        launch_bounds_alt=f"{threads}, 1",
        blocks=blocks,
    )
    real = p.R * p.S * p.C / (PIPELINE * 4 * s_steps * 4 * c_quads) * p.Wo / (warps * cols)
    sizes = (
        Size(
            "fragment",
            f"mma.m16n8k16, {p.dtype.value}",
            f"16 columns x {PIPELINE} window rows (R={p.R}) x (4 window columns x 4 "
            f"channels); {ksteps} k steps an input row ({s_steps} x {c_quads})",
        ),
        Size(
            "useful",
            f"{100 * real:.0f}% of the multiplies",
            f"{p.R}/{PIPELINE} rows x {p.S}/{4 * s_steps} columns x {p.C}/{4 * c_quads} "
            f"channels x {p.Wo}/{warps * cols} output columns",
        ),
        Size(
            "warp",
            f"{cols} columns x {v.images} image(s)",
            f"walks {steps} input rows ({p.H} real), output row iy + {pt} - {PIPELINE - 1} "
            "whole in lane 3 of each quad",
        ),
        Size(
            "block",
            f"{threads} threads, {v.images} image(s)",
            f"{warps} column groups of {cols}; {blocks} blocks an SM by the launch bounds",
        ),
        Size(
            "__shared__",
            f"{ring} B" + (" (dynamic)" if dynamic else ""),
            f"2 stages x {v.rows} rows x {v.images} image(s) x {span} pixels x {pw} words "
            f"(channels padded to {4 * c_quads}, pitch 2 mod 4 words)",
        ),
        Size(
            "fill",
            f"{items} items a stage, {per_thread} a thread",
            {
                "nhwc": "8-byte pieces of NHWC pixels",
                "pairs": "two pixels of every channel a 32-bit load, byte-permuted into pixels",
                "pixels": "one pixel of every channel a 16-bit load (W is odd)",
            }[mode],
        ),
    )
    launch = Launch(
        v.kernel_name(p),
        (Role.X, Role.W, *y_args(p), Role.BATCH),
        (threads, 1, 1),
        (0, 1, 1),
        0,
        1,
        v.images,
        ring if dynamic else 0,
    )
    return Plan(
        shape=p,
        variant=v,
        template="gemm/mmarows.cu.j2",
        launches=(launch,),
        static_smem=0 if dynamic else ring,
        dynamic_smem=ring if dynamic else 0,
        const_bytes=0,
        weight_format="f32",
        sizes=sizes,
        context=ctx,
    )


@dataclass(frozen=True, kw_only=True)
class Mmarows(Variant):
    key = "mmarows"
    templates = ("gemm/mmarows.cu.j2",)
    family = "gemm"
    description = (
        "fp16/bf16 tensor cores for one map: each warp walks the input rows under 16 output "
        "columns, the window's rows on the n side, the k side 4 window columns x 4 "
        "channels; a quad's shuffle pipeline adds each output row's window rows"
    )
    serves = EPILOGUE | {Feature.RECT, Feature.UNEQUAL_PAD, Feature.DTYPE16, Feature.NHWC}
    precisions = FRAGMENT16
    tensor_core = True

    images: int = param(1, Count("i"), "mmarows: images a warp's 16 columns cover (1 or 2)")
    rows: int = param(4, Count("r"), "mmarows: input rows a stage (one barrier each)")

    def plan(self, problem):
        return plan_mmarows(problem, self)

    @classmethod
    def fit(cls, problem, seed):
        """The tensors' own dtype; blocks of one image (16 columns a warp), and stages of
        the most rows whose mma chains are at most FIT_STAGE_MMA.  bf16 dgrad at B=10000
        (H100, 2026-11-27): mx-layer1's view (6 k steps a row) 0.600 ms in stages of 4 rows
        against 0.702 in 2 and 0.677 in 8, and 0.652-0.830 with 8 columns of two images,
        whose 72 columns waste none; layer1's (2 k steps) 0.383 in stages of 8 against
        0.501-0.511 in 2 or 4, and 0.420 with two images.  On the H200 the two defaults
        took 0.604 and 0.385 (``docs/measurements/bench-dgrad-*-bf16-2026-11-27-h200-35d8191.log``).
        """
        own_dtype16(cls.key, problem, seed.precision, planning=False)
        ksteps = ceil_div(problem.S, 4) * ceil_div(problem.C, 4)
        fits = [r for r in STAGE_ROWS if r * ksteps <= FIT_STAGE_MMA] or [1]
        return replace(seed, images=1, rows=max(fits))

    @classmethod
    def space(cls, problem, precision):
        return [cls(images=i, rows=r, precision=precision) for i in IMAGES for r in (2, 4, 8)]
