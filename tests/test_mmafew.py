"""mmafew, the tensor-core forward pass of channels-last layers of few input channels (a
network's stem): what the compiler makes of it (CPU tier), its limits, a NumPy model of
its patch and runs, and its numbers on drawn problems (GPU tier)."""

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from problems import (
    STEM,
    STEM32,
    VGG_STEM,
    DRAWN_COMPILES,
    assert_space_compiles_without_spills,
    few_channel_problems,
    GPU_DRAWS,
    assert_one_line_refusal,
    default_and_drawn,
    planned_space,
    verify_on_the_gpu,
)
from ptx import ptx_of
from specgen.compile import compile_source
from specgen.plan import make_plan
from specgen.reference import conv2d
from specgen.render import render
from specgen.shapes import parse_shape
from specgen.strategies import Mmafew, default_set
from specgen.strategies.mmafew import channels_padded
from specgen.strategies.tcgemm import MATH
from specgen.variants import Precision


@pytest.mark.parametrize("spec", [STEM, STEM32, VGG_STEM])
def test_stems_compile_without_spills_on_ldmatrix_and_mma(spec):
    """A fragment is one ldmatrix of a pixel's run, the sums bf16 m16n8k16, the weights
    read from global memory once a block (not once a tile)."""
    p = parse_shape(spec)
    (v,) = [x for x in default_set(p) if x.key == "mmafew"]
    plan = make_plan(p, v)
    binary = compile_source(render(plan), plan.name, plan.target("sm_90"))
    assert binary.spills == 0, (plan.name, binary.resources)
    ptx = ptx_of(plan)
    assert re.search(r"ldmatrix\.sync\.aligned\.m8n8\.x4\.shared\.b16", ptx)
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx
    assert len(re.findall(r"mma\.sync", ptx)) == p.R * plan.context["kr"] * (
        plan.context["per_warp"] * plan.context["nt"]
    )


def test_the_stem_pads_three_channels_to_four_and_a_row_of_taps_to_two_steps():
    p = parse_shape(STEM)
    plan = make_plan(p, Mmafew.default(p, Precision.BF16))
    c = plan.context
    assert (c["cp"], c["run"], c["kr"], c["tail"], c["kp"]) == (4, 28, 2, 12, 224)
    # B rows an odd number of 16-byte units apart: the 8 rows of an ldmatrix in 8 bank quads
    assert c["b_pitch"] * 2 // 16 % 2 == 1
    # neighbouring output pixels' runs 16 bytes apart: an ldmatrix's 8 rows are one line
    assert c["pixel_step"] == 16


@pytest.mark.parametrize(
    "spec,cp",
    [
        (STEM, 4),
        (VGG_STEM, 8),
        (STEM.replace("C=3", "C=5"), 8),
        (STEM.replace("stride=2", "stride=2x3"), 8),
    ],
)
def test_channels_pad_to_four_only_where_every_run_starts_on_16_bytes(spec, cp):
    assert channels_padded(parse_shape(spec)) == cp


@pytest.mark.parametrize(
    "spec,name,words",
    [
        (STEM.replace("nhwc", "nchw"), "mmafew_r2_c112_w7_bf16", "layout=nhwc"),
        (STEM.replace("bf16", "fp32"), "mmafew_r2_c112_w7_bf16", "16-bit"),
        (STEM, "mmafew_r2_c112_w7_fp16", "--precision bf16"),
        (STEM.replace("C=3", "C=16"), "mmafew_r2_c112_w7_bf16", "at most 8"),
        (STEM.replace("M=64", "M=24"), "mmafew_r2_c112_w7_bf16", "multiple of 16"),
        (STEM + ",dil=2", "mmafew_r2_c112_w7_bf16", "cannot serve dilation"),
        (STEM, "mmafew_r2_c40_w5_bf16", "multiple of 16"),
        (STEM, "mmafew_r2_c112_w3_bf16", "evenly"),
        (STEM, "mmafew_r2_c112_w2_bf16", "fp32 sums"),
        (STEM, "mmafew_r17_c112_w7_bf16", "1 to 16"),
        (
            "C=8,M=128,H=64,W=64,K=11,pad=5,stride=2,dtype=bf16,layout=nhwc",
            "mmafew_r1_c16_w1_bf16",
            "shared memory",
        ),
    ],
)
def test_limits_are_one_line_refusals(spec, name, words):
    assert_one_line_refusal(spec, name, words)


def test_tune_space_plans_or_refuses_in_one_line():
    assert len(planned_space(parse_shape(STEM), Mmafew, Precision.BF16)) >= 12


@pytest.mark.parametrize(
    "spec",
    [
        STEM32,
        "C=4,M=32,H=19,W=23,K=2x5,pad=0x1x3x2,stride=3x2,bias=1,act=relu,dtype=fp16,layout=nhwc",
    ],
)
def test_every_planned_variant_of_the_tune_space_compiles_without_spills(spec):
    assert_space_compiles_without_spills(parse_shape(spec), Mmafew)


@settings(max_examples=DRAWN_COMPILES, deadline=None, suppress_health_check=list(HealthCheck))
@given(p=few_channel_problems(Mmafew))
def test_drawn_defaults_compile_without_spills(p):
    plan = make_plan(p, Mmafew.default(p, MATH[p.dtype]))
    binary = compile_source(render(plan), plan.name, plan.target("sm_90"))
    assert binary.spills == 0, (p.spec, plan.name, binary.resources)


def mmafew_model(x, w, p, cp):
    """The kernel's sum in NumPy, float64, as it walks: the patch of the whole image
    (channels padded to cp, zero outside), and for each output pixel and window row the
    run of S*cp elements from the pixel's first column, padded to whole k steps with the
    next pixels' elements (dropped), times the row's weights laid out as the kernel's B.
    x [H][W][C], w [M][C][R][S]; returns y [Ho][Wo][M]."""
    H, W, C = x.shape
    M, _, R, S = w.shape
    pt, pb, pl, pr = p.pads
    (sh, sw), run = p.stride, S * cp
    kr = -(-run // 16)
    padded = np.zeros((H + pt + pb + R, W + pl + pr + 2 * S + 16, cp))
    padded[pt : pt + H, pl : pl + W, :C] = x
    b = np.zeros((M, R, kr * 16))
    b[:, :, :run] = np.pad(w.transpose(0, 2, 3, 1), ((0, 0), (0, 0), (0, 0), (0, cp - C))).reshape(
        M, R, run
    )
    y = np.zeros((p.Ho, p.Wo, M))
    for oy in range(p.Ho):
        for ox in range(p.Wo):
            for ky in range(R):
                a = padded[oy * sh + ky, ox * sw :].reshape(-1)[: kr * 16].copy()
                a[run:] = 0.0  # the tail's lanes, dropped
                y[oy, ox] += b[:, ky] @ a
    return y


@pytest.mark.parametrize(
    "spec",
    [STEM32.replace("H=32,W=32", "H=11,W=13"), "C=5,M=16,H=9,W=10,K=3x4,pad=2x0x1x3,stride=1x3"],
)
def test_the_run_model_is_the_convolution(spec):
    """The layout the kernel rests on, against the reference (independent of it)."""
    p = parse_shape(spec)
    rng = np.random.default_rng()
    x = rng.standard_normal((1, p.C, p.H, p.W))
    w = rng.standard_normal((p.M, p.C, p.R, p.S))
    want = conv2d(x, w, p)[0].transpose(1, 2, 0)
    got = mmafew_model(x[0].transpose(1, 2, 0), w, p, channels_padded(p))
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


# ---- GPU tier ----


@pytest.mark.gpu
@settings(max_examples=25, **GPU_DRAWS)
@given(p=few_channel_problems(Mmafew), batch=st.integers(1, 5), pick=st.integers(0, 10**6))
def test_drawn_problems_on_the_gpu(p, batch, pick):
    """The default and one variant of tune's space against the float64 reference: tiles
    past the image's last row and column, runs past the window, padded channels, the
    window's zeros on every side, and blocks that walk several tiles."""
    verify_on_the_gpu(p, default_and_drawn(p, Mmafew, MATH[p.dtype], pick), batch)


@pytest.mark.gpu
@pytest.mark.parametrize("spec,batch", [(STEM, 32), (STEM32, 128), (VGG_STEM, 8)])
def test_stems_at_their_batch_on_the_gpu(spec, batch):
    p = parse_shape(spec)
    verify_on_the_gpu(p, [v for v in default_set(p) if v.key == "mmafew"], batch)
