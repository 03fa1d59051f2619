"""wgwgrad, wgrad on Hopper's warpgroup tensor cores with MN-major operands: what ptxas
makes of it for sm_90a (CPU tier), its limits, the planner's choice, and its numbers on
drawn problems (GPU tier)."""

import re
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from problems import (
    DRAWN_COMPILES,
    GPU_DRAWS,
    default_and_drawn,
    parsed_or_rejected,
    tiled_wgrads,
    verify_on_the_gpu,
)
from specgen.choose import planned
from specgen.errors import SpecError
from specgen.plan import make_plan
from specgen.render import render
from specgen.shapes import PRESETS, Op, parse_shape
from specgen.strategies import default_set, parse_variant_name
from specgen.strategies.tcgemm import MATH
from specgen.strategies.wgwgrad import (
    Wgwdsm,
    Wgwgrad,
    Wgwhalo,
    Wgwtma,
    halo_layout,
    slices_for,
    tap_rects,
)
from specgen.tensors import Role
from specgen.tma import box_load
from specgen.variants import Precision
from ptx import SERIALIZED, compiled, ptx_of

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


# ---- the taps' own pixels, and one slice storing dw ----

# resnet18's slowest bf16 wgrads at 32x32 images (B=128): a 1x1 output whose stride-2
# window leaves five taps on the padding; 2x2 maps whose corner taps see one pixel
R18_SMALL = [
    ("C=256,M=512,H=2,W=2,K=3,pad=1,stride=2,dtype=bf16,layout=nhwc,op=wgrad", 4, 4),
    ("C=256,M=256,H=2,W=2,K=3,pad=1,dtype=bf16,layout=nhwc,op=wgrad", 16, 1),
]
# small maps through each of wgwgrad's forms: pruned with db on the tap that sees every
# pixel, dilated and unequally padded, strided with empty taps, fp16 with groups
PRUNED_LAYERS = [
    (
        "C=256,M=512,H=2,W=2,K=3,pad=1,stride=2,dtype=bf16,layout=nhwc,op=wgrad",
        "wgwgrad_b64x64_p3_s1_bf16",
    ),
    ("C=256,M=256,H=2,W=2,K=3,pad=1,dtype=bf16,layout=nhwc,op=wgrad", "wgwgrad_b128x64_p4_s3_bf16"),
    (
        "C=128,M=64,H=3,W=3,K=3,pad=1,bias=1,dtype=bf16,layout=nhwc,op=wgrad",
        "wgwgrad_b64x64_p3_s1_bf16",
    ),
    (
        "C=64,M=128,H=4,W=5,K=3,pad=2x1x0x2,dil=2,dtype=bf16,layout=nhwc,op=wgrad",
        "wgwgrad_b128x64_p4_s2_bf16",
    ),
    (
        "C=128,M=128,H=3,W=3,K=3,pad=2,stride=2,dtype=fp16,layout=nhwc,op=wgrad",
        "wgwgrad_b64x128_p3_s1_fp16",
    ),
    (
        "C=128,M=256,H=5,W=5,K=3,pad=1,groups=2,bias=1,dtype=fp16,layout=nhwc,op=wgrad",
        "wgwgrad_b64x64_p4_s5_fp16",
    ),
]


@settings(max_examples=60, deadline=None)
@given(p=tiled_wgrads(channel_blocks=1))
def test_each_taps_rectangle_holds_exactly_its_pixels_inside_the_image(p):
    """tap_rects against a walk of every output pixel: the rectangle of a tap (r, s) is
    the set of (oh, ow) whose input pixel, moved by the tap, lies in the image."""
    (sh, sw), (dh, dw), (pt, _, pl, _) = p.stride, p.dil, p.pads
    for tap, (oh, nh, ow, nw) in enumerate(tap_rects(p)):
        r, s = divmod(tap, p.S)
        inside = {
            (i, j)
            for i in range(p.Ho)
            for j in range(p.Wo)
            if 0 <= i * sh + r * dh - pt < p.H and 0 <= j * sw + s * dw - pl < p.W
        }
        assert inside == {(oh + i, ow + j) for i in range(nh) for j in range(nw)}, (tap, p)


@pytest.mark.parametrize("spec,kept,full", R18_SMALL)
def test_small_maps_walk_their_taps_pixels_and_one_slice_stores_dw(spec, kept, full):
    """resnet18's small-map wgrads: each tap's block walks only its pixels inside the
    image (``kept`` of 9 x Ho x Wo an image); at one slice one launch stores dw with no
    workspace, at three the slices go through the second pass; both without spills."""
    p = parse_shape(spec)
    assert sum(nh * nw for _, nh, _, nw in tap_rects(p)) == kept
    assert sum(nh * nw == p.Ho * p.Wo for _, nh, _, nw in tap_rects(p)) == full
    for splits in (1, 3):
        plan = make_plan(p, parse_variant_name(f"wgwgrad_b64x64_p3_s{splits}_bf16"))
        assert plan.context["prune"] and "tap_rect[tap]" in render(plan)
        assert len(plan.launches) == (1 if splits == 1 else 2)
        assert (plan.workspace_bytes == 0) == (splits == 1)
        if splits == 1:
            assert plan.launches[0].args == (Role.X, Role.DY, Role.DW, Role.BATCH)
        binary = compiled(plan)
        assert binary.spills == 0 and SERIALIZED not in binary.log, binary.resources


@pytest.mark.parametrize(
    "spec",
    [
        "C=256,M=256,H=14,W=14,K=3,pad=1,dtype=bf16,layout=nhwc,op=wgrad",  # 91% kept
        "C=256,M=256,H=2,W=2,K=3,pad=2,bias=1,dtype=bf16,layout=nhwc,op=wgrad",  # no full tap
        "C=256,M=256,H=2,W=2,K=1,pad=0,dtype=bf16,layout=nhwc,op=wgrad",
    ],
)
def test_large_maps_and_db_without_a_full_tap_walk_every_pixel(spec):
    p = parse_shape(spec)
    plan = make_plan(p, parse_variant_name("wgwgrad_b64x64_p3_s2_bf16"))
    assert not plan.context["prune"] and "tap_rect" not in render(plan)


@pytest.mark.gpu
@pytest.mark.parametrize("spec,name", PRUNED_LAYERS)
def test_pruned_layers_on_the_gpu(spec, name):
    """Each small-map layer's kernel against the float64 reference at a batch of 3:
    empty taps written as zeros, one slice storing dw, slices of a tap's own pixels."""
    p = parse_shape(spec)
    assert make_plan(p, parse_variant_name(name)).context["prune"]
    verify_on_the_gpu(p, [parse_variant_name(name)], 3)


# ---- wgwtma: the same product fed by the tensor memory accelerator ----

WGWTMA_LAYERS = [
    # resnet50's 3x3 wgrads over 7x7 and 14x14 maps (a band of 49 pixels, 15 rows of
    # zeros; 4 rows of 14, the last band's two rows past the image), a 1x1 over 7x7 (64
    # consecutive pixels of the batch a unit, the last one partly past it)
    ("C=512,M=512,H=7,W=7,K=3,pad=1,dtype=bf16,layout=nhwc,op=wgrad", "wgwtma_b64x128_p3_s3_bf16"),
    (
        "C=256,M=256,H=14,W=14,K=3,pad=1,bias=1,dtype=bf16,layout=nhwc,op=wgrad",
        "wgwtma_b128x256_p4_s2_bf16",
    ),
    ("C=2048,M=512,H=7,W=7,K=1,pad=0,dtype=bf16,layout=nhwc,op=wgrad", "wgwtma_b256x64_p5_s2_bf16"),
    # resnet50's strided wgrads: x's box steps by 2 along its rows and columns
    (
        "C=512,M=512,H=14,W=14,K=3,pad=1,stride=2,dtype=bf16,layout=nhwc,op=wgrad",
        "wgwtma_b128x256_p4_s1_bf16",
    ),
    (
        "C=1024,M=2048,H=14,W=14,K=1,pad=0,stride=2,dtype=bf16,layout=nhwc,op=wgrad",
        "wgwtma_b128x256_p4_s2_bf16",
    ),
    # the 1x1 units with db, and with groups in fp16
    (
        "C=1024,M=512,H=14,W=14,K=1,pad=0,bias=1,dtype=bf16,layout=nhwc,op=wgrad",
        "wgwtma_b128x64_p4_s4_bf16",
    ),
    (
        "C=256,M=128,H=14,W=14,K=1,pad=0,groups=2,dtype=fp16,layout=nhwc,op=wgrad",
        "wgwtma_b64x64_p4_s4_fp16",
    ),
    # four 4x4 images a band; groups and fp16
    ("C=128,M=128,H=4,W=4,K=3,pad=1,dtype=bf16,layout=nhwc,op=wgrad", "wgwtma_b64x64_p4_s8_bf16"),
    (
        "C=128,M=128,H=14,W=14,K=3,pad=1,groups=2,dtype=fp16,layout=nhwc,op=wgrad",
        "wgwtma_b64x64_p4_s4_fp16",
    ),
]


@pytest.mark.parametrize("spec,name", WGWTMA_LAYERS)
def test_wgwtma_compiles_unserialized_with_a_producer_warp_of_box_copies(spec, name):
    """No spills, the multiplies not serialized; a producer warp beside the warpgroups,
    its copies the tensor maps' boxes under mbarriers, and no cp.async left."""
    p = parse_shape(spec)
    plan = make_plan(p, parse_variant_name(name))
    binary = compiled(plan)
    assert binary.spills == 0 and SERIALIZED not in binary.log, binary.resources
    bm = plan.variant.blocktile[0]
    assert plan.launches[0].block == (128 * bm // 64 + 32, 1, 1)
    ptx = ptx_of(plan)
    assert "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier" in ptx
    assert "mbarrier.try_wait.parity" in ptx and "cp.async.cg" not in ptx
    assert [m.role for m in plan.launches[0].maps] == [Role.DY, Role.X]


def _unit_boxes(p, plan, dy, x, u, tap, m0, c0, grp, images):
    """The boxes the producer copies for unit u of tap ``tap`` (wgwgrad.cu.j2, tma), as
    the copy unit fills them: dy's rows of the band at maps m0.., x's at channels c0..,
    moved by the tap."""
    dymap, xmap = plan.launches[0].maps
    c = plan.context
    if c["flat"]:  # 64 consecutive pixels of the batch, x's those of dy
        return (
            box_load(dy, dymap, (m0, grp, 0, 0, u * c["rows"]), images),
            box_load(x, xmap, (c0, grp, 0, 0, u * c["rows"]), images),
        )
    n0, h0 = u // c["bands"] * c["nb"], u % c["bands"] * c["hb"]
    tr = tap // p.S * c["dh"] - c["pt"]
    ts = tap % p.S * c["dw"] - c["pl"]
    return (
        box_load(dy, dymap, (m0, grp, 0, h0, n0), images),
        box_load(x, xmap, (c0, grp, ts, h0 * p.stride[0] + tr, n0), images),
    )


@pytest.mark.parametrize("spec,name", WGWTMA_LAYERS)
def test_wgwtma_boxes_sum_to_the_weight_gradient(spec, name):
    """A NumPy replay of the copy unit: over every unit of the batch (a partial last
    band of images included), the products of each tap's boxes, dy's rows against x's,
    add up to the float64 wgrad of a 64 x 64 tile, and the rows past a band stay out."""
    import numpy as np

    from specgen.reference import conv2d_wgrad

    p = parse_shape(spec)
    plan = make_plan(p, parse_variant_name(name))
    c = plan.context
    images = 3 if c["flat"] else 2 * c["nb"] - 1 if c["nb"] > 1 else 2
    src = render(plan)
    h = "h0" if p.stride[0] == 1 else f"h0 * {p.stride[0]}"
    tail = ", 0, 0, p0);" if c["flat"] else f", ts, {h} + tr, n0);"
    assert "m0 + 64 * k, " in src and "c0 + 64 * k, " in src and tail in src
    rng = np.random.default_rng()
    x = rng.standard_normal((images, p.H, p.W, p.C)) + 2.0  # NHWC, no zeros
    dy = rng.standard_normal((images, p.Ho, p.Wo, p.M)) + 2.0
    want = conv2d_wgrad(x.transpose(0, 3, 1, 2), dy.transpose(0, 3, 1, 2), p)
    grp = p.groups - 1
    m0, c0 = p.Mg - 64, p.Cg - 64  # the group's last tile: boxes end at its edge
    P = p.Ho * p.Wo
    units = -(-images * P // c["rows"]) if c["flat"] else -(-images // c["nb"]) * c["bands"]
    for tap in range(p.R * p.S):
        got = np.zeros((64, 64))
        for u in range(units):
            a, b = _unit_boxes(p, plan, dy.reshape(-1), x.reshape(-1), u, tap, m0, c0, grp, images)
            assert a.shape == b.shape == (c["rows"], 64)
            got += a.T @ b
        r, s = divmod(tap, p.S)
        ref = want[grp * p.Mg + m0 : grp * p.Mg + m0 + 64, c0 : c0 + 64, r, s]
        assert np.allclose(got, ref, rtol=1e-12, atol=1e-9), (tap, np.abs(got - ref).max())


def test_every_wgwtma_tune_candidate_plans_and_compiles_unserialized():
    """Its space is wgwgrad's: each member plans beside its mbarriers (the ring's stages
    leave them room), and the wide tiles compile without spills or serialized multiplies."""
    p = PRESETS["ae-dec2-bf16"].with_op(Op.WGRAD)
    n = 0
    for v in Wgwtma.space(p, MATH[p.dtype]):
        plan = make_plan(p, v)
        if v.blocktile[0] * v.blocktile[1] < 128 * 128:
            continue
        binary = compiled(plan)
        assert binary.spills == 0 and SERIALIZED not in binary.log, (plan.name, binary.resources)
        n += 1
    assert n >= 6


@pytest.mark.parametrize(
    "spec,words",
    [
        (
            "C=64,M=64,H=316,W=316,K=3,pad=1,stride=5,dtype=bf16,layout=nhwc,op=wgrad",
            "past the copy unit's 256",
        ),
        ("C=64,M=64,H=70,W=70,K=3,pad=1,dtype=bf16,layout=nhwc,op=wgrad", "at most 64 pixels"),
    ],
)
def test_wgwtma_refuses_what_its_boxes_cannot_take(spec, words):
    with pytest.raises(SpecError) as e:
        make_plan(parse_shape(spec), parse_variant_name("wgwtma_b64x64_p4_s4_bf16"))
    assert words in str(e.value) and "wgwgrad" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.gpu
@pytest.mark.parametrize("spec,name", WGWTMA_LAYERS)
def test_wgwtma_layers_on_the_gpu(spec, name):
    """Each layer's kernel against the float64 reference at a batch that leaves a
    partial last band of images and slices past the batch's units."""
    p = parse_shape(spec)
    verify_on_the_gpu(p, [parse_variant_name(name)], 3)


@pytest.mark.gpu
@settings(max_examples=12, **GPU_DRAWS)
@given(
    p=wgwgrad_problems(),
    batch=st.integers(1, 5),
    pick=st.integers(0, 10**6),
)
def test_wgwtma_drawn_problems_on_the_gpu(p, batch, pick):
    """wgwtma's default and a drawn member of its space on drawn problems: padding the
    boxes zero-fill, strides they step by, dilation, groups, db, bands past the batch."""
    verify_on_the_gpu(p, default_and_drawn(p, Wgwtma, MATH[p.dtype], pick), batch)


# ---- wgwdsm: wgwtma's slices summed in a cluster ----

# WGWTMA_LAYERS as wgwdsm, their slices rounded down to 1, 2, 4 or 8 (the cluster's
# blocks); and resnet50's 3x3 layer over 7x7 maps in one block a tile (no cluster)
WGWDSM_LAYERS = [
    (spec, re.sub(r"_s(\d+)_", lambda m: f"_s{1 << int(m[1]).bit_length() - 1}_", name))
    for spec, name in ((s, n.replace("wgwtma", "wgwdsm")) for s, n in WGWTMA_LAYERS)
] + [
    ("C=512,M=512,H=7,W=7,K=3,pad=1,dtype=bf16,layout=nhwc,op=wgrad", "wgwdsm_b128x256_p4_s1_bf16")
]


@pytest.mark.parametrize("spec,name", WGWDSM_LAYERS)
def test_wgwdsm_stores_dw_itself_from_one_kernel(spec, name):
    """One launch that writes dw (and db) with no workspace; for more than one slice a
    cluster of that many blocks along z whose blocks read each other's shared memory;
    no spills, the multiplies not serialized; and under grads32 the same kernel with
    fp32 dw and db."""
    from specgen.strategies.wsplit import with_fp32_grads

    p = parse_shape(spec)
    v = parse_variant_name(name)
    plan = make_plan(p, v)
    (main,) = plan.launches
    assert main.args == (Role.X, Role.DY, Role.DW, *((Role.DB,) if p.bias else ()), Role.BATCH)
    assert plan.workspace_bytes == 0 and main.grid[2] == v.splits
    binary = compiled(plan)
    assert binary.spills == 0 and SERIALIZED not in binary.log, binary.resources
    ptx = ptx_of(plan)
    assert ("mapa.shared::cluster.u32" in ptx) == (v.splits > 1)
    if v.splits > 1:
        assert f".reqnctapercluster 1, 1, {v.splits}" in ptx
        assert ptx.count("barrier.cluster.arrive.release.aligned") == 2
    assert "_reduce" not in render(plan)
    wide = with_fp32_grads(plan, "mrsc")
    text = render(wide)
    assert "float* __restrict__ dw" in text and ("float* __restrict__ db" in text) == p.bias
    binary = compiled(wide)
    assert binary.spills == 0 and SERIALIZED not in binary.log, binary.resources


def test_wgwdsm_space_and_fit_keep_a_portable_cluster():
    """Every slice count of the space and of the fit is 1, 2, 4 or 8 (each block adds an
    equal share of the tile's columns); others are refused in one line.  Three slices
    of a 128-channel tile left its last 8 columns unwritten (NaN, H200, 2026-11-29)."""
    for spec in (
        "C=512,M=512,H=7,W=7,K=3,pad=1,dtype=bf16,layout=nhwc,op=wgrad",
        "C=256,M=256,H=14,W=14,K=3,pad=1,bias=1,dtype=bf16,layout=nhwc,op=wgrad",
        "C=128,M=128,H=4,W=4,K=3,pad=1,dtype=bf16,layout=nhwc,op=wgrad",
    ):
        p = parse_shape(spec)
        space = Wgwdsm.space(p, Precision.BF16)
        assert {v.splits for v in space} == {1, 2, 4, 8}
        for batch in (1, 3, 32, 128):
            v = Wgwdsm.default(replace(p, batch=batch), Precision.BF16)
            assert v.splits in (1, 2, 4, 8), (spec, batch, v.name)
    for splits in (3, 9):
        with pytest.raises(SpecError) as e:
            make_plan(p, parse_variant_name(f"wgwdsm_b64x128_p4_s{splits}_bf16"))
        assert "1, 2, 4 or 8" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.gpu
@pytest.mark.parametrize("spec,name", WGWDSM_LAYERS)
def test_wgwdsm_layers_on_the_gpu(spec, name):
    """Each layer's kernel against the float64 reference at a batch that leaves a
    partial last band of images and slices past the batch's units."""
    verify_on_the_gpu(parse_shape(spec), [parse_variant_name(name)], 3)


@pytest.mark.gpu
@settings(max_examples=12, **GPU_DRAWS)
@given(p=wgwgrad_problems(), batch=st.integers(1, 5), pick=st.integers(0, 10**6))
def test_wgwdsm_drawn_problems_on_the_gpu(p, batch, pick):
    """wgwdsm's default and a drawn member of its space on drawn problems: clusters whose
    last slices hold no pixels, db summed across the cluster, groups, strides."""
    verify_on_the_gpu(p, default_and_drawn(p, Wgwdsm, MATH[p.dtype], pick), batch)


# ---- ragged tiles: a group's maps or channels that no tile divides ----

RAGGED = [
    # efficientnet_b0's 1x1 wgrads of 112 and 672 channels (B=64 in its table)
    "C=672,M=112,H=14,W=14,K=1,pad=0,dtype=bf16,layout=nhwc,op=wgrad",
    "C=112,M=672,H=14,W=14,K=1,pad=0,dtype=bf16,layout=nhwc,op=wgrad",
    "C=672,M=192,H=7,W=7,K=1,pad=0,dtype=bf16,layout=nhwc,op=wgrad",
    # banded: a 3x3 window at stride 2, two groups of 104 channels and 72 maps, db
    "C=208,M=144,H=9,W=9,K=3,pad=1,stride=2,groups=2,bias=1,dtype=fp16,layout=nhwc,op=wgrad",
]


@pytest.mark.parametrize("spec", RAGGED)
def test_ragged_tiles_cover_a_group_that_no_tile_divides(spec):
    """wgwtma and wgwdsm tile a group's maps or channels that no tile divides with tiles
    that end past them: the copy unit zero-fills a box past the tensor's extent, and
    the stores skip what lies past the group.  Their spaces take such tiles along that
    extent only; no spills, not serialized.  wgwgrad's copies take dividing tiles only,
    and say so in one line."""
    p = replace(parse_shape(spec), batch=64)
    math = MATH[p.dtype]
    for cls in (Wgwtma, Wgwdsm):
        v = cls.default(p, math)
        plan = make_plan(p, v)
        bm, bn = v.blocktile
        guards = plan.context["guard_maps"], plan.context["guard_chans"]
        assert guards == (p.Mg % bm != 0, p.Cg % bn != 0) and any(guards)
        binary = compiled(plan)
        assert binary.spills == 0 and SERIALIZED not in binary.log, binary.resources
        space = cls.space(p, math)
        assert space and all(w.blocktile[0] <= -(-p.Mg // 64) * 64 for w in space)
        for w in space:
            if p.Mg % 64 == 0:
                assert p.Mg % w.blocktile[0] == 0, w.name
            if p.Cg % 64 == 0:
                assert p.Cg % w.blocktile[1] == 0, w.name
    with pytest.raises(SpecError) as e:
        make_plan(p, Wgwgrad.default(p, math))
    assert "tcwgrad" in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize(
    "spec",
    [
        # regnet_y_400mf's squeeze-and-excitation layers: 110 channels or maps, 220-byte
        # pixels of x or dy, which the copy unit's tensor maps cannot step by
        "C=110,M=440,H=1,W=1,K=1,pad=0,bias=1,dtype=bf16,layout=nhwc,op=wgrad",
        "C=440,M=110,H=1,W=1,K=1,pad=0,bias=1,dtype=bf16,layout=nhwc,op=wgrad",
        # shufflenet_v2's 116 channels
        "C=116,M=116,H=14,W=14,K=1,pad=0,dtype=bf16,layout=nhwc,op=wgrad",
    ],
)
def test_ragged_tiles_refuse_pixels_short_of_16_byte_units(spec):
    """Ragged tiles take x's and dy's pixels as rows of 16-byte units: elsewhere wgwtma
    and wgwdsm refuse in one line (not the tensor map's own error), and the planner
    takes another strategy."""
    p = replace(parse_shape(spec), batch=64)
    math = MATH[p.dtype]
    for cls in (Wgwtma, Wgwdsm):
        with pytest.raises(SpecError) as e:
            make_plan(p, cls.default(p, math))
        assert "tcwgrad" in str(e.value) and "\n" not in str(e.value)
    assert planned(p, False).variant.key not in ("wgwtma", "wgwdsm")


def test_the_planner_puts_ragged_1x1_wgrads_on_wgwtma_and_not_off_hopper():
    """Untuned, a 1x1 16-bit wgrad that no 64-wide tile divides runs wgwtma's ragged
    tiles on sm_90a (its fit beat tcwgrad's on 17 of 17 measured); larger windows keep
    tcwgrad (2 of 4), as does every layer off Hopper."""
    for spec in RAGGED[:3] + [
        "C=512,M=1000,H=13,W=13,K=1,pad=0,bias=1,dtype=bf16,layout=nhwc,op=wgrad"
    ]:
        p = parse_shape(spec)
        assert planned(p, False).variant.key == "wgwtma", spec
        assert planned(p, False, arch="sm_90").variant.key == "wgwtma", spec
        assert planned(p, False, arch="sm_80").variant.key == "tcwgrad", spec
    three = parse_shape("C=144,M=288,H=14,W=14,K=3,pad=1,dtype=bf16,layout=nhwc,op=wgrad")
    assert planned(three, False).variant.key == "tcwgrad"


@pytest.mark.gpu
@pytest.mark.parametrize("spec", RAGGED)
def test_ragged_tiles_on_the_gpu(spec):
    """wgwtma's and wgwdsm's defaults and two drawn members of each space (whole or in
    slices, one block or a cluster) against the float64 reference, dw poisoned first:
    the maps and channels past a group's neither read nor written."""
    p = parse_shape(spec)
    math = MATH[p.dtype]
    variants = []
    for cls in (Wgwtma, Wgwdsm):
        variants += default_and_drawn(p, cls, math, 7) + default_and_drawn(p, cls, math, 1000)[1:]
    verify_on_the_gpu(p, list(dict.fromkeys(variants)), 3)


def ragged_wgrad_problems():
    """wgwgrad_problems whose group's maps and channels are multiples of 8 from 64, one or
    both of which no 64-wide tile divides."""
    dtypes = st.sampled_from(["bf16", "fp16"]).map(lambda d: f",dtype={d},layout=nhwc")
    return tiled_wgrads(channel_blocks=3, tail=dtypes, unit=8).filter(
        lambda p: min(p.Mg, p.Cg) >= 64 and (p.Mg % 64 or p.Cg % 64)
    )


@settings(max_examples=DRAWN_COMPILES, deadline=None, suppress_health_check=list(HealthCheck))
@given(p=ragged_wgrad_problems())
def test_drawn_ragged_defaults_compile_without_spills(p):
    """wgwtma's and wgwdsm's defaults on drawn ragged problems (windows, strides,
    dilation, groups, db): no spills, not serialized; a refusal (a box the copy unit
    cannot take) in one line."""
    for cls in (Wgwtma, Wgwdsm):
        try:
            plan = make_plan(p, cls.default(p, MATH[p.dtype]))
        except SpecError as e:
            assert "\n" not in str(e)
            continue
        binary = compiled(plan)
        assert binary.spills == 0 and SERIALIZED not in binary.log, (p.spec, binary.resources)


@pytest.mark.gpu
@settings(max_examples=8, **GPU_DRAWS)
@given(p=ragged_wgrad_problems(), batch=st.integers(1, 5), pick=st.integers(0, 10**6))
def test_drawn_ragged_problems_on_the_gpu(p, batch, pick):
    """wgwtma's and wgwdsm's defaults and a drawn member of each space on drawn ragged
    problems, against the float64 reference."""
    variants = []
    for cls in (Wgwtma, Wgwdsm):
        try:
            variants += default_and_drawn(p, cls, MATH[p.dtype], pick)
        except SpecError:  # a box the copy unit cannot take: the compile test says so
            continue
    verify_on_the_gpu(p, variants, batch)


def _autocast_tensors(weights: str):
    """x, fp32 weights (in ``weights``' memory format), bias and dy of a 128-channel 3x3
    layer over 14x14 maps, B=3, channels-last activations."""
    import torch

    x = torch.randn(3, 128, 14, 14, device="cuda").to(memory_format=torch.channels_last)
    w = torch.randn(128, 128, 3, 3, device="cuda")
    if weights == "channels_last":
        w = w.contiguous(memory_format=torch.channels_last)
    b = torch.randn(128, device="cuda")
    dy = torch.randn(3, 128, 14, 14, device="cuda").to(memory_format=torch.channels_last)
    return x, w, b, dy


def _autocast_grads(monkeypatch, name: str, x, w, b, dy) -> tuple:
    """The operator's dw (and db, where ``b`` is given) under bf16 autocast, its wgrad
    run on the kernel ``name``."""
    import torch

    import specgen.torch as sg
    from specgen.choose import Choice
    from specgen.torch import _engine as E

    monkeypatch.setattr(E, "_kernels", {})
    real = E.choose

    def pick(p, *args):
        if p.op is not Op.WGRAD:
            return real(p, *args)
        return Choice(parse_variant_name(name), "planned", "test")

    monkeypatch.setattr(E, "choose", pick)
    leaves = [w.clone().requires_grad_()] + ([] if b is None else [b.clone().requires_grad_()])
    with torch.autocast("cuda", dtype=torch.bfloat16):
        y = sg.conv2d(x.to(torch.bfloat16).requires_grad_(), *leaves, padding=1)
    grads = torch.autograd.grad(y, leaves, dy)
    monkeypatch.setattr(E, "choose", real)
    return grads


@pytest.mark.gpu
@pytest.mark.parametrize("weights", ["contiguous", "channels_last"])
def test_wgwdsm_writes_the_operators_fp32_grads_as_wgwtmas_second_pass(monkeypatch, weights):
    """The PyTorch operator under autocast with fp32 weights (dw and db in fp32, dw in
    the weights' memory format): wgwdsm, its sums added in a cluster, gives the bits of
    wgwtma of the same tile and slices, whose second pass adds the same sums in the
    same order."""
    torch = pytest.importorskip("torch")
    tensors = _autocast_tensors(weights)
    grads = {
        key: _autocast_grads(monkeypatch, f"{key}_b64x128_p4_s4_bf16", *tensors)
        for key in ("wgwtma", "wgwdsm")
    }
    (dw0, db0), (dw1, db1) = grads["wgwtma"], grads["wgwdsm"]
    assert dw1.dtype == db1.dtype == torch.float32
    fmt = torch.channels_last if weights == "channels_last" else torch.contiguous_format
    assert dw1.is_contiguous(memory_format=fmt)
    assert not dw1.isnan().any() and torch.equal(dw0, dw1) and torch.equal(db0, db1)


@pytest.mark.gpu
def test_the_tune_times_a_16_bit_wgrad_as_the_operator_writes_its_grads():
    """bench_variant and retime on the plan the tune times (``bench.timed_plan``: dw and db
    in fp32, dw as the operator's channels_last weights lie): every output written (the
    NaN poison gone), for the second pass's form and for wgwdsm's."""
    import numpy as np

    from specgen.bench import bench_variant, ceilings, input_sets
    from specgen.bench import timed_plan
    from specgen.tune import retime
    from specgen.verify import random_inputs

    spec = "C=128,M=128,H=7,W=7,K=3,pad=1,bias=1,dtype=bf16,layout=nhwc,op=wgrad"
    p = replace(parse_shape(spec), batch=3)
    names = ("wgwtma_b64x128_p4_s2_bf16", "wgwdsm_b64x128_p4_s2_bf16")
    variants = [parse_variant_name(n) for n in names]
    rng = np.random.default_rng()
    xs = input_sets(p, 3, rng)
    _, w, bias = random_inputs(p, 1, rng)
    for v in variants:
        assert timed_plan(p, v).context["grads32"] == "mrsc"
        t = bench_variant(p, v, 3, xs, w, bias, ceilings())
        assert not t.verified and t.ms > 0, (v.name, t.verified)
    win, med, *_ = retime(p, variants, xs, w, bias)
    assert win in variants and all(med[v] > 0 for v in variants)


# ---- wgwhalo: every tap of a tile from one band of x's rows ----

# resnet's and vgg's 3x3 layers from 7x7 to 56x56 maps (one band of 7 rows padded to 9, 4
# rows of 14 padded to 16 with the last band past the image, 2 rows of 28, one of 56);
# dilation 2 in fp16; a 2x3 window unequally padded, with groups
HALO_LAYERS = [
    ("C=512,M=512,H=7,W=7,K=3,pad=1,dtype=bf16,layout=nhwc,op=wgrad", "wgwhalo_b64x64_p4_s2_bf16"),
    (
        "C=256,M=256,H=14,W=14,K=3,pad=1,dtype=bf16,layout=nhwc,op=wgrad",
        "wgwhalo_b64x64_p4_s4_bf16",
    ),
    (
        "C=128,M=128,H=28,W=28,K=3,pad=1,dtype=bf16,layout=nhwc,op=wgrad",
        "wgwhalo_b64x64_p6_s8_bf16",
    ),
    ("C=64,M=64,H=56,W=56,K=3,pad=1,dtype=bf16,layout=nhwc,op=wgrad", "wgwhalo_b64x64_p3_s1_bf16"),
    (
        "C=64,M=128,H=13,W=11,K=3,pad=2,dil=2,dtype=fp16,layout=nhwc,op=wgrad",
        "wgwhalo_b64x64_p4_s4_fp16",
    ),
    (
        "C=128,M=128,H=9,W=12,K=2x3,pad=0x1x2x0,groups=2,dtype=bf16,layout=nhwc,op=wgrad",
        "wgwhalo_b64x64_p3_s2_bf16",
    ),
    # strided: resnet50's layer4.0.conv2 and resnet18's layer4.0.conv1 (four phases of x,
    # taken every other row and column), stride 2x1 with dilation, stride 3 in fp16
    (
        "C=512,M=512,H=14,W=14,K=3,pad=1,stride=2,dtype=bf16,layout=nhwc,op=wgrad",
        "wgwhalo_b64x64_p3_s2_bf16",
    ),
    (
        "C=256,M=512,H=14,W=14,K=3,pad=1,stride=2,dtype=bf16,layout=nhwc,op=wgrad",
        "wgwhalo_b64x64_p4_s4_bf16",
    ),
    (
        "C=64,M=64,H=13,W=10,K=3,pad=2x1x1x2,stride=2x1,dil=2,dtype=bf16,layout=nhwc,op=wgrad",
        "wgwhalo_b64x64_p3_s2_bf16",
    ),
    (
        "C=64,M=128,H=20,W=17,K=3,pad=1,stride=3,dtype=fp16,layout=nhwc,op=wgrad",
        "wgwhalo_b64x64_p3_s1_fp16",
    ),
]


@st.composite
def halo_wgrads(draw):
    """Problems wgwhalo serves: no bias, windows up to 3x3 of two taps or more, 64-wide
    tiles of maps and channels, maps up to 30 rows and 40 columns (bands of one row to
    whole small images), strides 1 and 2 (up to four phases of x), dilation, every
    padding, groups, both 16-bit dtypes."""
    groups = draw(st.sampled_from([1, 1, 2]))
    cg, mg = 64 * draw(st.integers(1, 2)), 64 * draw(st.integers(1, 2))
    R, S = draw(st.sampled_from([(3, 3), (3, 3), (2, 2), (1, 3), (3, 1), (2, 3)]))
    H, W = draw(st.integers(R, 30)), draw(st.integers(S, 40))
    stride = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    dil = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    pads = "x".join(str(draw(st.integers(0, 2))) for _ in range(4))
    dtype = draw(st.sampled_from(["bf16", "fp16"]))
    return parsed_or_rejected(
        f"C={groups * cg},M={groups * mg},H={H},W={W},K={R}x{S},pad={pads},"
        f"stride={stride[0]}x{stride[1]},dil={dil[0]}x{dil[1]},groups={groups},"
        f"dtype={dtype},layout=nhwc,op=wgrad"
    )


@pytest.mark.parametrize("spec,name", HALO_LAYERS)
def test_wgwhalo_compiles_unserialized_with_a_warpgroup_a_window_row(spec, name):
    """No spills, the multiplies not serialized; a warpgroup a row of the window and the
    producer warp; dw stored by the one kernel, fp32 under grads32 too; a box of dy and
    one of x per stride phase a chunk."""
    from specgen.strategies.wsplit import with_fp32_grads

    p = parse_shape(spec)
    plan = make_plan(p, parse_variant_name(name))
    (main,) = plan.launches
    assert main.block == (128 * p.R + 32, 1, 1) and plan.workspace_bytes == 0
    assert [m.role for m in main.maps] == [Role.DY, Role.X]
    for form in (plan, with_fp32_grads(plan, "mrsc")):
        binary = compiled(form)
        assert binary.spills == 0 and SERIALIZED not in binary.log, binary.resources
    assert ptx_of(plan).count("cp.async.bulk.tensor.5d") == 1 + len(halo_layout(p).phases)
    # the zero-fill of one phase's buffer computes no phase
    phases = len(halo_layout(p).phases)
    assert phases > 1 or "const int ph =" not in render(plan), (spec, phases)


@pytest.mark.parametrize("spec,name", HALO_LAYERS)
def test_wgwhalo_rows_at_each_taps_shift_sum_to_the_weight_gradient(spec, name):
    """A NumPy replay of the copy unit and the taps' descriptors: over every band of the
    batch, dy's padded rows against x's rows of each tap's stride phase from the tap's
    shift (the rows no box writes zero) add up to the float64 wgrad of a 64 x 64 tile,
    for every tap."""
    import numpy as np

    from specgen.reference import conv2d_wgrad

    p = parse_shape(spec)
    plan = make_plan(p, parse_variant_name(name))
    h = halo_layout(p)
    sh = p.stride[0]
    grp = p.groups - 1
    src = render(plan)
    at_group = "grp" if p.groups > 1 else "0"
    assert f"m0 + 64 * k, {at_group}, 0, h0, n0);" in src
    assert src.count("&xmap, bar, c0,") == len(h.phases)
    images = 2
    rng = np.random.default_rng()
    x = rng.standard_normal((images, p.H, p.W, p.C)) + 2.0  # NHWC, no zeros
    dy = rng.standard_normal((images, p.Ho, p.Wo, p.M)) + 2.0
    want = conv2d_wgrad(x.transpose(0, 3, 1, 2), dy.transpose(0, 3, 1, 2), p)
    m0, c0 = p.Mg - 64, p.Cg - 64  # the group's last tile
    dymap, xmap = plan.launches[0].maps
    got = np.zeros((p.R, p.S, 64, 64))
    for u in range(images * h.bands):
        n0, band = divmod(u, h.bands)
        h0 = band * h.hb
        a = np.zeros((16 * h.ksteps, 64))
        a[: h.rows] = box_load(dy.reshape(-1), dymap, (m0, grp, 0, h0, n0), images)
        phases = []
        for col, row in h.phases:
            b = np.zeros((h.xread, 64))
            corner = (c0, grp, col, sh * h0 + row, n0)
            b[: h.xrows] = box_load(x.reshape(-1), xmap, corner, images)
            phases.append(b)
        for r in range(p.R):
            for s in range(p.S):
                b, at = phases[h.phase_of[r][s]], h.shifts[r][s]
                got[r, s] += a.T @ b[at : at + 16 * h.ksteps]
    ref = want[grp * p.Mg + m0 : grp * p.Mg + m0 + 64, c0 : c0 + 64].transpose(2, 3, 0, 1)
    assert np.allclose(got, ref, rtol=1e-12, atol=1e-9), np.abs(got - ref).max()


@pytest.mark.parametrize(
    "spec,words",
    [
        (
            "C=64,M=64,H=16,W=270,K=3,pad=1,stride=8,dtype=bf16,layout=nhwc,op=wgrad",
            "past the copy unit's 256",
        ),
        ("C=64,M=64,H=14,W=14,K=3,pad=1,bias=1,dtype=bf16,layout=nhwc,op=wgrad", "a bias"),
        ("C=64,M=64,H=14,W=14,K=5,pad=2,dtype=bf16,layout=nhwc,op=wgrad", "up to 3 x 3"),
        ("C=64,M=64,H=70,W=70,K=3,pad=1,dtype=bf16,layout=nhwc,op=wgrad", "72 positions"),
    ],
)
def test_wgwhalo_refuses_what_its_rows_cannot_take(spec, words):
    with pytest.raises(SpecError) as e:
        make_plan(parse_shape(spec), parse_variant_name("wgwhalo_b64x64_p4_s2_bf16"))
    assert words in str(e.value) and "wgwdsm" in str(e.value) and "\n" not in str(e.value)


def test_wgwhalo_space_and_fit_keep_the_64_tile_and_a_portable_cluster():
    """The space: the 64 x 64 tile, three stage counts at most, slices 1, 2, 4 and 8, each
    member planning; the fit fills the SMs (resnet50's 7x7 layer at B=32: 64 tiles, two
    slices); a tile that does not divide a group's maps is no member."""
    p = parse_shape("C=512,M=512,H=7,W=7,K=3,pad=1,dtype=bf16,layout=nhwc,op=wgrad")
    space = Wgwhalo.space(p, Precision.BF16)
    assert {v.blocktile for v in space} == {(64, 64)} and len(space) >= 8
    assert {v.splits for v in space} == {1, 2, 4, 8}
    for v in space:
        make_plan(p, v)
    assert Wgwhalo.default(replace(p, batch=32), Precision.BF16).splits == 2
    narrow = parse_shape("C=96,M=64,H=7,W=7,K=3,pad=1,dtype=bf16,layout=nhwc,op=wgrad")
    assert Wgwhalo.space(narrow, Precision.BF16) == []


@pytest.mark.gpu
@pytest.mark.parametrize("spec,name", HALO_LAYERS)
def test_wgwhalo_layers_on_the_gpu(spec, name):
    """Each layer's kernel against the float64 reference at a batch that leaves slices
    past the batch's bands."""
    verify_on_the_gpu(parse_shape(spec), [parse_variant_name(name)], 3)


@pytest.mark.gpu
@settings(max_examples=12, **GPU_DRAWS)
@given(p=halo_wgrads(), batch=st.integers(1, 5), pick=st.integers(0, 10**6))
def test_wgwhalo_drawn_problems_on_the_gpu(p, batch, pick):
    """wgwhalo's default and a drawn member of its space on drawn problems: bands of one
    row to whole images, the padded positions past a row, stride phases, dilation,
    groups."""
    verify_on_the_gpu(p, default_and_drawn(p, Wgwhalo, MATH[p.dtype], pick), batch)


@pytest.mark.gpu
@pytest.mark.parametrize("weights", ["contiguous", "channels_last"])
def test_wgwhalo_writes_the_operators_fp32_grads(monkeypatch, weights):
    """The PyTorch operator under autocast with fp32 weights: wgwhalo's dw is fp32 in the
    weights' memory format, every element written, and within fp32 rounding of wgwdsm's
    (the same bf16 products, summed in another order)."""
    torch = pytest.importorskip("torch")
    x, w, _, dy = _autocast_tensors(weights)
    (dw0,) = _autocast_grads(monkeypatch, "wgwdsm_b64x128_p4_s4_bf16", x, w, None, dy)
    (dw1,) = _autocast_grads(monkeypatch, "wgwhalo_b64x64_p4_s4_bf16", x, w, None, dy)
    assert dw1.dtype == torch.float32
    fmt = torch.channels_last if weights == "channels_last" else torch.contiguous_format
    assert dw1.is_contiguous(memory_format=fmt)
    assert not dw1.isnan().any()
    assert torch.allclose(dw1, dw0, rtol=1e-4, atol=1e-3 * dw0.abs().max().item())
