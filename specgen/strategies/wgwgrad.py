"""``wgwgrad``: wgrad (and db) of 16-bit channels-last layers on Hopper's warpgroup tensor
cores (sm_90a).

The product is tcwgrad's, dw[m][(r, s, c)] = sum over the batch's pixels p of dy[p][m] *
x[p's tap (r, s)][c], but on ``wgmma.mma_async``: a warpgroup multiplies 64 maps by up
to 256 channels of one tap, both operands read by the tensor cores from shared memory.
In NHWC both operands arrive as rows of pixels (dy's row holds the maps, x's row of one
tap the channels), so the reduction runs down the rows and the operands are MN-major:
a chunk of 64 pixels is stored as 64-element blocks of 64 rows of 128 bytes, the
128-byte swizzle on each, and the descriptors name the blocks' spacing (``lbo``, 8 KB)
and the 8-row groups' (1 KB); the instruction's transpose flags say MN-major.  The
copies are tcwgrad's 16-byte ``cp.async`` with a zero-fill where a tap leaves the image,
every warp copying, one barrier a chunk, ``stages - 1`` chunks in flight.

The batch's pixels are cut into ``splits`` contiguous slices, one block plane each; a
block writes its fp32 sums to its slice's workspace row and ``backward/tc_sums.j2`` adds
the rows in order, so the result is deterministic; one slice's block stores dw itself.
db rides along on the blocks of the first column tile: dy times a shared tile of ones on
an m64n8k16 wgmma.  On small maps, where most taps see padding for many pixels (a 3x3
window's corner taps one pixel of a 2x2 map), a tap's block walks only the rectangle of
pixels whose input lies in the image (``tap_rects``): resnet18's wgrads at 32x32 images
(B=128, H200) took 0.0073-0.0105 ms where they had 0.0119-0.0170.

``wgwtma`` is the same product fed by the tensor memory accelerator: a producer warp's
one thread issues, a chunk, a box of dy per 64 maps and a box of x per 64 channels
(``cp.async.bulk.tensor``, 128-byte swizzle), and the warpgroups only multiply, under
mbarriers ("landed", "retired").  A chunk is a band of whole output rows (``Wo`` pixels
by ``hb`` rows by ``nb`` images, at most 64 pixels): both boxes' rows are its pixels in
order, x's box moved by the tap and stepping by the stride (the copy unit's traversal
stride), and the copy unit zero-fills the padding and what lies past the batch.  The
rows of the last k step past the band are zeroed once in every stage.  It needs output
rows of at most 64 pixels; the copies of ``wgwgrad`` issue some 200 instructions a
chunk a warp, which its consumers do not.  A 1x1 unpadded stride-1 layer reads x at dy's
own pixel, so its chunk is 64 consecutive pixels of the batch instead (``flat_pixels``),
none past a band: resnet50's such wgrads of 7x7-28x28 maps (B=32, H200) took
0.0142-0.0203 ms where they had 0.0160-0.0244.

Where no 64-wide tile divides a group's maps or channels (efficientnet_b0's 112 and 672,
mobilenet_v2's 96 and 160), ``wgwtma`` and ``wgwdsm`` take tiles that end past them
(``ragged_tiles``): the copy unit zero-fills the part of a box past the tensor's extent,
and the stores skip the maps and channels past the group's.  Tuned, they ran those 1x1
wgrads at 0.90-1.50x cuDNN where tcwgrad had 0.74-0.96x (H200, 2026-12-01).

``wgwdsm`` is ``wgwtma`` whose slices (1, 2, 4 or 8) are the blocks of one thread block
cluster along z: each block leaves its fp32 sums (and db's) in its shared memory, adds
one share of the tile's 8-channel columns of every block's in rank order through
distributed shared memory (``common/cluster.j2``), and stores it in dw's layout itself,
in fp32 under ``grads32``: the bits of ``tc_sums.j2``'s in-order pass, with no workspace
and no second kernel.  On resnet18's wgrads of 1x1 to 8x8 maps at B=128 (H200) that took
each from 0.0077-0.0119 ms to 0.0060-0.0090.

``wgwhalo`` is ``wgwdsm`` with every tap of a window of up to 3x3 in one block, as
``tcwhalo`` keeps them on mma.sync: a block owns 64 maps x 64 channels of all the taps,
a warpgroup a row of the window (its taps' 32 sums a thread each).  A chunk is a band of
one image's output rows, each padded to the window's span, Wp = Wo + (S - 1) * dilation
positions (dy's box runs past Wo, where the copy unit fills zeros); x's box is the input
rows under the band at the same width, from the padding's corner on.  In that layout the
input pixel of tap (r, s) at band position k is x's row k + r * dh * Wp + s * dw, so every
tap multiplies dy's rows by the same x rows from a shifted start: x crosses from global
memory once a chunk instead of once a tap, and no tap's rows are copied twice.  The
shifted starts leave the 1024-byte lines of the swizzle; the tensor cores swizzle by the
address bits as the copy unit wrote them, so the descriptor stays the plain one.  The
padded positions cost multiplies by zero (a 7x7 map's band of 63 positions holds 49
pixels).  At a stride, the taps' input offsets fall in stride phases (at stride 2, the
window's outer rows read odd input rows and its middle one even rows): x is copied as
one box per phase, taken every stride rows and columns by the copy unit, and each tap
reads its phase's buffer from its own shift.  On resnet50's 3x3 wgrad of 7x7 maps
(C=M=512, B=32, H200) it took 0.0218 ms in its tune against wgwdsm's 0.0315 (cuDNN 0.0232
in that run); at B=64, 0.0325 against wgwgrad's 0.0612 (cuDNN 0.0318).  At stride 2 onto
7x7 maps, 0.0227 against wgwdsm's 0.0323 (C=M=512, B=32; cuDNN 0.0215).  On 14x14 output
maps and wider, where a cluster of up to 8 blocks exchanges each block's 147 KB of sums,
the one-tap kernels stay faster.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from ..errors import SpecError
from ..plan.common import Launch, Plan, Size, ceil_div, choices
from ..shapes import DType, Feature, Op, TensorLayout
from ..tensors import Role
from ..tma import BOX_LIMIT, STEP_LIMIT, TensorMap
from ..variants import EPILOGUE, GEOMETRY, Count, Pair, Precision, Variant, param
from .mma import ROUNDING
from .tcgemm import MATH, STAGE_LIMIT, flat_pixels
from .tcwgrad import slice_kernel, slice_sums
from .wgmma import descriptor

CHUNK = 64  # pixels a stage: four k16 steps
BLOCK = 64  # elements of a 128-byte row: a block of maps or channels
BLOCK_BYTES = CHUNK * 128  # one block of a chunk: 64 rows of 128 bytes
SMS = 132  # the H200's SMs: one block each (the ring takes most of an SM's memory)
ONES_BYTES = 2048  # db's tile of ones: two 8-row groups of 128 bytes
MAP_TILES = (64, 128, 256)  # a warpgroup's 64 maps, up to four warpgroups
CHANNEL_TILES = (64, 128, 256)  # wgmma's N
MOST_SUMS = 128 * 256  # a block's: 128 a thread of 256, or 64 of 512
# ae-dec2-bf16 wgrad (B=128, H200, 2026-11-24): 128 maps x 128 channels in six stages
# 0.054 ms, with 14 slices 0.058; 64 x 128 0.085; ae-enc2-bf16: 128 x 256 0.043,
# 128 x 128 0.054-0.057, 64 x 256 0.063 (tcwgrad 0.065, cuDNN 0.053-0.057)


@dataclass(frozen=True, kw_only=True)
class Wgwgrad(Variant):
    key = "wgwgrad"
    templates = ("backward/wgwgrad.cu.j2",)
    family = "backward"
    description = (
        "wgrad on Hopper's warpgroup tensor cores (sm_90a) for 16-bit channels-last tensors: "
        "pixels as the reduction, MN-major operands in a 128B-swizzled cp.async ring, "
        "wgmma.mma_async, batch slices added in order"
    )
    serves = GEOMETRY | EPILOGUE | {Feature.DTYPE16, Feature.NHWC}
    precisions = (Precision.BF16, Precision.FP16)
    tensor_core = True
    ops = frozenset({Op.WGRAD})

    blocktile: tuple[int, int] = param(
        (128, 256), Pair("b"), "wgwgrad: the block's tile of dw, maps x channels of one tap"
    )
    stages: int = param(4, Count("p"), "wgwgrad: chunks of 64 pixels in the shared-memory ring")
    splits: int = param(
        14, Count("s"), "wgwgrad: slices of the batch's pixels, one block plane each"
    )

    def plan(self, problem):
        return plan_wgwgrad(problem, self)

    @classmethod
    def fit(cls, problem, seed):
        """The tensors' own math; the widest tile of channels that divides a group's (or
        covers them, ``ragged_tiles``), then the widest of maps that does with at most
        128 x 256 sums a block; the most stages that fit; slices for one block an SM."""
        p = problem
        _math_of(p, seed)
        ragged = ragged_tiles(cls, p)
        bn = max(covering(p.Cg, CHANNEL_TILES, ragged), default=seed.blocktile[1])
        bm = max(
            (d for d in covering(p.Mg, MAP_TILES, ragged) if d * bn <= MOST_SUMS),
            default=seed.blocktile[0],
        )
        chunks = reduction_chunks(p, CHUNK)
        bm, bn = fuller_tile(p, (bm, bn), chunks, ragged)
        stages = max(2, min(6, _most_stages(bm, bn)))
        # (where no tile divides a group's maps or channels, the plan says why)
        splits = slices_for(SMS, tile_count(p, bm, bn), chunks)
        return replace(seed, blocktile=(bm, bn), stages=stages, splits=splits)

    @classmethod
    def space(cls, problem, precision):
        """Every tile that divides the group's maps and channels, with 3, 4 and the most
        stages up to 6 that fit, and slices for one and two blocks an SM, and one slice
        (its block stores dw: no workspace and no second kernel)."""
        if precision is not MATH[problem.dtype]:
            return []
        space = tiled_space(
            cls,
            problem,
            precision,
            _most_stages,
            lambda most: {3, 4, min(6, most)},
            CHUNK,
            ragged=ragged_tiles(cls, problem),
        )
        return list(dict.fromkeys(space + [replace(v, splits=1) for v in space]))


@dataclass(frozen=True, kw_only=True)
class Wgwtma(Wgwgrad):
    key = "wgwtma"
    description = (
        "wgwgrad fed by the tensor memory accelerator (sm_90a): a producer thread's box "
        "copies of bands of whole output rows (x's at the stride's traversal step), the "
        "warpgroups only multiplying, under mbarriers"
    )


@dataclass(frozen=True, kw_only=True)
class Wgwdsm(Wgwtma):
    key = "wgwdsm"
    description = (
        "wgwtma whose slices of the batch are the blocks of one thread block cluster "
        "(sm_90a): their sums added in rank order through distributed shared memory and "
        "stored as dw by the blocks themselves, with no workspace and no second kernel"
    )

    @classmethod
    def fit(cls, problem, seed):
        """wgwtma's tile and stages; its slices rounded down to 1, 2, 4 or 8 (a cluster's
        blocks share the tile's 8-channel columns evenly, at most a portable 8)."""
        v = super().fit(problem, seed)
        return replace(v, splits=max(s for s in CLUSTER_SLICES if s <= v.splits))

    @classmethod
    def space(cls, problem, precision):
        """wgwtma's tiles and stages, each with 1, 2, 4 and 8 slices."""
        out = []
        for v in super().space(problem, precision):
            for splits in CLUSTER_SLICES:
                out.append(replace(v, splits=splits))
        return list(dict.fromkeys(out))


@dataclass(frozen=True, kw_only=True)
class Wgwhalo(Wgwdsm):
    key = "wgwhalo"
    serves = frozenset(
        {
            Feature.RECT,
            Feature.STRIDE,
            Feature.DILATION,
            Feature.UNEQUAL_PAD,
            Feature.WIDE_PAD,
            Feature.GROUPS,
            Feature.DTYPE16,
            Feature.NHWC,
        }
    )
    description = (
        "wgwdsm with every tap of a window of up to 3x3 in one block (sm_90a): a chunk is a "
        "band of output rows padded to the window's span, x's rows under it (the halo) "
        "copied once a stride phase and each tap's operand its phase's rows from a shifted "
        "descriptor; a warpgroup a window row"
    )

    @classmethod
    def fit(cls, problem, seed):
        """A tile of 64 maps x 64 channels (every tap), the most stages up to 6 that fit,
        and the cluster's slices (1, 2, 4 or 8) that fill the SMs best, one block each."""
        p = problem
        _math_of(p, seed)
        stages = max(2, min(6, _halo_stages(p)))
        tiles = (p.Cg // BLOCK) * (p.Mg // BLOCK) * p.groups
        try:
            chunks = p.batch * halo_layout(p).bands
        except SpecError:  # the plan says why
            chunks = 1
        splits = slices_for(SMS, max(tiles, 1), chunks)
        splits = max(s for s in CLUSTER_SLICES if s <= splits)
        return replace(seed, blocktile=(BLOCK, BLOCK), stages=stages, splits=splits)

    @classmethod
    def space(cls, problem, precision):
        """The 64 x 64 tile with 3, 4 and the most stages up to 6 that fit, each with 1, 2,
        4 and 8 slices; none where the tile does not divide the group's maps and channels."""
        p = problem
        if precision is not MATH[p.dtype] or p.Mg % BLOCK or p.Cg % BLOCK:
            return []
        most = _halo_stages(p)
        return [
            cls(blocktile=(BLOCK, BLOCK), stages=stages, splits=splits, precision=precision)
            for stages in sorted({3, 4, min(6, most)})
            if 2 <= stages <= most
            for splits in CLUSTER_SLICES
        ]


@dataclass(frozen=True)
class HaloLayout:
    """``wgwhalo``'s chunk: a band of ``hb`` output rows of one image (``bands`` an image),
    each padded to ``Wp`` positions, ``rows`` of dy read in ``ksteps`` k steps; x's rows in
    one buffer per stride phase (``phases``: the corner of its box, column and row
    offset from the band's first input row), ``xrows`` of them written by the copy unit
    and ``xread`` read by the taps; tap (r, s) reads its phase's buffer from row
    ``shifts[r][s]`` on (``phase_of[r][s]``)."""

    Wp: int
    hb: int
    bands: int
    rows: int
    ksteps: int
    xrows: int
    xread: int
    phases: tuple
    phase_of: tuple
    shifts: tuple

    @property
    def box_rows(self) -> int:
        """x's box: the band's rows and the farthest phase's shift, in taken rows."""
        return self.xrows // self.Wp

    @property
    def tail_rows(self) -> int:
        """dy's rows past the band that the last k step reads: never copied, zero."""
        return 16 * self.ksteps - self.rows

    @property
    def x_tail(self) -> int:
        """x's rows past its box that the taps read, in each phase's buffer: zero."""
        return self.xread - self.xrows


def _axis_phases(taps: int, dil: int, pad: int, stride: int):
    """Along one axis: each tap's input offset (tap * dil - pad) as stride * q + phase;
    the distinct phases in order of first use with the least q of each; each tap's phase
    index and its q less its phase's least."""
    offsets = [k * dil - pad for k in range(taps)]
    order = list(dict.fromkeys(o % stride for o in offsets))
    least = {ph: min(o // stride for o in offsets if o % stride == ph) for ph in order}
    starts = [stride * least[ph] + ph for ph in order]  # each phase's first input offset
    index = [order.index(o % stride) for o in offsets]
    moved = [o // stride - least[o % stride] for o in offsets]
    return starts, index, moved


@lru_cache(maxsize=256)
def halo_layout(p) -> HaloLayout:
    """``wgwhalo``'s chunk for problem ``p``, worked out once a problem: the fit, the
    limits, the stages, the tensor maps and the plan all read it.  Tap (r, s) of output
    pixel (i, j) reads x at row sh i + r dh - pt and column sw j + s dw - pl; writing each
    offset as the stride
    times q plus a phase, the taps of one phase read one box of x taken at the stride
    (the copy unit's traversal step), tap (r, s) moved q - q0 rows and columns into it.
    Rows padded to Wp = Wo + the farthest column move make that a constant shift of the
    buffer's rows: (q_r - q0) Wp + (q_s - q0).  SpecError where a padded row is longer
    than a chunk."""
    (sh, sw), (dh, dw), (pt, _, pl, _) = p.stride, p.dil, p.pads
    row_starts, row_phase, row_moved = _axis_phases(p.R, dh, pt, sh)
    col_starts, col_phase, col_moved = _axis_phases(p.S, dw, pl, sw)
    Wp = p.Wo + max(col_moved)
    if Wp > CHUNK:
        raise SpecError(
            f"wgwhalo copies bands of output rows padded to the window's span, {Wp} "
            f"positions, over the {CHUNK} of a chunk; use --strategy wgwdsm"
        )
    hb = min(p.Ho, CHUNK // Wp)
    rows = hb * Wp
    ksteps = ceil_div(rows, 16)
    xrows = (hb + max(row_moved)) * Wp
    shift = max(row_moved) * Wp + max(col_moved)
    ncols = len(col_starts)
    return HaloLayout(
        Wp=Wp,
        hb=hb,
        bands=ceil_div(p.Ho, hb),
        rows=rows,
        ksteps=ksteps,
        xrows=xrows,
        xread=ceil_div(16 * ksteps + shift, 8) * 8,
        phases=tuple((c, r) for r in row_starts for c in col_starts),
        phase_of=tuple(
            tuple(row_phase[r] * ncols + col_phase[s] for s in range(p.S)) for r in range(p.R)
        ),
        shifts=tuple(
            tuple(row_moved[r] * Wp + col_moved[s] for s in range(p.S)) for r in range(p.R)
        ),
    )


def _halo_stages(p) -> int:
    """The most chunks whose ring fits (dy's block, x's rows of every phase) with the
    alignment slack."""
    try:
        h = halo_layout(p)
    except SpecError:
        return 0
    return (STAGE_LIMIT - 1024) // (BLOCK_BYTES + len(h.phases) * h.xread * 128)


def halo_limits(p, v) -> None:
    """What ``wgwhalo`` takes beyond what it serves (no db): windows of up to 3 x 3 taps (a
    warpgroup a row of them, 32 sums a tap a thread), the 64 x 64 tile, x's box within
    the copy unit's 256 elements a side (the stride times the taken rows and columns) and
    its step of 8."""
    if not (p.R <= 3 and p.S <= 3 and p.R * p.S > 1):
        raise SpecError(
            f"wgwhalo keeps every tap of a window of up to 3 x 3 in registers, not "
            f"{p.R} x {p.S}; use --strategy wgwdsm"
        )
    if v.blocktile != (BLOCK, BLOCK):
        raise SpecError(
            f"wgwhalo b{v.blocktile[0]}x{v.blocktile[1]}: a tile is 64 maps x 64 channels "
            "of every tap; choose b64x64"
        )
    h = halo_layout(p)
    sh, sw = p.stride
    if max(sh, sw) > STEP_LIMIT or sh * h.box_rows > BOX_LIMIT or sw * h.Wp > BOX_LIMIT:
        raise SpecError(
            f"wgwhalo: x's box of {sh * h.box_rows} x {sw * h.Wp} input rows and columns at "
            f"stride {sh}x{sw} is past the copy unit's {BOX_LIMIT} a side or step of "
            f"{STEP_LIMIT}; use --strategy wgwdsm"
        )


def halo_maps(p) -> tuple[TensorMap, TensorMap]:
    """``wgwhalo``'s tensor maps: dy as [N][Ho][Wo][groups][M/g], its box 64 maps by a band's
    padded rows (the copy unit zero-fills the columns past Wo), and x as
    [N][H][W][groups][C/g], its box 64 channels by the rows under the band (and the
    farthest tap's) at the same padded width, taken at the stride."""
    e = p.dtype.bytes
    h = halo_layout(p)
    sh, sw = p.stride
    dy = TensorMap(
        Role.DY,
        e,
        (p.Mg, p.groups, p.Wo, p.Ho, None),
        (p.Mg * e, p.M * e, p.Wo * p.M * e, p.Ho * p.Wo * p.M * e),
        (BLOCK, 1, h.Wp, h.hb, 1),
    )
    x = TensorMap(
        Role.X,
        e,
        (p.Cg, p.groups, p.W, p.H, None),
        (p.Cg * e, p.C * e, p.W * p.C * e, p.H * p.W * p.C * e),
        (BLOCK, 1, sw * h.Wp, sh * h.box_rows, 1),
        steps=(1, 1, sw, sh, 1) if (sh, sw) != (1, 1) else (),
    )
    return dy, x


CLUSTER_LIMIT = 8  # blocks of a portable cluster
# wgwdsm's slices: each block of the cluster adds an equal share of the tile's 8-channel
# columns (8, 16 or 32 of them), so a power of two up to the cluster's limit
CLUSTER_SLICES = (1, 2, 4, 8)


def bands_of(p) -> tuple[int, int, int]:
    """``wgwtma``'s unit of the reduction: (nb images, hb rows, the bands of an image),
    a band of nb x hb output rows of Wo pixels, at most ``CHUNK``; SpecError where a row
    is longer, or x's box, the band's rows and columns times the stride, is past the
    copy unit's 256 elements a side (or the stride past its step of 8)."""
    if p.Wo > CHUNK:
        raise SpecError(
            f"wgwtma copies bands of whole output rows of at most {CHUNK} pixels, not "
            f"{p.Wo}; use --strategy wgwgrad"
        )
    if p.Ho * p.Wo <= CHUNK:
        nb, hb, bands = min(CHUNK // (p.Ho * p.Wo), BOX_LIMIT), p.Ho, 1
    else:
        hb = CHUNK // p.Wo
        nb, bands = 1, ceil_div(p.Ho, hb)
    sh, sw = p.stride
    if max(sh, sw) > STEP_LIMIT or sw * p.Wo > BOX_LIMIT or sh * hb > BOX_LIMIT:
        raise SpecError(
            f"wgwtma: x's box of {sh * hb} x {sw * p.Wo} input rows and columns at stride "
            f"{sh}x{sw} is past the copy unit's {BOX_LIMIT} a side or step of {STEP_LIMIT}; "
            "use --strategy wgwgrad"
        )
    return nb, hb, bands


# ``wgwgrad`` walks only a tap's pixels inside the image where they are at most this
# share of all taps' (3x3 windows on maps of up to about 10 rows)
PRUNE_KEPT = 0.9


def tap_rects(p) -> list[tuple[int, int, int, int]]:
    """For each tap (r, s), in order: the output pixels whose input pixel lies in the
    image, a rectangle of rows oh0.. (nh of them) and columns ow0.. (nw); (0, 0, 0, 0)
    where every one falls on the padding."""
    (sh, sw), (dh, dw), (pt, _, pl, _) = p.stride, p.dil, p.pads

    def span(k: int, d: int, pad: int, stride: int, size: int, out: int) -> tuple[int, int]:
        # 0 <= o * stride + k * d - pad < size
        lo = max(0, -((k * d - pad) // stride))
        hi = min(out - 1, (size - 1 + pad - k * d) // stride)
        return (lo, hi - lo + 1) if hi >= lo else (0, 0)

    rows = [span(r, dh, pt, sh, p.H, p.Ho) for r in range(p.R)]
    cols = [span(s, dw, pl, sw, p.W, p.Wo) for s in range(p.S)]
    return [(oh, nh, ow, nw) if nh and nw else (0, 0, 0, 0) for oh, nh in rows for ow, nw in cols]


def kept_pixels(rects) -> int:
    """The pixels of an image that the taps' rectangles hold, over all taps."""
    return sum(nh * nw for _, nh, _, nw in rects)


def full_tap(p, rects) -> int | None:
    """The first tap that sees every output pixel inside the image (db's sums ride on
    its block), or None."""
    return next((t for t, (_, nh, _, nw) in enumerate(rects) if nh * nw == p.Ho * p.Wo), None)


def pruned(p, rects) -> bool:
    """Whether ``wgwgrad`` walks each tap's own pixels: they are at most ``PRUNE_KEPT`` of
    all taps', and where db rides along, one tap sees every pixel."""
    small = kept_pixels(rects) <= PRUNE_KEPT * p.R * p.S * p.Ho * p.Wo
    return small and (full_tap(p, rects) is not None or not p.bias)


def flat_maps(p) -> tuple[TensorMap, TensorMap]:
    """``wgwtma``'s tensor maps where ``flat_pixels``: dy and x as [the batch's pixels][1]
    [1][groups][M/g or C/g], each box 64 maps or channels by 64 pixels; the copy unit
    zero-fills the pixels past the batch."""
    e, P = p.dtype.bytes, p.Ho * p.Wo
    box = (BLOCK, 1, 1, 1, CHUNK)

    def rows(role, per_group, total):
        strides = (per_group * e, total * e, total * e, total * e)
        return TensorMap(role, e, (per_group, p.groups, 1, 1, None), strides, box, image_elems=P)

    return rows(Role.DY, p.Mg, p.M), rows(Role.X, p.Cg, p.C)


def tma_maps(p, nb: int, hb: int) -> tuple[TensorMap, TensorMap]:
    """``wgwtma``'s tensor maps: dy as [N][Ho][Wo][groups][M/g] and x as
    [N][H][W][groups][C/g], each with a box of 64 maps or channels by a band's pixels;
    x's spans the stride times the band's rows and columns and steps by the stride."""
    e = p.dtype.bytes
    box = (BLOCK, 1, p.Wo, hb, nb)
    sh, sw = p.stride
    dy = TensorMap(
        Role.DY,
        e,
        (p.Mg, p.groups, p.Wo, p.Ho, None),
        (p.Mg * e, p.M * e, p.Wo * p.M * e, p.Ho * p.Wo * p.M * e),
        box,
    )
    x = TensorMap(
        Role.X,
        e,
        (p.Cg, p.groups, p.W, p.H, None),
        (p.Cg * e, p.C * e, p.W * p.C * e, p.H * p.W * p.C * e),
        (BLOCK, 1, sw * p.Wo, sh * hb, nb),
        steps=(1, 1, sw, sh, 1) if (sh, sw) != (1, 1) else (),
    )
    return dy, x


def _stage_bytes(bm: int, bn: int) -> int:
    return CHUNK * (bm + bn) * 2


def _most_stages(bm: int, bn: int) -> int:
    """The most chunks whose ring fits beside db's ones and the alignment slack."""
    return (STAGE_LIMIT - 1024 - ONES_BYTES) // _stage_bytes(bm, bn)


def tiled_space(
    cls,
    p,
    precision,
    most_stages,
    stage_choices,
    chunk: int,
    fits=lambda bm, bn: True,
    ragged: bool = False,
):
    """A warpgroup wgrad's tune space: each tile of ``covering_tiles`` (``ragged``) that
    ``fits``, with each of ``stage_choices(most)`` up
    to the ``most_stages(bm, bn)`` that fit, and slices for one and two blocks an SM
    (``slices_for`` over the reduction's chunks of ``chunk`` pixels)."""
    out = []
    for bm, bn in covering_tiles(p, fits, ragged):
        most, tiles = most_stages(bm, bn), tile_count(p, bm, bn)
        for stages in sorted(s for s in stage_choices(most) if s <= most):
            for blocks in (SMS, 2 * SMS):
                splits = slices_for(blocks, tiles, reduction_chunks(p, chunk))
                out.append(
                    cls(blocktile=(bm, bn), stages=stages, splits=splits, precision=precision)
                )
    return list(dict.fromkeys(out))


def covering_tiles(p, fits=lambda bm, bn: True, ragged: bool = False) -> list[tuple[int, int]]:
    """The tiles of MAP_TILES x CHANNEL_TILES (maps x channels) along the group's maps and
    channels (``covering``: those that divide them, or where ``ragged`` and none does,
    those that cover them) that ``fits``."""
    return [
        (bm, bn)
        for bm in covering(p.Mg, MAP_TILES, ragged)
        for bn in covering(p.Cg, CHANNEL_TILES, ragged)
        if fits(bm, bn)
    ]


def covering(extent: int, tiles, ragged: bool) -> list[int]:
    """The tiles along a group's ``extent`` maps or channels: those that divide it; where
    none does and ``ragged``, each up to the extent rounded up to 64 (the last tile ends
    past it)."""
    dividing = [t for t in tiles if extent % t == 0]
    if dividing or not ragged:
        return dividing
    return [t for t in tiles if t <= ceil_div(extent, BLOCK) * BLOCK]


def ragged_tiles(cls, p) -> bool:
    """Whether ``cls``'s tiles may end past a group's maps or channels where no tile divides
    them (efficientnet_b0's 112 and 672): ``wgwtma``'s and ``wgwdsm``'s, whose copy unit
    zero-fills a box past the tensor's extent and whose stores skip it, where the group
    has at least one whole tile of each and x's and dy's pixels are rows of 16-byte units
    (the copy unit's strides; 110 channels refused).  wgwgrad's copies and wgwhalo's
    64 x 64 tile take dividing tiles only."""
    return (
        issubclass(cls, Wgwtma)
        and not issubclass(cls, Wgwhalo)
        and min(p.Mg, p.Cg) >= BLOCK
        and p.C % 8 == p.M % 8 == 0
    )


def fuller_tile(p, widest: tuple[int, int], chunks: int, ragged: bool = False) -> tuple[int, int]:
    """``widest`` (maps x channels), or where its grid at the most slices the reduction
    allows holds under half a wave of blocks, the widest tile whose grid holds that
    (else the one whose grid is largest).  resnet18's bf16 wgrads at 32x32 images, B=128
    (H200, 2026-11-28): 256 into 512 maps over 1x1 dy maps, two chunks of pixels, in 36
    blocks of 128 x 256 took 0.018 ms, in 72 of 128 x 128 0.015; 128 into 256 maps in
    36 blocks of 256 x 128 0.014, in 72 of 128 x 128 0.012 (cuDNN 0.008-0.009)."""
    most = most_slices(chunks)

    def blocks(t):
        return tile_count(p, *t) * most

    if widest not in covering_tiles(p, ragged=ragged) or blocks(widest) >= SMS // 2:
        return widest
    fits = covering_tiles(p, lambda bm, bn: bm * bn <= MOST_SUMS, ragged)
    half = [t for t in fits if blocks(t) >= SMS // 2]
    if half:  # the widest of them, the squarest of equal ones (each reads fewer rows)
        return max(half, key=lambda t: (t[0] * t[1], -abs(t[0] - t[1])))
    return max(fits, key=lambda t: (blocks(t), t[0] * t[1]))


def tile_count(p, bm: int, bn: int) -> int:
    """The blocks of one slice: a tile of bm maps x bn channels of each tap and group (the
    last of a group's past its maps or channels, where tiles are ragged)."""
    return p.R * p.S * ceil_div(p.Cg, bn) * ceil_div(p.Mg, bm) * p.groups


MOST_SLICES = 16  # slices tried for a fuller last wave: each adds a row of the sums' pass
SLICE_CHUNKS = 2  # chunks of the reduction a slice walks at the least


def reduction_chunks(p, chunk: int) -> int:
    """The chunks of ``chunk`` pixels that the batch's output pixels make: the
    reduction's length, which slices cut."""
    return -(-p.batch * p.Ho * p.Wo // chunk)


def most_slices(chunks: int) -> int:
    """The most slices a reduction of ``chunks`` chunks is cut into: up to
    ``MOST_SLICES``, none walking fewer than ``SLICE_CHUNKS``."""
    return max(1, min(MOST_SLICES, chunks // SLICE_CHUNKS))


def slices_for(blocks: int, tiles: int, chunks: int | None = None) -> int:
    """Slices of the batch's pixels (one a grid z index) for ``blocks`` blocks at once of
    ``tiles`` each: from ``blocks // tiles`` up, the fewest whose grid fills the last
    wave of blocks to 90% (up to ``MOST_SLICES``), else the one that fills it best;
    never so many that a slice walks fewer than ``SLICE_CHUNKS`` of the reduction's
    ``chunks``, since a slice's sums cost a trip through the workspace whatever its
    length.  One slice of 144 tiles ran vgg11's widest fp32 wgrad (C=M=512, 28x28,
    B=32) in 3.66 ms against cuDNN's 0.83: its second wave of blocks held 12 (H200,
    2026-11-28); resnet18's bf16 wgrad of 256 channels into 512 maps over 1x1 dy maps
    at B=128, two chunks of pixels, ran in 7 slices in 0.027 ms against cuDNN's 0.009.
    Where even ``MOST_SLICES`` slices leave the grid under ``blocks`` (a layer of a few
    tiles, as a 1x1 layer's), ``blocks // tiles``: mobilenet_v2's 1x1 fp32 wgrad of 96
    channels into 24 maps, one tile, ran on wgnchw in tf32 in 0.037 ms at 264 slices
    (cuDNN 0.040) where 16 slices had left 116 of the 132 SMs idle (H200, 2026-11-30)."""
    if tiles * MOST_SLICES < blocks:
        deepest = 65535 if chunks is None else max(1, chunks // SLICE_CHUNKS)
        return max(1, min(blocks // tiles, deepest, 65535))

    def filled(s: int) -> float:
        n = tiles * s
        return n / (-(-n // blocks) * blocks)

    most = MOST_SLICES if chunks is None else most_slices(chunks)
    first = max(1, min(blocks // tiles, 65535, most))
    options = range(first, max(first, most) + 1)
    return next((s for s in options if filled(s) >= 0.9), None) or max(options, key=filled)


def tile_limits(p, v, fallback: str, ragged: bool = False) -> None:
    """The block tile of a warpgroup wgrad (``v.key``'s, v.blocktile maps x channels of one
    tap): 64, 128 or 256 of each, dividing a group's maps and channels (or covering
    them, where ``ragged``: ``covering``); ``fallback``, the strategy named where no tile
    divides them."""
    bm, bn = v.blocktile
    at = f"{v.key} b{bm}x{bn}"
    if bm not in MAP_TILES:
        raise SpecError(f"{at}: a warpgroup multiplies 64 maps; choose 64, 128 or 256")
    if bn not in CHANNEL_TILES:
        raise SpecError(f"{at}: the channels of a tile are wgmma's N, 64, 128 or 256")
    for tile, extent, tiles, what, note in (
        (bm, p.Mg, MAP_TILES, "maps", ""),
        (bn, p.Cg, CHANNEL_TILES, "channels", " (a tile is one tap's)"),
    ):
        if tile in covering(extent, tiles, ragged):
            continue
        if ragged and extent % BLOCK:
            raise SpecError(
                f"{at}: a tile of {tile} {what} lies past the {extent} {what} of a group "
                f"rounded up to {BLOCK}; choose fewer"
            )
        fits = [d for d in tiles if extent % d == 0]
        raise SpecError(
            f"{at}: {tile} {what} must divide the {extent} {what} of a group{note}; "
            + (f"choose one of {choices(fits)} {what}" if fits else f"use --strategy {fallback}")
        )


def ring_limits(v) -> None:
    """A warpgroup wgrad's ring of 2 to 8 chunks and its slices, one a grid z index."""
    if not 2 <= v.stages <= 8:
        raise SpecError(f"{v.key} p{v.stages}: the ring holds 2 to 8 chunks")
    if not 1 <= v.splits <= 65535:
        raise SpecError(f"{v.key} s{v.splits}: 1 to 65535 slices (grid z)")


def grid_size(p, v, col_tiles: int, map_tiles: int, every_tap: bool = False) -> Size:
    """The grid of a warpgroup wgrad: a block a tile of one tap (or of every tap) and a
    slice of pixels."""
    return Size(
        "grid",
        f"{col_tiles} x {map_tiles * p.groups} x {v.splits}",
        f"{'channel tiles' if every_tap else '(tap, channel tiles)'} x map tiles"
        f"{' x groups' if p.groups > 1 else ''} x slices of the batch's pixels "
        "(contiguous, chunk-aligned)",
    )


def sliced_plan(p, v, launches, smem, sizes, ctx, workspace, chunk: int) -> Plan:
    """The plan of a warpgroup wgrad whose slices of the batch's pixels are added in order
    by a second launch (``tcwgrad.slice_sums``): a slice's sums are at most its pixels
    deep, and the adds ``splits`` deep."""
    return Plan(
        shape=p,
        variant=v,
        template=v.templates[0],
        launches=launches,
        static_smem=0,
        dynamic_smem=smem,
        const_bytes=0,
        weight_format="f32",
        sizes=sizes,
        context={**ctx, **descriptor()},  # 128-byte rows
        workspace_bytes=workspace,
        sum_depth=(p.Ho * p.Wo, v.splits, v.splits + chunk),
        arch="sm_90a",
    )


def _math_of(p, v) -> None:
    if p.dtype is DType.FP32:
        raise SpecError(
            "wgwgrad multiplies 16-bit tensors (tf32 operands cannot be MN-major in wgmma): "
            "use --strategy tcwgrad"
        )
    own = MATH[p.dtype]
    if v.precision is not own:
        raise SpecError(
            f"wgwgrad multiplies {p.dtype.value} tensors in {own.value}: take --precision "
            f"{own.value}"
        )


def plan_wgwgrad(p, v: Wgwgrad) -> Plan:
    # 1. limits
    if p.layout is not TensorLayout.NHWC:
        raise SpecError(
            "wgwgrad reads channels-last tensors (rows of pixels, 16-byte copies along the "
            "channels and maps): use layout=nhwc in the shape spec, or --strategy wstrip"
        )
    _math_of(p, v)
    bm, bn = v.blocktile
    ragged = ragged_tiles(type(v), p)
    tile_limits(p, v, "tcwgrad", ragged)
    if bm * bn > MOST_SUMS:
        raise SpecError(
            f"wgwgrad b{bm}x{bn}: {bm * bn // (128 * bm // BLOCK)} sums a thread leave no "
            f"registers for the rest (ptxas stops at 128 a thread of {128 * bm // BLOCK}); "
            "at most 128 x 256 or 256 x 128"
        )
    ring_limits(v)
    tma = isinstance(v, Wgwtma)
    dsm = isinstance(v, Wgwdsm)
    halo = isinstance(v, Wgwhalo)
    if halo:
        halo_limits(p, v)
    if dsm and v.splits not in CLUSTER_SLICES:
        raise SpecError(
            f"wgwdsm s{v.splits}: a slice a block of one cluster, each adding an equal share "
            f"of the tile's 8-channel columns: 1, 2, 4 or 8 (at most {CLUSTER_LIMIT}, a "
            "portable cluster)"
        )
    # One slice stores dw itself (wgwdsm's store, no workspace and no second kernel)
    direct = dsm or v.splits == 1
    rects = tap_rects(p)
    prune = not tma and pruned(p, rects)
    db_tap = full_tap(p, rects) if prune and p.bias else 0  # whose first column tile sums db
    flat = tma and not halo and flat_pixels(p)
    nb, hb, bands = bands_of(p) if tma and not flat and not halo else (0, 0, 0)
    a_stage, b_stage = CHUNK * bm * 2, CHUNK * bn * 2
    # wgwhalo: a warpgroup a row of the window's taps over the tile's 64 maps, x's rows
    # of a chunk read at each tap's shift
    taps = p.R * p.S if halo else 1  # the taps of a block's tile
    if halo:  # x's rows in one buffer per stride phase
        h = halo_layout(p)
        b_stage = len(h.phases) * h.xread * 128
    ring = v.stages * (a_stage + b_stage)
    warpgroups = p.R if halo else bm // BLOCK
    threads = 128 * warpgroups + (32 if tma else 0)  # wgwtma: and a producer warp
    # wgwdsm's slices: each block's fp32 sums of the tile (and db's, a float4 a thread),
    # read by the cluster's blocks, in the ring's place
    partials = 4 * bm * bn * taps + (16 * threads if p.bias else 0) if dsm and v.splits > 1 else 0
    ones_at = max(ring, partials)
    bars_at = ones_at + (ONES_BYTES if p.bias else 0)  # wgwtma's mbarriers, 16 B a stage
    smem = bars_at + (16 * v.stages if tma else 0) + 1024  # and the slack to align to 1024 B
    if smem > STAGE_LIMIT:
        most = (STAGE_LIMIT - 1024 - (ONES_BYTES if p.bias else 0)) // (a_stage + b_stage)
        raise SpecError(
            f"{v.key}'s ring of {v.stages} chunks needs {smem} B of shared memory, over the "
            f"{STAGE_LIMIT} B a block may opt in to; choose --stages "
            f"{_halo_stages(p) if halo else most} or a smaller tile"
        )

    # 2. work
    rows_per_pass = 16 * warpgroups  # a thread copies one 16-byte unit of a row
    passes = CHUNK // rows_per_pass  # rows of one block a thread copies
    CgRS = p.Cg * p.R * p.S
    c_tiles = ceil_div(p.Cg, bn)  # the last one past a group's channels where ragged
    col_tiles, map_tiles = p.R * p.S // taps * c_tiles, ceil_div(p.Mg, bm)
    P = p.Ho * p.Wo
    name = v.kernel_name(p)
    ctx, workspace, reduce, gemm, scratch = slice_sums(p, name, v.splits)
    (sh, sw), (pt, _, pl, _) = p.stride, p.pads
    ctx.update(
        elem="f16" if p.dtype is DType.FP16 else "bf16",
        io="unsigned short",
        one="0x3C00" if p.dtype is DType.FP16 else "0x3F80",
        BM=bm,
        BN=bn,
        BK=CHUNK,
        NACC=bn // 2,
        SACC=bn // 2 * (p.S if halo else 1),  # a thread's sums: a window row's taps' in wgwhalo
        stages=v.stages,
        threads=threads,
        warpgroups=warpgroups,
        rows_per_pass=rows_per_pass,
        passes=passes,
        a_blocks=bm // BLOCK,
        b_blocks=bn // BLOCK,
        block_bytes=BLOCK_BYTES,
        a_stage=a_stage,
        b_stage=b_stage,
        ones_at=ones_at,
        ones_words=ONES_BYTES // 4,
        a_ring=v.stages * a_stage,
        ksteps=CHUNK // 16,
        c_tiles=c_tiles,
        # ragged tiles: the stores skip the maps and channels past a group's
        guard_maps=p.Mg % bm != 0,
        guard_chans=p.Cg % bn != 0,
        CgRS=CgRS,
        P=P,
        sh=sh,
        sw=sw,
        pt=pt,
        pl=pl,
        map_tiles=map_tiles,
        precision_note=ROUNDING[v.precision].replace("x and w", "x and dy"),
        tma=tma,
        # the template's store: the blocks of a cluster adding a tile's slices (wgwdsm),
        # 1 where one block stores its tile, 0 where the slices go through the workspace
        cluster=v.splits if dsm else int(direct),
        # wgwdsm: the tile's channels a block of the cluster stores, and where db's
        # partial sums lie (after the tile's)
        share_channels=bn // v.splits if dsm else bn,
        db_partials_at=4 * bm * bn,
        prune=prune,
        tap_rects=rects,
        db_block=db_tap * c_tiles,
        halo=halo,
    )
    grid = (col_tiles, map_tiles * p.groups, v.splits)
    if direct:  # dw and db stored by the blocks themselves
        outs = (Role.DW, *((Role.DB,) if p.bias else ()))
        main = Launch(
            name, (Role.X, Role.DY, *outs, Role.BATCH), (threads, 1, 1), grid, 2, 0, 1, smem
        )
        reduce, workspace = None, 0
        scratch = Size(
            "cluster" if dsm else "slices",
            f"{v.splits} block(s) along z, a slice of the batch's pixels each",
            (
                f"each block's {bm} x {bn} fp32 sums in its shared memory; block q adds channels "
                f"{bn // v.splits}q.. of the tile of all {v.splits} in rank order through "
                "distributed shared memory and stores them in dw"
                if v.splits > 1
                else "one block a tile: its sums stored in dw"
            ),
        )
    else:
        main = slice_kernel(name, threads, grid, smem)
    if halo:
        # the 16-byte units a stage's zero-fill writes, 8 a row: dy's rows past the band,
        # x's past each box
        zero_units = 8 * (h.tail_rows + len(h.phases) * h.x_tail)
        ctx.update(
            nb=1,
            hb=h.hb,
            bands=h.bands,
            Wo=p.Wo,
            Wp=h.Wp,
            rows=h.rows,
            ksteps=h.ksteps,
            tail_rows=h.tail_rows,
            xrows=h.xrows,
            xread=h.xread,
            x_tail=h.x_tail,
            zero_units=zero_units,
            zero_all=v.stages * zero_units,  # those of every stage
            x_zero_from=h.xrows - h.tail_rows,  # x's row of fill row k, one phase
            phases=h.phases,
            phase_bytes=h.xread * 128,
            phase_at=[i * h.xread * 128 for i in range(len(h.phases))],  # each buffer's bytes in
            tap_columns=bn // 8,  # a tap's 8-channel columns: its float4s of a thread's sums
            # the float4s of a thread's sums (a window row's taps) this block of the cluster stores
            halo_share=bn // 8 * p.S // v.splits,
            # each tap's x rows: its phase's buffer, from the tap's shift on (bytes)
            tap_at=[
                [(ph * h.xread + at) * 128 for ph, at in zip(phs, ats)]
                for phs, ats in zip(h.phase_of, h.shifts)
            ],
            bars_at=bars_at,
            stage_bytes=(bm * h.rows + bn * h.xrows * len(h.phases)) * 2,
            flat=False,
        )
        main = replace(main, maps=halo_maps(p))
    elif tma:
        rows = CHUNK if flat else nb * hb * p.Wo  # a unit's pixels: the boxes' rows
        ksteps = ceil_div(rows, 16)
        ctx.update(
            nb=nb,
            hb=hb,
            bands=bands,
            Wo=p.Wo,
            rows=rows,
            ksteps=ksteps,
            tail_rows=16 * ksteps - rows,
            bars_at=bars_at,
            stage_bytes=(bm + bn) * rows * 2,
            flat=flat,
        )
        main = replace(main, maps=flat_maps(p) if flat else tma_maps(p, nb, hb))
    if halo:
        tile = Size(
            "block tile",
            f"{bm} maps x {bn} channels of all {p.R * p.S} taps",
            f"{warpgroups} warpgroup(s) of m64n{bn}k16, one a window row: {p.S} taps x "
            f"{bn // 2} fp32 sums per thread",
        )
        ring_text = (
            f"{v.stages} stages x (64 rows of dy's {bm} maps + {len(h.phases)} x {h.xread} "
            f"rows of x's {bn} channels, a buffer per stride phase: the band's {h.hb} "
            f"output rows padded to {h.Wp} and the taps' rows under them) x 128 B, "
            "128B-swizzled"
        )
    else:
        tile = Size(
            "block tile",
            f"{bm} maps x {bn} channels of one tap",
            f"{warpgroups} warpgroup(s) of m64n{bn}k16, {bn // 2} fp32 sums per thread",
        )
        ring_text = (
            f"{v.stages} stages x {CHUNK} pixels x ({bm} maps + {bn} channels) x 2 B in blocks "
            "of 64 rows x 128 B, 128B-swizzled"
        )
    sizes = (
        gemm,
        tile,
        Size(
            "__shared__",
            f"{smem} B (dynamic)",
            ring_text
            + (f"; {ONES_BYTES} B of ones for db" if p.bias else "")
            + (f"; {16 * v.stages} B of mbarriers" if tma else "")
            + "; 1024 B of slack to align the ring",
        ),
        grid_size(p, v, col_tiles, map_tiles, halo),
        scratch,
    )
    if prune:
        sizes += (
            Size(
                "taps' pixels",
                f"{kept_pixels(rects)} of {p.R * p.S} x {P} an image",
                "a tap's block walks only the output pixels whose input pixel lies in the "
                "image (a rectangle a tap), the rest being zero padding",
            ),
        )
    launches = (main,) if direct else (main, reduce)
    return sliced_plan(p, v, launches, smem, sizes, ctx, workspace, CHUNK)
