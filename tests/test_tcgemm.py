"""tcgemm, the pipelined tensor-core implicit GEMM: what the compiler makes of it (CPU
tier), its limits, its weight packing, and its numbers on drawn problems (GPU tier)."""

import re
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

from problems import DRAWN_COMPILES, default_and_drawn, verify_on_the_gpu
from ptx import ptx_of
from specgen.compile import compile_source
from specgen.errors import SpecError
from specgen.plan import make_plan
from specgen.render import render
from specgen.runtime import pack_weights, to_bits16
from specgen.shapes import PRESETS, DType, Op, TensorLayout, parse_shape
from specgen.variants import Precision
from specgen.strategies import Tcgemm, Tcwgrad, default_set, parse_variant_name
from specgen.strategies.tcgemm import MATH

AE_ENC2_BF16 = "C=256,M=128,H=16,W=16,K=3,pad=1,dtype=bf16,layout=nhwc"


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
    "spec, batch, precision, want",
    [
        # tf32, 3x3 layers on 128x128 tiles: 64x64 warps, three stages, the slices for
        # two blocks an SM, four times as many where those are 3 or fewer
        ("C=128,M=128,H=28,W=28,K=3,pad=1", 64, "tf32", ((128, 128), (2, 2), 3, 29)),
        ("C=256,M=512,H=28,W=28,K=3,pad=1,bias=1", 32, "tf32", ((128, 128), (2, 2), 3, 12)),
        ("C=512,M=512,H=14,W=14,K=3,pad=1,bias=1", 32, "tf32", ((128, 128), (2, 2), 3, 4)),
        # tf32, a 1x1 layer: 64x32 warps, four stages, the slices for two blocks an SM
        ("C=128,M=256,H=28,W=28,K=1,stride=2", 64, "tf32", ((128, 128), (2, 4), 4, 132)),
        # fp32, 144 tiles of 128x128 (more than the SMs, fewer than two an SM): half as
        # wide, two slices; 72 tiles: as they were, three slices
        ("C=512,M=512,H=7,W=7,K=3,pad=1", 64, "fp32", ((128, 64), (4, 2), 4, 2)),
        ("C=512,M=512,H=28,W=28,K=3,pad=1,bias=1", 32, "fp32", ((128, 64), (4, 2), 4, 2)),
        ("C=256,M=512,H=28,W=28,K=3,pad=1,bias=1", 32, "fp32", ((128, 128), (4, 4), 4, 3)),
    ],
)
def test_the_wgrad_fit_takes_what_the_tunes_timed_fastest(spec, batch, precision, want):
    """The tf32 and fp32 defaults of a channels-last wgrad (tile, warps, stages, slices),
    as the tunes of vgg11 and resnet18 timed them fastest (docs/measurements/
    tcwgrad-{tf32-fit,tf32-slices,fp32-wide-layers}-from-tunes-2026-11-29.log); each
    compiles for sm_90 without spills (tf32's 64x64 warps: 254 registers with db)."""
    p = replace(parse_shape(spec + ",layout=nhwc,op=wgrad"), batch=batch)
    v = Tcwgrad.default(p, Precision(precision))
    assert (v.blocktile, v.warpgrid, v.stages, v.splits) == want
    plan = make_plan(p, v)
    assert compile_source(render(plan), plan.name, plan.target("sm_90")).spills == 0


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
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))  # dgrad's in phases
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
        return p
    except SpecError:
        assume(False)


@pytest.mark.parametrize(
    "spec, kt",
    [
        # resnext50's grouped 3x3 layers: 8 channels a group (3 chunks of 32, not 9) ...
        ("C=256,M=256,H=56,W=56,K=3,pad=1,stride=2,groups=32,dtype=bf16,layout=nhwc", 3),
        ("C=256,M=256,H=28,W=28,K=3,pad=1,groups=32,dtype=bf16,layout=nhwc,op=dgrad", 3),
        # ... 16 (5, not 9), and 32: whole chunks, a tap each as before
        ("C=512,M=512,H=14,W=14,K=3,pad=1,groups=32,dtype=bf16,layout=nhwc", 5),
        ("C=1024,M=1024,H=7,W=7,K=3,pad=1,groups=32,dtype=bf16,layout=nhwc", 9),
        # fp32 in tf32: chunks of 16, 24 channels a group over 5x5 taps, 38 chunks, not 50
        ("C=96,M=64,H=9,W=9,K=5,pad=2,groups=4,dtype=fp32,layout=nhwc", 38),
    ],
)
def test_a_groups_channels_short_of_a_chunk_are_walked_flat(spec, kt):
    """Where a group's channels do not fill whole chunks, the k walk runs over (r, s, c)
    as one run, a chunk spanning taps, instead of a tap a chunk zero-filled past them.
    The walk as the kernel takes it (element kc + vec * unit of the run, tap k / Cg)
    covers every (tap, channel) once in kt chunks, and the kernel compiles for sm_90
    without spills.  A strided dgrad keeps its per-phase tap walk."""
    p = parse_shape(spec)
    v = Tcgemm.default(Tcgemm.problem_for(p), MATH[p.dtype])
    plan = make_plan(p, v)
    c, q = plan.context, Tcgemm.problem_for(p)
    flat = q.Cg % c["BK"] != 0
    assert c["flat_k"] == flat and c["kt"] == kt, (c["kt"], c["BK"])
    if flat:
        rsc, seen = q.R * q.S * q.Cg, []
        for kc in range(0, kt * c["BK"], c["BK"]):
            for unit in range(c["per_row"]):
                k = kc + unit * c["vec"]
                if k < rsc:  # else zero-filled
                    t, ch = divmod(k, q.Cg)
                    seen += [(t, ch + e) for e in range(c["vec"])]
        assert sorted(seen) == [(t, ch) for t in range(q.R * q.S) for ch in range(q.Cg)]
    binary = compile_source(render(plan), plan.name, plan.target("sm_90"))
    assert binary.spills == 0, (spec, plan.name, binary.resources)
    strided = parse_shape(
        "C=256,M=256,H=56,W=56,K=3,pad=1,stride=2,groups=32,dtype=bf16,layout=nhwc,op=dgrad"
    )
    assert not make_plan(strided, Tcgemm.default(strided, MATH[strided.dtype])).context["flat_k"]


SMALL_TILES = {(32, 64), (64, 32), (32, 32), (32, 128)}


@pytest.mark.parametrize(
    "spec, precision",
    [
        ("C=256,M=512,H=2,W=2,K=1,stride=2,layout=nhwc,op=dgrad", Precision.FP32),
        ("C=256,M=512,H=2,W=2,K=1,stride=2,layout=nhwc,op=dgrad", Precision.TF32),
        ("C=512,M=512,H=1,W=1,K=1,dtype=bf16,layout=nhwc", Precision.BF16),
    ],
)
def test_a_grid_of_few_blocks_adds_32_pixel_and_32_map_tiles_to_the_space(spec, precision):
    """resnet18's layer4 at 32x32 images (B=128): 64x64 tiles leave most SMs idle, so
    the tune also times tiles of 32 pixels or maps, warps down to 16x16; each plans and
    compiles for sm_90 without spills.  A wide layer's space has none of them."""
    p = replace(parse_shape(spec), batch=128)
    small = [v for v in Tcgemm.space(p, precision) if v.blocktile in SMALL_TILES]
    assert {v.blocktile for v in small} == SMALL_TILES
    for v in small[:: len(small) // 4]:  # one of each tile
        plan = make_plan(p, v)
        binary = compile_source(render(plan), plan.name, plan.target("sm_90"))
        assert binary.spills == 0, (plan.name, binary.resources)
    wide = replace(parse_shape(AE_ENC2_BF16), batch=128)
    assert not [v for v in Tcgemm.space(wide, Precision.BF16) if v.blocktile in SMALL_TILES]


@pytest.mark.gpu
@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
)
@given(p=tc_problems(), batch=st.integers(1, 5), pick=st.integers(0, 10**6))
def test_small_tiles_on_the_gpu(p, batch, pick):
    """A 32-pixel or 32-map tile (warps of 16 to 32 pixels and maps) drawn for a
    forward pass or dgrad, against the float64 reference: the same tails as the wide
    tiles', more tiles to a map and to the batch."""
    assume(p.op is not Op.WGRAD)
    precision = {DType.BF16: Precision.BF16, DType.FP16: Precision.FP16}.get(p.dtype)
    if precision is None:
        precision = Precision.FP32 if pick % 2 else Precision.TF32
    seed = Tcgemm.default(Tcgemm.problem_for(p), precision)
    tiles = {(32, 64): (2, 2), (64, 32): (2, 2), (32, 32): (2, 2), (32, 128): (1, 4)}
    tile = sorted(tiles)[pick % 4]
    v = replace(seed, blocktile=tile, warpgrid=tiles[tile], stages=3 + pick % 3)
    try:
        make_plan(p, v)
    except SpecError:
        assume(False)
    verify_on_the_gpu(p, [v], batch)


@pytest.mark.gpu
@pytest.mark.parametrize("shard", range(2))  # two draws, side by side
@settings(
    max_examples=13,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
)
@given(p=tc_problems(), batch=st.integers(1, 5), pick=st.integers(0, 10**6))
def test_drawn_problems_on_the_gpu(shard, p, batch, pick):
    """The default variant and one drawn from tune's space, against the float64
    reference: the tails of every tile (pixels past the batch, maps past the group,
    channels past the chunk) and the window's zero-fill."""
    precision = {DType.BF16: Precision.BF16, DType.FP16: Precision.FP16}.get(p.dtype)
    if precision is None:  # fp32 tensors: tf32, or fp32 in three tf32 products
        three = pick % 2
        precision = Precision.FP32 if three else Precision.TF32
    verify_on_the_gpu(p, default_and_drawn(p, strategy_for(p), precision, pick), batch)
    assert p.layout is TensorLayout.NHWC


@settings(max_examples=DRAWN_COMPILES, deadline=None, suppress_health_check=list(HealthCheck))
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


def replay_phases(p, dy, w):
    """dx of a dgrad problem as tcgemm's kernel computes it, in float64 NumPy, from the
    C expressions of its plan (``phases_of``): per phase, each GEMM row's pixel, its
    walk of taps (the dy pixel each reads, the packed tap it multiplies) and the dx pixel
    it stores to.  Nothing here knows the phase rules but what the plan wrote."""
    from specgen.runtime import dgrad_weights
    from specgen.strategies.tcgemm import phases_of

    B, M, Ho, Wo = dy.shape
    G, Cg, Mg = p.groups, p.Cg, p.Mg
    # the packing: [C][R*S][M/g] per group, flipped and transposed as the kernel reads it
    wt = dgrad_weights(w, G).reshape(p.C, Mg, p.R * p.S).transpose(0, 2, 1)
    dyn = dy.transpose(0, 2, 3, 1)  # NHWC, as the kernel reads it
    dx = np.full((B, p.H * p.W, p.C), np.nan)
    for ph in phases_of(p, 1):
        n, pix = np.divmod(np.arange(B * ph["HW"]), ph["HW"])
        oh, ow = pix // ph["OW"], pix % ph["OW"]
        acc = np.zeros((len(n), p.C))
        at = dict(oh=oh, ow=ow)
        ih0, iw0 = eval(ph["ih0"], {}, at), eval(ph["iw0"], {}, at)
        for lr in range(ph["RT"]):
            for ls in range(ph["ST"]):
                walk = {"lr": lr, "ls": ls, "ih0": [ih0], "iw0": [iw0], "i": 0}
                ih, iw = eval(ph["ih"], {}, walk), eval(ph["iw"], {}, walk)
                tap = eval(ph["tap"], {}, walk)
                inside = (ih >= 0) & (ih < Ho) & (iw >= 0) & (iw < Wo)
                rows = dyn[n, np.clip(ih, 0, Ho - 1), np.clip(iw, 0, Wo - 1)] * inside[:, None]
                for g in range(G):
                    out = slice(g * Cg, (g + 1) * Cg)
                    acc[:, out] += rows[:, g * Mg : (g + 1) * Mg] @ wt[out, tap].T
        where = eval(ph["out"], {}, dict(n=n, oh=oh, ow=ow)) - n * p.H * p.W
        assert np.isnan(dx[n, where]).all(), "two phases stored to one pixel"
        dx[n, where] = acc
    return dx.reshape(B, p.H, p.W, p.C).transpose(0, 3, 1, 2)


@st.composite
def strided_dgrads(draw):
    R, S = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    sh, sw = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    dh, dw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    H, W = draw(st.integers(dh * (R - 1) + 1, 13)), draw(st.integers(dw * (S - 1) + 1, 13))
    pads = "x".join(str(draw(st.integers(0, 4))) for _ in range(4))
    groups = draw(st.sampled_from([1, 2]))
    spec = (
        f"C={2 * groups},M={3 * groups},H={H},W={W},K={R}x{S},pad={pads},stride={sh}x{sw},"
        f"dil={dh}x{dw},groups={groups},layout=nhwc,op=dgrad"
    )
    try:
        return parse_shape(spec)
    except SpecError:
        assume(False)


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(p=strided_dgrads(), seed=st.integers(0, 2**31))
def test_dgrad_phases_replayed_in_numpy_give_dx(p, seed):
    """Every dx pixel stored by exactly one phase, with the sum of the taps that reach
    it: the plan's expressions replayed in NumPy against the float64 reference (strides
    past the window, dilations, paddings past its reach, groups)."""
    from specgen.reference import conv2d_dgrad

    rng = np.random.default_rng(seed)
    dy = rng.standard_normal((2, p.M, p.Ho, p.Wo))
    w = rng.standard_normal((p.M, p.Cg, p.R, p.S))
    got = replay_phases(p, dy, w)
    assert not np.isnan(got).any(), "a dx pixel no phase stored"
    np.testing.assert_allclose(got, conv2d_dgrad(dy, w, p), rtol=1e-12, atol=1e-12)


def test_a_phase_no_tap_reaches_stores_zeros():
    """A 1x1 window at stride 2: three of the four phases have no tap and write zeros
    (kt 0), in the same launch as the one that has."""
    p = parse_shape("C=64,M=128,H=14,W=14,K=1,stride=2,layout=nhwc,dtype=bf16,op=dgrad")
    plan = make_plan(p, Tcgemm.default(p, Precision.BF16))
    kts = [ph["kt"] for ph in plan.context["phases"]]
    assert len(kts) == 4 and sorted(kts)[:3] == [0, 0, 0] and max(kts) > 0
    assert plan.launches[0].grid[2] == 4 and plan.weight_transform == "dgrad"
    assert "switch (blockIdx.z)" in render(plan)
