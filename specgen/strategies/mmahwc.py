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
"""

from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass, replace

from ..errors import SpecError
from ..plan import make_plan
from ..plan.common import (
    OPTIN_SMEM_BYTES,
    SM_SHARED,
    Size,
    band_walk_plan,
    ceil_div,
    shape_context,
)
from ..shapes import ConvProblem, DType, Feature
from ..variants import EPILOGUE, Count, Pair, Variant, param
from .mmapersist import (
    BLOCKS16,
    FRAGMENT16,
    MAX_ACCUMULATORS,
    _warp_grid,
    band16_context,
    band16_words,
    own_dtype16,
    warp_tiles,
)

# Channels padded past this would make a window row's k steps (and the unrolled body of
# one row) long, and such layers are wgmma's.
MAX_CHANNELS = 64
# A channel count padded up by more than this share of its k steps is a waste of the
# multiplies (1 to 3 channels pad to 4): mmastrip and mmatoep take those layers.
MIN_K_USE = 0.75
# The bank model of a band's A loads looks at this many of an item's tiles.
MODELLED_TILES = 24


def channels_padded(C: int) -> tuple[int, int]:
    """(cp, copies): a pixel's channels padded to a multiple of 4, and the band's copies:
    one where 2*cp bytes is a multiple of 16, else two (the second 4 elements on)."""
    cp = ceil_div(C, 4) * 4
    return cp, 1 if cp % 8 == 0 else 2


def _lane_pixel(lane: int, paired: bool) -> tuple[int, int]:
    """(pixel of its tile, run element) whose ldmatrix row lane addresses: matrix lane/8
    holds the tile's pixels 0-7 or 8-15 (``paired``: 0, 2, .., 14 or 1, 3, .., 15) at run
    elements 0-7 or 8-15."""
    return (2 * (lane % 8) + lane // 8 % 2 if paired else lane % 16), 8 * (lane // 16)


def _wavefronts(wo, pixels, cp, copies, stride, shift, paired):
    """(wavefronts, worst) of an item's A loads: an ldmatrix matrix reads 8 rows of 16
    bytes, one wavefront for each of them in the same bank quad (of 8 per 128 bytes) at
    worst; pixel (oy, ox) at element oy*stride + ox*cp, odd columns from the second copy,
    ``shift`` bytes further into its line."""
    total = worst = 0
    for tile in range(min(ceil_div(pixels, 16), MODELLED_TILES)):
        for matrix in range(4):
            quads: dict[int, set[int]] = {}
            for lane in range(8 * matrix, 8 * matrix + 8):
                px, k = _lane_pixel(lane, paired)
                oy, ox = divmod(min(tile * 16 + px, pixels - 1), wo)
                at = 2 * (oy * stride + ox * cp + k)
                if copies == 2 and ox % 2:
                    at += 8 + shift + (1 << 24)  # another word, the same place in its line
                quads.setdefault(at // 16 % 8, set()).add(at)
            degree = max(len(v) for v in quads.values())
            total += degree
            worst = max(worst, degree)
    return total, worst


def _layout(shape: ConvProblem, rows: int) -> dict:
    """The band's numbers for bands of ``rows`` output rows: its padded channels and
    copies, the k steps of a window row, the band's words, and what the bank model
    chose: the row stride, the second copy's shift, the tiles' row order (``paired``)
    and the pixels a tile row spans (``vw``), with the fewest ldmatrix wavefronts."""
    return _band_layout(shape.C, shape.K, shape.W + 2 * shape.pad, shape.Wo, rows)


@functools.lru_cache(maxsize=4096)
def _band_layout(C: int, K: int, iw: int, Wo: int, rows: int) -> dict:
    cp, copies = channels_padded(C)
    kr = ceil_div(K * cp, 16)  # k steps of one window row
    best = None
    # Tiles run over rows of vw pixels: Wo, or one more where Wo is odd and the band is
    # kept twice, so that a column's copy follows the pixel's parity in every row
    # (mx-layer2, 27 columns: 27% more A wavefronts in rows of 27 than of 28, whose last
    # pixel is computed and not stored).
    for vw in sorted({Wo, Wo + Wo % 2 * (copies - 1)}):
        # A row's last run (column vw-1) reads 16*kr elements, 4 more in the second copy.
        least = max(iw * cp, (vw - 1) * cp + 16 * kr + 4 * (copies - 1))
        least = ceil_div(least, 8) * 8
        tiles = ceil_div(rows * vw, 16)
        for paired in (True, False):
            for stride in range(least, least + 64, 8):
                for shift in range(0, 128, 16) if copies == 2 else (0,):
                    total, worst = _wavefronts(vw, rows * vw, cp, copies, stride, shift, paired)
                    # the A wavefronts of an item, then the fewest tiles
                    cost = (total * tiles / min(tiles, MODELLED_TILES), tiles)
                    if best is None or cost < best[0]:
                        best = (
                            cost,
                            dict(vw=vw, paired=paired, stride=stride, shift=shift, degree=worst),
                        )
    lay = best[1]
    return dict(
        lay,
        cp=cp,
        copies=copies,
        kr=kr,
        ih=rows + K - 1,
        iw=iw,
        band_words=ceil_div((rows + K - 1) * lay["stride"], 64) * 32,  # a copy, whole lines
    )


def plan_mmahwc(shape: ConvProblem, v: "Mmahwc"):
    own_dtype16(Mmahwc.key, shape, v.precision, planning=True)
    C, M, H, W, K, pad = shape.C, shape.M, shape.H, shape.W, shape.K, shape.pad
    Ho, Wo = shape.Ho, shape.Wo
    if C > MAX_CHANNELS:
        raise SpecError(
            f"mmahwc keeps a pixel's channels side by side for C up to {MAX_CHANNELS}, "
            f"not {C}; use --strategy wgmma or tcgemm"
        )
    rows, nt, p = warp_tiles(shape, v)
    lay = _layout(shape, rows)
    cp, copies, kr, ih, stride = lay["cp"], lay["copies"], lay["kr"], lay["ih"], lay["stride"]
    steps = K * kr
    map_tiles = ceil_div(M, 8)
    map_groups = ceil_div(map_tiles, nt)
    map_tiles = map_groups * nt  # B holds zero maps up to whole map groups
    vw = lay["vw"]
    pixels = rows * vw
    tiles = ceil_div(pixels, 16)
    # Registers: accumulators, a step's A and B fragments, the tiles' addresses and about
    # 40 for the rest; two blocks an SM.
    pg, passes = _warp_grid(tiles, p, map_groups, 4 * nt * p + 5 * p + 2 * nt + 40, BLOCKS16)
    warps = map_groups * pg
    threads = 32 * warps

    # Shared memory in 32-bit words: B fragments [step][map tile][lane] of uint2, the raw
    # band in x's order, then the band's copies, each [ih][stride], the second `shift`
    # bytes further into its 128-byte line.
    b_words = steps * map_tiles * 64
    chunk_words, raw_words, _, _ = band16_words(shape, ih, 0)
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
    bands_per_image = ceil_div(Ho, rows)
    unit = 8 if copies == 1 else 4  # elements a spread store writes
    kpad = 16 * steps
    ctx = dict(
        shape_context(shape),
        **band16_context(shape, ih, threads, chunk_words, spread=False),
        elem="f16" if shape.dtype is DType.FP16 else "bf16",
        rows=rows,
        ih=ih,
        iw=lay["iw"],
        cp=cp,
        copies=copies,
        kr=kr,
        steps=steps,
        stride=stride,
        unit=unit,
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
        row_bytes=2 * stride,
        last_pixel=rows * lay["vw"] - 1,
        words_a_pixel=cp // 2,
        step_fragments=map_tiles * 32,  # uint2 B fragments of one k step
        zero_words=words - b_words - raw_words,
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
        accumulators=4 * nt * p,
        threads=threads,
        launch_bounds=f"{threads}, {BLOCKS16}",
        launch_bounds_alt=f"{threads}, 1",
        pixels=pixels,
        vw=vw,
        paired=lay["paired"],
        tiles=tiles,
        band_pixels=ih * W,
        bands_per_image=bands_per_image,
        guard_rows=Ho % rows != 0,
        guard_maps=map_tiles * 8 != M,
        smem_bytes=nbytes,
        precision_note=f"{shape.dtype.value} products exact, accumulated in fp32",
    )
    sizes = [
        Size("output", f"{M} x {Ho} x {Wo}", f"Ho = H + 2*pad - K + 1 = {H}+{2 * pad}-{K}+1"),
        Size(
            "fragment",
            f"mma.m16n8k16, {shape.dtype.value}",
            "16 pixels x 8 maps x 16 elements of a window row's taps x channels run",
        ),
        Size(
            "k padding",
            f"{shape.reduction} -> {kpad} ({100.0 * (kpad - shape.reduction) / kpad:.1f}% zeros)",
            (f"C to {cp}, " if cp != C else "")
            + f"a window row's {K} x {cp} to {16 * kr}: {kr} k steps a row, {steps} in all",
        ),
        Size(
            "warp",
            f"{p} x {nt} mma per k step",
            f"register tile {16 * p} pixels x {8 * nt} maps = {4 * nt * p} accumulators per "
            f"thread; {p} ldmatrix.x4 and {nt} 8-byte B loads a step",
        ),
        Size(
            "block",
            f"{threads} threads",
            f"{map_groups} map group(s) x {pg} pixel group(s) of warps, two blocks an SM",
        ),
        Size(
            "work item",
            f"{rows} output rows = {pixels} pixels"
            + (f" (rows of {vw}: the last column computed, not stored)" if vw != Wo else ""),
            f"{tiles} m16 tiles in {passes} pass(es) of {pg * p} "
            f"({100.0 * (1 - tiles / (passes * pg * p)):.0f}% idle); "
            f"{bands_per_image} item(s) per image",
        ),
        Size(
            "smem B",
            f"{4 * b_words} B",
            f"{steps} k steps x {map_tiles} map tiles x 32 lanes x 8 B",
        ),
        Size(
            "smem raw band",
            f"{4 * raw_words} B [{C}][{2 * chunk_words}]",
            f"{ih} input rows of {W} per channel as x holds them, by 16-byte cp.async",
        ),
        Size(
            "smem band",
            f"{copies} x [{ih}][{stride}] {shape.dtype.value}",
            f"[row][column][{cp} channels], row stride {stride}"
            + (", the second copy 4 elements on (odd columns' runs aligned)" if copies == 2 else "")
            + f": {lay['degree']}-way ldmatrix conflicts at worst",
        ),
    ]
    return band_walk_plan(
        shape, v, "gemm/mmahwc.cu.j2", threads, bands_per_image, nbytes, sizes, ctx
    )


@dataclass(frozen=True, kw_only=True)
class Mmahwc(Variant):
    key = "mmahwc"
    family = "gemm"
    description = (
        "persistent blocks on fp16/bf16 tensor cores over a band spread pixel by pixel "
        "(HWC): a window row's taps x channels one run on the k side, A by ldmatrix"
    )
    serves = EPILOGUE | {Feature.DTYPE16}
    precisions = FRAGMENT16
    tensor_core = True

    tile: int = param(16, Count("t"), "mmahwc: output rows per band")
    regtile: tuple[int, int] = param(
        (24, 32), Pair("r"), "mmahwc: maps x pixels of a warp (whole n8 and m16 tiles)"
    )

    def plan(self, problem):
        return plan_mmahwc(problem, self)

    @classmethod
    def fit(cls, problem, seed):
        """The tensors' own dtype, where at least 3/4 of the k steps and of the n8 map
        tiles carry real channels and maps; every map in a warp up to 3 tiles (else the
        fewest even groups), up to 6 pixel tiles within 64 accumulators, and the band that lets two
        blocks share an SM with the fewest input rows an image (taller on ties), else
        the tallest that fits.  bf16 at B=10000 (H200, 2026-11-24), mx-layer2's dgrad
        view in bands of 11 rows (two blocks an SM): 16 maps x 96 pixels a warp 1.45 ms,
        x 64 1.52, x 128 1.49; mx-layer2's forward pass in bands of 14, 24 maps x 80
        pixels 0.79, x 64 0.88, x 48 0.93; whole images (one block an SM) 0.97."""
        own_dtype16(cls.key, problem, seed.precision, planning=False)
        C, M, K = problem.C, problem.M, problem.K
        if C > MAX_CHANNELS:
            raise SpecError(
                f"mmahwc keeps a pixel's channels side by side for C up to {MAX_CHANNELS}, "
                f"not {C}; use --strategy wgmma or tcgemm"
            )
        cp, _ = channels_padded(C)
        use = C * K / (16 * ceil_div(K * cp, 16))
        fill = M / (8 * ceil_div(M, 8))
        if use < MIN_K_USE or fill < MIN_K_USE:
            raise SpecError(
                f"mmahwc: {100 * use:.0f}% of the k side and {100 * fill:.0f}% of the map "
                f"tiles would carry C={C}, M={M}; it wants {100 * MIN_K_USE:.0f}%"
            )
        map_tiles = ceil_div(M, 8)
        nt = ceil_div(map_tiles, ceil_div(map_tiles, 3))
        p = max(1, min(6, 16 // nt, ceil_div(problem.Ho * problem.Wo, 16)))
        base = replace(seed, regtile=(8 * nt, 16 * p))
        two, one = [], []
        for rows in range(problem.Ho, 0, -1):
            try:
                plan = make_plan(problem, replace(base, tile=rows))
            except SpecError:
                continue
            cost = (ceil_div(problem.Ho, rows) * (rows + K - 1), -rows)
            if BLOCKS16 * (plan.dynamic_smem + 1024) <= SM_SHARED:
                two.append((cost, rows))
            else:
                one.append(rows)
        if two:
            rows = min(two)[1]
        elif one:
            rows = max(one)
        else:
            raise SpecError("mmahwc: no band of this problem fits an SM's shared memory")
        return replace(base, tile=ceil_div(problem.Ho, ceil_div(problem.Ho, rows)))

    @classmethod
    def space(cls, problem, precision):
        """1 to 3 map tiles by 1 to 8 pixel tiles a warp (at most 64 accumulators),
        bands of Ho/k rows."""
        map_tiles = min(3, ceil_div(problem.M, 8))
        rows = sorted({ceil_div(problem.Ho, k) for k in (1, 2, 3, 4, 6)}, reverse=True)
        return [
            cls(tile=r, regtile=(8 * nt, 16 * p), precision=precision)
            for nt, p, r in itertools.product(range(1, map_tiles + 1), range(1, 9), rows)
            if 4 * nt * p <= MAX_ACCUMULATORS
        ]
