"""tcwhalo, wgrad on tensor cores for layers with few channels or maps: what the compiler
makes of it (CPU tier), its limits, the planner's choice, and its numbers on drawn
problems (GPU tier)."""

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
from specgen.choose import planned
from specgen.compile import compile_source
from specgen.errors import SpecError
from specgen.plan import make_plan
from specgen.render import render
from specgen.shapes import DType, parse_shape
from specgen.strategies import Tcwhalo
from specgen.variants import Precision

from ptx import ptx_of

# The autoencoder's first and last layers as autocast runs them (B=128 in the model).
ENC1 = "C=3,M=256,H=32,W=32,K=3,pad=1,bias=1,dtype=bf16,layout=nhwc,op=wgrad"
DEC3 = "C=256,M=3,H=32,W=32,K=3,pad=1,bias=1,dtype=bf16,layout=nhwc,op=wgrad"
# shufflenet_v2_x1_0's 1x1 layers whose rows are more than the default's threads hold
# (B=32 in the model): their wgrads went to wband's CUDA cores in NCHW at 1.77 ms
# against cuDNN's 0.02 (H200, 2026-11-29)
SHUFFLE = [
    f"C={c},M={m},H={h},W={h},K=1,pad=0,dtype=bf16,layout=nhwc,op=wgrad"
    for c, m, h in [(24, 58, 56), (116, 116, 28), (116, 116, 14)]
]


@pytest.mark.parametrize("spec", [ENC1, DEC3])
def test_three_channel_layers_compile_without_spills_on_tensor_cores(spec):
    """The default keeps every tap's sums in registers without spilling; its PTX reads
    fragments transposed, copies the wide operand 16 bytes at a time in a ring that
    leaves stages - 2 chunks in flight, and multiplies bf16 on m16n8k16."""
    p = parse_shape(spec)
    v = Tcwhalo.default(p, Precision.BF16)
    plan = make_plan(p, v)
    binary = compile_source(render(plan), plan.name, plan.target("sm_90"))
    assert binary.spills == 0, (plan.name, binary.resources)
    ptx = ptx_of(plan)
    assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in ptx
    assert re.search(r"cp\.async\.cg\.shared\.global \[%r\d+\], \[%rd\d+\], 16", ptx)
    assert f"cp.async.wait_group {v.stages - 2};" in ptx
    assert ptx.count("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32") >= 9


def test_the_planner_puts_three_channel_16_bit_wgrad_on_tcwhalo():
    for spec in (ENC1, DEC3, ENC1.replace("bf16", "fp16")):
        choice = planned(parse_shape(spec), allow_tf32=False)
        assert choice.variant.key == "tcwhalo", (spec, choice)
        assert choice.variant.precision.value == parse_shape(spec).dtype.value
    wide = parse_shape("C=256,M=128,H=16,W=16,K=3,pad=1,dtype=bf16,layout=nhwc,op=wgrad")
    assert planned(wide, allow_tf32=False).variant.key == "wgwgrad"  # on Hopper
    assert planned(wide, allow_tf32=False, arch="sm_80").variant.key == "tcwgrad"


@pytest.mark.parametrize("spec", [ENC1, DEC3])
def test_tune_space_plans_or_refuses_in_one_line(spec):
    p = parse_shape(spec)
    ok = []
    for v in Tcwhalo.space(p, Precision.BF16):
        try:
            make_plan(p, v)
            ok.append(v)
        except SpecError as e:
            assert "\n" not in str(e)
    assert len(ok) >= 20
    for v in ok[::9]:  # a sample compiles clean too
        plan = make_plan(p, v)
        assert compile_source(render(plan), plan.name, plan.target("sm_90")).spills == 0


@pytest.mark.parametrize(
    "spec,name,words",
    [
        (ENC1.replace("layout=nhwc", "layout=nchw"), "tcwhalo_b128x8_w8x1_r2_p3_s8_bf16", "nhwc"),
        (ENC1.replace(",dtype=bf16", ""), "tcwhalo_b128x8_w8x1_r2_p3_s8_bf16", "16-bit"),
        (ENC1, "tcwhalo_b128x8_w8x1_r2_p3_s8_fp16", "bf16"),
        (ENC1, "tcwhalo_b96x8_w8x1_r2_p3_s8_bf16", "maps per block"),
        (ENC1, "tcwhalo_b128x8_w4x2_r2_p3_s8_bf16", "fewer warps"),
        (ENC1, "tcwhalo_b128x8_w2x1_r2_p3_s8_bf16", "--warpgrid"),
        (ENC1, "tcwhalo_b128x8_w8x1_r40_p3_s8_bf16", "output rows"),
        (ENC1, "tcwhalo_b128x8_w8x1_r2_p9_s8_bf16", "2 to 8"),
        (DEC3, "tcwhalo_b16x128_w1x8_r4_p3_s8_bf16", "registers"),
        (DEC3.replace("W=32", "W=200"), "tcwhalo_b16x64_w1x8_r1_p3_s8_bf16", "shared memory"),
    ],
)
def test_limits_are_one_line_refusals(spec, name, words):
    assert_one_line_refusal(spec, name, words)


# ---- GPU tier ----


@pytest.mark.parametrize("spec", SHUFFLE)
def test_rows_too_wide_for_the_threads_take_more_warps_or_smaller_tiles(spec):
    """Where one output row's gathers or registers are more than a thread holds, the
    default takes more warps, then halves its larger tile, rather than refuse: the
    operator computes these wgrads on tensor cores in place, and they compile without
    spilling."""
    from specgen.choose import computed_problem

    p = parse_shape(spec)
    computed = computed_problem(p, "NVIDIA H200", False, "sm_90")
    v = planned(computed, allow_tf32=False).variant
    assert computed.layout is p.layout and v.key == "tcwhalo", v.name
    plan = make_plan(p, v)
    assert compile_source(render(plan), plan.name, plan.target("sm_90")).spills == 0


@st.composite
def few_channel_problems(draw):
    """wgrad of channels-last 16-bit layers with few channels or few maps per group (or
    both, or neither): stride, dilation, every padding, groups, db, both dtypes."""
    groups = draw(st.sampled_from([1, 1, 2]))
    cg = draw(st.sampled_from([1, 2, 3, 4, 5, 8, 12, 16, 24]))
    mg = draw(st.sampled_from([1, 3, 4, 6, 8, 16, 24, 40]))
    R, S = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    H, W = draw(st.integers(R, 19)), draw(st.integers(S, 23))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    dil = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    pads = "x".join(str(draw(st.integers(0, 2))) for _ in range(4))
    spec = (
        f"C={groups * cg},M={groups * mg},H={H},W={W},K={R}x{S},pad={pads},"
        f"stride={stride[0]}x{stride[1]},dil={dil[0]}x{dil[1]},groups={groups},"
        f"dtype={draw(st.sampled_from(['bf16', 'fp16']))},layout=nhwc,op=wgrad"
    )
    if draw(st.booleans()):
        spec += ",bias=1"
    return parsed_or_rejected(spec)


@pytest.mark.gpu
@pytest.mark.parametrize("shard", range(2))  # two draws, side by side
@settings(max_examples=13, **GPU_DRAWS)
@given(p=few_channel_problems(), batch=st.integers(1, 5), pick=st.integers(0, 10**6))
def test_drawn_problems_on_the_gpu(shard, p, batch, pick):
    """The default and one variant of tune's space against the float64 reference: the
    halo's zero-fill at every edge, the element-wise gathers, maps and channels past
    the group, rows past the image in the last chunk, empty slices."""
    precision = {DType.BF16: Precision.BF16, DType.FP16: Precision.FP16}[p.dtype]
    try:
        make_plan(p, Tcwhalo.default(p, precision))
    except SpecError:
        assume(False)  # a drawn problem the default cannot serve (its tiles refuse)
    verify_on_the_gpu(p, default_and_drawn(p, Tcwhalo, precision, pick), batch)


@pytest.mark.gpu
@pytest.mark.parametrize("spec", [ENC1, DEC3, *SHUFFLE])
def test_three_channel_layers_at_the_models_batch(spec):
    """The long reduction (131072 pixels a weight) where the error shows."""
    from specgen.runtime import device_arch
    from specgen.verify import verify_variant

    p = parse_shape(spec)
    v = Tcwhalo.default(p, Precision.BF16)
    row = verify_variant(p, v, arch=device_arch(), batch=128, numbers=True)
    assert row.status == "PASS", (v.name, row.problems)


@settings(max_examples=DRAWN_COMPILES, deadline=None, suppress_health_check=list(HealthCheck))
@given(p=few_channel_problems())
def test_drawn_defaults_compile_without_spills(p):
    precision = {DType.BF16: Precision.BF16, DType.FP16: Precision.FP16}[p.dtype]
    assert_compiles_without_spills(p, lambda: Tcwhalo.default(p, precision))
