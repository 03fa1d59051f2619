"""dwplane, depthwise layers in NCHW: the emitted kernel run thread by thread on the CPU
against float64, what the compiler makes of it and its limits (CPU tier), and its
numbers on drawn problems and the networks' layers (GPU tier)."""

from dataclasses import replace

import cpu_kernel
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
    verify_on_the_gpu,
)
from specgen.errors import SpecError
from specgen.plan import make_plan
from specgen.shapes import parse_shape
from specgen.strategies import Dwplane
from specgen.variants import Precision

FP32 = Precision.FP32
# mobilenet_v2's depthwise layers in NCHW at 224x224 (its first, a strided one, the
# 960-channel 7x7 one), EfficientNet's 5x5 at stride 2 with its epilogue, ConvNeXt's 7x7
LAYERS = [
    "C=32,M=32,H=112,W=112,K=3,pad=1,groups=32",
    "C=144,M=144,H=56,W=56,K=3,pad=1,stride=2,groups=144",
    "C=960,M=960,H=7,W=7,K=3,pad=1,groups=960",
    "C=240,M=240,H=28,W=28,K=5,pad=2,stride=2,groups=240,bias=1,act=relu",
    "C=96,M=96,H=56,W=56,K=7,pad=3,groups=96,dtype=bf16",
]


def _planned(p, variant=None):
    """The default (or ``variant``) for ``p`` through dwplane's view of it, planned."""
    v = variant or Dwplane.default(Dwplane.problem_for(p), FP32)
    return make_plan(p, v)


def _run_emitted_on_the_cpu(p, variant=None):
    """The emitted kernel run on the CPU (``cpu_kernel``) for a batch of two, its output
    poisoned with NaN first, judged against float64."""
    plan = _planned(p, variant)
    result = cpu_kernel.judged_on_cpu(p, plan)
    assert result["ok"], (plan.name, result)


@pytest.mark.skipif(cpu_kernel.CXX is None, reason="no C++ compiler here")
@pytest.mark.parametrize(
    "spec",
    [
        "C=6,M=6,H=9,W=11,K=3,pad=1,groups=6,bias=1,act=relu",
        "C=5,M=5,H=10,W=9,K=3x5,pad=1x0x2x1,stride=2x3,dil=1x2,groups=5,dtype=fp16",
        "C=3,M=3,H=7,W=7,K=3,pad=1,groups=3,dtype=bf16",
        "C=4,M=4,H=8,W=13,K=7,pad=3,groups=4",
        "C=4,M=4,H=10,W=7,K=3,pad=2,dil=2,groups=4,dtype=bf16,op=dgrad",
        "C=3,M=3,H=8,W=7,K=3,pad=0x2x1x1,groups=3,op=dgrad",
    ],
)
@pytest.mark.parametrize("pixels", [1, 2, 4])
def test_the_emitted_kernel_run_on_the_cpu_matches_float64(spec, pixels):
    """The generated source itself, compiled as C++ and run thread by thread: runs of
    1, 2 and 4 outputs (the last of a row cut short), the planes' rows one flat grid,
    padding on every side, stride, dilation, rectangular windows, the 16-bit loads and
    stores, the epilogue, stride-1 dgrad's forward view (the windows flipped)."""
    p = parse_shape(spec)
    view = Dwplane.problem_for(p)
    v = replace(Dwplane.default(view, FP32), pixels=min(pixels, view.Wo), threads=64)
    _run_emitted_on_the_cpu(p, v)


@pytest.mark.parametrize("spec", LAYERS)
def test_the_networks_layers_compile_without_spills(spec):
    """The default and each run length of the space: the window's weights and the run's
    sums in registers, no spill."""
    from ptx import compiled

    p = parse_shape(spec)
    for v in Dwplane.space(p, FP32):
        if v.threads == 256:
            binary = compiled(_planned(p, v))
            assert binary.spills == 0, (v.name, binary.resources)


def test_the_planned_grid_is_one_flat_walk_of_the_rows():
    """Every run of every output row of every plane a thread, runs fastest: 960 planes of
    7 rows of 4 runs of 2 (the last cut short) at a batch of 64."""
    p = replace(parse_shape(LAYERS[2]), batch=64)
    plan = _planned(p, replace(Dwplane.default(p, FP32), pixels=2, threads=256))
    launch = plan.launches[0]
    assert plan.context["per_row"] == 4 and plan.context["ragged"]
    assert launch.per_image == 960 * 7 * 4 and plan.weight_format == "f32"
    assert launch.grid_for(64)[0] == -(-64 * 960 * 7 * 4 // 256)


def test_the_fit_and_the_planner_take_the_tuned_runs():
    """Whole rows of the narrow planes, 4 outputs on wide ones, 2 or 1 when strided (as
    tuned on mobilenet_v2's layers); the planner's pick for NCHW depthwise forward passes
    and stride-1 dgrads, not for the strided dgrad nor for channels-last."""
    from specgen.choose import planned

    names = [planned(parse_shape(s), False).variant.name for s in LAYERS[:3]]
    assert names == ["dwplane_p4_t256_fp32", "dwplane_p2_t128_fp32", "dwplane_p7_t64_fp32"]
    assert planned(parse_shape(LAYERS[0] + ",op=dgrad"), False).variant.key == "dwplane"
    assert planned(parse_shape(LAYERS[1] + ",op=dgrad"), False).variant.key != "dwplane"
    assert planned(parse_shape(LAYERS[0] + ",layout=nhwc"), False).variant.key != "dwplane"


@pytest.mark.parametrize(
    "spec,name,words",
    [
        (LAYERS[0] + ",layout=nhwc", "dwplane_p2_t256_fp32", "cannot serve nhwc"),
        ("C=32,M=32,H=9,W=9,K=3,pad=1,groups=8", "dwplane_p2_t256_fp32", "depthwise"),
        ("C=8,M=8,H=12,W=12,K=9,pad=4,groups=8", "dwplane_p2_t256_fp32", "49 taps"),
        (LAYERS[2], "dwplane_p9_t256_fp32", "1 to 8 outputs"),
        ("C=8,M=8,H=3,W=3,K=3,pad=1,groups=8", "dwplane_p4_t256_fp32", "Wo=3"),
        (LAYERS[2], "dwplane_p2_t100_fp32", "threads per block"),
        (LAYERS[1] + ",op=dgrad", "dwplane_p2_t256_fp32", "phased"),
    ],
)
def test_limits_are_one_line_refusals(spec, name, words):
    assert_one_line_refusal(spec, name, words)


@settings(max_examples=DRAWN_COMPILES, deadline=None, suppress_health_check=list(HealthCheck))
@given(p=depthwise_problems(layout="nchw"))
def test_drawn_defaults_compile_without_spills(p):
    assert_compiles_without_spills(p, lambda: Dwplane.default(Dwplane.problem_for(p), FP32))


# ---- GPU tier ----


@pytest.mark.gpu
@settings(max_examples=16, **GPU_DRAWS)
@given(p=depthwise_problems(layout="nchw"), batch=st.integers(1, 5), pick=st.integers(0, 10**6))
def test_drawn_problems_on_the_gpu(p, batch, pick):
    """The default and one member of the space against the float64 reference: runs cut
    short, padding on every side, the epilogue, the three dtypes, stride-1 dgrad's
    forward view (the strided dgrad is not dwplane's)."""
    try:
        variants = default_and_drawn(p, Dwplane, FP32, pick)
    except SpecError:
        assume(False)  # the strided dgrad, a window over 7x7
    verify_on_the_gpu(p, variants, batch)


@pytest.mark.gpu
@pytest.mark.parametrize("spec", LAYERS)
def test_the_networks_layers_at_their_batch(spec):
    from specgen.runtime import device_arch
    from specgen.verify import verify_variant

    p = parse_shape(spec)
    v = Dwplane.default(Dwplane.problem_for(p), FP32)
    row = verify_variant(p, v, arch=device_arch(), batch=64, numbers=True)
    assert row.status == "PASS", row.problems
