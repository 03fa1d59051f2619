"""mmahwc (templates/gemm/mmahwc.cu.j2): 16-bit tensor cores over a band spread pixel by
pixel, a window row's taps x channels one run of k.

Without a GPU: the kernel's indexing replayed in numpy from the plan's numbers (band16's
fetch, the spread into the band's copies, each tile's lane addresses and run, the B words
as the block stages them, the guarded stores) against the float64 convolution; the bank
model of the chosen layouts; its limits as one-line refusals; the planner's and the
tuner's variants compile clean with ldmatrix and m16n8k16 in their PTX.  On the GPU the
default sets cover it (tests/test_gpu.py draws 16-bit windows and dgrad views)."""

from __future__ import annotations

import itertools
import re

import numpy as np
import pytest

from problems import assert_one_line_refusal
from specgen.compile import compile_source
from specgen.plan import make_plan
from specgen.reference import conv2d
from specgen.render import render
from specgen.shapes import parse_shape
from specgen.strategies import Mmahwc, parse_variant_name
from specgen.strategies.mmahwc import _band_layout, _lane_pixel, _stacked_score, swizzled
from specgen.variants import Precision
from specgen.verify import check_resources
from ptx import ptx_of
from band16 import band16_fetch


def _put(smem, ctx, byte, value):
    """An element stored at the band's byte ``byte`` where the swizzle (if any) puts it."""
    if ctx["swizzle"]:
        byte = swizzled(byte)
    smem[byte // ctx["eb"]] = value


def _unit(smem, ctx, byte):
    """The 16-byte unit an ldmatrix row reads at the band's byte ``byte``."""
    assert byte % 16 == 0, "ldmatrix rows on 16-byte boundaries"
    if ctx["swizzle"]:
        byte = swizzled(byte)
    assert byte + 16 <= smem.size * ctx["eb"], "runs inside the zeroed words"
    return smem[byte // ctx["eb"] : (byte + 16) // ctx["eb"]]


def _spread(shape, ctx, x, item):
    """band16's fetch, then the kernel's spread in numpy: band row r, column pl + col holds
    the raw band's element of each channel c < C at first[c] + (iy - lo) * W + col, zero
    for rows outside the image; the second copy the same, 4 elements on.  Returns the
    shared words from the band's start as elements (both copies and the zeroed rest)."""
    C, H, W, eb = shape.C, shape.H, shape.W, ctx["eb"]
    rows, ih, bpi, cp = ctx["rows"], ctx["ih"], ctx["bands_per_image"], ctx["cp"]
    stride, pl, chunk = ctx["stride"], ctx["pl"], ctx["chunk_elems"]
    unit = ctx["raw_unit"]  # x's elements a 16-byte fetch
    iy0 = item % bpi * rows - shape.pad
    lo = max(iy0, 0)
    raw, row_start = band16_fetch(shape, ctx, x, item)
    smem = np.zeros(4 * ctx["zero_words"] // eb)
    copy1 = 4 * (ctx["copy1_at"] - ctx["band_at"]) + 8
    for q in range(ih * W):
        r, col = divmod(q, W)
        iy = iy0 + r
        e = r * stride + (col + pl) * cp
        assert eb * e % ctx["unit_bytes"] == 0, "spread stores aligned"
        # the units the kernel stores, element by element
        for c in range(ctx["units"] * ctx["unit"]):
            v = 0.0
            if 0 <= iy < H and c < C:
                v = raw[2 + c * chunk + (row_start(c, lo) & (unit - 1)) + (iy - lo) * W + col]
            _put(smem, ctx, eb * (e + c), v)
            if ctx["copies"] == 2:
                smem[(copy1 + eb * (e + c)) // eb] = v
    return smem


def _tap_weight(w, shape, ctx, n, ky, k):
    """templates/gemm/mmahwc.cu.j2's tap_weight: map n / S at tap k / cp - n % S,
    channel k % cp."""
    S, cp = ctx["shifts"], ctx["cp"]
    m, d = divmod(n, S)
    kx, c = k // cp - d, k % cp
    if m < shape.M and c < shape.C and 0 <= kx < shape.K:
        return w[m, c, ky, kx]
    return 0.0


def _b_step(w, ctx, shape, s):
    """B[k][n] of k step s as the block stages its words and the mma reads them.  bf16:
    word (s, j, l, h) holds run elements 16 * (s % kr) + 2 * (l % 4) + 8h, +1, the
    fragment's b0 (h = 0: rows 2t, 2t+1) and b1 (rows 2t + 8, +9) of column 8j + l/4; tf32:
    run element 8 * (s % kr) + l % 4 + 4h, rows t and t + 4."""
    kr, tf32 = ctx["kr"], ctx["tf32"]
    depth = 8 if tf32 else 16
    B = np.zeros((depth, 8 * ctx["map_tiles"]))
    ky = s // kr
    for j in range(ctx["map_tiles"]):
        for lane in range(32):
            for h in range(2):
                n = 8 * j + lane // 4
                if tf32:
                    ks = [lane % 4 + 4 * h]
                else:
                    ks = [2 * (lane % 4) + 8 * h, 2 * (lane % 4) + 8 * h + 1]
                for k in ks:
                    B[k, n] = _tap_weight(w, shape, ctx, n, ky, s % kr * depth + k)
    return B


def _emulate(shape, plan, x, w):
    """Every tile of every item: each lane's ldmatrix row (its base pixel's run, in the copy
    the column's parity picks, through the swizzle) for each row of its stack, the k steps
    of every window row, the stores of the columns in the band's rows and Wo's columns."""
    ctx = plan.context
    M, Ho, Wo = shape.M, shape.Ho, shape.Wo
    rows, bpi, vw, S = ctx["rows"], ctx["bands_per_image"], ctx["vw"], ctx["shifts"]
    R = ctx["stack"]
    copy1 = 4 * (ctx["copy1_at"] - ctx["band_at"]) + 8
    steps = [_b_step(w, ctx, shape, s) for s in range(ctx["steps"])]
    order = [_lane_pixel(lane, ctx["paired"])[0] for lane in range(16)]
    y = np.full((x.shape[0], M, Ho, Wo), np.nan)
    for item in range(x.shape[0] * bpi):
        n, oy0 = item // bpi, item % bpi * rows
        smem = _spread(shape, ctx, x, item)
        valid = min(rows, Ho - oy0)
        for tile, r in itertools.product(range(ctx["tiles"]), range(R)):
            acc = np.zeros((16, 8 * ctx["map_tiles"]))
            base = []
            for row in range(16):
                px = min(tile * 16 + order[row], ctx["last_pixel"])
                oy, b = divmod(px, vw)
                at = R * oy * ctx["row_bytes"] + b * ctx["pitch"]
                if ctx["copies"] == 2 and b % 2:
                    at += copy1
                base.append(at)
            for s in range(ctx["steps"]):
                ky, k = divmod(s, ctx["kr"])
                off = (ky + r) * ctx["row_bytes"] + 32 * k  # row r of the stack meets ky + r
                A = np.stack(
                    [np.concatenate([_unit(smem, ctx, b + off + h) for h in (0, 16)]) for b in base]
                )
                acc += A @ steps[s]
            for row in range(16):
                j, b = divmod(tile * 16 + order[row], vw)
                oy = R * j + r
                for col in range(8 * ctx["map_tiles"]):
                    m, d = divmod(col, S)
                    if oy < valid and S * b + d < Wo and m < M:
                        y[n, m, oy0 + oy, S * b + d] = acc[row, col]
    return y


CASES = [
    ("C=12,M=24,H=17,W=17,K=7", None),  # mx-layer2's kind: two copies, rows of Wo + 1
    ("C=24,M=12,H=11,W=11,K=7,pad=6", None),  # its dgrad view: one copy, maps past M
    ("C=4,M=16,H=20,W=20,K=7", None),  # layer2's kind: 4 channels, shifts 2
    ("C=4,M=16,H=20,W=20,K=7", "mmahwc_t14_r16x32_s1_v1_k1"),  # pixel pairs, two copies
    ("C=5,M=9,H=13,W=14,K=5,pad=2", "mmahwc_t4_r16x32_s1_v1_k1"),  # C padded to 8; short last band
    ("C=20,M=16,H=9,W=15,K=3,pad=1", None),  # 20 channels: two copies, odd width
    ("C=13,M=12,H=11,W=9,K=3,pad=1", "mmahwc_t4_r16x16_s1_v1_k1"),  # 16 channels, bands of 4
    ("C=16,M=4,H=12,W=12,K=7,pad=6", None),  # layer2's dgrad view: shifts, swizzled
    ("C=16,M=4,H=9,W=9,K=7,pad=6", "mmahwc_t5_r16x32_s4_v1_k1"),  # 15 columns: the last base's
    ("C=12,M=6,H=10,W=13,K=5,pad=2", "mmahwc_t3_r24x16_s4_v1_k1"),  # 6 maps x 4: a guarded tile
    ("C=16,M=4,H=12,W=12,K=7,pad=6", "mmahwc_t6_r16x32_s4_v2_k1"),  # stacks of 2, swizzled
    ("C=12,M=24,H=17,W=17,K=7", "mmahwc_t8_r24x16_s1_v4_k1"),  # stacks of 4, two copies, paired
    ("C=5,M=9,H=13,W=14,K=5,pad=2", "mmahwc_t6_r16x16_s1_v3_k1"),  # 3 rows a stack, short band
    ("C=4,M=16,H=20,W=20,K=7", "mmahwc_t14_r16x32_s2_v2_k1"),  # stacks with shifts 2
    ("C=12,M=24,H=17,W=17,K=7", "mmahwc_t11_r24x16_s1_v4_k1"),  # a band of 2 stacks and 3 rows
    ("C=12,M=1,H=20,W=22,K=7,pad=6", "mmahwc_t9_r8x16_s8_v4_k3"),  # one map, 3 slices of k
    ("C=16,M=4,H=9,W=10,K=7,pad=6", "mmahwc_t5_r16x16_s4_v3_k1"),  # 5 rows: a stack past Ho
    ("C=16,M=4,H=14,W=14,K=7,pad=6", "mmahwc_t10_r8x16_s2_v5_k2"),  # stacks of 5, 2 slices
    ("C=12,M=1,H=20,W=22,K=7,pad=6", "mmahwc_t9_r8x16_s8_v6_k3"),  # 6 rows, 3 past the band
    ("C=12,M=24,H=17,W=17,K=7", "mmahwc_t11_r8x16_s1_v8_k1"),  # 8 rows, 3 map groups
]


@pytest.mark.parametrize("spec,name", CASES)
@pytest.mark.parametrize("dtype", ["bf16", "fp32"])
def test_the_kernels_indexing_computes_the_convolution(spec, name, dtype):
    """Exact products: only the indexing is under test, against the float64 reference;
    16-bit tensors in bf16, fp32 ones in tf32."""
    shape = parse_shape(spec + (",dtype=bf16" if dtype == "bf16" else ""))
    math = Precision.BF16 if dtype == "bf16" else Precision.TF32
    if name:
        v = parse_variant_name(f"{name}_{math.value}")
    else:
        v = Mmahwc.default(shape, math)
    plan = make_plan(shape, v)
    rng = np.random.default_rng()
    x = rng.integers(-4, 5, (2, shape.C, shape.H, shape.W)).astype(np.float64)
    w = rng.integers(-4, 5, (shape.M, shape.C, shape.K, shape.K)).astype(np.float64)
    y = _emulate(shape, plan, x, w)
    assert not np.isnan(y).any(), "every output written"
    np.testing.assert_array_equal(y, conv2d(x, w, shape))


@pytest.mark.parametrize(
    "C,K,iw,Wo,rows,shifts,elem,worst",
    [
        (12, 7, 33, 27, 27, 1, 2, 1),  # mx-layer2: rows of 28, two copies
        (24, 7, 39, 33, 11, 1, 2, 1),  # its dgrad view: 48-byte pixels, in order
        (4, 7, 40, 34, 34, 1, 2, 1),  # layer2
        (4, 7, 40, 34, 34, 2, 2, 1),  # layer2 with shifts: 16-byte base pixels, one copy
        (12, 7, 33, 27, 9, 1, 4, 1),  # mx-layer2 in tf32: 48-byte pixels
    ],
)
def test_the_presets_bands_are_read_without_bank_conflicts(C, K, iw, Wo, rows, shifts, elem, worst):
    """The layout search finds, for the 7x7 presets, a row stride and copy placement whose
    ldmatrix matrices each read 8 distinct bank quads (Nsight Compute on the first
    layouts, H200: 27% and 41% of the shared wavefronts were conflicts)."""
    assert _band_layout(C, K, iw, Wo, rows, shifts, elem)["degree"] == worst


def test_the_swizzle_spreads_base_pixels_a_line_apart():
    """layer2's bf16 dgrad view with shifts 4: base pixels 128 bytes apart would all read
    one bank quad (8-way); the swizzled band the model picks keeps the worst at 2."""
    lay = _band_layout(16, 7, 46, 40, 20, 4, 2)
    assert lay["pitch"] == 128 and lay["swizzle"] and lay["degree"] <= 2
    assert sorted(swizzled(128 * b) // 16 % 8 for b in range(8)) == list(range(8))


@pytest.mark.parametrize(
    "spec",
    [
        "C=12,M=24,H=33,W=33,K=7,dtype=bf16",
        "C=12,M=24,H=33,W=33,K=7,dtype=fp16,op=dgrad",
        "C=4,M=16,H=40,W=40,K=7,dtype=bf16,bias=1,act=relu",
        "C=4,M=16,H=40,W=40,K=7,dtype=bf16,op=dgrad",
        "C=4,M=16,H=40,W=40,K=7",
        "C=12,M=24,H=33,W=33,K=7,bias=1",
    ],
)
def test_defaults_and_neighbours_compile_clean(spec):
    """The default and the tuning space's ends compile for sm_90 with the planned
    resources, no spills, and ldmatrix.x4 and m16n8k16 (m16n8k8 tf32 for fp32 tensors)
    in the PTX."""
    p = parse_shape(spec)
    view = Mmahwc.problem_for(p)
    math = Precision.TF32 if p.dtype.value == "fp32" else Precision(p.dtype.value)
    default = Mmahwc.default(view, math)
    space = Mmahwc.space(view, default.precision)
    for v in [default, space[0], space[-1]]:
        plan = make_plan(p, v)
        binary = compile_source(render(plan), plan.name, plan.target("sm_90"))
        stats, problems = check_resources(plan, binary)
        assert not problems and stats["spills"] == 0, (v.name, problems)
        if v is default:
            ptx = ptx_of(plan)
            assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in ptx
            shape = "m16n8k8" if math is Precision.TF32 else "m16n8k16"
            assert f"mma.sync.aligned.{shape}.row.col.f32" in ptx


@pytest.mark.parametrize(
    "spec,math,name",
    [
        # 4 channels: no stacks (the band and stores bound it; stacks lost 0.37 -> 0.51 ms)
        ("C=4,M=16,H=40,W=40,K=7,dtype=bf16", "bf16", "mmahwc_t34_r32x64_s2_v1_k1_bf16"),
        # the measured winners (H200, B=10000): layer2's dgrad view in stacks of 5 with
        # shifts 2 in two slices (10 warps a block, two blocks an SM), in tf32 in three (one
        # block of 15); mx-layer2's forward pass in stacks of 3 over whole images (two
        # blocks), its tf32 one likewise (one block: 33 input rows an image against 45)
        ("C=16,M=4,H=34,W=34,K=7,pad=6,dtype=bf16", "bf16", "mmahwc_t20_r8x16_s2_v5_k2_bf16"),
        ("C=16,M=4,H=34,W=34,K=7,pad=6", "tf32", "mmahwc_t20_r8x16_s2_v5_k3_tf32"),
        ("C=12,M=24,H=33,W=33,K=7,dtype=bf16", "bf16", "mmahwc_t27_r24x16_s1_v3_k1_bf16"),
        ("C=12,M=24,H=33,W=33,K=7", "tf32", "mmahwc_t27_r24x16_s1_v3_k1_tf32"),
        # mx-layer2's dgrad view: whole images, one block (39 input rows an image), beat
        # 11-row bands, two blocks (51)
        ("C=24,M=12,H=27,W=27,K=7,pad=6,dtype=bf16", "bf16", "mmahwc_t33_r16x16_s1_v3_k1_bf16"),
    ],
)
def test_the_fit_stacks_where_a_pixel_has_more_than_four_channels(spec, math, name):
    """Where a pixel has more than 4 channels: the stack and band of least pipe clocks
    times input rows an image (one block an SM weighed 1.2), then the fewest slices of
    the k steps that give an SM 12 warps."""
    assert Mmahwc.default(parse_shape(spec), Precision(math)).name == name


def test_the_stacked_score_orders_the_measured_bands():
    """The stacked fit's score ranks each measured pair of bands as the H200 did (bf16,
    B=10000): layer2's dgrad view in stacks of 5, 20-row bands (two blocks an SM) 0.498
    ms against whole images (one block) 0.505; mx-layer2's in stacks of 3, whole images
    1.055 against 11-row bands 1.349."""

    def score(spec, name):
        shape = parse_shape(spec)
        v = parse_variant_name(name)
        return _stacked_score(shape, make_plan(shape, v), v)

    l2 = "C=16,M=4,H=34,W=34,K=7,pad=6,dtype=bf16"
    assert score(l2, "mmahwc_t20_r8x16_s2_v5_k1_bf16") < score(l2, "mmahwc_t40_r8x16_s2_v5_k1_bf16")
    mx = "C=24,M=12,H=27,W=27,K=7,pad=6,dtype=bf16"
    assert score(mx, "mmahwc_t33_r16x16_s1_v3_k1_bf16") < score(
        mx, "mmahwc_t11_r16x16_s1_v3_k1_bf16"
    )


def test_slices_add_their_sums_under_named_barriers():
    """mx-layer1-bf16's dgrad winner (three slices of the k steps) compiles clean, and its
    slices meet at a barrier named for their tiles (``bar.sync id, threads``), not the
    block's."""
    shape = parse_shape("C=1,M=12,H=72,W=72,K=7,dtype=bf16,op=dgrad")
    plan = make_plan(shape, parse_variant_name("mmahwc_t18_r8x16_s8_v6_k3_bf16"))
    binary = compile_source(render(plan), plan.name, plan.target("sm_90"))
    stats, problems = check_resources(plan, binary)
    assert not problems and stats["spills"] == 0, problems
    assert re.search(r"bar\.sync\s+%r\d+, %r\d+;", ptx_of(plan))
    assert plan.context["slices"] == 3 and plan.context["threads"] == 3 * 2 * 32


def test_limits_are_one_line_refusals():
    """Channels past 64, warp maps that are not whole n8 tiles, accumulators past 64
    (stacked rows counted), fp32 tensors, shared memory past the block's, warps past a
    block's 32; and the fit's refusal of layers whose channels or maps fill too little
    of its tiles."""
    assert_one_line_refusal(
        "C=72,M=16,H=20,W=20,K=3,dtype=bf16", "mmahwc_t4_r16x32_s1_v1_k1_bf16", "C up to 64"
    )
    bf = "C=12,M=24,H=33,W=33,K=7,dtype=bf16"
    assert_one_line_refusal(bf, "mmahwc_t8_r12x32_s1_v1_k1_bf16", "whole n8 map tiles")
    assert_one_line_refusal(bf, "mmahwc_t8_r24x96_s1_v1_k1_bf16", "accumulators per thread")
    assert_one_line_refusal(
        "C=12,M=24,H=33,W=33,K=7", "mmahwc_t8_r24x32_s1_v1_k1_bf16", "take --precision tf32"
    )
    assert_one_line_refusal(bf, "mmahwc_t8_r24x32_s3_v1_k1_bf16", "1, 2, 4 or 8")
    assert_one_line_refusal(bf, "mmahwc_t8_r24x32_s1_v4_k1_bf16", "stacked rows x 4")
    assert_one_line_refusal(bf, "mmahwc_t8_r8x16_s1_v9_k1_bf16", "7 or 8")
    assert_one_line_refusal(bf, "mmahwc_t8_r24x16_s1_v1_k2_bf16", "take --stack 2")
    assert_one_line_refusal(bf, "mmahwc_t8_r24x16_s1_v2_k7_bf16", "choose 1 to 6")
    assert_one_line_refusal(
        "C=64,M=64,H=200,W=200,K=7,dtype=bf16", "mmahwc_t194_r16x32_s1_v1_k1_bf16", "shared memory"
    )
    # 144 maps x 2 shifts in n8 groups of one: 36 warps, which ptxas compiles but no SM
    # can run (a tune's candidate once failed so on the GPU, occupancy 0)
    assert_one_line_refusal(
        "C=24,M=144,H=56,W=56,K=1,pad=0", "mmahwc_t14_r8x16_s2_v8_k1_tf32", "36 warps"
    )
    with pytest.raises(Exception) as e:
        Mmahwc.default(parse_shape("C=1,M=4,H=86,W=86,K=7,dtype=bf16"), Precision.BF16)
    assert "of the k side" in str(e.value) and "\n" not in str(e.value)
