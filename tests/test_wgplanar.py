"""wgplanar, the forward pass and dgrad (strided: a GEMM per stride phase) of fp32 NCHW
layers in tf32 and 3xTF32 on Hopper's warpgroup tensor cores with x in registers: what
ptxas makes of it for sm_90a (CPU tier), its limits, its fit, where tune takes it, and
its numbers on drawn problems (GPU tier)."""

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from problems import DRAWN_COMPILES, GPU_DRAWS, assert_one_line_refusal, default_and_drawn
from problems import verify_on_the_gpu
from specgen.choose import computed_layout, planned
from specgen.errors import SpecError
from specgen.plan import make_plan
from specgen.shapes import Op, TensorLayout, parse_shape
from specgen.strategies import default_set
from specgen.strategies.wgplanar import (
    TILE_RATES,
    Wgcols,
    Wgplanar,
    _filled_fit,
    _one_tap_phase,
    _splits_for,
)
from specgen.tensors import Role
from specgen.variants import Precision
from ptx import SERIALIZED, compiled, ptx_of

TF32, FP32 = Precision.TF32, Precision.FP32
RESNET_1X1 = "C=64,M=256,H=56,W=56,K=1,pad=0"  # resnet50's layer1 expansion, B=32


@st.composite
def planar_problems(draw):
    """fp32 NCHW problems wgplanar takes: channels a group a multiple of 4 from 16 (up to
    past a chunk of 32), maps up to past a tile, windows up to 5x5 with stride, dilation and
    every padding, groups, bias and relu; forward, and dgrad (a GEMM per stride phase
    where strided)."""
    groups = draw(st.sampled_from([1, 1, 2, 3]))
    cg = 4 * draw(st.integers(4, 20))
    mg = draw(st.integers(1, 140))
    op = draw(st.sampled_from(["fprop", "fprop", "dgrad"]))
    R, S = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    H, W = draw(st.integers(R, 19)), draw(st.integers(S, 19))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    dil = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    pads = "x".join(str(draw(st.integers(0, 2))) for _ in range(4))
    if op == "dgrad":  # the forward view's channels are the layer's maps
        mg = 4 * draw(st.integers(4, 35))
    spec = (
        f"C={groups * cg},M={groups * mg},H={H},W={W},K={R}x{S},pad={pads},"
        f"stride={stride[0]}x{stride[1]},dil={dil[0]}x{dil[1]},groups={groups},op={op}"
    )
    if op == "fprop" and draw(st.booleans()):
        spec += ",bias=1"
    if op == "fprop" and draw(st.booleans()):
        spec += ",act=relu"
    try:
        p = parse_shape(spec)
        make_plan(p, Wgplanar.default(Wgplanar.problem_for(p), TF32))
        return p
    except SpecError:
        assume(False)


@pytest.mark.parametrize("precision", [TF32, FP32])
@pytest.mark.parametrize(
    "spec",
    [RESNET_1X1, "C=256,M=256,H=14,W=14,K=3,pad=1", "C=128,M=128,H=56,W=56,K=3,pad=1,stride=2"],
)
def test_resnet_layers_compile_for_sm_90a_with_x_from_registers(spec, precision):
    """No spills, the multiplies not serialized, and in the PTX the warpgroup MMA in tf32
    with A as four registers and B a descriptor, fed by cp.async copies (16-byte ones
    where a 1x1 window at stride 1 maps pixels onto pixels) under the proxy fence; in
    fp32 math three products a step."""
    p = replace(parse_shape(spec), batch=32)
    v = Wgplanar.default(p, precision)
    plan = make_plan(p, v)
    assert plan.target("sm_90") == "sm_90a"
    binary = compiled(plan)
    assert binary.spills == 0 and SERIALIZED not in binary.log, binary.resources
    ptx = ptx_of(plan)
    bm, bn = v.blocktile
    assert f"wgmma.mma_async.sync.aligned.m64n{bn}k8.f32.tf32.tf32" in ptx
    assert "}, {%r" in ptx  # A in registers
    # scale-d 1, or in fp32 math p (a chunk's products from zero); tf32 has no transpose
    assert (", p, 1, 1;" if precision is FP32 else ", 1, 1, 1;") in ptx
    assert "fence.proxy.async.shared::cta;" in ptx
    one = p.K == 1 and p.stride == (1, 1)
    assert ("cp.async.cg.shared.global" in ptx and ", 16, " in ptx) and (
        ("cp.async.ca.shared.global" in ptx) != one
    )
    products = ptx.count(f"wgmma.mma_async.sync.aligned.m64n{bn}k8")
    assert products == (12 if precision is FP32 else 4)  # a chunk's, unrolled
    assert plan.launches[0].block[0] == 2 * bm  # a warpgroup a 64 pixels


@pytest.mark.parametrize(
    "spec", ["C=128,M=128,H=28,W=28,K=3,pad=1", "C=256,M=3,H=32,W=32,K=3,pad=1"]
)
def test_fp32_math_splits_the_weights_a_16_byte_unit_at_a_time(spec):
    """In 3xTF32 each thread splits the weights' units it copied with one vector load and
    two vector stores a unit (a warp's units fill the banks), not word by word (four
    rows' words in eight banks: four-way conflicts)."""
    p = Wgplanar.problem_for(replace(parse_shape(spec), batch=64))
    plan = make_plan(p, Wgplanar.default(p, FP32))
    ptx = ptx_of(plan)
    units = plan.context["b_vecs"]
    assert ptx.count("ld.shared.v4.f32") == units and ptx.count("st.shared.v4.f32") == 2 * units
    assert "st.shared.f32" not in ptx


@pytest.mark.parametrize(
    "spec, batch, precision, tile, splits",
    [
        # the fit's picks against the wave-filling rule's on an H200 (2026-11-29,
        # wgplanar-fit-against-old): 0.0507 ms against b64x128_s5's 0.0649
        ("C=512,M=512,H=7,W=7,K=3,pad=1", 32, TF32, (128, 256), 5),
        # 0.2495 against b64x128's 0.4222: in 3xTF32 64 pixels a block is the slowest
        ("C=256,M=256,H=14,W=14,K=3,pad=1", 64, FP32, (192, 64), 1),
        ("C=512,M=128,H=28,W=28,K=1", 32, FP32, (192, 64), 1),  # 0.0580 against 0.1004
        ("C=256,M=256,H=14,W=14,K=3,pad=1", 64, TF32, (128, 256), 1),  # 0.0791, 0.1089
    ],
)
def test_the_fit_takes_the_tile_its_rates_price_cheapest(spec, batch, precision, tile, splits):
    p = replace(parse_shape(spec), batch=batch)
    v = Wgplanar.default(p, precision)
    assert (v.blocktile, v.stages, v.splits) == (tile, 4, splits)
    three = precision is FP32
    assert (*tile, three) in TILE_RATES
    if p.C != p.M:
        return
    # a dgrad at stride 1 through its forward view (here the same sizes) takes the same tile
    d = replace(parse_shape(spec + ",op=dgrad"), batch=batch)
    view = Wgplanar.problem_for(d)
    assert Wgplanar.default(view, precision).blocktile == tile
    plan = make_plan(d, Wgplanar.default(view, precision))
    assert plan.weight_transform == "dgrad" and plan.name.endswith("_dgrad")


def test_a_rated_tile_must_price_clearly_below_the_wave_filling_one():
    """Within ``RATED_MARGIN`` the rates do not order tiles reliably: the autoencoder's
    3-map layer keeps the wave-filling 128x32 tile (192x32 in four slices priced 0.92 of
    it measured 9% slower, H200 2026-11-29)."""
    p = replace(parse_shape("ae-dec3"), batch=128)
    for precision in (TF32, FP32):
        v = Wgplanar.default(p, precision)
        assert v == _filled_fit(p, Wgplanar(precision=precision))
        assert (v.blocktile, v.splits) == ((128, 32), 1)


def test_a_strided_dgrad_keeps_the_wave_filling_fit():
    """A strided dgrad's phases have unequal taps, which the rates do not price: its tile
    is the one that fills the SMs' waves, 128 pixels where that grid still fills them."""
    p = replace(parse_shape("C=128,M=128,H=56,W=56,K=3,pad=1,stride=2,op=dgrad"), batch=32)
    assert Wgplanar.problem_for(p).op is Op.DGRAD
    for precision in (TF32, FP32):
        v = Wgplanar.default(p, precision)
        assert v == _filled_fit(p, Wgplanar(precision=precision))
        assert v.blocktile == (128, 128) and v.splits == 1


def test_every_fitted_tile_is_priced_and_in_the_tune_space():
    """On layers of several widths, windows and batches the fit's tile is one
    ``TILE_RATES`` prices, and the tune's space holds it (so a tune times its tile with
    other stages and slices beside it)."""
    for C, M, HW, K, batch in [
        (64, 64, 56, 3, 32),
        (96, 200, 28, 1, 16),
        (512, 2048, 7, 1, 64),
        (40, 24, 112, 3, 8),
        (1024, 256, 14, 1, 128),
    ]:
        p = replace(parse_shape(f"C={C},M={M},H={HW},W={HW},K={K},pad={K // 2}"), batch=batch)
        for precision in (TF32, FP32):
            v = Wgplanar.default(p, precision)
            assert (*v.blocktile, precision is FP32) in TILE_RATES
            tiles = {w.blocktile for w in Wgplanar.space(p, precision)}
            assert v.blocktile in tiles, (C, M, HW, K, batch, precision, v)


@pytest.mark.parametrize(
    "spec, tile, tf32, fp32",
    [
        # 100 blocks where the SMs hold 264 at once, 144 chunks: five slices, 500 blocks
        ("C=512,M=512,H=7,W=7,K=3,pad=1", (64, 128), 5, 5),
        # 392 blocks in 1.5 waves of 264: two slices; in 3xTF32 (one block an SM) 2.97
        # waves of 132 already
        ("C=512,M=512,H=14,W=14,K=3,pad=1", (64, 128), 2, 1),
        # 98 blocks of 128x128 on 132 SMs: in tf32 the workspace's bytes cost what the
        # idle SMs would win, in 3xTF32 (three times the work) they pay
        ("C=256,M=256,H=14,W=14,K=3,pad=1", (128, 128), 1, 4),
        # 16 chunks: whole
        ("C=512,M=128,H=28,W=28,K=1", (64, 128), 1, 1),
    ],
)
def test_the_reduction_is_sliced_where_its_price_is_lower(spec, tile, tf32, fp32):
    """``_splits_for``'s slices of the reduction at B=32 for the tiles the bench timed,
    as it measured them fastest on an H200 (wgplanar-splits-bench-2026-11-28)."""
    p = replace(parse_shape(spec), batch=32)
    for precision, splits in ((TF32, tf32), (FP32, fp32)):
        assert _splits_for(p, Wgplanar(blocktile=tile, stages=4, precision=precision)) == splits


def planned_or_refused(p, v):
    """``v``'s plan for ``p``, or None where the planner refuses it, in one line: wgplanar's
    space holds tiles whose registers or shared memory it refuses, more of them where
    wgcols reads w's columns."""
    try:
        return make_plan(p, v)
    except SpecError as e:
        assert "\n" not in str(e)
        return None


def clean_compiles(p, variants) -> int:
    """How many of ``variants`` the planner takes for ``p``; each of them compiles with no
    spills and no serialized wgmma."""
    n = 0
    for v in variants:
        plan = planned_or_refused(p, v)
        if plan is None:
            continue
        binary = compiled(plan)
        assert binary.spills == 0 and SERIALIZED not in binary.log, (v.name, binary.resources)
        n += 1
    return n


def test_every_tune_candidate_plans_and_compiles_unserialized():
    p = replace(parse_shape("C=128,M=256,H=14,W=14,K=3,pad=1"), batch=32)
    assert clean_compiles(p, Wgplanar.space(p, TF32) + Wgplanar.space(p, FP32)) >= 30


@pytest.mark.parametrize(
    "spec",
    [
        RESNET_1X1,
        "C=512,M=512,H=7,W=7,K=3,pad=1",
        RESNET_1X1 + ",op=dgrad",
    ],
)
def test_the_planner_takes_it_for_tf32_nchw_on_sm_90a(spec):
    """The untuned pick of a wide fp32 NCHW forward pass or stride-1 dgrad, in tf32 where
    it is allowed and else in 3xTF32, computed in place (no layout moves); not where
    wgmma is not (sm_80: tcgemm in NHWC), nor in fp32 math for fewer than 32 channels."""
    p = replace(parse_shape(spec), batch=32)
    assert planned(p, allow_tf32=True).variant == Wgplanar.default(Wgplanar.problem_for(p), TF32)
    assert planned(p, allow_tf32=False).variant == Wgplanar.default(Wgplanar.problem_for(p), FP32)
    for tf32 in (True, False):
        assert computed_layout(p, "NVIDIA H200", allow_tf32=tf32) is TensorLayout.NCHW
    assert planned(p, allow_tf32=True, arch="sm_80").variant.key != "wgplanar"
    few = replace(parse_shape("C=16,M=64,H=56,W=56,K=3,pad=1"), batch=32)
    assert planned(few, allow_tf32=False).variant.key != "wgplanar"


def test_the_planner_takes_it_for_strided_dgrads():
    """A 3x3 stride-2 dgrad, and a 1x1 one whose phases but one only write zeros, in tf32
    and in 3xTF32, in place.  Untuned: on a GPU with winners shipped, both layouts'
    winners decide (resnet50's 3x3 one in tf32 runs in NHWC on the H200, where its wgmma
    winner with the moves took 0.094 ms against wgplanar's 0.110; in 3xTF32 in place,
    0.146 against tcgemm's 0.136 and the moves' 0.046)."""
    three = replace(parse_shape("C=128,M=128,H=56,W=56,K=3,pad=1,stride=2,op=dgrad"), batch=32)
    one = replace(parse_shape("C=512,M=1024,H=28,W=28,K=1,stride=2,op=dgrad"), batch=32)
    for p in (three, one):
        for tf32, precision in ((True, TF32), (False, FP32)):
            assert planned(p, allow_tf32=tf32).variant == Wgplanar.default(p, precision)
            assert computed_layout(p, "some GPU", allow_tf32=tf32) is TensorLayout.NCHW
        assert computed_layout(p, "NVIDIA H200") is TensorLayout.NCHW
    assert computed_layout(three, "NVIDIA H200", allow_tf32=True) is TensorLayout.NHWC
    assert computed_layout(one, "NVIDIA H200", allow_tf32=True) is TensorLayout.NCHW


@pytest.mark.parametrize("precision", [TF32, FP32])
def test_a_strided_dgrad_is_a_gemm_per_stride_phase(precision):
    """resnet50's 3x3 stride-2 dgrad: dy into dx in four phases of dx's pixels (blockIdx.z)
    over the 4, 2, 2 and 1 taps that reach them (the most rows of taps first, a row's
    two phases side by side), the weights flipped and transposed; its reduction whole;
    no spills, not serialized."""
    p = replace(parse_shape("C=256,M=256,H=28,W=28,K=3,pad=1,stride=2,op=dgrad"), batch=32)
    v = Wgplanar.default(Wgplanar.problem_for(p), precision)
    plan = make_plan(p, v)
    assert plan.weight_transform == "dgrad" and plan.name.endswith("_dgrad")
    [launch] = plan.launches
    assert launch.args[:3] == (Role.DY, Role.W, Role.DX) and launch.grid[2] == 4
    assert [(ph["HW"], ph["RT"] * ph["ST"]) for ph in plan.context["phases"]] == [
        (196, 4),
        (196, 2),
        (196, 2),
        (196, 1),
    ]
    assert [(ph["a"], ph["b"]) for ph in plan.context["phases"]] == [(1, 1), (1, 0), (0, 1), (0, 0)]
    binary = compiled(plan)
    assert binary.spills == 0 and SERIALIZED not in binary.log, binary.resources
    with pytest.raises(SpecError, match="whole"):
        make_plan(p, replace(v, splits=2))


@pytest.mark.parametrize("precision", [TF32, FP32])
def test_a_1x1_strided_dgrad_clears_dx_and_multiplies_its_one_phase(precision):
    """resnet50's 1x1 stride-2 dgrad: three of its four phases have no tap, so a first
    kernel clears dx (16-byte stores) and the grid takes the one phase left, which
    reads dy's pixels one to one in 16-byte copies; no spills, not serialized."""
    p = replace(parse_shape("C=512,M=1024,H=28,W=28,K=1,stride=2,op=dgrad"), batch=32)
    plan = make_plan(p, Wgplanar.default(Wgplanar.problem_for(p), precision))
    zero, main = plan.launches
    assert zero.kernel == plan.name + "_zero" and zero.args == (Role.DX, Role.BATCH)
    assert main.grid[2] == 1 and [ph["what"][:20] for ph in plan.context["phases"]] == [
        "dx rows h = 0 (mod 2"
    ]
    assert plan.context["VEC"] == 4 and plan.context["zero_vec"] == 4
    binary = compiled(plan)
    assert binary.spills == 0 and SERIALIZED not in binary.log, binary.resources
    # a padded one reads dy at an offset: 4-byte copies
    padded = replace(parse_shape("C=64,M=128,H=28,W=28,K=1,pad=1,stride=2,op=dgrad"), batch=2)
    assert make_plan(padded, Wgplanar.default(padded, precision)).context["VEC"] == 1


# 1x1 dgrads: mobilenet_v2's features.7.conv.2 (B=64); resnet50's stride-2 one; ragged
# maps and channels of a group (the view's 50 rows past a tile, its 36 channels past a chunk)
ONE_BY_ONE_DGRADS = [
    "C=192,M=64,H=14,W=14,K=1,op=dgrad",
    "C=512,M=1024,H=28,W=28,K=1,stride=2,op=dgrad",
    "C=100,M=72,H=9,W=9,K=1,groups=2,op=dgrad",
]


@pytest.mark.parametrize("precision", [TF32])
@pytest.mark.parametrize("spec", ONE_BY_ONE_DGRADS)
def test_wgcols_reads_pytorchs_weights_where_they_lie(spec, precision):
    """wgcols plans a 1x1 window's dgrad, at stride 1 too, as itself (one phase of one
    tap) and reads w[M][C/g] as PyTorch lays it out, a unit's four words four 4-byte
    copies down a column: the plan's weights are PyTorch's own (``f32``, no transform),
    so the operator gathers none a call.  No spills, not serialized.  At stride 1 the fit
    is its forward view's; wgplanar keeps the view and the packed weights, and wgcols
    refuses a 3x3 window in one line."""
    p = replace(parse_shape(spec), batch=64)
    assert Wgcols.problem_for(p) is p
    v = Wgcols.default(p, precision)
    plan = make_plan(p, v)
    assert (plan.weight_format, plan.weight_transform) == ("f32", "")
    assert plan.context["w_columns"] and plan.name.startswith("wgcols_")
    binary = compiled(plan)
    assert binary.spills == 0 and SERIALIZED not in binary.log, binary.resources
    if p.stride == (1, 1):
        assert v.blocktile == Wgplanar.default(p.dgrad_view(), precision).blocktile
        assert Wgplanar.problem_for(p).op is Op.FPROP
    packed = make_plan(p, Wgplanar.default(Wgplanar.problem_for(p), precision))
    assert packed.weight_transform == "dgrad" and not packed.context["w_columns"]
    three = replace(parse_shape(spec.replace("K=1", "K=3,pad=1")), batch=64)
    with pytest.raises(SpecError, match="wgcols computes the dgrad of a 1x1 window") as e:
        make_plan(three, Wgcols(precision=precision))
    assert "\n" not in str(e.value)
    # tf32 only, the reduction whole (3xTF32 and slices are not proved on the GPU)
    assert all(v.splits == 1 for v in Wgcols.space(p, precision)) and not Wgcols.space(p, FP32)
    for refused in (replace(v, splits=2), Wgcols(precision=FP32)):
        with pytest.raises(SpecError) as e:
            make_plan(p, refused)
        assert "\n" not in str(e.value)


def test_a_tune_times_packed_weights_with_their_gather_where_the_operator_packs_them():
    """``bench.operator_pack``: a tune charges a candidate the operator's gather where the
    operator packs its weights in a launch of their own every call (fp32 weights, an
    order that neither of the model's memory formats stores), and reads the right
    weights: the storage at its offsets is the host's packing.  wgcols, a 1x1 forward
    pass beside channels_last weights and a 16-bit layer (whose pack rides in autocast's
    cast) pay none."""
    import numpy as np

    from specgen.bench import operator_pack
    from specgen.runtime import dgrad_weights, pack_weights
    from specgen.shapes import DType
    from specgen.strategies import Wgmma
    from specgen.tensors import w_shape

    p = replace(parse_shape("C=192,M=64,H=14,W=14,K=1,op=dgrad"), batch=64)
    packed = make_plan(p, Wgplanar.default(Wgplanar.problem_for(p), TF32))
    at = operator_pack(p, packed)
    w = np.random.default_rng().standard_normal(w_shape(p)).astype(np.float32)
    want = pack_weights(dgrad_weights(w, p.groups), packed.weight_format)
    assert at is not None and np.array_equal(w.reshape(-1)[at], want)
    assert operator_pack(p, make_plan(p, Wgcols.default(p, TF32))) is None

    # a 3x3 forward pass: mrsc beside contiguous weights is packed, beside channels_last
    # ones it is their storage
    three = replace(parse_shape("C=64,M=64,H=14,W=14,K=3,pad=1"), batch=8)
    planar = make_plan(three, Wgplanar.default(three, TF32))
    at = operator_pack(three, planar)
    w = np.random.default_rng().standard_normal(w_shape(three)).astype(np.float32)
    assert at is not None and np.array_equal(w.reshape(-1)[at], pack_weights(w, "mrsc.fp32"))
    nhwc = replace(three, layout=TensorLayout.NHWC)
    assert operator_pack(nhwc, make_plan(nhwc, Wgmma.default(nhwc, TF32))) is None
    bf16 = replace(p, dtype=DType.BF16, layout=TensorLayout.NHWC)
    v = Wgmma.default(Wgmma.problem_for(bf16), Precision.BF16)
    assert make_plan(bf16, v).weight_transform == "dgrad"
    assert operator_pack(bf16, make_plan(bf16, v)) is None


def test_every_wgcols_tile_of_a_wide_1x1_dgrad_compiles_without_spills():
    """resnet50's layer3.0.conv3 dgrad (256 <- 1024 channels over 14x14 maps): each tile of
    wgcols' space (tf32, the reduction whole) reads w's columns without spills (a warp's
    8 rows a step, their offsets immediates: copied a unit a thread, the widest tiles
    spilled up to 984 bytes)."""
    p = replace(parse_shape("C=256,M=1024,H=14,W=14,K=1,op=dgrad"), batch=32)
    tiles = {v.blocktile: v for v in Wgcols.space(p, TF32)}.values()
    assert clean_compiles(p, tiles) >= 15


@pytest.mark.parametrize("precision", [TF32, FP32])
def test_a_1x1_strided_dgrad_over_few_blocks_may_slice_its_one_phase(precision):
    """resnet18's 1x1 stride-2 dgrad over 2x2 dx at B=128 leaves most SMs idle whole (16
    blocks of 16 chunks): the tune's space cuts its one phase's reduction in 2, 4 and 8
    slices (the fit keeps it whole).  Sliced, the GEMM writes each slice's sums to the
    workspace as the phase's pixels lie, and a second kernel adds them in order into dx
    and writes the other phases' zeros, so no first kernel clears dx; no spills, not
    serialized.  A 3x3 one's phases of unequal taps stay whole."""
    p = replace(parse_shape("C=256,M=512,H=2,W=2,K=1,stride=2,op=dgrad"), batch=128)
    assert {2, 4, 8} <= {v.splits for v in Wgplanar.space(p, precision)}
    whole = Wgplanar.default(p, precision)
    assert whole.splits == 1
    plan = make_plan(p, replace(whole, splits=4))
    main, total = plan.launches
    assert main.args == (Role.DY, Role.W, Role.WORKSPACE, Role.BATCH) and main.grid[2] == 4
    assert total.kernel == plan.name + "_sum"
    assert total.args == (Role.WORKSPACE, Role.DX, Role.BATCH) and total.per_image == 256 * 4
    assert plan.workspace_per_image == 4 * 4 * 256 * 1  # 4 slices of 256 channels x 1 pixel
    binary = compiled(plan)
    assert binary.spills == 0 and SERIALIZED not in binary.log, binary.resources
    three = replace(parse_shape("C=128,M=128,H=8,W=8,K=3,pad=1,stride=2,op=dgrad"), batch=128)
    assert {v.splits for v in Wgplanar.space(three, precision)} == {1}
    with pytest.raises(SpecError, match="one phase of one tap"):
        make_plan(three, replace(Wgplanar.default(three, precision), splits=2))


def test_the_tune_and_the_default_set_take_it_for_fp32_nchw_only():
    p = parse_shape("C=256,M=256,H=14,W=14,K=3,pad=1")
    assert [v for v in default_set(p) if v.key == "wgplanar"]
    assert Wgplanar.space(p, TF32) and Wgplanar.space(p, FP32)
    nhwc = parse_shape("C=256,M=256,H=14,W=14,K=3,pad=1,layout=nhwc")
    bf16 = parse_shape("C=256,M=256,H=14,W=14,K=3,pad=1,dtype=bf16")
    for q in (nhwc, bf16):
        assert not Wgplanar.space(q, TF32)
        assert not [v for v in default_set(q) if v.key == "wgplanar"]


@pytest.mark.parametrize(
    "spec,name,words",
    [
        (RESNET_1X1 + ",layout=nhwc", "wgplanar_b128x128_p4_s1_tf32", "cannot serve nhwc"),
        (RESNET_1X1 + ",dtype=bf16", "wgplanar_b128x128_p4_s1_tf32", "cannot serve bf16"),
        ("C=30,M=64,H=8,W=8,K=3,pad=1", "wgplanar_b128x64_p4_s1_tf32", "multiple of 4"),
        ("C=12,M=64,H=8,W=8,K=3,pad=1", "wgplanar_b128x64_p4_s1_tf32", "most of each chunk zeros"),
        (RESNET_1X1, "wgplanar_b96x128_p4_s1_tf32", "64 pixels"),
        (RESNET_1X1, "wgplanar_b128x96_p4_s1_tf32", "wgmma's N"),
        (RESNET_1X1, "wgplanar_b256x256_p3_s1_tf32", "registers"),
        (RESNET_1X1, "wgplanar_b64x256_p8_s1_tf32", "--stages"),
        (RESNET_1X1, "wgplanar_b128x128_p9_s1_tf32", "2 to 8"),
        (RESNET_1X1, "wgplanar_b128x256_p3_s1_fp32", "at most 128 maps"),
        (RESNET_1X1, "wgplanar_b128x128_p4_s3_tf32", "2 chunks are cut into 1 to 2 slices"),
    ],
)
def test_limits_are_one_line_refusals(spec, name, words):
    assert_one_line_refusal(spec, name, words)


@pytest.mark.parametrize("precision", [TF32, FP32])
def test_sliced_reductions_compile_with_their_second_kernel(precision):
    """resnet50's 3x3 layer over 7x7 maps in slices (its default at B=32), with a bias
    and relu: two kernels, the first writing the slices' sums to the workspace, the
    second adding them in order and applying the epilogue; no spills, not serialized."""
    p = replace(parse_shape("C=512,M=512,H=7,W=7,K=3,pad=1,bias=1,act=relu"), batch=32)
    v = Wgplanar.default(p, precision)
    plan = make_plan(p, v)
    assert v.splits > 1 and [l.kernel for l in plan.launches] == [plan.name, plan.name + "_sum"]
    assert plan.launches[0].grid[2] == v.splits
    assert plan.workspace_per_image == 4 * v.splits * 512 * 49
    binary = compiled(plan)
    assert binary.spills == 0 and SERIALIZED not in binary.log, binary.resources


@settings(max_examples=DRAWN_COMPILES, deadline=None, suppress_health_check=list(HealthCheck))
@given(p=planar_problems())
def test_drawn_defaults_compile_without_spills(p):
    for precision in (TF32, FP32):
        binary = compiled(make_plan(p, Wgplanar.default(Wgplanar.problem_for(p), precision)))
        assert binary.spills == 0 and SERIALIZED not in binary.log, (p.spec, precision)


# ---- GPU tier ----


@pytest.mark.gpu
@settings(max_examples=16, **GPU_DRAWS)
@given(
    p=planar_problems(),
    batch=st.integers(1, 5),
    pick=st.integers(0, 10**6),
    precision=st.sampled_from([TF32, FP32]),
)
def test_drawn_problems_on_the_gpu(p, batch, pick, precision):
    """The default variant and one drawn from tune's space, in tf32 and in 3xTF32 (whose
    bound is fp32's), against the float64 reference: pixels past the batch and tiles
    across images, maps past the tile, channels past the chunk, the taps' zero-fill,
    groups, bias and relu, the dgrad view."""
    verify_on_the_gpu(p, default_and_drawn(p, Wgplanar, precision, pick), batch)


@pytest.mark.gpu
@settings(max_examples=8, **GPU_DRAWS)
@given(
    p=planar_problems(),
    batch=st.integers(1, 5),
    splits=st.integers(2, 6),
    precision=st.sampled_from([TF32, FP32]),
)
def test_slices_of_the_reduction_on_the_gpu(p, batch, splits, precision):
    """The reduction cut into slices, a block plane each, added in order with the bias
    and activation by the second kernel: against the float64 reference."""
    assume(Wgplanar.problem_for(p).op is Op.FPROP)  # a strided dgrad's phases take it whole
    v = Wgplanar.default(Wgplanar.problem_for(p), precision)
    kt = p.R * p.S * -(-(Wgplanar.problem_for(p).Cg) // 32)
    assume(kt >= 2)
    verify_on_the_gpu(p, [replace(v, splits=min(splits, kt))], batch)


@st.composite
def one_tap_dgrads(draw):
    """Strided dgrads of a 1x1 window, whose taps reach one stride phase of dx (which
    one the padding decides; an image smaller than the stride has fewer phases): dx's
    channels a group any count, dy's a multiple of 4 from 16, groups."""
    groups = draw(st.sampled_from([1, 1, 2]))
    cg, mg = draw(st.integers(1, 70)), 4 * draw(st.integers(4, 40))
    stride = (draw(st.integers(1, 3)), draw(st.integers(2, 3)))
    pads = "x".join(str(draw(st.integers(0, 1))) for _ in range(4))
    H, W = draw(st.integers(1, 9)), draw(st.integers(1, 9))
    spec = (
        f"C={groups * cg},M={groups * mg},H={H},W={W},K=1,pad={pads},"
        f"stride={stride[0]}x{stride[1]},groups={groups},op=dgrad"
    )
    try:
        p = parse_shape(spec)
        make_plan(p, Wgplanar.default(Wgplanar.problem_for(p), TF32))
    except SpecError:
        assume(False)
    assume(_one_tap_phase(Wgplanar.problem_for(p)) is not None)
    return p


@pytest.mark.gpu
@settings(max_examples=8, **GPU_DRAWS)
@given(
    p=one_tap_dgrads(),
    batch=st.integers(1, 5),
    splits=st.integers(2, 8),
    precision=st.sampled_from([TF32, FP32]),
)
def test_a_sliced_one_phase_dgrad_on_the_gpu(p, batch, splits, precision):
    """A 1x1 strided dgrad's one phase in slices, added in order into dx by the second
    kernel with the other phases' zeros (dx poisoned first): against the float64
    reference."""
    v = Wgplanar.default(Wgplanar.problem_for(p), precision)
    kt = -(-(p.M // p.groups) // 32)
    assume(kt >= 2)
    verify_on_the_gpu(p, [replace(v, splits=min(splits, kt))], batch)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", [TF32, FP32])
@pytest.mark.parametrize("spec", [RESNET_1X1, "C=512,M=512,H=7,W=7,K=3,pad=1"])
def test_resnet50_layers_on_the_gpu(spec, precision):
    p = parse_shape(spec)
    verify_on_the_gpu(p, [Wgplanar.default(p, precision)], 3)


@pytest.mark.gpu
@pytest.mark.parametrize("spec", ONE_BY_ONE_DGRADS)
def test_wgcols_reads_pytorchs_weights_on_the_gpu(spec):
    """w[M][C/g] read where it lies, down its columns, in tf32: the default and the
    narrowest and widest tiles of the tune's space at 3 stages that the planner takes
    (the view's rows past a tile, its channels past a chunk, groups, stride), against
    the float64 reference."""
    p = parse_shape(spec)
    tiles = [v for v in Wgcols.space(p, TF32) if v.stages == 3 and planned_or_refused(p, v)]
    verify_on_the_gpu(p, [Wgcols.default(p, TF32), tiles[0], tiles[-1]], 3)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "spec", ["C=192,M=64,H=14,W=14,K=1,op=dgrad", "C=64,M=96,H=14,W=14,K=3,pad=1,groups=2"]
)
def test_the_tunes_weight_pack_writes_what_the_host_packs_on_the_gpu(spec):
    """The gather a tune times before a packed candidate (``with_operator_pack``: a 1x1
    dgrad's transposed weights, a grouped 3x3 forward pass's mrsc) leaves in the kernel's
    weights exactly the host's packing of fresh weights, over NaN, before the launch it
    precedes."""
    import cupy
    import numpy as np

    from specgen.bench import with_operator_pack
    from specgen.runtime import Conv
    from specgen.verify import random_inputs

    p = replace(parse_shape(spec), batch=2)
    v = Wgplanar.default(Wgplanar.problem_for(p), TF32)
    conv = Conv(p, v)
    rng = np.random.default_rng()
    _, w, bias = random_inputs(p, 1, rng)
    conv.set_weights(w, bias)
    want = cupy.asnumpy(conv.w).copy()
    conv.w.fill(np.nan)
    ran = []
    with_operator_pack(conv, p, w, ran.append)(0)
    cupy.cuda.Device().synchronize()
    assert ran == [0] and np.array_equal(cupy.asnumpy(conv.w), want)
