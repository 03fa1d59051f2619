"""wgmma, the implicit GEMM on Hopper's warpgroup tensor cores: what ptxas makes of it
for sm_90a (CPU tier), its limits and architecture, the planner's choice, and its
numbers on drawn problems (GPU tier)."""

import re
from dataclasses import replace

import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

from problems import (
    i2c_problems,
    DRAWN_COMPILES,
    GPU_DRAWS,
    assert_one_line_refusal,
    default_and_drawn,
    that_plan,
    flat_tma_problems,
    row_tma_problems,
    tma_problems,
    verify_on_the_gpu,
    wgmma_problems,
)
from ptx import SERIALIZED, compiled, ptx_of
from specgen.choose import planned
from specgen.errors import SpecError
from specgen.plan import make_plan
from specgen.render import render
from specgen.shapes import PRESETS, Op, parse_shape
from specgen.strategies import Wgdsm, Wgmma, default_set, parse_variant_name
from specgen.strategies.tcgemm import MATH
from specgen.plan.common import thread_registers
from specgen.strategies.wgmma import PIXEL_TILES, Feed, row_tiles
from specgen.tensors import Role
from specgen.tma import box_load, im2col_load
from specgen.variants import Precision

AE_ENC2_BF16 = "C=256,M=128,H=16,W=16,K=3,pad=1,dtype=bf16,layout=nhwc"
AE_ENC2_TF32 = "C=256,M=128,H=16,W=16,K=3,pad=1,bias=1,layout=nhwc"  # fp32 tensors


def test_ae_enc2_bf16_compiles_for_sm_90a_with_wgmma_from_shared_memory():
    """The issue's CPU check for the sm_90 path: no spills, the multiplies not
    serialized by ptxas, and in the PTX the warpgroup MMA with its fences and what
    feeds it (the default's TMA copies, or 16-byte cp.async)."""
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
    if v.feed is Feed.TMA:  # the copy unit writes, an mbarrier counts the bytes
        assert "cp.async.bulk.tensor.5d.shared::cluster.global.tile" in ptx
    else:
        assert "fence.proxy.async.shared::cta;" in ptx  # cp.async writes, wgmma reads
        assert re.search(r"cp\.async\.cg\.shared\.global \[%r\d+\], \[%rd\d+\], 16", ptx)
    if v.feed is not Feed.SY:  # the producer and the consumers meet at mbarriers
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
    """Every candidate of the space plans or refuses in one line, and the planned ones
    that bring an option's value no compiled one had yet (every value of every option
    compiled at least once) compile without spills or a serialized wgmma."""
    import dataclasses

    p = parse_shape(AE_ENC2_BF16)
    planned_count, covered = 0, set()
    for v in Wgmma.space(p, Precision.BF16):
        try:
            plan = make_plan(p, v)
        except SpecError as e:
            assert "\n" not in str(e)
            continue
        planned_count += 1
        values = {(f.name, getattr(v, f.name)) for f in dataclasses.fields(v)}
        if values <= covered:
            continue
        covered |= values
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
        (AE_ENC2_BF16, "wgmma_b256x192_p4_q1_gr_tma_bf16", "over the 128 that 416"),
        (AE_ENC2_BF16 + ",stride=2,op=dgrad", "wgmma_b128x128_p4_q1_gr_i2c_bf16", "phases"),
        (AE_ENC2_BF16.replace("K=3,pad=1", "K=1"), "wgmma_b128x128_p4_q1_gr_i2c_bf16", "tma"),
        (
            "C=192,M=128,H=16,W=16,K=3,pad=1,dtype=bf16,layout=nhwc,groups=8",
            "wgmma_b128x128_p4_q1_gr_i2c_bf16",
            "past a group's 24",
        ),
        (AE_ENC2_BF16.replace("pad=1", "pad=130"), "wgmma_b128x64_p6_q1_gr_i2c_bf16", "corners"),
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


@pytest.mark.gpu
@pytest.mark.parametrize("shard", range(2))  # two draws, side by side
@settings(
    max_examples=11,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
)
@given(p=wgmma_problems(), batch=st.integers(1, 5), pick=st.integers(0, 10**6))
def test_drawn_problems_on_the_gpu(shard, p, batch, pick):
    """The default variant and one drawn from tune's space, against the float64
    reference: pixels past the batch, maps past the tile, channels past the chunk,
    the window's zero-fill, and the staged epilogue's bias and relu."""
    precision = MATH[p.dtype]
    verify_on_the_gpu(p, default_and_drawn(p, Wgmma, precision, pick), batch)


@pytest.mark.gpu
@pytest.mark.parametrize("shard", range(2))  # two draws, side by side
@settings(max_examples=11, **GPU_DRAWS)
@given(
    p=wgmma_problems(ops=("dgrad",), least_stride=2),
    batch=st.integers(1, 5),
    pick=st.integers(0, 10**6),
)
def test_drawn_strided_dgrads_on_the_gpu(shard, p, batch, pick):
    """A strided dgrad's phases (blockIdx.z) cover dx once: phases of different pixel
    counts and taps, phases that no tap reaches (their dx written as zeros), images
    smaller than the stride in one axis."""
    verify_on_the_gpu(p, default_and_drawn(p, Wgmma, MATH[p.dtype], pick), batch)


def test_a_strided_dgrad_is_a_gemm_a_phase_on_every_warps_copies():
    """Strided bf16 dgrads take wgmma in phases (the planner's pick, before tcgemm), with
    the cp.async feed: a phase's pixels are not whole rows of a TMA box."""
    p = parse_shape("C=128,M=128,H=56,W=56,K=3,pad=1,stride=2,dtype=bf16,layout=nhwc,op=dgrad")
    v = planned(p, False).variant
    assert v.key == "wgmma" and v.feed.value == "sy" and not v.persistent, v.name
    plan = make_plan(p, v)
    assert plan.launches[0].grid[2] == 4 and plan.weight_transform == "dgrad"
    text = render(plan)
    assert "switch (blockIdx.z)" in text and "taps r [0, 2] x s [0, 2]" in text
    with pytest.raises(SpecError, match="every warp"):
        make_plan(p, replace(v, feed=Feed.TMA))
    assert all(c.feed.value == "sy" and not c.persistent for c in Wgmma.space(p, v.precision))


@settings(max_examples=DRAWN_COMPILES, deadline=None, suppress_health_check=list(HealthCheck))
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


# ---- tma: the TMA feed ----


def tma_variants(p) -> list:
    """The tma members of the tune space that plan for p."""
    space = Wgmma.space(Wgmma.problem_for(p), MATH[p.dtype])
    return that_plan(p, [v for v in space if v.feed is Feed.TMA])


def _load(x, p, v, plan, lr, ls, lc, p0, n0, grp, images):
    """The producer's two boxes of chunk (lr, ls, lc) for the tile at p0, n0 of group
    grp, at the coordinates the kernel gives them (wgmma.cu.j2, tma)."""
    xmap, wmap = plan.launches[0].maps
    c = plan.context
    n, oh0 = p0 // (p.Ho * p.Wo), p0 % (p.Ho * p.Wo) // p.Wo
    if c["im2col"]:  # the window's corner at the tile's first pixel, the tap its offset
        corner = (grp * p.Cg + lc, p0 % p.Wo * c["sw"] - c["pl"], oh0 * c["sh"] - c["pt"], n)
        xs = im2col_load(x[0], xmap, corner, (ls * c["dw"], lr * c["dh"]), images)
    elif c["flat"]:  # a 1x1 layer's rows of the batch's pixels
        xs = box_load(x[0], xmap, (lc, grp, 0, 0, p0), images)
    else:
        at = (lc, grp, ls * c["dw"] - c["pl"], oh0 + lr * c["dh"] - c["pt"], n)
        xs = box_load(x[0], xmap, at, images)
    ws = box_load(x[1], wmap, (lc, lr * p.S + ls, n0, grp))
    return xs, ws


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    p=st.one_of(tma_problems(), flat_tma_problems()),
    images=st.integers(1, 3),
    pick=st.integers(0, 10**6),
)
def test_tma_boxes_hold_the_tiles_operands(p, images, pick):
    """A NumPy replay of the copy unit: for a drawn problem and tile, each chunk's x box
    holds the tile's pixels in order at that tap (zeros in the padding, past the batch
    and past the group's channels) and its w box the tile's maps' weights there (zeros
    past the group's maps and channels), as the implicit GEMM's operands are defined.
    1x1 layers at stride 1, unpadded, take any tile: its pixels as the batch's rows."""
    variants = tma_variants(p)
    assume(variants)
    _assert_boxes_hold_the_operands(p, variants[pick % len(variants)], images, pick)


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(p=row_tma_problems(), images=st.integers(1, 3), pick=st.integers(0, 10**6))
def test_tma_row_tiles_hold_the_tiles_operands(p, images, pick):
    """The same replay for the tiles of whole rows that no power-of-two tile is (112 or
    224 pixels of 14-, 28- or 56-pixel rows, say)."""
    variants = [v for v in tma_variants(p) if v.blocktile[0] not in PIXEL_TILES]
    assume(variants)
    _assert_boxes_hold_the_operands(p, variants[pick % len(variants)], images, pick)


def i2c_variants(p) -> list:
    """The i2c members of the tune space that plan for p."""
    space = Wgmma.space(Wgmma.problem_for(p), MATH[p.dtype])
    return that_plan(p, [v for v in space if v.feed is Feed.I2C])


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(p=i2c_problems(), images=st.integers(1, 3), pick=st.integers(0, 10**6))
def test_i2c_copies_hold_the_tiles_operands(p, images, pick):
    """The replay for x copied in im2col mode (``tma.im2col_load``, the copy unit's walk
    of the filter corner's positions): any map, stride, dilation and padding, tiles that
    end inside a row and inside an image, past the batch; each chunk holds the tile's
    pixels at that tap, zeros in the padding and past the channels."""
    variants = i2c_variants(p)
    assume(variants)
    _assert_boxes_hold_the_operands(p, variants[pick % len(variants)], images, pick)


def _assert_boxes_hold_the_operands(p, v, images, pick):
    import numpy as np

    p = Wgmma.problem_for(p)  # the forward problem the kernel computes
    plan = make_plan(p, v)
    bn, bm = v.blocktile
    chunk = plan.context["CHUNK"]
    rng = np.random.default_rng(pick)
    x = rng.standard_normal((images, p.H, p.W, p.C)) + 3.0  # no zero among them
    w = rng.standard_normal((p.M, p.R, p.S, p.Cg)) + 3.0
    flat = (x.reshape(-1), w.reshape(-1))
    pixels = images * p.Ho * p.Wo
    p0 = bn * rng.integers(0, -(-pixels // bn))
    n0 = bm * rng.integers(0, -(-p.Mg // bm))
    grp = int(rng.integers(0, p.groups))
    (dh, dw), (pt, _, pl, _), (sh, sw) = p.dil, p.pads, p.stride
    for lr in range(p.R):
        for ls in range(p.S):
            for lc in range(0, p.Cg, chunk):
                xs, ws = _load(flat, p, v, plan, lr, ls, lc, p0, n0, grp, images)
                assert xs.shape == (bn, chunk) and ws.shape == (bm, chunk)
                want_x = np.zeros((bn, chunk))
                for i in range(bn):
                    q = p0 + i
                    n, oh, ow = q // (p.Ho * p.Wo), q % (p.Ho * p.Wo) // p.Wo, q % p.Wo
                    ih, iw = oh * sh + lr * dh - pt, ow * sw + ls * dw - pl
                    if n < images and 0 <= ih < p.H and 0 <= iw < p.W:
                        cs = slice(grp * p.Cg + lc, grp * p.Cg + min(lc + chunk, p.Cg))
                        want_x[i, : cs.stop - cs.start] = x[n, ih, iw, cs]
                want_w = np.zeros((bm, chunk))
                for m in range(min(bm, p.Mg - n0)):
                    row = w[grp * p.Mg + n0 + m, lr, ls, lc : lc + chunk]
                    want_w[m, : len(row)] = row
                assert np.array_equal(xs, want_x), (p.spec, v.name, lr, ls, lc, p0)
                assert np.array_equal(ws, want_w), (p.spec, v.name, lr, ls, lc, n0)


def test_tma_compiles_to_bulk_tensor_copies_under_mbarriers():
    """The issue's other CPU check: ae-enc2 bf16 with the TMA feed compiles for sm_90a
    with no spills and unserialized wgmma, its PTX issuing cp.async.bulk.tensor from the
    __grid_constant__ maps, with transaction-counted mbarriers and no cp.async."""
    p = PRESETS["ae-enc2-bf16"]
    plan = make_plan(p, parse_variant_name("wgmma_b256x128_p4_q2_gr_tma_bf16"))
    binary = compiled(plan)
    assert binary.spills == 0 and SERIALIZED not in binary.log, binary.resources
    ptx = ptx_of(plan)
    assert "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes" in ptx
    assert "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes" in ptx
    assert "mbarrier.arrive.expect_tx.shared::cta.b64" in ptx
    assert "cp.async.cg" not in ptx
    assert plan.launches[0].block == (288, 1, 1)  # two consumer warpgroups and a producer warp
    xmap, wmap = plan.launches[0].maps
    assert xmap.box == (64, 1, 16, 16, 1) and wmap.box == (64, 1, 128, 1)
    assert plan.context["a_stage"] + plan.context["b_stage"] == xmap.box_bytes + wmap.box_bytes


@pytest.mark.parametrize(
    "spec",
    [
        # resnext50's and resnet50's 1x1 layers, whose tiles end inside an output row
        "C=256,M=512,H=28,W=28,K=1,dtype=bf16,layout=nhwc",
        "C=512,M=1024,H=14,W=14,K=1,dtype=bf16,layout=nhwc,op=dgrad",
        "C=1024,M=2048,H=7,W=7,K=1,dtype=bf16,layout=nhwc",
        "C=256,M=128,H=56,W=56,K=1,dtype=fp32,layout=nhwc",
    ],
)
def test_a_1x1_layer_takes_the_tma_feed_in_any_pixel_tile(spec):
    """A 1x1 layer at stride 1 without padding reads x at the output's own pixel: its
    TMA box is the tile's run of the batch's pixels, so tiles of 128 and 256 pixels that
    end inside a 28-, 14- or 7-pixel row take the feed (whole rows refused them, and
    every warp copied instead).  Each compiles for sm_90a with no spills and
    unserialized wgmma, its x box one chunk by the tile's pixels."""
    p = parse_shape(spec)
    q = Wgmma.problem_for(p)
    for bn, bm in ((128, 128), (256, 128)):
        name = f"wgmma_b{bn}x{bm}_p4_q1_gr_tma_{MATH[q.dtype].value}"
        plan = make_plan(q, parse_variant_name(name))
        xmap, wmap = plan.launches[0].maps
        assert plan.context["flat"] and xmap.box == (plan.context["CHUNK"], 1, 1, 1, bn)
        assert xmap.sized(3) == (q.Cg, q.groups, 1, 1, 3 * q.H * q.W)
        binary = compiled(plan)
        assert binary.spills == 0 and SERIALIZED not in binary.log, (name, binary.resources)
    assert Wgmma.default(q, MATH[q.dtype]).feed is Feed.TMA


@pytest.mark.parametrize(
    "spec, name, words",
    [
        (AE_ENC2_BF16 + ",stride=2", "wgmma_b128x128_p4_q2_gr_tma_bf16", "stride 1"),
        (
            "C=64,M=64,H=7,W=7,K=3,pad=1,dtype=bf16,layout=nhwc",
            "wgmma_b64x64_p4_q2_gr_tma_bf16",
            "whole output rows",
        ),
        (AE_ENC2_BF16, "wgmma_b256x128_p3_q2_pe_tma_bf16", "registers"),
    ],
)
def test_tma_refusals_are_one_line(spec, name, words):
    assert_one_line_refusal(spec, name, words)


def test_the_launcher_points_each_map_at_its_encoding(monkeypatch):
    """The runtime's side: a map parameter points at the 128-byte encoding for the
    address its tensor is at, encoded once per address (the driver mocked)."""
    import ctypes

    from specgen import runtime, tma

    calls = []

    def fake(m, ptr, images):
        calls.append((m.role, ptr, images))
        return (ctypes.c_ubyte * 192)()

    monkeypatch.setattr(tma, "encode", fake)
    m = tma.TensorMap(Role.X, 2, (64, 1, 16, 16, None), (128, 128, 2048, 32768), (64, 1, 16, 16, 1))
    bound = tma.BoundMap(m, 5)
    st_ = runtime._Step(0, (1, 1, 1), (32, 1, 1), 0, [(Role.Y, 0), (Role.X, bound, 4096)])
    launched = []
    monkeypatch.setattr(
        "cupy.cuda.driver.launchKernel", lambda *a: launched.append(st_.params[1]), raising=False
    )
    launcher = runtime.Launcher([st_])
    launcher({Role.X: 1 << 20, Role.Y: 1 << 24}, 0)
    launcher({Role.X: 1 << 20, Role.Y: 1 << 24}, 0)
    launcher({Role.X: 1 << 21, Role.Y: 1 << 24}, 0)
    assert calls == [(Role.X, (1 << 20) + 4096, 5), (Role.X, (1 << 21) + 4096, 5)]
    assert launched[0] == launched[1] != launched[2] and launched[0] % 64 == 0
    assert st_.slots[0] == 1 << 24


# vgg11's and resnet's 3x3 layers on 56x56 and 28x28 maps, and a 112x112 one
ROW_TILE_LAYERS = [
    "C=256,M=256,H=56,W=56,K=3,pad=1,dtype=bf16,layout=nhwc",
    "C=512,M=512,H=28,W=28,K=3,pad=1,dtype=bf16,layout=nhwc,op=dgrad",
    "C=64,M=128,H=112,W=112,K=3,pad=1,bias=1,act=relu,dtype=fp16,layout=nhwc",
    "C=128,M=128,H=56,W=56,K=3,pad=1,layout=nhwc",
]


@pytest.mark.parametrize("spec", ROW_TILE_LAYERS)
def test_the_networks_maps_take_tma_in_tiles_of_whole_rows(spec):
    """Where no power-of-two tile is whole rows of the map, the tune space holds tma in
    tiles that are (112 pixels on 28x28 maps, 112 and 224 on 56x56 and 112x112 ones),
    and each compiles without spills or a serialized wgmma."""
    p = parse_shape(spec)
    q = Wgmma.problem_for(p)
    tiles = row_tiles(q)
    assert tiles and all(q.Ho * q.Wo % bn == 0 or bn % (q.Ho * q.Wo) == 0 for bn in tiles)
    assert all(bn % q.Wo == 0 and bn % 8 == 0 and bn not in PIXEL_TILES for bn in tiles)
    rows = [v for v in Wgmma.space(q, MATH[p.dtype]) if v.blocktile[0] in tiles]
    assert rows and all(v.feed is Feed.TMA for v in rows)
    for v in that_plan(p, rows):  # a persistent 224-pixel tile is refused its registers
        binary = compiled(make_plan(p, v))
        assert binary.spills == 0 and SERIALIZED not in binary.log, (v.name, binary.resources)


@settings(max_examples=DRAWN_COMPILES, deadline=None, suppress_health_check=list(HealthCheck))
@given(p=row_tma_problems(), pick=st.integers(0, 10**6))
def test_drawn_row_tiles_compile_without_spills(p, pick):
    """A drawn tile of whole rows (any multiple of 8 pixels: the sums' registers are
    listed to the wgmma in runs of 16 and 8 that need not fill the last) compiles for
    sm_90a without spills or a serialized wgmma."""
    variants = [v for v in tma_variants(p) if v.blocktile[0] not in PIXEL_TILES]
    assume(variants)
    v = variants[pick % len(variants)]
    binary = compiled(make_plan(p, v))
    assert binary.spills == 0 and SERIALIZED not in binary.log, (v.name, binary.resources)


PROBE = """extern "C" __global__ void __launch_bounds__(%d, %d) k(float* a, const float* b)
{
    float v[200];
#pragma unroll
    for (int i = 0; i < 200; i++) v[i] = b[threadIdx.x * 200 + i];
#pragma unroll
    for (int i = 0; i < 200; i++) v[i] = v[i] * v[(i * 7 + 1) %% 200] + 1.0f;
    float s = 0;
#pragma unroll
    for (int i = 0; i < 200; i++) s += v[i] * v[199 - i];
    a[threadIdx.x] = s;
}"""


@pytest.mark.parametrize("threads,per_sm", [(288, 2), (416, 1), (160, 2), (544, 1), (224, 2)])
def test_the_register_bound_is_ptxas_own(threads, per_sm):
    """A kernel that wants every register it can get is held by ptxas to what ``thread_registers``
    says ``__launch_bounds__(threads, per_sm)`` leaves a thread (a quarter of the SM's
    file over every fourth warp), the bound the plan sizes its sums by."""
    from specgen.compile import compile_source

    binary = compile_source(PROBE % (threads, per_sm), "k", "sm_90a")
    assert binary.resources["k"].registers == thread_registers(threads, per_sm)


@pytest.mark.parametrize("spec", ["H=8,W=17", "H=12,W=12"])
def test_a_row_tile_past_two_blocks_registers_takes_one_block_an_sm(spec):
    """Under ``__launch_bounds__(288, 2)`` ptxas gives a thread 96 registers (the SM's file
    over warps counted in pairs): too few for the 68 or 72 sums of a 136- or 144-pixel
    tile and their wgmma.  Such a tile plans one block an SM and compiles (it failed in
    ptxas on the GPU tier)."""
    p = parse_shape(f"C=96,M=128,{spec},K=3,pad=1,groups=2,bias=1,act=relu,layout=nhwc")
    bn = p.H * p.W
    plan = make_plan(p, parse_variant_name(f"wgmma_b{bn}x128_p3_q1_gr_tma_tf32", p))
    assert plan.context["per_sm"] == 1
    assert compiled(plan).spills == 0


def test_a_tile_that_is_not_a_power_of_two_takes_tma_alone():
    """112 pixels are whole rows of a 56-pixel map, but every warp's copies (sy, ws) and
    tiles that are not whole rows keep to 64, 128, 192 and 256 pixels."""
    p = parse_shape("C=256,M=256,H=56,W=56,K=3,pad=1,dtype=bf16,layout=nhwc")
    make_plan(p, parse_variant_name("wgmma_b112x128_p4_q1_gr_tma_bf16", p))
    for name, words in (
        ("wgmma_b112x128_p4_q1_gr_sy_bf16", "with --feed tma"),
        ("wgmma_b120x128_p4_q1_gr_tma_bf16", "not whole rows"),
        ("wgmma_b116x128_p4_q1_gr_tma_bf16", "one of 64, 128, 192, 256"),
    ):
        with pytest.raises(SpecError, match=words):
            make_plan(p, parse_variant_name(name, p))


@pytest.mark.gpu
@settings(max_examples=20, **GPU_DRAWS)
@given(p=row_tma_problems(), batch=st.integers(1, 5), pick=st.integers(0, 10**6))
def test_tma_row_tiles_on_drawn_problems_on_the_gpu(p, batch, pick):
    """The tiles of whole rows that are no power of two against the float64 reference,
    in wgmma and in wgdsm's slices: boxes past the batch, channels past the chunk, maps
    past the tile, groups, bias and relu, forward and through dgrad's view."""
    from specgen.strategies import Wgdsm

    variants = [v for v in tma_variants(p) if v.blocktile[0] not in PIXEL_TILES]
    assume(variants)
    sliced = Wgdsm.space(Wgdsm.problem_for(p), MATH[p.dtype])
    sliced = that_plan(p, [v for v in sliced if v.blocktile[0] not in PIXEL_TILES])
    picked = [variants[pick % len(variants)], *sliced[pick % max(1, len(sliced)) :][:1]]
    verify_on_the_gpu(p, picked, batch)


@pytest.mark.gpu
@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
)
@given(
    p=st.one_of(tma_problems(), flat_tma_problems()),
    batch=st.integers(1, 5),
    pick=st.integers(0, 10**6),
)
def test_tma_on_drawn_problems_on_the_gpu(p, batch, pick):
    """The TMA feed against the float64 reference on drawn problems, forward and through
    dgrad's view: boxes past the batch and the image, channels past the chunk, maps past
    the tile, groups, bias and relu."""
    variants = tma_variants(p)
    assume(variants)
    verify_on_the_gpu(p, [variants[pick % len(variants)]], batch)


I2C_LAYERS = [  # resnet50's and vgg11's 3x3 layers that no tma box of whole rows takes
    "C=256,M=256,H=14,W=14,K=3,pad=1,dtype=bf16,layout=nhwc",
    "C=512,M=512,H=7,W=7,K=3,pad=1,dtype=bf16,layout=nhwc",
    "C=128,M=128,H=56,W=56,K=3,pad=1,stride=2,dtype=bf16,layout=nhwc",
    "C=512,M=512,H=14,W=14,K=3,pad=1,bias=1,dtype=bf16,layout=nhwc",
    "C=256,M=256,H=14,W=14,K=3,pad=1,dtype=bf16,layout=nhwc,op=dgrad",
    "C=256,M=256,H=14,W=14,K=3,pad=1,dtype=fp32,layout=nhwc",
]


@pytest.mark.parametrize("spec", I2C_LAYERS)
def test_the_networks_small_maps_take_i2c_and_compile(spec):
    """Where no box of whole rows fits (14x14 and 7x7 maps, stride 2), the tune space
    holds x's copy in im2col mode, and each such tile compiles for sm_90a without
    spills or a serialized wgmma."""
    p = parse_shape(spec)
    variants = i2c_variants(p)
    assert len(variants) >= 6
    for v in variants:
        binary = compiled(make_plan(p, v))
        assert binary.spills == 0 and SERIALIZED not in binary.log, (v.name, binary.resources)


@pytest.mark.gpu
@pytest.mark.parametrize("shard", range(2))  # two draws, side by side
@settings(max_examples=11, **GPU_DRAWS)
@given(p=i2c_problems(), batch=st.integers(1, 5), pick=st.integers(0, 10**6))
def test_i2c_on_drawn_problems_on_the_gpu(shard, p, batch, pick):
    """x copied in im2col mode against the float64 reference, in wgmma and in wgdsm's
    slices: any map, stride, dilation and padding, tiles across rows, images and the
    batch's end, groups, bias and relu, forward and stride-1 dgrad."""
    from specgen.strategies import Wgdsm

    variants = i2c_variants(p)
    assume(variants)
    sliced = Wgdsm.space(Wgdsm.problem_for(p), MATH[p.dtype])
    sliced = that_plan(p, [v for v in sliced if v.feed is Feed.I2C])
    picked = [variants[pick % len(variants)], *sliced[pick % max(1, len(sliced)) :][:1]]
    verify_on_the_gpu(p, picked, batch)


@pytest.mark.gpu
@pytest.mark.parametrize("spec", I2C_LAYERS)
def test_i2c_on_the_networks_layers_on_the_gpu(spec):
    """Every i2c tile of the networks' small-map layers against float64, 3 images."""
    p = parse_shape(spec)
    verify_on_the_gpu(p, i2c_variants(p), 3)


def _driver_arguments(monkeypatch, m, images):
    """The arguments ``tma.encode`` gives the driver for ``m``, arrays as lists."""
    from specgen import tma

    seen = {}

    def driver(name="cuTensorMapEncodeTiled"):
        def call(*args):
            seen[name] = [
                list(a) if hasattr(a, "_length_") else getattr(a, "value", a) for a in args
            ]
            return 0

        return call

    monkeypatch.setattr(tma, "_encode_function", driver)
    tma.encode(m, 1 << 20, images)
    ((name, args),) = seen.items()
    return name, args[1:]  # past the map's own address


def test_the_driver_gets_each_map_innermost_first(monkeypatch):
    """cuTensorMapEncodeTiled and cuTensorMapEncodeIm2col get the maps' numbers in their
    order: data type, rank, address, dims (the images counted), strides, then the box
    and traversal; or the corners, channels, pixels and the steps (1 for C and the
    images); then no interleave, the 128-byte swizzle, 256-byte L2 promotion, zeros."""
    from specgen import tma

    tiled = tma.TensorMap(
        Role.X, 2, (64, 1, 16, 16, None), (128, 128, 2048, 32768), (64, 1, 8, 2, 1)
    )
    name, args = _driver_arguments(monkeypatch, tiled, 5)
    assert name == "cuTensorMapEncodeTiled"
    assert args == [
        1,
        5,
        1 << 20,
        [64, 1, 16, 16, 5],
        [128, 128, 2048, 32768],
        [64, 1, 8, 2, 1],
        [1, 1, 1, 1, 1],
        0,
        3,
        3,
        0,
    ]
    p = parse_shape("C=96,M=64,H=13,W=11,K=3x5,pad=1x1x2x2,stride=2x3,layout=nhwc,dtype=bf16")
    xmap = (
        make_plan(p, parse_variant_name("wgmma_b128x64_p6_q1_gr_i2c_bf16", p)).launches[0].maps[0]
    )
    name, args = _driver_arguments(monkeypatch, xmap, 3)
    assert name == "cuTensorMapEncodeIm2col"
    upper_w, upper_h = (p.Wo - 1) * 3 - 2 - 10, (p.Ho - 1) * 2 - 1 - 12
    assert args == [
        1,
        4,
        1 << 20,
        [96, 11, 13, 3],
        [192, 11 * 192, 13 * 11 * 192],
        [-2, -1],
        [upper_w, upper_h],
        64,
        128,
        [1, 3, 2, 1],
        0,
        3,
        3,
        0,
    ]


# Persistent tma and i2c: problems of more tiles than a grid of resident blocks (132 SMs
# on the H200), so that each block walks several, at the batch given.
PERSISTENT_CASES = [
    ("C=64,M=256,H=64,W=64,K=3,pad=1,dtype=bf16,layout=nhwc", "b128x128_p4_q2_pe_i2c", 8),
    (
        "C=64,M=128,H=64,W=64,K=3,pad=1,stride=2,bias=1,act=relu,dtype=fp16,layout=nhwc",
        "b128x64_p6_q2_pe_i2c",
        16,
    ),
    (
        "C=64,M=128,H=32,W=32,K=3,pad=1,bias=1,act=relu,dtype=bf16,layout=nhwc",
        "b128x64_p6_q2_pe_tma",
        40,
    ),
    ("C=64,M=128,H=32,W=32,K=3,pad=1,dtype=bf16,layout=nhwc", "b256x64_p4_q2_pe_tma", 40),
    ("C=64,M=128,H=32,W=32,K=3,pad=1,layout=nhwc", "b128x64_p6_q2_pe_i2c", 20),
    ("C=128,M=256,H=28,W=28,K=3,pad=1,groups=2,dtype=bf16,layout=nhwc", "b128x64_p6_q2_pe_i2c", 24),
    ("C=96,M=64,H=30,W=30,K=3,pad=1,dtype=bf16,layout=nhwc,op=dgrad", "b128x128_p4_q2_pe_i2c", 40),
    ("C=128,M=128,H=56,W=56,K=3,pad=1,dtype=bf16,layout=nhwc", "b112x128_p4_q2_pe_tma", 6),
]


def _persistent(spec, tile):
    p = parse_shape(spec)
    precision = {"bf16": "bf16", "fp16": "fp16"}.get(p.dtype.value, "tf32")
    return p, parse_variant_name(f"wgmma_{tile}_{precision}", p)


@pytest.mark.parametrize("spec,tile,batch", PERSISTENT_CASES)
def test_persistent_tma_compiles_without_spills(spec, tile, batch):
    """The persistent form with the tma and i2c feeds (the sums staged after the ring, the
    producer walking the block's tiles ahead of the consumers) compiles for sm_90a with
    no spills and unserialized wgmma, and plans a grid of tiles past its blocks."""
    p, v = _persistent(spec, tile)
    plan = make_plan(p, v)
    binary = compiled(plan)
    assert binary.spills == 0 and SERIALIZED not in binary.log, (v.name, binary.resources)
    bn, bm = v.blocktile
    q = Wgmma.problem_for(p)
    tiles = -(-batch * q.Ho * q.Wo // bn) * -(-q.Mg // bm) * q.groups
    assert tiles > 132 * plan.context["per_sm"], (v.name, tiles)


@pytest.mark.gpu
@pytest.mark.parametrize("spec,tile,batch", PERSISTENT_CASES)
def test_persistent_tma_walks_several_tiles_a_block_on_the_gpu(spec, tile, batch):
    """Against float64: each block's walk over several tiles, the chunk count running on
    across them (the ring's phases), the last chunk of a tile given back after its wait,
    the next tile's chunks copied while the staged sums go out."""
    p, v = _persistent(spec, tile)
    verify_on_the_gpu(p, [v], batch)


# ---- narrow rows: the 64- and 32-byte swizzles ----

# Groups of few channels (spec, the ring row's bytes): a 1x1 layer's flat tma box, the
# channels past a 64-byte row's 24, a dgrad whose reduction is the layer's 16 maps, a
# strided dgrad's phases over 24 maps, tf32 rows of 8 and 12 fp32 channels, groups of 16
# channels, and 40 channels (80 bytes) that stay in the 128-byte row.
NARROW_CASES = [
    ("C=16,M=96,H=28,W=28,K=1,pad=0,dtype=bf16,layout=nhwc", 32),
    ("C=24,M=144,H=14,W=14,K=1,pad=0,bias=1,act=relu,dtype=bf16,layout=nhwc", 64),
    ("C=32,M=16,H=16,W=16,K=1,pad=0,dtype=fp16,layout=nhwc,op=dgrad", 32),
    ("C=16,M=24,H=9,W=11,K=3,pad=1,stride=2,dtype=bf16,layout=nhwc,op=dgrad", 64),
    ("C=8,M=64,H=12,W=12,K=3,pad=1,layout=nhwc", 32),
    ("C=12,M=40,H=10,W=13,K=3,pad=1x0x2x1,stride=2,layout=nhwc", 64),
    ("C=32,M=64,H=10,W=10,K=3,pad=1,groups=2,dtype=bf16,layout=nhwc", 32),
    ("C=40,M=64,H=8,W=8,K=3,pad=1,dtype=bf16,layout=nhwc", 128),
]


def _one_of_each_feed(p) -> list:
    """The default, then the first planned member of wgmma's space for each feed,
    persistence and chunks in flight, and the first whose pixel rows' copies end in a
    pass that leaves some threads idle; then wgdsm's default where it plans."""
    view = Wgmma.problem_for(p)
    precision = MATH[p.dtype]
    out, seen = [Wgmma.default(view, precision)], set()
    for v in that_plan(p, Wgmma.space(view, precision)):
        kind = (v.feed, v.persistent, v.inflight)
        tail = "tail" not in seen and make_plan(p, v).context["b_tail"]
        if kind not in seen or tail:
            seen |= {kind, "tail"} if tail else {kind}
            out.append(v)
    return out + that_plan(p, [Wgdsm.default(Wgdsm.problem_for(p), precision)])


@pytest.mark.parametrize("spec,row", NARROW_CASES)
def test_few_channels_take_the_narrowest_swizzle_and_compile(spec, row):
    """A group of up to 16 16-bit channels (8 fp32) fills a 32-byte ring row and up to 32
    (16 fp32) a 64-byte one, where a 128-byte row would copy and multiply zeros: the
    stages shrink to the row, the descriptors name its swizzle, a chunk takes a k step
    per 32 bytes, and each feed's member compiles for sm_90a without spills or a
    serialized wgmma."""
    p = parse_shape(spec)
    mode = {128: 1, 64: 2, 32: 3}[row]
    for v in _one_of_each_feed(p):
        plan = make_plan(p, v)
        c = plan.context
        bn, bm = v.blocktile
        assert c["ROW"] == row and c["ksteps"] == row // 32, (v.name, c["ROW"])
        assert (c["a_stage"], c["b_stage"]) == (bm * row, bn * row), v.name
        text = render(plan)
        assert f"({8 * row // 16}ull << 32) | ({mode}ull << 62)" in text, v.name
        for box in plan.launches[0].maps:
            assert box.swizzle == row, (v.name, box)
        binary = compiled(plan)
        assert binary.spills == 0 and SERIALIZED not in binary.log, (v.name, binary.resources)


@pytest.mark.gpu
@pytest.mark.parametrize("spec,row", NARROW_CASES)
def test_few_channels_on_the_gpu(spec, row):
    """Against float64, one member of each feed on rows of 32 and 64 bytes: the swizzle
    the copies write and the descriptors read, the channels past the group's zero-filled
    within the row, the copies' last pass over a tile that leaves some threads idle."""
    p = parse_shape(spec)
    verify_on_the_gpu(p, _one_of_each_feed(p), 3)
