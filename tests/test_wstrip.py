"""wstrip, wgrad on 16-bit tensor cores for narrow NCHW layers: its fragment indexing
replayed in NumPy, what the compiler makes of it (CPU tier), its limits, the planner's
choice, and its numbers on drawn problems and the 7x7 presets (GPU tier)."""

import re
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from problems import (
    DRAWN_COMPILES,
    GPU_DRAWS,
    assert_compiles_without_spills,
    assert_one_line_refusal,
    default_and_drawn,
    parsed_or_rejected,
    planned_space,
    verify_on_the_gpu,
)
from specgen.choose import planned
from specgen.compile import compile_source
from specgen.errors import SpecError
from specgen.plan import make_plan
from specgen.reference import bias_grad, conv2d_wgrad
from specgen.render import render
from specgen.shapes import PRESETS, DType, Op, parse_shape
from specgen.strategies import Wstrip, parse_variant_name
from specgen.variants import Precision

from band16 import band16, band16_fetch, mma16
from ptx import ptx_of

SEVEN = ["layer1-bf16", "layer2-bf16", "mx-layer1-bf16", "mx-layer2-bf16"]


def _wgrad(name: str):
    return replace(PRESETS[name], op=Op.WGRAD)


def _precision(p) -> Precision:
    return {DType.BF16: Precision.BF16, DType.FP16: Precision.FP16}[p.dtype]


def _emulate_wstrip(shape, plan, x, dy):
    """The arithmetic of templates/backward/wstrip.cu.j2 in numpy, from the plan's
    numbers: x's band as band16 spreads it, dy's rows with zeros past Wo, each strip's
    input rows read as a lane's words (columns 2t + g + 16j + 8k; lane 7's ones where it
    has them), the tiles' quads of two input rows, B words of map g, and the sums laid
    out as dw and db.  Exact products, so only the indexing is under test."""
    ctx = plan.context
    C, M, R, S = shape.C, shape.M, shape.R, shape.S
    P, Q = shape.Ho, shape.Wo
    rows, rs, nj, nt, mw = ctx["rows"], ctx["RS_rows"], ctx["nj"], ctx["nt"], ctx["mw"]
    tiles, octets = ctx["tiles"], ctx["octets"]
    plane, stride = ctx["plane"], ctx["stride"]
    g, t = np.arange(8)[:, None], np.arange(4)[None, :]
    elements = C * plane + 16 * nj + 8 * octets + 64
    ones = np.ones((8, 4, 2))
    acc = np.zeros((C, ctx["map_groups"], len(tiles), nt, 16, 8))
    for n in range(x.shape[0]):
        for p0 in range(0, P, rows):
            band = band16(shape, ctx, x, n, p0, C, elements)
            valid = min(rows, P - p0)
            dband = np.zeros((M, ctx["dy_rows"], 16 * nj))
            dband[:, :valid, :Q] = dy[n, :, p0 : p0 + valid, :]
            for u in range(ctx["units"]):
                j, row0 = u % nj, u // nj * rs
                for c in range(C):

                    def word(i, k):
                        a = c * plane + (row0 + i) * stride + 2 * t + g + 16 * j + 8 * k
                        w = np.stack([band[a], band[a + 1]], -1)
                        if ctx["lane_ones"]:
                            w[7] = 1.0
                        return w

                    for i in range(rs):
                        for mg in range(ctx["map_groups"]):
                            for jn in range(nt):
                                maps = np.minimum(mg * mw + 8 * jn + g, M - 1)
                                q = 16 * j + 2 * t
                                halves = [
                                    np.stack(
                                        [
                                            dband[maps, row0 + i, q + h],
                                            dband[maps, row0 + i, q + h + 1],
                                        ],
                                        -1,
                                    )
                                    for h in (0, 8)
                                ]
                                b = np.stack(halves, 2)  # [g][t][h][2]
                                for tl in tiles:
                                    if tl["ones"]:
                                        regs = [ones] * 4
                                    else:
                                        v, o = i + tl["ra"], tl["o"]
                                        regs = [
                                            word(v, o),
                                            word(v + 1, o),
                                            word(v, o + 1),
                                            word(v + 1, o + 1),
                                        ]
                                    acc[c, mg, tl["i"], jn] += mma16(regs, b)
    dw = np.full((M, C, R, S), np.nan)
    db = np.full(M, np.nan)
    for c in range(C):
        for mg in range(ctx["map_groups"]):
            for tl in tiles:
                for jn in range(nt):
                    for col in range(8):
                        m = mg * mw + 8 * jn + col
                        if m >= M:
                            continue
                        d = acc[c, mg, tl["i"], jn][:, col]
                        if tl["ones"]:
                            if c == 0:
                                db[m] = d[0]
                            continue
                        for row in range(16):
                            s, r = 8 * tl["o"] + row % 8, tl["ra"] + row // 8
                            if s < S and r < R:
                                dw[m, c, r, s] = d[row]
                        if ctx["lane_ones"] and tl["i"] == 0 and c == 0:
                            db[m] = d[7]
    return dw, db


def _band16_fetch_and_spread(shape, ctx, x, item):
    """band16.j2's fetch, then its word-wise spread in numpy, element for element: each
    lane's pair of raw words, the byte permutation, the masks of the padding, and the
    words of both copies.  Returns the even copy and the odd copy's region (odd[j] at
    region element j + 2)."""
    C, H, W, pad = shape.C, shape.H, shape.W, shape.pad
    rows, ih, bpi = ctx["rows"], ctx["ih"], ctx["bands_per_image"]
    chunk = 2 * ctx["chunk_words"]
    iy0 = item % bpi * rows - pad
    lo = max(iy0, 0)
    raw, row_start = band16_fetch(shape, ctx, x, item)
    size = C * ctx["plane"] + 64
    even, odd = np.zeros(size), np.zeros(size)
    for c in range(C):
        for r in range(ih):
            iy = iy0 + r
            frm = c * chunk + row_start(c, iy) - pad - (row_start(c, lo) & ~7)
            base = (c * ctx["plane"] + r * ctx["stride"]) // 2
            for w in range(ctx["spread_words"]):
                at = frm + 2 * w
                a = max(at >> 1, -1)
                e0, e1, e2, e3 = (raw[2 + 2 * a + i] for i in range(4))
                ev, ov = ((e1, e2), (e2, e3)) if at & 1 else ((e0, e1), (e1, e2))

                def ok(col):
                    return 0 <= iy < H and 0 <= col - pad < W

                even[2 * (base + w)] = ev[0] if ok(2 * w) else 0.0
                even[2 * (base + w) + 1] = ev[1] if ok(2 * w + 1) else 0.0
                odd[2 * (base + w + 1)] = ov[0] if ok(2 * w + 1) else 0.0
                odd[2 * (base + w + 1) + 1] = ov[1] if ok(2 * w + 2) else 0.0
    return even, odd


@pytest.mark.parametrize(
    "spec",
    [
        "C=1,M=4,H=17,W=9,K=8,pad=7",  # odd padding: a word straddles the pad's edge
        "C=3,M=5,H=11,W=14,K=5,pad=2",
        "C=2,M=4,H=13,W=13,K=3,pad=1",  # odd widths: rows at odd elements
        "C=1,M=4,H=30,W=30,K=7",
        "C=3,M=8,H=12,W=11,K=7,pad=3",
    ],
)
def test_word_spread_builds_the_band(spec):
    """The 16-byte fetch and the word-wise spread lay every band of three images out as the
    element-wise band16 spread does: the even copy, and the odd copy shifted by one."""
    shape = parse_shape(f"{spec},dtype=bf16,op=wgrad")
    ctx = make_plan(shape, Wstrip.default(shape, Precision.BF16)).context
    x = np.random.default_rng().standard_normal((3, shape.C, shape.H, shape.W)) + 5.0
    iw = ctx["iw"]
    for item in range(3 * ctx["bands_per_image"]):
        even, odd = _band16_fetch_and_spread(shape, ctx, x, item)
        p0 = item % ctx["bands_per_image"] * ctx["rows"]
        ref = band16(shape, ctx, x, item // ctx["bands_per_image"], p0, shape.C, even.size)
        for c in range(shape.C):
            for r in range(ctx["ih"]):
                b = c * ctx["plane"] + r * ctx["stride"]
                np.testing.assert_array_equal(even[b : b + iw], ref[b : b + iw])
                np.testing.assert_array_equal(odd[b + 2 : b + iw + 1], ref[b + 1 : b + iw])


@pytest.mark.parametrize(
    "spec,variant",
    [
        ("C=1,M=4,H=30,W=30,K=7", "wstrip_t24_r8x8_s4"),
        ("C=4,M=16,H=20,W=20,K=7,bias=1", "wstrip_t7_r16x3_s4"),  # a band cut short, 2 map tiles
        ("C=2,M=9,H=12,W=21,K=3,pad=1", "wstrip_t5_r16x2_s4"),  # ragged columns, 9 maps
        ("C=3,M=5,H=11,W=14,K=9,pad=4,bias=1", "wstrip_t11_r8x3_s4"),  # two octets a row
        ("C=3,M=12,H=15,W=17,K=5,pad=2,bias=1", "wstrip_t6_r16x4_s4"),  # odd Wo: dy spread
        ("C=2,M=24,H=12,W=12,K=6,pad=1,bias=1", "wstrip_t4_r24x4_s4"),  # even K: a ones tile
        ("C=12,M=24,H=33,W=33,K=7", "wstrip_t14_r24x5_s4"),  # mx-layer2's layer
    ],
)
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_fragment_indexing_computes_the_weight_gradient(spec, variant, dtype):
    """Every weight (and db) written, each equal to the float64 gradient: the band and
    chunk offsets, window-row pairs and octets, the ones rows, maps past M, strips that
    run past the band and bands past the image."""
    shape = parse_shape(f"{spec},dtype={dtype},op=wgrad")
    plan = make_plan(shape, parse_variant_name(f"{variant}_{dtype}"))
    rng = np.random.default_rng()
    batch = 2
    x = rng.standard_normal((batch, shape.C, shape.H, shape.W))
    dy = rng.standard_normal((batch, shape.M, shape.Ho, shape.Wo))
    dw, db = _emulate_wstrip(shape, plan, x, dy)
    assert not np.isnan(dw).any()
    np.testing.assert_allclose(dw, conv2d_wgrad(x, dy, shape), rtol=1e-10, atol=1e-10)
    if shape.bias:
        assert not np.isnan(db).any()
        np.testing.assert_allclose(db, bias_grad(dy), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", SEVEN)
def test_seven_by_seven_layers_compile_without_spills(name):
    """The default of each 7x7 layer keeps its sums in registers without spilling; its
    PTX multiplies bf16 on m16n8k16, copies x and dy by 16-byte cp.async and waits for
    them, and reads no 16-bit element of dy or x from global memory one at a time."""
    p = _wgrad(name)
    plan = make_plan(p, Wstrip.default(p, Precision.BF16))
    binary = compile_source(render(plan), plan.name, plan.target("sm_90"))
    assert binary.spills == 0, (plan.name, binary.resources)
    ptx = ptx_of(plan)
    assert ptx.count("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32") >= 4
    assert re.search(r"cp\.async\.cg\.shared\.global \[%r\d+\], \[%rd\d+\], 16", ptx)
    assert "cp.async.ca" not in ptx and "ld.global.nc.u16" not in ptx
    assert "cp.async.wait_group 0;" in ptx


def test_the_planner_puts_16_bit_nchw_7x7_wgrad_on_wstrip():
    for name in SEVEN:
        p = _wgrad(name)
        for dtype in (DType.BF16, DType.FP16):
            choice = planned(replace(p, dtype=dtype), allow_tf32=False)
            assert choice.variant.key == "wstrip", (name, choice)
            assert choice.variant.precision.value == dtype.value
    fp32 = replace(_wgrad("layer2"), dtype=DType.FP32)
    assert planned(fp32, allow_tf32=False).variant.key == "wtap"


@pytest.mark.parametrize("name", ["layer2-bf16", "mx-layer2-bf16"])
def test_tune_space_plans_or_refuses_in_one_line(name):
    p = _wgrad(name)
    ok = []
    for v in Wstrip.space(p, Precision.BF16):
        try:
            make_plan(p, v)
            ok.append(v)
        except SpecError as e:
            assert "\n" not in str(e)
    assert len(ok) >= 20


@pytest.mark.parametrize(
    "spec,name,words",
    [
        (
            "C=4,M=16,H=40,W=40,K=7,dtype=bf16,layout=nhwc,op=wgrad",
            "wstrip_t34_r16x6_s264_bf16",
            "nhwc",
        ),
        ("C=4,M=16,H=40,W=40,K=7,op=wgrad", "wstrip_t34_r16x6_s264_bf16", "fp16 or bf16"),
        ("C=4,M=16,H=40,W=40,K=7,dtype=bf16,op=wgrad", "wstrip_t34_r16x6_s264_fp16", "bf16"),
        ("C=4,M=16,H=40,W=40,K=7,dtype=bf16,op=wgrad", "wstrip_t34_r12x6_s264_bf16", "n8 map"),
        ("C=4,M=16,H=40,W=40,K=7,dtype=bf16,op=wgrad", "wstrip_t35_r16x6_s264_bf16", "dy rows"),
        ("C=4,M=16,H=40,W=40,K=7,dtype=bf16,op=wgrad", "wstrip_t8_r16x9_s264_bf16", "strip"),
        ("C=4,M=40,H=40,W=40,K=7,dtype=bf16,op=wgrad", "wstrip_t8_r40x4_s264_bf16", "sums"),
        ("C=20,M=16,H=40,W=40,K=7,dtype=bf16,op=wgrad", "wstrip_t8_r16x4_s264_bf16", "warps"),
        (
            "C=12,M=24,H=400,W=400,K=7,dtype=bf16,op=wgrad",
            "wstrip_t394_r24x4_s132_bf16",
            "shared memory",
        ),
        (
            "C=4,M=16,H=40,W=40,K=7,stride=2,dtype=bf16,op=wgrad",
            "wstrip_t8_r16x4_s264_bf16",
            "stride",
        ),
    ],
)
def test_limits_are_one_line_refusals(spec, name, words):
    assert_one_line_refusal(spec, name, words)


# ---- GPU tier ----


@st.composite
def narrow_problems(draw):
    """wgrad of NCHW 16-bit layers with few channels and maps: windows 1 to 9 (square),
    any padding under the window, odd and even widths, db or not, both dtypes."""
    K = draw(st.integers(1, 9))
    C = draw(st.sampled_from([1, 2, 3, 4, 6, 12]))
    M = draw(st.sampled_from([1, 3, 4, 8, 12, 16, 24]))
    H, W = draw(st.integers(K, 30)), draw(st.integers(K, 40))
    pad = draw(st.integers(0, K - 1))
    spec = f"C={C},M={M},H={H},W={W},K={K},pad={pad},op=wgrad"
    spec += f",dtype={draw(st.sampled_from(['bf16', 'fp16']))}"
    if draw(st.booleans()):
        spec += ",bias=1"
    return parsed_or_rejected(spec)


@pytest.mark.gpu
@settings(max_examples=25, **GPU_DRAWS)
@given(p=narrow_problems(), batch=st.integers(1, 5), pick=st.integers(0, 10**6))
def test_drawn_problems_on_the_gpu(p, batch, pick):
    """The default and one variant of tune's space against the float64 reference: the
    band's zero padding, rows and columns past the image, maps past M, the ones rows'
    db, empty blocks."""
    try:
        make_plan(p, Wstrip.default(p, _precision(p)))
    except SpecError:
        assume(False)
    verify_on_the_gpu(p, default_and_drawn(p, Wstrip, _precision(p), pick), batch)


@pytest.mark.gpu
@pytest.mark.parametrize("name", SEVEN)
def test_seven_by_seven_layers_at_a_long_reduction(name):
    """B=1000 (6 to 29 million terms a weight): where the summation's error shows."""
    from specgen.runtime import device_arch
    from specgen.verify import verify_variant

    p = replace(_wgrad(name), bias=True)
    v = Wstrip.default(p, Precision.BF16)
    row = verify_variant(p, v, arch=device_arch(), batch=1000, numbers=True)
    assert row.status == "PASS", (v.name, row.problems)


@settings(max_examples=DRAWN_COMPILES, deadline=None, suppress_health_check=list(HealthCheck))
@given(p=narrow_problems())
def test_drawn_defaults_compile_without_spills(p):
    assert_compiles_without_spills(p, lambda: Wstrip.default(p, _precision(p)))


@pytest.mark.parametrize(
    "spec",
    [  # drawn problems whose strips of 4 rows spilled (12 warps a block, 168 registers)
        "C=12,M=8,H=20,W=19,K=9,pad=7,bias=1,dtype=bf16,op=wgrad",
        "C=12,M=16,H=14,W=12,K=8,pad=2,bias=1,dtype=bf16,op=wgrad",
    ],
)
def test_the_space_leaves_out_strips_of_half_the_window(spec):
    """Tune's space has no strip of half the window's rows or fewer (the two that
    spilled among them), and of what plans, the shortest strips of the tallest band
    compile for sm_90 without spilling."""
    p = parse_shape(spec)
    space = planned_space(p, Wstrip, _precision(p))
    assert space and all(2 * v.regtile[1] > p.K for v in Wstrip.space(p, _precision(p)))
    tallest = max(v.tile for v in space)
    shortest = min(v.regtile[1] for v in space if v.tile == tallest)
    for v in space:
        if (
            v.tile == tallest
            and v.regtile[1] == shortest
            and v.splits == min(u.splits for u in space)
        ):
            plan = make_plan(p, v)
            binary = compile_source(render(plan), plan.name, plan.target("sm_90"))
            assert binary.spills == 0, (v.name, binary.resources)
