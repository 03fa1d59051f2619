"""kn2row, the taps-as-columns tensor-core GEMM for layers of few maps: what the compiler
makes of it (CPU tier), its limits, a NumPy model of its two steps, and its numbers on
drawn problems (GPU tier)."""

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

from problems import (
    assert_one_line_refusal,
    default_and_drawn,
    planned_space,
    verify_on_the_gpu,
    DRAWN_COMPILES,
)
from specgen.compile import compile_source
from specgen.errors import SpecError
from specgen.plan import make_plan
from specgen.reference import conv2d
from specgen.render import render
from specgen.shapes import parse_shape
from specgen.strategies import Kn2row, default_set
from specgen.strategies.kn2row import z_stride
from specgen.variants import Precision
from ptx import ptx_of

AE_DEC3_BF16 = "C=256,M=3,H=32,W=32,K=3,pad=1,dtype=bf16,layout=nhwc"


def test_ae_dec3_bf16_compiles_without_spills_and_pipelines():
    """One GEMM over the band's pixels (ldmatrix, 16-byte cp.async, a wait that leaves
    stages - 2 chunks in flight, bf16 m16n8k16) and no per-tap walk of x."""
    p = parse_shape(AE_DEC3_BF16)
    (v,) = [x for x in default_set(p) if x.key == "kn2row"]
    plan = make_plan(p, v)
    binary = compile_source(render(plan), plan.name, plan.target("sm_90"))
    assert binary.spills == 0, (plan.name, binary.resources)
    ptx = ptx_of(plan)
    assert re.search(r"ldmatrix\.sync\.aligned\.m8n8\.x4\.shared\.b16", ptx)
    assert re.search(r"cp\.async\.cg\.shared\.global \[%r\d+\], \[%rd\d+\], 16", ptx)
    assert f"cp.async.wait_group {v.stages - 2};" in ptx
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx
    # 8 chunks of 32 channels, 8 copies of x a thread each: the x pixels are read once
    assert plan.context["kt"] == 8 and plan.context["columns"] == 27


def test_dgrad_of_a_three_channel_layer_goes_through_the_forward_view():
    p = parse_shape("C=3,M=256,H=32,W=32,K=3,pad=1,dtype=fp16,layout=nhwc,op=dgrad")
    (v,) = [x for x in default_set(p) if x.key == "kn2row"]
    plan = make_plan(p, v)
    assert plan.view.C == 256 and plan.view.M == 3
    assert compile_source(render(plan), plan.name, plan.target("sm_90")).spills == 0
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in ptx_of(plan)


@pytest.mark.parametrize(
    "spec,name,words",
    [
        (AE_DEC3_BF16.replace("nhwc", "nchw"), "kn2row_r8_w10_k32_p4_bf16", "nhwc"),
        (AE_DEC3_BF16.replace("bf16", "fp32"), "kn2row_r8_w10_k32_p4_bf16", "16-bit"),
        (AE_DEC3_BF16, "kn2row_r8_w10_k32_p4_fp16", "--precision bf16"),
        (AE_DEC3_BF16 + ",stride=2", "kn2row_r8_w10_k32_p4_bf16", "cannot serve stride 2"),
        (
            AE_DEC3_BF16.replace("M=3", "M=4") + ",groups=2",
            "kn2row_r8_w10_k32_p4_bf16",
            "cannot serve 2 groups",
        ),
        (AE_DEC3_BF16.replace("C=256", "C=12"), "kn2row_r8_w10_k32_p4_bf16", "multiple of 8"),
        (AE_DEC3_BF16.replace("M=3", "M=8"), "kn2row_r8_w10_k32_p4_bf16", "72 columns"),
        (AE_DEC3_BF16, "kn2row_r40_w5_k32_p4_bf16", "1 to 32"),
        (AE_DEC3_BF16, "kn2row_r8_w5_k48_p4_bf16", "32 or 64"),
        (AE_DEC3_BF16, "kn2row_r8_w5_k32_p1_bf16", "2 to 8"),
        (AE_DEC3_BF16, "kn2row_r8_w17_k32_p4_bf16", "1 to 16"),
        (AE_DEC3_BF16, "kn2row_r8_w2_k32_p4_bf16", "--warps 3"),
        (AE_DEC3_BF16, "kn2row_r32_w16_k64_p8_bf16", "shared memory"),
    ],
)
def test_limits_are_one_line_refusals(spec, name, words):
    assert_one_line_refusal(spec, name, words)


def test_tune_space_plans_or_refuses_in_one_line():
    assert len(planned_space(parse_shape(AE_DEC3_BF16), Kn2row, Precision.BF16)) >= 20


@pytest.mark.parametrize(
    "spec",
    [
        AE_DEC3_BF16,
        # a 10-warp k64 variant spilled here at the 168 registers ptxas gives 10 warps
        "C=216,M=3,H=18,W=21,K=4x5,pad=0x2x1x2,dil=2,bias=1,act=relu,dtype=bf16,layout=nhwc",
    ],
)
def test_every_planned_variant_of_the_tune_space_compiles_without_spills(spec):
    """The planner's register estimate refuses what would spill, so tune never times a
    spilling kernel and the drawn GPU tests never meet one."""
    p = parse_shape(spec)
    for v in planned_space(p, Kn2row, own(p)):
        plan = make_plan(p, v)
        binary = compile_source(render(plan), plan.name, plan.target("sm_90"))
        assert binary.spills == 0, (plan.name, binary.resources)


def test_z_rows_put_consecutive_outputs_in_distinct_banks():
    for maps, columns in ((3, 27), (1, 9), (5, 45), (7, 63), (2, 50)):
        zs = z_stride(maps, columns)
        assert zs >= columns
        # consecutive outputs (pixel q, map m) of a warp: 32 in a row of y's order
        banks = {(q * zs + m) % 32 for o in range(32) for q, m in [divmod(o, maps)]}
        assert len(banks) == 32


@st.composite
def kn2row_problems(draw):
    """Problems kn2row serves: stride 1, one group, channels a multiple of 8, taps x maps
    at most 64; any window, dilation and padding (wide, unequal), bias and relu, both
    16-bit dtypes; the forward pass, and dgrad where its view has few maps."""
    op = draw(st.sampled_from(["fprop", "fprop", "dgrad"]))
    dtype = draw(st.sampled_from(["bf16", "fp16"]))
    R, S = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    maps = draw(st.integers(1, max(1, 64 // (R * S))))
    wide = 8 * draw(st.integers(1, 40))
    C, M = (wide, maps) if op == "fprop" else (maps, wide)
    H, W = draw(st.integers(R, 24)), draw(st.integers(S, 24))
    dil = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    pads = "x".join(str(draw(st.integers(0, 3))) for _ in range(4))
    spec = (
        f"C={C},M={M},H={H},W={W},K={R}x{S},pad={pads},dil={dil[0]}x{dil[1]},"
        f"dtype={dtype},layout=nhwc,op={op}"
    )
    if op == "fprop" and draw(st.booleans()):
        spec += ",bias=1"
    if op == "fprop" and draw(st.booleans()):
        spec += ",act=relu"
    try:
        p = parse_shape(spec)
        make_plan(p, Kn2row.default(Kn2row.problem_for(p), own(p)))
        return p
    except SpecError:
        assume(False)


def own(p):
    return Precision(p.dtype.value)


@settings(max_examples=DRAWN_COMPILES, deadline=None, suppress_health_check=list(HealthCheck))
@given(p=kn2row_problems())
def test_drawn_defaults_compile_without_spills(p):
    plan = make_plan(p, Kn2row.default(Kn2row.problem_for(p), own(p)))
    binary = compile_source(render(plan), plan.name, plan.target("sm_90"))
    assert binary.spills == 0, (p.spec, plan.name, binary.resources)


def kn2row_model(x, w, pads, dil):
    """The kernel's two steps in NumPy, float64: Z = x . w as [pixels x C] . [C x (taps,
    maps)], then each output the sum of its taps' columns at the shifted pixels (zero
    outside x).  x [H][W][C], w [M][C][R][S]; returns y [Ho][Wo][M]."""
    H, W, C = x.shape
    M, _, R, S = w.shape
    pt, pb, pl, pr = pads
    Ho, Wo = H + pt + pb - (R - 1) * dil[0], W + pl + pr - (S - 1) * dil[1]
    z = x.reshape(H * W, C) @ w.transpose(1, 2, 3, 0).reshape(C, R * S * M)
    z = z.reshape(H, W, R, S, M)
    y = np.zeros((Ho, Wo, M))
    for r in range(R):
        for s in range(S):
            for oh in range(Ho):
                ih = oh - pt + r * dil[0]
                if 0 <= ih < H:
                    for ow in range(Wo):
                        iw = ow - pl + s * dil[1]
                        if 0 <= iw < W:
                            y[oh, ow] += z[ih, iw, r, s]
    return y


@pytest.mark.parametrize(
    "spec",
    [AE_DEC3_BF16.replace("H=32,W=32", "H=7,W=6"), "C=16,M=2,H=6,W=9,K=2x3,pad=3x0x1x2,dil=2x1"],
)
def test_the_shift_add_model_is_the_convolution(spec):
    """The identity the kernel rests on, against the reference (independent of it)."""
    p = parse_shape(spec)
    rng = np.random.default_rng()
    x = rng.standard_normal((1, p.C, p.H, p.W))
    w = rng.standard_normal((p.M, p.C, p.R, p.S))
    want = conv2d(x, w, p)[0].transpose(1, 2, 0)
    got = kn2row_model(x[0].transpose(1, 2, 0), w, p.pads, p.dil)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


# ---- GPU tier ----


@pytest.mark.gpu
@pytest.mark.parametrize("shard", range(2))  # two draws, side by side
@settings(
    max_examples=13,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
)
@given(p=kn2row_problems(), batch=st.integers(1, 5), pick=st.integers(0, 10**6))
def test_drawn_problems_on_the_gpu(shard, p, batch, pick):
    """The default and one variant of tune's space against the float64 reference: bands
    past the image's last row, pixels past the band's last warp, columns past the taps x
    maps, channels past the chunk, and the window's zeros on every side."""
    verify_on_the_gpu(p, default_and_drawn(p, Kn2row, own(p), pick), batch)


@pytest.mark.gpu
def test_ae_dec3_bf16_at_the_default_batch_on_the_gpu():
    p = parse_shape(AE_DEC3_BF16)
    verify_on_the_gpu(p, [v for v in default_set(p) if v.key == "kn2row"], 128)
