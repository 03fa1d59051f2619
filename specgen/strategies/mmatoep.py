"""``mmatoep``: fp16/bf16 tensor cores with the window's columns in a Toeplitz B.

mmastrip and mmafold put a strip's pixels on the m16 side and taps on the k side, so a
lane's A words are taps of its own pixels, loaded word by word for every k step: about
five shared loads a mma where the maps are few (the 7x7 layers' dgrad views have 1 to
12), and dgrad ran 2 to 3 times over its targets (H200, bf16, B=10000).

Here the m16 side is 16 output rows and the n8 side 8 output columns of one map; for
each channel c and window row ky the k side is the 16 input columns under the 8 output
columns, and B is the window row's taps laid as a Toeplitz band: B[k][n] = w[ky][k - n -
delta] for 0 <= k - n - delta < K, else 0 (so K + delta <= 9).  A is then a plain 16 x 16
block of the band, rows r0 + ky .. r0 + ky + 15 at columns 8j .. 8j + 15, read by
``ldmatrix`` with each lane addressing its own row: moving 8 columns right keeps half of
the fragment (its k 8..15 are the next tile's k 0..7), so a warp's walk along a row of
column tiles loads one ``ldmatrix.x2`` a mma, and each B fragment, two words a lane from
a table of the window row's K + 1 tap pairs, serves every column tile of the walk.  K of
the 16 k columns carry taps: for 7x7 windows 44% of the multiplies are useful.

The band holds each image row from a 16-byte boundary (``lpad`` columns of zeros before
it, the padding and more after it, never written), at a row stride of 8 mod 16 elements
so that the 8 rows of an ``ldmatrix`` matrix fall in 8 different bank quads.  x's rows
arrive by band16's 16-byte fetch into one raw band while the band before is multiplied,
and are realigned 16 bytes at a time (five words and four byte permutations a chunk, or
one 16-byte copy where x's rows start on 16-byte boundaries): band16's word-wise spread
into the padded layout cost about three times the multiplies on these layers (layer1's
dgrad view 0.70 ms with it, 0.41 without; H200, bf16, B=10000).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

from ..errors import SpecError
from ..plan import ladder, make_plan
from ..plan.common import OPTIN_SMEM_BYTES, Size, band_walk_plan, ceil_div, shape_context
from ..shapes import DType, Feature
from ..variants import EPILOGUE, Count, Pair, Variant, param
from .mmapersist import (
    BLOCKS16,
    FRAGMENT16,
    _warp_grid,
    band16_context,
    band16_words,
    own_dtype16,
)
from .mmastrip import MAX_ACCUMULATORS  # fp32 accumulators per thread
from ..plan.common import SM_SHARED

MAX_K = 9  # 8 output columns and K - 1 more fill at most one k16 step
# The channel loop is unrolled where it has at most this many (channel, window row) steps.
FULL_UNROLL_STEPS = 112


def _stride(iw: int) -> int:
    """The band's row stride in elements: at least the spread's words (iw rounded up to
    even), 8 mod 16 (an odd number of 16-byte units: the 8 rows an ldmatrix matrix reads
    start in 8 different bank quads)."""
    s = iw + iw % 2
    return s + (8 - s % 16) % 16


def _chunk_masks(kept: int) -> list[tuple[str, str]]:
    """The words of a 16-byte chunk (x, y, z, w) that hold columns past the image where its
    first ``kept`` elements (1 to 7; 0: all 8) are the image's, with the mask each keeps."""
    if not kept:
        return []
    out = []
    for part, first in zip("xyzw", range(0, 8, 2)):
        halves = min(max(kept - first, 0), 2)
        if halves < 2:
            out.append((part, "0x0000ffffu" if halves else "0u"))
    return out


def plan_mmatoep(shape, v):
    own_dtype16(v.key, shape, v.precision, planning=True)
    C, M, H, W, K, pad = shape.C, shape.M, shape.H, shape.W, shape.K, shape.pad
    Ho, Wo = shape.Ho, shape.Wo
    key = v.key
    if K > MAX_K:
        raise SpecError(
            f"{key} reads the 8 + K - 1 input columns under 8 output columns as one k16 "
            f"step: K at most {MAX_K}, not {K}; use --strategy mmastrip"
        )
    rows = v.tile
    if rows < 1 or rows > Ho:
        raise SpecError(f"{key}'s tile is a band of output rows, 1 to Ho={Ho}; got {rows}")
    mw, ct = v.regtile
    bm = v.maps
    if mw > M or bm > M or bm % mw:
        fits = [m for m in range(mw, M + 1, mw)]
        raise SpecError(
            f"{key}'s block maps ({bm}) are whole groups of a warp's maps ({mw}), at most "
            f"M={M}: choose --regtile with at most {M} maps and --maps "
            + (f"one of {', '.join(map(str, fits))}" if fits else f"up to {M}")
        )
    if 4 * mw * ct > MAX_ACCUMULATORS:
        raise SpecError(
            f"register tile {mw} maps x {ct} column tiles = {4 * mw * ct} accumulators per "
            f"thread, over {MAX_ACCUMULATORS}; choose at most "
            f"{max(1, MAX_ACCUMULATORS // (4 * mw))} column tiles for {mw} maps"
        )
    map_blocks = ceil_div(M, bm)
    map_groups = bm // mw
    # The k side of column tile j is the 16 band columns from 8j; output column n of the
    # tile reads band column 8j + n + s for tap s, so B[k][n] = w[k - n - delta].  The band
    # row holds the image row from column ``lpad`` (a multiple of 8: 16-byte chunks), zero
    # around.  Where K + delta passes 16 - 8 + 1, the tiles start eps columns left of the
    # image instead, and delta is 0.
    delta = -pad % 8
    eps = 0
    if K + delta > MAX_K:
        eps, delta = delta, 0
    lpad = pad + (-pad % 8)
    col_tiles = ceil_div(Wo + eps, 8)
    if ct > col_tiles:
        raise SpecError(
            f"register tile columns {ct}: Wo={Wo} has {col_tiles} tiles of 8 columns; "
            f"choose 1 to {col_tiles}"
        )
    row_tiles = ceil_div(rows, 16)
    col_groups = ceil_div(col_tiles, ct)
    units = row_tiles * col_groups * map_groups
    # Accumulators, the B words of a step, two A fragments, and about 40 for the rest.
    pg, passes = _warp_grid(units, 1, 1, 4 * mw * ct + 2 * mw + 48, BLOCKS16)
    threads = 32 * pg

    stride = _stride(lpad + W + pad)
    ih = rows + K - 1  # input rows a band reads
    ih_alloc = max(rows, 16) + K - 1  # and a 16-row tile from the band's first row
    plane = ih_alloc * stride
    # The last column tile reads 16 columns from its first, past Wo: into the next row
    # or, past the last plane's last row, into this slack.
    slack = 8 * col_tiles + 16
    # A window row's tap pairs: word q holds taps q - 1 and q (q = 0..K), the words of B's
    # Toeplitz band that are not zero.
    table_row = K + 1
    table_words = C * K * bm * table_row
    chunk_words, raw_words, band_words, _ = band16_words(shape, ih, C * plane + slack)
    raw_at = ceil_div(table_words, 4) * 4  # 16-byte aligned: cp.async's destination
    band_at = raw_at + raw_words + 4  # a chunk's realign reads a word past the raw band
    nbytes = 4 * (band_at + band_words)
    if nbytes > OPTIN_SMEM_BYTES:
        raise SpecError(
            f"{key} needs {nbytes} bytes of shared memory (tap tables {4 * table_words} B, "
            f"a raw band of {4 * raw_words} B, the band {4 * band_words} B), over the "
            f"sm_90 limit of {OPTIN_SMEM_BYTES} bytes per block; choose --tile "
            f"{max(1, rows // 2)}" + (f" or --maps {max(mw, bm // 2)}" if bm > mw else "")
        )
    # x's rows start on 16-byte boundaries: the raw band's chunks are the band's
    aligned = W % 8 == 0 and (H * W) % 8 == 0 and (C * H * W) % 8 == 0
    steps = C * K
    pairs = Wo % 2 == 0 and eps == 0
    bands_per_image = ceil_div(Ho, rows)
    ctx = dict(
        shape_context(shape),
        **band16_context(shape, ih, threads, chunk_words, spread=False),
        elem="f16" if shape.dtype is DType.FP16 else "bf16",
        rows=rows,
        ih=ih,
        stride=stride,
        plane=plane,
        lpad=lpad,
        delta=delta,
        eps=eps,
        row_chunks=ceil_div(W, 8),
        channel_chunks=ih * ceil_div(W, 8),
        band_chunks=C * ih * ceil_div(W, 8),
        last_chunk=ceil_div(W, 8) - 1,
        # the last chunk's words past W: (component, mask of what stays), none where W % 8 is 0
        last_chunk_masks=_chunk_masks(W % 8),
        q0_base=1 - delta,  # lane (g, t)'s first table word is 2t - g + q0_base
        channel_tables=bm * K,
        group_words=mw * table_row,  # a map group's offset in a (channel, window row)'s tables
        row_tile_units=map_groups * col_groups,
        last_j0=col_tiles - ct,
        accumulators=4 * mw * ct,
        aligned=aligned,
        mw=mw,
        ct=ct,
        bm=bm,
        map_blocks=map_blocks,
        map_groups=map_groups,
        col_tiles=col_tiles,
        col_groups=col_groups,
        row_tiles=row_tiles,
        units=units,
        table_words=table_words,
        table_row=table_row,
        raw_at=raw_at,
        raw_words=raw_words,
        band_at=band_at,
        zero_words=band_words,
        chunk_words=chunk_words,
        copy_words=C * chunk_words,
        unrolled=steps <= FULL_UNROLL_STEPS,
        threads=threads,
        launch_bounds=f"{threads}, {BLOCKS16}",
        launch_bounds_alt=f"{threads}, 1",
        bands_per_image=bands_per_image,
        guard_rows=Ho % rows != 0 or rows < 16,
        guard_maps=map_blocks * bm != M,
        pairs=pairs,
        smem_bytes=nbytes,
    )
    useful = K / 16 * Wo / (8 * col_tiles) * rows / (16 * row_tiles)
    sizes = [
        Size("output", f"{M} x {Ho} x {Wo}", f"Ho = H + 2*pad - K + 1 = {H}+{2 * pad}-{K}+1"),
        Size(
            "fragment",
            f"mma.m16n8k16, {shape.dtype.value}",
            f"16 output rows x 8 output columns of a map x the 16 input columns under them; "
            f"B a window row's {K} taps as a Toeplitz band ({K} of 16 k columns), "
            f"B[k][n] = w[k - n - {delta}]",
        ),
        Size(
            "useful",
            f"{100 * useful:.0f}% of the multiplies",
            f"{K}/16 k columns x {Wo}/{8 * col_tiles} columns x {rows}/{16 * row_tiles} rows",
        ),
        Size(
            "warp",
            f"16 rows x {ct} column tile(s) x {mw} map(s)",
            f"{4 * mw * ct} accumulators per thread; per (channel, window row) "
            f"{ct + 1} ldmatrix.x2 and {2 * mw} table words for {ct * mw} mma",
        ),
        Size(
            "block",
            f"{threads} threads, {bm} map(s)",
            f"{units} units ({row_tiles} row tiles x {col_groups} column groups x "
            f"{map_groups} map groups) in {passes} pass(es); {map_blocks} map block(s), "
            f"{BLOCKS16} blocks an SM",
        ),
        Size(
            "work item",
            f"{rows} output rows x {bm} maps",
            f"{bands_per_image} band(s) an image; a block keeps its map block's taps",
        ),
        Size(
            "smem taps",
            f"{4 * table_words} B",
            f"[{C}][{K}][{bm}][{table_row}] words: tap pairs (w[q-1], w[q]), q = 0..{K}",
        ),
        Size(
            "smem raw band",
            f"{4 * raw_words} B [{C}][{2 * chunk_words}]",
            f"{ih} input rows of {W} per channel as x holds them, by 16-byte cp.async "
            "while the band before is multiplied"
            + ("" if aligned else ", realigned 16 bytes at a time"),
        ),
        Size(
            "smem band",
            f"[{C}][{ih_alloc}][{stride}] {shape.dtype.value}",
            f"image rows from column {lpad}, zero around; stride {stride} = 8 mod 16: "
            "ldmatrix rows in distinct bank quads",
        ),
        Size(
            "stores",
            "pixel pairs, 32-bit" if pairs else "single pixels, 16-bit",
            "a lane's two columns are neighbours" if pairs else f"Wo={Wo} is odd",
        ),
    ]
    return band_walk_plan(
        shape,
        v,
        "gemm/mmatoep.cu.j2",
        threads,
        bands_per_image * map_blocks,
        nbytes,
        sizes,
        ctx,
    )


@dataclass(frozen=True, kw_only=True)
class Mmatoep(Variant):
    key = "mmatoep"
    templates = ("gemm/mmatoep.cu.j2",)
    family = "gemm"
    description = (
        "persistent blocks on fp16/bf16 tensor cores for narrow windows: each mma 16 output "
        "rows x 8 columns of a map, the k side the 16 input columns under them, the window "
        "row's taps a Toeplitz B"
    )
    serves = EPILOGUE | {Feature.DTYPE16}
    precisions = FRAGMENT16
    tensor_core = True

    tile: int = param(16, Count("t"), "mmatoep: output rows per band")
    regtile: tuple[int, int] = param(
        (1, 4), Pair("r"), "mmatoep: maps x 8-column tiles of a warp's 16 output rows"
    )
    maps: int = param(1, Count("m"), "mmatoep: maps a block computes (it keeps their taps)")

    def plan(self, problem):
        return plan_mmatoep(problem, self)

    @classmethod
    def fit(cls, problem, seed):
        """The tensors' own dtype; two maps a warp where M is even, else one, across half
        a row's column tiles (at most 6); every map in a block where their tap tables
        fit, else the fewest map blocks; among the bands that give two blocks an SM at
        least 4 warps each (else one block at least 8, else any), the fewest 16-row
        tiles an image, then the fewest bands, cut evenly.  bf16 dgrad at B=10000 (H200,
        2026-11-24): layer1's view (11 column tiles, 1 map) 0.407 ms with 6 tiles a warp
        against 0.417 with 11 and 0.475 with 3; layer2's (5 tiles, 4 maps) 0.938 with 2
        maps x 3 tiles against 1.95 with 4 x 3 and 1.02 with 1 x 5; mx-layer1's bands of
        24 rows (two blocks of 6 warps) 1.15 against 1.32 in bands of 36 (one of 9)."""
        own_dtype16(cls.key, problem, seed.precision, planning=False)
        M, Ho = problem.M, problem.Ho
        mw = 2 if M % 2 == 0 else 1
        ct = min(6, ceil_div(ceil_div(problem.Wo, 8), 2))

        def cost(rows):
            """(16-row tiles an image, bands an image): a band's last tile starts early
            rather than run past it, so a band of r rows is ceil(r / 16) tiles."""
            full, last = divmod(Ho, rows)
            return full * ceil_div(rows, 16) + ceil_div(last, 16), ceil_div(Ho, rows)

        for bm in [m for m in range(M, 0, -mw) if M % m == 0]:

            def variant(rows):
                return replace(seed, tile=rows, regtile=(mw, ct), maps=bm)

            two, one, any_ = [], [], []
            for rows in ladder(Ho):
                try:
                    plan = make_plan(problem, variant(rows))
                except SpecError:
                    continue
                warps = plan.launches[0].block[0] // 32
                if BLOCKS16 * (plan.dynamic_smem + 1024) <= SM_SHARED and warps >= 4:
                    two.append(rows)
                elif plan.dynamic_smem + 1024 <= SM_SHARED and warps >= 8:
                    one.append(rows)
                else:
                    any_.append(rows)
            for fits in (two, one):
                if fits:
                    best = min(fits, key=lambda rows: (cost(rows), -rows))
                    return variant(ceil_div(Ho, ceil_div(Ho, best)))
            if any_:
                return variant(any_[0])
        raise SpecError("mmatoep: no band of this problem fits an SM's shared memory")

    @classmethod
    def space(cls, problem, precision):
        """1 to 4 maps a warp by 1 to all column tiles (at most 64 accumulators), block
        maps M or its halves, bands of Ho/k rows."""
        M = problem.M
        col_tiles = ceil_div(problem.Wo, 8)
        bands = sorted({ceil_div(problem.Ho, k) for k in (1, 2, 3, 4)}, reverse=True)
        out = []
        for mw, ct, b in itertools.product((1, 2, 3, 4), range(1, col_tiles + 1), bands):
            if mw > M or 4 * mw * ct > MAX_ACCUMULATORS:
                continue
            for bm in sorted({M - M % mw, ceil_div(M // 2, mw) * mw}):
                if bm >= mw:
                    out.append(cls(tile=b, regtile=(mw, ct), maps=bm, precision=precision))
        return out
