"""wdw: its walk replayed against the float64 weight gradient (bands, staged rows, the
block's column sums, the slice rows); what the compiler makes of it and its limits (CPU
tier), and its numbers on drawn problems and the networks' layers (GPU tier)."""

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
    shipped_layer_winners,
    verify_on_the_gpu,
)
from specgen.compile import compile_source
from specgen.errors import SpecError
from specgen.plan import make_plan
from specgen.reference import bias_grad, conv2d_wgrad
from specgen.render import render
from specgen.shapes import parse_shape
from specgen.strategies.wdw import Wdw
from specgen.variants import Precision

# mobilenet_v2's and efficientnet_b0's depthwise wgrads at 224x224: the first (32
# channels, 112x112), strided ones, 5x5 windows, the widest, and one in fp32
LAYERS = [
    "C=32,M=32,H=112,W=112,K=3,pad=1,groups=32,dtype=bf16,layout=nhwc,op=wgrad",
    "C=144,M=144,H=56,W=56,K=3,pad=1,groups=144,dtype=bf16,layout=nhwc,op=wgrad",
    "C=96,M=96,H=112,W=112,K=3,pad=1,stride=2,groups=96,dtype=bf16,layout=nhwc,op=wgrad",
    "C=144,M=144,H=56,W=56,K=5,pad=2,stride=2,groups=144,dtype=bf16,layout=nhwc,op=wgrad",
    "C=576,M=576,H=14,W=14,K=3,pad=1,groups=576,dtype=fp16,layout=nhwc,op=wgrad",
    "C=1152,M=1152,H=7,W=7,K=3,pad=1,groups=1152,dtype=bf16,layout=nhwc,op=wgrad",
    "C=144,M=144,H=56,W=56,K=3,pad=1,groups=144,layout=nhwc,op=wgrad",
]


@st.composite
def depthwise_wgrads(draw, largest: int = 14):
    """Channels-last depthwise wgrads whose pixels are whole 16-byte copies: windows of 1
    to 7 a side, stride and dilation, every padding form within the window's reach,
    bias, the three dtypes."""
    dtype = draw(st.sampled_from(["fp32", "fp16", "bf16"]))
    unit = 4 if dtype == "fp32" else 8
    C = unit * draw(st.integers(1, 6))
    R, S = draw(st.integers(1, 7)), draw(st.integers(1, 7))
    dil = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    H = draw(st.integers(dil[0] * (R - 1) + 1, largest))
    W = draw(st.integers(dil[1] * (S - 1) + 1, largest))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    reach = (dil[0] * (R - 1), dil[1] * (S - 1))
    pads = [draw(st.integers(0, reach[i // 2])) for i in range(4)]
    spec = (
        f"C={C},M={C},H={H},W={W},K={R}x{S},pad={'x'.join(map(str, pads))},"
        f"stride={stride[0]}x{stride[1]},dil={dil[0]}x{dil[1]},groups={C},"
        f"bias={int(draw(st.booleans()))},dtype={dtype},layout=nhwc,op=wgrad"
    )
    return parsed_or_rejected(spec)


def _replay_wdw(p, x, dy, plan):
    """dw and db the way the wdw kernels compute them: each block's bands staged with
    zeros at the padding and past the maps, each staged row's (output row, window row)
    pairs, the block's columns added in order, the slice rows added by the second pass."""
    c = plan.context
    B = x.shape[0]
    cols, rows, walkers, tiles = c["cols"], c["rows"], c["walkers"], c["col_tiles"]
    sh, sw, dw = p.stride[0], p.stride[1], p.dil[1]
    pt, _, pl, _ = p.pads
    bands = B * c["bands"]
    per = -(-bands // walkers)
    ws = np.full((walkers * tiles, c["row"]), np.nan)
    xcols = c["xcols"]
    for k in range(walkers):
        for i in range(tiles):
            q0 = i * cols
            acc = np.zeros((cols, p.C, p.R, p.S))
            dbacc = np.zeros((cols, p.C))
            for b in range(k * per, min(bands, k * per + per)):
                n, p0 = b // c["bands"], b % c["bands"] * rows
                xs = np.zeros((c["span"], xcols, p.C))
                for r in range(c["span"]):
                    for q in range(xcols):
                        ih, iw = p0 * sh - pt + r, q0 * sw - pl + q
                        if 0 <= ih < p.H and 0 <= iw < p.W:
                            xs[r, q] = x[n, :, ih, iw]
                ds = np.zeros((rows, cols, p.C))
                for j in range(rows):
                    for q in range(cols):
                        if p0 + j < p.Ho and q0 + q < p.Wo:
                            ds[j, q] = dy[n, :, p0 + j, q0 + q]
                dbacc += ds.sum(0)
                for row in c["x_rows"]:
                    for j, r in row["pairs"]:
                        for s in range(p.S):
                            at = sw * np.arange(cols) + s * dw
                            acc[:, :, r, s] += ds[j] * xs[row["at"], at]
            ws[k * tiles + i, : c["weights"]] = acc.sum(0).reshape(-1)
            if c["with_db"]:
                ws[k * tiles + i, c["weights"] :] = dbacc.sum(0)
    sums = ws.sum(0)
    return sums[: c["weights"]].reshape(p.M, 1, p.R, p.S), sums[c["weights"] :]


def _assert_replays(p, plan, batch=2):
    rng = np.random.default_rng()
    x = rng.standard_normal((batch, p.C, p.H, p.W))
    dy = rng.standard_normal((batch, p.M, p.Ho, p.Wo))
    dw, db = _replay_wdw(p, x, dy, plan)
    np.testing.assert_allclose(dw, conv2d_wgrad(x, dy, p), rtol=1e-11, atol=1e-11)
    if p.bias:
        np.testing.assert_allclose(db, bias_grad(dy), rtol=1e-11, atol=1e-11)


def _plans(p, v) -> bool:
    try:
        make_plan(p, v)
    except SpecError:
        return False
    return True


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(p=depthwise_wgrads(), pick=st.integers(0, 10**6), batch=st.integers(1, 3))
def test_the_replayed_walk_gives_the_weight_gradient(p, pick, batch):
    """Stride, dilation, rectangular windows, padding of every form: the default's and a
    drawn tune member's bands, staged rows and pairs, over the launched blocks and
    slices (some with no band at a small batch), give dw and db."""
    space = planned_space(p, Wdw, Precision.FP32)
    assume(space)
    for v in [Wdw.default(p, Precision.FP32), space[pick % len(space)]]:
        if _plans(p, v):
            _assert_replays(p, make_plan(p, v), batch)


def test_every_pair_of_a_band_is_read_once():
    """Each (output row, window row) pair of a band reads exactly one staged x row, at
    stride 2 and dilation 2 too; rows no pair reads are staged but multiply nothing."""
    from specgen.strategies.wdw import band_rows

    for spec in (
        "C=8,M=8,H=20,W=20,K=3,pad=1,groups=8,layout=nhwc,op=wgrad",
        "C=8,M=8,H=20,W=20,K=5,pad=2,stride=2,groups=8,layout=nhwc,op=wgrad",
        "C=8,M=8,H=20,W=20,K=3,pad=2,dil=2,groups=8,layout=nhwc,op=wgrad",
    ):
        p = parse_shape(spec)
        for rows in (1, 2, 4, 8):
            staged = band_rows(p, rows)
            pairs = [pair for row in staged for pair in row["pairs"]]
            assert sorted(pairs) == [(j, r) for j in range(rows) for r in range(p.R)], spec
            assert len(staged) == (rows - 1) * p.stride[0] + (p.R - 1) * p.dil[0] + 1


@pytest.mark.parametrize("spec", LAYERS)
def test_the_networks_depthwise_wgrads_compile_without_spills(spec):
    """The untuned pick and the tune space's first and last members compile for sm_90
    without spills, their shared memory within an SM's."""
    p = parse_shape(spec)
    space = planned_space(p, Wdw, Precision.FP32)
    for v in [Wdw.default(p, Precision.FP32), space[0], space[-1]]:
        plan = make_plan(p, v)
        binary = compile_source(render(plan), plan.name, plan.target("sm_90"))
        assert binary.spills == 0, (plan.name, binary.resources)
        assert plan.dynamic_smem <= 227 * 1024


def test_the_untuned_pick_fills_the_row_evenly():
    """112 outputs a row at 8 channel words a column: four blocks of 28 columns, not 32
    and a tail of 16; words of 8 bytes; bands of 8 rows at stride 1, 4 past it."""
    p = parse_shape(LAYERS[0])
    v = Wdw.default(p, Precision.FP32)
    assert (v.vec, v.cols, v.rows) == (4, 28, 8)
    assert make_plan(p, v).launches[0].grid[0] == 4
    assert Wdw.default(parse_shape(LAYERS[2]), Precision.FP32).rows == 4
    p7 = parse_shape("C=96,M=96,H=56,W=56,K=7,pad=3,groups=96,dtype=bf16,layout=nhwc,op=wgrad")
    assert Wdw.default(p7, Precision.FP32).vec == 2  # 49 taps x 2 channels and 7 dy rows


def test_the_planner_picks_wdw_for_wide_depthwise_wgrads():
    """The untuned pick of mobilenet_v2's depthwise wgrads over inputs 28 wide or more is
    wdw, at stride 1 and 2; over 14- and 7-wide inputs wlane keeps them, and NCHW
    layers never take it."""
    from specgen.choose import planned

    for spec in LAYERS[:4]:
        assert planned(parse_shape(spec), False).variant.key == "wdw", spec
    for spec in LAYERS[4:6]:
        assert planned(parse_shape(spec), False).variant.key == "wlane", spec
    nchw = parse_shape("C=144,M=144,H=56,W=56,K=3,pad=1,groups=144,dtype=bf16,op=wgrad")
    assert planned(nchw, False).variant.key != "wdw"


@pytest.mark.parametrize(
    "spec, name, words",
    [
        ("C=32,M=32,H=9,W=9,K=3,pad=1,groups=32,op=wgrad", "wdw_v4_c4_r2_s8_fp32", "nhwc"),
        (
            "C=64,M=64,H=9,W=9,K=3,pad=1,groups=32,layout=nhwc,op=wgrad",
            "wdw_v4_c4_r2_s8_fp32",
            "depthwise",
        ),
        (
            "C=12,M=12,H=9,W=9,K=3,pad=1,groups=12,dtype=bf16,layout=nhwc,op=wgrad",
            "wdw_v4_c4_r2_s8_fp32",
            "16 bytes",
        ),
        (
            "C=16,M=16,H=9,W=9,K=3,pad=1,groups=16,dtype=bf16,layout=nhwc,op=wgrad",
            "wdw_v16_c4_r2_s8_fp32",
            "[8, 4, 2]",
        ),
        (
            "C=16,M=16,H=9,W=9,K=5,pad=2,groups=16,dtype=bf16,layout=nhwc,op=wgrad",
            "wdw_v8_c4_r2_s8_fp32",
            "--vec",
        ),
        (
            "C=128,M=128,H=9,W=9,K=3,pad=1,groups=128,layout=nhwc,op=wgrad",
            "wdw_v1_c9_r2_s8_fp32",
            "--cols",
        ),
        (
            "C=16,M=16,H=9,W=9,K=3,pad=1,groups=16,layout=nhwc,op=wgrad",
            "wdw_v4_c10_r2_s8_fp32",
            "Wo=9",
        ),
        (
            "C=16,M=16,H=9,W=9,K=3,pad=1,groups=16,layout=nhwc,op=wgrad",
            "wdw_v4_c4_r10_s8_fp32",
            "Ho=9",
        ),
        (
            "C=1152,M=1152,H=7,W=7,K=5,pad=2,groups=1152,dtype=bf16,layout=nhwc,op=wgrad",
            "wdw_v4_c1_r4_s8_fp32",
            "168 registers",
        ),
        (
            "C=960,M=960,H=64,W=64,K=7,pad=3,groups=960,layout=nhwc,op=wgrad",
            "wdw_v1_c1_r64_s8_fp32",
            "--rows",
        ),
    ],
)
def test_limits_are_one_line_refusals(spec, name, words):
    assert_one_line_refusal(spec, name, words)


@settings(max_examples=DRAWN_COMPILES, deadline=None, suppress_health_check=list(HealthCheck))
@given(p=depthwise_wgrads())
def test_drawn_defaults_compile_without_spills(p):
    assert_compiles_without_spills(p, lambda: Wdw.default(p, Precision.FP32))


# ---- GPU tier ----


@pytest.mark.gpu
@pytest.mark.parametrize("shard", range(2))  # two draws, side by side
@settings(max_examples=16, **GPU_DRAWS)
@given(p=depthwise_wgrads(), batch=st.integers(1, 5), pick=st.integers(0, 10**6))
def test_drawn_problems_on_the_gpu(shard, p, batch, pick):
    """The default and one variant of tune's space against the float64 reference: every
    dtype and word, padding on every side, bands and columns cut short, slices with no
    band at a small batch, db."""
    try:
        make_plan(p, Wdw.default(p, Precision.FP32))
    except SpecError:
        assume(False)
    verify_on_the_gpu(p, default_and_drawn(p, Wdw, Precision.FP32, pick), batch)


@pytest.mark.gpu
@pytest.mark.parametrize("spec", LAYERS)
def test_the_networks_layers_at_their_batch(spec):
    """The untuned pick and the tune space's last member, at batch 64, one with a bias."""
    p = parse_shape(spec)
    space = planned_space(p, Wdw, Precision.FP32)
    verify_on_the_gpu(p, [Wdw.default(p, Precision.FP32), space[-1]], 64)
    pb = replace(p, bias=True)
    verify_on_the_gpu(pb, [Wdw.default(pb, Precision.FP32)], 7)


def test_every_shipped_winner_plans():
    """The shipped wdw winners (mobilenet_v2's and efficientnet_b0's depthwise wgrads)
    plan under today's limits: the operator runs the kernels they were timed as."""
    found = shipped_layer_winners("wdw")
    for p, v in found:
        make_plan(p, v)
    assert found
