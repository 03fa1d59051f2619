"""``kn2row``: a layer of few maps on tensor cores, every tap of the window a column of
one matrix product, then a shift-add.

Where the maps are few (the autoencoder's 256 -> 3 output layer), an implicit GEMM's
map side is mostly padding (3 of an n8 tile) and its reduction walks x once per tap.
Here the n side is every (tap, map) pair instead: for a band of output rows a block
multiplies the x pixels the band's windows read, [pixels x C], by the weights laid out
as [C x (R*S*M)], so that Z[q][(r, s, m)] is pixel q's contribution to map m through
tap (r, s) (a 1x1 convolution per tap, "kn2row"), and then sums each output's R*S
contributions from the pixels around it: y[oh][ow][m] = sum over (r, s) of
Z[oh + r*dh][ow - pl + s*dw][(r, s, m)].  Every x element is read from memory once per
band (the band's R - 1 halo rows twice, from L2) in 16-byte ``cp.async`` copies through
a multistage swizzled ring, multiplied on ``mma.sync`` m16n8k16 with fp32 sums, and Z
waits in shared memory for the shift-add, which runs the epilogue and stores the band's
outputs, contiguous in NHWC y, in order.

dgrad at stride 1 comes through the forward view: the 3-channel layer's input gradient
is this kernel over dy's maps as channels.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import SpecError
from ..plan.common import Launch, Plan, Size, ceil_div, shape_context, y_args
from ..shapes import ConvProblem, DType, Feature, TensorLayout
from ..tensors import Role
from ..variants import EPILOGUE, Count, Precision, Variant, first_planned, param
from .mma import ROUNDING
from .tcgemm import MAX_ACCUMULATORS, STAGE_LIMIT, VECTOR

# The n side, every (tap, map) pair, padded to whole ldmatrix pairs of n8 tiles: a warp
# holds all of it, so this bounds the layers kernel serves (R*S*M of at most 64).
MAX_COLUMNS = 64
MATH = {DType.BF16: Precision.BF16, DType.FP16: Precision.FP16}


@dataclass(frozen=True, kw_only=True)
class Kn2row(Variant):
    key = "kn2row"
    templates = ("gemm/kn2row.cu.j2",)
    family = "gemm"
    description = (
        "taps as GEMM columns (kn2row): a band's x pixels times the weights as "
        "[C x taps*maps] on mma.sync m16n8k16 through a multistage cp.async ring, then "
        "a shift-add of the taps' partial sums in shared memory"
    )
    serves = (
        EPILOGUE
        | {Feature.RECT, Feature.DILATION, Feature.UNEQUAL_PAD}
        | {
            Feature.WIDE_PAD,
            Feature.DTYPE16,
            Feature.NHWC,
        }
    )
    precisions = (Precision.BF16, Precision.FP16)
    tensor_core = True

    rows: int = param(8, Count("r"), "kn2row: output rows of one image per block (a band)")
    warps: int = param(10, Count("w"), "kn2row: warps, each a run of the band's x pixels")
    chunk: int = param(32, Count("k"), "kn2row: channels per pipeline stage")
    stages: int = param(4, Count("p"), "kn2row: chunks in the shared-memory ring")

    def plan(self, problem):
        return plan_kn2row(problem, self)

    @classmethod
    def fit(cls, problem, seed):
        """Bands of 8 output rows, warps of 32 x pixels, chunks of 32 channels four deep
        (on the H200 the autoencoder's 256 -> 3 layer, bf16 NHWC at B=128, ran so in
        0.024 ms; warps of 64 pixels 0.025, bands of 4 or 16 rows 0.026, chunks of 64
        channels 0.028); shorter bands, or warps of 64 pixels, where the image is wide
        enough that these take more than 16 warps or more shared memory than there is."""
        candidates = (
            replace(seed, rows=rows, warps=ceil_div(band_pixels(problem, rows), per_warp), chunk=32)
            for rows in dict.fromkeys(min(r, problem.Ho) for r in (seed.rows, 4, 2, 1))
            for per_warp in (32, 64)
        )
        return first_planned(candidates, lambda v: plan_kn2row(problem, v), "kn2row: no band fits")

    @classmethod
    def space(cls, problem, precision):
        out = []
        for rows in (4, 8, 16):
            for per_warp in (32, 64):
                warps = ceil_div(band_pixels(problem, rows), per_warp)
                if warps > 16:
                    continue
                for chunk in (32, 64):
                    for stages in (2, 3, 4):
                        out.append(
                            cls(
                                rows=rows,
                                warps=warps,
                                chunk=chunk,
                                stages=stages,
                                precision=precision,
                            )
                        )
        return out


def band_pixels(p: ConvProblem, rows: int) -> int:
    """The x pixels a band of ``rows`` output rows reads: whole rows, the band's and the
    window's R - 1 (dilated) below it."""
    return (rows + (p.R - 1) * p.dil[0]) * p.W


def z_stride(maps: int, columns: int) -> int:
    """Z's row pitch in words: at least its columns, and maps more than a multiple of 32,
    so that the shift-add's threads (consecutive (pixel, map) outputs) read 32 distinct
    banks."""
    return columns + (maps - columns) % 32


def shift_taps(p: ConvProblem, zs: int) -> list[dict]:
    """The shift-add's taps (r, s) in order: ``z``, the word offset of the tap's column at
    its pixel from Z's word for tap (0, 0) at output column ow (``zq``); ``col``, how far
    the tap's x column lies from ow; ``inside``, whether it is inside the image for every
    output column (no bounds test)."""
    (dh, dw), pl = p.dil, p.pads[2]
    out = []
    for r in range(p.R):
        for s in range(p.S):
            col = s * dw - pl
            out.append(
                dict(
                    z=(r * dh * p.W + col) * zs + (r * p.S + s) * p.M,
                    col=col,
                    inside=col >= 0 and p.Wo - 1 + col < p.W,
                )
            )
    return out


def plan_kn2row(p: ConvProblem, v: Kn2row) -> Plan:
    # 1. limits
    if p.layout is not TensorLayout.NHWC:
        raise SpecError(
            "kn2row reads channels-last tensors (16-byte copies along the channels): use "
            "layout=nhwc in the shape spec"
        )
    want = MATH.get(p.dtype)
    if want is None:
        raise SpecError(
            f"kn2row multiplies 16-bit tensors on tensor cores, not {p.dtype.value}: use "
            "dtype=bf16 or fp16 in the shape spec, or --strategy tcgemm"
        )
    if v.precision is not want:
        raise SpecError(
            f"kn2row multiplies {p.dtype.value} tensors in {want.value}: take --precision "
            f"{want.value}"
        )
    if p.C % VECTOR:
        raise SpecError(
            f"kn2row copies {VECTOR} channels at a time: {p.C} channels are not a multiple "
            f"of {VECTOR}; use --strategy mma"
        )
    taps = p.R * p.S
    columns = taps * p.M
    if columns > MAX_COLUMNS:
        raise SpecError(
            f"kn2row holds every (tap, map) pair in a warp's n side: {p.R}x{p.S} taps x "
            f"{p.M} maps are {columns} columns, over {MAX_COLUMNS}; use --strategy tcgemm"
        )
    if not 1 <= v.rows <= p.Ho:
        raise SpecError(f"kn2row r{v.rows}: a band is 1 to {p.Ho} output rows (Ho)")
    size = p.dtype.bytes
    chunks = (64 // size, 128 // size)
    if v.chunk not in chunks:
        raise SpecError(
            f"kn2row k{v.chunk}: a chunk is {chunks[0]} or {chunks[1]} channels of "
            f"{p.dtype.value} (the swizzle keeps 8 rows of a k column in distinct banks only "
            "for rows of 64 or 128 bytes)"
        )
    if not 2 <= v.stages <= 8:
        raise SpecError(f"kn2row p{v.stages}: the ring holds 2 to 8 chunks")
    if not 1 <= v.warps <= 16:
        raise SpecError(f"kn2row w{v.warps}: a block has 1 to 16 warps")
    pixels = band_pixels(p, v.rows)
    in_rows = pixels // p.W
    warp_m = ceil_div(ceil_div(pixels, v.warps), 16) * 16
    bm = warp_m * v.warps  # the pixel tile, padded to the warps' m16 fragments
    bn = ceil_div(columns, 16) * 16
    fm, fn = warp_m // 16, bn // 8
    if fm * fn * 4 > MAX_ACCUMULATORS:
        most = MAX_ACCUMULATORS // (fn * 4) * 16  # pixels a warp may hold
        raise SpecError(
            f"kn2row r{v.rows} w{v.warps}: each warp's {warp_m} pixels x {bn} columns need "
            f"{fm * fn * 4} fp32 sums per thread, over {MAX_ACCUMULATORS}; choose --warps "
            f"{ceil_div(pixels, most)} or more, or fewer --rows"
        )
    threads = 32 * v.warps
    vec = VECTOR
    per_row = v.chunk // vec
    a_stage, b_stage = bm * v.chunk * size, bn * v.chunk * size
    ring = v.stages * (a_stage + b_stage)
    zs = z_stride(p.M, columns)
    z_bytes = pixels * zs * 4
    smem = max(ring, z_bytes)
    if smem > STAGE_LIMIT:
        fit = STAGE_LIMIT // (a_stage + b_stage)
        raise SpecError(
            f"kn2row r{v.rows} k{v.chunk} p{v.stages} needs {smem} B of shared memory "
            f"(ring {ring}, sums {z_bytes}), over the {STAGE_LIMIT} B a block may opt in "
            f"to; choose fewer --rows" + (f" or --stages {fit}" if 2 <= fit < v.stages else "")
        )
    # Registers: the sums, two sets of fragments, a pointer per copied row, about 30 for
    # the walk, and as tcgemm 20 for each mma k step of a chunk past two.  ptxas caps a
    # block's threads as if they were a whole number of 4-warp groups (an SM's four
    # schedulers each hold a quarter): 10 warps get the registers of 12, 168 a thread
    # (a 10-warp k64 variant spilled at 168 on a drawn problem).
    a_vecs = bm * per_row // threads
    budget = min(255, 65536 // (ceil_div(threads, 128) * 128) // 8 * 8)
    need = fm * fn * 4 + 2 * (fm * 4 + fn * 2) + 2 * a_vecs + 30 + 20 * max(0, per_row // 2 - 2)
    if need > budget:
        raise SpecError(
            f"kn2row r{v.rows} w{v.warps}: about {need} registers a thread, over the "
            f"{budget} that {threads} threads get; choose fewer --rows or more --warps"
        )

    # 2. work
    bands = ceil_div(p.Ho, v.rows)
    kt = ceil_div(p.C, v.chunk)
    b_units = bn * per_row
    dh, dw = p.dil
    ctx = shape_context(p)
    ctx.update(
        fp16=p.dtype is DType.FP16,
        elem={Precision.FP16: "f16", Precision.BF16: "bf16"}[v.precision],
        tf32=False,  # the ring's main loop (gemm/ring_mma.j2) serves tcgemm's tf32 too
        split=False,  # nor its fp32 in three tf32 products
        mma_shape="m16n8k16",
        vec=vec,
        ksteps=per_row // 2,
        R=p.R,
        S=p.S,
        dh=dh,
        dw=dw,
        taps=taps,
        columns=columns,
        BH=v.rows,
        in_rows=in_rows,
        pixels=pixels,
        BM=bm,
        BN=bn,
        BK=v.chunk,
        WM=warp_m,
        FM=fm,
        FN=fn,
        stages=v.stages,
        threads=threads,
        per_row=per_row,
        a_vecs=a_vecs,
        b_vecs=ceil_div(b_units, threads),
        b_units=b_units,
        rows_per_pass=threads // per_row,
        a_stage=a_stage,
        b_stage=b_stage,
        smem=smem,
        kt=kt,
        bands=bands,
        zs=zs,
        outputs=v.rows * p.Wo * p.M,
        row_out=p.Wo * p.M,  # a y row's outputs
        shift_taps=shift_taps(p, zs),
        band_tail=p.Ho % v.rows != 0,
        guard_chans=p.C % v.chunk != 0,
        image_in=p.H * p.W * p.C,
        precision_note=ROUNDING[v.precision],
        # blocks an SM may hold, for the launch bounds' register cap: by shared memory,
        # and by the register estimate with a quarter to spare (ptxas's count runs over it)
        min_blocks=max(1, min(STAGE_LIMIT // smem, 65536 // (threads * need * 5 // 4), 8)),
    )
    sizes = (
        Size(
            "GEMM",
            f"{pixels} x {columns} x {p.C} per band",
            f"the band's {in_rows} x rows of {p.W} pixels x ({p.R}x{p.S} taps, {p.M} maps) "
            "x channels",
        ),
        Size(
            "block tile",
            f"{bm} pixels x {bn} columns",
            f"{v.warps} warps of {warp_m} pixels: {fm} m16 x {fn} n8 fragments, "
            f"{fm * fn * 4} fp32 sums per thread",
        ),
        Size(
            "grid",
            f"{bands} band(s) an image",
            f"{v.rows} output rows of {p.Wo} pixels x {p.M} maps each",
        ),
        Size(
            "k walk",
            f"{kt} chunks of {v.chunk} channels",
            "each x pixel once; the taps are columns, not steps",
        ),
        Size(
            "__shared__",
            f"{smem} B (dynamic)",
            f"ring {v.stages} x ({bm} + {bn}) rows x {v.chunk * size} B, XOR-swizzled; "
            f"after it, Z {pixels} x {zs} fp32 in the same bytes",
        ),
    )
    launch = Launch(
        v.kernel_name(p),
        (Role.X, Role.W, *y_args(p), Role.BATCH),
        (threads, 1, 1),
        (0, 1, 1),
        0,
        bands,
        1,
        smem,
    )
    return Plan(
        shape=p,
        variant=v,
        template="gemm/kn2row.cu.j2",
        launches=(launch,),
        static_smem=0,
        dynamic_smem=smem,
        const_bytes=0,
        weight_format="mrsc." + p.dtype.value,
        sizes=sizes,
        context=ctx,
    )
