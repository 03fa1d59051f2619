"""wfew, the tensor-core wgrad of channels-last layers of few input channels (a network's
stem): what the compiler makes of it (CPU tier), its limits, a NumPy model of its runs,
and its numbers on drawn problems (GPU tier)."""

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import problems
from problems import (
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
from specgen.reference import conv2d_wgrad
from specgen.render import render
from specgen.shapes import parse_shape
from specgen.strategies import Wfew, default_set
from specgen.strategies.mmafew import channels_padded
from specgen.strategies.tcgemm import MATH
from specgen.variants import Precision

STEM, STEM32, VGG = (s + ",op=wgrad" for s in (problems.STEM, problems.STEM32, problems.VGG_STEM))


@pytest.mark.parametrize("spec", [STEM, STEM32, VGG])
def test_stems_compile_without_spills_on_transposed_ldmatrix_and_mma(spec):
    """Both operands are transposed ldmatrix reads of the tile (dy's and the patch's),
    the products bf16 m16n8k16, dy copied by 16-byte cp.async, the slices added in order
    by the second kernel."""
    p = parse_shape(spec)
    (v,) = [x for x in default_set(p) if x.key == "wfew"]
    plan = make_plan(p, v)
    binary = compile_source(render(plan), plan.name, plan.target("sm_90"))
    assert binary.spills == 0, (plan.name, binary.resources)
    ptx = ptx_of(plan)
    assert re.search(r"ldmatrix\.sync\.aligned\.m8n8\.x4\.trans\.shared\.b16", ptx)
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx
    assert re.search(r"cp\.async\.cg\.shared\.global \[%r\d+\], \[%rd\d+\], 16", ptx)
    assert [launch.kernel for launch in plan.launches] == [plan.name, plan.name + "_reduce"]
    c = plan.context
    mmas = c["steps"] * c["fm"] * (c["fn"] + (1 if p.bias else 0))
    assert len(re.findall(r"mma\.sync", ptx)) == mmas


def test_the_stems_run_is_two_n8_pairs_and_dy_rows_miss_each_others_banks():
    c = make_plan(parse_shape(STEM), Wfew.default(parse_shape(STEM), Precision.BF16)).context
    assert (c["cp"], c["run"], c["kr"], c["fn"], c["warps"]) == (4, 28, 2, 4, 7)
    # D's pixel rows an odd number of 16-byte units apart: a transposed ldmatrix's 8 rows
    # fall in 8 bank quads
    assert c["d_pitch"] % 16 == 0 and c["d_pitch"] // 16 % 2 == 1


@pytest.mark.parametrize(
    "spec,name,words",
    [
        (STEM.replace("nhwc", "nchw"), "wfew_r4_c32_m1_s132_bf16", "layout=nhwc"),
        (STEM.replace("bf16", "fp32"), "wfew_r4_c32_m1_s132_bf16", "16-bit"),
        (STEM, "wfew_r4_c32_m1_s132_fp16", "--precision bf16"),
        (STEM.replace("C=3", "C=12"), "wfew_r4_c32_m1_s132_bf16", "at most 8"),
        (STEM.replace("M=64", "M=40"), "wfew_r4_c32_m1_s132_bf16", "multiple of 16"),
        (STEM + ",dil=2", "wfew_r4_c32_m1_s132_bf16", "cannot serve dilation"),
        (STEM, "wfew_r4_c24_m1_s132_bf16", "multiple of 16"),
        (STEM, "wfew_r4_c32_m3_s132_bf16", "evenly"),
        (STEM, "wfew_r4_c32_m4_s132_bf16", "over 16"),
        (STEM.replace("M=64", "M=128"), "wfew_r4_c32_m1_s132_bf16", "fp32 sums"),
        (STEM, "wfew_r4_c32_m1_s70000_bf16", "65535"),
        (STEM, "wfew_r16_c256_m1_s132_bf16", "shared memory"),
    ],
)
def test_limits_are_one_line_refusals(spec, name, words):
    assert_one_line_refusal(spec, name, words)


def test_tune_space_plans_or_refuses_in_one_line():
    assert len(planned_space(parse_shape(STEM), Wfew, Precision.BF16)) >= 20


@pytest.mark.parametrize(
    "spec",
    [
        STEM32,
        "C=5,M=32,H=19,W=23,K=2x5,pad=0x1x3x2,stride=3x2,bias=1,dtype=fp16,layout=nhwc,op=wgrad",
    ],
)
def test_every_planned_variant_of_the_tune_space_compiles_without_spills(spec):
    assert_space_compiles_without_spills(parse_shape(spec), Wfew)


@settings(max_examples=DRAWN_COMPILES, deadline=None, suppress_health_check=list(HealthCheck))
@given(p=few_channel_problems(Wfew, "wgrad"))
def test_drawn_defaults_compile_without_spills(p):
    plan = make_plan(p, Wfew.default(p, MATH[p.dtype]))
    binary = compile_source(render(plan), plan.name, plan.target("sm_90"))
    assert binary.spills == 0, (p.spec, plan.name, binary.resources)


def wfew_model(x, dy, p, cp):
    """The kernel's sums in NumPy, float64, as it walks: for each window row, the runs
    of the output pixels (S*cp elements of the padded image from the pixel's first
    column, padded to whole k steps) times dy, summed over the pixels; dw's columns are
    the run's elements of a real tap and channel.  x [H][W][C], dy [Ho][Wo][M]; returns
    dw [M][C][R][S]."""
    H, W, C = x.shape
    M = dy.shape[2]
    pt, pb, pl, pr = p.pads
    (sh, sw), run = p.stride, p.S * cp
    kr = -(-run // 16)
    padded = np.zeros((H + pt + pb + p.R, W + pl + pr + 2 * p.S + 16, cp))
    padded[pt : pt + H, pl : pl + W, :C] = x
    cols = np.zeros((M, p.R, kr * 16))
    for oy in range(p.Ho):
        for ox in range(p.Wo):
            for ky in range(p.R):
                runs = padded[oy * sh + ky, ox * sw :].reshape(-1)[: kr * 16]
                cols[:, ky] += np.outer(dy[oy, ox], runs)
    dw = cols[:, :, :run].reshape(M, p.R, p.S, cp)[..., :C]
    return dw.transpose(0, 3, 1, 2)


@pytest.mark.parametrize(
    "spec",
    [
        STEM32.replace("H=32,W=32", "H=11,W=13"),
        "C=5,M=16,H=9,W=10,K=3x4,pad=2x0x1x3,stride=1x3,op=wgrad",
    ],
)
def test_the_run_model_is_the_weight_gradient(spec):
    """The layout the kernel rests on, against the reference (independent of it)."""
    p = parse_shape(spec)
    rng = np.random.default_rng()
    x = rng.standard_normal((1, p.C, p.H, p.W))
    dy = rng.standard_normal((1, p.M, p.Ho, p.Wo))
    want = conv2d_wgrad(x, dy, p)
    got = wfew_model(x[0].transpose(1, 2, 0), dy[0].transpose(1, 2, 0), p, channels_padded(p))
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


# ---- GPU tier ----


@pytest.mark.gpu
@settings(max_examples=25, **GPU_DRAWS)
@given(p=few_channel_problems(Wfew, "wgrad"), batch=st.integers(1, 5), pick=st.integers(0, 10**6))
def test_drawn_problems_on_the_gpu(p, batch, pick):
    """The default and one variant of tune's space against the float64 reference: tiles
    past the image's last row and column, runs past the window, padded channels, the
    window's zeros on every side, blocks with several tiles and blocks with none, db."""
    verify_on_the_gpu(p, default_and_drawn(p, Wfew, MATH[p.dtype], pick), batch)


@pytest.mark.gpu
@pytest.mark.parametrize("spec,batch", [(STEM, 32), (STEM32, 128), (VGG, 8)])
def test_stems_at_their_batch_on_the_gpu(spec, batch):
    p = parse_shape(spec)
    verify_on_the_gpu(p, [v for v in default_set(p) if v.key == "wfew"], batch)
