"""mmahwc (templates/gemm/mmahwc.cu.j2): 16-bit tensor cores over a band spread pixel by
pixel, a window row's taps x channels one run of k.

Without a GPU: the kernel's indexing replayed in numpy from the plan's numbers (band16's
fetch, the spread into the band's copies, each tile's lane addresses and run, the B words
as the block stages them, the guarded stores) against the float64 convolution; the bank
model of the chosen layouts; its limits as one-line refusals; the planner's and the
tuner's variants compile clean with ldmatrix and m16n8k16 in their PTX.  On the GPU the
default sets cover it (tests/test_gpu.py draws 16-bit windows and dgrad views)."""

from __future__ import annotations

import numpy as np
import pytest

from problems import assert_one_line_refusal
from specgen.compile import compile_source
from specgen.plan import make_plan
from specgen.reference import conv2d
from specgen.render import render
from specgen.shapes import parse_shape
from specgen.strategies import Mmahwc, parse_variant_name
from specgen.strategies.mmahwc import _band_layout, _lane_pixel
from specgen.variants import Precision
from specgen.verify import check_resources
from test_wgmma import ptx_of
from test_wstrip import band16_fetch


def _spread(shape, ctx, x, item):
    """band16's fetch, then the kernel's spread in numpy: band row r, column pl + col holds
    the raw band's element of each channel c < C at first[c] + (iy - lo) * W + col, zero
    for rows outside the image; the second copy the same, 4 elements on.  Returns the
    shared words from the band's start as elements (both copies and the zeroed rest)."""
    C, H, W = shape.C, shape.H, shape.W
    rows, ih, bpi, cp = ctx["rows"], ctx["ih"], ctx["bands_per_image"], ctx["cp"]
    stride, pl, chunk = ctx["stride"], ctx["pl"], 2 * ctx["chunk_words"]
    iy0 = item % bpi * rows - shape.pad
    lo = max(iy0, 0)
    raw, row_start = band16_fetch(shape, ctx, x, item)
    smem = np.zeros(2 * ctx["zero_words"])
    copy1 = 2 * (ctx["copy1_at"] - ctx["band_at"]) + 4
    for q in range(ih * W):
        r, col = divmod(q, W)
        iy = iy0 + r
        e = r * stride + (col + pl) * cp
        for c in range(cp):
            v = 0.0
            if 0 <= iy < H and c < C:
                v = raw[2 + c * chunk + (row_start(c, lo) & 7) + (iy - lo) * W + col]
            smem[e + c] = v
            if ctx["copies"] == 2:
                smem[copy1 + e + c] = v
    return smem


def _b_step(w, ctx, shape, s):
    """B[16][map_tiles * 8] of k step s as the block stages its words: word (s, j, l, h)
    holds run elements k0 = 16 * (s % kr) + 2 * (l % 4) + 8h, +1 of map 8j + l/4 in window
    row s / kr, run element k being tap k / cp of channel k % cp."""
    C, M, K, cp, kr = shape.C, shape.M, shape.K, ctx["cp"], ctx["kr"]
    B = np.zeros((16, 8 * ctx["map_tiles"]))
    ky = s // kr
    for j in range(ctx["map_tiles"]):
        for lane in range(32):
            for h in range(2):
                k0 = s % kr * 16 + lane % 4 * 2 + 8 * h
                m = 8 * j + lane // 4
                for i in range(2):
                    kx, c = divmod(k0 + i, cp)
                    if m < M and c < C and kx < K:
                        B[k0 + i - s % kr * 16, m] = w[m, c, ky, kx]
    return B


def _emulate(shape, plan, x, w):
    """Every tile of every item: each lane's ldmatrix row (its pixel's run in the copy the
    column's parity picks), the k steps of every window row, the stores of the pixels in
    the band's rows and Wo's columns."""
    ctx = plan.context
    M, Ho, Wo = shape.M, shape.Ho, shape.Wo
    rows, bpi, vw, cp, stride = (
        ctx["rows"],
        ctx["bands_per_image"],
        ctx["vw"],
        ctx["cp"],
        ctx["stride"],
    )
    copy1 = 2 * (ctx["copy1_at"] - ctx["band_at"]) + 4
    steps = [_b_step(w, ctx, shape, s) for s in range(ctx["steps"])]
    order = [_lane_pixel(lane, ctx["paired"])[0] for lane in range(16)]
    y = np.full((x.shape[0], M, Ho, Wo), np.nan)
    for item in range(x.shape[0] * bpi):
        n, oy0 = item // bpi, item % bpi * rows
        smem = _spread(shape, ctx, x, item)
        valid = min(rows, Ho - oy0)
        for tile in range(ctx["tiles"]):
            acc = np.zeros((16, 8 * ctx["map_tiles"]))
            base = []
            for row in range(16):
                px = min(tile * 16 + order[row], ctx["pixels"] - 1)
                oy, ox = divmod(px, vw)
                at = oy * stride + ox * cp
                if ctx["copies"] == 2 and ox % 2:
                    at += copy1
                assert at % 8 == 0, "ldmatrix rows on 16-byte boundaries"
                base.append(at)
            for s in range(ctx["steps"]):
                ky, k = divmod(s, ctx["kr"])
                off = ky * stride + 16 * k
                assert max(base) + off + 16 <= smem.size, "runs inside the zeroed words"
                A = np.stack([smem[b + off : b + off + 16] for b in base])
                acc += A @ steps[s]
            for row in range(16):
                oy, ox = divmod(tile * 16 + order[row], vw)
                if oy < valid and ox < Wo:
                    y[n, :, oy0 + oy, ox] = acc[row, :M]
    return y


CASES = [
    ("C=12,M=24,H=17,W=17,K=7", None),  # mx-layer2's kind: two copies, rows of Wo + 1
    ("C=24,M=12,H=11,W=11,K=7,pad=6", None),  # its dgrad view: one copy, maps past M
    ("C=4,M=16,H=20,W=20,K=7", None),  # layer2's kind: 4 channels, pixel pairs
    ("C=5,M=9,H=13,W=14,K=5,pad=2", "mmahwc_t4_r16x32"),  # C padded to 8; short last band
    ("C=20,M=16,H=9,W=15,K=3,pad=1", None),  # 20 channels: two copies, odd width
    ("C=13,M=12,H=11,W=9,K=3,pad=1", "mmahwc_t4_r16x16"),  # 16 channels, bands of 4
]


@pytest.mark.parametrize("spec,name", CASES)
def test_the_kernels_indexing_computes_the_convolution(spec, name):
    """Exact products: only the indexing is under test, against the float64 reference."""
    shape = parse_shape(f"{spec},dtype=bf16")
    v = parse_variant_name(f"{name}_bf16") if name else Mmahwc.default(shape, Precision.BF16)
    plan = make_plan(shape, v)
    rng = np.random.default_rng()
    x = rng.integers(-4, 5, (2, shape.C, shape.H, shape.W)).astype(np.float64)
    w = rng.integers(-4, 5, (shape.M, shape.C, shape.K, shape.K)).astype(np.float64)
    y = _emulate(shape, plan, x, w)
    assert not np.isnan(y).any(), "every output written"
    np.testing.assert_array_equal(y, conv2d(x, w, shape))


@pytest.mark.parametrize(
    "C,K,iw,Wo,rows,worst",
    [
        (12, 7, 33, 27, 27, 1),  # mx-layer2: rows of 28, two copies
        (24, 7, 39, 33, 11, 1),  # its dgrad view: 48-byte pixels, in order
        (4, 7, 40, 34, 34, 1),  # layer2
    ],
)
def test_the_presets_bands_are_read_without_bank_conflicts(C, K, iw, Wo, rows, worst):
    """The layout search finds, for the 7x7 presets, a row stride and copy placement whose
    ldmatrix matrices each read 8 distinct bank quads (Nsight Compute on the first
    layouts, H200: 27% and 41% of the shared wavefronts were conflicts)."""
    assert _band_layout(C, K, iw, Wo, rows)["degree"] == worst


@pytest.mark.parametrize(
    "spec",
    [
        "C=12,M=24,H=33,W=33,K=7,dtype=bf16",
        "C=12,M=24,H=33,W=33,K=7,dtype=fp16,op=dgrad",
        "C=4,M=16,H=40,W=40,K=7,dtype=bf16,bias=1,act=relu",
    ],
)
def test_defaults_and_neighbours_compile_clean(spec):
    """The default and the tuning space's ends compile for sm_90 with the planned
    resources, no spills, and ldmatrix.x4 and m16n8k16 in the PTX."""
    p = parse_shape(spec)
    view = Mmahwc.problem_for(p)
    default = Mmahwc.default(view, Precision(p.dtype.value))
    space = Mmahwc.space(view, default.precision)
    for v in [default, space[0], space[-1]]:
        plan = make_plan(p, v)
        binary = compile_source(render(plan), plan.name, plan.target("sm_90"))
        stats, problems = check_resources(plan, binary)
        assert not problems and stats["spills"] == 0, (v.name, problems)
        if v is default:
            ptx = ptx_of(plan)
            assert "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in ptx
            assert "mma.sync.aligned.m16n8k16.row.col.f32" in ptx


def test_limits_are_one_line_refusals():
    """Channels past 64, warp maps that are not whole n8 tiles, accumulators past 64,
    fp32 tensors, shared memory past the block's; and the fit's refusal of layers whose
    channels or maps fill too little of its tiles."""
    assert_one_line_refusal(
        "C=72,M=16,H=20,W=20,K=3,dtype=bf16", "mmahwc_t4_r16x32_bf16", "C up to 64"
    )
    bf = "C=12,M=24,H=33,W=33,K=7,dtype=bf16"
    assert_one_line_refusal(bf, "mmahwc_t8_r12x32_bf16", "whole n8 map tiles")
    assert_one_line_refusal(bf, "mmahwc_t8_r24x96_bf16", "accumulators per thread")
    assert_one_line_refusal("C=12,M=24,H=33,W=33,K=7", "mmahwc_t8_r24x32_bf16", "own dtype")
    assert_one_line_refusal(
        "C=64,M=64,H=200,W=200,K=7,dtype=bf16", "mmahwc_t194_r16x32_bf16", "shared memory"
    )
    with pytest.raises(Exception) as e:
        Mmahwc.default(parse_shape("C=1,M=4,H=86,W=86,K=7,dtype=bf16"), Precision.BF16)
    assert "of the k side" in str(e.value) and "\n" not in str(e.value)
