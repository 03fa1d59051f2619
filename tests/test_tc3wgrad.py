"""tc3wgrad, fp32 wgrad of NCHW layers on tensor cores in 3xTF32 (and in tf32, one
product a product): what the compiler makes of it (CPU tier), its error bound, its
limits, and its numbers on drawn problems and at the autoencoder's batch (GPU tier)."""

import re

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from problems import (
    DRAWN_COMPILES,
    GPU_DRAWS,
    assert_compiles_without_spills,
    assert_one_line_refusal,
    default_and_drawn,
    parsed_or_rejected,
    verify_on_the_gpu,
)
from specgen.compile import compile_source
from specgen.errors import SpecError
from specgen.plan import make_plan
from specgen.reference import U_FP32, U_HALF, error_coefficient
from specgen.render import render
from specgen.shapes import parse_shape
from specgen.strategies import Tc3wgrad, Wtap
from specgen.variants import Precision
from specgen.verify import tolerance

from ptx import ptx_of

# The autoencoder's wide layers (B=128 in the model), NCHW fp32.
ENC2 = "C=256,M=128,H=16,W=16,K=3,pad=1,bias=1,op=wgrad"
DEC2 = "C=128,M=256,H=16,W=16,K=3,pad=1,bias=1,op=wgrad"


@pytest.mark.parametrize("spec", [ENC2, DEC2])
def test_wide_layers_compile_without_spills_in_three_tf32_products(spec):
    """The default keeps its 72 sums a thread without spilling; its PTX copies rows 16
    bytes at a time in a ring that leaves stages - 2 chunks in flight, and multiplies on
    tf32 m16n8k8, three products for each pair of fragments, each step's summed from
    zero and added to the sums in fp32 (add.f32, round to nearest)."""
    p = parse_shape(spec)
    v = Tc3wgrad.default(p, Precision.FP32)
    plan = make_plan(p, v)
    binary = compile_source(render(plan), plan.name, plan.target("sm_90"))
    assert binary.spills == 0, (plan.name, binary.resources)
    ptx = ptx_of(plan)
    assert re.search(r"cp\.async\.cg\.shared\.global \[%r\d+\], \[%rd\d+\], 16", ptx)
    assert f"cp.async.wait_group {v.stages - 2};" in ptx
    fm, frags = plan.context["FM"], plan.context["NF"]
    mma = "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32"
    assert ptx.count(mma) == 3 * fm * frags  # one k8 step, looped
    assert "cvt.rna.tf32" not in ptx  # hi is rounded with two integer operations
    assert ptx.count("add.f32") >= 4 * fm * frags


def test_the_bound_counts_three_products_and_the_split():
    """The plan counts three additions a pixel, and the bound adds 5 u^2 for the split:
    per pixel three fp32 roundings, far above the split's term at the model's batch."""
    p = parse_shape(ENC2)
    v = Tc3wgrad.default(p, Precision.FP32)
    plan = make_plan(p, v)
    per_image, slices, fixed = plan.sum_depth
    assert per_image == 3 * plan.context["HB"] * plan.context["KC"]
    assert (slices, fixed) == (v.splits, v.splits)
    gamma, absolute = tolerance(plan, 128, 1.0, 0.0)
    terms = per_image * -(-128 // v.splits) + fixed
    assert gamma == pytest.approx((terms * U_FP32 + 5 * U_HALF**2) * 1.01)
    assert absolute == 0.0
    # an fp32-math strategy without the split has no such term
    wtap = Wtap.default(p, Precision.FP32)
    assert error_coefficient(wtap, p, 100) == pytest.approx(100 * U_FP32 * 1.01)


def test_tune_space_plans_or_refuses_in_one_line():
    p = parse_shape(ENC2)
    ok = []
    for v in Tc3wgrad.space(p, Precision.FP32):
        try:
            make_plan(p, v)
            ok.append(v)
        except SpecError as e:
            assert "\n" not in str(e)
    assert len(ok) >= 20
    for v in ok[::11]:  # a sample compiles clean too
        plan = make_plan(p, v)
        assert compile_source(render(plan), plan.name, plan.target("sm_90")).spills == 0
    tf32 = Tc3wgrad.space(p, Precision.TF32)
    assert len(tf32) == len(Tc3wgrad.space(p, Precision.FP32))
    assert all(v.precision is Precision.TF32 for v in tf32)
    assert Tc3wgrad.space(p, Precision.BF16) == []


# MobileNetV2's and EfficientNet's 24-channel layers: 3 warps of 8 channels divide no
# tile; and 3x3 windows at 56 x 56 where a one-row chunk of 32-map warps spills.
NARROW = [
    "C=24,M=144,H=56,W=56,K=1,op=wgrad",
    "C=144,M=24,H=56,W=56,K=1,op=wgrad",
    "C=24,M=16,H=56,W=56,K=3,pad=1,op=wgrad",
    "C=20,M=64,H=16,W=16,K=3,pad=1,op=wgrad",
    "C=3,M=32,H=56,W=56,K=3,pad=1,op=wgrad",
    "C=48,M=48,H=56,W=56,K=3,pad=1,groups=2,op=wgrad",
]


@pytest.mark.parametrize("spec", NARROW)
def test_the_default_plans_for_every_group_width(spec):
    """The fit never hands the planner a tile it refuses, and what it hands compiles
    without spills: 17 to 24 channels take a 32-channel tile over warps of 16 (or 4 of
    8), never 3."""
    p = parse_shape(spec)
    v = Tc3wgrad.default(p, Precision.FP32)
    assert v.warpgrid[1] != 3
    assert_compiles_without_spills(p, lambda: v)


def test_every_group_width_up_to_80_plans():
    """Over the channels and maps a group may have, 1x1 and 3x3, narrow and wide
    images: the default plans (the resource report is the test above's)."""
    for cg in range(1, 81):
        for mg in (1, 16, 24, 32, 144):
            for k, hw in ((1, 56), (3, 56), (3, 8)):
                p = parse_shape(f"C={cg},M={mg},H={hw},W={hw},K={k},pad={k // 2},op=wgrad")
                make_plan(p, Tc3wgrad.default(p, Precision.FP32))


@pytest.mark.parametrize("spec", [ENC2, DEC2])
def test_in_tf32_one_product_a_product(spec):
    """tf32 math: each word rounded to tf32 once (two integer operations, no split), one
    m16n8k8 a pair of fragments, its step's sum added in fp32; the plan counts one
    addition a pixel and the bound is tf32's (two roundings of the inputs), no split
    term; the speed class is the tensor cores' fastest."""
    from specgen.choose import FASTEST, speed_class

    p = parse_shape(spec)
    v = Tc3wgrad.default(p, Precision.TF32)
    assert not v.three_tf32 and Tc3wgrad.default(p, Precision.FP32).three_tf32
    assert speed_class(v) == FASTEST
    plan = make_plan(p, v)
    binary = compile_source(render(plan), plan.name, plan.target("sm_90"))
    assert binary.spills == 0, (plan.name, binary.resources)
    ptx = ptx_of(plan)
    fm, frags = plan.context["FM"], plan.context["NF"]
    assert ptx.count("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32") == fm * frags
    assert "cvt.rna.tf32" not in ptx
    per_image, slices, fixed = plan.sum_depth
    assert per_image == plan.context["HB"] * plan.context["KC"]
    assert error_coefficient(v, p, 100) == pytest.approx((2 * U_HALF + 100 * U_FP32) * 1.01)


@pytest.mark.parametrize(
    "spec,name,words",
    [
        (ENC2 + ",layout=nhwc", "tc3wgrad_b64x32_w2x4_r2_p4_s8_fp32", "nhwc"),
        (ENC2 + ",dtype=bf16", "tc3wgrad_b64x32_w2x4_r2_p4_s8_fp32", "bf16"),
        (ENC2.replace("W=16", "W=18"), "tc3wgrad_b64x32_w2x4_r2_p4_s8_fp32", "multiples of 4"),
        (ENC2, "tc3wgrad_b48x32_w2x4_r2_p4_s8_fp32", "maps per block"),
        (ENC2, "tc3wgrad_b64x32_w8x1_r2_p4_s8_fp32", "fewer warps"),
        (ENC2, "tc3wgrad_b128x32_w2x4_r2_p4_s8_fp32", "--warpgrid"),
        (ENC2, "tc3wgrad_b64x32_w2x4_r17_p4_s8_fp32", "output rows"),
        (ENC2, "tc3wgrad_b64x32_w2x4_r2_p9_s8_fp32", "2 to 8"),
        (ENC2.replace("K=3", "K=7"), "tc3wgrad_b32x8_w2x1_r2_p4_s8_fp32", "sums per thread"),
        (ENC2.replace("H=16", "H=64"), "tc3wgrad_b64x64_w2x8_r16_p8_s8_fp32", "shared memory"),
    ],
)
def test_limits_are_one_line_refusals(spec, name, words):
    assert_one_line_refusal(spec, name + "_wgrad", words)


@st.composite
def nchw_problems(draw):
    """fp32 NCHW wgrad with rows of 4k pixels: stride, dilation, every padding, groups,
    maps and channels past the tiles, db."""
    groups = draw(st.sampled_from([1, 1, 2]))
    cg = draw(st.sampled_from([1, 3, 8, 12, 16, 24, 40]))
    mg = draw(st.sampled_from([1, 5, 16, 24, 40]))
    R, S = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    stride = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    dil = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    pads = [draw(st.integers(0, 2)) for _ in range(4)]
    Wo = 4 * draw(st.integers(1, 5))
    # W so that Wo comes out a multiple of 4 and W is one too
    W = (Wo - 1) * stride[1] + (S - 1) * dil[1] + 1 - pads[2] - pads[3]
    assume(W >= 4 and W % 4 == 0)
    H = draw(st.integers(R, 13))
    spec = (
        f"C={groups * cg},M={groups * mg},H={H},W={W},K={R}x{S},"
        f"pad={'x'.join(map(str, pads))},stride={stride[0]}x{stride[1]},"
        f"dil={dil[0]}x{dil[1]},groups={groups},op=wgrad"
    )
    if draw(st.booleans()):
        spec += ",bias=1"
    p = parsed_or_rejected(spec)
    assume(p.Wo % 4 == 0)
    return p


@settings(max_examples=DRAWN_COMPILES, deadline=None, suppress_health_check=list(HealthCheck))
@given(p=nchw_problems())
def test_drawn_defaults_compile_without_spills(p):
    assert_compiles_without_spills(p, lambda: Tc3wgrad.default(p, Precision.FP32))


# ---- GPU tier ----


@pytest.mark.gpu
@pytest.mark.parametrize("shard", range(2))  # two draws, side by side
@settings(max_examples=13, **GPU_DRAWS)
@given(p=nchw_problems(), batch=st.integers(1, 5), pick=st.integers(0, 10**6))
def test_drawn_problems_on_the_gpu(shard, p, batch, pick):
    """The default and one variant of tune's space, in fp32 or tf32 math, against the
    float64 reference: the halo's zero-fill at every edge, strided and dilated taps,
    maps and channels past the group, rows past the image in the last chunk, empty
    slices."""
    math = (Precision.FP32, Precision.TF32)[pick % 2]
    try:
        make_plan(p, Tc3wgrad.default(p, math))
    except SpecError:
        assume(False)
    verify_on_the_gpu(p, default_and_drawn(p, Tc3wgrad, math, pick // 2), batch)


@pytest.mark.gpu
@pytest.mark.parametrize("math", [Precision.FP32, Precision.TF32], ids=["fp32", "tf32"])
@pytest.mark.parametrize("spec", [ENC2, DEC2])
def test_wide_layers_at_the_models_batch(spec, math):
    """The long reduction (32768 pixels a weight) where the error shows."""
    from specgen.runtime import device_arch
    from specgen.verify import verify_variant

    p = parse_shape(spec)
    v = Tc3wgrad.default(p, math)
    row = verify_variant(p, v, arch=device_arch(), batch=128, numbers=True)
    assert row.status == "PASS", (v.name, row.problems)


@pytest.mark.gpu
@pytest.mark.parametrize("spec", NARROW[:3])
def test_the_narrow_layers_on_the_gpu(spec):
    """The 24-channel tiles and the 16-map warps against the float64 reference, in fp32
    and tf32 math."""
    p = parse_shape(spec)
    verify_on_the_gpu(
        p, [Tc3wgrad.default(p, Precision.FP32), Tc3wgrad.default(p, Precision.TF32)], 3
    )
