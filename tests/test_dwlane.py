"""dwlane, depthwise layers in channels-last: the planned walk replayed in NumPy against
the float64 reference (every output once, every tap once), what the compiler makes of
it and its limits (CPU tier), and its numbers on drawn problems (GPU tier)."""

from dataclasses import replace

import cpu_kernel
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from problems import (
    DRAWN_COMPILES,
    GPU_DRAWS,
    assert_compiles_without_spills,
    assert_one_line_refusal,
    default_and_drawn,
    depthwise_problems,
    narrow_group_problems,
    verify_on_the_gpu,
)
from specgen.compile import compile_source
from specgen.errors import SpecError
from specgen.plan import make_plan
from specgen.reference import conv2d, conv2d_dgrad
from specgen.render import render
from specgen.shapes import Op, parse_shape
from specgen.strategies import Dwlane, Dwrows
from specgen.variants import Precision

# MobileNetV2's depthwise layers at 224x224 (its first, a strided one, a 14x14 one),
# ConvNeXt's 7x7, and one of EfficientNet's 5x5 at stride 2
LAYERS = [
    "C=32,M=32,H=112,W=112,K=3,pad=1,groups=32,dtype=bf16,layout=nhwc",
    "C=144,M=144,H=56,W=56,K=3,pad=1,stride=2,groups=144,dtype=bf16,layout=nhwc",
    "C=576,M=576,H=14,W=14,K=3,pad=1,groups=576,dtype=fp16,layout=nhwc",
    "C=96,M=96,H=56,W=56,K=7,pad=3,groups=96,layout=nhwc",
    "C=240,M=240,H=28,W=28,K=5,pad=2,stride=2,groups=240,dtype=bf16,layout=nhwc,bias=1,act=relu",
]


def _replay(view, plan, x, w, batch):
    """The kernel's output the way it computes it, NCHW: thread u's channels, run and
    row from its index; for each window row that reaches the row, each planned column
    in the input, every (output, tap) pair that reads it; outputs past the row dropped.
    Forward: y from x.  Gather (dgrad past stride 1): dx from dy, row oh taking dy row
    (oh + pt - r*dh) / sh where that divides."""
    c = plan.context
    y = np.full((batch, view.C, c["out_h"], c["out_w"]), np.nan)
    (sh, sw), pl = view.stride, view.pads[2]
    for u in range(batch * c["units"]):
        c0 = u % c["vectors"] * c["vec"]
        run = u // c["vectors"]
        k, orow = run % c["per_row"], run // c["per_row"]
        n, oh = divmod(orow, c["out_h"])
        ow0 = k * c["P"]
        chans = slice(c0, c0 + c["vec"])
        acc = np.zeros((c["P"], c["vec"]))
        for r, at in c["rows"]:
            if c["gather"]:
                num = oh + at
                if num < 0 or num % sh:
                    continue
                ih = num // sh
            else:
                ih = oh * sh + at
            if not 0 <= ih < c["in_h"]:
                continue
            for t, users in c["cols"]:
                iw = (ow0 // sw if c["gather"] else ow0 * sw - pl) + t
                if not 0 <= iw < c["in_w"]:
                    continue
                for j, s in users:
                    acc[j] += x[n, chans, ih, iw] * w[chans, 0, r, s]
        for j in range(c["P"]):
            if ow0 + j < c["out_w"]:
                assert np.isnan(y[n, chans, oh, ow0 + j]).all(), "an output written twice"
                y[n, chans, oh, ow0 + j] = acc[j]
    return y


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(p=depthwise_problems(), pixels=st.sampled_from([1, 2, 3, 4, 8]))
def test_the_planned_walk_gives_the_convolution(p, pixels):
    """Every output once, from every tap inside the image: the runs (the last one cut
    short), the columns each row's loads cover at the stride and dilation, and the
    padding on every side."""
    view = Dwlane.problem_for(p)
    try:
        plan = make_plan(p, replace(Dwlane.default(view, Precision.FP32), pixels=pixels))
    except SpecError:
        assume(False)  # a run longer than the row, or a window too wide for the registers
    rng = np.random.default_rng()
    c = plan.context
    x = rng.standard_normal((2, view.C, c["in_h"], c["in_w"]))
    w = rng.standard_normal((view.M, 1, view.R, view.S))
    got = _replay(view, plan, x, w, 2)
    assert not np.isnan(got).any(), "an output never written"
    if c["gather"]:
        want = conv2d_dgrad(x, w, view)
    else:
        want = conv2d(x, w, replace(view, bias=False), epilogue=False)
    np.testing.assert_allclose(got, want, atol=1e-12)


@pytest.mark.parametrize("spec", LAYERS)
def test_the_networks_layers_compile_without_spills(spec):
    """16-byte words where C allows (8 16-bit channels, 4 fp32), the vector loads and
    stores in the PTX, no spills."""
    p = parse_shape(spec)
    v = Dwlane.default(p, Precision.FP32)
    assert v.vec * p.dtype.bytes == 16, v.name
    plan = make_plan(p, v)
    binary = compile_source(render(plan), plan.name, plan.target("sm_90"))
    assert binary.spills == 0, (plan.name, binary.resources)


@pytest.mark.parametrize("spec", LAYERS[:2])
def test_stride_one_dgrad_runs_on_the_flipped_forward_view(spec):
    p = parse_shape(spec.replace("stride=2,", "") + ",op=dgrad")
    plan = make_plan(p, Dwlane.default(Dwlane.problem_for(p), Precision.FP32))
    assert plan.view is not None and plan.view.op is Op.FPROP
    assert plan.weight_transform == "dgrad" and plan.name.endswith("_dgrad_iobf16_nhwc")


def test_strided_dgrad_is_a_gather_that_multiplies_no_zero():
    """MobileNetV2's strided depthwise dgrad: dy read as it is, runs of dx starting at
    even columns, each dy column feeding only the pixels its taps reach."""
    p = parse_shape(LAYERS[1] + ",op=dgrad")
    v = Dwlane.default(Dwlane.problem_for(p), Precision.FP32)
    plan = make_plan(p, v)
    assert plan.view is None and plan.weight_transform == "" and v.pixels % 2 == 0
    taps = sum(len(users) for _, users in plan.context["cols"])
    assert taps == v.pixels * p.S // 2  # half a row's products: the rest would meet zeros
    binary = compile_source(render(plan), plan.name, plan.target("sm_90"))
    assert binary.spills == 0


@pytest.mark.parametrize(
    "spec, name, words",
    [
        ("C=32,M=32,H=9,W=9,K=3,pad=1,groups=32,dtype=bf16", "dwlane_v8_p4_t128_fp32", "nhwc"),
        ("C=96,M=96,H=9,W=9,K=3,pad=1,groups=32,layout=nhwc", "dwlane_v4_p4_t128_fp32", "groups"),
        ("C=64,M=64,H=9,W=9,K=3,groups=8,layout=nhwc", "dwlane_v4_p4_t128_fp32", "word"),
        ("C=16,M=8,H=9,W=9,K=3,pad=1,groups=4,layout=nhwc", "dwlane_v4_p4_t128_fp32", "one group"),
        (
            "C=64,M=64,H=9,W=9,K=7,pad=3,groups=8,dtype=bf16,layout=nhwc",
            "dwlane_v8_p4_t128_fp32",
            "narrower --vec",
        ),
        ("C=32,M=32,H=9,W=9,K=3,groups=1,layout=nhwc", "dwlane_v4_p4_t128_fp32", "depthwise"),
        ("C=12,M=12,H=9,W=9,K=3,groups=12,layout=nhwc", "dwlane_v8_p4_t128_fp32", "4"),
        (
            "C=12,M=12,H=9,W=9,K=3,groups=12,dtype=fp16,layout=nhwc",
            "dwlane_v8_p4_t128_fp32",
            "multiple",
        ),
        ("C=8,M=8,H=9,W=5,K=3,groups=8,layout=nhwc", "dwlane_v4_p4_t128_fp32", "Wo=3"),
        (
            "C=8,M=8,H=9,W=30,K=1x13,groups=8,dtype=bf16,layout=nhwc",
            "dwlane_v8_p8_t128_fp32",
            "pixels",
        ),
        ("C=8,M=8,H=9,W=9,K=3,groups=8,layout=nhwc", "dwlane_v4_p4_t96_fp32", "threads"),
        ("C=8,M=8,H=9,W=9,K=3,groups=8,layout=nhwc", "dwlane_v4_p9_t128_fp32", "1 to 8"),
    ],
)
def test_limits_are_one_line_refusals(spec, name, words):
    assert_one_line_refusal(spec, name, words)


@settings(max_examples=DRAWN_COMPILES, deadline=None, suppress_health_check=list(HealthCheck))
@given(p=depthwise_problems())
def test_drawn_defaults_compile_without_spills(p):
    assert_compiles_without_spills(p, lambda: Dwlane.default(Dwlane.problem_for(p), Precision.FP32))


@settings(max_examples=DRAWN_COMPILES, deadline=None, suppress_health_check=list(HealthCheck))
@given(p=narrow_group_problems())
def test_drawn_narrow_group_defaults_compile_without_spills(p):
    v = _planned_default(p)
    assert_compiles_without_spills(p, lambda: v)


def _planned_default(p):
    """The default for a drawn problem, the draw rejected where the planner refuses it
    (a group that is no word, maps a thread's vector does not divide, a window too wide
    for the registers)."""
    try:
        v = Dwlane.default(Dwlane.problem_for(p), Precision.FP32)
        make_plan(p, v)
    except SpecError:
        assume(False)
    return v


# ResNeXt-50 (32x4d)'s grouped 3x3 layers (32 groups of 4 and 8 channels), B=32: the
# tensor-core picks left their tiles' maps mostly empty (0.23-0.34x cuDNN's, bf16 NHWC,
# H200, 2026-11-29, model-resnext50_32x4d-bf16-2026-11-29-h200-441c559.log)
RESNEXT = [
    "C=128,M=128,H=56,W=56,K=3,pad=1,groups=32,dtype=bf16,layout=nhwc",
    "C=256,M=256,H=56,W=56,K=3,pad=1,stride=2,groups=32,dtype=bf16,layout=nhwc",
    "C=256,M=256,H=28,W=28,K=3,pad=1,groups=32,dtype=bf16,layout=nhwc",
    "C=256,M=256,H=28,W=28,K=3,pad=1,groups=32,dtype=bf16,layout=nhwc,op=dgrad",
    "C=256,M=256,H=56,W=56,K=3,pad=1,stride=2,groups=32,dtype=bf16,layout=nhwc,op=dgrad",
]


@pytest.mark.parametrize("spec", RESNEXT)
def test_the_planner_puts_narrow_groups_on_dwlane(spec):
    """Groups of 4 and 8 channels go to dwlane's grouped form, a thread's maps in one
    group (4 of them: 8 would hold too many weights of a 3x3 window of 8 channels), and
    compile without spills."""
    from specgen.choose import planned

    p = parse_shape(spec)
    v = planned(p, allow_tf32=False).variant
    assert v.key == "dwlane" and v.vec == 4, v.name
    plan = make_plan(p, v)
    assert compile_source(render(plan), plan.name, plan.target("sm_90")).spills == 0


# ---- GPU tier ----


@pytest.mark.gpu
@pytest.mark.parametrize("shard", range(2))  # two draws, side by side
@settings(max_examples=16, **GPU_DRAWS)
@given(p=depthwise_problems(), batch=st.integers(1, 5), pick=st.integers(0, 10**6))
def test_drawn_problems_on_the_gpu(shard, p, batch, pick):
    """The default and one variant of tune's space against the float64 reference: the
    vector loads and stores of each width, the zero padding on every side, the last
    run of a row cut short, the epilogue, dgrad's flipped windows."""
    _planned_default(p)
    verify_on_the_gpu(p, default_and_drawn(p, Dwlane, Precision.FP32, pick), batch)


@pytest.mark.gpu
@pytest.mark.parametrize("shard", range(2))  # two draws, side by side
@settings(max_examples=16, **GPU_DRAWS)
@given(p=narrow_group_problems(), batch=st.integers(1, 5), pick=st.integers(0, 10**6))
def test_drawn_narrow_groups_on_the_gpu(shard, p, batch, pick):
    """Grouped layers against the float64 reference: a group's channels loaded in one
    word, every channel's products in every map's sums, the thread's maps in one group,
    stride-1 dgrad's forward view with its weights transposed per group, the strided
    gather's dy maps of a group."""
    _planned_default(p)
    verify_on_the_gpu(p, default_and_drawn(p, Dwlane, Precision.FP32, pick), batch)


@pytest.mark.gpu
@pytest.mark.parametrize("spec", LAYERS + RESNEXT)
def test_the_networks_layers_at_their_batch(spec):
    from specgen.runtime import device_arch
    from specgen.verify import verify_variant

    p = parse_shape(spec)
    v = Dwlane.default(Dwlane.problem_for(p), Precision.FP32)
    row = verify_variant(p, v, arch=device_arch(), batch=64, numbers=True)
    assert row.status == "PASS", row.problems


@pytest.mark.skipif(cpu_kernel.CXX is None, reason="no C++ compiler here")
@pytest.mark.parametrize(
    "spec",
    [
        "C=16,M=16,H=9,W=11,K=3,pad=1,groups=16,dtype=bf16,layout=nhwc,bias=1,act=relu",
        "C=12,M=12,H=10,W=9,K=3x5,pad=1x0x2x1,stride=2x3,dil=1x2,groups=12,dtype=fp16,layout=nhwc",
        "C=6,M=6,H=8,W=13,K=7,pad=3,groups=6,layout=nhwc",
        "C=24,M=24,H=9,W=10,K=3,pad=1,stride=2,groups=24,dtype=bf16,layout=nhwc,op=dgrad",
        "C=8,M=8,H=11,W=12,K=5x3,pad=2x1x0x2,stride=3x2,groups=8,layout=nhwc,op=dgrad",
        "C=10,M=10,H=7,W=8,K=3,pad=2,groups=10,dtype=bf16,layout=nhwc,op=dgrad",
        # narrow groups: 4 and 8 channels a group (16-bit), 1, 2 and 4 (fp32), maps a
        # group that take 2 to 8 a thread, a channel multiplier, strides, dilation,
        # rectangular windows, the epilogue, stride-1 dgrad's forward view
        "C=16,M=16,H=9,W=11,K=3,pad=1,groups=4,dtype=bf16,layout=nhwc,bias=1,act=relu",
        "C=32,M=32,H=7,W=9,K=3,pad=1,stride=2,groups=4,dtype=bf16,layout=nhwc",
        "C=8,M=24,H=8,W=10,K=3x5,pad=1x0x2x1,stride=2x3,dil=1x2,groups=2,dtype=fp16,layout=nhwc",
        "C=12,M=12,H=6,W=7,K=3,pad=1,groups=6,layout=nhwc",
        "C=8,M=16,H=7,W=6,K=5,pad=2,groups=2,layout=nhwc,bias=1",
        "C=6,M=12,H=9,W=8,K=3,pad=1,groups=6,layout=nhwc",
        "C=24,M=16,H=9,W=10,K=3,pad=1,groups=4,dtype=bf16,layout=nhwc,op=dgrad",
        "C=16,M=16,H=8,W=9,K=3,pad=2,dil=2,groups=2,dtype=fp16,layout=nhwc,op=dgrad",
        # ... and strided dgrad's gather: dx's channels of a group from its dy maps
        "C=16,M=16,H=9,W=10,K=3,pad=1,stride=2,groups=4,dtype=bf16,layout=nhwc,op=dgrad",
        "C=16,M=8,H=11,W=12,K=5x3,pad=2x1x0x2,stride=3x2,groups=2,layout=nhwc,op=dgrad",
        "C=8,M=16,H=10,W=9,K=3,pad=1,stride=2,dil=2x1,groups=4,dtype=fp16,layout=nhwc,op=dgrad",
    ],
)
def test_the_emitted_kernel_run_on_the_cpu_matches_float64(spec):
    """The generated source itself, compiled as C++ and run thread by thread: its vector
    loads and stores, the 16-bit conversions, the padding checks, the runs cut short,
    the epilogue, dgrad's forward view and its gather, a narrow group's channels in one
    word, against the float64 reference within the error bound, the output poisoned
    with NaN first."""
    _run_emitted_on_the_cpu(parse_shape(spec))


@pytest.mark.skipif(cpu_kernel.CXX is None, reason="no C++ compiler here")
@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(p=narrow_group_problems(largest=9))
def test_drawn_narrow_groups_run_on_the_cpu_match_float64(p):
    _planned_default(p)
    _run_emitted_on_the_cpu(p)


def _run_emitted_on_the_cpu(p, variant=None):
    """The default's (or ``variant``'s) emitted kernel run on the CPU (``cpu_kernel``)
    for a batch of two, its output poisoned with NaN first, judged against float64."""
    plan = make_plan(p, variant or Dwlane.default(Dwlane.problem_for(p), Precision.FP32))
    result = cpu_kernel.judged_on_cpu(p, plan)
    assert result["ok"], (plan.name, result)


# ---- dwrows: a band of output rows a thread ----

BANDS = [
    "C=16,M=16,H=9,W=11,K=3,pad=1,groups=16,dtype=bf16,layout=nhwc,bias=1,act=relu",
    "C=12,M=12,H=10,W=9,K=3x5,pad=1x0x2x1,stride=2x3,dil=1x2,groups=12,dtype=fp16,layout=nhwc",
    "C=8,M=8,H=13,W=8,K=5,pad=2,stride=2,groups=8,layout=nhwc",
    "C=24,M=24,H=7,W=10,K=3,pad=2,dil=2,groups=24,dtype=bf16,layout=nhwc,op=dgrad",
    "C=6,M=6,H=8,W=7,K=3,pad=0x2x1x1,groups=6,dtype=bf16,layout=nhwc",
]


@pytest.mark.skipif(cpu_kernel.CXX is None, reason="no C++ compiler here")
@pytest.mark.parametrize("spec", BANDS)
@pytest.mark.parametrize("rows", [2, 3, 4])
def test_dwrows_band_run_on_the_cpu_matches_float64(spec, rows):
    """dwrows' emitted kernel run thread by thread: each input row of a band loaded once
    for every output row and window row that reads it (stride, dilation, rectangular
    windows, padding on every side), the last band cut short where the rows do not
    divide, the epilogue, stride-1 dgrad's forward view; against float64, the output
    poisoned with NaN first."""
    p = parse_shape(spec)
    view = Dwrows.problem_for(p)
    v = replace(Dwrows.default(view, Precision.FP32), rows=rows, pixels=2)
    if rows > view.Ho:
        pytest.skip("a band past the output's rows")
    _run_emitted_on_the_cpu(p, v)


@pytest.mark.parametrize("spec", LAYERS)
def test_dwrows_compiles_without_spills(spec):
    """The default and the widest band of the space on the networks' depthwise layers:
    the whole window's weights and the band's sums in registers, no spill."""
    p = parse_shape(spec)
    view = Dwrows.problem_for(p)
    space = Dwrows.space(view, Precision.FP32)
    widest = max(space, key=lambda v: v.vec * v.rows * v.pixels)
    for v in (Dwrows.default(view, Precision.FP32), widest):
        binary = compile_source(render(make_plan(p, v)), v.kernel_name(p), "sm_90")
        assert binary.spills == 0, (v.name, binary.resources)


@pytest.mark.parametrize(
    "spec,name,words",
    [
        (LAYERS[1] + ",op=dgrad", "dwrows_v8_p2_t128_r2_fp32", "gathers"),
        (RESNEXT[0], "dwrows_v8_p2_t128_r2_fp32", "depthwise"),
        (LAYERS[3], "dwrows_v4_p4_t128_r4_fp32", "weights a thread, over 160"),
        ("C=8,M=8,H=3,W=9,K=3,pad=1,groups=8,layout=nhwc", "dwrows_v4_p1_t128_r4_fp32", "Ho=3"),
    ],
)
def test_dwrows_limits_are_one_line_refusals(spec, name, words):
    assert_one_line_refusal(spec, name, words)


@pytest.mark.gpu
@pytest.mark.parametrize("shard", range(2))  # two draws, side by side
@settings(max_examples=12, **GPU_DRAWS)
@given(p=depthwise_problems(), batch=st.integers(1, 5), pick=st.integers(0, 10**6))
def test_dwrows_drawn_problems_on_the_gpu(shard, p, batch, pick):
    """dwrows' default and one member of its space against the float64 reference: bands
    cut short, the vector words of each width, the padding, the epilogue, stride-1
    dgrad's forward view (the strided gather is dwlane's)."""
    view = Dwrows.problem_for(p)
    assume(view.op is not Op.DGRAD)
    try:
        variants = default_and_drawn(p, Dwrows, Precision.FP32, pick)
        make_plan(p, variants[0])
    except SpecError:
        assume(False)  # a window too wide for the registers, a single output row
    verify_on_the_gpu(p, variants, batch)
