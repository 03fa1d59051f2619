"""``mmafew``: the forward pass of a channels-last layer of few input channels (a
network's stem: 3 colours into 64 maps through a 7x7 window at stride 2) on tensor cores.

An implicit GEMM whose reduction is C*R*S = 147 wastes most of a k step on each tap when
it gathers tap by tap, and reads x as scattered 2-byte words.  Here a block walks tiles of
output pixels, persistent, and for each copies the input patch the tile's windows cover
into shared memory once, each pixel's channels padded to ``cp`` (4, or 8 where 4 would
leave every other pixel off a 16-byte boundary: an odd stride), zero outside the image.
For one output pixel and one window row, the S taps x cp channels it multiplies are then
one run of S*cp elements of the patch, ``cp*stride`` elements after the run of the pixel
to its left: a k step is 16 consecutive run elements, and an A fragment (16 pixels x 16
elements) is one ``ldmatrix.x4`` with each lane giving its pixel's run.  A window row's
run pads to whole k steps once (7 taps x 4 channels: 28 -> 32), its tail elements zeroed
in the fragment (so that a neighbour's infinity never meets a zero weight).

The weights, [maps][window rows x padded runs], stay in shared memory for the block's
life, each row 16 bytes longer than a multiple of 32 so that an ``ldmatrix.x4`` of B (two
n8 tiles) meets eight bank quads.  A warp holds p m16 tiles of the tile's pixels x every
map, and for each k step loads p A fragments and M/16 B pairs for p*M/8 ``mma.sync``
m16n8k16 (fp32 sums).  Each thread stores its two neighbouring maps of a pixel as one
32-bit word of y, after the bias and the activation.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import product

from ..errors import SpecError
from ..plan.common import (
    MAX_REGISTERS,
    REGISTER_FILE,
    Plan,
    Size,
    band_walk_plan,
    ceil_div,
    shape_context,
    smem_blocks,
)
from ..shapes import ConvProblem, DType, Feature, Op, TensorLayout
from ..variants import EPILOGUE, Count, Precision, Variant, first_planned, param
from .mma import ROUNDING
from .tcgemm import MATH, STAGE_LIMIT

# A pixel's channels are padded to at most this many: past it the layer is wgmma's.
MAX_CHANNELS = 8
# fp32 sums a thread holds (p m16 tiles x M/8 n8 tiles x 4); more spill.
MAX_SUMS = 96
MAX_WARPS = 16


@dataclass(frozen=True, kw_only=True)
class Mmafew(Variant):
    key = "mmafew"
    templates = ("gemm/mmafew.cu.j2",)
    family = "gemm"
    description = (
        "channels-last layers of few input channels (a network's stem) on mma.sync: "
        "each tile's input patch copied once, a window row's taps x channels one run of "
        "k, A by ldmatrix, the weights resident in shared memory"
    )
    serves = EPILOGUE | {
        Feature.RECT,
        Feature.STRIDE,
        Feature.UNEQUAL_PAD,
        Feature.WIDE_PAD,
        Feature.DTYPE16,
        Feature.NHWC,
    }
    precisions = (Precision.BF16, Precision.FP16)
    tensor_core = True

    rows: int = param(2, Count("r"), "mmafew: output rows of a tile")
    cols: int = param(64, Count("c"), "mmafew: output columns of a tile (a multiple of 16)")
    warps: int = param(
        4, Count("w"), "mmafew: warps of a block, each a share of the tile's m16 tiles"
    )

    def plan(self, problem):
        return plan_mmafew(problem, self)

    @classmethod
    def fit(cls, problem, seed):
        """Tiles as wide as the output rows (up to 128 columns) and 4-8 warps of two m16
        tiles each, else of one or three; else 2-3 warps."""
        candidates = (
            replace(seed, rows=rows, cols=cols, warps=rows * cols // 16 // per_warp)
            for least in (4, 2)
            for cols, per_warp, rows in product(_widths(problem), (2, 1, 3), range(1, 9))
            if (rows * cols // 16) % per_warp == 0 and least <= rows * cols // 16 // per_warp <= 8
        )
        return first_planned(
            candidates,
            lambda v: plan_mmafew(problem, v),
            f"mmafew: no tile of {problem.Wo} output columns fits",
        )

    @classmethod
    def space(cls, problem, precision):
        out = []
        for cols in _widths(problem):
            for rows in (1, 2, 4, 8):
                tiles = rows * cols // 16
                for per_warp in (1, 2, 3):
                    if tiles % per_warp == 0 and 2 <= tiles // per_warp <= MAX_WARPS:
                        v = cls(rows=rows, cols=cols, warps=tiles // per_warp, precision=precision)
                        if v not in out:
                            out.append(v)
        return out


def _widths(p: ConvProblem) -> list[int]:
    """Tile widths worth trying: the output row rounded to m16 tiles (up to 128), then
    64, 32 and 16 columns."""
    whole = ceil_div(p.Wo, 16) * 16
    return list(dict.fromkeys(w for w in (whole, 64, 32, 16) if w <= min(whole, 128)))


def channels_padded(p: ConvProblem) -> int:
    """A patch pixel's channels: 4 where the pixels a tile's lanes start at (stride
    columns apart) then all lie on 16-byte boundaries, else 8."""
    return 4 if p.C <= 4 and p.stride[1] * 4 * 2 % 16 == 0 else 8


def check_few(p: ConvProblem, v: Variant) -> None:
    """The limits mmafew and wfew share: 16-bit channels-last tensors in their own math, at
    most 8 channels, maps a multiple of 16, and a tile of whole m16 rows of pixels."""
    key = v.key
    if p.layout is not TensorLayout.NHWC:
        raise SpecError(
            f"{key} reads channels-last tensors (a pixel's channels side by side): use "
            "layout=nhwc in the shape spec"
        )
    if p.dtype is DType.FP32:
        raise SpecError(
            f"{key} multiplies 16-bit tensors on tensor cores, not {p.dtype.value}: use "
            "dtype=bf16 or fp16 in the shape spec"
        )
    want = MATH[p.dtype]
    if v.precision is not want:
        raise SpecError(
            f"{key} multiplies {p.dtype.value} tensors in {want.value}: take --precision "
            f"{want.value}"
        )
    wide, narrow = ("tcwgrad", "tcwgrad") if p.op is Op.WGRAD else ("wgmma or tcgemm", "mma")
    if p.C > MAX_CHANNELS:
        raise SpecError(
            f"{key} pads a pixel's channels to at most {MAX_CHANNELS}, not {p.C}: use "
            f"--strategy {wide}"
        )
    if p.M % 16:
        raise SpecError(
            f"{key} loads 16 maps an ldmatrix: M={p.M} is not a multiple of 16; use "
            f"--strategy {narrow}"
        )
    if v.cols % 16 or not 16 <= v.cols <= 256:
        raise SpecError(f"{key} c{v.cols}: a tile is 16 to 256 output columns, a multiple of 16")
    if not 1 <= v.rows <= 16:
        raise SpecError(f"{key} r{v.rows}: a tile is 1 to 16 output rows")


def patch_layout(p: ConvProblem, rows: int, cols: int, threads: int) -> dict:
    """The input patch of a tile of ``rows`` x ``cols`` output pixels, as both kernels
    keep it (templates/gemm/few_patch.j2): a pixel's channels padded to ``cp``, a window
    row's run of S*cp elements padded to ``kr`` k steps of 16 (the patch holds the last
    run's tail), rows of ``p_pitch`` bytes; the tiles of an image; the pixels each of
    ``threads`` fetches (``npt``)."""
    (sh, sw), elem = p.stride, 2
    cp = channels_padded(p)
    run = p.S * cp
    kr = ceil_div(run, 16)
    ph = (rows - 1) * sh + p.R
    pw = (cols - 1) * sw + p.S + ceil_div(kr * 16 - run, cp)
    p_pitch = ceil_div(pw * cp * elem, 16) * 16
    row_tiles, col_tiles = ceil_div(p.Ho, rows), ceil_div(p.Wo, cols)
    return dict(
        shape_context(p),
        cp=cp,
        run=run,
        kr=kr,
        ph=ph,
        pw=pw,
        p_pitch=p_pitch,
        patch_bytes=ph * p_pitch,
        patch_pixels=ph * pw,
        npt=ceil_div(ph * pw, threads),
        TH=rows,
        TW=cols,
        threads=threads,
        row_tiles=row_tiles,
        col_tiles=col_tiles,
        per_image=row_tiles * col_tiles,
        run_k=kr * 16,  # a run padded to whole k steps
        cp_words=cp // 2,  # 32-bit words of a pixel's channels
        tile_rows_in=rows * sh,  # input rows between neighbouring tiles' patches
        tile_cols_in=cols * sw,
        image_in=p.H * p.W * p.C,
        pixel_step=sw * cp * elem,  # bytes between the runs of neighbouring output pixels
        row_step=sh * p_pitch,  # bytes between the patch rows of neighbouring output rows
        pt=p.pads[0],
        pl=p.pads[2],
    )


def launch_blocks(threads: int, smem: int, registers: int, what: str) -> int:
    """Blocks an SM holds by shared memory and threads, fewer where the register
    estimate asks more than that leaves; SpecError past what one block's threads get."""
    most = min(MAX_REGISTERS, REGISTER_FILE // threads // 8 * 8)
    if registers > most:
        raise SpecError(
            f"{what}: about {registers} registers a thread, over the {most} that {threads} "
            "threads get; choose fewer warps or a smaller tile"
        )
    blocks = max(1, min(smem_blocks(smem), 2048 // threads, 32))
    if registers > REGISTER_FILE // (blocks * threads) // 8 * 8:
        blocks = max(1, REGISTER_FILE // (threads * ceil_div(registers, 8) * 8))
    return blocks


def plan_mmafew(p: ConvProblem, v: Mmafew) -> Plan:
    # 1. limits
    check_few(p, v)
    tiles = v.rows * v.cols // 16  # m16 tiles of output pixels, each in one output row
    if not 1 <= v.warps <= MAX_WARPS or tiles % v.warps:
        raise SpecError(
            f"mmafew w{v.warps}: the tile's {tiles} m16 tiles are shared evenly among 1 to "
            f"{MAX_WARPS} warps"
        )
    per_warp = tiles // v.warps
    nt = p.M // 8
    sums = 4 * nt * per_warp
    if sums > MAX_SUMS:
        raise SpecError(
            f"mmafew r{v.rows} c{v.cols} w{v.warps}: {per_warp} m16 tiles a warp x {p.M} "
            f"maps are {sums} fp32 sums a thread, over {MAX_SUMS}; choose more --warps"
        )

    # 2. the patch and the weights in shared memory
    threads = 32 * v.warps
    ctx = patch_layout(p, v.rows, v.cols, threads)
    cp, run, kr, ph, pw, npt = (ctx[k] for k in ("cp", "run", "kr", "ph", "pw", "npt"))
    tail = run - (kr - 1) * 16  # elements of the last step that are real (16: all)
    kp = p.R * kr * 16  # a map's weights: window rows x padded runs
    b_pitch = kp + 8  # elements: 16 bytes past a multiple of 32, an odd count of 16-byte units
    b_bytes = p.M * b_pitch * 2
    smem = b_bytes + ctx["patch_bytes"]
    if smem > STAGE_LIMIT:
        raise SpecError(
            f"mmafew needs {smem} B of shared memory (weights {b_bytes}, patch "
            f"{ctx['patch_bytes']}), over the {STAGE_LIMIT} B a block may opt in to; choose "
            "fewer --rows or --cols"
        )
    # Registers: the sums, a step's A and B fragments, the lanes' addresses, the next
    # item's patch pixels held while this one multiplies, and about 40 for the rest.
    registers = sums + 4 * per_warp + 2 * nt + per_warp + npt * cp // 2 + 40
    blocks = launch_blocks(
        threads, smem, registers, f"mmafew r{v.rows} c{v.cols} w{v.warps} ({npt} patch pixels held)"
    )

    # 3. work
    row_tiles, col_tiles, per_image = ctx["row_tiles"], ctx["col_tiles"], ctx["per_image"]
    ctx.update(
        elem={Precision.FP16: "f16", Precision.BF16: "bf16"}[v.precision],
        tail=tail,
        kp=kp,
        b_pitch=b_pitch,
        b_bytes=b_bytes,
        tiles=tiles,
        per_warp=per_warp,
        nt=nt,
        weights=p.M * kp,
        weight_taps=p.M * p.R * p.S,  # (map, tap) units the weights load copies
        weight_rows=p.M * p.R,  # (map, window row) runs whose padding it zeroes
        nt_pairs=nt // 2,
        b_pair=16 * b_pitch * 2,  # bytes between two n8 tiles' B rows
        # the unrolled k steps: window row ky's run, step j; B's and A's byte offsets,
        # and whether the step ends a run that does not fill it (its tail dropped)
        ksteps=[
            dict(
                ky=ky,
                j=j,
                b_at=(ky * kr + j) * 32,
                a_at=ky * ctx["p_pitch"] + j * 32,
                tail=j == kr - 1 and tail < 16,
            )
            for ky in range(p.R)
            for j in range(kr)
        ],
        precision_note=ROUNDING[v.precision],
        launch_bounds=f"{threads}, {blocks}",
        launch_bounds_alt=f"{threads}, 1",
    )
    sizes = (
        Size(
            "GEMM",
            f"{p.Ho * p.Wo} x {p.M} x {kp} per image",
            f"output pixels x maps x ({p.R} window rows x {kr} k steps of 16: {p.S} taps x "
            f"{cp} channels, C={p.C} padded)",
        ),
        Size(
            "tile",
            f"{v.rows} x {v.cols} output pixels",
            f"{tiles} m16 tiles, {per_warp} a warp x {nt} n8 tiles: {sums} fp32 sums a thread",
        ),
        Size(
            "work",
            f"{per_image} tiles an image",
            f"{row_tiles} x {col_tiles}; persistent blocks walk (image, tile) items",
        ),
        Size(
            "__shared__",
            f"{smem} B (dynamic)",
            f"weights {p.M} x {b_pitch} {p.dtype.value} ({b_bytes} B, loaded once a block); "
            f"patch {ph} x {pw} pixels x {cp} channels, rows of {ctx['p_pitch']} B",
        ),
    )
    return band_walk_plan(
        p, v, "gemm/mmafew.cu.j2", threads, per_image, smem, sizes, ctx, "mrsc." + p.dtype.value
    )
