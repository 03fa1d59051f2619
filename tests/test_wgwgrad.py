"""wgwgrad, wgrad on Hopper's warpgroup tensor cores with MN-major operands: what ptxas
makes of it for sm_90a (CPU tier), its limits, the planner's choice, and its numbers on
drawn problems (GPU tier)."""

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from problems import GPU_DRAWS, default_and_drawn, tiled_wgrads, verify_on_the_gpu
from specgen.choose import planned
from specgen.errors import SpecError
from specgen.plan import make_plan
from specgen.shapes import PRESETS, Op, parse_shape
from specgen.strategies import default_set, parse_variant_name
from specgen.strategies.tcgemm import MATH
from specgen.strategies.wgwgrad import Wgwgrad, slices_for
from specgen.variants import Precision
from test_wgmma import SERIALIZED, compiled, ptx_of

AE_DEC2_BF16 = "C=128,M=256,H=16,W=16,K=3,pad=1,bias=1,dtype=bf16,layout=nhwc,op=wgrad"


@pytest.mark.parametrize("spec", ["ae-enc2-bf16", "ae-dec2-bf16", AE_DEC2_BF16])
def test_the_wide_layers_compile_for_sm_90a_with_mn_major_wgmma(spec):
    """No spills, the multiplies not serialized, and in the PTX the warpgroup MMA with
    both operands transposed (MN-major: rows of pixels), fed by 16-byte cp.async copies
    under the proxy fence; with a bias, db's m64n8 product on the tile of ones."""
    p = PRESETS[spec].with_op(Op.WGRAD) if spec in PRESETS else parse_shape(spec)
    (v,) = [x for x in default_set(p) if x.key == "wgwgrad"]
    plan = make_plan(p, v)
    assert plan.target("sm_90") == "sm_90a"
    binary = compiled(plan)
    assert binary.spills == 0 and SERIALIZED not in binary.log, binary.resources
    ptx = ptx_of(plan)
    bm, bn = v.blocktile
    assert f"wgmma.mma_async.sync.aligned.m64n{bn}k16.f32.bf16.bf16" in ptx
    assert ", p, 1, 1, 1, 1;" in ptx  # scale-a, scale-b, transpose-a, transpose-b
    assert "fence.proxy.async.shared::cta;" in ptx
    assert "cp.async.cg.shared.global" in ptx
    assert ("wgmma.mma_async.sync.aligned.m64n8k16" in ptx) == p.bias
    assert plan.launches[0].block[0] == 2 * bm  # a warpgroup a 64 maps


def test_the_fit_tiles_the_wide_layers_as_measured():
    """128 maps x 256 channels where the channels allow (ae-enc2: 0.043 ms), 256 x 128
    where the maps do, and slices for one block an SM."""
    enc = Wgwgrad.default(
        PRESETS["ae-enc2-bf16"].with_op(Op.WGRAD), MATH[PRESETS["ae-enc2-bf16"].dtype]
    )
    dec = Wgwgrad.default(
        PRESETS["ae-dec2-bf16"].with_op(Op.WGRAD), MATH[PRESETS["ae-dec2-bf16"].dtype]
    )
    assert enc.blocktile == (128, 256) and dec.blocktile == (256, 128)
    for v in (enc, dec):
        assert 9 * v.splits <= 132 < 9 * (v.splits + 1)


def test_every_tune_candidate_plans_and_compiles_unserialized():
    p = PRESETS["ae-dec2-bf16"].with_op(Op.WGRAD)
    n = 0
    for v in Wgwgrad.space(p, MATH[p.dtype]):
        plan = make_plan(p, v)
        if v.blocktile[0] * v.blocktile[1] < 128 * 128:
            continue  # the small tiles compile as the large ones do; time is short
        binary = compiled(plan)
        assert binary.spills == 0 and SERIALIZED not in binary.log, (plan.name, binary.resources)
        n += 1
    assert n >= 6


def test_the_planner_puts_wide_16_bit_wgrad_on_wgwgrad_and_not_off_hopper():
    for name in ("ae-enc2-bf16", "ae-dec2-bf16"):
        p = PRESETS[name].with_op(Op.WGRAD)
        assert planned(p, False).variant.key == "wgwgrad"
        assert planned(p, False, arch="sm_90").variant.key == "wgwgrad"
        assert planned(p, False, arch="sm_80").variant.key == "tcwgrad"
    few = parse_shape("C=3,M=256,H=32,W=32,K=3,pad=1,bias=1,dtype=bf16,layout=nhwc,op=wgrad")
    assert planned(few, False).variant.key != "wgwgrad"
    assert not [v for v in default_set(PRESETS["ae-enc2"].with_op(Op.WGRAD)) if v.key == "wgwgrad"]


@pytest.mark.parametrize(
    "spec,name,words",
    [
        (AE_DEC2_BF16.replace("nhwc", "nchw"), "wgwgrad_b128x128_p4_s7_bf16", "nhwc"),
        (AE_DEC2_BF16.replace(",dtype=bf16", ""), "wgwgrad_b128x128_p4_s7_bf16", "tcwgrad"),
        (AE_DEC2_BF16, "wgwgrad_b128x128_p4_s7_fp16", "--precision bf16"),
        (AE_DEC2_BF16, "wgwgrad_b96x128_p4_s7_bf16", "64 maps"),
        (AE_DEC2_BF16, "wgwgrad_b128x96_p4_s7_bf16", "wgmma's N"),
        (
            AE_DEC2_BF16.replace("M=256", "M=192"),
            "wgwgrad_b128x128_p4_s7_bf16",
            "choose one of 64 maps",
        ),
        (AE_DEC2_BF16.replace("M=256", "M=40"), "wgwgrad_b64x128_p4_s7_bf16", "tcwgrad"),
        (AE_DEC2_BF16, "wgwgrad_b128x256_p4_s7_bf16", "choose one of 64, 128 channels"),
        (AE_DEC2_BF16, "wgwgrad_b256x128_p5_s7_bf16", "--stages 4"),
        (AE_DEC2_BF16, "wgwgrad_b128x128_p1_s7_bf16", "2 to 8"),
        (
            "C=256,M=256,H=28,W=28,K=3,pad=1,stride=2,dtype=bf16,layout=nhwc,op=wgrad",
            "wgwgrad_b256x256_p3_s14_bf16",
            "at most 128 x 256",
        ),
    ],
)
def test_limits_are_one_line_refusals(spec, name, words):
    with pytest.raises(SpecError) as e:
        make_plan(parse_shape(spec), parse_variant_name(name))
    assert words in str(e.value) and "\n" not in str(e.value)


def test_layers_no_tile_divides_are_refused_not_crashed():
    """The fit of a layer of 40 maps has no tile: the default set leaves wgwgrad out."""
    p = parse_shape("C=40,M=40,H=8,W=8,K=3,pad=1,dtype=bf16,layout=nhwc,op=wgrad")
    assert not [v for v in default_set(p) if v.key == "wgwgrad"]
    with pytest.raises(SpecError) as e:
        make_plan(p, Wgwgrad.default(p, MATH[p.dtype]))
    assert "tcwgrad" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "tiles,blocks,slices",
    [
        (144, 132, 5),  # one slice: a second wave of 12 blocks; five: 720 of 792 slots
        (72, 132, 5),  # resnet50's 7x7 tf32 wgrad: 72 of 132 SMs with one slice
        (9, 132, 14),  # from blocks // tiles up: 126 of 132 is full enough
        (132, 132, 1),
        (18, 264, 14),
    ],
)
def test_slices_fill_the_last_wave_of_blocks(tiles, blocks, slices):
    """The fewest slices from ``blocks // tiles`` up whose grid fills its last wave of
    blocks to 90%."""
    assert slices_for(blocks, tiles) == slices
    n = tiles * slices
    assert n / (-(-n // blocks) * blocks) >= 0.9


def test_no_slice_walks_fewer_than_two_chunks_of_the_reduction():
    """resnet18's widest bf16 wgrads at 32x32 images (B=128): over 1x1 dy maps two chunks
    of pixels, one slice; over 2x2 maps eight chunks, at most four slices (7 and 14
    before, where one slice spread 36 tiles over 132 SMs)."""
    assert slices_for(132, 36, chunks=2) == 1
    assert slices_for(132, 36, chunks=8) == 3  # of 3 and 4, the fuller last wave
    assert slices_for(132, 36) == 7
    wide = "C=256,M=512,H=2,W=2,K=3,pad=1,stride=2,dtype=bf16,layout=nhwc,op=wgrad"
    assert Wgwgrad.default(replace(parse_shape(wide), batch=128), Precision.BF16).splits == 1


# ---- GPU tier ----


def wgwgrad_problems():
    """Problems wgwgrad serves: both 16-bit dtypes, channels-last."""
    dtypes = st.sampled_from(["bf16", "fp16"]).map(lambda d: f",dtype={d},layout=nhwc")
    return tiled_wgrads(channel_blocks=3, tail=dtypes)


@pytest.mark.gpu
@settings(max_examples=12, **GPU_DRAWS)
@given(p=wgwgrad_problems(), batch=st.integers(1, 5), pick=st.integers(0, 10**6))
def test_drawn_problems_on_the_gpu(p, batch, pick):
    """The default variant and one drawn from tune's space, against the float64
    reference: slices past the batch's pixels, the taps' zero-fill, groups, db."""
    verify_on_the_gpu(p, default_and_drawn(p, Wgwgrad, MATH[p.dtype], pick), batch)


@pytest.mark.parametrize(
    "spec, batch, tile",
    [
        # resnet18's at 32x32 images: two chunks of pixels, 36 blocks of the widest tile
        ("C=256,M=512,H=2,W=2,K=3,pad=1,stride=2", 128, (128, 128)),
        ("C=128,M=256,H=4,W=4,K=3,pad=1,stride=2", 128, (128, 128)),
        # grids of half a wave or more keep the widest tile
        ("C=256,M=256,H=2,W=2,K=3,pad=1", 128, (128, 256)),
        ("C=512,M=512,H=7,W=7,K=3,pad=1", 32, (128, 256)),
    ],
)
def test_a_grid_under_half_a_wave_takes_a_narrower_tile(spec, batch, tile):
    p = replace(parse_shape(f"{spec},dtype=bf16,layout=nhwc,op=wgrad"), batch=batch)
    v = Wgwgrad.default(p, Precision.BF16)
    assert v.blocktile == tile, v.name
