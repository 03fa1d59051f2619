"""wgwino, wgrad of fp32 NCHW 3x3 layers in the Winograd domain F(3, 2) on wgnchw's GEMM:
what ptxas makes of it for sm_90a and its plan (CPU tier), its limits, and its numbers on
drawn problems against float64 (GPU tier)."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from problems import DRAWN_COMPILES, GPU_DRAWS, default_and_drawn, parsed_or_rejected
from problems import verify_on_the_gpu
from specgen.choose import planned
from specgen.errors import SpecError
from specgen.plan import make_plan
from specgen.shapes import parse_shape
from specgen.strategies.wgnchw import Wgnchw
from specgen.strategies.wgwino import SPREAD, Wgwino, gemm_problem, weight
from specgen.variants import Precision
from specgen.verify import spread_magnitudes
from ptx import SERIALIZED, compiled, ptx_of

TF32, FP32 = Precision.TF32, Precision.FP32
# vgg11's 3x3 wgrads of 28x28 and 14x14 maps (B=32 in its training step), an odd one
VGG = (
    "C=512,M=512,H=28,W=28,K=3,pad=1,bias=1,op=wgrad",
    "C=512,M=512,H=14,W=14,K=3,pad=1,bias=1,op=wgrad",
    "C=64,M=128,H=13,W=9,K=3,pad=1,op=wgrad",
)


@st.composite
def wino_wgrads(draw):
    """3x3 wgrads at stride 1: maps and channels in multiples of 16 or 64 (wgnchw's tiles
    of the GEMM), images of 3 to 13 pixels a side, odd or even, every padding up to 3 a
    side (unequal, and wider than the window), a bias or none."""
    unit = draw(st.sampled_from([16, 64]))
    C, M = unit * draw(st.integers(1, 3)), unit * draw(st.integers(1, 3))
    H, W = draw(st.integers(1, 13)), draw(st.integers(1, 13))
    pads = "x".join(str(draw(st.integers(0, 3))) for _ in range(4))
    bias = ",bias=1" if draw(st.booleans()) else ""
    return parsed_or_rejected(f"C={C},M={M},H={H},W={W},K=3,pad={pads}{bias},op=wgrad")


@pytest.mark.parametrize("precision", [TF32, FP32])
@pytest.mark.parametrize("spec", VGG)
def test_the_vgg_layers_compile_for_sm_90a_without_spills(spec, precision):
    """Four kernels: dy's and x's transforms, wgnchw's GEMM on the workspace (three
    products a step in fp32 math), the way back to the taps; no spills, the multiplies
    not serialized."""
    p = parse_shape(spec)
    plan = make_plan(p, Wgwino.default(p, precision))
    assert plan.target("sm_90") == "sm_90a"
    assert [l.kernel.removeprefix(plan.name) for l in plan.launches] == ["_dy", "_x", "", "_out"]
    binary = compiled(plan)
    assert binary.spills == 0 and SERIALIZED not in binary.log, binary.resources
    ptx = ptx_of(plan)
    bn = plan.variant.blocktile[1]
    products = ptx.count(f"wgmma.mma_async.sync.aligned.m64n{bn}k8")
    assert products == (12 if precision is FP32 else 4)


@pytest.mark.parametrize("precision", [TF32, FP32])
@pytest.mark.parametrize("spec, units", list(zip(VGG, (True, False, False))))
def test_the_gemm_copies_16_bytes_where_no_4_tiles_cross_an_image(spec, units, precision):
    """28x28 maps: 14x14 tiles an image, whole units of 4, copied 16 bytes a thread (and
    split a unit at a time in 3xTF32); 7x7 or 7x5 tiles an image: 4 bytes a thread."""
    p = parse_shape(spec)
    plan = make_plan(p, Wgwino.default(p, precision))
    assert plan.context.get("vec4", False) is units
    ptx = ptx_of(plan)
    assert ("cp.async.cg.shared.global" in ptx) is units
    assert ("cp.async.ca.shared.global" in ptx) is not units


@settings(max_examples=DRAWN_COMPILES, deadline=None)
@given(p=wino_wgrads(), precision=st.sampled_from([TF32, FP32]))
def test_drawn_problems_plan_and_compile_without_spills(p, precision):
    binary = compiled(make_plan(p, Wgwino.default(p, precision)))
    assert binary.spills == 0, binary.resources


def test_the_gemm_is_a_grouped_1x1_wgrad_over_the_tiles():
    """16 groups, one a position of the 4x4 domain: dy^'s 16 x M maps and x^'s 16 x C
    channels over the tiles' grid (ragged where dy's size is odd), the bias kept for db."""
    p = parse_shape("C=64,M=128,H=13,W=9,K=3,pad=1,bias=1,op=wgrad")
    q = gemm_problem(p)
    assert (q.C, q.M, q.groups, q.H, q.W, q.R, q.S) == (16 * 64, 16 * 128, 16, 7, 5, 1, 1)
    assert q.bias
    v = Wgwino.default(p, FP32)
    g = Wgnchw.fit(q, Wgnchw(precision=FP32))
    assert (v.blocktile, v.stages, v.splits) == (g.blocktile, g.stages, g.splits)


def test_the_workspace_holds_the_whole_batchs_domain():
    """The slices' rows whatever the batch, then 16 values a tile of dy and of x an
    image, for the whole batch: the runtime's scratch at that batch."""
    p = parse_shape("C=64,M=128,H=28,W=28,K=3,pad=1,op=wgrad")
    plan = make_plan(p, Wgwino.default(p, FP32))
    tiles = 14 * 14
    assert plan.batch_workspace == 4 * 16 * (64 + 128) * tiles
    assert plan.workspace_bytes == 4 * plan.variant.splits * 16 * 128 * 64
    assert plan.workspace_per_image == 0  # never cut into segments: dw sums the batch


def test_a_taps_bound_takes_the_other_taps_products_it_mixes():
    """A tap's sum in the Winograd domain takes the products of the window's other
    offsets (which cancel in exact arithmetic) and none past it: its magnitudes are the
    reference's, spread by those weights along each axis; the GEMM's additions and the
    transforms' 10 roundings make its depth."""
    assert SPREAD == ((1, 1, 2), (1, 1, 1), (2, 1, 1))
    assert all(weight(r, d) == 0 for r in range(3) for d in (-1, 3))
    mag = np.zeros((1, 1, 3, 3))
    mag[0, 0, 2, 0] = 1.0  # products at offset (2, 0) alone
    spread = spread_magnitudes(mag, SPREAD, np)[0, 0]
    assert spread[0, 0] == 2 * 1 and spread[2, 2] == 1 * 2 and spread[1, 1] == 1
    p = parse_shape("C=64,M=128,H=28,W=28,K=3,pad=1,op=wgrad")
    plan = make_plan(p, Wgwino.default(p, FP32))
    gemm = make_plan(gemm_problem(p), Wgnchw.default(gemm_problem(p), FP32))
    assert plan.sum_depth == (*gemm.sum_depth[:2], gemm.sum_depth[2] + 10)
    assert plan.spread == SPREAD and gemm.spread is None


@pytest.mark.parametrize(
    "spec, words",
    [
        ("C=64,M=64,H=28,W=28,K=3,pad=1,stride=2,op=wgrad", "stride"),
        ("C=64,M=64,H=28,W=28,K=3,pad=2,dil=2,op=wgrad", "dilation"),
        ("C=64,M=64,H=28,W=28,K=3,pad=1,groups=2,op=wgrad", "groups"),
        ("C=64,M=64,H=28,W=28,K=5,pad=2,op=wgrad", "3x3"),
        ("C=64,M=64,H=28,W=28,K=3,pad=1,layout=nhwc,op=wgrad", "nhwc"),
        ("C=64,M=64,H=28,W=28,K=3,pad=1,dtype=bf16,op=wgrad", "bf16"),
        ("C=64,M=64,H=28,W=28,K=3,pad=1,op=dgrad", "dgrad"),
        ("C=12,M=64,H=28,W=28,K=3,pad=1,op=wgrad", "GEMM"),
    ],
)
def test_limits_are_one_line_refusals(spec, words):
    with pytest.raises(SpecError) as e:
        make_plan(parse_shape(spec), Wgwino(precision=FP32))
    assert words in str(e.value) and "\n" not in str(e.value)


# ---- GPU tier ----


@pytest.mark.gpu
@settings(max_examples=12, **GPU_DRAWS)
@given(
    p=wino_wgrads(),
    batch=st.integers(1, 5),
    pick=st.integers(0, 10**6),
    precision=st.sampled_from([TF32, FP32]),
)
def test_drawn_problems_on_the_gpu(p, batch, pick, precision):
    """The default variant and one drawn from tune's space, in tf32 and in 3xTF32,
    against the float64 reference: ragged tiles at odd sizes, every padding, db."""
    verify_on_the_gpu(p, default_and_drawn(p, Wgwino, precision, pick), batch)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", [TF32, FP32])
@pytest.mark.parametrize("spec", VGG)
def test_the_vgg_layers_on_the_gpu(spec, precision):
    verify_on_the_gpu(parse_shape(spec), [Wgwino.default(parse_shape(spec), precision)], 3)


@pytest.mark.gpu
def test_dw_is_as_close_to_float64_as_the_direct_three_products():
    """On vgg11's 28x28 layer at batch 8: the Winograd domain's worst dw error, relative
    to the largest |dw|, within twice wgnchw's direct 3xTF32 one (the NumPy study found
    them alike: docs/measurements/winograd-wgrad-accuracy-numpy-2026-11-30.log)."""
    import cupy

    from specgen.reference import conv2d_wgrad
    from specgen.runtime import Conv
    from specgen.tensors import Role

    p = parse_shape("C=128,M=128,H=28,W=28,K=3,pad=1,op=wgrad")
    rng = np.random.default_rng()
    x = rng.standard_normal((8, 128, 28, 28), dtype=np.float32)
    dy = rng.standard_normal((8, 128, 28, 28), dtype=np.float32)
    ref = conv2d_wgrad(x.astype(np.float64), dy.astype(np.float64), p, np)
    errors = []
    for v in (Wgwino.default(p, FP32), Wgnchw.default(p, FP32)):
        conv = Conv(p, v)
        dw = cupy.full(ref.shape, np.nan, np.float32)
        conv.run({Role.X: cupy.asarray(x), Role.DY: cupy.asarray(dy)}, {Role.DW: dw})
        errors.append(float(np.abs(dw.get() - ref).max() / np.abs(ref).max()))
    assert np.isfinite(errors).all() and errors[0] <= 2 * errors[1], errors


def test_the_planner_takes_it_for_layers_of_many_weights():
    """Untuned (as measured beside the picks on the H200): in three tf32 products (not
    where tf32 is allowed) from 256 x 512 weights a tap over maps from 14x14, from 128 x
    256 over 16x16, or from 512 x 512 over 7x7; in tf32 from 256 x 512 over maps from
    7x7; fewer weights or smaller maps stay the others', and a strided window never
    takes it."""
    picks = {
        spec: (
            planned(parse_shape(spec), False).variant.key,
            planned(parse_shape(spec), True).variant.key,
        )
        for spec in (
            "C=384,M=384,H=20,W=20,K=3,pad=1,op=wgrad",
            "C=256,M=256,H=20,W=20,K=3,pad=1,bias=1,op=wgrad",
            "C=256,M=256,H=14,W=14,K=3,pad=1,bias=1,op=wgrad",
            "C=128,M=128,H=20,W=20,K=3,pad=1,op=wgrad",
            "C=512,M=512,H=7,W=7,K=3,pad=1,op=wgrad",
            "C=384,M=384,H=20,W=20,K=3,pad=1,stride=2,op=wgrad",
            "C=512,M=512,H=6,W=6,K=3,pad=1,op=wgrad",
        )
    }
    assert list(picks.values()) == [
        ("wgwino", "wgwino"),
        ("wgwino", "wgnchw"),
        ("wgnchw", "wgnchw"),
        ("wgnchw", "wgnchw"),
        ("wgwino", "wgwino"),
        ("wgnchw", "wgnchw"),
        ("wtap", "wgnchw"),
    ]


def test_the_spread_bound_passes_the_exact_dw_and_catches_a_wrong_one():
    """The verifier's judgment of a wgwino plan, on the CPU: dw computed in float64 and
    rounded to fp32 passes; a tap's dw taken from its mirror, one weight 0.1% off, or a
    NaN fails, under the bound's spread magnitudes as under the direct ones."""
    from specgen.reference import conv2d_wgrad
    from specgen.tensors import Role, from_storage
    from specgen.verify import judge, random_inputs

    p = parse_shape("C=16,M=16,H=9,W=7,K=3,pad=1,op=wgrad")
    plan = make_plan(p, Wgwino.default(p, FP32))
    inputs, w, b = random_inputs(p, 2, np.random.default_rng())
    exact = conv2d_wgrad(
        from_storage(inputs[Role.X], p.dtype), from_storage(inputs[Role.DY], p.dtype), p
    ).astype(np.float32)
    assert judge(p, plan, 2, inputs, w, b, {Role.DW: exact})["ok"]
    mirrored = exact.copy()
    mirrored[:, :, 0] = exact[:, :, 2]
    off = exact.copy()
    off[3, 5, 1, 2] *= np.float32(1.001)
    poisoned = exact.copy()
    poisoned[0, 0, 0, 0] = np.nan
    for wrong in (mirrored, off, poisoned):
        assert not judge(p, plan, 2, inputs, w, b, {Role.DW: wrong})["ok"]
