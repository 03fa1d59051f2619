"""``wfew``: the weight gradient of a channels-last layer of few input channels (a
network's stem) on tensor cores, mmafew's patch the other way round.

tcwgrad pads a 3-channel layer to 8 channels and copies each tap's columns of im2col(x)
for every chunk of pixels.  Here a block walks tiles of output pixels, copying for each
the input patch its windows cover once (mmafew's: a pixel's channels padded to 4, a
window row's taps x channels one run of the patch) and dy's tile of pixels x maps (16-byte
``cp.async``, the next tile's in flight under the multiplies).  dw's columns for window
row ky are the run's elements: for 16 output pixels of one row, B (16 pixels x 16 run
elements) is one ``ldmatrix.x4.trans`` of the pixels' runs, and A (16 maps x 16 pixels) one
of dy's tile; the run's padding elements are columns never stored.  Warp (ky, g) keeps the
sums of window row ky for a share g of the maps, so every warp reads its own B and the
warps of one row share nothing but dy.

The blocks (``splits``) each take every splits-th tile and write their sums to a
workspace row; ``backward/tc_sums.j2`` adds the rows in order, so dw is deterministic
and, under the PyTorch operator's autocast, written in fp32 as the weights lie.  db rides
along on the warps of the first window row: dy^T times a fragment of ones.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from itertools import product

from ..errors import SpecError
from ..plan.common import Plan, Size, ceil_div
from ..shapes import ConvProblem, Feature, Op
from ..variants import Count, Precision, Variant, first_planned, param
from .mma import ROUNDING
from .mmafew import MAX_WARPS, check_few, launch_blocks, patch_layout
from .tcgemm import STAGE_LIMIT
from .tcwgrad import TARGET_BLOCKS, slice_kernel, slice_sums

# fp32 sums a thread holds: its maps' m16 tiles x its window row's n8 tiles x 4.
MAX_SUMS = 96
# Registers a thread holds the next tile's patch pixels in (a 1x4 window at stride 3 over
# one warp's tile of 8 x 16 pixels: 24 pixels of 8 channels, 96 registers, spilled).
MAX_HELD = 32


@dataclass(frozen=True, kw_only=True)
class Wfew(Variant):
    key = "wfew"
    templates = ("backward/wfew.cu.j2",)
    family = "backward"
    description = (
        "wgrad of channels-last layers of few input channels (a network's stem) on "
        "mma.sync: each tile's input patch and dy copied once, a window row's taps x "
        "channels one run of dw's columns, the blocks' sums added in order"
    )
    serves = frozenset(
        {
            Feature.RECT,
            Feature.STRIDE,
            Feature.UNEQUAL_PAD,
            Feature.WIDE_PAD,
            Feature.BIAS,
            Feature.ACT,
            Feature.DTYPE16,
            Feature.NHWC,
        }
    )
    precisions = (Precision.BF16, Precision.FP16)
    tensor_core = True
    ops = frozenset({Op.WGRAD})

    rows: int = param(4, Count("r"), "wfew: output rows of a tile")
    cols: int = param(32, Count("c"), "wfew: output columns of a tile (a multiple of 16)")
    mapsplit: int = param(
        1, Count("m"), "wfew: warps of a window row, each a share of the maps' m16 tiles"
    )
    splits: int = param(132, Count("s"), "wfew: blocks, each a workspace row of sums")

    def plan(self, problem):
        return plan_wfew(problem, self)

    @classmethod
    def fit(cls, problem, seed):
        """Tiles of 128 output pixels (32 columns or the rows' width; else 64, 32, 16),
        the maps in one warp a window row where the sums fit (two or four else; the fewest
        that give a block 4 warps or more first), and a block an SM."""
        whole = ceil_div(problem.Wo, 16) * 16
        shares = sorted((1, 2, 4), key=lambda m: (problem.R * m < 4, m))
        candidates = (
            replace(seed, rows=max(1, pixels // cols), cols=cols, mapsplit=mapsplit, splits=132)
            for pixels, cols, mapsplit in product(
                (128, 64, 32, 16), dict.fromkeys((min(32, whole), 16)), shares
            )
        )
        return first_planned(candidates, lambda v: plan_wfew(problem, v), "wfew: no tile fits")

    @classmethod
    def space(cls, problem, precision):
        whole = ceil_div(problem.Wo, 16) * 16
        widths = dict.fromkeys(c for c in (whole, 64, 32, 16) if c <= min(whole, 128))
        return [
            cls(rows=rows, cols=cols, mapsplit=mapsplit, splits=splits, precision=precision)
            for cols, rows, mapsplit, splits in product(
                widths, (1, 2, 4, 8), (1, 2, 4), (132, TARGET_BLOCKS, 396)
            )
            if rows * cols <= 256
        ]


def plan_wfew(p: ConvProblem, v: Wfew) -> Plan:
    # 1. limits
    check_few(p, v)
    m_tiles = p.M // 16
    if v.mapsplit < 1 or m_tiles % v.mapsplit:
        raise SpecError(
            f"wfew m{v.mapsplit}: the {m_tiles} m16 tiles of M={p.M} are shared evenly among "
            "a window row's warps"
        )
    warps = p.R * v.mapsplit
    if warps > MAX_WARPS:
        raise SpecError(
            f"wfew m{v.mapsplit}: {p.R} window rows x {v.mapsplit} warps are {warps} warps, "
            f"over {MAX_WARPS}; choose a smaller --mapsplit"
        )
    if not 1 <= v.splits <= 65535:
        raise SpecError(f"wfew s{v.splits}: 1 to 65535 blocks")
    threads = 32 * warps
    ctx = patch_layout(p, v.rows, v.cols, threads)
    cp, kr, npt = ctx["cp"], ctx["kr"], ctx["npt"]
    fm, fn = m_tiles // v.mapsplit, 2 * kr  # a warp's m16 tiles of maps, n8 tiles of its run
    sums = 4 * fm * fn
    if sums > MAX_SUMS:
        raise SpecError(
            f"wfew m{v.mapsplit}: {fm} m16 tiles of maps x {fn} n8 tiles of a window row's run "
            f"are {sums} fp32 sums a thread, over {MAX_SUMS}; choose a larger --mapsplit"
        )

    # 2. shared memory: dy's tile twice ([pixel][M + 8]: the eight pixel rows of a
    # transposed ldmatrix an odd number of 16-byte units apart), then the patch
    pixels = v.rows * v.cols
    d_pitch = (p.M + 8) * 2
    d_bytes = pixels * d_pitch
    smem = ctx["patch_bytes"] + 2 * d_bytes
    if smem > STAGE_LIMIT:
        raise SpecError(
            f"wfew needs {smem} B of shared memory (patch {ctx['patch_bytes']}, dy 2 x "
            f"{d_bytes}), over the {STAGE_LIMIT} B a block may opt in to; choose fewer --rows "
            "or --cols"
        )
    d_units = pixels * p.M // 8  # 16-byte copies of dy's tile
    # Registers: the sums (and db's), a step's fragments, the next patch held, dy's copies
    # in flight (four at a time), about 64 for the rest (with 96 sums, 40 let a 5x6 window
    # of 10 warps spill).
    d_npt = ceil_div(d_units, threads)
    if npt * cp // 2 > MAX_HELD:
        raise SpecError(
            f"wfew r{v.rows} c{v.cols} m{v.mapsplit}: {npt} patch pixels a thread to hold "
            f"({npt * cp // 2} registers), over {MAX_HELD}; choose a smaller tile or more warps"
        )
    registers = (
        sums + (4 * fm if p.bias else 0) + 4 * fm + 4 * kr + npt * cp // 2 + 3 * min(d_npt, 4) + 64
    )
    blocks = launch_blocks(threads, smem, registers, f"wfew r{v.rows} c{v.cols} m{v.mapsplit}")

    # 3. work
    name = v.kernel_name(p)
    sums_ctx, workspace, reduce, gemm, scratch = slice_sums(p, name, v.splits)
    ctx.update(sums_ctx)
    ctx.update(
        cp=cp,  # sums_context's shape_context would not know them
        kr=kr,
        elem={Precision.FP16: "f16", Precision.BF16: "bf16"}[v.precision],
        fm=fm,
        fn=fn,
        mapsplit=v.mapsplit,
        warps=warps,
        threads=threads,
        pixels=pixels,
        steps=pixels // 16,
        warp_maps=fm * 16,
        pixel_units=p.M // 8,  # dy's 16-byte copies of a pixel
        # the unrolled k steps, 16 pixels of one output row each: dy's and the patch's
        # byte offsets
        ksteps=[
            dict(
                q=q,
                first=16 * q,
                last=16 * q + 15,
                row=16 * q // v.cols,
                col=16 * q % v.cols,
                a_at=16 * q * d_pitch,
                b_at=16 * q // v.cols * ctx["row_step"] + 16 * q % v.cols * ctx["pixel_step"],
            )
            for q in range(pixels // 16)
        ],
        d_pitch=d_pitch,
        d_bytes=d_bytes,
        d_units=d_units,
        d_npt=d_npt,
        patch_at=2 * d_bytes,
        RSC=p.R * p.S * p.C,
        CgRS=p.R * p.S * p.C,  # tc_sums.j2's name for it
        dy_image=p.Ho * p.Wo * p.M,
        precision_note=ROUNDING[v.precision].replace("x and w", "x and dy"),
        launch_bounds=f"{threads}, {blocks}",
        launch_bounds_alt=f"{threads}, 1",
    )
    main = slice_kernel(name, threads, (v.splits, 1, 1), smem)
    sizes = (
        gemm,
        Size(
            "tile",
            f"{v.rows} x {v.cols} output pixels",
            f"{pixels // 16} k steps of 16 pixels; {warps} warps: window row x "
            f"{v.mapsplit} share(s) of the maps, {fm} m16 x {fn} n8 tiles, {sums} fp32 sums",
        ),
        Size(
            "run",
            f"{p.S} taps x {cp} channels -> {kr * 16}",
            f"a window row's dw columns (C={p.C} padded; the padding is never stored)",
        ),
        Size(
            "__shared__",
            f"{smem} B (dynamic)",
            f"dy 2 x {pixels} pixels x {d_pitch} B; patch {ctx['ph']} x {ctx['pw']} pixels x "
            f"{cp} channels, rows of {ctx['p_pitch']} B",
        ),
        Size(
            "grid",
            f"{v.splits} blocks",
            f"block b takes tiles b, b + {v.splits}, .. of the batch's ({ctx['per_image']} an "
            "image)",
        ),
        scratch,
    )
    padded = ctx["row_tiles"] * v.rows * ctx["col_tiles"] * v.cols  # pixels summed an image
    return Plan(
        shape=p,
        variant=v,
        template="backward/wfew.cu.j2",
        launches=(main, reduce),
        static_smem=0,
        dynamic_smem=smem,
        const_bytes=0,
        weight_format="f32",
        sizes=sizes,
        context=ctx,
        workspace_bytes=workspace,
        # a block sums at most ceil(tiles / splits) tiles; then the blocks in order
        sum_depth=(padded, v.splits, v.splits + pixels),
    )
