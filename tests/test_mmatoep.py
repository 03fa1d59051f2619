"""mmatoep (templates/gemm/mmatoep.cu.j2): the window's columns as a Toeplitz B.

Without a GPU: the kernel's indexing replayed in numpy from the plan's numbers (band16's
fetch, the realign into the band, each unit's 16 rows and column tiles, the lanes' tap
words) against the float64 convolution; its limits as one-line refusals; the planner's
and the tuner's variants compile clean.  On the GPU the default sets cover it
(tests/test_gpu.py draws the dgrad views it serves)."""

from __future__ import annotations

import numpy as np
import pytest

from problems import assert_one_line_refusal
from specgen.compile import compile_source
from specgen.errors import SpecError
from specgen.plan import make_plan
from specgen.reference import conv2d
from specgen.render import render
from specgen.shapes import Op, parse_shape
from specgen.strategies import Mmatoep, parse_variant_name
from specgen.variants import Precision
from specgen.verify import check_resources
from band16 import band16_fetch


def _realign(shape, ctx, x, item):
    """The kernel's realign in numpy: band row r of channel c holds image row iy0 + r from
    column lpad, copied 8 elements (a 16-byte chunk) at a time from the raw band, an odd
    start taking each word's high half and the next one's low half, the last chunk's
    columns past W zero, rows outside the image zero, and zero around."""
    C, H = shape.C, shape.H
    rows, ih, bpi = ctx["rows"], ctx["ih"], ctx["bands_per_image"]
    plane, stride, lpad, rc = ctx["plane"], ctx["stride"], ctx["lpad"], ctx["row_chunks"]
    chunk = 2 * ctx["chunk_words"]
    iy0 = item % bpi * rows - shape.pad
    lo = max(iy0, 0)
    raw, row_start = band16_fetch(shape, ctx, x, item)
    band = np.zeros(2 * ctx["zero_words"])
    for c in range(C):
        for r in range(ih):
            iy = iy0 + r
            for k in range(rc):
                v = np.zeros(8)
                if 0 <= iy < H:
                    at = c * chunk + row_start(c, iy) - (row_start(c, lo) & ~7) + 8 * k
                    if ctx["aligned"]:
                        assert at % 8 == 0
                    v = raw[2 + at : 2 + at + 8].copy()  # five words' halves, as the prmt picks
                    if k == ctx["last_chunk"]:  # the masks of its words past W
                        for part, keep in ctx["last_chunk_masks"]:
                            i = 2 * "xyzw".index(part)
                            v[i + (keep != "0u") : i + 2] = 0.0
                at = c * plane + r * stride + lpad + 8 * k
                band[at : at + 8] = v
    return band


def _table(w, mb, ctx, shape):
    """The block's tap tables as the kernel builds them, flat: word e is entry e // (K + 1)
    = (c, ky, block map), word q = e % (K + 1) holding taps q - 1 and q (zero outside the
    window and past M)."""
    M, K, bm = shape.M, shape.K, ctx["bm"]
    out = np.zeros((ctx["table_words"], 2))
    for e in range(ctx["table_words"]):
        s, tab = e % ctx["table_row"] - 1, e // ctx["table_row"]
        m, ky, c = mb * bm + tab % bm, tab // bm % K, tab // (bm * K)
        for h, tap in enumerate((s, s + 1)):
            if m < M and 0 <= tap < K:
                out[e, h] = w[m, c, ky, tap]
    return out


def _b_fragment(ctx, table, mg, m, c, ky, K):
    """B[k][n] as the lanes load it: lane (g, t)'s words from tb0 and tb1 (word q0 = 2t -
    g + 1 - delta clamped into 0..K, and q0 + 8 likewise) where b0_real and b1_real hold
    (the word lies in 0..K), else zero; the first word is k = 2t, 2t+1 of column g, the second k = 2t+8, 2t+9.
    """
    B = np.zeros((16, 8))
    base = mg * ctx["mw"] * ctx["table_row"] + ((c * K + ky) * ctx["bm"] + m) * ctx["table_row"]
    for g in range(8):
        for t in range(4):
            q0 = 2 * t - g + 1 - ctx["delta"]
            if 0 <= q0 <= K:
                B[2 * t : 2 * t + 2, g] = table[base + min(max(q0, 0), K)]
            if 0 <= q0 + 8 <= K:
                B[2 * t + 8 : 2 * t + 10, g] = table[base + min(max(q0 + 8, 0), K)]
    return B


def _emulate(shape, plan, x, w):
    """Every item of every map block: units (map group, column group, row tile) as the
    kernel numbers them, 16 rows from r0 and ct tiles from j0 (clamped back), A the 16 x
    16 block of band rows r0 + ky .. at columns 8 * (j0 + j) .., the stores guarded."""
    ctx = plan.context
    C, M, K, Ho, Wo = shape.C, shape.M, shape.K, shape.Ho, shape.Wo
    plane, stride = ctx["plane"], ctx["stride"]
    mw, ct, bm, eps = ctx["mw"], ctx["ct"], ctx["bm"], ctx["eps"]
    bpi, rows = ctx["bands_per_image"], ctx["rows"]
    y = np.full((x.shape[0], M, Ho, Wo), np.nan)
    for item in range(x.shape[0] * bpi):
        n, oy0 = item // bpi, item % bpi * rows
        band = _realign(shape, ctx, x, item)
        valid = min(rows, Ho - oy0)
        for mb in range(ctx["map_blocks"]):
            table = _table(w, mb, ctx, shape)
            for u in range(ctx["units"]):
                mg = u % ctx["map_groups"]
                cg = u // ctx["map_groups"] % ctx["col_groups"]
                rt = u // (ctx["map_groups"] * ctx["col_groups"])
                r0 = max(min(16 * rt, valid - 16), 0)
                j0 = min(cg * ct, ctx["col_tiles"] - ct)
                for m in range(mw):
                    mp = mb * bm + mg * mw + m
                    acc = np.zeros((ct, 16, 8))
                    for c in range(C):
                        for ky in range(K):
                            B = _b_fragment(ctx, table, mg, m, c, ky, K)
                            for j in range(ct):
                                at = c * plane + (r0 + ky) * stride + 8 * (j0 + j)
                                A = np.stack(
                                    [
                                        band[at + i * stride : at + i * stride + 16]
                                        for i in range(16)
                                    ]
                                )
                                acc[j] += A @ B
                    if mp >= M:
                        continue
                    for j in range(ct):
                        for i in range(16):
                            for col in range(8):
                                row, cc = r0 + i, 8 * (j0 + j) + col - eps
                                if row < valid and 0 <= cc < Wo:
                                    y[n, mp, oy0 + row, cc] = acc[j, i, col]
    return y


CASES = [
    ("C=4,M=1,H=20,W=21,K=7,pad=6", None),  # a dgrad view's padding: delta 2, odd W
    ("C=2,M=4,H=17,W=16,K=7", None),  # x's rows on 16-byte boundaries: chunks as fetched
    ("C=3,M=2,H=13,W=11,K=5,pad=3", None),  # delta 5 + K = 10: the tiles start 5 columns left
    ("C=4,M=6,H=19,W=18,K=9,pad=8", None),  # K = 9 fills the k16 step
    ("C=5,M=3,H=9,W=9,K=3,pad=1", None),  # a band under 16 rows
    ("C=1,M=1,H=9,W=9,K=5", None),  # K = 5: lanes whose first word is past the table's
    ("C=1,M=1,H=5,W=5,K=5,pad=4", None),  # delta 4: lanes whose second word is before it
    ("C=4,M=6,H=26,W=23,K=7,pad=2", "mmatoep_t7_r2x2_m4"),  # map blocks, M past them; short bands
    ("C=2,M=3,H=40,W=30,K=5", "mmatoep_t36_r1x3_m3"),  # column groups clamped back to overlap
]


@pytest.mark.parametrize("spec,name", CASES)
def test_the_kernels_indexing_computes_the_convolution(spec, name):
    """Exact products: only the indexing is under test, against the float64 reference."""
    shape = parse_shape(f"{spec},dtype=bf16")
    v = parse_variant_name(f"{name}_bf16") if name else Mmatoep.default(shape, Precision.BF16)
    plan = make_plan(shape, v)
    rng = np.random.default_rng()
    x = rng.integers(-4, 5, (2, shape.C, shape.H, shape.W)).astype(np.float64)
    w = rng.integers(-4, 5, (shape.M, shape.C, shape.K, shape.K)).astype(np.float64)
    y = _emulate(shape, plan, x, w)
    assert not np.isnan(y).any(), "every output written"
    np.testing.assert_array_equal(y, conv2d(x, w, shape))


@pytest.mark.parametrize(
    "spec",
    [
        "C=1,M=4,H=86,W=86,K=7,dtype=bf16,op=dgrad",
        "C=4,M=16,H=40,W=40,K=7,dtype=fp16,op=dgrad",
        "C=1,M=12,H=72,W=72,K=7,dtype=bf16,op=dgrad",
        "C=3,M=2,H=13,W=11,K=5,pad=1,dtype=bf16,bias=1,act=relu",
    ],
)
def test_defaults_and_neighbours_compile_clean(spec):
    """The default and two of its neighbours in the tuning space compile for sm_90 with
    the planned resources and no spills."""
    p = parse_shape(spec)
    view = Mmatoep.problem_for(p)
    default = Mmatoep.default(view, Precision(p.dtype.value))
    space = Mmatoep.space(view, default.precision)
    for v in [default, space[0], space[-1]]:
        try:
            plan = make_plan(p, v)
        except SpecError:
            assert v is not default
            continue
        binary = compile_source(render(plan), plan.name, plan.target("sm_90"))
        stats, problems = check_resources(plan, binary)
        assert not problems and stats["spills"] == 0, (v.name, problems)


def test_limits_are_one_line_refusals():
    """Windows past 9 taps, warp maps past the block's, accumulators past 64, column
    tiles past the row's, fp32 tensors, shared memory past the block's."""
    bf = "C=4,M=4,H=40,W=40,K=7,dtype=bf16"
    assert_one_line_refusal(
        "C=4,M=4,H=40,W=40,K=11,dtype=bf16", "mmatoep_t8_r1x2_m1_bf16", "K at most 9"
    )
    assert_one_line_refusal(bf, "mmatoep_t8_r2x2_m3_bf16", "whole groups of a warp's maps")
    assert_one_line_refusal(bf, "mmatoep_t8_r4x5_m4_bf16", "accumulators per thread")
    assert_one_line_refusal(bf, "mmatoep_t8_r1x6_m1_bf16", "tiles of 8 columns")
    assert_one_line_refusal("C=4,M=4,H=40,W=40,K=7", "mmatoep_t8_r1x2_m1_bf16", "fp16 or bf16")
    assert_one_line_refusal(
        "C=64,M=4,H=200,W=200,K=7,dtype=bf16", "mmatoep_t190_r1x2_m4_bf16", "shared memory"
    )


def test_dgrad_view_and_planner():
    """dgrad reaches it through the forward view (dy padded by K - 1 - pad); the planner
    took it for the 7x7 views of one map over four channels or more until mmarows (the
    H200: mx-layer1's 1.15 ms here, 0.604 there), which it still computes."""
    from specgen.choose import planned

    p = parse_shape("C=1,M=12,H=72,W=72,K=7,dtype=bf16,op=dgrad")
    view = Mmatoep.problem_for(p)
    assert (view.C, view.M, view.pad, view.op) == (12, 1, 6, Op.FPROP)
    assert planned(p, allow_tf32=False).variant.key == "mmarows"
    make_plan(p, Mmatoep.default(view, Precision.BF16))
