"""``wgmma``: the implicit GEMM of ``tcgemm`` on Hopper's warpgroup tensor cores.

The product is the same, y[p][m] = sum over k of X[p][k] * W[m][k] with k = (r, s, c)
walked tap by tap, but computed transposed, D[m][p] = W[m][k] X[p][k]: a warpgroup's
``wgmma.mma_async`` m64nNk16 multiplies 64 maps by up to 256 pixels with both operands
read from shared memory by the tensor cores themselves, so no thread spends issue slots
or shared-memory bandwidth on ``ldmatrix`` (the limit of ``tcgemm``'s mma.sync on wide
layers).  Each warpgroup owns 64 maps and every pixel of the block.  Chunks of 64
channels (one 128-byte row per map or pixel) reach a ring of ``stages`` buffers, laid
out in the 128-byte swizzle that the operand descriptors name, zero-filled at the
padding.  Where a group's channels fit 32 or 64 bytes (up to 16 or 32 16-bit channels,
8 or 16 fp32), a row is that wide instead, in the swizzle of that width (``ring_row``):
the rest of a 128-byte row would be zeros, copied and multiplied.  On the H200 that took
mobilenet_v2's 1x1 bf16 layers of 16 to 32 channels from 0.0518 to 0.0360 ms (a dgrad
reducing over 16 maps) and from 0.0773 to 0.0643 (a forward pass of 16 channels), their
kernels unchanged otherwise.  The multiplies of ``inflight`` chunks run at once
(``wgmma.wait_group inflight - 1``).  Four ways to feed them (``--feed``):

* ``tma`` (the default where it applies): one thread of a producer warp issues two
  ``cp.async.bulk.tensor`` copies a chunk, a box of x (the tile's pixels at one tap:
  whole output rows, or whole images) and a box of w (the tile's maps at that tap),
  from tensor maps the runtime encodes for the tensors' addresses (``specgen.tma``).
  The copy unit writes the swizzle and the zeros of the padding itself, and an mbarrier
  a stage completes when the boxes' bytes have landed; the consumer warps retire each
  stage at another.  It needs stride 1 and a tile of whole output rows, but for a 1x1
  layer without padding, whose x is the batch's pixels as rows: there the box is the
  tile's run of them, wherever the output rows end (``tcgemm.flat_pixels``).  Where no
  power-of-two tile is whole rows (the networks' 56x56 and 28x28 maps), the tune space
  holds tiles that are: 112 or 224 pixels (``row_tiles``).  On the H200 it
  took the wide layers' bf16 forward from 0.035/0.038 ms to 0.031/0.034 (ae-enc2/ae-dec2)
  and their tf32 forward from 0.066/0.071 to 0.058/0.062: the consumers issue nothing
  but the multiplies and their waits.
* ``i2c``: ``tma`` with x's copy in the copy unit's im2col mode (``tma.Im2colMap``): the
  map names the window's reach (its corner's positions in an image run from minus the
  padding to the last output pixel's, ``stride`` apart), and one copy takes the tile's
  pixels from its first, walking output rows and images as the GEMM numbers them, each
  at the tap's offset within the filter, zeros where the tap falls in the padding or
  past the batch.  So any tile on any map at any stride: the 14x14 and 7x7 maps and the
  strided layers whose rows no box of whole rows takes.  Not for a strided dgrad (its
  phases are no convolution's windows) nor for groups whose channels end inside a
  chunk (the copy would read the next group's).
* ``sy``: every warp copies with 16-byte ``cp.async``, and the block meets at one
  barrier a chunk; a stage is refilled ``inflight`` chunks after its multiply was
  issued, so ``stages - inflight`` chunks of copies fly ahead.  Any stride and tile.
* ``ws``: a producer warpgroup copies with ``cp.async``, and mbarriers say "landed"
  (after the producer's own wait and proxy fence) and "retired" (by each consumer
  warp).  The producer announces a chunk ``stages - inflight`` chunks after issuing it:
  a longer lag deadlocks when the consumers retire a chunk only after multiplying the
  next.  On the H200 the 128 producer threads issuing every copy were slower than
  ``sy`` (0.037 against 0.035 ms on ae-enc2), so ``ws`` stays in the tune space only.

ptxas serializes every wgmma when a non-wgmma instruction may read the sums while a
multiply is in flight (a single ``cvt.rn.bf16.f32`` in the epilogue was enough): the
epilogue rounds pairs, and the compile test reads ptxas's report for that.  The epilogue
(bias, activation, rounding) stages the tile through shared memory as [pixel][map] rows
and stores it in 16-byte pieces along the maps, as NHWC y lies.

``pe`` (persistent): a block for each resident slot walks the tiles.  With ``sy`` the
next tile's first chunks are issued while this one's staged rows go out.  With ``tma``
and ``i2c`` the producer thread counts the block's chunks across its tiles (the ring's
stages and phases run on), and copies the next tile's while the consumers stage and
store this one's sums in a buffer of their own after the ring; the consumers give
back a tile's last chunk after their final wait.  ptxas then holds 288 threads to 168
registers, so the widest such tiles of 128 maps are 128 pixels (192 spilled).

fp32 NHWC tensors are multiplied in tf32: a 128-byte row holds 32 fp32 channels and an
m64nNk8 tf32 step reads 32 bytes of it, as a k16 step does, so the ring, swizzle and
descriptors are the same; the sums are stored whole.  The tensor cores read the fp32
words as tf32 with no cvt on the way, so the error bound takes them truncated
(``tf32_truncated``).

``wgdsm`` is ``wgmma`` with the reduction cut into ``kslices`` slices of the chunks, the
blocks of one thread block cluster along y (2 to 8, sharing one tile).  Each block walks
its slice, leaves its fp32 sums in its own shared memory, and after the cluster's barrier
adds one share of the tile's 8-pixel columns of every block's sums, in rank order, through
distributed shared memory (``mapa``, ``ld.shared::cluster``), then stores that share
through the epilogue; a second barrier keeps each block's memory until every block has
read it.  No workspace and no second kernel: where small maps leave wgmma's grid with
fewer blocks than the SMs (resnet18's 2x2 to 4x4 maps at B=128, resnet50's 7x7 maps at
B=32) the slices fill them; on the H200 the 3x3 layer of 512 channels over 7x7 maps went
from 0.028 to 0.024 ms at B=32.

``wgmma`` exists on sm_90a only: the plan says so and the compile step targets it.
dgrad at stride 1 comes through the forward view, as for every forward strategy.  A
strided dgrad is a GEMM per stride phase of dx (``tcgemm.phases_of``: rows h = a mod sh,
columns w = b mod sw, each over the taps that reach it), blockIdx.z the phase, so no
multiply meets a zero the stride would insert; its chunks come through ``sy`` (every
warp copies: a phase's pixels are not whole rows of a TMA box), a tile a block.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, fields, replace

from ..errors import SpecError
from ..plan.common import (
    SM_SHARED,
    Launch,
    Plan,
    Size,
    ceil_div,
    shape_context,
    thread_registers,
    y_args,
)
from ..shapes import ConvProblem, DType, Feature, Op, TensorLayout
from ..tensors import Role
from ..tma import Im2colMap, TensorMap
from ..variants import (
    EPILOGUE,
    GEOMETRY,
    Choice,
    Count,
    Pair,
    Precision,
    Switch,
    Variant,
    param,
)
from .mma import ROUNDING
from .tcgemm import MATH, STAGE_LIMIT, VECTOR, flat_pixels, gemm_view, k_walk, phases_of

CHUNK_BYTES = 128  # a stage's row per map and per pixel: 64 16-bit or 32 fp32 channels
# The narrower rows of the 64- and 32-byte swizzles, for a group whose channels fit one
# (``ring_row``): 16, 24 or 32 16-bit channels fill 32 or 64 bytes where a 128-byte row
# would carry zeros in three quarters or half of every copy and multiply.
NARROW_ROWS = (32, 64)
SMS = 132  # the H200's SMs, for sizing the grid
REGISTERS = 65536  # per SM
PIXEL_TILES = (64, 128, 192, 256)  # wgmma's N: a multiple of 8 up to 256; 64 keeps copies even
# The tma feed's other tiles: whole output rows (or images) of the map that none of
# PIXEL_TILES is, 64 to 256 pixels in steps of wgmma's 8: 112 and 224 pixels on 56x56
# maps, 112 on 28x28 ones.  Its copies are the boxes, so nothing asks a power of two.
ROW_TILES_KEPT = 2  # the widest this many go into the tune space
# tma's persistent tiles in the tune space beside the row tiles' (pixels, maps, stages):
# the staged sums lie after the ring, and ptxas holds 288 threads to 168 registers
PERSISTENT_TMA_TILES = ((128, 128, 4), (128, 64, 6), (256, 64, 4))
# i2c's tiles in the tune space (pixels, maps, stages): im2col copies take any tile
I2C_TILES = (
    (256, 128, 3),
    (256, 128, 4),
    (128, 128, 4),
    (128, 128, 6),
    (192, 128, 4),
    (128, 64, 6),
    (128, 256, 4),
)


class Feed(enum.Enum):
    """How chunks reach the ring (the tags of the variant names)."""

    SY = "sy"  # every warp copies with cp.async, a barrier a chunk
    WS = "ws"  # a producer warpgroup copies with cp.async, under mbarriers
    TMA = "tma"  # a producer thread issues two TMA copies a chunk, under mbarriers
    I2C = "i2c"  # the same, x's copy in the TMA unit's im2col mode: any tile, any stride


@dataclass(frozen=True, kw_only=True)
class Wgmma(Variant):
    key = "wgmma"
    templates = ("gemm/wgmma.cu.j2",)
    family = "gemm"
    description = (
        "implicit GEMM on Hopper's warpgroup tensor cores (sm_90a): NHWC 16-bit tensors, "
        "16-byte cp.async into a ring swizzled at its rows' width (32, 64 or 128 bytes), "
        "wgmma.mma_async from shared memory, fp32 sums"
    )
    serves = GEOMETRY | EPILOGUE | {Feature.DTYPE16, Feature.NHWC}
    precisions = (Precision.BF16, Precision.FP16, Precision.TF32)
    tensor_core = True
    ops = frozenset({Op.FPROP, Op.DGRAD})
    phased_dgrad = True  # a strided dgrad a GEMM per stride phase (``phases_of``)
    # tf32 operands are fp32 words read by the tensor cores from shared memory, with no
    # cvt.rna on the way: the error bound takes them truncated (2^-10 relative).
    tf32_truncated = True

    blocktile: tuple[int, int] = param(
        (256, 128),
        Pair("b"),
        "wgmma: the block's tile of y, output pixels x maps (64 maps a warpgroup)",
    )
    stages: int = param(3, Count("p"), "wgmma: chunks of 64 channels in the shared-memory ring")
    inflight: int = param(
        1, Count("q"), "wgmma: chunks whose multiplies run at once (wgmma.wait_group q-1)"
    )
    persistent: bool = param(
        False,
        Switch("pe", "gr", ("persistent", "one-tile-a-block")),
        "wgmma: blocks for the SMs walk the tiles, the next tile's first chunks copied while "
        "this tile's sums go out (pe); or a block for each tile (gr)",
    )
    feed: Feed = param(
        Feed.TMA,
        Choice(Feed, "feed"),
        "wgmma: every warp copies and the block syncs on each chunk (sy); a producer "
        "warpgroup copies under mbarriers (ws); a producer thread's TMA copies, a box of "
        "each operand a chunk, under mbarriers (tma); the same with x's copy in the TMA "
        "unit's im2col mode, the tile's pixels wherever they lie (i2c)",
    )

    def plan(self, problem):
        return plan_wgmma(problem, self)

    @classmethod
    def fit(cls, problem, seed):
        """The tensors' own math; the TMA feed where its boxes take the tile (else x
        copied in im2col mode, else every warp copies); 64 maps a warpgroup, as many
        warpgroups as the group's maps fill (up to two), and the widest pixel tile that
        fits the registers and whose grid fills the SMs' waves within 10% of the best."""
        _math_of(problem, seed)
        g = gemm_view(problem)  # a strided dgrad's GEMM: dy's channels into dx's maps
        phases = phases_of(problem, 1)
        maps = min(seed.blocktile[1], 64 * ceil_div(g.Mg, 64))
        pixels = problem.batch * max(ph["HW"] for ph in phases)
        tiles = ceil_div(g.Mg, maps) * g.groups * len(phases)

        def filled(bn):
            blocks = ceil_div(pixels, bn) * tiles
            return blocks / (ceil_div(blocks, SMS) * SMS)

        # The seed's feed where some tile takes it; TMA's boxes need whole output rows
        # and stride 1, and where no tile gives them x is copied in im2col mode (any
        # tile, any stride), else by every warp.
        feeds = [seed.feed] + ([Feed.I2C, Feed.SY] if seed.feed is Feed.TMA else [])
        for feed in feeds:
            seed = replace(seed, feed=feed)
            fits = []
            for bn in PIXEL_TILES:
                try:
                    plan_wgmma(problem, replace(seed, blocktile=(bn, maps)))
                    fits.append(bn)
                except SpecError:
                    pass
            fits = [bn for bn in fits if bn <= seed.blocktile[0]] or fits
            if fits:
                break
        if not fits:  # every tile is refused: let the seed's plan say why
            return replace(seed, blocktile=(seed.blocktile[0], maps))
        # no wider than the narrowest tile that holds every pixel: a squeeze layer's 8
        # pixels (1x1 maps, B=8) took 256-pixel tiles, and in tf32 16 bytes spilled
        fits = [bn for bn in fits if bn <= min((t for t in fits if t >= pixels), default=bn)]
        best = max(filled(bn) for bn in fits)
        bn = max(bn for bn in fits if filled(bn) >= 0.9 * best)
        return replace(seed, blocktile=(bn, maps))

    @classmethod
    def space(cls, problem, precision):
        """The tiles and stages below with each feed, persistent or not; a strided
        dgrad's with ``sy`` one tile a block only."""
        phased = problem.op is Op.DGRAD
        members = [
            (bn, bm, stages, inflight, feed, persistent)
            for bn, bm, stages in (
                (256, 128, 3),
                (256, 128, 4),
                (128, 128, 3),
                (128, 128, 4),
                (128, 128, 6),
                (192, 128, 4),
                (128, 64, 4),
                (128, 64, 6),
                (64, 128, 8),
                (128, 256, 4),
                (192, 192, 4),
                # 129 to 192 maps in one tile, x read once: mobilenet_v2's 1x1 layers of
                # 24 and 144 channels at 56x56 took 0.036 ms in 128-map tiles (one of them
                # 16 maps), 0.032 in this (bf16, B=64, H200, pe_sy)
                (128, 192, 3),
            )
            for inflight, persistent, feed in (
                (1, False, Feed.SY),
                (2, False, Feed.SY),
                (1, True, Feed.SY),
                (2, True, Feed.SY),
                (2, False, Feed.WS),
                (1, False, Feed.TMA),
                (2, False, Feed.TMA),
            )
            if not (phased and (persistent or feed is not Feed.SY))
        ]
        if not phased:
            # tma's whole-row tiles where the map's rows fit none of the above; then x's
            # copy in im2col mode, which takes any tile (but a 1x1 layer's flat box); then
            # the persistent form of each feed's two chunks in flight
            more = [
                (bn, bm, stages, inflight, Feed.TMA, False)
                for bn in row_tiles(problem)[-ROW_TILES_KEPT:]
                for bm, stages, inflight in ((128, 3, 1), (128, 4, 2), (64, 6, 1))
            ]
            if not flat_pixels(gemm_view(problem)):
                more += [
                    (*tile, inflight, Feed.I2C, False) for tile in I2C_TILES for inflight in (1, 2)
                ]
            more += [(*m[:5], True) for m in more if m[3] == 2]
            more += [(bn, bm, st, 2, Feed.TMA, True) for bn, bm, st in PERSISTENT_TMA_TILES]
            members += more
        return [
            cls(
                blocktile=(bn, bm),
                stages=st,
                inflight=q,
                persistent=pe,
                feed=feed,
                precision=precision,
            )
            for bn, bm, st, q, feed, pe in members
        ]


SWIZZLE_MODES = {128: 1, 64: 2, 32: 3}  # an operand descriptor's layout type, by row bytes


def descriptor(row: int = CHUNK_BYTES) -> dict:
    """The context of the operand descriptor (``common/wgmma.j2``) for K-major tiles of
    ``row``-byte rows in the swizzle of that width: the row, the bytes from one group of
    8 rows to the next and the same in the descriptor's 16-byte units, and the layout
    type.  wgmma's narrow rows take 64 or 32; wgplanar's, wgnchw's and wgwgrad's rows are
    128 bytes."""
    return dict(
        desc_row=row,
        desc_group=8 * row,
        desc_group_units=8 * row // 16,
        desc_mode=SWIZZLE_MODES[row],
    )


def ring_row(p: ConvProblem) -> int:
    """Bytes of a ring row (one map's or one pixel's channels of a chunk) for GEMM view
    ``p``: the narrowest of the 32- and 64-byte swizzles that holds a group's channels,
    else 128 bytes (64 16-bit or 32 fp32 channels a chunk).  A wgmma k step reads 32
    bytes of a row in any of the three."""
    need = p.Cg * p.dtype.bytes
    return next((row for row in NARROW_ROWS if need <= row), CHUNK_BYTES)


def row_tiles(problem: ConvProblem) -> list[int]:
    """The pixel tiles beyond ``PIXEL_TILES`` whose tma boxes are whole output rows of
    one image (or whole images) of ``problem``'s GEMM, narrowest first; none for a 1x1
    layer whose box is any run of the batch's pixels (``flat_pixels``)."""
    p = gemm_view(problem)
    if flat_pixels(p):
        return []
    row = ring_row(p)
    chunk = row // p.dtype.bytes
    out = []
    for bn in range(64, 257, 8):
        if bn in PIXEL_TILES:
            continue
        try:
            _boxes(p, bn, 64, chunk, row)
        except (SpecError, ValueError):
            continue
        out.append(bn)
    return out


@dataclass(frozen=True, kw_only=True)
class Wgdsm(Wgmma):
    key = "wgdsm"
    description = (
        "wgmma with the reduction cut into slices, the blocks of one thread block cluster "
        "(sm_90a), their sums added in rank order through distributed shared memory"
    )

    kslices: int = param(
        2,
        Count("k"),
        "wgdsm: slices of the reduction (taps x channels), the blocks of one cluster, "
        "their sums added through distributed shared memory",
    )

    @classmethod
    def fit(cls, problem, seed):
        """wgmma's tile one block a tile; then the fewest slices (2, 4 or 8, as the
        tile's pixels allow) whose clusters fill the SMs, each slice at least
        ``SLICE_CHUNKS`` chunks long."""
        v = replace(super().fit(problem, seed), persistent=False)
        if v.feed is Feed.WS:
            v = replace(v, feed=Feed.SY)
        return replace(v, kslices=_fewest_slices(problem, v))

    @classmethod
    def space(cls, problem, precision):
        """wgmma's candidates of one block a tile fed by every warp or by TMA (one chunk's
        multiplies at a time), each with 2, 4 and 8 slices where the tile's 8-pixel
        columns divide into them."""
        out = []
        for v in Wgmma.space(problem, precision):
            copied = v.feed in (Feed.TMA, Feed.I2C)
            if v.persistent or v.feed is Feed.WS or (copied and v.inflight > 1):
                continue
            own = {f.name: getattr(v, f.name) for f in fields(v)}
            for kslices in (2, 4, 8):
                if (v.blocktile[0] // 8) % kslices == 0:
                    out.append(cls(**own, kslices=kslices))
        return out


SLICE_CHUNKS = 4  # chunks a slice walks at the least: its prologue and the sums' trip


def _fewest_slices(problem: ConvProblem, v: Wgmma) -> int:
    """wgdsm's slices for ``v``'s tile: the fewest of 2, 4 and 8 whose blocks fill the
    SMs (else the most), each dividing the tile's pixel columns and walking at least
    ``SLICE_CHUNKS`` chunks."""
    g = gemm_view(problem)
    bn, bm = v.blocktile
    chunk = ring_row(g) // g.dtype.bytes
    phases = phases_of(problem, ceil_div(g.Cg, chunk))
    kt = max(ph["kt"] for ph in phases)
    tiles = (
        ceil_div(g.Mg, bm) * g.groups * sum(ceil_div(problem.batch * ph["HW"], bn) for ph in phases)
    )
    options = [k for k in (2, 4, 8) if (bn // 8) % k == 0 and kt // k >= SLICE_CHUNKS] or [2]
    return next((k for k in options if tiles * k >= SMS), options[-1])


def _im2col_serves(p: ConvProblem, phased: bool, chunk: int) -> None:
    """Refuse, in one line, a GEMM whose x the im2col copy cannot take."""
    if phased:
        why = "a strided dgrad's phases are no convolution's windows; choose --feed sy"
    elif flat_pixels(p):
        why = (
            "a 1x1 layer at stride 1 without padding takes tma's box of the batch's "
            "pixels; choose --feed tma"
        )
    elif p.groups > 1 and p.Cg % chunk:
        why = f"a copy of {chunk} channels would run past a group's {p.Cg}; choose --feed sy"
    else:
        return
    raise SpecError(f"wgmma i2c copies x in im2col mode: {why}")


def _math_of(p: ConvProblem, v: Wgmma) -> None:
    want = MATH[p.dtype]
    if v.precision is not want:
        raise SpecError(
            f"wgmma multiplies the tensors' own dtype (fp32 as tf32): {p.dtype.value} "
            f"tensors take --precision {want.value}"
        )


def _boxes(
    p: ConvProblem, bn: int, bm: int, chunk: int, row: int, im2col: bool = False
) -> tuple[TensorMap | Im2colMap, TensorMap]:
    """The tensor maps of ``tma``: x as [N][H][W][groups][C/g] with a box of a chunk's
    channels by the tile's whole output rows (or whole images) at one tap, so that the
    box's rows are the tile's pixels in order and the copy unit zero-fills the padding;
    w as [groups][M/g][R*S][C/g] with a box of a chunk's channels by the tile's maps at
    one tap.  A 1x1 layer at stride 1 without padding (``flat_pixels``) reads x as
    [the batch's pixels][1][1][groups][C/g] instead, its box the tile's pixels whatever
    rows they fall in.  SpecError where the tile is not whole rows or the stride is not 1.
    ``im2col``: x as [N][H][W][C] in the copy unit's im2col mode instead, the tile's
    pixels from its first (any tile, any stride), their window at a tap's offset.  Each
    box row is a ring row of ``row`` bytes in the swizzle of that width."""
    HoWo, Wo = p.Ho * p.Wo, p.Wo
    e = p.dtype.bytes
    rs = p.R * p.S
    w = TensorMap(
        Role.W,
        e,
        (p.Cg, rs, p.Mg, p.groups),
        (p.Cg * e, rs * p.Cg * e, p.Mg * rs * p.Cg * e),
        (chunk, 1, bm, 1),
        swizzle=row,
    )
    if im2col:  # the corner's positions are the output pixels, lower to upper, stride apart
        (pt, _, pl, _), (sh, sw) = p.pads, p.stride
        try:
            x = Im2colMap(
                Role.X,
                e,
                (p.C, p.W, p.H, None),
                (p.C * e, p.W * p.C * e, p.H * p.W * p.C * e),
                lower=(-pl, -pt),
                upper=((p.Wo - 1) * sw - pl - (p.W - 1), (p.Ho - 1) * sh - pt - (p.H - 1)),
                channels=chunk,
                pixels=bn,
                steps=(sw, sh),
                swizzle=row,
            )
        except ValueError as err:
            raise SpecError(f"wgmma i2c: {err}; choose --feed sy") from None
        return x, w
    if flat_pixels(p):  # the copy unit zero-fills the pixels past the batch
        strides = (p.Cg * e, p.C * e, p.C * e, p.C * e)
        box = (chunk, 1, 1, 1, bn)
        x = TensorMap(Role.X, e, (p.Cg, p.groups, 1, 1, None), strides, box, row, image_elems=HoWo)
        return x, w
    if p.stride != (1, 1):
        raise SpecError(
            f"wgmma tma copies a tap's box of whole rows, which needs stride 1, not "
            f"{p.stride[0]}x{p.stride[1]}; choose --feed sy"
        )
    if bn >= HoWo and bn % HoWo == 0:
        box_rows = (Wo, p.Ho, bn // HoWo)  # whole images
    elif bn < HoWo and HoWo % bn == 0 and bn % Wo == 0:
        box_rows = (Wo, bn // Wo, 1)  # whole rows of one image
    else:
        raise SpecError(
            f"wgmma tma copies whole output rows: a tile of {bn} pixels is not whole rows "
            f"of {Wo} pixels within one {p.Ho}x{Wo} image, nor whole images; choose --feed sy "
            "or another pixel tile"
        )
    if max(box_rows) > 256:
        raise SpecError(f"wgmma tma: a box of {box_rows} pixels is over 256 along one axis")
    x = TensorMap(
        Role.X,
        e,
        (p.Cg, p.groups, p.W, p.H, None),
        (p.Cg * e, p.C * e, p.W * p.C * e, p.H * p.W * p.C * e),
        (chunk, 1, *box_rows),
        swizzle=row,
    )
    return x, w


def plan_wgmma(problem: ConvProblem, v: Wgmma) -> Plan:
    p = gemm_view(problem)  # the GEMM's sizes; ``problem`` keeps the op and geometry
    phased = problem.op is Op.DGRAD
    # 1. limits
    if p.layout is not TensorLayout.NHWC:
        raise SpecError(
            "wgmma reads channels-last tensors (16-byte copies along the channels): "
            "use layout=nhwc in the shape spec, or --strategy mma"
        )
    _math_of(p, v)
    tf32 = p.dtype is DType.FP32
    vec = 4 if tf32 else VECTOR  # elements of a 16-byte copy
    row = ring_row(p)  # bytes of a ring row: 128, or 64 or 32 where the channels fit
    chunk = row // p.dtype.bytes  # channels of a row
    units = row // 16  # its 16-byte copies
    if p.Cg % vec:
        raise SpecError(
            f"wgmma copies {vec} channels at a time: the {p.Cg} channels per group are "
            f"not a multiple of {vec}; use --strategy mma"
        )
    if p.Mg % vec or p.M % vec:
        raise SpecError(
            f"wgmma stores {vec} maps at a time: {p.Mg} maps per group ({p.M} in all) are not "
            f"a multiple of {vec}; use --strategy tcgemm"
        )
    bn, bm = v.blocktile
    if bn not in PIXEL_TILES and not (v.feed is Feed.TMA and bn % 8 == 0 and 64 <= bn <= 256):
        raise SpecError(
            f"wgmma b{bn}x{bm}: a block's pixels are wgmma's N, one of "
            f"{', '.join(map(str, PIXEL_TILES))} (with --feed tma, any multiple of 8 from 64 "
            "to 256 that is whole output rows)"
        )
    if bm % 64 or not 64 <= bm <= 256:
        raise SpecError(
            f"wgmma b{bn}x{bm}: a warpgroup multiplies 64 maps; choose 64, 128, 192 or 256 maps"
        )
    producer = v.feed is not Feed.SY
    im2col = v.feed is Feed.I2C
    tma = v.feed is Feed.TMA or im2col  # a producer thread's TMA copies
    if v.persistent and v.feed is Feed.WS:
        raise SpecError(
            "wgmma pe_ws: the persistent form copies with every warp or by TMA; choose sy, "
            "tma or i2c with pe, or gr with ws"
        )
    kslices = getattr(v, "kslices", 1)  # wgdsm's
    if kslices > 1:
        if v.persistent or v.feed is Feed.WS:
            raise SpecError(
                f"wgdsm k{kslices}: a cluster's blocks share one tile, fed by TMA or by every "
                "warp (choose gr with --feed tma or sy)"
            )
        if not 2 <= kslices <= 8 or (bn // 8) % kslices:
            raise SpecError(
                f"wgdsm b{bn}x{bm} k{kslices}: 2 to 8 slices (a portable cluster), each adding "
                f"whole 8-pixel columns of the tile: a divisor of {bn // 8}"
            )
    if im2col:
        _im2col_serves(p, phased, chunk)
    if phased and (producer or v.persistent):
        raise SpecError(
            f"wgmma's strided dgrad (a GEMM a stride phase) is copied by every warp, a tile "
            f"a block: choose --feed sy{'' if not v.persistent else ' without pe'}"
        )
    boxes = _boxes(p, bn, bm, chunk, row, im2col) if tma else None
    warpgroups = bm // 64
    consumers = 128 * warpgroups  # threads that multiply and store
    # threads that copy: all, a producer warpgroup, or one thread of a producer warp
    copiers = 1 if tma else 128 if producer else consumers
    threads = consumers + (32 if tma else 128 if producer else 0)
    nacc = bn // 2  # fp32 sums per thread: 64 x bn over 128 threads
    budget = thread_registers(threads, 1)
    # Registers, as ptxas allotted them on sm_90a: the sums and about 30 more in a thread
    # that multiplies; five per pixel row and two per map row in a thread that copies.
    a_vecs, b_vecs = ceil_div(bm * units, copiers), ceil_div(bn * units, copiers)
    copying = 0 if tma else 5 * b_vecs + 2 * a_vecs + 30
    need = max(nacc + 30, copying) if producer else nacc + copying + 10
    if v.persistent:
        # the walk over tiles keeps the copy state (sy) or the tile's place and the
        # epilogue's (tma) live beside the sums (ptxas: a 192-pixel tma tile spilled)
        need += 45
    if need > budget:
        raise SpecError(
            f"wgmma b{bn}x{bm}{'_pe' if v.persistent else ''}_{v.feed.value}: "
            f"{warpgroups} warpgroup(s) of {nacc} fp32 sums a thread"
            f"{'' if tma else f' and {b_vecs} pixel rows to copy'} need about "
            f"{need} registers, over the {budget} that {threads} threads get; choose fewer "
            "pixels or more maps"
        )
    if v.inflight not in (1, 2):
        raise SpecError(f"wgmma q{v.inflight}: one or two chunks' multiplies run at once")
    if not v.inflight + 1 <= v.stages <= 8:
        raise SpecError(
            f"wgmma p{v.stages} q{v.inflight}: the ring holds {v.inflight + 1} to 8 chunks "
            f"({v.inflight} being multiplied, the rest in flight)"
        )
    a_stage, b_stage = bm * row, bn * row
    ring = v.stages * (a_stage + b_stage)
    # elements of a staged output row: the pad puts the rows a store touches in distinct banks
    pitch = bm + (4 if tf32 else 8)
    staging = bn * pitch * (4 if tf32 else 2)
    # The staged output tile: in the ring once it is free, or after it where the next
    # tile's copies fill the ring meanwhile.
    staging_at = ring if v.persistent else 0
    # wgdsm: each block's fp32 sums of the tile, read by the cluster's blocks, in the ring
    partials = 4 * bm * bn if kslices > 1 else 0
    bars_at = max(ring, staging_at + staging, partials)  # the producer's mbarriers after them
    bars = 16 * v.stages if producer else 0
    smem = bars_at + bars + 1024  # and the slack to align the ring to 1024 B
    if smem > STAGE_LIMIT:
        fit = (STAGE_LIMIT - 1024 - bars - (staging if v.persistent else 0)) // (
            a_stage + b_stage + (16 if producer else 0)
        )
        raise SpecError(
            f"wgmma's ring of {v.stages} chunks needs {smem} B of shared memory, over the "
            f"{STAGE_LIMIT} B a block may opt in to; choose --stages {fit} or a smaller tile"
        )

    # Two blocks on an SM where both fit (one's epilogue and prologue then overlap the
    # other's multiplies); the bounds hold ptxas to the registers that takes.
    if tma:  # a producer warp beside the consumers: under ptxas's bound for two blocks,
        # the sums and 32 more (a tile's 72 sums and its wgmma took 98), and the
        # persistent walk's 45 (a 256-pixel tile spilled under the bound without them)
        two = nacc + 32 + (45 if v.persistent else 0) <= thread_registers(threads, 2)
    else:
        two = nacc <= 64 and threads <= 256
    per_sm = 2 if 2 * (smem + 1024) <= SM_SHARED and two else 1

    # 2. work
    chunks_per_tap = ceil_div(p.Cg, chunk)
    phases = phases_of(problem, chunks_per_tap)
    kt = max(ph["kt"] for ph in phases)  # the longest walk of a pixel's sums
    # wgdsm: each phase's slice of chunks a block walks (the last slice's fewer)
    phases = [dict(ph, per=ceil_div(ph["kt"], kslices)) for ph in phases]
    if kslices > 1 and kslices > kt:
        raise SpecError(
            f"wgdsm k{kslices}: the reduction is {kt} chunk(s) of {chunk} channels; choose "
            f"at most {kt} slice(s)"
        )
    map_tiles = ceil_div(p.Mg, bm)
    ctx = shape_context(p)
    ctx.update(
        elem={DType.FP16: "f16", DType.BF16: "bf16", DType.FP32: "tf32"}[p.dtype],
        etype="float" if tf32 else "unsigned short",
        kstep=8 if tf32 else 16,
        VEC=vec,
        CHUNK=chunk,
        ROW=row,
        units=units,
        ksteps=row // 32,  # a k step reads 32 bytes of a row
        row_line=CHUNK_BYTES // row,  # rows a 128-byte line of the swizzle holds
        wg_bytes=64 * row,  # a warpgroup's 64 map rows of a stage
        **descriptor(row),
        BM=bm,
        BN=bn,
        NACC=nacc,
        groups_wg=warpgroups,
        stages=v.stages,
        inflight=v.inflight,
        lag=v.stages - v.inflight,  # chunks a producer thread keeps copying past an arrival
        threads=threads,
        consumers=consumers,
        copiers=copiers,
        producer=producer,
        tma=tma,
        flat=tma and not im2col and flat_pixels(p),  # x's box: the batch's rows of pixels
        im2col=im2col,  # x's copy in im2col mode: the tile's pixels from its first one
        persistent=v.persistent,
        staging_at=staging_at,
        bars_at=bars_at,
        per_sm=per_sm,
        a_vecs=a_vecs,
        b_vecs=b_vecs,
        a_tail=bm * units % copiers != 0,  # the last pass copies some threads' rows only
        b_tail=bn * units % copiers != 0,
        rows_per_pass=copiers // units,
        a_stage=a_stage,
        b_stage=b_stage,
        pitch=pitch,
        kt=kt,
        phases=phases,
        phased=phased,
        problem_sh=problem.stride[0],  # the dgrad's own stride (the view's is 1)
        problem_sw=problem.stride[1],
        map_tiles=map_tiles,
        kslices=kslices,
        chunks_per_tap=chunks_per_tap,
        share_pixels=bn // kslices,  # wgdsm: the tile's pixels a block of the cluster stores
        rsc=p.R * p.S * p.Cg,
        guard_maps=p.Mg % bm != 0,
        guard_chans=p.Cg % chunk != 0,
        x_image=p.H * p.W * p.C,
        precision_note=(
            "x and w read as tf32 by the tensor cores (no cvt: the low 13 bits dropped), "
            "products accumulated in fp32"
            if tf32
            else ROUNDING[v.precision]
        ),
    )
    gemm = Size(
        "GEMM",
        f"{p.Mg} x (B*{p.Ho * p.Wo}) x {p.R * p.S * p.Cg}"
        + (f", {p.groups} groups" if p.groups > 1 else ""),
        "maps x output pixels x (r, s, c) taps: y transposed, D = W X^T",
    )
    if phased:
        sh, sw = problem.stride
        gemm = Size(
            "phases",
            f"{len(phases)} of {sh} x {sw}, blockIdx.z",
            "dx rows h = a (mod sh) x columns w = b (mod sw), each a GEMM of C/groups x "
            "(B*its pixels) x (its taps x M/groups) over dy: "
            + ", ".join(f"{ph['HW']} x {ph['RT'] * ph['ST']}" for ph in phases),
        )
    sizes = (
        gemm,
        Size(
            "block tile",
            f"{bm} maps x {bn} pixels",
            f"{warpgroups} warpgroup(s) of 64 maps x {bn} pixels: wgmma m64n{bn}k{8 if tf32 else 16}, "
            f"{nacc} fp32 sums per thread"
            + {
                Feed.SY: "; every warp copies",
                Feed.WS: "; a producer warpgroup copies",
                Feed.TMA: "; a producer thread issues TMA copies",
                Feed.I2C: "; a producer thread issues TMA copies, x's in im2col mode",
            }[v.feed],
        ),
        k_walk(p, kt, chunk, phased),
        Size(
            "__shared__",
            f"{smem} B (dynamic)",
            f"{v.stages} stages x ({bm} + {bn}) rows x {row} B in the {row}B swizzle, "
            f"aligned to 1024 B; then the output tile; {per_sm} block(s) per SM",
        ),
        (
            Size(
                "copies",
                "2 TMA boxes a chunk: x "
                + (
                    f"{bn} pixels x {chunk} channels in im2col mode"
                    if im2col
                    else "x".join(map(str, boxes[0].box))
                )
                + f", w {'x'.join(map(str, boxes[1].box))}",
                "cp.async.bulk.tensor from tensor maps, zero-filled outside the image and "
                f"past the channels by the copy unit, laid out in the {row}B swizzle; "
                "mbarriers count the bytes landed, the consumer warps retire each stage",
            )
            if tma
            else Size(
                "copies",
                f"{a_vecs} + {b_vecs} per copying thread per chunk",
                "16-byte cp.async.cg, zero-filled outside the image and past the channels"
                + ("; mbarriers say landed and retired" if producer else "; a barrier a chunk"),
            )
        ),
    )
    if v.persistent:  # tiles numbered along one axis, the grid capped at the SMs' blocks
        grid, per_image = (0, 1, 1), p.Ho * p.Wo * map_tiles * p.groups
    else:  # a strided dgrad's phases along z, the grid's x for the largest
        most = max(ph["HW"] for ph in phases)
        grid, per_image = (0, map_tiles * p.groups * kslices, len(phases)), most
    if kslices > 1:
        sizes += (
            Size(
                "cluster",
                f"{kslices} blocks along y, a slice of about {ceil_div(kt, kslices)} chunks each",
                f"each block's {bm} x {bn} fp32 sums in its shared memory ({partials} B); "
                f"block q adds columns {bn // kslices}q.. of all {kslices} in rank order "
                "through distributed shared memory and stores them",
            ),
        )
    args = (Role.DY, Role.W, Role.DX) if phased else (Role.X, Role.W, *y_args(p))
    launch = Launch(
        v.kernel_name(problem),
        (*args, Role.BATCH),
        (threads, 1, 1),
        grid,
        0,
        per_image,
        bn,
        smem,
        persistent=v.persistent,
        maps=boxes or (),
    )
    return Plan(
        shape=problem,
        variant=v,
        template="gemm/wgmma.cu.j2",
        launches=(launch,),
        static_smem=0,
        dynamic_smem=smem,
        const_bytes=0,
        weight_format="mrsc." + p.dtype.value,  # mrsc.fp32 for tf32
        weight_transform="dgrad" if phased else "",
        sizes=sizes,
        context=ctx,
        arch="sm_90a",
    )
