"""``mmastrip``: fp16/bf16 tensor cores for windows over few channels (the 7x7 presets).

mmapersist's 16-bit kernel gives each warp flat m16 tiles of pixels and loads, for every
k step, the A words of its two window rows: four shared loads per mma.  With one to a
dozen channels there are only a few k steps per tile, and the loads, not the multiplies,
fill the instruction stream (layer1: 37k warp instructions an image for 1600 mma, H200).

Here a warp owns a strip: 16 columns of R output rows.  Output row r at window row ky
reads input row r + ky, so the R rows of a strip read R + K - 1 input rows between
them: a warp loads each input row's words (taps 2t, 2t+1 of its pixels g and g+8, each
octet of 8 taps) once per channel and feeds them to every output row that row serves,
about (R + K - 1) / (R * K) of mmapersist's loads for the same multiplies.  A k step is
two window rows of one channel (an odd count gets a slot of zero weights), so the
fragments of a step are registers picked at compile time: rows r + ky_a and r + ky_b.

The band, its two copies (as is, and shifted by one element so that every tap pair is an
aligned word) and the persistent walk over (image, band) items are mmapersist's
(templates/gemm/band16.j2).  The m16 rows of a fragment are the strip's columns in the
order 0, 2, .., 14, 1, 3, .., 15: a lane's A words are then an even column's, always in the
band's even copy, and an odd column's, always in the odd copy (no per-lane choice), and
its sums are two neighbouring pixels of each of its maps, one 32-bit store (where Wo is
even), each store of a warp four full 32-byte sectors.  With rows g and g+8 as columns g
and g+8, each store wrote half sectors of eight maps, and the layer with most output
(mx-layer1, 1 GB) ran at 1.29 ms held by its stores (Nsight Compute: MIO and global
store-queue stalls, 28% of each written sector used; H200).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, replace
from math import gcd

from ..errors import SpecError
from ..plan import ladder, make_plan, tallest
from ..plan.common import (
    OPTIN_SMEM_BYTES,
    Plan,
    Size,
    band_walk_plan,
    ceil_div,
    shape_context,
)
from ..shapes import ConvProblem, DType, Feature
from ..variants import EPILOGUE, Count, Pair, Switch, Variant, param
from .mmapersist import (
    BLOCKS16,
    FRAGMENT16,
    _warp_grid,
    band16_context,
    band16_words,
    own_dtype16,
    warp_map_tiles,
)
from ..plan.common import SM_SHARED

MAX_ACCUMULATORS = 64  # fp32 accumulators per thread: R rows x NT map tiles x 4
# The channels are unrolled up to this many k steps in all (each step R x NT mma);
# beyond, a loop over channels whose body is one channel.
FULL_UNROLL_STEPS = 28


# Where Wo leaves 2 or 4 columns past its whole 16-column tiles (34, 66), those columns
# are taken as column pairs down 8 rows a fragment (each lane a row), instead of a
# strip of 16 columns that would mostly fall past Wo.
REMAINDER_COLUMNS = (2, 4)


def _layout(shape: ConvProblem, rows: int, r: int, remainders: bool = True):
    """(row groups, column tiles, remainder column pairs, input rows allocated, row
    stride) of a band whose strips are r output rows tall."""
    Wo = shape.Wo
    remainder = remainders and Wo > 16 and Wo % 16 in REMAINDER_COLUMNS and Wo % 2 == 0
    row_groups = ceil_div(rows, r)
    col_tiles = Wo // 16 if remainder else ceil_div(Wo, 16)
    rem_pairs = Wo % 16 // 2 if remainder else 0
    rows_read = max(row_groups * r, ceil_div(rows, 8) * 8 if remainder else 0)
    ih_alloc = rows_read + shape.K - 1
    iw = shape.W + 2 * shape.pad
    stride = iw + iw % 2
    return row_groups, col_tiles, rem_pairs, ih_alloc, stride


def plan_mmastrip(shape: ConvProblem, v: Variant) -> Plan:
    own_dtype16(v.key, shape, v.precision, planning=True)
    C, M, H, W, K, pad = shape.C, shape.M, shape.H, shape.W, shape.K, shape.pad
    Ho, Wo = shape.Ho, shape.Wo
    rows = v.tile
    fold = getattr(v, "fold", 1)  # output rows a fragment's n8 side holds, with its maps
    mw, r = v.regtile
    key = v.key
    if rows < 1 or rows > Ho:
        raise SpecError(f"{key}'s tile is a band of output rows, 1 to Ho={Ho}; got {rows}")
    if fold == 1:
        nt = warp_map_tiles(M, mw)
        map_groups = ceil_div(ceil_div(M, 8), nt)
    else:
        if mw > M or (mw * fold) % 8:
            fits = [m for m in range(1, M + 1) if (m * fold) % 8 == 0]
            if fits:
                raise SpecError(
                    f"register tile maps {mw}: a warp's maps x {fold} folded rows fill whole "
                    f"n8 tiles, at most M={M} maps; choose one of {', '.join(map(str, fits))}"
                )
            m = min(mw, M)
            raise SpecError(
                f"{m} map(s) a warp x {fold} folded rows fill no whole n8 tile; choose "
                f"--fold {8 // gcd(8, m)} (or a multiple of it)"
            )
        nt = mw * fold // 8
        map_groups = ceil_div(M, mw)
    if r < 1 or 4 * nt * r > MAX_ACCUMULATORS:
        what = f"{mw} maps x {r} rows" if fold == 1 else f"{mw} maps x {r} groups of {fold} rows"
        raise SpecError(
            f"register tile {what} = {4 * nt * r} accumulators per thread; "
            f"choose 1 to {MAX_ACCUMULATORS // (4 * nt)} {'rows' if fold == 1 else 'groups'} "
            f"for {mw} maps"
        )
    octets = ceil_div(K, 8)
    # octets of one channel's window rows; folded, of the input rows under a group's rows
    slots = (K + fold - 1) * octets
    steps = ceil_div(slots, 2)  # per channel; an odd count pads one slot of zero weights
    unrolled = C * steps <= FULL_UNROLL_STEPS
    map_tiles = map_groups * nt
    strip_rows = fold * r
    row_groups, col_tiles, rem_pairs, ih_alloc, stride = _layout(
        shape, rows, strip_rows, remainders=fold == 1
    )
    rem_units = rem_pairs * ceil_div(rows, 8)
    units = row_groups * col_tiles + rem_units
    span = strip_rows + K - 1  # input rows of a strip
    a_words = 2 * span * octets
    # Accumulators, a channel's A words, and about 40 for the rest; two blocks an SM.
    pg, passes = _warp_grid(units, 1, map_groups, 4 * nt * r + a_words + 40, BLOCKS16)
    warps = map_groups * pg
    threads = 32 * warps

    ih = rows + K - 1
    plane = ih_alloc * stride
    # A strip's last column tile reads up to 15 + 8*octets columns past its first, past
    # Wo, into the next row or, in the last plane, into this slack.
    slack = 24 + 8 * octets
    b_words = C * steps * map_tiles * 64
    chunk_words, raw_words, even_words, odd_words = band16_words(shape, ih, C * plane + slack)
    # pixel pairs are one word where Wo, Ho*Wo and the image are even
    pairs = Wo % 2 == 0 and (M * Ho * Wo) % 2 == 0
    if v.staged and not pairs:
        raise SpecError(
            f"{key}'s staged output (ys) stores pixel pairs as words: it needs an even "
            f"Wo and Ho*Wo, not Wo={Wo}; take --store-output"
        )
    # The staged band of sums: each map's rows, at the phase of their run in y modulo 8
    # elements, so that 16-byte chunks of shared memory and of y line up; a map's run
    # is (rows*Wo + 8) elements rounded up to 4 words past a multiple of 16: one store
    # of the fragments writes maps 2 apart, 8 banks apart then, and meets in no bank.
    run_words = ceil_div(rows * Wo + 8, 2)
    run_words = run_words + (4 - run_words) % 16 if v.staged else 0
    out_words = M * run_words
    words = b_words + 2 * raw_words + even_words + odd_words + out_words
    nbytes = 4 * words
    if nbytes > OPTIN_SMEM_BYTES:
        raise SpecError(
            f"{key} needs {nbytes} bytes of shared memory (B fragments {4 * b_words} B, "
            f"two raw bands of {4 * raw_words} B, the band twice in "
            f"{4 * (even_words + odd_words)} B), over the sm_90 limit of {OPTIN_SMEM_BYTES} "
            f"bytes per block; choose --tile {max(1, rows // 2)}"
        )

    def slot(q: int) -> tuple[int, int]:
        """(window row, octet) of slot q of a channel (folded: input row of the group's
        band, octet); the padding slot reuses slot 0."""
        return divmod(q, octets) if q < slots else (0, 0)

    def words_at(where: tuple[int, int]) -> int:
        """Words from a strip's first input row to window row ky's octet o."""
        ky, o = where
        return ky * stride // 2 + 4 * o

    body = [
        dict(
            s=s,
            a=slot(2 * s),
            b=slot(2 * s + 1),
            a_at=words_at(slot(2 * s)),
            b_at=words_at(slot(2 * s + 1)),
            pad=2 * s + 1 >= slots,
            w=s * map_tiles * 32,
        )
        for s in range(steps)
    ]
    bands_per_image = ceil_div(Ho, rows)
    ctx = dict(
        shape_context(shape),
        **band16_context(shape, ih, threads, chunk_words),
        elem="f16" if shape.dtype is DType.FP16 else "bf16",
        rows=rows,
        R=r,
        span=span,
        last_row=span - 1,
        a_words=a_words,
        step_words=64 * map_tiles,
        ih=ih,
        ih_alloc=ih_alloc,
        iw=W + 2 * pad,
        stride=stride,
        row_words=stride // 2,
        plane=plane,
        octets=octets,
        slots=slots,
        steps=steps,
        unrolled=unrolled,
        body=body,
        channel_words=plane // 2,
        channel_w=steps * map_tiles * 32,
        chunk_words=chunk_words,
        copy_words=C * chunk_words,
        band_total=C * ih * (W + 2 * pad),
        band_pixels=ih * (W + 2 * pad),
        b_words=b_words,
        raw_at=b_words,
        raw_words=raw_words,
        even_at=b_words + 2 * raw_words,
        odd_at=b_words + 2 * raw_words + even_words,
        zero_words=even_words + odd_words,
        staged=v.staged,
        map_phase=Ho * Wo % 8,  # y's runs modulo 8 elements: a map's step, an image's
        image_phase=M * Ho * Wo % 8,
        band_run=rows * Wo,
        run_chunks=(rows * Wo + 14) // 8,  # 16-byte chunks a run can touch at any phase
        out_chunks=M * ((rows * Wo + 14) // 8),
        out_at=b_words + 2 * raw_words + even_words + odd_words,
        run_words=run_words,
        map_tiles=map_tiles,
        nt=nt,
        map_groups=map_groups,
        unit_groups=pg,
        units=units,
        strips=row_groups * col_tiles,
        col_tiles=col_tiles,
        rem_pairs=rem_pairs,
        rem_col0=16 * col_tiles,
        last_col=Wo - 1,
        warp_maps=8 * nt,
        warp_fragments=32 * nt,
        accumulators=4 * nt * r,
        threads=threads,
        launch_bounds=f"{threads}, {BLOCKS16}",
        # one block an SM (ptxas may then take 255 registers): a drawn dgrad view's 16 maps
        # x 4 rows over 6 unrolled channels spilled 8 B at two (NVRTC 13, H200), and the
        # bare bound left ptxas at 128
        launch_bounds_alt=f"{threads}, 1",
        bands_per_image=bands_per_image,
        guard_rows=Ho % rows != 0 or row_groups * strip_rows != rows,
        fold=fold,
        mpw=mw if fold > 1 else 8 * nt,
        strip_rows=strip_rows,
        guard_cols=not rem_pairs and col_tiles * 16 != Wo,
        guard_maps=map_tiles * 8 != M,
        pairs=pairs,
        smem_bytes=nbytes,
        precision_note=f"{shape.dtype.value} products exact, accumulated in fp32",
    )
    kpad = C * steps * 16
    loads = 2 * span * octets
    mmas = r * steps
    sizes = [
        Size("output", f"{M} x {Ho} x {Wo}", f"Ho = H + 2*pad - K + 1 = {H}+{2 * pad}-{K}+1"),
        Size(
            "fragment",
            f"mma.m16n8k16, {shape.dtype.value}",
            (
                "16 pixels of a row x 8 maps x 16 taps (two window rows of 8), fp32 accumulators"
                if fold == 1
                else f"16 pixels of a row x ({fold} rows x {mw} maps on the n8 side) x 16 taps "
                f"(two input rows of a group's {fold + K - 1}, the weights banded), fp32 "
                "accumulators"
            ),
        ),
        Size(
            "k padding",
            f"{shape.reduction} -> {kpad} ({100.0 * (kpad - shape.reduction) / kpad:.1f}% zeros)",
            f"window rows padded to {8 * octets} taps, a channel's padded to {2 * steps}: "
            f"{steps} k steps a channel"
            + (f" (the {fold + K - 1} input rows under {fold} output rows)" if fold > 1 else ""),
        ),
        Size(
            "warp",
            (
                f"strip of {r} rows x 16 columns x {8 * nt} maps"
                if fold == 1
                else f"strip of {r} x {fold} rows x 16 columns x {mw} maps"
            ),
            f"{4 * nt * r} accumulators per thread; per channel {loads} A loads for "
            f"{mmas * nt} mma ({loads / (mmas * nt):.2f} a mma; flat tiles: 4)",
        ),
        Size(
            "block",
            f"{threads} threads",
            f"{map_groups} map group(s) x {pg} strip group(s) of warps, {BLOCKS16} blocks an SM",
        ),
        Size(
            "work item",
            f"{rows} output rows",
            f"{row_groups} row group(s) x {col_tiles} column tile(s)"
            + (
                f" + {rem_units} fragments of 2 columns x 8 rows for columns "
                f"{16 * col_tiles}..{Wo - 1}"
                if rem_units
                else ""
            )
            + f" = {units} units in {passes} pass(es) of {pg}; {bands_per_image} item(s) "
            "per image",
        ),
        Size("smem B", f"{4 * b_words} B", f"[{C}][{steps}][{map_tiles}][32] uint2"),
        Size(
            "smem raw bands",
            f"2 x {4 * raw_words} B [{C}][{2 * chunk_words}]",
            f"{ih} input rows of {W} per channel as x holds them, by 16-byte cp.async, spread "
            "a word at a time",
        ),
        Size(
            "smem band",
            f"2 copies x [{C}][{ih_alloc}][{stride}] {shape.dtype.value}",
            "as is and shifted by one element, so every tap pair is one aligned word",
        ),
        Size(
            "stores",
            (
                f"staged: {M} runs of {rows * Wo} pixels, 16-byte stores"
                if v.staged
                else "pixel pairs, 32-bit" if pairs else "single pixels, 16-bit"
            ),
            (
                f"smem [{M}][{2 * run_words}] {shape.dtype.value}, each map's rows one run of y"
                if v.staged
                else (
                    "a lane's two columns are neighbours: one 32-bit store of each map"
                    if pairs
                    else f"Wo={Wo} or the image odd: a pair could start at an odd element"
                )
            ),
        ),
    ]
    return band_walk_plan(
        shape, v, "gemm/mmastrip.cu.j2", threads, bands_per_image, nbytes, sizes, ctx
    )


def _rows_per_strip(rows: int, most: int, k: int) -> int:
    """The strip height, at most ``most``, that makes the most of its loads: the band's
    rows over the rows its strips compute (the last may run past the band), times a
    strip's rows over the input rows it loads (R / (R + K - 1))."""
    return max(range(1, most + 1), key=lambda r: rows / (ceil_div(rows, r) * r) * r / (r + k - 1))


@dataclass(frozen=True, kw_only=True)
class Mmastrip(Variant):
    key = "mmastrip"
    templates = ("gemm/mmastrip.cu.j2",)
    family = "gemm"
    description = (
        "persistent blocks on fp16/bf16 tensor cores for few channels: each warp a strip "
        "of output rows, every input row's fragments loaded once for all the rows it serves"
    )
    serves = EPILOGUE | {Feature.DTYPE16}
    precisions = FRAGMENT16
    tensor_core = True

    tile: int = param(8, Count("t"), "mmastrip: output rows per band")
    regtile: tuple[int, int] = param(
        (8, 8), Pair("r"), "mmastrip: maps x output rows of a warp's strip (16 columns wide)"
    )
    staged: bool = param(
        False,
        Switch("ys", "yd", ("stage-output", "store-output")),
        "mmastrip: the band's sums gathered in shared memory and written out as each map's "
        "run of rows in 16-byte stores, or stored from the fragments in pixel pairs",
    )

    def plan(self, problem):
        return plan_mmastrip(problem, self)

    @classmethod
    def fit(cls, problem, seed):
        """The tensors' own dtype; two map tiles (16 maps) a warp at most, strips of up
        to 8 / map tiles rows cut to make the most of their loads, and the tallest band,
        cut evenly, that lets two blocks share an SM."""
        own_dtype16(cls.key, problem, seed.precision, planning=False)
        nt = min(ceil_div(problem.M, 8), 2)
        # Strips of at most 10 rows of 8 maps, 4 rows of 16: two blocks then fit an SM's
        # registers.  layer2 in bf16 took 0.435 ms with 16 maps x 4 rows a warp, and
        # 16 x 6 spilled (H200, B=10000); layer1's 8 maps x 10 rows took 0.300.
        most = 10 if nt == 1 else 4

        # Sums staged where each warp store would straddle sectors (rows not whole
        # 32-byte sectors) and the outputs outweigh the multiplies (few channels):
        # mx-layer1 in bf16, 0.71 ms staged against 1.04 stored from the fragments; on
        # layer2 (4 channels) staging lost, 0.57 against 0.52 (H200, B=10000).
        Wo, K = problem.Wo, problem.K
        staged = (
            Wo % 16 != 0
            and Wo % 2 == 0
            and (problem.M * problem.Ho * Wo) % 2 == 0
            and problem.C * ceil_div(K * ceil_div(K, 8), 2) <= 8
        )

        def variant(rows):
            r = _rows_per_strip(rows, most, K)
            return replace(seed, tile=rows, regtile=(8 * nt, r), staged=staged)

        def two_an_sm(rows):
            try:
                plan = make_plan(problem, variant(rows))
            except SpecError:
                return False
            return BLOCKS16 * (plan.dynamic_smem + 1024) <= SM_SHARED

        rows = tallest(problem.Ho, two_an_sm)
        if rows is None:
            raise SpecError("mmastrip: no band of this problem fits two blocks an SM")
        return variant(ceil_div(problem.Ho, ceil_div(problem.Ho, rows)))

    @classmethod
    def space(cls, problem, precision):
        """1-3 map tiles by strips of 2 to 16 rows (at most 64 accumulators), bands of
        Ho/k rows, sums staged or stored from the fragments."""
        map_tiles = min(3, ceil_div(problem.M, 8))
        bands = sorted({ceil_div(problem.Ho, k) for k in (1, 2, 3, 4)}, reverse=True)
        return [
            cls(tile=b, regtile=(8 * nt, r), staged=staged, precision=precision)
            for nt, r, b, staged in itertools.product(
                range(1, map_tiles + 1), range(2, 17), bands, (False, True)
            )
            if 4 * nt * r <= MAX_ACCUMULATORS and r <= b
        ]


FOLDS = (2, 4, 8)  # output rows a fragment's n8 side may hold
MAX_FOLD_TILES = 4  # n8 tiles of a warp's maps x folded rows


def _fold_for(maps: int) -> int | None:
    """The fewest rows that, beside ``maps`` maps, fill whole n8 tiles (at most
    MAX_FOLD_TILES of them), or None."""
    return next((j for j in FOLDS if (maps * j) % 8 == 0 and maps * j // 8 <= MAX_FOLD_TILES), None)


@dataclass(frozen=True, kw_only=True)
class Mmafold(Mmastrip):
    """mmastrip for few maps: the n8 side of each mma holds ``fold`` output rows of a
    warp's maps instead of 8 maps, the k side the input rows under them (the weights,
    shifted a row for each output row, become a banded B staged once per block), so that
    a map or four (dgrad's forward views of the 7x7 layers: 1 to 12 maps) fill the n8
    side.  For one map, 8 rows: 14 input rows of 8 taps a k16 pair of slots, 7 k steps
    for 8 x 16 outputs where mmastrip's 1-map fragment wastes 7 of its 8 columns."""

    key = "mmafold"

    templates = ("gemm/mmastrip.cu.j2",)
    description = (
        "persistent blocks on fp16/bf16 tensor cores for few maps: each mma's n8 side "
        "output rows x maps, the k side the input rows under them, the weights banded"
    )

    fold: int = param(2, Count("j"), "mmafold: output rows on a fragment's n8 side, with the maps")

    @classmethod
    def fit(cls, problem, seed):
        """The tensors' own dtype; every map of a group in one warp, folded with the
        fewest rows that fill whole n8 tiles; groups of rows for strips of about 8 output
        rows; the tallest band, cut evenly, that lets two blocks share an SM."""
        own_dtype16(cls.key, problem, seed.precision, planning=False)
        fold = _fold_for(problem.M)
        if fold is None:
            raise SpecError(
                f"mmafold folds rows beside a warp's maps into whole n8 tiles: M={problem.M} "
                "maps fill none (with 2, 4 or 8 rows, at most 4 tiles); use --strategy mmastrip"
            )
        nt = problem.M * fold // 8
        r = max(1, min(8 // fold, MAX_ACCUMULATORS // (4 * nt)))
        strip = fold * r
        Ho = problem.Ho

        def variant(rows):
            return replace(seed, tile=rows, regtile=(problem.M, r), staged=False, fold=fold)

        def computed(rows):
            """Output rows the strips compute over an image: the last strip of each band
            runs past it."""
            full, last = divmod(Ho, rows)
            return full * ceil_div(rows, strip) * strip + ceil_div(last, strip) * strip

        # Two blocks an SM where their bands are two strips tall or more, else one; among
        # the bands that fit, the fewest rows computed past the image, then the tallest.
        for blocks, least in ((BLOCKS16, min(Ho, 2 * strip)), (1, 1)):
            fits = []
            for rows in (h for h in ladder(Ho) if h >= least):
                try:
                    plan = make_plan(problem, variant(rows))
                except SpecError:
                    continue
                if blocks * (plan.dynamic_smem + 1024) <= SM_SHARED:
                    fits.append(rows)
            if fits:
                return variant(min(fits, key=lambda rows: (computed(rows), -rows)))
        raise SpecError("mmafold: no band of this problem fits an SM")

    @classmethod
    def space(cls, problem, precision):
        """Folds of 2, 4 and 8 rows beside every map (where they fill whole tiles), 1 to
        4 groups a strip, bands of Ho/k rows."""
        bands = sorted({ceil_div(problem.Ho, k) for k in (1, 2, 3, 4)}, reverse=True)
        return [
            cls(tile=b, regtile=(problem.M, r), staged=False, fold=j, precision=precision)
            for j, r, b in itertools.product(FOLDS, (1, 2, 3, 4), bands)
            if (problem.M * j) % 8 == 0 and problem.M * j // 8 <= MAX_FOLD_TILES and j * r <= b
        ]
