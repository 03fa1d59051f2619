"""``mmahwc``: fp16/bf16 tensor cores over a band laid out pixel by pixel (HWC).

mmapersist and mmastrip keep x's planes (a channel's rows side by side) and put a window
row's taps on the k side: with K=7 each row pads to 8 taps, a k step is two rows of one
channel, and a lane reads its A words one at a time (mx-layer2's 12 channels in bf16:
1.13 ms, shared loads 62% busy at 1.8 a mma, H200).

Here the block spreads its band so that a pixel's channels are side by side, padded to a
multiple of 4, cp: band[row][col][c].  For one output pixel and one window row, the K
taps x cp channels it multiplies are then one run of K*cp elements, and a k step is 16
consecutive elements of that run: an A fragment is one ``ldmatrix.x4``, each lane giving
the address of its pixel's run, and the window row's run pads to whole k steps only once
(K*cp -> 16*ceil(K*cp/16); 84 -> 96 for 12 channels, 168 -> 176 for mx-layer2's dgrad
view of 24).  A warp holds p tiles of 16 output pixels x nt n8 tiles of maps: per k step p
``ldmatrix.x4`` and nt 8-byte loads of B feed p*nt mma.

``ldmatrix`` wants each row on a 16-byte boundary.  A pixel is 2*cp bytes; where cp is a
multiple of 8 every pixel starts on one.  Where cp = 4 mod 8 every other pixel starts 8
bytes off, and the band is kept twice, the second copy 4 elements later, so that an odd
column's run is aligned there.  The band's row stride and the second copy's place in its
128-byte line are chosen so that the 8 rows of each ldmatrix matrix (8 neighbouring
pixels) fall in distinct bank quads.  A tile's m16 rows are its pixels in order: with
rows 0, 2, .., 14 in one matrix (so that a lane's sums would be neighbours, one 32-bit
store), pixels 2*48 bytes apart met in every other quad, and mx-layer2's dgrad view lost
41% of its shared wavefronts to the conflicts (Nsight Compute, H200).

The band arrives by 16-byte ``cp.async`` in x's own order (band16's fetch, one raw band) and
each thread spreads one pixel at a time: its channels' elements from the raw rows, packed
in pairs, stored as 16-byte (or 8-byte) units.  The raw band is fetched again for the next
item as soon as it is spread, under the multiplies.  Past the last tap of a run, the k
step's tail reads the next pixel's channels (or the zeroed slack) against zero weights.

**Shifts.**  With few maps the n8 tiles are mostly empty, or each A fragment feeds only one
or two mma and the shared loads are the limit.  With ``shifts`` S > 1 the n side holds a
map's S neighbouring output columns: column (m, d) of base pixel (oy, S*b) is output (m, oy,
S*b + d), the run spans K + S - 1 pixels, and B gives column (m, d) the tap kx at pixel kx +
d (zero elsewhere).  A fragment then feeds S times as many columns, and only every S-th pixel
is a tile row.  For layer2 (4 channels) the run of 8 pixels costs no k step that 7 did not
(28 elements pad to 32 either way): its bf16 forward pass went from 0.353 to 0.312 ms, and
its dgrad view (16 channels, 4 maps: half an n8 tile with S=1) runs in 0.83 ms with S=4,
against mmatoep's 1.09 (H200, B=10000).  Base pixels S*cp*2 bytes apart fall in one bank
quad where that is a multiple of 128: the band may then be swizzled (16-byte unit u of
128-byte line l kept at unit u ^ (l % 8)), at three integer operations a ldmatrix, where
the bank model finds fewer wavefronts.

**Stacks.**  With ``stack`` R > 1 a warp's tiles cover the same base pixels in R
neighbouring output rows (a tile row is a stack's first row; the band's rows go in stacks).
Row r of a stack meets input row ky + r at window row ky, so the k-step loop goes outside
and the window rows, unrolled, inside it: each input row's ldmatrix feeds the R rows, and
each B fragment (one window row's) feeds them too, K + R - 1 A loads and K B loads for R x
K row products.  A band need not be whole stacks: the last one computes rows past it from
band rows that stay zero, and does not store them.  bf16, B=10000, H200: layer2's dgrad
view 0.83 -> 0.54 ms (shifts 2, stacks of 4) -> 0.48 (stacks of 5, whose 4 stacks of 20
base pixels fill 5 m16 tiles), mx-layer2's forward pass 0.79 -> 0.67 (stacks of 3), its
dgrad view 1.46 -> 1.05 -> 1.03 (stacks of 5).  Where a pixel has 4 channels (layer2's
forward pass) the band and stores bound the kernel and stacks lose.

**Slices.**  With ``kslices`` G > 1, G warps share a stack's tiles, warp q taking k steps q,
q + G, ..; warps q > 0 leave their sums in shared memory, and warp 0 adds them in order of
q (a named barrier for each group of tiles) and stores.  For items with few tiles:
mx-layer1's one-map dgrad view (9 base pixels a row) had 3 warps a block, and two slices
take it from 1.18 to 0.98 ms; in stacks of 6 rows, three slices, 0.94 ms.

**tf32.**  fp32 tensors take the same kernel in tf32: x is fetched in 16-byte units of 4
floats, rounded to tf32 as it is spread, a k step of m16n8k8 is 8 elements (32 bytes, as
m16n8k16's 16), and ldmatrix's 8 x 16-byte matrices are each a quarter of a tf32 A fragment
(word t of row g).  A pixel of cp floats is a multiple of 16 bytes, so the band is kept once.
layer2 in 0.576 ms (S=2) and mx-layer2 in 1.41 against mmapersist's 0.87 and 1.74 and
cuDNN tf32's 2.57 and 4.05 (H200, B=10000).
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, replace

import numpy as np

from ..errors import SpecError
from ..plan import ladder, make_plan
from ..plan.common import (
    MAX_THREADS,
    most_distinct,
    OPTIN_SMEM_BYTES,
    SM_SHARED,
    Size,
    band_walk_plan,
    ceil_div,
    shape_context,
    smem_blocks,
)
from ..shapes import ConvProblem, DType, Feature
from ..variants import EPILOGUE, Count, Pair, Precision, Variant, param
from .mmapersist import (
    BLOCKS16,
    FRAGMENT16,
    MAX_ACCUMULATORS,
    _warp_grid,
    band16_context,
    band16_words,
    warp_tiles,
)

# Channels padded past this would make a window row's k steps (and the unrolled body of
# one row) long, and such layers are wgmma's.
MAX_CHANNELS = 64
# A channel count padded up by more than this share of its k steps is a waste of the
# multiplies (1 to 3 channels pad to 4): mmastrip and mmatoep take those layers.
MIN_K_USE = 0.75
# With output columns on the n side (shifts), the share of the multiplies that meet a
# real tap, channel and map below which the fit takes none.
MIN_SHIFTED_USE = 0.5
# Output columns a map may take on the n side: one, or an even number (a lane's two
# accumulators of a map are then neighbours in a row).
SHIFTS = (1, 2, 4, 8)
# Output rows of a stack: a warp's tiles of pixels in each of them, each ldmatrix of an
# input row feeding every row of the stack.
STACKS = (1, 2, 3, 4, 5, 6, 7, 8)
# The fit's stacks keep at most this many accumulators a thread (n8 tiles x stacked rows x
# 4): mx-layer2's bf16 dgrad view with 16 maps a warp in stacks of 6 (48) spilled 8 bytes
# over whole images, in stacks of 5 (40) it did not.
FIT_ACCUMULATORS = 40
# The stacked fit's weight on a band that leaves room for one block an SM (its score is the
# warp's pipe clocks times the input rows an image, this much more with one block): bf16,
# B=10000, H200, layer2's dgrad view in stacks of 5, 20-row bands (52 input rows an image,
# two blocks) 0.498 ms against 0.505 for whole images (46 rows, one block), each 5 m16
# tiles a band's stacks; mx-layer2's in stacks of 3, whole images (39 rows, one block)
# 1.055 against 11-row bands (51 rows, two) 1.349.  Any weight between 52/46 and about
# 51/39 orders both as measured; this is near the middle.
ONE_BLOCK_WEIGHT = 1.2
# The stacked fit's slices: the fewest that give an SM this many warps (its blocks' warps
# together).  H200, B=10000: layer2's tf32 dgrad view in stacks of 5, one block an SM of 5,
# 10 and 15 warps (1, 2 and 3 slices) 1.272, 0.951 and 0.911 ms; mx-layer1's bf16 view in
# stacks of 6, two blocks of 4 and 6 warps 1.024 and 0.940; layer2's bf16 view in stacks of
# 4, two blocks of 7 warps 0.537 against 8 in two slices 0.581.
WARPS_AN_SM = 12


def most_tiles(shifts: int) -> int:
    """n8 tiles of a warp in the fit and the space: 3 where each column is a map (as
    measured), 4 with shifts."""
    return 3 if shifts == 1 else 4


# The bank model of a band's A loads looks at this many of an item's tiles.
MODELLED_TILES = 24


def elem_bytes(precision: Precision) -> int:
    """Bytes of a band element: tf32 words for fp32 tensors, else 16-bit values."""
    return 4 if precision is Precision.TF32 else 2


def own_math(shape: ConvProblem, precision: Precision) -> None:
    """mmahwc multiplies fp32 tensors in tf32 and fp16/bf16 tensors in their own dtype."""
    own = Precision.TF32 if shape.dtype is DType.FP32 else Precision(shape.dtype.value)
    if precision is not own:
        raise SpecError(
            f"mmahwc multiplies {shape.dtype.value} tensors in {own.value}, not "
            f"{precision.value}; take --precision {own.value}"
        )


def channels_padded(C: int, elem: int = 2, shifts: int = 1) -> tuple[int, int]:
    """(cp, copies): a pixel's channels padded to a multiple of 4, and the band's copies:
    one where the base pixels' starts (shifts pixels of elem * cp bytes apart) are all on
    16-byte boundaries, else two (the second 4 elements on)."""
    cp = ceil_div(C, 4) * 4
    return cp, 1 if shifts * cp * elem % 16 == 0 else 2


def _lane_pixel(lane: int, paired: bool) -> tuple[int, int]:
    """(pixel of its tile, byte of the run) whose ldmatrix row lane addresses: matrix
    lane/8 holds the tile's pixels 0-7 or 8-15 (``paired``: 0, 2, .., 14 or 1, 3, .., 15)
    at run bytes 0-15 or 16-31 (k 0-7 or 8-15 of m16n8k16, 0-3 or 4-7 of tf32's m16n8k8)."""
    return (2 * (lane % 8) + lane // 8 % 2 if paired else lane % 16), 16 * (lane // 16)


def swizzled(at: int) -> int:
    """A band byte's place where the band is swizzled: the 16-byte unit within its
    128-byte line XOR the line's index mod 8."""
    return at ^ ((at >> 3) & 0x70)


def _wavefronts(vw, pixels, pitch, copies, row_bytes, shift, paired, swizzle, stack=1):
    """(wavefronts, worst) of an item's A loads: an ldmatrix matrix reads 8 rows of 16
    bytes, one wavefront for each of them in the same bank quad (of 8 per 128 bytes) at
    worst; tile pixel q at base column b = q % vw of output row oy = stack * (q // vw), at
    byte oy*row_bytes + b*pitch, odd columns from the second copy, ``shift`` bytes further
    into its line.  A swizzled band is modelled at the k steps of a line and two window
    rows (its pattern moves with the address).  Computed for every (offset, tile,
    matrix) at once: axis -1 is the matrix's 8 lanes."""
    offsets = [32 * s + row_bytes * ky for ky in range(2) for s in range(4)] if swizzle else [0]
    tiles = min(ceil_div(pixels, 16), MODELLED_TILES)
    lane = np.arange(32)
    px = 2 * (lane % 8) + lane // 8 % 2 if paired else lane % 16  # as _lane_pixel
    kb = 16 * (lane // 16)
    q = np.minimum(np.arange(tiles)[:, None] * 16 + px[None, :], pixels - 1)  # (tile, lane)
    oy, b = np.divmod(q, vw)
    at = stack * oy * row_bytes + b * pitch + kb[None, :]
    if copies == 2:
        at = at + np.where(b % 2 == 1, 8 + shift + (1 << 24), 0)
    at = at[None, :, :] + np.asarray(offsets)[:, None, None]  # (offset, tile, lane)
    if swizzle:
        at = swizzled(at)
    # a matrix's 8 rows of 16 bytes over the 8 bank quads of a line: (offset, tile, matrix)
    degree = most_distinct(at.reshape(len(offsets), tiles, 4, 8), lambda a: a // 16 % 8, 8)
    return int(degree.sum()) / len(offsets), int(degree.max())


def _layout(shape: ConvProblem, rows: int, shifts: int = 1, elem: int = 2, stack: int = 1) -> dict:
    """The band's numbers for bands of ``rows`` output rows (tiles over its stacks of
    ``stack`` rows): its padded channels and copies, the k steps of a window row, the
    band's words, and what the bank model chose: the row stride, the second copy's shift,
    the swizzle, the tiles' row order (``paired``) and the base pixels a tile row spans
    (``vw``), with the fewest ldmatrix wavefronts."""
    return _band_layout(
        shape.C, shape.K, shape.W + 2 * shape.pad, shape.Wo, rows, shifts, elem, stack
    )


@functools.lru_cache(maxsize=4096)
def _band_layout(
    C: int, K: int, iw: int, Wo: int, rows: int, shifts: int = 1, elem: int = 2, stack: int = 1
) -> dict:
    cp, copies = channels_padded(C, elem, shifts)
    kr = ceil_div((K + shifts - 1) * cp * elem, 32)  # k steps (32 bytes) of one window row
    nb = ceil_div(Wo, shifts)  # base pixels of an output row
    pitch = shifts * cp * elem  # bytes from one base pixel to the next
    best = None
    # Tiles run over rows of vw base pixels: nb, or one more where nb is odd and the band
    # is kept twice, so that a column's copy follows the pixel's parity in every row
    # (mx-layer2, 27 columns: 27% more A wavefronts in rows of 27 than of 28, whose last
    # pixel is computed and not stored).
    for vw in sorted({nb, nb + nb % 2 * (copies - 1)}):
        # A row's last run (base vw-1) reads 32*kr bytes, 8 more in the second copy.
        least = max(iw * cp * elem, (vw - 1) * pitch + 32 * kr + 8 * (copies - 1))
        least = ceil_div(least, 16) * 16
        lead = rows // stack * vw  # the tiles' pixels: a stack's first row
        tiles = ceil_div(lead, 16)
        for paired in (True, False) if shifts == 1 else (False,):
            for swizzle in (False, True) if copies == 1 else (False,):
                for row_bytes in range(least, least + 128, 16):
                    for shift in range(0, 128, 16) if copies == 2 else (0,):
                        total, worst = _wavefronts(
                            vw, lead, pitch, copies, row_bytes, shift, paired, swizzle, stack
                        )
                        # the A wavefronts of an item, then the fewest tiles, unswizzled
                        cost = (total * tiles / min(tiles, MODELLED_TILES), tiles, swizzle)
                        if best is None or cost < best[0]:
                            best = (
                                cost,
                                dict(
                                    vw=vw,
                                    paired=paired,
                                    swizzle=swizzle,
                                    stride=row_bytes // elem,
                                    row_bytes=row_bytes,
                                    shift=shift,
                                    degree=worst,
                                ),
                            )
    lay = best[1]
    return dict(
        lay,
        cp=cp,
        copies=copies,
        kr=kr,
        pitch=pitch,
        ih=rows + K - 1,
        iw=iw,
        band_words=ceil_div((rows + K - 1) * lay["row_bytes"], 128) * 32,  # whole lines
    )


def use(problem: ConvProblem, shifts: int, elem: int) -> float:
    """The share of the multiplies that meet a real tap, channel and map: the k side's
    run of K + shifts - 1 pixels padded to whole k steps, the n side's maps x shifts
    padded to n8 tiles, each column's K of those pixels."""
    C, M, K = problem.C, problem.M, problem.K
    cp, _ = channels_padded(C, elem, shifts)
    run = ceil_div((K + shifts - 1) * cp * elem, 32) * 32 // elem
    return K * C * M * shifts / (run * 8 * ceil_div(M * shifts, 8))


def _steps(problem: ConvProblem, shifts: int, elem: int) -> int:
    """k steps of a window row's run of K + shifts - 1 pixels."""
    cp, _ = channels_padded(problem.C, elem, shifts)
    return ceil_div((problem.K + shifts - 1) * cp * elem, 32)


def stack_for(problem: ConvProblem, nt: int, elem: int) -> int:
    """The stack that ``_model`` counts to rank the shifts (``_stacked_fit`` then chooses
    its own): 4 rows where a warp has one n8 tile, else 3, with one pixel tile; none where
    a pixel has 4 channels or fewer (layer2's forward pass, whose short runs leave the
    kernel bound by its band and stores: stacks of 2 or 4 took 0.51-0.55 ms against 0.37
    without, H100).  bf16, B=10000, H100 (2026-11-24): layer2's dgrad view
    (16 channels, 4 maps) with shifts 2 and 8 columns a warp in stacks of 4, 0.534 ms
    against 0.825 with shifts 4 and none; mx-layer2's forward pass (12 channels, 24 maps)
    in stacks of 3, 0.716 against 0.790, of 4 (one block an SM) 0.768; its dgrad view in
    stacks of 3, 1.046 against 1.447."""
    if channels_padded(problem.C, elem)[0] <= 4:
        return 1
    return 4 if nt == 1 else 3


def _model(problem: ConvProblem, shifts: int, elem: int) -> tuple[float, int, int, int]:
    """(cost, n8 tiles, m16 tiles, stack) of a warp for the fit: an image's
    ``_pipe_clocks`` over its output pixels' tiles.  Without stacks, pixel tiles a warp: up to 6 with a
    column a map, up to 4 with shifts, whose items have fewer tiles and would leave too
    few warps (layer2's bf16 dgrad view with shifts 4, B=10000, H200: 2 n8 tiles x 1, 2,
    3, 6 pixel tiles 0.98, 0.83, 0.83 and 0.98 ms).  A stack of R rows loads each input
    row's A once for the R rows (K + R - 1 rows for R x K window rows) and each B
    fragment once for them."""
    kr = _steps(problem, shifts, elem)
    K = problem.K
    cols = ceil_div(problem.M * shifts, 8)
    most = most_tiles(shifts)
    nt = ceil_div(cols, ceil_div(cols, most))
    tiles = problem.Ho * ceil_div(problem.Wo, shifts) / 16
    R = stack_for(problem, nt, elem)
    if R > 1:
        p = 1
    else:
        p = max(1, min(6 if shifts == 1 else 4, 16 // nt, ceil_div(problem.Ho * problem.Wo, 16)))
    return _pipe_clocks(K, kr, cols, nt, p, R, tiles / R), nt, p, R


def _pipe_clocks(K: int, kr: int, cols: int, nt: int, p: int, R: int, stacks: float) -> float:
    """Tensor and shared pipe clocks of ``stacks`` m16 tiles of stacks' first rows (of R
    rows each), kr k steps a window row, cols n8 tiles in warps of nt and p pixel tiles: the
    larger of 2 a mma and one a wavefront (ldmatrix.x4 four, a step's B fragment two), a
    stack loading K + R - 1 input rows' A for each of its column groups."""
    mma = stacks * R * K * kr * cols
    a = 4 * stacks * kr * (K + R - 1) * ceil_div(cols, nt)
    b = 2 * stacks / p * kr * K * cols
    return max(2 * mma, a + b)


def _stacked_score(problem: ConvProblem, plan, v: "Mmahwc") -> float:
    """The stacked fit's score of a planned variant (lower is better): ``_model``'s pipe
    clocks of an image counted over the tiles the bands really hold (a band's last stack
    computes rows past it, a stack's pixels pad to whole m16 tiles), times the input rows
    an image's bands hold, ``ONE_BLOCK_WEIGHT`` more where a band leaves room for one block
    an SM."""
    c = plan.context
    K = problem.K
    cols = ceil_div(problem.M * v.shifts, 8)
    clocks = _pipe_clocks(
        K, c["kr"], cols, c["nt"], c["p"], v.stack, c["bands_per_image"] * c["tiles"]
    )
    weight = 1 if c["blocks"] == BLOCKS16 else ONE_BLOCK_WEIGHT
    return clocks * c["bands_per_image"] * (c["rows"] + K - 1) * weight


def _stacked_fit(problem: ConvProblem, seed: "Mmahwc", fits: list) -> "Mmahwc":
    """The stacked variant of least ``_stacked_score`` over the fit's shifts (``fits``), a
    warp's n8 tiles for each, stacks of 2 rows up to ``FIT_ACCUMULATORS`` and bands of at
    least K - 1 rows (up to 8 an image); then the fewest slices of the k steps that give an
    SM ``WARPS_AN_SM`` warps, else those that give it the most.  Ties go to the taller band,
    the fewer shifts and the deeper stack (where the multiplies bound the score, a deeper
    stack still loads less)."""
    K, Ho = problem.K, problem.Ho
    heights = sorted(
        {ceil_div(Ho, n) for n in range(1, 9)} & set(range(min(K - 1, Ho), Ho + 1)),
        reverse=True,
    )
    best = None
    for (_, nt, _, _), S in fits:
        for R in STACKS[1:]:
            if 4 * nt * R > FIT_ACCUMULATORS:
                break
            for rows in heights:
                v = replace(seed, tile=rows, regtile=(8 * nt, 16), shifts=S, stack=R)
                try:
                    plan = make_plan(problem, v)
                except SpecError:
                    continue
                key = (_stacked_score(problem, plan, v), -rows, S, -R)
                if best is None or key < best[0]:
                    best = (key, v, plan)
    if best is None:
        raise SpecError("mmahwc: no band of this problem fits an SM's shared memory")
    _, chosen, plan = best

    def warps_an_sm(plan) -> int:
        return plan.context["threads"] // 32 * plan.context["blocks"]

    most = warps_an_sm(plan)
    for G in range(2, min(8, plan.context["kr"]) + 1):
        if most >= WARPS_AN_SM:
            break
        v = replace(chosen, kslices=G)
        try:
            plan = make_plan(problem, v)
        except SpecError:
            continue
        if warps_an_sm(plan) > most:
            chosen, most = v, warps_an_sm(plan)
    return chosen


def plan_mmahwc(shape: ConvProblem, v: "Mmahwc"):
    own_math(shape, v.precision)
    C, M, H, W, K, pad = shape.C, shape.M, shape.H, shape.W, shape.K, shape.pad
    Ho, Wo = shape.Ho, shape.Wo
    S = v.shifts
    tf32 = v.precision is Precision.TF32
    elem = elem_bytes(v.precision)
    if C > MAX_CHANNELS:
        raise SpecError(
            f"mmahwc keeps a pixel's channels side by side for C up to {MAX_CHANNELS}, "
            f"not {C}; use --strategy wgmma or tcgemm"
        )
    if S not in SHIFTS:
        raise SpecError(
            f"mmahwc's shifts are the output columns of a map on the n side: "
            f"{', '.join(map(str, SHIFTS[:-1]))} or {SHIFTS[-1]}, not {S}"
        )
    rows, nt, p = warp_tiles(shape, v, M * S, f"M x shifts = {M} x {S}" if S > 1 else "")
    R = v.stack
    if R not in STACKS:
        raise SpecError(
            f"mmahwc's stack is the output rows that share each input row's ldmatrix: "
            f"{', '.join(map(str, STACKS[:-1]))} or {STACKS[-1]}, not {R}"
        )
    if 4 * nt * p * R > MAX_ACCUMULATORS:
        raise SpecError(
            f"mmahwc r{8 * nt}x{16 * p} v{R}: {4 * nt * p * R} accumulators per thread "
            f"(n8 tiles x pixel tiles x stacked rows x 4), over {MAX_ACCUMULATORS}; choose "
            "fewer pixels or a lower stack"
        )
    # A band of rows that are not whole stacks computes the last stack's rows past it (not
    # stored) from rows of the band that stay zero.
    computed = ceil_div(rows, R) * R
    G = v.kslices
    if G > 1 and R == 1:
        raise SpecError(
            f"mmahwc k{G}: slices of the k steps come with stacked rows; take --stack 2 or more"
        )
    lay = _layout(shape, computed, S, elem, R)
    cp, copies, kr, stride = lay["cp"], lay["copies"], lay["kr"], lay["stride"]
    ih = rows + K - 1  # the input rows a band holds; the band's words hold computed + K - 1
    steps = K * kr
    if not 1 <= G <= min(8, kr):
        raise SpecError(
            f"mmahwc k{G}: a window row's run has {kr} k steps to slice; choose 1 to {min(8, kr)}"
        )
    map_tiles = ceil_div(M * S, 8)  # n8 tiles: maps x shifts
    map_groups = ceil_div(map_tiles, nt)
    map_tiles = map_groups * nt  # B holds zero columns up to whole groups
    vw = lay["vw"]
    pixels = rows * vw  # base pixels of an item
    lead = computed // R * vw  # the tiles' pixels: each stack's first row
    tiles = ceil_div(lead, 16)
    # Shared memory in 32-bit words: B fragments [step][n8 tile][lane] of uint2, the raw
    # band in x's order, then the band's copies, each [ih][stride], the second `shift`
    # bytes further into its 128-byte line.
    b_words = steps * map_tiles * 64
    chunk_words, raw_words, _, _ = band16_words(shape, ih, 0, elem)
    band_words = lay["band_words"]
    copy1_at = b_words + raw_words + band_words + lay["shift"] // 4
    words = b_words + raw_words + copies * band_words + (lay["shift"] // 4 + 4) * (copies - 1)
    nbytes = 4 * words
    if nbytes > OPTIN_SMEM_BYTES:
        raise SpecError(
            f"mmahwc needs {nbytes} bytes of shared memory (B fragments {4 * b_words} B, "
            f"a raw band of {4 * raw_words} B, the band {copies} x {4 * band_words} B), over "
            f"the sm_90 limit of {OPTIN_SMEM_BYTES} bytes per block; choose --tile "
            f"{max(1, rows // 2)}"
        )
    # Registers: accumulators, a step's A fragments (4 a tile for each input row it
    # reads: a stack of R > 1 rows reads R + 1) and B fragments, the tiles' addresses and
    # about 40 for the rest; two blocks an SM, or one where its shared memory leaves room
    # for only one (its warps may then take all the registers: mx-layer2's bf16 forward
    # pass in stacks of 3, whole images, 24 maps x 16 pixels a warp: 8 warps 0.717 ms,
    # H100).
    a_rows = R + 1 if R > 1 else 1
    registers = 4 * nt * p * R + 4 * p * a_rows + p + 2 * nt + 40
    blocks = min(BLOCKS16, smem_blocks(nbytes))
    pg, passes = _warp_grid(tiles, p, map_groups * G, registers, blocks)
    warps = map_groups * pg * G
    threads = 32 * warps
    if threads > MAX_THREADS:  # each group of n8 tiles takes a warp or more
        raise SpecError(
            f"mmahwc r{8 * nt}x{16 * p}: the n side's {map_groups} groups of {nt} n8 tiles "
            f"(maps x shifts) take {warps} warps, over a block's {MAX_THREADS // 32}; "
            "choose a register tile of more n-side columns or fewer --shifts"
        )
    # Slices: each warp of tiles w past the first slice leaves its sums in slot (q - 1, w).
    part_slot = map_groups * pg * 32 * 4 * nt * p * R  # words of one slice's sums
    part_at = words  # past the words zeroed once: each slot is written before it is read
    if G > 1:
        if map_groups * pg > 15:
            raise SpecError(
                f"mmahwc k{G}: {map_groups * pg} warps' tiles, each group on its own named "
                "barrier (15 at most); choose more pixels a warp or --kslices 1"
            )
        words += (G - 1) * part_slot
        nbytes = 4 * words
        if nbytes > OPTIN_SMEM_BYTES:
            raise SpecError(
                f"mmahwc k{G}: the slices' sums take the shared memory to {nbytes} bytes, "
                f"over the sm_90 limit of {OPTIN_SMEM_BYTES}; choose fewer --kslices or --tile "
                f"{max(1, rows // 2)}"
            )

    bands_per_image = ceil_div(Ho, rows)
    # Bytes a spread store writes: 16 where every pixel starts on a 16-byte boundary (and
    # the band is kept once), else 8.
    unit_bytes = 16 if copies == 1 and cp * elem % 16 == 0 else 8
    unit = unit_bytes // elem
    math = v.precision.value
    kpad = 32 // elem * steps
    ctx = dict(
        shape_context(shape),
        **band16_context(shape, ih, threads, chunk_words, spread=False, elem_bytes=elem),
        elem="tf32" if tf32 else "f16" if shape.dtype is DType.FP16 else "bf16",
        tf32=tf32,
        eb=elem,
        rows=rows,
        ih=ih,
        band_rows=lay["ih"],
        iw=lay["iw"],
        cp=cp,
        copies=copies,
        kr=kr,
        steps=steps,
        stride=stride,
        shifts=S,
        pitch=lay["pitch"],
        swizzle=lay["swizzle"],
        unit=unit,
        unit_bytes=unit_bytes,
        units=cp // unit,
        chunk_words=chunk_words,
        copy_words=C * chunk_words,
        raw_at=b_words,
        raw_words=raw_words,
        band_at=b_words + raw_words,
        copy1_at=copy1_at,
        copy1_words=copy1_at - b_words - raw_words,  # the second copy's word from the band's
        # an odd column's run: from the second copy, 4 elements on
        copy1_bytes=4 * (copy1_at - b_words - raw_words) + 8,
        row_bytes=lay["row_bytes"],
        last_pixel=lead - 1,
        stack=R,
        slices=G,
        part_at=part_at,
        part_slot=part_slot,
        words_a_pixel=cp * elem // 4,
        step_fragments=map_tiles * 32,  # uint2 B fragments of one k step
        zero_words=part_at - b_words - raw_words,
        b_words=b_words,
        step_words=64 * map_tiles,
        row_fragments=kr * map_tiles * 32,  # uint2 B fragments of one window row
        map_tiles=map_tiles,
        nt=nt,
        p=p,
        map_groups=map_groups,
        pixel_groups=pg,
        pass_tiles=pg * p,
        warp_maps=8 * nt,
        warp_fragments=32 * nt,
        accumulators=4 * nt * p * R,
        threads=threads,
        launch_bounds=f"{threads}, {blocks}",
        blocks=blocks,
        launch_bounds_alt=f"{threads}, 1",
        pixels=pixels,
        vw=vw,
        paired=lay["paired"],
        tiles=tiles,
        band_pixels=ih * W,
        bands_per_image=bands_per_image,
        guard_rows=Ho % rows != 0,
        guard_maps=map_tiles * 8 != M * S,
        smem_bytes=nbytes,
        precision_note=(
            "x and w rounded to tf32 (cvt.rna), products accumulated in fp32"
            if tf32
            else f"{shape.dtype.value} products exact, accumulated in fp32"
        ),
    )
    n_side = f"{M} maps x {S} output columns" if S > 1 else f"{M} maps"
    sizes = [
        Size("output", f"{M} x {Ho} x {Wo}", f"Ho = H + 2*pad - K + 1 = {H}+{2 * pad}-{K}+1"),
        Size(
            "fragment",
            f"mma.m16n8k{32 // elem}, {math}",
            f"16 pixels x 8 columns x {32 // elem} elements of a window row's taps x channels run",
        ),
        Size(
            "n side",
            f"{n_side} -> {8 * map_tiles}",
            (
                f"column (m, d) of base pixel (oy, {S}b) is output (m, oy, {S}b + d): its "
                f"run spans {K + S - 1} pixels, tap kx at pixel kx + d"
                if S > 1
                else "a column a map"
            )
            + f"; {100 * use(shape, S, elem):.0f}% of the multiplies meet a tap, channel and map",
        ),
        Size(
            "k padding",
            f"{shape.reduction} -> {kpad}",
            (f"C to {cp}, " if cp != C else "")
            + f"a window row's {K + S - 1} x {cp} to {32 // elem * kr}: {kr} k steps a row, "
            f"{steps} in all",
        ),
        (
            Size(
                "warp",
                f"{p} x {R} x {nt} mma per k step and window row",
                f"register tile {16 * p} base pixels x {R} stacked rows x {8 * nt} columns = "
                f"{4 * nt * p * R} accumulators per thread; per k step and window row {p} "
                f"ldmatrix.x4 (an input row's, for the {R} rows) and {nt} 8-byte B loads",
            )
            if R > 1
            else Size(
                "warp",
                f"{p} x {nt} mma per k step",
                f"register tile {16 * p} base pixels x {8 * nt} columns = {4 * nt * p} "
                f"accumulators per thread; {p} ldmatrix.x4 and {nt} 8-byte B loads a step",
            )
        ),
        Size(
            "block",
            f"{threads} threads",
            f"{map_groups} column group(s) x {pg} pixel group(s) of warps"
            + (f" x {G} slices of the k steps, sums added in shared memory" if G > 1 else "")
            + ", "
            + ("two blocks an SM" if blocks == 2 else "one block an SM (by its shared memory)"),
        ),
        Size(
            "work item",
            f"{rows} output rows = {pixels} base pixels"
            + (f" in stacks of {R} rows" if R > 1 else "")
            + (f" ({computed - rows} more computed, not stored)" if computed > rows else "")
            + (f" (rows of {vw}: the last computed, not stored)" if vw * S > Wo else ""),
            f"{tiles} m16 tiles in {passes} pass(es) of {pg * p} "
            f"({100.0 * (1 - tiles / (passes * pg * p)):.0f}% idle); "
            f"{bands_per_image} item(s) per image",
        ),
        Size(
            "smem B",
            f"{4 * b_words} B",
            f"{steps} k steps x {map_tiles} n8 tiles x 32 lanes x 8 B",
        ),
        Size(
            "smem raw band",
            f"{4 * raw_words} B [{C}][{4 // elem * chunk_words}]",
            f"{ih} input rows of {W} per channel as x holds them, by 16-byte cp.async",
        ),
        Size(
            "smem band",
            f"{copies} x [{lay['ih']}][{stride}] {'tf32' if tf32 else shape.dtype.value}",
            f"[row][column][{cp} channels], row stride {stride}"
            + (", the second copy 4 elements on (odd columns' runs aligned)" if copies == 2 else "")
            + (", 16-byte units swizzled in their 128-byte line" if lay["swizzle"] else "")
            + f": {lay['degree']}-way ldmatrix conflicts at worst",
        ),
    ]
    return band_walk_plan(
        shape, v, "gemm/mmahwc.cu.j2", threads, bands_per_image, nbytes, sizes, ctx
    )


@dataclass(frozen=True, kw_only=True)
class Mmahwc(Variant):
    key = "mmahwc"
    templates = ("gemm/mmahwc.cu.j2",)
    family = "gemm"
    description = (
        "persistent blocks on tensor cores (fp16/bf16, tf32 for fp32 tensors) over a band "
        "spread pixel by pixel (HWC): a window row's taps x channels one run on the k side, "
        "A by ldmatrix, a map's neighbouring output columns on the n side"
    )
    serves = EPILOGUE | {Feature.DTYPE16}
    precisions = (*FRAGMENT16, Precision.TF32)
    tensor_core = True

    tile: int = param(16, Count("t"), "mmahwc: output rows per band")
    regtile: tuple[int, int] = param(
        (24, 32),
        Pair("r"),
        "mmahwc: n-side columns (maps x shifts) x base pixels of a warp (whole n8 and m16 tiles)",
    )
    shifts: int = param(
        1, Count("s"), "mmahwc: output columns of a map on the n side (1, 2, 4 or 8)"
    )
    stack: int = param(
        1,
        Count("v"),
        "mmahwc: output rows whose tiles share each input row's A fragments (1 to 8)",
    )
    kslices: int = param(
        1,
        Count("k"),
        "mmahwc: warps that share a stack's tiles, each taking every k-th step of the "
        "window rows' runs, their sums added in shared memory (with stacks)",
    )

    def plan(self, problem):
        return plan_mmahwc(problem, self)

    @classmethod
    def fit(cls, problem, seed):
        """The tensors' own math (tf32 for fp32).  Shifts: of those that leave 3/4 of the
        k steps and n8 tiles real with one column a map, or half the multiplies real
        with more.  Where a pixel has more than 4 channels, stacked rows: the shifts,
        stack, band and slices of ``_stacked_fit``.  Else the cheapest shifts by
        ``_model``, every column in a warp up to 3 tiles (4 with shifts; else the fewest
        even groups), up to 6 pixel tiles within 64 accumulators, and the band (at least
        K - 1 rows) that lets two blocks share an SM with the fewest input rows an image
        (taller on ties), else the tallest that fits.  bf16 at B=10000 (H200,
        2026-11-24), mx-layer2's forward pass without stacks in bands of 14 (two blocks
        an SM), 24 maps x 80 pixels 0.79, x 64 0.88, x 48 0.93; whole images (one block
        an SM) 0.97."""
        own_math(problem, seed.precision)
        C, M, K = problem.C, problem.M, problem.K
        if C > MAX_CHANNELS:
            raise SpecError(
                f"mmahwc keeps a pixel's channels side by side for C up to {MAX_CHANNELS}, "
                f"not {C}; use --strategy wgmma or tcgemm"
            )
        elem = elem_bytes(seed.precision)
        k_use = C * K / (32 // elem * _steps(problem, 1, elem))
        fill = M / (8 * ceil_div(M, 8))
        fits = []
        one = k_use >= MIN_K_USE and fill >= MIN_K_USE
        if one:
            fits.append((_model(problem, 1, elem), 1))
        # Shifts where one column a map does not fit, or where they cost no k step (mx-layer2's
        # bf16 dgrad view, 24 channels: 11 k steps a row with one column, 12 with two, and
        # 1.45 ms against 1.88-2.06 with two, B=10000, H200).
        fits += [
            (_model(problem, S, elem), S)
            for S in SHIFTS[1:]
            if S <= problem.Wo
            and use(problem, S, elem) >= MIN_SHIFTED_USE
            and (not one or _steps(problem, S, elem) == _steps(problem, 1, elem))
        ]
        if not fits:
            raise SpecError(
                f"mmahwc: {100 * k_use:.0f}% of the k side and {100 * fill:.0f}% of the map "
                f"tiles would carry C={C}, M={M}, and at most "
                f"{100 * max(use(problem, S, elem) for S in SHIFTS[1:]):.0f}% of the "
                f"multiplies with output columns on the n side; it wants "
                f"{100 * MIN_K_USE:.0f}% and {100 * MIN_SHIFTED_USE:.0f}%"
            )
        fits.sort(key=lambda f: (f[0][0], f[1]))
        if stack_for(problem, 1, elem) > 1:
            return _stacked_fit(problem, seed, fits)
        # The cheapest shifts whose band lets two blocks share an SM, else the cheapest.
        fallback = None
        for (_, nt, p, _), S in fits:
            base = replace(seed, regtile=(8 * nt, 16 * p), shifts=S)
            two, one = [], []
            for rows in ladder(problem.Ho):
                try:
                    plan = make_plan(problem, replace(base, tile=rows))
                except SpecError:
                    continue
                band_cost = (ceil_div(problem.Ho, rows) * (rows + K - 1), -rows)
                # two blocks an SM, where the band is at least its halo's height
                if BLOCKS16 * (plan.dynamic_smem + 1024) <= SM_SHARED and rows >= min(
                    K - 1, problem.Ho
                ):
                    two.append((band_cost, rows))
                else:
                    one.append(rows)
            if two:
                fallback = (base, min(two)[1])
                break
            if one and fallback is None:
                fallback = (base, max(one))
        if fallback is None:
            raise SpecError("mmahwc: no band of this problem fits an SM's shared memory")
        base, rows = fallback
        return replace(base, tile=ceil_div(problem.Ho, ceil_div(problem.Ho, rows)))

    @classmethod
    def space(cls, problem, precision):
        """Shifts 1 (1 to 3 n8 tiles) and those whose multiplies are half real (up to 4),
        1 to 8 pixel tiles a warp (at most 64 accumulators), or stacks of 2 to 4 rows with
        1 or 2 pixel tiles in one or two slices of the k steps, or of 5 to 8 rows with one
        in one to three slices, bands of Ho/k rows; those that plan."""
        elem = elem_bytes(precision)
        rows = sorted({ceil_div(problem.Ho, k) for k in (1, 2, 3, 4, 6)}, reverse=True)
        shapes = [(p, 1, 1) for p in range(1, 9)]
        shapes += [(p, R, G) for R in STACKS[1:5] for p in (1, 2) for G in (1, 2)]
        shapes += [(1, R, G) for R in STACKS[5:] for G in (1, 2, 3)]
        out = []
        for S in SHIFTS:
            if S > 1 and (S > problem.Wo or use(problem, S, elem) < MIN_SHIFTED_USE):
                continue
            most = min(most_tiles(S), ceil_div(problem.M * S, 8))
            for nt, (p, R, G), r in itertools.product(range(1, most + 1), shapes, rows):
                if 4 * nt * p * R > MAX_ACCUMULATORS:
                    continue
                v = cls(
                    tile=r,
                    regtile=(8 * nt, 16 * p),
                    shifts=S,
                    stack=R,
                    kslices=G,
                    precision=precision,
                )
                try:  # the B fragments and band of long runs may not fit shared memory
                    plan_mmahwc(problem, v)
                except SpecError:
                    continue
                out.append(v)
        return out
