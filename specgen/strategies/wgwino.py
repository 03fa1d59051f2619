"""``wgwino``: wgrad of fp32 NCHW 3x3 layers at stride 1 in the Winograd domain, its
GEMMs on wgnchw's warpgroup tensor cores (sm_90a), in tf32 or in three tf32 products.

dw[m][c] is a correlation of x with dy, a window of 3x3 taps.  Winograd's F(3, 2) takes
it two dy pixels at a time along each axis: dy's 2x2 tile (ti, tj) at rows 2ti.. and
x's 4x4 tile at rows 2ti - pad.., each transformed to 4x4 values (dy^ = A dy A^T and
x^ = Bt x Bt^T), give the tile's share of the 3x3 taps as G^T (dy^ . x^) G.  The
elementwise products summed over the batch's tiles are 16 GEMMs, one a position g of the
4x4: U[g][m][c] = sum over tiles of dy^[g][m] x^[g][c], 16 products a tile of 4 dy
pixels against 9 a pixel directly, 2.25 times fewer.

Four kernels:
1. ``_dy``: dy's tiles to dy^, laid out [B][16 x M][tiles] (a 1x1 layer's dy of 16 x M
   maps over the tiles' grid);
2. ``_x``: x's tiles to x^, [B][16 x C][tiles] (its x of 16 x C channels);
3. the 16 GEMMs as one grouped 1x1 wgrad of 16 groups, wgnchw's kernel over those
   tensors (its tile, ring and slices are this variant's parameters), into its slices'
   rows of U and, with a bias, the sums of dy^ (position (1, 1) is the tile's sum: db).
   Where an image's tiles are a multiple of 4 (and the tile's rows a thread copies), it
   copies 16-byte units of 4 tiles and splits them for 3xTF32 a unit at a time, a
   quarter of the 4-byte path's instructions (vgg11's fp32 wgrads 1.17-1.24x faster,
   nvidia-h200, ``docs/measurements/bench-vgg11-wgwino-vec4-2026-11-30-h200-605b65b.log``);
4. ``_out``: the slices added in order, then dw = G^T U G and db.
The transforms are adds and halvings in fp32.  x^ and dy^ take 16 values a tile, 4 a
pixel of x or dy: the workspace holds them for the whole batch.

The error: a tap's sum takes, besides its own products, those of dy with x at the
window's other offsets, which cancel in exact arithmetic (``SPREAD``: their weights); the
bound's magnitudes are those sums (``verify.spread_magnitudes``), and the transforms
round 10 more times on a tap's path.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import SpecError
from ..plan.common import SMS, Launch, Plan, Size
from ..shapes import ConvProblem, DType, Feature, Op, TensorLayout
from ..tensors import Role
from ..variants import Count, Pair, Precision, Variant, param
from .wgnchw import Wgnchw, plan_wgnchw

POSITIONS = 16  # the 4x4 Winograd domain of F(3, 2) on both axes
# F(3, 2) along one axis: dy^ = A d, x^ = Bt e, the taps = G^T U
A = ((1, 0), (1, 1), (1, -1), (0, -1))
BT = ((1, 0, -1, 0), (0, 1, 1, 0), (0, -1, 1, 0), (0, 1, 0, -1))
G = ((1, 0, 0), (0.5, 0.5, 0.5), (0.5, -0.5, 0.5), (0, 0, 1))


def weight(r: int, d: int) -> float:
    """Along one axis, the largest weight with which the product of dy's pixel k of a tile
    (0 or 1) and x's pixel i = k + d of its tile (the window's offset d) enters tap r:
    sum over the domain's a of |G[a][r] Bt[a][i] A[a][k]|, the larger of the two k.
    Offsets -1 and 3, outside the window, weigh nothing: no product of x past the window
    enters a sum (test_wgwino)."""
    return max(
        (
            sum(abs(G[a][r] * BT[a][k + d] * A[a][k]) for a in range(4))
            for k in (0, 1)
            if 0 <= k + d < 4
        ),
        default=0.0,
    )


SPREAD = tuple(tuple(weight(r, d) for d in range(3)) for r in range(3))
TRANSFORM_ROUNDINGS = 10  # x^ 3 adds, dy^ 3, G^T U G 4 on a tap's path
TRANSFORM_BLOCK = 256
TRANSFORM_BLOCKS = SMS * 8  # a grid that strides over the batch's tiles


@dataclass(frozen=True, kw_only=True)
class Wgwino(Variant):
    key = "wgwino"
    templates = ("backward/wgwino.cu.j2",)
    family = "backward"
    description = (
        "wgrad of fp32 NCHW 3x3 stride-1 layers in the Winograd domain F(3, 2): dy's 2x2 "
        "and x's 4x4 tiles transformed, 16 GEMMs over the tiles on wgnchw's warpgroup "
        "tensor cores (sm_90a) in tf32 or 3xTF32, G^T U G back to the taps"
    )
    serves = frozenset({Feature.UNEQUAL_PAD, Feature.WIDE_PAD, Feature.BIAS})
    precisions = (Precision.TF32, Precision.FP32)
    tensor_core = True
    tf32_truncated = True  # wgnchw's reads: fp32 words as tf32 with no cvt
    ops = frozenset({Op.WGRAD})

    blocktile: tuple[int, int] = param(
        (128, 128), Pair("b"), "wgwino: the GEMM block's tile of U, maps x channels"
    )
    stages: int = param(3, Count("p"), "wgwino: the GEMM's chunks of 32 tiles in its ring")
    splits: int = param(4, Count("s"), "wgwino: slices of the batch's tiles, one block plane each")

    def plan(self, problem):
        return plan_wgwino(problem, self)

    @classmethod
    def fit(cls, problem, seed):
        """wgnchw's fit on the Winograd domain's GEMM problem."""
        g = Wgnchw.fit(gemm_problem(problem), _gemm(seed))
        return replace(seed, blocktile=g.blocktile, stages=g.stages, splits=g.splits)

    @classmethod
    def space(cls, problem, precision):
        """wgnchw's space on the GEMM problem."""
        if precision not in cls.precisions or not _servable(problem):
            return []
        return [
            cls(blocktile=g.blocktile, stages=g.stages, splits=g.splits, precision=precision)
            for g in Wgnchw.space(gemm_problem(problem), precision)
        ]


def _servable(p: ConvProblem) -> bool:
    return (
        p.op is Op.WGRAD
        and p.dtype is DType.FP32
        and p.layout is TensorLayout.NCHW
        and (p.R, p.S) == (3, 3)
        and p.stride == (1, 1)
        and p.dil == (1, 1)
        and p.groups == 1
    )


def tiles(p: ConvProblem) -> tuple[int, int]:
    """dy's 2x2 tiles down and across (the last ones ragged where dy's size is odd)."""
    return -(-p.Ho // 2), -(-p.Wo // 2)


def gemm_problem(p: ConvProblem) -> ConvProblem:
    """The 16 GEMMs as one grouped 1x1 wgrad: dy^ of 16 x M maps and x^ of 16 x C channels
    over the tiles' grid, a group a position."""
    th, tw = tiles(p)
    return ConvProblem(
        C=POSITIONS * p.C,
        M=POSITIONS * p.M,
        H=th,
        W=tw,
        R=1,
        S=1,
        groups=POSITIONS,
        bias=p.bias,
        batch=p.batch,
        dtype=DType.FP32,
        layout=TensorLayout.NCHW,
        op=Op.WGRAD,
    )


def _gemm(v: Variant) -> Wgnchw:
    return Wgnchw(blocktile=v.blocktile, stages=v.stages, splits=v.splits, precision=v.precision)


def plan_wgwino(p: ConvProblem, v: Wgwino) -> Plan:
    # 1. limits
    if p.layout is not TensorLayout.NCHW or p.dtype is not DType.FP32:
        raise SpecError(
            "wgwino reads fp32 NCHW tensors: use dtype=fp32,layout=nchw, or --strategy "
            "tcwgrad for channels-last ones"
        )
    if (p.R, p.S) != (3, 3) or p.stride != (1, 1) or p.dil != (1, 1) or p.groups != 1:
        raise SpecError(
            "wgwino's F(3, 2) takes a dense 3x3 window at stride 1 and dilation 1: use "
            "--strategy wgnchw"
        )
    q = gemm_problem(p)
    try:
        inner = plan_wgnchw(q, _gemm(v))
    except SpecError as e:  # the GEMM's own limits, in its words
        raise SpecError(f"wgwino's GEMM {q.Mg} x {q.Cg} x tiles: {e}") from None

    # 2. work
    name = v.kernel_name(p)
    th, tw = tiles(p)
    T = th * tw
    ctx = dict(inner.context)
    row = ctx["row"]  # a slice's U (16 x M x C) and the sums of dy^ (16 x M)
    dy_image = POSITIONS * p.M * T  # dy^'s words an image
    x_image = POSITIONS * p.C * T
    pt, _, pl, _ = p.pads
    # The GEMM's 16-byte copies (wgnchw's, where its tiles an image are a multiple of 4)
    # read dy^ and x^ after the slices' rows, 16 x (M x C + M) words each: 16-byte
    # aligned as a tensor is.
    ctx.update(
        winograd=True,
        # the transforms' and the way back's literals; the slices' row, splits and
        # weights (U's words a slice, before the sums of dy^) are wgnchw's sums context
        wino=dict(
            C=p.C,
            M=p.M,
            H=p.H,
            W=p.W,
            Ho=p.Ho,
            Wo=p.Wo,
            pt=pt,
            pl=pl,
            TH=th,
            TW=tw,
            T=T,
            block=TRANSFORM_BLOCK,
            stride=TRANSFORM_BLOCKS * TRANSFORM_BLOCK,  # the grid's threads
            dy_plane=p.Ho * p.Wo,
            dy_corner=p.Wo + 1,  # a tile's lower right pixel from its upper left
            x_plane=p.H * p.W,
            dy_position=p.M * T,  # words from one position's dy^ to the next's
            x_position=p.C * T,
            dy_image=dy_image,
            dy_maps=POSITIONS * p.M,  # dy^'s maps an image
            x_channels=POSITIONS * p.C,
            dy_at=v.splits * row,  # dy^ after the slices' rows, then x^
            MC=p.M * p.C,
            db_at=q.weight_count + 5 * p.M,  # the sums of dy^ at position (1, 1): db
        ),
        precision_note=(
            "dy^ and x^ in fp32; "
            + ctx["precision_note"]
            + "; the slices added in order and G^T U G in fp32"
        ),
    )
    gemm = replace(
        inner.launches[0],
        kernel=name,
        args=(Role.WORKSPACE, Role.WORKSPACE, Role.WORKSPACE, Role.BATCH),
    )
    outs = (Role.DW, Role.DB) if p.bias else (Role.DW,)
    launches = (
        _fixed(f"{name}_dy", (Role.DY, Role.WORKSPACE, Role.BATCH), TRANSFORM_BLOCKS),
        _fixed(f"{name}_x", (Role.X, Role.WORKSPACE, Role.BATCH), TRANSFORM_BLOCKS),
        gemm,
        _fixed(f"{name}_out", (Role.WORKSPACE, *outs), -(-p.M * p.C // TRANSFORM_BLOCK)),
    )
    slices = 4 * v.splits * row
    sizes = (
        Size(
            "domain",
            f"{th} x {tw} tiles of 2x2 dy, 4x4 x",
            "F(3, 2) along each axis: 16 products a tile of 4 dy pixels against 36 directly",
        ),
        Size(
            "GEMM",
            f"16 x {p.M} x {p.C} x (B*{T})",
            "a position's maps x channels x the batch's tiles, as one grouped 1x1 wgrad",
        ),
        *inner.sizes[1:-1],
        Size(
            "workspace",
            f"{slices} B + B x {4 * (dy_image + x_image)} B",
            f"{v.splits} slices x {row} fp32 sums of U and dy^; dy^ and x^, 16 values a "
            "tile, for the whole batch",
        ),
    )
    depth = inner.sum_depth
    return replace(
        inner,
        shape=p,
        variant=v,
        template=v.templates[0],
        launches=launches,
        sizes=sizes,
        context=ctx,
        workspace_bytes=slices,
        batch_workspace=4 * (dy_image + x_image),
        sum_depth=(T, depth[1], depth[2] + TRANSFORM_ROUNDINGS),
        spread=SPREAD,
    )


def _fixed(kernel: str, args: tuple, blocks: int) -> Launch:
    """A launch of ``blocks`` blocks whatever the batch: the transforms stride over the
    batch's tiles, the way back walks U's maps x channels."""
    return Launch(
        kernel, args, (TRANSFORM_BLOCK, 1, 1), (blocks, 1, 1), axis=0, per_image=0, per_block=1
    )
