"""wgmma, the implicit GEMM on Hopper's warpgroup tensor cores: what ptxas makes of it
for sm_90a (CPU tier), its limits and architecture, the planner's choice, and its
numbers on drawn problems (GPU tier)."""

import re

import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

from problems import default_and_drawn, verify_on_the_gpu
from specgen.choose import planned
from specgen.compile import compile_source, options_for
from specgen.errors import SpecError
from specgen.plan import make_plan
from specgen.render import render
from specgen.shapes import PRESETS, Op, parse_shape
from specgen.strategies import Wgmma, default_set, parse_variant_name
from specgen.strategies.tcgemm import MATH
from specgen.variants import Precision

AE_ENC2_BF16 = "C=256,M=128,H=16,W=16,K=3,pad=1,dtype=bf16,layout=nhwc"
AE_ENC2_TF32 = "C=256,M=128,H=16,W=16,K=3,pad=1,bias=1,layout=nhwc"  # fp32 tensors
SERIALIZED = "C7514"  # ptxas: wgmma.mma_async instructions are serialized


def compiled(plan):
    return compile_source(render(plan), plan.name, plan.target("sm_90"))


def ptx_of(plan) -> str:
    from cupy_backends.cuda.libs import nvrtc

    prog = nvrtc.createProgram(render(plan), f"{plan.name}.cu", [], [])
    try:
        nvrtc.compileProgram(prog, list(options_for(plan.target("sm_90"))))
        return nvrtc.getPTX(prog).decode()
    finally:
        nvrtc.destroyProgram(prog)


def test_ae_enc2_bf16_compiles_for_sm_90a_with_wgmma_from_shared_memory():
    """The issue's CPU check for the sm_90 path: no spills, the multiplies not
    serialized by ptxas, and in the PTX the warpgroup MMA with its fences and the
    16-byte cp.async copies that feed it."""
    p = PRESETS["ae-enc2-bf16"]
    (v,) = [x for x in default_set(p) if x.key == "wgmma"]
    plan = make_plan(p, v)
    assert plan.target("sm_90") == "sm_90a"
    binary = compiled(plan)
    assert binary.arch == "sm_90a"
    assert binary.spills == 0, binary.resources
    assert SERIALIZED not in binary.log
    ptx = ptx_of(plan)
    bn = v.blocktile[0]
    assert f"wgmma.mma_async.sync.aligned.m64n{bn}k16.f32.bf16.bf16" in ptx
    assert f"wgmma.wait_group.sync.aligned {v.inflight - 1};" in ptx
    assert "fence.proxy.async.shared::cta;" in ptx  # cp.async writes, wgmma reads
    assert re.search(r"cp\.async\.cg\.shared\.global \[%r\d+\], \[%rd\d+\], 16", ptx)
    if v.producer:  # the producer warpgroup and the consumers meet at mbarriers
        assert "mbarrier.try_wait.parity.acquire.cta.shared::cta.b64" in ptx
        assert "mbarrier.arrive.release.cta.shared::cta.b64" in ptx


@pytest.mark.parametrize("op", [Op.FPROP, Op.DGRAD])
def test_ae_enc2_fp32_channels_last_runs_wgmma_in_tf32(op):
    """fp32 channels-last tensors: 32 channels a 128-byte row, m64nNk8 tf32 products
    read from the same swizzled ring, fp32 stored whole; the planner takes it where tf32
    is allowed, and the bound counts the operands truncated."""
    from specgen.reference import U_HALF, error_coefficient

    p = parse_shape(AE_ENC2_TF32).with_op(op)
    v = planned(p, True).variant
    assert (v.key, v.precision) == ("wgmma", Precision.TF32)
    assert planned(p, False).variant.key != "wgmma"  # fp32 math where tf32 is not allowed
    plan = make_plan(p, v)
    binary = compiled(plan)
    assert binary.spills == 0 and SERIALIZED not in binary.log, binary.resources
    ptx = ptx_of(plan)
    assert f"wgmma.mma_async.sync.aligned.m64n{v.blocktile[0]}k8.f32.tf32.tf32" in ptx
    assert "cvt.rn" not in ptx and "cvt.rna" not in ptx  # nothing rounded on the way
    assert plan.weight_format == "mrsc.fp32"
    gamma = error_coefficient(v, Wgmma.problem_for(p), 1)
    assert gamma >= 4 * U_HALF


def _deadlocks(stages: int, inflight: int, lag: int, chunks: int) -> bool:
    """The ws protocol stepped as the kernel runs it: the producer loads chunk k once
    chunk k - stages is retired and announces chunk k - lag after loading chunk k (the
    rest after its loop); the consumers multiply chunk k once announced and retire chunk
    k - inflight + 1 after it.  True when neither side can move."""
    announced, retired, k_prod, k_cons, drained = set(), set(), 0, 0, False
    while k_cons < chunks:
        moved = False
        if k_prod < chunks and (k_prod < stages or k_prod - stages in retired):
            if k_prod >= lag:
                announced.add(k_prod - lag)
            k_prod, moved = k_prod + 1, True
        elif k_prod == chunks and not drained:
            announced |= set(range(max(chunks - lag, 0), chunks))
            drained = moved = True
        if k_cons in announced:
            if k_cons >= inflight - 1:
                retired.add(k_cons - inflight + 1)
            k_cons, moved = k_cons + 1, True
        if not moved:
            return True
    return False


def test_the_producer_protocol_cannot_deadlock():
    """Every ring and overlap of the tune space, with the lag the plan gives the
    template, over walks of 1 to 40 chunks; and the lag of stages - 1 that hung on the
    H200 is caught."""
    p = parse_shape(AE_ENC2_BF16)
    for v in Wgmma.space(p, Precision.BF16):
        try:
            ctx = make_plan(p, v).context
        except SpecError:
            continue
        for chunks in range(1, 41):
            assert not _deadlocks(v.stages, v.inflight, ctx["lag"], chunks), (v.name, chunks)
    assert _deadlocks(4, 2, 3, 10)


def test_every_tune_candidate_plans_or_refuses_and_compiles_unserialized():
    p = parse_shape(AE_ENC2_BF16)
    planned_count = 0
    for v in Wgmma.space(p, Precision.BF16):
        try:
            plan = make_plan(p, v)
        except SpecError as e:
            assert "\n" not in str(e)
            continue
        planned_count += 1
        binary = compiled(plan)
        assert binary.spills == 0 and SERIALIZED not in binary.log, (plan.name, binary.resources)
    assert planned_count >= 8


def test_the_planner_picks_wgmma_for_wide_16_bit_layers_and_not_off_hopper():
    for name in ("ae-enc2-bf16", "ae-dec2-bf16"):
        p = PRESETS[name]
        assert planned(p, False).variant.key == "wgmma"
        assert planned(p.with_op(Op.DGRAD), False).variant.key == "wgmma"
        assert planned(p, False, arch="sm_80").variant.key == "tcgemm"
        assert planned(p, False, arch="sm_90").variant.key == "wgmma"
    assert not [v for v in default_set(PRESETS["ae-enc2"]) if v.key == "wgmma"]  # fp32 NCHW


def test_the_planner_runs_16_bit_layers_of_few_channels_on_mma_and_fp32_ones_not():
    """3 channels: neither wgmma nor tcgemm copies them, mma's own-dtype math does; an
    fp32 layer keeps fp32 math even where tf32 is allowed, and a wide 16-bit NCHW layer
    stays on stream."""
    for dtype in ("bf16", "fp16"):
        p = parse_shape(f"C=3,M=256,H=32,W=32,K=3,pad=1,bias=1,dtype={dtype},layout=nhwc")
        v = planned(p, False).variant
        assert v.key == "mma" and v.precision.value == dtype
        dgrad = parse_shape(f"C=256,M=3,H=32,W=32,K=3,pad=1,dtype={dtype},layout=nhwc,op=dgrad")
        assert planned(dgrad, False).variant.key == "mma"
    fp32 = parse_shape("C=3,M=256,H=32,W=32,K=3,pad=1,bias=1")
    for tf32 in (False, True):
        assert planned(fp32, tf32).variant.key != "mma"
    wide = parse_shape("C=128,M=128,H=8,W=8,K=3,pad=1,dtype=bf16")  # NCHW: stream's fp32
    assert planned(wide, False).variant.key == "stream"


@pytest.mark.parametrize(
    "spec,name,words",
    [
        ("C=256,M=128,H=16,W=16,K=3,pad=1", "wgmma_b256x128_p4_q2_gr_ws_bf16", "nhwc"),
        (AE_ENC2_TF32, "wgmma_b256x128_p4_q2_gr_ws_bf16", "--precision tf32"),
        (AE_ENC2_TF32.replace("C=256", "C=6"), "wgmma_b128x128_p4_q1_gr_sy_tf32", "multiple of 4"),
        (AE_ENC2_BF16.replace("nhwc", "nchw"), "wgmma_b256x128_p4_q2_gr_ws_bf16", "nhwc"),
        (AE_ENC2_BF16, "wgmma_b256x128_p4_q2_gr_ws_fp16", "--precision bf16"),
        (AE_ENC2_BF16.replace("C=256", "C=12"), "wgmma_b256x128_p4_q2_gr_ws_bf16", "multiple of 8"),
        (AE_ENC2_BF16.replace("M=128", "M=100"), "wgmma_b256x128_p4_q2_gr_ws_bf16", "tcgemm"),
        (AE_ENC2_BF16, "wgmma_b96x128_p4_q2_gr_ws_bf16", "wgmma's N"),
        (AE_ENC2_BF16, "wgmma_b256x96_p4_q2_gr_ws_bf16", "64 maps"),
        (AE_ENC2_BF16, "wgmma_b256x64_p4_q2_gr_sy_bf16", "registers"),
        (AE_ENC2_BF16, "wgmma_b128x256_p4_q2_gr_ws_bf16", "registers"),
        (AE_ENC2_BF16, "wgmma_b256x128_p5_q2_gr_ws_bf16", "--stages 4"),
        (AE_ENC2_BF16, "wgmma_b256x128_p2_q2_gr_ws_bf16", "3 to 8"),
        (AE_ENC2_BF16, "wgmma_b256x128_p4_q3_gr_ws_bf16", "one or two"),
        (AE_ENC2_BF16, "wgmma_b128x128_p4_q2_pe_ws_bf16", "persistent form"),
        (AE_ENC2_BF16, "wgmma_b256x128_p3_q1_pe_sy_bf16", "registers"),
    ],
)
def test_limits_are_one_line_refusals(spec, name, words):
    with pytest.raises(SpecError) as e:
        make_plan(parse_shape(spec), parse_variant_name(name))
    assert words in str(e.value) and "\n" not in str(e.value)


def test_the_plan_names_its_architecture():
    plan = make_plan(PRESETS["ae-enc2-bf16"], parse_variant_name("wgmma_b256x128_p4_q2_gr_ws_bf16"))
    assert plan.target("sm_90a") == "sm_90a"
    with pytest.raises(SpecError) as e:
        plan.target("sm_80")
    assert "sm_90a" in str(e.value) and "tcgemm" in str(e.value)
    other = make_plan(
        PRESETS["ae-enc2-bf16"], parse_variant_name("tcgemm_b128x128_w2x2_k32_p4_bf16")
    )
    assert other.target("sm_80") == "sm_80"


# ---- GPU tier ----


@st.composite
def wgmma_problems(draw):
    """Problems wgmma serves: channels and maps multiples of 8 per group (4 in fp32,
    multiplied as tf32), stride, dilation, every padding, bias and relu, the three
    dtypes; forward and dgrad."""
    groups = draw(st.sampled_from([1, 1, 2, 3]))
    dtype = draw(st.sampled_from(["bf16", "fp16", "fp32"]))
    vec = 4 if dtype == "fp32" else 8
    cg = vec * draw(st.integers(1, 160 // vec))
    mg = vec * draw(st.integers(1, 192 // vec))
    op = draw(st.sampled_from(["fprop", "fprop", "dgrad"]))
    R, S = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    H, W = draw(st.integers(R, 21)), draw(st.integers(S, 21))
    stride = (1, 1) if op == "dgrad" else (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    dil = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    pads = "x".join(str(draw(st.integers(0, 2))) for _ in range(4))
    spec = (
        f"C={groups * cg},M={groups * mg},H={H},W={W},K={R}x{S},pad={pads},"
        f"stride={stride[0]}x{stride[1]},dil={dil[0]}x{dil[1]},groups={groups},"
        f"dtype={dtype},layout=nhwc,op={op}"
    )
    if op == "fprop" and draw(st.booleans()):
        spec += ",bias=1"
    if op == "fprop" and draw(st.booleans()):
        spec += ",act=relu"
    try:
        p = parse_shape(spec)
        Wgmma.problem_for(p)  # dgrad: padding past the window's reach has none
        return p
    except SpecError:
        assume(False)


@pytest.mark.gpu
@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
)
@given(p=wgmma_problems(), batch=st.integers(1, 5), pick=st.integers(0, 10**6))
def test_drawn_problems_on_the_gpu(p, batch, pick):
    """The default variant and one drawn from tune's space, against the float64
    reference: pixels past the batch, maps past the tile, channels past the chunk,
    the window's zero-fill, and the staged epilogue's bias and relu."""
    precision = MATH[p.dtype]
    verify_on_the_gpu(p, default_and_drawn(p, Wgmma, precision, pick), batch)


@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(p=wgmma_problems())
def test_drawn_defaults_compile_without_spills(p):
    view = Wgmma.problem_for(p)
    for precision in Wgmma.precisions:
        try:
            v = Wgmma.default(view, precision)
        except SpecError:
            continue
        binary = compiled(make_plan(p, v))
        assert binary.spills == 0 and SERIALIZED not in binary.log, (p.spec, v.name)
