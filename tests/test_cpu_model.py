"""CPU tier: shapes, variant names, planning arithmetic and limits."""

import itertools
import re
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings

from band16 import band16, mma16
from specgen.errors import SpecError
from specgen.plan import make_plan
from specgen.render import render
from specgen.reference import (
    compare,
    conv2d,
    conv2d_loop,
    error_coefficient,
    output_rounding,
    underflow_term,
)
from specgen.shapes import PRESETS, Op, TensorLayout, parse_shape, square
from specgen.strategies import TABLE, default_set, parse_variant_name
from specgen.strategies.direct import Direct
from specgen.strategies.inputtile import Inputtile
from specgen.strategies.mma import Mma
from specgen.strategies.persist import Persist
from specgen.strategies.split import Split
from specgen.strategies.stream import Stream
from specgen.strategies.tiled import Tiled
from specgen.variants import Layout, Precision, Weights

from problems import assert_one_line_refusal, problem_specs

ALL = [(s, v) for s in PRESETS.values() for op in Op for v in default_set(s.with_op(op))]


def test_presets_match_the_reference_table():
    s = PRESETS["mx-layer2"]
    assert (s.C, s.M, s.H, s.W, s.K, s.pad, s.batch) == (12, 24, 33, 33, 7, 0, 10000)
    assert 4 * s.weight_count == 56448
    assert (PRESETS["layer2"].Ho, PRESETS["layer2"].Wo) == (34, 34)
    assert PRESETS["ae-dec1"].Ho == 8 and PRESETS["ae-dec1"].batch == 128
    assert PRESETS["layer2"].flops(10000) == 2 * 10000 * 16 * 4 * 49 * 34 * 34


def test_inline_spec_parses_like_a_preset():
    s = parse_shape("C=4, M=16,H=40,W=40,K=7")
    assert (s.C, s.M, s.H, s.W, s.K, s.pad) == (4, 16, 40, 40, 7, 0)
    assert parse_shape("C=3,M=8,H=9,W=11,K=3,pad=1").Wo == 11


@pytest.mark.parametrize(
    "text,needle",
    [
        ("layer9", "known presets: layer1"),
        ("C=4,M=16,H=40,W=40", "missing K"),
        ("C=4,M=x,H=40,W=40,K=7", "malformed"),
        ("C=4,M=16,H=40,W=40,K=7,Q=1", "malformed"),
        ("C=1,M=1,H=3,W=3,K=5", "larger than the padded image"),
        ("C=0,M=1,H=3,W=3,K=1", "at least 1"),
    ],
)
def test_bad_shapes_say_why(text, needle):
    with pytest.raises(SpecError, match=needle) as e:
        parse_shape(text)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("shape,variant", ALL, ids=[f"{s.name}-{v.name}" for s, v in ALL])
def test_names_round_trip_and_are_symbols(shape, variant):
    assert parse_variant_name(variant.name) == variant
    assert re.fullmatch(r"[a-z][a-z0-9_]*", variant.name)


# Strategies for layers that no preset has, and a layer that shows each in its default set.
BEYOND_PRESETS = {
    "dwlane": "C=32,M=32,H=112,W=112,K=3,pad=1,groups=32,dtype=bf16,layout=nhwc",  # depthwise
    "dwrows": "C=32,M=32,H=112,W=112,K=3,pad=1,groups=32,dtype=bf16,layout=nhwc",  # its bands
    "dwplane": "C=960,M=960,H=7,W=7,K=3,pad=1,groups=960",  # depthwise in NCHW
    "mmafew": "C=3,M=64,H=224,W=224,K=7,pad=3,stride=2,dtype=bf16,layout=nhwc",  # a stem
    "wfew": "C=3,M=64,H=224,W=224,K=7,pad=3,stride=2,dtype=bf16,layout=nhwc,op=wgrad",
    "wdw": "C=32,M=32,H=112,W=112,K=3,pad=1,groups=32,dtype=bf16,layout=nhwc,op=wgrad",
    "wgcols": "C=192,M=64,H=14,W=14,K=1,op=dgrad",  # a 1x1 fp32 NCHW dgrad
}


def test_default_sets_cover_every_strategy_somewhere():
    seen = {(type(v), v.precision) for _, v in ALL}
    for key, spec in BEYOND_PRESETS.items():
        seen |= {(type(v), v.precision) for v in default_set(parse_shape(spec)) if v.key == key}
    for s in TABLE:
        assert any(st is s for st, _ in seen), s
    assert (Mma, Precision.TF32) in seen and (Mma, Precision.FP16) in seen
    assert (Tiled, Precision.FP16) in seen


@pytest.mark.parametrize("preset", ["layer2", "ae-enc1", "ae-dec3"])
def test_every_name_of_the_search_space_round_trips(preset):
    """tune's whole space as the strategies list it, before the planner filters it:
    every candidate's name parses back to an equal variant, so ``v in space`` holds
    for a variant read back from the results database."""
    shape = PRESETS[preset]
    count = 0
    for cls in TABLE:
        for precision in cls.precisions:
            for v in cls.space(shape, precision):
                assert type(v) is cls and v.precision is precision
                assert parse_variant_name(v.name) == v, v.name
                count += 1
    assert count > 300  # the space, not a handful


def test_a_strategy_holds_only_its_own_fields():
    with pytest.raises(TypeError):
        Persist(maps=64)
    with pytest.raises(TypeError):
        Direct(layout=Layout.PLANAR)
    assert [f.name for f in Split.params()] == [
        "tile",
        "coarsening",
        "layout",
        "weights",
        "splits",
        "unroll",
    ]


def test_kernel_names_carry_the_problems_dtype_and_layout():
    fp32 = parse_shape("C=4,M=8,H=9,W=9,K=3")
    bf16 = parse_shape("C=4,M=8,H=9,W=9,K=3,dtype=bf16,layout=nhwc")
    v = Tiled(tile=8, coarsening=(4, 1, 8))
    assert v.kernel_name(fp32) == v.name  # the default problem adds nothing
    assert v.kernel_name(bf16) == v.name + "_iobf16_nhwc"
    assert make_plan(bf16, v).name == v.name + "_iobf16_nhwc"
    assert parse_variant_name(v.kernel_name(bf16), bf16) == v
    assert parse_variant_name(v.kernel_name(bf16)) == v
    with pytest.raises(SpecError, match="for another problem"):
        parse_variant_name(v.kernel_name(bf16), fp32)


def test_layer2_tile16_plan_arithmetic():
    p = make_plan(PRESETS["layer2"], Tiled(tile=16, coarsening=(4, 1, 8), unroll=False))
    assert p.const_bytes == 4 * 3136
    ctx = p.context
    # planar halo tile: 4 channels of (16+6) rows of (16+6+pad) floats
    assert ctx["ih"] == ctx["iw"] == 22
    assert p.static_smem == 4 * 4 * 22 * (22 + ctx["smem"]["pad"])
    assert p.launches[-1].block == (4, 16, 1)
    assert p.launches[-1].grid_for(10) == (9, 2, 10)


def test_interleaved_layout_sizes_pixels_by_channels():
    p = make_plan(
        PRESETS["mx-layer2"],
        Tiled(layout=Layout.INTERLEAVED, coarsening=(4, 1, 8), unroll=False),
    )
    assert p.static_smem == 4 * 22 * 22 * (12 + p.context["smem"]["pad"])


def test_persist_plan_arithmetic():
    """layer2, 4 maps x 12 pixels: 4 map groups x 34 rows x 3 segments of a 36-wide
    row; weights, two bands and two output rounds in one dynamic allocation."""
    p = make_plan(PRESETS["layer2"], Persist(tile=34, regtile=(4, 12)))
    ctx = p.context
    assert p.launches[0].block == (4 * 34 * 3, 1, 1)
    assert ctx["iw"] == 3 * 12 + 6 and ctx["ih"] == 34 + 6
    assert ctx["stride"] % 4 == 0 and ctx["stride"] >= ctx["iw"]  # float4 row loads
    assert ctx["row_load"]["vec"] == 4 and ctx["nv"] == 20  # 18 pixels read as 5 float4
    assert ctx["row_load"]["count"] == 5
    assert ctx["maps_load"]["vec"] == 4  # a thread's 4 maps of one tap are one float4
    assert ctx["bands_at"] == 3136 and ctx["band"] == 4 * 40 * ctx["stride"]
    assert ctx["scratch"] == 4 * 34 * 34 and ctx["out_vec"] == 4
    assert p.dynamic_smem == 4 * (ctx["out_at"] + 2 * ctx["scratch"]) and p.static_smem == 0
    assert ctx["guard_cols"] and not ctx["guard_rows"]  # 36 columns computed, 34 stored
    assert ctx["unroll_window"] == (49 * 4 * 12 <= 2048)
    # persistent: the grid is capped by what is resident, never past the work items
    launch = p.launches[0]
    assert launch.persistent and launch.grid_for(10000, 132) == (132, 1, 1)
    assert launch.grid_for(3, 132) == (3, 1, 1)


def test_persist_names_round_trip():
    v = Persist(tile=12, regtile=(4, 17))
    assert v.name == "persist_t12_r4x17_fp32"
    assert parse_variant_name(v.name) == v


def test_stream_names_carry_the_block_maps():
    v = Stream(tile=8, maps=128, chunk=4, regtile=(8, 8))
    assert v.name == "stream_t8_m128_c4_r8x8_fp32"
    assert parse_variant_name(v.name) == v
    with pytest.raises(SpecError, match="malformed variant name"):
        parse_variant_name("stream_t8_m128_r8x8_fp32")


def test_mma_padding_is_exact_and_reported():
    p = make_plan(PRESETS["layer2"], Mma(tile=64, precision=Precision.TF32))
    assert p.context["kpad"] == 200  # 196 rounded up to a multiple of 8
    assert p.context["koff"][196:] == [-1] * 4
    p = make_plan(PRESETS["layer2"], Mma(tile=64, precision=Precision.FP16))
    assert p.context["kpad"] == 208
    assert any("196 -> 208" in s.value for s in p.sizes)


@pytest.mark.parametrize(
    "shape,variant,needle",
    [
        (
            square(64, 64, 16, 16, 7),
            Tiled(weights=Weights.CONST, unroll=False),
            "65536-byte constant bank; use --weights global",
        ),
        (
            PRESETS["ae-enc2"],
            Tiled(tile=16, weights=Weights.GLOBAL, unroll=False),
            "choose --tile",
        ),
        (
            PRESETS["layer2"],
            Tiled(tile=64, coarsening=(1, 1, 1), unroll=False),
            "1024 threads",
        ),
        (PRESETS["layer2"], Tiled(tile=0), "at least 1"),
        (PRESETS["layer2"], Tiled(coarsening=(3, 1, 1)), "must divide the tile"),
        (
            PRESETS["layer1"],
            Mma(precision=Precision.TF32, tile=64),
            "16 output maps",
        ),
        (PRESETS["layer1"], Split(splits=2), "C=1"),
        (PRESETS["layer2"], Mma(tile=64), "mma computes in tf32, fp16 or bf16, not fp32"),
        (PRESETS["layer2"], Tiled(precision=Precision.TF32), "for tf32 use --strategy mma"),
        (PRESETS["layer2"], Tiled(coarsening=(4, 1, 16)), "FMAs"),
        (
            PRESETS["layer2"],
            Persist(tile=34, regtile=(1, 4)),
            "choose --tile 7 or fewer",
        ),
        (
            PRESETS["layer2"],
            Persist(tile=34, regtile=(16, 17)),
            "272 accumulators",
        ),
        (
            PRESETS["layer2"],
            Persist(tile=34, regtile=(3, 17)),
            "must divide M=16",
        ),
        (
            PRESETS["ae-enc2"],
            Persist(tile=16, regtile=(4, 8)),
            "use --strategy tiled or implicit",
        ),
        (
            PRESETS["mx-layer2"],
            Persist(tile=27, regtile=(1, 27)),
            "choose --tile",
        ),
        (
            PRESETS["layer2"],
            Persist(tile=34, regtile=(4, 12), precision=Precision.TF32),
            "persist computes in fp32, not tf32",
        ),
        (
            PRESETS["ae-enc2"],
            Stream(tile=8, maps=128, regtile=(8, 8), precision=Precision.TF32),
            "stream computes in fp32, not tf32",
        ),
        (
            PRESETS["ae-enc2"],
            Stream(tile=8, maps=96, chunk=4, regtile=(8, 8)),
            "must divide M=128",
        ),
        (
            PRESETS["ae-enc2"],
            Stream(tile=8, maps=64, chunk=4, regtile=(12, 8)),
            "must divide the block's 64 maps",
        ),
        (
            PRESETS["ae-enc2"],
            Stream(tile=16, maps=128, chunk=4, regtile=(2, 8)),
            "choose --tile 8 or fewer",
        ),
        (
            PRESETS["ae-enc2"],
            Stream(tile=8, maps=128, chunk=3, regtile=(8, 8)),
            "chunk of 3 channels must divide C=256",
        ),
        (
            PRESETS["ae-dec3"],
            Stream(tile=32, maps=3, chunk=32, regtile=(3, 8)),
            "choose a smaller --chunk",
        ),
    ],
)
def test_limits_are_checked_before_rendering(shape, variant, needle):
    with pytest.raises(SpecError, match=re.escape(needle)) as e:
        make_plan(shape, variant)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "spec",
    [
        "C=3,M=4,H=7,W=6,K=3",
        "C=3,M=4,H=7,W=6,K=3,pad=1",
        "C=3,M=4,H=7,W=6,K=5,pad=2",
        "C=3,M=4,H=7,W=6,K=1",
        "C=4,M=6,H=9,W=8,K=3x2,stride=2x1,pad=1x0",
        "C=4,M=6,H=9,W=8,K=3,dil=2x1,pad=2,stride=3",
        "C=4,M=6,H=9,W=8,K=2,pad=same,dil=2",
        "C=4,M=6,H=9,W=8,K=3,pad=0x1x2x0,groups=2,bias=1",
        "C=6,M=6,H=5,W=7,K=3,pad=1,groups=6,act=relu,bias=1",
        "C=2,M=3,H=4,W=4,K=3,pad=4,stride=2,act=relu",
    ],
)
def test_numpy_reference_matches_the_definition(spec):
    p = parse_shape(spec)
    rng = np.random.default_rng()
    x = rng.standard_normal((2, p.C, p.H, p.W))
    w = rng.standard_normal((p.M, p.Cg, p.R, p.S))
    b = rng.standard_normal(p.M) if p.bias else None
    np.testing.assert_allclose(
        conv2d(x, w, p, bias=b), conv2d_loop(x, w, p, bias=b), rtol=1e-12, atol=1e-12
    )


def test_tolerance_follows_precision_and_length():
    layer2 = PRESETS["layer2"]
    fp32 = error_coefficient(Tiled(), layer2)
    assert fp32 < error_coefficient(Tiled(), PRESETS["mx-layer2"])  # longer sums
    assert 1e-6 < fp32 < 1e-4
    tf32 = error_coefficient(Mma(precision=Precision.TF32), layer2)
    half = error_coefficient(Tiled(precision=Precision.FP16), layer2)
    assert fp32 < tf32 < half < 1e-2
    grouped = parse_shape("C=16,M=16,H=40,W=40,K=7,groups=4")
    assert error_coefficient(Tiled(), grouped) == fp32  # 4 channels per group, as layer2
    assert output_rounding(layer2) == 0.0
    assert (
        0
        < output_rounding(parse_shape("C=4,M=16,H=40,W=40,K=7,dtype=fp16"))
        < (output_rounding(parse_shape("C=4,M=16,H=40,W=40,K=7,dtype=bf16")))
    )


def test_fp16_bound_covers_subnormal_inputs():
    """fp16 inputs near zero become subnormals: a relative bound alone fails there
    (seen with one-term outputs, C=1 K=1), the underflow term covers it."""
    rng = np.random.default_rng()
    v = Mma(tile=64, precision=Precision.FP16)
    x = rng.standard_normal(200000).astype(np.float32)
    x[:1000] *= np.float32(1e-4)  # make sure the subnormal range is drawn
    w = np.float32(rng.uniform(0.5, 1.0))
    y = x.astype(np.float16).astype(np.float64) * float(np.float16(w))
    ref = x.astype(np.float64) * float(w)
    one_term = square(1, 1, 1, 1, 1)
    gamma = error_coefficient(v, one_term)
    assert not compare(y, ref, np.abs(ref), gamma)["ok"]
    absolute = underflow_term(v, one_term, float(np.abs(x).max()), float(w))
    result = compare(y, ref, np.abs(ref), gamma, absolute=absolute)
    assert result["ok"], result
    assert underflow_term(Tiled(), PRESETS["layer2"], 5.0, 1.0) == 0.0  # fp32: none


def _emulate_mmapersist(shape, plan, x, w):
    """The arithmetic of templates/gemm/mmapersist.cu.j2 in numpy, from the plan's
    numbers: band staging (zeroed, halo, row pad, padding channel), the B-fragment
    swizzle, every lane's A and B element of every k step, the mma's fragment layout
    and the guarded stores.  Exact products, so only the indexing is under test."""
    ctx = plan.context
    C, M, K, pad, H, W = shape.C, shape.M, shape.K, shape.pad, shape.H, shape.W
    Ho, Wo, rows, mt = shape.Ho, shape.Wo, ctx["rows"], ctx["map_tiles"]
    lane = np.arange(32)
    g, t = lane // 4, lane % 4
    # B fragments, element e = ((s * map_tiles + j) * 32 + l) * 2 + h.
    e = np.arange(ctx["w_words"])
    l, q = e // 2 % 32, e // (64 * mt) * 2 + e % 2
    m = e // 64 % mt * 8 + l // 4
    c, ky = q // ctx["per_channel"], q % ctx["per_channel"] // ctx["quads_per_row"]
    kx = q % ctx["quads_per_row"] * 4 + l % 4
    real = (m < M) & (c < C) & (kx < K)
    ws = np.where(real, w.reshape(-1)[np.where(real, ((m * C + c) * K + ky) * K + kx, 0)], 0.0)
    ws = ws.reshape(-1, 32, 2)  # [step * map_tiles + tile][lane][half]
    y = np.full((x.shape[0], M, Ho, Wo), np.nan)
    for n in range(x.shape[0]):
        for oy0 in range(0, Ho, rows):
            band = np.zeros(ctx["band"])
            for cc in range(C):
                for r in range(ctx["stage_rows"]):
                    for col in range(ctx["iw"]):
                        iy, ix = oy0 + r - pad, col - pad
                        if 0 <= iy < H and 0 <= ix < W:
                            band[cc * ctx["plane"] + r * ctx["stride"] + col] = x[n, cc, iy, ix]
            valid = min(rows, Ho - oy0) * Wo
            for tile in range(ctx["tiles"]):
                px = tile * 16 + g[None, :] + 8 * np.arange(2)[:, None]  # [h][lane]
                px_read = np.where(px < ctx["pixels"], px, 0)
                pa = px_read // Wo * ctx["stride"] + px_read % Wo + t
                acc = np.zeros((mt, 16, 8))
                for it in range(1 if ctx["unrolled"] else ctx["iterations"]):
                    base = it * ctx["group_plane"]
                    for s in ctx["body"]:
                        a = np.empty((16, 8))
                        a[g, t] = band[base + pa[0] + s["a"]]
                        a[g + 8, t] = band[base + pa[1] + s["a"]]
                        a[g, t + 4] = band[base + pa[0] + s["b"]]
                        a[g + 8, t + 4] = band[base + pa[1] + s["b"]]
                        for j in range(mt):
                            frag = ws[it * ctx["group_w"] // 32 + s["w"] // 32 + j]
                            b = np.empty((8, 8))
                            b[t, g], b[t + 4, g] = frag[:, 0], frag[:, 1]
                            acc[j] += a @ b
                for j in range(mt):
                    for r in range(16):
                        p = tile * 16 + r
                        for col in range(8):
                            if p < valid and j * 8 + col < M:
                                yy, xx = oy0 + p // Wo, p % Wo
                                y[n, j * 8 + col, yy, xx] = acc[j, r, col]
    return y


@pytest.mark.parametrize(
    "shape,variant",
    [
        (PRESETS["layer2"], "mmapersist_t34_r16x64_tf32"),
        (PRESETS["layer2"], "mmapersist_t12_r8x32_tf32"),
        (parse_shape("C=3,M=10,H=9,W=7,K=3,pad=1"), "mmapersist_t4_r8x16_tf32"),
        (parse_shape("C=13,M=24,H=12,W=11,K=7,pad=2"), "mmapersist_t5_r24x32_tf32"),
        (parse_shape("C=2,M=5,H=8,W=8,K=5,pad=1"), "mmapersist_t3_r8x32_tf32"),
        (parse_shape("C=5,M=17,H=13,W=18,K=1,pad=0"), "mmapersist_t13_r16x64_tf32"),
    ],
)
def test_mmapersist_fragment_indexing_computes_the_convolution(shape, variant):
    """Every output written, each equal to the float64 convolution: the band offsets,
    the quad padding of the window rows, the channel loop and the B swizzle agree."""
    plan = make_plan(shape, parse_variant_name(variant))
    rng = np.random.default_rng()
    x = rng.standard_normal((1, shape.C, shape.H, shape.W))
    w = rng.standard_normal((shape.M, shape.C, shape.K, shape.K))
    y = _emulate_mmapersist(shape, plan, x, w)
    assert not np.isnan(y).any()
    np.testing.assert_allclose(y, conv2d(x, w, shape), rtol=1e-10, atol=1e-10)


def _b16(shape, ctx, w, slot_of):
    """B words as the 16-bit kernels stage them: [word // map_tiles][lane][half][2 taps]
    from the flat word index e = ((step * map_tiles + j) * 32 + l) * 2 + h; slot_of(step,
    h) gives (channel, window row, octet) or None for a slot of zero weights."""
    mt, K = ctx["map_tiles"], shape.K
    words = ctx["b_words"]
    out = np.zeros((words // 64, 32, 2, 2))
    for e in range(words):
        l, h, step = e // 2 % 32, e % 2, e // (64 * mt)
        m = e // 64 % mt * 8 + l // 4
        where = slot_of(step, h)
        if where is None or m >= shape.M:
            continue
        c, ky, o = where
        for k in range(2):
            kx = 8 * o + 2 * (l % 4) + k
            if kx < K:
                out[e // 64, l, h, k] = w[m, c, ky, kx]
    return out


def _emulate_mmastrip(shape, plan, x, w):
    """The arithmetic of templates/gemm/mmastrip.cu.j2 in numpy, from the plan's numbers:
    the padded band, the B words, each strip's input rows read once a channel, the k
    steps' picks of rows r + ky, fragment rows as columns 0, 2, .., 14, 1, .., 15, and the
    guarded stores.  Exact products, so only the indexing is under test."""
    ctx = plan.context
    C, M, Ho, Wo, rows, R = shape.C, shape.M, shape.Ho, shape.Wo, ctx["rows"], ctx["R"]
    steps, octets, slots = ctx["steps"], ctx["octets"], ctx["slots"]
    fold, mpw, nt = ctx["fold"], ctx["mpw"], ctx["nt"]

    def slot_of(step, h):
        c, s = divmod(step, steps)
        q = 2 * s + h
        return None if q >= slots else (c, q // octets, q % octets)

    if fold == 1:
        ws = _b16(shape, ctx, w, slot_of).reshape(C, steps, ctx["map_tiles"], 32, 2, 2)
    else:  # n column of tile j: row n // mpw of a group, map n % mpw; window row u - that row
        ws = np.zeros((C * steps, ctx["map_tiles"], 32, 2, 2))
        for step, tile, l, h, k in np.ndindex(C * steps, ctx["map_tiles"], 32, 2, 2):
            where = slot_of(step, h)
            n = tile % nt * 8 + l // 4
            m = tile // nt * mpw + n % mpw
            if where is None or m >= M:
                continue
            c, u, o = where
            ky, kx = u - n // mpw, 8 * o + 2 * (l % 4) + k
            if 0 <= ky < shape.K and kx < shape.K:
                ws[step, tile, l, h, k] = w[m, c, ky, kx]
        ws = ws.reshape(C, steps, ctx["map_tiles"], 32, 2, 2)
    g, t = np.arange(8)[:, None], np.arange(4)[None, :]
    y = np.full((x.shape[0], M, Ho, Wo), np.nan)
    elements = C * ctx["plane"] + 64
    for n in range(x.shape[0]):
        for oy0 in range(0, Ho, rows):
            band = band16(shape, ctx, x, n, oy0, C, elements)
            valid = min(rows, Ho - oy0)
            for u in range(ctx["strips"], ctx["units"]):  # 2 columns x 8 rows, a row a lane
                row8 = (u - ctx["strips"]) // ctx["rem_pairs"] * 8
                col = ctx["rem_col0"] + (u - ctx["strips"]) % ctx["rem_pairs"] * 2
                acc = np.zeros((ctx["map_tiles"], 16, 8))
                for c in range(C):
                    for s in ctx["body"]:
                        regs = []
                        for ky, o in (s["a"], s["b"]):
                            a = c * ctx["plane"] + (row8 + g + ky) * ctx["stride"] + col + 8 * o
                            a = a + 2 * t
                            regs += [np.stack([band[a], band[a + 1]], -1)]
                            regs += [np.stack([band[a + 1], band[a + 2]], -1)]
                        for j in range(ctx["map_tiles"]):
                            frag = ws[c, s["s"], j].reshape(8, 4, 2, 2)
                            acc[j] += mma16(regs, frag)
                for j in range(ctx["map_tiles"]):
                    for row in range(16):
                        yy, xx = row8 + row % 8, col + row // 8
                        for mm in range(8):
                            if yy < valid and 8 * j + mm < M:
                                y[n, 8 * j + mm, oy0 + yy, xx] = acc[j, row, mm]
            for u in range(ctx["strips"]):
                row0, col0 = u // ctx["col_tiles"] * fold * R, u % ctx["col_tiles"] * 16
                acc = np.zeros((R, ctx["map_tiles"], 16, 8))
                for c in range(C):
                    # word of octet o of input row i: even column 2g, odd column 2g+1
                    words = {}
                    for i in range(ctx["span"]):
                        for o in range(octets):
                            a = c * ctx["plane"] + (row0 + i) * ctx["stride"] + col0 + 8 * o
                            a = a + 2 * g + 2 * t
                            words[i, o] = (
                                np.stack([band[a], band[a + 1]], -1),
                                np.stack([band[a + 1], band[a + 2]], -1),
                            )
                    for s in ctx["body"]:
                        for r in range(R):
                            (ea, oa), (eb, ob) = (
                                words[fold * r + s["a"][0], s["a"][1]],
                                words[fold * r + s["b"][0], s["b"][1]],
                            )
                            for j in range(ctx["map_tiles"]):
                                frag = ws[c, s["s"], j].reshape(8, 4, 2, 2)
                                acc[r, j] += mma16((ea, oa, eb, ob), frag)
                for r in range(R):
                    for j in range(ctx["map_tiles"]):
                        for row in range(16):
                            col = col0 + (2 * row if row < 8 else 2 * (row - 8) + 1)
                            for mm in range(8):
                                nn = j % nt * 8 + mm  # fold: output row nn // mpw, map nn % mpw
                                m = j // nt * mpw + nn % mpw if fold > 1 else 8 * j + mm
                                yy = row0 + fold * r + (nn // mpw if fold > 1 else 0)
                                if yy < valid and col < Wo and m < M:
                                    y[n, m, oy0 + yy, col] = acc[r, j, row, mm]
    return y


def _emulate_mmapersist16(shape, plan, x, w):
    """templates/gemm/mmapersist16.cu.j2 in numpy: flat m16 tiles, octet slots two a k
    step (the loop over channel groups, the slot of zero weights), B words, stores."""
    ctx = plan.context
    C, M, Ho, Wo, rows = shape.C, shape.M, shape.Ho, shape.Wo, ctx["rows"]
    per_channel, octets, slots = ctx["per_channel"], ctx["octets"], ctx["slots"]

    def slot_of(step, h):
        q = 2 * step + h
        return None if q >= slots else (q // per_channel, q % per_channel // octets, q % octets)

    ws = _b16(shape, ctx, w, slot_of).reshape(-1, ctx["map_tiles"], 32, 2, 2)
    g, t = np.arange(8)[:, None], np.arange(4)[None, :]
    y = np.full((x.shape[0], M, Ho, Wo), np.nan)
    elements = ctx["c_pad"] * ctx["plane"] + 64
    body_steps = len(ctx["body"])
    for n in range(x.shape[0]):
        for oy0 in range(0, Ho, rows):
            band = band16(shape, ctx, x, n, oy0, C, elements)
            valid = min(rows, Ho - oy0) * Wo
            for tile in range(ctx["tiles"]):
                px = tile * 16 + g + 8 * np.arange(2)[:, None, None]  # [h][g][1]
                px = np.where(px < ctx["pixels"], px, 0)
                pa = px // Wo * ctx["stride"] + px % Wo + 2 * t
                acc = np.zeros((ctx["map_tiles"], 16, 8))
                for it in range(1 if ctx["unrolled"] else ctx["iterations"]):
                    for s in ctx["body"]:
                        regs = []
                        for off, h in ((s["a"], 0), (s["a"], 1), (s["b"], 0), (s["b"], 1)):
                            a = 2 * (it * ctx["group_words"] + off) + pa[h]
                            regs.append(np.stack([band[a], band[a + 1]], -1))
                        for j in range(ctx["map_tiles"]):
                            frag = ws[it * body_steps + s["s"], j].reshape(8, 4, 2, 2)
                            acc[j] += mma16(regs, frag)
                for j in range(ctx["map_tiles"]):
                    for row in range(16):
                        p = tile * 16 + row
                        for mm in range(8):
                            if p < valid and 8 * j + mm < M:
                                y[n, 8 * j + mm, oy0 + p // Wo, p % Wo] = acc[j, row, mm]
    return y


@pytest.mark.parametrize(
    "spec,variant",
    [
        ("C=1,M=4,H=30,W=30,K=7", "mmastrip_t24_r8x8_yd"),
        ("C=4,M=16,H=20,W=20,K=7", "mmastrip_t7_r16x4_ys"),  # a band cut short, 2 map tiles
        ("C=2,M=9,H=12,W=21,K=3,pad=1", "mmastrip_t5_r16x2_yd"),  # odd slots, ragged columns
        ("C=3,M=5,H=11,W=14,K=9,pad=4", "mmastrip_t11_r8x3_yd"),  # two octets a row
        ("C=7,M=12,H=15,W=16,K=5,pad=2", "mmastrip_t15_r8x5_ys"),  # the channel loop
        ("C=4,M=16,H=40,W=40,K=7", "mmastrip_t34_r8x4_yd"),  # 2 remainder columns
        ("C=2,M=11,H=24,W=22,K=5,pad=1", "mmastrip_t11_r16x3_ys"),  # 4 remainder columns
        ("C=4,M=1,H=30,W=30,K=7,pad=6", "mmafold_t22_r1x1_yd_j8"),  # layer1's dgrad view
        ("C=16,M=4,H=20,W=21,K=7,pad=6", "mmafold_t13_r4x3_yd_j2"),  # layer2's, odd width
        ("C=3,M=12,H=12,W=12,K=7,pad=6", "mmafold_t9_r12x2_ys_j2"),  # 3 tiles, staged
        ("C=2,M=2,H=14,W=18,K=5,pad=1", "mmafold_t7_r2x1_yd_j4"),  # a band cut short
        ("C=5,M=3,H=9,W=10,K=9,pad=4", "mmafold_t9_r3x1_yd_j8"),  # two octets, the loop
        ("C=1,M=4,H=30,W=30,K=7", "mmapersist_t24_r8x64"),
        ("C=3,M=10,H=13,W=11,K=5,pad=2", "mmapersist_t5_r16x32"),  # odd slots
        ("C=5,M=20,H=15,W=13,K=9,pad=4", "mmapersist_t15_r24x32"),  # channel loop, octets
        ("C=7,M=3,H=9,W=10,K=7,pad=1", "mmapersist_t4_r8x48"),  # channel groups of 2
    ],
)
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_16bit_fragment_indexing_computes_the_convolution(spec, variant, dtype):
    """Every output written, each equal to the float64 convolution: the strips' and the
    flat tiles' band offsets, octet slots, padding slots, channel loops and B words."""
    shape = parse_shape(f"{spec},dtype={dtype}")
    plan = make_plan(shape, parse_variant_name(f"{variant}_{dtype}"))
    if "persist" not in variant:
        assert plan.context["unrolled"] == (shape.C * plan.context["steps"] <= 28)
    rng = np.random.default_rng()
    x = rng.standard_normal((1, shape.C, shape.H, shape.W))
    w = rng.standard_normal((shape.M, shape.C, shape.K, shape.K))
    emulate = _emulate_mmapersist16 if "persist" in variant else _emulate_mmastrip
    y = emulate(shape, plan, x, w)
    assert not np.isnan(y).any()
    np.testing.assert_allclose(y, conv2d(x, w, shape), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(
    "spec,name,words",
    [
        ("C=4,M=1,H=80,W=80,K=7,pad=6,dtype=bf16", "mmafold_t32_r1x1_yd_j4_bf16", "--fold 8"),
        ("C=16,M=4,H=34,W=34,K=7,pad=6,dtype=bf16", "mmafold_t20_r4x2_yd_j3_bf16", "--fold 2"),
        ("C=16,M=4,H=34,W=34,K=7,pad=6,dtype=bf16", "mmafold_t20_r5x2_yd_j8_bf16", "choose one of"),
        ("C=16,M=4,H=34,W=34,K=7,pad=6,dtype=bf16", "mmafold_t20_r4x9_yd_j4_bf16", "accumulators"),
        ("C=16,M=4,H=34,W=34,K=7,pad=6,dtype=bf16", "mmafold_t41_r4x4_yd_j2_bf16", "Ho=40"),
    ],
)
def test_mmafold_limits_are_one_line_refusals(spec, name, words):
    assert_one_line_refusal(spec, name, words)


def _emulate_stream(shape, plan, x, w):
    """The copies and arithmetic of templates/direct/stream.cu.j2 in numpy, thread by
    thread (vectorized over threadIdx), from the plan's numbers: each thread's band and
    weight copy slots into NaN-poisoned chunk buffers, the [C][K][K][M] weight layout,
    the register tile's loads and the guarded stores.  A read of a word nobody wrote
    poisons the output; exact products, so only the indexing is under test."""
    from specgen.runtime import pack_weights

    ctx = plan.context
    M, K, pad, H, W, Ho, Wo = shape.M, shape.K, shape.pad, shape.H, shape.W, shape.Ho, shape.Wo
    T, cb, KK, bm, tm, tx = (ctx[k] for k in ("threads", "cb", "KK", "bm", "tm", "tx"))
    rows, iw, stride, plane, segs = (ctx[k] for k in ("rows", "iw", "stride", "plane", "segs"))
    bpi, runs, vec = ctx["bands_per_image"], ctx["w_row_copies"], ctx["w_vec"]
    wp = pack_weights(w, "ckkm").astype(np.float64)
    tid = np.arange(T)
    g, row, seg = tid // ctx["row_threads"], tid // segs % rows, tid % segs
    y = np.full((x.shape[0], M, Ho, Wo), np.nan)
    for blk in range(x.shape[0] * bpi * ctx["map_blocks"]):
        mb, item = blk % ctx["map_blocks"], blk // ctx["map_blocks"]
        n, iy0 = item // bpi, item % bpi * rows - pad
        acc = np.zeros((T, tm, tx))
        for k in range(ctx["chunks"]):
            ws, bs = np.full(ctx["wchunk"] + 8, np.nan), np.full(ctx["band"] + 8, np.nan)
            for i in range(ctx["w_slots"]):
                if ctx["w_regular"]:
                    tap, q = tid // runs + ctx["w_tap_step"] * i, tid % runs * vec
                    ok = tap < cb * KK
                else:
                    e = tid + T * i
                    tap, q, ok = e // runs, e % runs * vec, e < ctx["w_copies"]
                for j in range(vec):
                    src = mb * bm + k * ctx["w_chunk_stride"] + tap * M + q + j
                    ws[(tap * bm + q + j)[ok]] = wp[src[ok]]
            for i in range(ctx["band_slots"]):
                e = tid + T * i
                iy, ix = iy0 + e // iw, e % iw - pad
                dst = np.where(e < ctx["band_pixels"], e // iw * stride + e % iw, -1)
                inside = (dst >= 0) & (iy >= 0) & (iy < H) & (ix >= 0) & (ix < W)
                for c in range(cb):
                    plane_x = x[n, k * cb + c]
                    val = np.where(inside, plane_x[iy.clip(0, H - 1), ix.clip(0, W - 1)], 0.0)
                    bs[(dst + c * plane)[dst >= 0]] = val[dst >= 0]
            for c in range(cb):
                for ky in range(K):
                    v = bs[
                        (row * stride + seg * tx + c * plane + ky * stride)[:, None]
                        + np.arange(tx + K - 1)
                    ]
                    for kx in range(K):
                        wm = ws[(g * tm + (c * KK + ky * K + kx) * bm)[:, None] + np.arange(tm)]
                        acc += wm[:, :, None] * v[:, None, kx : kx + tx]
        oy = item % bpi * rows + row
        for t in range(T):
            for m in range(tm):
                for j in range(tx):
                    if oy[t] < Ho and seg[t] * tx + j < Wo:
                        y[n, mb * bm + g[t] * tm + m, oy[t], seg[t] * tx + j] = acc[t, m, j]
    return y


@pytest.mark.parametrize(
    "shape,variant",
    [
        (PRESETS["ae-dec1"], "stream_t8_m32_c16_r8x8_fp32"),  # 4 map blocks, float4 copies
        (
            parse_shape("C=12,M=16,H=9,W=11,K=3,pad=1"),
            "stream_t4_m8_c6_r4x6_fp32",
        ),  # tails, 2 chunks
        (parse_shape("C=5,M=6,H=10,W=10,K=5,pad=2"), "stream_t3_m3_c5_r3x5_fp32"),  # 4-byte copies
        (parse_shape("C=3,M=4,H=8,W=13,K=1,pad=0"), "stream_t8_m4_c1_r2x4_fp32"),  # K=1, 3 chunks
        (parse_shape("C=2,M=12,H=14,W=14,K=7,pad=0"), "stream_t5_m12_c1_r4x8_fp32"),  # K=7, C=2
    ],
)
def test_stream_copies_and_register_tile_compute_the_convolution(shape, variant):
    """Every output written, each equal to the float64 convolution: the copy slots of
    both chunk buffers, the transposed weights and the row loads of the register tile."""
    plan = make_plan(shape, parse_variant_name(variant))
    rng = np.random.default_rng()
    x = rng.standard_normal((2, shape.C, shape.H, shape.W))
    # fp32 values: the host packs the weights as fp32, the check is of indices only
    w = rng.standard_normal((shape.M, shape.C, shape.K, shape.K)).astype(np.float32)
    y = _emulate_stream(shape, plan, x, w)
    assert not np.isnan(y).any()
    ref = conv2d(x, w.astype(np.float64), shape)
    np.testing.assert_allclose(y, ref, rtol=1e-10, atol=1e-10)


@settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck))
@given(p=problem_specs())
def test_every_problem_parses_back_and_plans_a_default_set(p):
    """The spec round-trips, the slug is a folder name, the default set is not empty and
    every member renders; a strategy that cannot serve the problem said so and was left
    out."""
    assert parse_shape(p.spec) == replace(p, batch=1, name="")
    assert re.fullmatch(r"[a-z0-9_]+", p.slug)
    variants = default_set(p)
    assert any(type(v) is Direct for v in variants), "direct serves every problem"
    for v in variants:
        src = render(make_plan(p, v))
        assert f"{v.kernel_name(p)}(" in src
    for v in variants:
        assert set(p.features()) <= v.serves, (v.name, p.features())


def simulate_inputtile(shape, plan, x, w):
    """inputtile's addressing as the template spells it, block by block in NumPy: each
    thread stages its own pixel of each channel of the chunk into xs[c][ty][tx], the
    inner threads read their window at ty*sh*row + tx*sw + a tap's literal offset and
    multiply by the weight at wb + m*wstride_map + the tap's weight offset.  Unwritten
    outputs stay NaN.  x and y in NCHW; weights in [M][C/g][R][S]."""
    ctx, v = plan.context, plan.variant
    ih, iw, row, plane, tile = (ctx[k] for k in ("ih", "iw", "row", "plane", "tile"))
    maps, chunk, steps, tiles_x = v.maps, v.chunk, ctx["steps"], ctx["tiles_x"]
    (sh, sw), pt, pl = shape.stride, ctx["pt"], ctx["pl"]
    H, W, Ho, Wo, Cg = shape.H, shape.W, shape.Ho, shape.Wo, shape.Cg
    wflat = w.astype(np.float64).reshape(-1)
    ty, tx = np.divmod(np.arange(ih * iw), iw)
    y = np.full((x.shape[0], shape.M, Ho, Wo), np.nan)
    tiles = ctx["tiles_x"] * -(-Ho // tile)
    for n, bx, mg in itertools.product(range(x.shape[0]), range(tiles), range(ctx["map_groups"])):
        tile_y, tile_x = divmod(bx, tiles_x)
        c_base = mg // ctx["map_groups_per_group"] * Cg
        iy, ix = tile_y * tile * sh - pt + ty, tile_x * tile * sw - pl + tx
        inside = (iy >= 0) & (iy < H) & (ix >= 0) & (ix < W)
        oy, ox = tile_y * tile + ty, tile_x * tile + tx
        computes = (tx < tile) & (ty < tile) & (oy < Ho) & (ox < Wo)
        acc = np.zeros((ih * iw, maps))
        for step in range(steps):
            xs = np.full(chunk * plane, np.nan)
            for c in range(chunk):
                pix = x[n, c_base + step * chunk + c][iy.clip(0, H - 1), ix.clip(0, W - 1)]
                xs[c * plane + ty * row + tx] = np.where(inside, pix, 0.0)
            wb = mg * maps * ctx["wstride_map"] + step * chunk * ctx["KK"]
            corner = ty * sh * row + tx * sw
            for t in ctx["taps"]:
                vals = xs[(corner + t["x"]).clip(0, xs.size - 1)]
                for m in range(maps):
                    acc[:, m] += vals * wflat[wb + m * ctx["wstride_map"] + t["w"]]
        for t in np.flatnonzero(computes):
            for m in range(maps):
                y[n, mg * maps + m, oy[t], ox[t]] = acc[t, m]
    return y


@pytest.mark.parametrize(
    "spec,variant",
    [
        ("C=4,M=8,H=13,W=11,K=3,pad=1", "inputtile_t4_m4_c2_wconst_fp32"),  # 2 steps, tails
        ("C=6,M=6,H=15,W=14,K=3x5,stride=2x1,dil=1x2,pad=1x3,groups=3", None),  # groups
        ("C=2,M=3,H=9,W=9,K=5,pad=valid", "inputtile_t2_m1_c1_wglobal_fp32"),  # 3 map groups
        ("C=3,M=4,H=10,W=12,K=1,stride=3", None),  # 1x1 window, stride 3
    ],
)
def test_inputtile_block_is_the_input_tile_and_computes_the_convolution(spec, variant):
    shape = parse_shape(spec)
    v = parse_variant_name(variant) if variant else Inputtile.default(shape, Precision.FP32)
    plan = make_plan(shape, v)
    ih, iw = plan.context["ih"], plan.context["iw"]
    (sh, sw), (dh, dw) = shape.stride, shape.dil
    assert plan.launches[0].block == (iw, ih, 1)  # one thread per input-tile pixel
    assert iw == (v.tile - 1) * sw + (shape.S - 1) * dw + 1
    assert ih == (v.tile - 1) * sh + (shape.R - 1) * dh + 1
    rng = np.random.default_rng()
    x = rng.standard_normal((2, shape.C, shape.H, shape.W))
    w = rng.standard_normal((shape.M, shape.Cg, shape.R, shape.S))
    y = simulate_inputtile(shape, plan, x, w)
    ref = conv2d(x, w, shape)
    assert not np.isnan(y).any()  # every output written
    np.testing.assert_allclose(y, ref, rtol=1e-10, atol=1e-10)


def simulate_gather(shape, plan, x):
    """The X matrix of the implicit GEMM as implicit's and mma's templates gather it,
    per group: column (n, oh, ow) starts at its window's corner (``x_corner``, a C
    expression that is also Python), row k adds ``koff[k]``, and with padding
    ``kdyx[k]`` decides whether the pixel is inside the image.  x in the problem's
    layout, flattened per image; returns [groups][k][col]."""
    ctx = plan.context
    nhwc = shape.layout is TensorLayout.NHWC
    flat = x.transpose(0, 2, 3, 1) if nhwc else x
    flat = flat.reshape(x.shape[0], -1)
    red, HoWo = shape.reduction, shape.Ho * shape.Wo
    cols = x.shape[0] * HoWo
    out = np.zeros((shape.groups, red, cols))
    for col in range(cols):
        n, oh, ow = col // HoWo, col % HoWo // shape.Wo, col % shape.Wo
        env = dict(oh=oh, ow=ow)
        corner = eval(ctx["x_corner"], {}, env)
        for k in range(red):
            off = ctx["koff"][k]
            if ctx["kdyx"]:
                d = ctx["kdyx"][k]
                dy, dx = d >> 16, (d & 0xFFFF) - (0x10000 if d & 0x8000 else 0)
                ih, iw = eval(ctx["oh_in"], {}, env) + dy, eval(ctx["ow_in"], {}, env) + dx
                if not (0 <= ih < shape.H and 0 <= iw < shape.W):
                    continue
            for g in range(shape.groups):
                out[g, k, col] = flat[n, g * ctx["group_x"] + corner + off]
    return out


@pytest.mark.parametrize(
    "spec",
    [
        "C=32,M=64,H=13,W=11,K=3x5,stride=2x1,dil=2,pad=1x2,groups=4,layout=nhwc",
        "C=6,M=32,H=9,W=10,K=3,stride=2,pad=0x0x1x2,groups=2",
        "C=3,M=16,H=8,W=7,K=1x3,dil=1x2,pad=valid",
        "C=4,M=16,H=9,W=9,K=3,pad=1",  # the presets' kind: square, equal padding
    ],
)
@pytest.mark.parametrize("variant", ["implicit_t64_r4x4_fp32", "mma_t64_tf32"])
def test_gemm_gather_computes_the_convolution(spec, variant):
    """Through the gather tables and corner expressions the planner gives implicit and
    mma, W . X per group is the convolution, in either layout, with stride, dilation,
    unequal padding and groups."""
    shape = parse_shape(spec)
    plan = make_plan(shape, parse_variant_name(variant))
    rng = np.random.default_rng()
    x = rng.standard_normal((2, shape.C, shape.H, shape.W))
    w = rng.standard_normal((shape.M, shape.Cg, shape.R, shape.S))
    X = simulate_gather(shape, plan, x)
    Mg = shape.Mg
    y = np.concatenate(
        [w[g * Mg : (g + 1) * Mg].reshape(Mg, -1) @ X[g] for g in range(shape.groups)]
    )
    y = y.reshape(shape.M, 2, shape.Ho, shape.Wo).transpose(1, 0, 2, 3)
    np.testing.assert_allclose(y, conv2d(x, w, shape), rtol=1e-10, atol=1e-10)
    blocks = plan.context["m_blocks"]
    assert blocks == shape.groups * -(-Mg // plan.context["bm"])  # none straddles a group
