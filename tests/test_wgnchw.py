"""wgnchw, tf32 wgrad of fp32 NCHW layers on Hopper's warpgroup tensor cores with K-major
operands: what ptxas makes of it for sm_90a (CPU tier), its limits, where the tune and
the planner take it, and its numbers on drawn problems (GPU tier)."""

from dataclasses import replace

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from problems import DRAWN_COMPILES, GPU_DRAWS, default_and_drawn, tiled_wgrads
from problems import verify_on_the_gpu
from specgen.choose import planned
from specgen.errors import SpecError
from specgen.plan import make_plan
from specgen.render import render
from specgen.shapes import PRESETS, Op, parse_shape
from specgen.strategies import default_set, parse_variant_name
from specgen.strategies.wgnchw import Wgnchw
from specgen.variants import Precision
from ptx import SERIALIZED, compiled, ptx_of

TF32, FP32 = Precision.TF32, Precision.FP32
RESNET_7X7 = "C=512,M=512,H=7,W=7,K=3,pad=1,op=wgrad"  # resnet50's last 3x3, B=32
# mobilenet_v2's 1x1 wgrads whose maps no tile of 64 divides, or whose channels no tile of
# 64: 96 -> 24, 24 -> 144 and 576 -> 96 (B=64 in its training step); and two groups of
# 24 channels into 24 maps, a 3x3 window, and a bias.
RAGGED = (
    "C=96,M=24,H=56,W=56,K=1,pad=0,op=wgrad",
    "C=24,M=144,H=56,W=56,K=1,pad=0,bias=1,op=wgrad",
    "C=576,M=96,H=14,W=14,K=1,pad=0,op=wgrad",
    "C=48,M=48,H=9,W=11,K=3,pad=1,groups=2,bias=1,op=wgrad",
)


@pytest.mark.parametrize("precision", [TF32, FP32])
@pytest.mark.parametrize("spec", ["ae-enc2", RESNET_7X7, "C=64,M=128,H=28,W=28,K=3,pad=1,bias=1"])
def test_the_wide_layers_compile_for_sm_90a_with_k_major_wgmma(spec, precision):
    """No spills, the multiplies not serialized, and in the PTX the warpgroup MMA in tf32
    with no transpose flags (K-major: rows of pixels), fed by 4-byte cp.async copies
    under the proxy fence; with a bias, db's m64n8 product on the tile of ones; in fp32
    math three products a step."""
    p = PRESETS[spec].with_op(Op.WGRAD) if spec in PRESETS else parse_shape(spec)
    p = p.with_op(Op.WGRAD)
    v = Wgnchw.default(p, precision)
    plan = make_plan(p, v)
    assert plan.target("sm_90") == "sm_90a"
    binary = compiled(plan)
    assert binary.spills == 0 and SERIALIZED not in binary.log, binary.resources
    ptx = ptx_of(plan)
    bm, bn = v.blocktile
    assert f"wgmma.mma_async.sync.aligned.m64n{bn}k8.f32.tf32.tf32" in ptx
    assert ", p, 1, 1;" in ptx  # scale-d from p, scale-a, scale-b: tf32 has no transpose
    assert "fence.proxy.async.shared::cta;" in ptx
    assert "cp.async.ca.shared.global" in ptx and ", 4, " in ptx
    assert ("wgmma.mma_async.sync.aligned.m64n8k8" in ptx) == p.bias
    assert plan.launches[0].block[0] == 2 * bm  # a warpgroup a 64 maps
    products = ptx.count(f"wgmma.mma_async.sync.aligned.m64n{bn}k8")
    assert products == (12 if precision is FP32 else 4)  # a chunk's, unrolled


def test_the_fit_tiles_the_widest_and_fills_the_sms():
    """128 maps x 256 channels where both divide, the most stages that fit (up to 8), and
    the fewest slices from one block an SM up whose last wave of blocks is 90% full:
    resnet50's 7x7 layer has 9 x 2 x 4 tiles, which one slice spreads over 72 of the
    132 SMs, five over 360 of 396 block slots (at B=32: 49 chunks of pixels to cut)."""
    v = Wgnchw.default(replace(parse_shape(RESNET_7X7), batch=32), TF32)
    assert v.blocktile == (128, 256) and v.splits == 5 and v.stages == 4
    v = Wgnchw.default(parse_shape("C=64,M=64,H=56,W=56,K=3,pad=1,op=wgrad"), TF32)
    assert v.blocktile == (64, 64) and v.stages == 8 and 9 * v.splits <= 132 < 9 * (v.splits + 1)
    # fp32 math keeps a chunk's products apart: at most 128 channels, half the sums
    v = Wgnchw.default(parse_shape(RESNET_7X7), FP32)
    assert v.blocktile == (128, 128) and v.stages == 3


def test_every_tune_candidate_plans_and_compiles_unserialized():
    p = parse_shape("C=128,M=256,H=14,W=14,K=3,pad=1,op=wgrad")
    n = 0
    for v in Wgnchw.space(p, TF32) + Wgnchw.space(p, FP32):
        binary = compiled(make_plan(p, v))
        assert binary.spills == 0 and SERIALIZED not in binary.log, (v.name, binary.resources)
        n += 1
    assert n >= 16


@pytest.mark.parametrize("spec", RAGGED)
def test_ragged_maps_and_narrow_channels_compile_with_their_guards(spec):
    """Maps that no tile of 64 divides take the fewest warpgroups that hold them (the
    last tile's rows past them copied as zeros and not stored); channels that none of
    64, 128 and 256 divides, a tile of their own multiple of 8 (wgmma's N). The default
    and the tune space's first and last members, in both maths, compile without spills
    and unserialized (the GPU tier runs every member)."""
    p = parse_shape(spec)
    n = 0
    for precision in (TF32, FP32):
        default = Wgnchw.default(p, precision)
        space = Wgnchw.space(p, precision)
        assert default in space
        for v in dict.fromkeys([default, space[0], space[-1]]):
            plan = make_plan(p, v)
            bm, bn = v.blocktile
            assert p.Cg % bn == 0 and bn % 8 == 0 and bm % 64 == 0 and bm < p.Mg + 64
            assert plan.context["guard_maps"] == (p.Mg % bm != 0)
            if p.Mg % bm:
                assert f"< {p.Mg};  // rows past the maps" in render(plan)
            assert plan.launches[0].grid[1] == -(-p.Mg // bm) * p.groups
            binary = compiled(plan)
            assert binary.spills == 0 and SERIALIZED not in binary.log, (v.name, binary.resources)
            assert f"m64n{bn}k8.f32.tf32.tf32" in ptx_of(plan)
            n += 1
    assert n >= 2


# 1x1 layers at stride 1 without padding, whose x is read at dy's own pixel: resnet50's
# 512 -> 256 at 28x28, two groups with a bias, ragged maps, and maps of 49 pixels (no 16-byte
# copy of 4 pixels stays in one image there).
FLAT = (
    "C=512,M=256,H=28,W=28,K=1,pad=0,op=wgrad",
    "C=64,M=128,H=6,W=10,K=1,pad=0,groups=2,bias=1,op=wgrad",
    "C=96,M=24,H=14,W=14,K=1,pad=0,op=wgrad",
    "C=128,M=64,H=7,W=7,K=1,pad=0,op=wgrad",
)


@pytest.mark.parametrize("spec", FLAT)
def test_flat_layers_copy_four_pixels_a_thread(spec):
    """Where a 1x1 window at stride 1 reads x at dy's pixel and an image's pixels are a
    multiple of 4, the default and the space's first and last members copy 16 bytes (4
    pixels of a row) a cp.async, with no spills and the multiplies unserialized;
    elsewhere 4 bytes (the GPU tier runs every member)."""
    p = parse_shape(spec)
    four = (p.H * p.W) % 4 == 0
    for precision in (TF32, FP32):
        space = Wgnchw.space(p, precision)
        for v in dict.fromkeys([Wgnchw.default(p, precision), space[0], space[-1]]):
            plan = make_plan(p, v)
            assert plan.context.get("vec4", False) == four, v.name
            ptx = ptx_of(plan)
            assert ("cp.async.cg.shared.global" in ptx and ", 16, " in ptx) == four
            assert ("cp.async.ca.shared.global" in ptx and ", 4, " in ptx) != four
            binary = compiled(plan)
            assert binary.spills == 0 and SERIALIZED not in binary.log, (v.name, binary.resources)


def test_the_fit_fills_the_sms_with_slices_where_the_tiles_are_few():
    """A 1x1 layer of 96 channels into 24 maps is one tile: a slice of the batch's pixels
    a block, one an SM (before, at most 16 slices kept 116 SMs idle); 24 channels into
    144 maps, one tile of 192 maps (three warpgroups, the last 48 rows zeros)."""
    p = replace(parse_shape(RAGGED[0]), batch=64)
    v = Wgnchw.default(p, TF32)
    assert v.blocktile == (64, 96) and v.splits == 132
    p = replace(parse_shape(RAGGED[1]), batch=64)
    assert Wgnchw.default(p, TF32).blocktile == (192, 24)
    # in fp32 math at most 128 channels: 144 take tiles of 72
    p = replace(parse_shape("C=144,M=24,H=56,W=56,K=1,pad=0,op=wgrad"), batch=64)
    assert Wgnchw.default(p, FP32).blocktile == (64, 72)


def test_the_planner_takes_ragged_tiles_where_they_were_measured_faster():
    """mobilenet_v2's 1x1 wgrads untuned (as tuned at B=64 on the H200): ragged map tiles
    in tf32 from 24 maps; 16 maps, and fp32 math where tc3wgrad takes the layer, stay
    tc3wgrad's; over 14x14 maps, which tc3wgrad's 16-byte rows refuse, wgnchw in both."""
    picks = {
        spec: (
            planned(parse_shape(spec), True).variant.key,
            planned(parse_shape(spec), False).variant.key,
        )
        for spec in (
            "C=96,M=24,H=56,W=56,K=1,pad=0,op=wgrad",
            "C=32,M=16,H=112,W=112,K=1,pad=0,op=wgrad",
            "C=384,M=96,H=14,W=14,K=1,pad=0,op=wgrad",
        )
    }
    assert list(picks.values()) == [
        ("wgnchw", "tc3wgrad"),
        ("tc3wgrad", "tc3wgrad"),
        ("wgnchw", "wgnchw"),
    ]


@settings(max_examples=DRAWN_COMPILES, deadline=None)
@given(p=tiled_wgrads(channel_blocks=2, unit=8), pick=st.integers(0, 10**6))
def test_drawn_narrow_tiles_compile_without_spills(p, pick):
    """Maps and channels a group drawn in multiples of 8: the default and a member of the
    space plan and compile for sm_90a without spills, unserialized."""
    assume(Wgnchw.space(p, TF32))
    for v in default_and_drawn(p, Wgnchw, TF32, pick):
        binary = compiled(make_plan(p, v))
        assert binary.spills == 0 and SERIALIZED not in binary.log, (p.spec, v.name)


def test_the_tune_the_default_set_and_the_planner_take_it():
    """In the default set and tune's space of an fp32 NCHW wgrad, in tf32 and fp32 math,
    not for other layouts and dtypes; the planner's pick for wide layers on sm_90a, in
    the fastest math allowed, and not where wgmma is not."""
    p = parse_shape("C=128,M=128,H=14,W=14,K=3,pad=1,op=wgrad")
    assert [v for v in default_set(p) if v.key == "wgnchw"]
    assert Wgnchw.space(p, TF32) and Wgnchw.space(p, FP32)
    assert planned(p, allow_tf32=True).variant == Wgnchw.default(p, TF32)
    assert planned(p, allow_tf32=False).variant == Wgnchw.default(p, FP32)
    assert planned(p, allow_tf32=True, arch="sm_80").variant.key != "wgnchw"
    nhwc = parse_shape("C=256,M=256,H=14,W=14,K=3,pad=1,layout=nhwc,op=wgrad")
    bf16 = parse_shape("C=256,M=256,H=14,W=14,K=3,pad=1,dtype=bf16,op=wgrad")
    for q in (nhwc, bf16):
        assert not Wgnchw.space(q, TF32)
        assert not [v for v in default_set(q) if v.key == "wgnchw"]


@pytest.mark.parametrize(
    "spec,name,words",
    [
        (RESNET_7X7 + ",layout=nhwc", "wgnchw_b128x128_p4_s1_tf32", "cannot serve nhwc"),
        (
            RESNET_7X7.replace("op=wgrad", "dtype=bf16,op=wgrad"),
            "wgnchw_b128x128_p4_s1_tf32",
            "cannot serve bf16",
        ),
        (RESNET_7X7, "wgnchw_b64x256_p2_s1_fp32", "at most 128 x 128 in fp32 math"),
        (RESNET_7X7, "wgnchw_b96x128_p4_s1_tf32", "64 maps"),
        (RESNET_7X7, "wgnchw_b128x100_p4_s1_tf32", "wgmma's N"),
        (RESNET_7X7, "wgnchw_b128x96_p4_s1_tf32", "choose one of"),
        ("C=96,M=512,H=7,W=7,K=3,pad=1,op=wgrad", "wgnchw_b128x64_p4_s1_tf32", "16, 24, 32"),
        ("C=12,M=512,H=7,W=7,K=3,pad=1,op=wgrad", "wgnchw_b128x8_p4_s1_tf32", "tc3wgrad"),
        ("C=40,M=192,H=7,W=7,K=3,pad=1,op=wgrad", "wgnchw_b192x40_p4_s1_tf32", "12 warps"),
        ("C=256,M=3,H=7,W=7,K=3,pad=1,op=wgrad", "wgnchw_b64x128_p4_s1_tf32", "tc3wgrad"),
        (
            "C=64,M=96,H=7,W=7,K=3,pad=1,op=wgrad",
            "wgnchw_b256x64_p4_s1_tf32",
            "choose one of 64, 128 maps",
        ),
        (RESNET_7X7, "wgnchw_b256x256_p2_s1_tf32", "at most 128 x 256"),
        (RESNET_7X7, "wgnchw_b128x256_p8_s1_tf32", "--stages 4"),
    ],
)
def test_limits_are_one_line_refusals(spec, name, words):
    with pytest.raises(SpecError) as e:
        make_plan(parse_shape(spec), parse_variant_name(name))
    assert words in str(e.value) and "\n" not in str(e.value)


# ---- GPU tier ----


def wgnchw_problems():
    """Problems wgnchw serves (fp32 NCHW): images whose pixels are not a multiple of a
    chunk's 32 among them."""
    return tiled_wgrads(channel_blocks=2)


@pytest.mark.gpu
@settings(max_examples=12, **GPU_DRAWS)
@given(
    p=wgnchw_problems(),
    batch=st.integers(1, 5),
    pick=st.integers(0, 10**6),
    precision=st.sampled_from([TF32, FP32]),
)
def test_drawn_problems_on_the_gpu(p, batch, pick, precision):
    """The default variant and one drawn from tune's space, in tf32 and in 3xTF32,
    against the float64 reference (3xTF32's bound is fp32's): slices past the batch's
    pixels, chunks across images, the taps' zero-fill, groups, db."""
    verify_on_the_gpu(p, default_and_drawn(p, Wgnchw, precision, pick), batch)


@pytest.mark.gpu
@settings(max_examples=12, **GPU_DRAWS)
@given(
    p=tiled_wgrads(channel_blocks=2, unit=8),
    batch=st.integers(1, 5),
    pick=st.integers(0, 10**6),
    precision=st.sampled_from([TF32, FP32]),
)
def test_drawn_narrow_tiles_on_the_gpu(p, batch, pick, precision):
    """Maps and channels a group in multiples of 8: ragged map tiles, channel tiles of
    their own width, against the float64 reference."""
    assume(Wgnchw.space(p, precision))
    verify_on_the_gpu(p, default_and_drawn(p, Wgnchw, precision, pick), batch)


@pytest.mark.gpu
@pytest.mark.parametrize("spec", RAGGED)
def test_ragged_maps_and_narrow_channels_on_the_gpu(spec):
    """Every member of the tune space, in tf32 and 3xTF32, against float64."""
    p = parse_shape(spec)
    verify_on_the_gpu(p, Wgnchw.space(p, TF32) + Wgnchw.space(p, FP32), 2)


@pytest.mark.gpu
@pytest.mark.parametrize("precision", [TF32, FP32])
def test_resnet50s_widest_7x7_layer_on_the_gpu(precision):
    p = parse_shape(RESNET_7X7)
    verify_on_the_gpu(p, [Wgnchw.default(p, precision)], 3)


@pytest.mark.gpu
@pytest.mark.parametrize("spec", FLAT)
def test_flat_layers_on_the_gpu(spec):
    """Every member of the space of the 1x1 layers, 16-byte copies and 4-byte ones, in
    tf32 and 3xTF32, against float64: chunks and slices across images, groups, db."""
    p = parse_shape(spec)
    verify_on_the_gpu(p, Wgnchw.space(p, TF32) + Wgnchw.space(p, FP32), 3)
