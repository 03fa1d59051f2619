"""tcgemm, the pipelined tensor-core implicit GEMM: what the compiler makes of it (CPU
tier), its limits, its weight packing, and its numbers on drawn problems (GPU tier)."""

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

from problems import default_and_drawn, verify_on_the_gpu
from specgen.compile import compile_source, options_for
from specgen.errors import SpecError
from specgen.plan import make_plan
from specgen.render import render
from specgen.runtime import pack_weights, to_bits16
from specgen.shapes import PRESETS, DType, Op, TensorLayout, parse_shape
from specgen.variants import Precision
from specgen.strategies import Tcgemm, Tcwgrad, default_set, parse_variant_name

AE_ENC2_BF16 = "C=256,M=128,H=16,W=16,K=3,pad=1,dtype=bf16,layout=nhwc"


def ptx_of(plan) -> str:
    from cupy_backends.cuda.libs import nvrtc

    prog = nvrtc.createProgram(render(plan), f"{plan.name}.cu", [], [])
    try:
        nvrtc.compileProgram(prog, list(options_for("sm_90")))
        return nvrtc.getPTX(prog).decode()
    finally:
        nvrtc.destroyProgram(prog)


def test_ae_enc2_bf16_nhwc_compiles_without_spills_and_pipelines():
    """The issue's CPU check: ldmatrix reads, 16-byte cp.async copies, a wait that
    leaves stages - 2 chunks in flight, and bf16 m16n8k16 mma in the PTX."""
    p = parse_shape(AE_ENC2_BF16)
    for v in [x for x in default_set(p) if x.key == "tcgemm"] + [
        parse_variant_name("tcgemm_b128x128_w2x2_k32_p4_bf16")
    ]:
        plan = make_plan(p, v)
        binary = compile_source(render(plan), plan.name, plan.target("sm_90"))
        assert binary.spills == 0, (plan.name, binary.resources)
        ptx = ptx_of(plan)
        assert re.search(r"ldmatrix\.sync\.aligned\.m8n8\.x4\.shared\.b16", ptx)
        assert re.search(r"cp\.async\.cg\.shared\.global \[%r\d+\], \[%rd\d+\], 16", ptx)
        assert f"cp.async.wait_group {v.stages - 2};" in ptx
        assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx


def test_fp32_channels_last_compiles_to_tf32_mma_without_spills():
    """fp32 NHWC tensors on tcgemm and tcwgrad: the same rings (a 16-byte unit is 4
    channels), each fragment word rounded to tf32, m16n8k8 products, fp32 stores."""
    for spec in (
        "C=256,M=128,H=16,W=16,K=3,pad=1,layout=nhwc",
        "C=128,M=256,H=16,W=16,K=3,pad=1,layout=nhwc,op=dgrad",
        "C=256,M=128,H=16,W=16,K=3,pad=1,bias=1,layout=nhwc,op=wgrad",
    ):
        p = parse_shape(spec)
        cls = strategy_for(p)
        v = cls.default(cls.problem_for(p), Precision.TF32)
        plan = make_plan(p, v)
        binary = compile_source(render(plan), plan.name, plan.target("sm_90"))
        assert binary.spills == 0, (plan.name, binary.resources)
        ptx = ptx_of(plan)
        assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in ptx
        assert "cvt.rna.tf32.f32" in ptx
        assert f"cp.async.wait_group {v.stages - 2};" in ptx
        if cls is Tcgemm:
            assert plan.weight_format == "mrsc.fp32"
            assert re.search(r"ldmatrix\.sync\.aligned\.m8n8\.x4\.shared\.b16", ptx)
        else:  # wgrad's transposed reads: one 32-bit word at a time
            assert "ld.shared.f32" in ptx


def test_default_set_of_16_bit_channels_last_holds_tcgemm_in_the_tensors_dtype():
    for dtype in ("bf16", "fp16"):
        p = parse_shape(f"C=128,M=256,H=16,W=16,K=3,pad=1,dtype={dtype},layout=nhwc")
        tc = [v for v in default_set(p) if v.key == "tcgemm"]
        assert [v.precision.value for v in tc] == [dtype]
    assert not [v for v in default_set(PRESETS["ae-enc2"]) if v.key == "tcgemm"]


@pytest.mark.parametrize(
    "spec,name,words",
    [
        ("C=256,M=128,H=16,W=16,K=3,pad=1", "tcgemm_b128x128_w2x2_k32_p4_tf32", "nhwc"),
        (
            "C=256,M=128,H=16,W=16,K=3,pad=1,layout=nhwc",
            "tcgemm_b128x128_w2x2_k32_p4_bf16",
            "--precision tf32",
        ),
        (
            "C=254,M=128,H=16,W=16,K=3,pad=1,layout=nhwc",
            "tcgemm_b128x128_w2x2_k32_p4_tf32",
            "multiple of 4",
        ),
        (
            "C=256,M=128,H=16,W=16,K=3,pad=1,layout=nhwc",
            "tcgemm_b128x128_w2x2_k64_p4_tf32",
            "16 or 32",
        ),
        (AE_ENC2_BF16.replace("nhwc", "nchw"), "tcgemm_b128x128_w2x2_k32_p4_bf16", "nhwc"),
        (AE_ENC2_BF16, "tcgemm_b128x128_w2x2_k32_p4_fp16", "--precision bf16"),
        (AE_ENC2_BF16.replace("C=256", "C=12"), "tcgemm_b128x128_w2x2_k32_p4_bf16", "8"),
        (AE_ENC2_BF16, "tcgemm_b128x128_w2x2_k48_p4_bf16", "32 or 64"),
        (AE_ENC2_BF16, "tcgemm_b128x128_w1x1_k32_p4_bf16", "--warpgrid"),
        (AE_ENC2_BF16, "tcgemm_b128x96_w2x4_k32_p4_bf16", "multiple of 16"),
        (AE_ENC2_BF16, "tcgemm_b256x128_w4x2_k64_p8_bf16", "--stages 4"),
        (AE_ENC2_BF16, "tcgemm_b128x128_w2x2_k32_p1_bf16", "2 to 8"),
        (AE_ENC2_BF16, "tcgemm_b128x256_w2x8_k32_p4_bf16", "registers"),
    ],
)
def test_limits_are_one_line_refusals(spec, name, words):
    with pytest.raises(SpecError) as e:
        make_plan(parse_shape(spec), parse_variant_name(name))
    assert words in str(e.value) and "\n" not in str(e.value)


def test_bf16_bits_round_to_nearest_even():
    one = 1.0
    w = np.array([one, one + 2**-8, one + 3 * 2**-8, -2.5, 1e-40, 3.0e38], np.float32)
    bits = to_bits16(w, "bf16")
    back = (bits.astype(np.uint32) << 16).view(np.float32)
    # ties go to the even neighbour: 1 + 2^-8 -> 1, 1 + 3 * 2^-8 -> 1 + 2^-6
    assert back.tolist()[:4] == [1.0, 1.0, 1.0 + 2**-6, -2.5]
    assert abs(back[4] - 1e-40) <= 2**-133 and np.isfinite(back[5])
    assert (to_bits16(w[:5], "fp16") == w[:5].astype(np.float16).view(np.uint16)).all()


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_weights_pack_as_maps_taps_channels(dtype):
    """[M][C/g][R][S] -> [M][R][S][C/g] in the 16-bit dtype, and the index gather the
    PyTorch operator uses picks the same elements."""
    rng = np.random.default_rng()
    w = rng.standard_normal((6, 8, 3, 2)).astype(np.float32)
    packed = pack_weights(w, f"mrsc.{dtype}")
    assert packed.dtype == np.uint16 and packed.shape == (w.size,)
    want = to_bits16(np.ascontiguousarray(w.transpose(0, 2, 3, 1)).reshape(-1), dtype)
    assert (packed == want).all()
    ids = pack_weights(np.arange(w.size).reshape(w.shape), f"mrsc.{dtype}")
    assert (to_bits16(w.reshape(-1)[ids], dtype) == packed).all()


def test_tune_space_plans_or_refuses_in_one_line():
    p = parse_shape(AE_ENC2_BF16)
    planned = 0
    for v in Tcgemm.space(p, Tcgemm.precisions[0]):
        try:
            make_plan(p, v)
            planned += 1
        except SpecError as e:
            assert "\n" not in str(e)
    assert planned >= 30


# ---- GPU tier ----


def strategy_for(p):
    return Tcwgrad if p.op is Op.WGRAD else Tcgemm


@st.composite
def tc_problems(draw):
    """Problems tcgemm serves: channels a multiple of 8 per group (4 in fp32), any maps, stride,
    dilation, every padding, bias and relu, both 16-bit dtypes and fp32 (tf32 math);
    forward, dgrad and wgrad (with db where the layer has a bias)."""
    groups = draw(st.sampled_from([1, 1, 2, 3]))
    op = draw(st.sampled_from(["fprop", "fprop", "dgrad", "wgrad"]))
    dtype = draw(st.sampled_from(["bf16", "fp16", "fp32"]))
    cg = (4 if dtype == "fp32" else 8) * draw(st.integers(1, 9))  # a 16-byte copy's channels
    # dgrad's forward view reads dy's maps as its channels; wgrad copies 8 maps at once
    mg = 8 * draw(st.integers(1, 9)) if op != "fprop" else draw(st.integers(1, 72))
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
    if op != "dgrad" and draw(st.booleans()):
        spec += ",bias=1"  # wgrad's db
    if op == "fprop" and draw(st.booleans()):
        spec += ",act=relu"
    try:
        p = parse_shape(spec)
        strategy_for(p).problem_for(p)  # dgrad: padding past the window's reach has none
        return p
    except SpecError:
        assume(False)


@pytest.mark.gpu
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
)
@given(p=tc_problems(), batch=st.integers(1, 5), pick=st.integers(0, 10**6))
def test_drawn_problems_on_the_gpu(p, batch, pick):
    """The default variant and one drawn from tune's space, against the float64
    reference: the tails of every tile (pixels past the batch, maps past the group,
    channels past the chunk) and the window's zero-fill."""
    precision = {DType.BF16: Precision.BF16, DType.FP16: Precision.FP16}.get(p.dtype)
    verify_on_the_gpu(
        p, default_and_drawn(p, strategy_for(p), precision or Precision.TF32, pick), batch
    )
    assert p.layout is TensorLayout.NHWC


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck))
@given(p=tc_problems())
def test_drawn_defaults_compile_without_spills(p):
    cls = strategy_for(p)
    view = cls.problem_for(p)
    for precision in cls.precisions:
        try:
            v = cls.default(view, precision)
        except SpecError:
            continue
        plan = make_plan(p, v)
        binary = compile_source(render(plan), plan.name, plan.target("sm_90"))
        assert binary.spills == 0, (p.spec, plan.name, binary.resources)


def test_wgrad_of_ae_enc2_bf16_reads_fragments_transposed():
    p = PRESETS["ae-enc2-bf16"].with_op(Op.WGRAD)
    (v,) = [x for x in default_set(p) if x.key == "tcwgrad"]
    plan = make_plan(p, v)
    assert compile_source(render(plan), plan.name, plan.target("sm_90")).spills == 0
    ptx = ptx_of(plan)
    assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in ptx
    assert f"cp.async.wait_group {v.stages - 2};" in ptx
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx


@pytest.mark.parametrize(
    "spec,name,words",
    [
        (
            "C=256,M=128,H=16,W=16,K=3,pad=1,op=wgrad",
            "tcwgrad_b128x128_w2x2_k32_p4_s8_tf32",
            "nhwc",
        ),
        (
            "C=256,M=128,H=16,W=16,K=3,pad=1,layout=nhwc,op=wgrad",
            "tcwgrad_b128x128_w2x2_k32_p4_s8_bf16",
            "--precision tf32",
        ),
        (AE_ENC2_BF16 + ",op=wgrad", "tcwgrad_b128x128_w2x2_k32_p4_s8_fp16", "bf16"),
        (
            AE_ENC2_BF16.replace("M=128", "M=20") + ",op=wgrad",
            "tcwgrad_b64x64_w1x2_k32_p4_s8_bf16",
            "multiples of 8",
        ),
        (AE_ENC2_BF16 + ",op=wgrad", "tcwgrad_b32x128_w1x2_k32_p4_s8_bf16", "64, 128 or 256"),
        (AE_ENC2_BF16 + ",op=wgrad", "tcwgrad_b128x128_w1x1_k32_p4_s8_bf16", "--warpgrid"),
        (AE_ENC2_BF16 + ",op=wgrad", "tcwgrad_b128x128_w2x2_k48_p4_s8_bf16", "32 or 64"),
        (AE_ENC2_BF16 + ",op=wgrad", "tcwgrad_b128x128_w2x2_k16_p4_s8_bf16", "even number"),
        (AE_ENC2_BF16 + ",op=wgrad", "tcwgrad_b256x256_w4x4_k64_p8_s8_bf16", "--stages"),
    ],
)
def test_wgrad_limits_are_one_line_refusals(spec, name, words):
    with pytest.raises(SpecError) as e:
        make_plan(parse_shape(spec), parse_variant_name(name))
    assert words in str(e.value) and "\n" not in str(e.value)
