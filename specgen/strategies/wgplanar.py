"""``wgplanar``: the forward pass of fp32 NCHW (planar) layers on Hopper's warpgroup
tensor cores, in tf32 or at fp32 accuracy in three tf32 products, reading the planes
where they lie.

The product is ``wgmma``'s, y[p][m] = sum over k of X[p][k] * W[m][k] with k = (r, s, c)
walked tap by tap, but with the pixels on wgmma's M side: D[p][m] = X[p][k] W[m][k].
wgmma reads tf32 operands from shared memory K-major only, and in NCHW the pixels, not
the channels, are the axis along which x lies; so x is the A operand, which wgmma also
takes from registers in whatever order they were loaded.  A chunk of 32 channels of one
tap reaches shared memory as the planes lie, a row of the tile's pixels a channel, by
4-byte ``cp.async`` (16-byte where a 1x1 window at stride 1 maps pixels onto pixels), the
padding and pixels past the batch zero-filled; each thread then loads its fragments
(pixel lane / 4, channel lane % 4, and 8 pixels and 4 channels on) with plain shared
loads, in distinct banks as the rows are 8 words longer than the tile.  The weights are
the B operand: a map's row of 32 channels of the tap in the 128-byte swizzle, as
``wgmma`` stores its A.  The sums leave as they sit in the registers: a warp's store
writes 8 neighbouring pixels of 4 maps, four whole 32-byte sectors of y's planes.

A warpgroup owns 64 pixels and every map of the block's tile; the ring is ``wgmma``'s
``sy`` feed (every thread copies, one barrier a chunk).  A chunk's multiplies are waited
for before the next chunk's fragments are loaded into the same registers (loading them
into registers of their own during the multiplies measured -4% to +5% by layer).

In tf32 math the words are the fp32 ones read with no cvt (``tf32_truncated``).  In
fp32 math (3xTF32, as ``tcgemm``'s) each thread splits x's fragments in its registers
into hi (rounded to tf32) and lo = v - hi, and the weights' words it copied, once they
have landed, into hi in place and lo in a second tile of the stage; a chunk's products
lo x hi, hi x lo and hi x hi start from zero on the tensor cores and are added to the
thread's sums in fp32.  wgmma's own sums truncate: chained over the whole reduction, as
at first, they drifted to 1.2e-4 of vgg11's output against cuDNN fp32's 1.1e-6 (H200,
2026-11-28).

Where the grid leaves SMs idle, ``--splits`` cuts the reduction into slices over grid
z, each slice's sums to its plane of a workspace, added in order by a second kernel with
the bias and activation; the fit prices the count (``_splits_for``).

The fit prices every tile it may take at that tile's own rate, measured on the tunes of
vgg11 and resnet18 (``TILE_RATES``: a chunk of x copied and loaded once serves all of the
block's maps, so wide map tiles run faster, and in 3xTF32 64-pixel tiles are the
slowest), and takes the cheapest where it prices clearly below the tile that best fills
the SMs' waves; a strided dgrad, whose phases' taps are unequal, takes the latter.

dgrad at stride 1 comes through the forward view, as for every forward strategy: dy's
planes are x's, dx's are y's, and the operator packs the weights flipped and transposed
for it, in fp32 a launch of its own every call.  ``wgcols`` is the same kernel for a 1x1
window's dgrad that packs none: planned as itself at any stride (one phase of one tap),
it reads w[M][C/g] where PyTorch lays it out, a row of the view's B a column there, a
warp copying 8 neighbouring rows' 4-byte words a step.  Four times the copy
instructions of the packed 16-byte units, and every block reads all of its maps' w: on
resnet50's wide 1x1 dgrads 5-47% slower, and on mobilenet_v2's features.7.conv.2 (192 <-
64 channels, 14x14, B=64, tf32) 0.0126 ms against 0.0136 with the gather (H200,
2026-11-30, ``wgplanar-1x1-dgrad-weight-columns-*``); so it is the tune's to pick a
layer, the packed kernels timed with their gather (``bench.operator_pack``).  It runs
in tf32 with the reduction whole: a strided 3xTF32 one failed against float64 on the
GPU (2026-12-01), and slices were not proved there.

A strided dgrad is a GEMM per stride phase of dx's pixels (``tcgemm.phases_of``;
blockIdx.z the phase, whose sizes, dy offsets and flipped taps the kernel sets at run
time), over the taps that reach the phase, its sums stored to the phase's pixels of
dx's planes; its reduction stays whole.  The phases that no tap
reaches (a 1x1 window's but one) are cleared by a first kernel over all of dx instead.
Where one phase alone has taps, one a pixel (a 1x1 window's), its reduction may be cut
in slices as a forward pass's: the second kernel adds them into the phase's pixels and
writes the other phases' zeros, so no first kernel clears dx.
``wgplanar`` exists on sm_90a only.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

from ..errors import SpecError
from ..plan.common import (
    COPY_RATE,
    SM_SHARED,
    Launch,
    Plan,
    Size,
    ceil_div,
    shape_context,
    y_args,
)
from ..shapes import ConvProblem, DType, Op, TensorLayout
from ..tensors import Role
from ..variants import EPILOGUE, GEOMETRY, Count, Pair, Precision, Variant, param
from .tcgemm import STAGE_LIMIT, gemm_view, phases_of
from .wgmma import REGISTERS, SMS, descriptor

CHUNK = 32  # channels a stage: a map's 128-byte row of B, four k8 steps
ROW_BYTES = 128
PAD = 8  # words past a channel's row of pixels: 8 rows' first words 8 banks apart
PIXEL_TILES = (64, 128, 192, 256)  # 64 a warpgroup
MAP_TILES = (32, 64, 128, 192, 256)  # wgmma's N
THREE_MOST_MAPS = 128  # fp32 math: a chunk's sums and x's lo words beside the sums
FEW_CHANNELS = 16  # channels a group below which a chunk of 32 is mostly zero-fill
MIN_SLICE_CHUNKS = 8  # chunks a slice of the reduction walks at the least
SM_RATE = 1.8e12  # tf32 flops a second an SM's blocks reach together (H200, fitted)
# What an SM's blocks of one tile reach together, in tf32 flops a second (3xTF32 counts
# its three products), by (pixels, maps, fp32 math): the median over the tunes of vgg11
# (B=32) and resnet18 at 224 (B=64), forward passes and stride-1 dgrads in one slice (521
# timings; nvidia-h200, 2026-11-29, tree e9723ae; ``docs/measurements/
# wgplanar-tile-rates-2026-11-29-from-tunes.log``).  A chunk of x is copied and loaded
# once for all of the block's maps, so the rate grows with the maps; in 3xTF32 the three
# products a chunk amortize it, and a warpgroup alone (64 pixels) has no partner to
# overlap with.  Tiles the tunes timed fewer than 5 times are left out, and so are the
# 256-pixel ones: 3-14% slower than the 128-pixel tile of as many maps on 12 layers of
# resnet34, resnet50, wide_resnet50_2, vgg16 and resnet18 at B=128 (``docs/measurements/
# wgplanar-fit-against-old-2026-11-29-h200.log``).  The three-product rates predate the
# weights' split a 16-byte unit at a time, which raised them 1.15-1.47x; refitted to the
# later tunes' timings they change no pick that those timed faster (``docs/measurements/
# wgplanar-rates-after-split-2026-11-29-from-tunes.log``), so they stay as measured.
TILE_RATES = {
    (64, 32, False): 0.51e12,
    (64, 64, False): 0.83e12,
    (64, 128, False): 1.01e12,
    (64, 192, False): 1.21e12,
    (64, 256, False): 1.63e12,
    (128, 32, False): 0.52e12,
    (128, 64, False): 0.80e12,
    (128, 128, False): 1.21e12,
    (128, 192, False): 1.68e12,
    (128, 256, False): 2.04e12,
    (192, 32, False): 0.53e12,
    (192, 64, False): 0.78e12,
    (192, 128, False): 1.25e12,
    (192, 192, False): 1.99e12,
    (64, 32, True): 0.66e12,
    (64, 64, True): 0.68e12,
    (64, 128, True): 0.80e12,
    (128, 32, True): 0.80e12,
    (128, 64, True): 1.12e12,
    (128, 128, True): 1.39e12,
    (192, 32, True): 0.87e12,
    (192, 64, True): 1.34e12,
}
# The rates' spread.  Of 130 layers timed with the wave-filling tile and the rated one
# (``wgplanar-fit-against-old-2026-11-29-h200.log``): where the rated tile was priced at
# 0.90 of the other's or more, 13 of 40 were slower by 2-10% (the 32-map tiles of the
# autoencoder's layers among them) and 10 faster; below 0.90, 86 of 90 were faster by
# 2-44% and 2 slower (ae-dec1's 8x8 maps in tf32, by 9%).
RATED_MARGIN = 0.9
SUM_LAUNCH = 3e-6  # seconds the kernel that adds the slices costs past its bytes
SUM_BLOCK = 256  # threads of the kernel that adds the slices


@dataclass(frozen=True, kw_only=True)
class Wgplanar(Variant):
    key = "wgplanar"
    templates = ("gemm/wgplanar.cu.j2",)
    family = "gemm"
    description = (
        "forward pass and dgrad of fp32 NCHW tensors on Hopper's warpgroup tensor cores "
        "(sm_90a), in tf32 or in 3xTF32 (fp32 accuracy): the pixels wgmma's M side, x's "
        "planes copied as they lie and loaded into registers as the A operand, the "
        "weights K-major in a 128B-swizzled ring; a strided dgrad a GEMM per stride phase"
    )
    serves = GEOMETRY | EPILOGUE
    precisions = (Precision.TF32, Precision.FP32)
    tensor_core = True
    tf32_truncated = True  # in tf32 math, fp32 words read as tf32 with no cvt: truncated

    blocktile: tuple[int, int] = param(
        (128, 128),
        Pair("b"),
        "wgplanar: the block's tile of y, output pixels x maps (64 pixels a warpgroup)",
    )
    stages: int = param(4, Count("p"), "wgplanar: chunks of 32 channels in the shared-memory ring")
    splits: int = param(
        1,
        Count("s"),
        "wgplanar: slices of the reduction, one block plane each, added in order by a "
        "second kernel",
    )

    ops = frozenset({Op.FPROP, Op.DGRAD})
    phased_dgrad = True  # a strided dgrad a GEMM per stride phase (``phases_of``)
    columns: ClassVar[bool] = False  # a 1x1 dgrad's w read down its columns (``Wgcols``)

    def plan(self, problem):
        return plan_wgplanar(problem, self)

    @classmethod
    def fit(cls, problem, seed):
        """The block tile and slices of the reduction that ``_sliced_seconds`` prices
        cheapest at each tile's ``TILE_RATES``, with the most stages up to 4 that fit,
        where that price is below ``RATED_MARGIN`` of the wave-filling tile's
        (``_filled_fit``); else, and for a strided dgrad's phases, the wave-filling one."""
        p = problem
        filled = _filled_fit(p, seed)
        # a dgrad at stride 1 of a 1x1 window is priced as its GEMM, its forward view
        q = _one_tap_phase(p) if _rated_dgrad(p) else p
        if q.op is Op.DGRAD:
            return filled
        three = seed.precision is Precision.FP32
        kt = q.R * q.S * ceil_div(q.Cg, CHUNK)
        widest = _widest_maps(p, three)
        prices = {}  # each rated tile, whole and in its slices: its seconds
        for (bm, bn, tile_three), rate in TILE_RATES.items():
            if tile_three != three or bn > widest:
                continue
            v = replace(
                seed, blocktile=(bm, bn), stages=min(4, _most_stages(bm, bn, three)), splits=1
            )
            try:
                per_sm = plan_wgplanar(p, v).context["per_sm"]
            except SpecError:
                continue
            for splits in {1, _splits_for(p, v, per_sm)}:
                prices[replace(v, splits=splits)] = _sliced_seconds(q, v, per_sm, kt, splits, rate)
        if not prices:
            return filled
        best = min(prices, key=lambda v: (prices[v], *v.blocktile))
        against = prices.get(filled)  # the wave-filling tile, where it is a rated one
        return best if against is None or prices[best] < RATED_MARGIN * against else filled

    @classmethod
    def space(cls, problem, precision):
        """Pixel tiles of one to four warpgroups by map tiles up to the group's maps
        (one past them; at most 128 in fp32 math), with 3 and the most stages up to 6
        that fit; each with the reduction in one piece, in ``_splits_for``'s slices
        where it prices more than one cheaper, and in ``_few_block_splits``' where the
        grid leaves most SMs idle."""
        if precision not in cls.precisions or problem.dtype is not DType.FP32:
            return []
        if problem.layout is not TensorLayout.NCHW:
            return []
        three = precision is Precision.FP32
        widest = _widest_maps(problem, three)
        out = []
        for bm in PIXEL_TILES:
            for bn in (t for t in MAP_TILES if t <= widest):
                most = _most_stages(bm, bn, three)
                for stages in sorted({3, min(6, most)}):
                    v = cls(blocktile=(bm, bn), stages=stages, precision=precision)
                    out.append(v)
                    counts = {_splits_for(problem, v)} | _few_block_splits(problem, v)
                    out.extend(replace(v, splits=s) for s in sorted(counts - {1}))
        return out


@dataclass(frozen=True, kw_only=True)
class Wgcols(Wgplanar):
    """``wgplanar``'s kernel for a 1x1 window's dgrad, reading w where PyTorch lays it
    out (the module's docstring): its parameters, fit and space are wgplanar's."""

    key = "wgcols"
    description = (
        "dgrad of a 1x1 window over fp32 NCHW tensors on Hopper's warpgroup tensor cores "
        "(sm_90a), in tf32: wgplanar's kernel reading the weights where "
        "PyTorch lays them out, down w's columns, so that no gather packs them a call"
    )
    ops = frozenset({Op.DGRAD})
    # tf32 only, the reduction whole: in 3xTF32 and in slices its kernels were not yet
    # proved on the GPU (a strided 3xTF32 one failed against float64, 2026-12-01)
    precisions = (Precision.TF32,)
    columns = True

    @classmethod
    def problem_for(cls, problem):
        """The dgrad itself at any stride (one phase of one tap): its kernel reads w's
        columns where a forward view's would read the packed, transposed weights."""
        if problem.op is not Op.DGRAD or problem.R * problem.S != 1:
            raise SpecError(
                f"wgcols computes the dgrad of a 1x1 window, not op={problem.op.value} with a "
                f"{problem.R}x{problem.S} one; use --strategy wgplanar"
            )
        return problem

    @classmethod
    def fit(cls, problem, seed):
        """wgplanar's fit, the reduction whole."""
        return replace(super().fit(problem, seed), splits=1)

    @classmethod
    def space(cls, problem, precision):
        """wgplanar's space, the reduction whole."""
        return [v for v in super().space(problem, precision) if v.splits == 1]

    def plan(self, problem):
        if self.splits != 1:
            raise SpecError(f"wgcols s{self.splits}: wgcols takes the reduction whole (s1)")
        return plan_wgplanar(problem, self)


def _filled_fit(p: ConvProblem, seed: Wgplanar) -> Wgplanar:
    """The wave-filling tile: in tf32 256 maps where the group has them and 128-pixel
    tiles of them still fill the SMs, else the group's maps rounded up to a tile (at most
    128); then the widest pixel tile whose grid fills the SMs' waves within 10% of the
    best, and the most stages up to 4 that fit.  A strided dgrad takes it, its phases'
    unequal taps being what ``TILE_RATES`` does not price (resnet18's six at B=64 in tf32
    within 10% of the fastest the tune timed,
    ``tune-resnet18-224-budget12-db-2026-11-29-h200-e9723ae.jsonl.gz``), and the rated
    pick must price clearly below it (``RATED_MARGIN``)."""
    g = gemm_view(p)
    three = seed.precision is Precision.FP32
    pixels = p.batch * _pixels(p)
    bn = min((t for t in MAP_TILES if t >= min(g.Mg, 128)), default=128)
    wide = ceil_div(pixels, 128) * ceil_div(g.Mg, 256) * g.groups >= SMS
    if g.Mg >= 256 and wide and not three:
        bn = 256
    tiles = ceil_div(g.Mg, bn) * g.groups

    def filled(bm):
        blocks = ceil_div(pixels, bm) * tiles
        return blocks / (ceil_div(blocks, SMS) * SMS)

    fits = []
    for bm in (64, 128):
        stages = min(4, _most_stages(bm, bn, three))
        try:
            plan_wgplanar(p, replace(seed, blocktile=(bm, bn), stages=stages))
            fits.append((bm, stages))
        except SpecError:
            pass
    if not fits:  # the seed's plan says why
        return replace(seed, blocktile=(seed.blocktile[0], bn))
    best = max(filled(bm) for bm, _ in fits)
    bm, stages = max(f for f in fits if filled(f[0]) >= 0.9 * best)
    fitted = replace(seed, blocktile=(bm, bn), stages=stages)
    if p.op is Op.DGRAD and not _rated_dgrad(p):  # one phase's slices are the tune's to time
        return fitted
    return replace(fitted, splits=_splits_for(p, fitted))


def _rated_dgrad(p: ConvProblem) -> bool:
    """Whether ``p`` is a dgrad that ``fit`` prices as a forward pass: a 1x1 window's at
    stride 1 (``Wgcols.problem_for``), the GEMM of its forward view, which it was
    planned as before it read PyTorch's weights; strided ones keep the wave-filling
    tile."""
    return (
        p.op is Op.DGRAD and p.R * p.S == 1 and p.stride == (1, 1) and _one_tap_phase(p) is not None
    )


def _widest_maps(p: ConvProblem, three: bool) -> int:
    """The widest map tile worth a block: the group's maps rounded up to a tile, at most
    ``THREE_MOST_MAPS`` in fp32 math."""
    most = THREE_MOST_MAPS if three else MAP_TILES[-1]
    return min((t for t in MAP_TILES if t >= min(gemm_view(p).Mg, most)), default=most)


def _stage_bytes(bm: int, bn: int, three: bool) -> tuple[int, int]:
    """A chunk's bytes of A (32 channel rows of the tile's pixels and the pad) and of B
    (a 128-byte row a map; in 3xTF32 as many again for the lo words)."""
    return CHUNK * (bm + PAD) * 4, bn * ROW_BYTES * (2 if three else 1)


def _most_stages(bm: int, bn: int, three: bool) -> int:
    return (STAGE_LIMIT - 1024) // sum(_stage_bytes(bm, bn, three))


def _grid_phases(p: ConvProblem, chunks_per_tap: int = 1) -> tuple[list[dict], bool]:
    """A strided dgrad's stride phases that the grid takes (blockIdx.z), and whether dx
    is cleared first: where some phase has taps and some has none (a 1x1 window's but
    one), the ones with taps; else all (``phases_of``'s order: the most rows of taps
    first)."""
    every = phases_of(p, chunks_per_tap)
    taps = [ph for ph in every if ph["RT"] * ph["ST"]]
    if 0 < len(taps) < len(every):
        return taps, True
    return every, False


def _pixels(p: ConvProblem) -> int:
    """Output pixels of the grid: of a phase's most times the phases, else the image's,
    an image."""
    if p.op is Op.DGRAD:
        phases, _ = _grid_phases(p)
        return max(ph["HW"] for ph in phases) * len(phases)
    return p.Ho * p.Wo


def _one_tap_phase(p: ConvProblem) -> ConvProblem | None:
    """The GEMM of a strided dgrad whose taps all reach one stride phase of dx, one tap
    a pixel (a 1x1 window's: the other phases are zeros), as a forward problem over the
    phase's pixels (a 1x1 window of dy's channels into dx's): a reduction that may be
    cut in slices as a forward pass's is.  None for any other problem."""
    if p.op is not Op.DGRAD:
        return None
    phases, _ = _grid_phases(p)
    if len(phases) != 1 or phases[0]["RT"] * phases[0]["ST"] != 1:
        return None
    ph = phases[0]
    return replace(gemm_view(p), H=ph["Hq"], W=ph["Wq"], R=1, S=1, pads=(0,) * 4, dil=(1, 1))


def _sliced_gemm(p: ConvProblem) -> tuple[ConvProblem, int] | None:
    """The GEMM whose reduction slices would cut, as a forward problem, and its chunks:
    the problem itself, or a strided dgrad's one phase of one tap (``_one_tap_phase``);
    None for a strided dgrad whose phases take the reduction whole."""
    q = _one_tap_phase(p) if p.op is Op.DGRAD else p
    if q is None:
        return None
    return q, q.R * q.S * ceil_div(q.Cg, CHUNK)


def _one_to_one(ph: dict, g: ConvProblem) -> bool:
    """Whether a stride phase reads dy's pixels one to one: one tap, no offset, dy's
    own sizes (a 1x1 window's phase at a stride, unpadded)."""
    return (ph["RT"], ph["ST"], ph["oy0"], ph["ox0"], ph["HW"], ph["Wq"]) == (
        1,
        1,
        0,
        0,
        g.H * g.W,
        g.W,
    )


def _splits_for(p: ConvProblem, v: Wgplanar, per_sm: int | None = None) -> int:
    """The slices of the reduction that ``_sliced_seconds`` prices cheapest, one where
    the reduction has fewer than two slices' ``MIN_SLICE_CHUNKS``.  Slices pay where
    the whole grid leaves SMs idle and the sums' trip through the workspace is small
    beside the work: resnet50's 3x3 layers over 7x7 maps (100 blocks of 144 chunks,
    0.084 ms in one piece, 0.065 in five slices at B=32, tf32), not its 1x1 layers
    of 16 to 32 chunks (0.027 ms in one piece, 0.044 in two; H200, 2026-11-28).
    ``per_sm``: the blocks an SM holds, where the caller has planned ``v`` already.
    A strided dgrad's phases take the reduction whole, but for one phase of one tap
    (``_one_tap_phase``), priced as its GEMM."""
    sliceable = _sliced_gemm(p)
    if sliceable is None:
        return 1
    q, kt = sliceable
    if kt < 2 * MIN_SLICE_CHUNKS:
        return 1
    if per_sm is None:
        try:
            per_sm = plan_wgplanar(p, replace(v, splits=1)).context["per_sm"]
        except SpecError:
            return 1
    counts = range(1, kt // MIN_SLICE_CHUNKS + 1)
    return min(counts, key=lambda s: (_sliced_seconds(q, v, per_sm, kt, s), s))


def _few_block_splits(p: ConvProblem, v: Wgplanar) -> set[int]:
    """More slices for the tune to time where the grid in one piece leaves most SMs idle
    and the reduction is short (a small map's 1x1 layer: resnet18's 1x1 stride-2 dgrad
    over 2x2 dx at B=128, 16 blocks of 16 chunks), which ``_splits_for`` leaves whole by
    its ``MIN_SLICE_CHUNKS``: 2, 4 and 8 slices of at least 2 chunks each."""
    sliceable = _sliced_gemm(p)
    if sliceable is None:
        return set()
    q, kt = sliceable
    bm, bn = v.blocktile
    blocks = ceil_div(q.batch * q.Ho * q.Wo, bm) * ceil_div(q.Mg, bn) * q.groups
    if blocks >= SMS // 2:
        return set()
    return {s for s in (2, 4, 8) if 2 * s <= kt}


def _sliced_seconds(
    p: ConvProblem, v: Wgplanar, per_sm: int, kt: int, splits: int, rate: float = SM_RATE
) -> float:
    """A price of the grid in ``splits`` slices: its waves of ``per_sm`` blocks an SM,
    each as long as a block's slice of chunks at ``rate`` (``SM_RATE`` unless the
    tile's is given) shared by the blocks an SM holds, and past one slice the
    workspace's bytes (each slice's sums written and read back) at ``COPY_RATE`` and
    the second kernel's launch.  Fitted to 31
    problems timed whole and in slices on an H200 (``docs/measurements/
    wgplanar-splits-bench-2026-11-28-h200-d897791.log`` and resnet50's layers in
    ``model-resnet50-fp32-tf32-2026-11-28-h200x4-d897791.log``, whose whole grids are
    82464ef's on another H200 host: cuDNN's times in the two runs a median 1.01x apart):
    its count is the fastest timed, within 3%, in 28; a 1x1 layer in 3xTF32 is 13% off,
    and two it slices in two were not timed so."""
    bm, bn = v.blocktile
    blocks = ceil_div(p.batch * p.Ho * p.Wo, bm) * ceil_div(p.Mg, bn) * p.groups
    products = 3 if v.precision is Precision.FP32 else 1
    chunk_flops = 2 * bm * bn * CHUNK * products
    waves = ceil_div(blocks * splits, SMS * per_sm)
    seconds = waves * per_sm * ceil_div(kt, splits) * chunk_flops / rate
    if splits > 1:
        sums = p.batch * p.M * p.Ho * p.Wo * 4
        seconds += 2 * splits * sums / COPY_RATE + SUM_LAUNCH
    return seconds


def plan_wgplanar(p: ConvProblem, v: Wgplanar) -> Plan:
    # 1. limits
    if p.layout is not TensorLayout.NCHW or p.dtype is not DType.FP32:
        raise SpecError(
            f"{v.key} reads fp32 NCHW tensors ({p.dtype.value} {p.layout.value} given): "
            "use --strategy wgmma"
        )
    # a strided dgrad: the GEMM of dy (channels M) into dx's C maps, a stride phase of
    # dx's pixels a GEMM over the taps that reach it (blockIdx.z); else the forward pass
    phased = p.op is Op.DGRAD
    g = gemm_view(p)
    if g.Cg < FEW_CHANNELS:
        raise SpecError(
            f"{v.key} multiplies chunks of {CHUNK} channels: the {g.Cg} channels per group "
            "would leave most of each chunk zeros; use --strategy mmahwc or mmapersist"
        )
    if g.Cg % 4:
        raise SpecError(
            f"{v.key} copies a map's weights 4 channels at a time: the {g.Cg} channels per "
            "group are not a multiple of 4; use --strategy mma"
        )
    three = v.precision is Precision.FP32
    bm, bn = v.blocktile
    if bm not in PIXEL_TILES:
        raise SpecError(
            f"{v.key} b{bm}x{bn}: a warpgroup multiplies 64 pixels; choose "
            f"{', '.join(map(str, PIXEL_TILES))} pixels"
        )
    if bn not in MAP_TILES:
        raise SpecError(
            f"{v.key} b{bm}x{bn}: the block's maps are wgmma's N, one of "
            f"{', '.join(map(str, MAP_TILES))}"
        )
    if three and bn > THREE_MOST_MAPS:
        raise SpecError(
            f"{v.key} b{bm}x{bn}: fp32 math keeps a chunk's sums and x's lo words beside "
            f"the sums, at most {THREE_MOST_MAPS} maps a block; choose fewer maps"
        )
    warpgroups = bm // 64
    threads = 128 * warpgroups
    nacc = bn // 2  # fp32 sums a thread: 64 x bn over 128 threads
    chunks_per_tap = ceil_div(g.Cg, CHUNK)
    # a strided dgrad's phases (``_grid_phases``): those no tap reaches cleared by a
    # first kernel over all of dx, the grid the rest
    phases, zero_first = _grid_phases(p, chunks_per_tap) if phased else (None, False)
    sliced = v.splits > 1
    zero_first = zero_first and not sliced  # the slices' sum writes the zeros too
    # a 1x1 window at stride 1 without padding maps 4 neighbouring pixels of an image
    # onto 4 neighbouring input words: 16-byte copies where no 4 cross an image; so does
    # a phase that reads dy's pixels one to one (a 1x1 window's at stride 2, unpadded)
    if phased:
        whole = all(_one_to_one(ph, g) for ph in phases) and g.H * g.W % 4 == 0
    else:
        whole = (p.R, p.S, p.stride, p.Ho * p.Wo % 4, p.pads) == (1, 1, (1, 1), 0, (0,) * 4)
    vec = 4 if whole else 1
    # wgcols: a 1x1 window's dgrad reads PyTorch's weights where they lie, w[M][C/g]:
    # the view's rows are its columns, a unit's 4 words 4 copies (no gather packs them)
    w_columns = type(v).columns
    b_groups = ceil_div(bn // 8, threads // 32)  # a warp's groups of 8 rows of w (w_columns)
    if w_columns and three:
        raise SpecError(
            f"{v.key} reads w's columns in tf32 only; for 3xTF32 use --strategy wgplanar"
        )
    a_vecs = CHUNK * bm // vec // threads  # a thread's copies of x a chunk
    b_vecs = ceil_div(bn * 8, threads)  # the last pass of some threads past the maps' rows
    budget = min(255, REGISTERS // threads // 8 * 8)
    # the sums (and a chunk's apart in fp32 math), a chunk's 16 fragments (and their lo
    # words), the copies' pointers and about 40 more (ptxas)
    need = nacc * (2 if three else 1) + (32 if three else 16) + 2 * b_vecs + 40
    if need > budget:
        raise SpecError(
            f"{v.key} b{bm}x{bn}: {nacc} fp32 sums a thread and its copies need about "
            f"{need} registers, over the {budget} that {threads} threads get; choose fewer "
            "maps or pixels"
        )
    if not 2 <= v.stages <= 8:
        raise SpecError(f"{v.key} p{v.stages}: the ring holds 2 to 8 chunks")
    kt = max(ph["kt"] for ph in phases) if phased else p.R * p.S * chunks_per_tap
    if phased and v.splits != 1 and _one_tap_phase(p) is None:
        raise SpecError(
            f"{v.key} s{v.splits}: a strided dgrad's phases take the reduction whole, but "
            "for one phase of one tap (a 1x1 window's)"
        )
    if not 1 <= v.splits <= kt:
        raise SpecError(
            f"{v.key} s{v.splits}: the reduction's {kt} chunks are cut into 1 to {kt} slices"
        )
    a_stage, b_stage = _stage_bytes(bm, bn, three)
    smem = v.stages * (a_stage + b_stage) + 1024  # and the slack to align B to 1024 B
    if smem > STAGE_LIMIT:
        raise SpecError(
            f"{v.key}'s ring of {v.stages} chunks needs {smem} B of shared memory, over the "
            f"{STAGE_LIMIT} B a block may opt in to; choose --stages {_most_stages(bm, bn, three)} "
            "or a smaller tile"
        )
    per_sm = 2 if 2 * (smem + 1024) <= SM_SHARED and 2 * threads * (need + 8) <= REGISTERS else 1

    # 2. work
    map_tiles = ceil_div(g.Mg, bn)
    a_rows = threads * vec // bm
    ctx = shape_context(g)
    if phased:  # dx's own sizes and stride, where the GEMM's sums go
        ctx.update(
            out_image=p.C * p.H * p.W,
            out_plane=p.H * p.W,
            out_W=p.W,
            sh=p.stride[0],
            sw=p.stride[1],
            slice_image=p.C * phases[0]["HW"],  # a sliced one phase's sums an image
        )
    zero_vec = 4 if p.C * p.H * p.W % 4 == 0 else 1  # dx cleared 16 bytes a store
    ctx.update(
        phased=phased,
        phases=phases,
        zero_first=zero_first,
        zero_vec=zero_vec,
        zero_units=p.C * p.H * p.W // zero_vec,  # dx's words an image, zero_vec a unit
        BM=bm,
        BN=bn,
        NACC=nacc,
        CHUNK=CHUNK,
        VEC=vec,
        threads=threads,
        per_sm=per_sm,
        stages=v.stages,
        kt=kt,
        chunks_per_tap=chunks_per_tap,
        splits=v.splits,
        sum_block=SUM_BLOCK,
        map_tiles=map_tiles,
        a_stage=a_stage,
        b_stage=b_stage,
        b_half=bn * ROW_BYTES,  # the lo words' tile of a stage, in 3xTF32
        three=three,
        pitch=bm + PAD,
        a_stage_words=a_stage // 4,
        b_ring=v.stages * b_stage,  # the weights' stages, then x's
        ahead=v.stages - 1,  # chunks in flight before the first multiply
        warpgroups=warpgroups,
        fragments=bn // 8,  # n8 columns of a warpgroup's sums
        copy_lanes=bm // vec,  # threads that copy one channel row of x
        a_vecs=a_vecs,
        a_rows=a_rows,  # channel rows apart of a thread's copies of x
        a_step_bytes=a_rows * (bm + PAD) * 4,
        a_step_words=a_rows * g.H * g.W,
        # wgmma_step's operands after the sums: A's four registers, B's descriptor, the
        # scale-d flag
        a_ops=", ".join(f"%{nacc + i}" for i in range(4)),
        b_op=nacc + 4,
        add_op=nacc + 5,
        b_vecs=b_vecs,
        b_rows=threads // 8,
        guard_b_rows=bn * 8 % threads != 0,
        rsc=p.R * p.S * g.Cg,
        w_columns=w_columns,
        warps=threads // 32,
        b_groups=b_groups,
        guard_b_groups=bn // 8 % (threads // 32) != 0,
        x_image=g.C * g.H * g.W,
        guard_maps=g.Mg % bn != 0,
        guard_chans=g.Cg % CHUNK != 0,
        precision_note=(
            "fp32 products as three tf32 ones (lo x hi + hi x lo + hi x hi), fp32 sums"
            if three
            else "x and w read as tf32 by the tensor cores (no cvt: the low 13 bits dropped), "
            "products accumulated in fp32"
        ),
    )
    if phased:
        gemm = (
            Size(
                "GEMM",
                f"{len(phases)} phase{'s' if len(phases) > 1 else ''} of (B*phase pixels) x "
                f"{g.Mg} x (phase taps*{g.Cg})" + (f", {p.groups} groups" if p.groups > 1 else ""),
                "dx pixels of a stride phase x dx channels x (its taps, dy maps): D = dY W^T "
                + (
                    "with w read where it lies, "
                    if w_columns
                    else "with w flipped and transposed, "
                )
                + ("the one phase in slices" if sliced else "blockIdx.z the phase"),
            ),
            Size(
                "phases",
                f"{len(phases)} of {p.stride[0]} x {p.stride[1]}"
                + ("" if sliced else ", blockIdx.z"),
                "pixels x taps: "
                + ", ".join(f"{ph['HW']} x {ph['RT'] * ph['ST']}" for ph in phases),
            ),
        )
    else:
        gemm = (
            Size(
                "GEMM",
                f"(B*{p.Ho * p.Wo}) x {p.Mg} x {p.R * p.S * p.Cg}"
                + (f", {p.groups} groups" if p.groups > 1 else ""),
                "output pixels x maps x (r, s, c) taps: D = X W^T, X from registers",
            ),
        )
    sizes = (
        *gemm,
        Size(
            "block tile",
            f"{bm} pixels x {bn} maps",
            f"{warpgroups} warpgroup(s) of 64 pixels x {bn} maps: wgmma m64n{bn}k8"
            + (" three times a step" if three else "")
            + f", {nacc} fp32 sums per thread",
        ),
        Size(
            "k walk",
            f"{kt} chunks of {CHUNK} channels" + (" at most" if phased else ""),
            (
                f"a phase's taps x {chunks_per_tap}"
                if phased
                else f"{p.R}x{p.S} taps x {chunks_per_tap}"
            )
            + f" chunk(s) of the group's {g.Cg} channels"
            + ("; the last zero-filled past them" if g.Cg % CHUNK else ""),
        ),
        Size(
            "__shared__",
            f"{smem} B (dynamic)",
            f"{v.stages} stages x ({bn} map rows x 128 B in the 128B swizzle"
            + (", hi and lo" if three else "")
            + f" + {CHUNK} "
            f"channel rows x {bm + PAD} words); {per_sm} block(s) per SM",
        ),
        Size(
            "copies",
            f"{a_vecs} of x ({4 * vec} B) + "
            + (f"{8 * b_groups} of w (4 B)" if w_columns else f"{b_vecs} of w (16 B)")
            + " per thread per chunk",
            "cp.async, zero-filled outside the image, past the batch and past the channels; "
            + (
                "w read as PyTorch lays it out, [M][C/g], a column a row of the view, a warp "
                "a unit of 8 rows; "
                if w_columns
                else ""
            )
            + "a barrier a chunk",
        ),
    )
    name = v.kernel_name(p)
    if phased:
        args = (Role.DY, Role.W, Role.WORKSPACE if sliced else Role.DX)
    else:
        args = (Role.X, Role.W, *((Role.WORKSPACE,) if sliced else y_args(p)))
    launches = ()
    if zero_first:
        every = len(phases_of(p, 1))
        launches += (
            Launch(
                name + "_zero",
                (Role.DX, Role.BATCH),
                (SUM_BLOCK, 1, 1),
                (0, 1, 1),
                0,
                ctx["zero_units"],
                SUM_BLOCK,
            ),
        )
        sizes += (
            Size(
                "zeros",
                f"{every - len(phases)} of {every} phases",
                f"dx cleared first ({zero_vec * 4}-byte stores), the pixels no tap reaches "
                "left so; the grid takes the phases with taps",
            ),
        )
    launches += (
        Launch(
            name,
            (*args, Role.BATCH),
            (threads, 1, 1),
            (0, map_tiles * p.groups, len(phases) if phased and not sliced else v.splits),
            0,
            max(ph["HW"] for ph in phases) if phased else p.Ho * p.Wo,
            bm,
            smem,
        ),
    )
    if sliced:  # the second kernel: into dx and its zeros, or into y with the epilogue
        if phased:
            out, per_image, words = (Role.DX,), p.C * p.H * p.W, ctx["slice_image"]
            what = "the one phase's reduction"
            then = " into dx and writes the zeros of the phases no tap reaches"
        else:
            out, per_image, words = y_args(p), p.M * p.Ho * p.Wo, p.M * p.Ho * p.Wo
            what, then = "the reduction", ", then the bias and activation"
        launches += (
            Launch(
                name + "_sum",
                (Role.WORKSPACE, *out, Role.BATCH),
                (SUM_BLOCK, 1, 1),
                (0, 1, 1),
                0,
                per_image,
                SUM_BLOCK,
            ),
        )
        sizes += (
            Size(
                "slices",
                f"{v.splits} x about {kt // v.splits} chunks",
                f"grid z: {what} cut in {v.splits}, each slice's sums to its plane of the "
                f"workspace ({v.splits} x B x {words} fp32); a second kernel adds them in "
                f"order{then}",
            ),
        )
    return Plan(
        shape=p,
        variant=v,
        template="gemm/wgplanar.cu.j2",
        launches=launches,
        static_smem=0,
        dynamic_smem=smem,
        const_bytes=0,
        weight_format="f32" if w_columns else "mrsc.fp32",
        weight_transform="dgrad" if phased and not w_columns else "",
        sizes=sizes,
        context={**ctx, **descriptor()},  # 128-byte rows
        workspace_per_image=(
            4 * v.splits * (ctx["slice_image"] if phased else p.M * p.Ho * p.Wo) if sliced else 0
        ),
        # 3xTF32: a chunk's three products a channel summed apart by the tensor cores,
        # which truncate (twice fp32's rounding: counted twice), then the chunks' sums
        # (and the slices')
        sum_depth=((0, 1, 2 * 3 * CHUNK + kt + v.splits + (1 if p.bias else 0)) if three else None),
        arch="sm_90a",
    )
