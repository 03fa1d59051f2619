"""wlane: its walk replayed against the float64 weight gradient over every problem form,
and a word of channels a thread on depthwise layers; what the compiler makes of it and
its limits (CPU tier), and its numbers on drawn problems and the networks' layers (GPU
tier)."""

from dataclasses import replace
from unittest.mock import patch

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
    depthwise_problems,
    problem_specs,
    shipped_layer_winners,
    verify_on_the_gpu,
)
from specgen.compile import compile_source
from specgen.errors import SpecError
from specgen.plan import make_plan
from specgen.reference import bias_grad, conv2d_wgrad
from specgen.render import render
from specgen.shapes import Op, TensorLayout, parse_shape
from specgen.strategies.wlane import Wlane
from specgen.variants import Precision

# mobilenet_v2's and efficientnet_b0's depthwise wgrads at 224x224: the first (32
# channels, 112x112), strided ones, 5x5 windows, the narrowest maps
LAYERS = [
    "C=32,M=32,H=112,W=112,K=3,pad=1,groups=32,dtype=bf16,layout=nhwc,op=wgrad",
    "C=96,M=96,H=112,W=112,K=3,pad=1,stride=2,groups=96,dtype=bf16,layout=nhwc,op=wgrad",
    "C=144,M=144,H=56,W=56,K=5,pad=2,stride=2,groups=144,dtype=bf16,layout=nhwc,op=wgrad",
    "C=240,M=240,H=28,W=28,K=5,pad=2,groups=240,dtype=bf16,layout=nhwc,op=wgrad",
    "C=576,M=576,H=14,W=14,K=3,pad=1,groups=576,dtype=fp16,layout=nhwc,op=wgrad",
    "C=1152,M=1152,H=7,W=7,K=3,pad=1,groups=1152,dtype=bf16,layout=nhwc,op=wgrad",
    "C=144,M=144,H=56,W=56,K=3,pad=1,groups=144,layout=nhwc,op=wgrad",
]


def _emitted_runs(c) -> list[dict]:
    """The runs of a row as the template emits them (``pieces``): a looped piece once a
    first output ``wl``, its offsets (text) evaluated there."""
    out = []
    for piece in c["pieces"]:
        for wl in range(piece["w0"], piece["w0"] + piece["times"] * piece["count"], piece["count"]):
            at = dict(wl=wl)
            if piece["times"] > 1:
                at["xo"] = eval(piece["xo"], {}, at)
            loads = [(q, eval(where, {}, at)) for q, where in piece["loads"]]
            dy_ats = [eval(where, {}, at) for where in piece["dy_ats"]]
            assert eval(piece["dy_at"], {}, at) == dy_ats[0]
            out.append(
                dict(w0=wl, count=piece["count"], loads=loads, fmas=piece["fmas"], dy_ats=dy_ats)
            )
    return out


def _replay_wlane(p, x, dy, plan):
    """dw (and db) the way the wlane kernel computes them: channel tiles and slices of
    the (image, row) walk as launched, each run's loads and products as the template
    emits them, the slices' rows, the reduce adding them in order."""
    c = plan.context
    runs = _emitted_runs(c)
    assert [r["w0"] for r in runs] == [r["w0"] for r in c["runs"]]
    B = x.shape[0]
    threads, splits = c["threads"], c["splits"]
    ws = np.full((splits, c["row"]), np.nan)
    rows = B * p.Ho
    per = -(-rows // splits)
    for k in range(splits):
        for ch in range(p.C):  # every live lane of every channel tile
            m0 = ch // p.Cg * p.Mg
            acc = np.zeros((p.Mg, p.R, p.S))
            dbacc = np.zeros(p.Mg)
            for orow in range(k * per, min(rows, k * per + per)):
                n, ho = divmod(orow, p.Ho)
                for run in runs:
                    assert run["dy_ats"] == [(run["w0"] + j) * p.M for j in range(run["count"])]
                    d = dy[n, m0 : m0 + p.Mg, ho, run["w0"] : run["w0"] + run["count"]].T
                    for r, hi_at in c["tap_rows"]:
                        hi = ho * c["sh"] + hi_at
                        if not 0 <= hi < p.H:
                            continue
                        xs = {}
                        for q, at in run["loads"]:
                            assert at % p.C == 0  # a pixel's offset in NHWC
                            xs[q] = x[n, ch, hi, at // p.C]
                        for j, s, q in run["fmas"]:
                            acc[:, r, s] += d[j] * xs[q]
                    dbacc += d.sum(0)
            ci = ch - m0 // p.Mg * p.Cg
            for m in range(p.Mg):
                at = ((m0 + m) * p.Cg + ci) * p.R * p.S
                ws[k, at : at + p.R * p.S] = acc[m].reshape(-1)
            if c["with_db"] and ci == 0:
                ws[k, c["weights"] + m0 : c["weights"] + m0 + p.Mg] = dbacc
    assert threads * -(-p.C // threads) >= p.C
    sums = ws.sum(0)  # the reduce: slices in order (any order is exact in float64)
    dw = sums[: c["weights"]].reshape(p.M, p.Cg, p.R, p.S)
    return dw, sums[c["weights"] :]


def _assert_replays(p, plan):
    """The replay of ``plan`` on fresh random x and dy gives dw and db as float64 does."""
    rng = np.random.default_rng()
    x = rng.standard_normal((2, p.C, p.H, p.W))
    dy = rng.standard_normal((2, p.M, p.Ho, p.Wo))
    dw, db = _replay_wlane(p, x, dy, plan)
    np.testing.assert_allclose(dw, conv2d_wgrad(x, dy, p), rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(db, bias_grad(dy), rtol=1e-11, atol=1e-11)


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(p=problem_specs(largest=8))
def test_wlane_replay_gives_the_weight_gradient(p):
    """Stride, dilation, groups, padding of every form: the planned runs' loads and
    products, over the launched slices, give dw and db (the windows' x positions are
    the planner's arithmetic, not the template's)."""
    from specgen.strategies.wlane import Wlane

    p = replace(p.with_op(Op.WGRAD), layout=TensorLayout.NHWC, bias=True)
    try:
        plan = make_plan(p, Wlane.default(p, Wlane().precision))
    except SpecError:
        assume(False)  # maps x taps past its registers, say; drawn again
    _assert_replays(p, plan)


@settings(max_examples=16, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(p=problem_specs(largest=40), pixels=st.integers(1, 3))
def test_a_rows_middle_as_one_loop_replays_to_the_weight_gradient(p, pixels):
    """Every row looped where two whole runs stay off its padding (the bound on a row's
    unrolled products taken to 0): the loop's offsets, evaluated at each of its first
    outputs, give dw and db."""
    from specgen.strategies import wlane

    p = replace(p.with_op(Op.WGRAD), layout=TensorLayout.NHWC, bias=True)
    v = replace(Wlane.default(p, Wlane().precision), pixels=min(pixels, p.Wo))
    with patch.object(wlane, "UNROLLED_ROW_MAX", 0):
        try:
            plan = make_plan(p, v)
        except SpecError:
            assume(False)
    _assert_replays(p, plan)


# Rows whose unrolled products pass UNROLLED_ROW_MAX: convnext_tiny's widest depthwise
# wgrad, maps of two a group under a strided, dilated, unequally padded window, and
# a depthwise one without a bias (channel words)
WIDE_ROWS = [
    "C=96,M=96,H=56,W=56,K=7,pad=3,groups=96,bias=1,dtype=bf16,layout=nhwc,op=wgrad",
    "C=48,M=96,H=21,W=99,K=5,pad=1x3,stride=2,dil=2,groups=48,bias=1,layout=nhwc,op=wgrad",
    "C=64,M=64,H=30,W=64,K=7,pad=3,groups=64,dtype=fp16,layout=nhwc,op=wgrad",
]


@pytest.mark.parametrize("spec", WIDE_ROWS)
def test_a_wide_rows_middle_is_one_loop_that_compiles_without_spills(spec):
    """The tune space's members loop over the middle of the row (two runs or more) and
    compile for sm_90 without spills, from a shorter source than the row unrolled
    whole."""
    from specgen.strategies import wlane

    p = parse_shape(spec)
    assert p.Mg * p.Wo * p.R * p.S > wlane.UNROLLED_ROW_MAX
    for v in [Wlane.default(p, Precision.FP32), Wlane.space(p, Precision.FP32)[-1]]:
        plan = make_plan(p, v)
        assert plan.context["looped"] >= 2, v.name
        source = render(plan)
        assert "for (int wl = " in source
        binary = compile_source(source, plan.name, plan.target("sm_90"))
        assert binary.spills == 0, (plan.name, binary.resources)
        with patch.object(wlane, "UNROLLED_ROW_MAX", 1 << 30):
            unrolled = render(make_plan(p, v))
        assert "for (int wl = " not in unrolled and len(source) < len(unrolled), v.name


def test_no_shipped_winner_loops_over_its_rows():
    """The bound on a row's unrolled products sits above every shipped wlane winner's
    rows: the winners run the kernels they were timed as."""
    found = shipped_layer_winners("wlane")
    for p, v in found:
        assert make_plan(p, v).context["looped"] == 0, (p.spec, v.name)
    assert found


def depthwise_wgrads():
    """Depthwise wgrads without a bias (the ones channel words serve) in channels-last."""
    return depthwise_problems().map(lambda p: replace(p.with_op(Op.WGRAD), bias=False))


def _words(p, v) -> int:
    return replace(v, vec=next(w for w in (8, 4, 2, 1) if _plans(p, replace(v, vec=w)))).vec


def _plans(p, v) -> bool:
    try:
        make_plan(p, v)
    except SpecError:
        return False
    return True


@settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck))
@given(p=depthwise_wgrads(), pick=st.integers(0, 10**6))
def test_a_word_of_channels_a_thread_gives_the_weight_gradient(p, pick):
    """The widest word that plans and a drawn member of the tune space: every channel
    of every block's words covered once, and the planned runs' loads and products over
    the launched slices give dw."""
    base = Wlane.default(p, Precision.FP32)
    space = [v for v in Wlane.space(p, Precision.FP32) if _plans(p, v)]
    for v in [replace(base, vec=_words(p, base))] + space[pick % len(space) :][:1]:
        plan = make_plan(p, v)
        launch, _ = plan.launches
        tiles, threads = launch.grid[0], launch.block[0]
        firsts = [(i * threads + t) * v.vec for i in range(tiles) for t in range(threads)]
        covered = [f + e for f in firsts if f < p.C for e in range(v.vec)]
        assert sorted(covered) == list(range(p.C)), v.name
        x = np.random.default_rng().standard_normal((2, p.C, p.H, p.W))
        dy = np.random.default_rng().standard_normal((2, p.M, p.Ho, p.Wo))
        dw, _ = _replay_wlane(p, x, dy, plan)
        np.testing.assert_allclose(dw, conv2d_wgrad(x, dy, p), rtol=1e-11, atol=1e-11)


def _widest_word(p):
    """The tune space's first member with a word of channels a thread."""
    return next(v for v in Wlane.space(p, Precision.FP32) if v.vec > 1)


@pytest.mark.parametrize("spec", LAYERS)
def test_the_networks_depthwise_wgrads_compile_in_words_without_spills(spec):
    """The tune space holds a word of 4 bytes or more a lane, which compiles for sm_90
    without spills; the untuned pick keeps one channel a lane (words measured slower on
    most of these layers)."""
    p = parse_shape(spec)
    assert Wlane.default(p, Precision.FP32).vec == 1
    v = _widest_word(p)
    assert v.vec * p.dtype.bytes >= 4, v.name
    plan = make_plan(p, v)
    binary = compile_source(render(plan), plan.name, plan.target("sm_90"))
    assert binary.spills == 0, (plan.name, binary.resources)


def test_words_are_searched_only_where_they_serve():
    """Groups of several channels, a bias, or a channel count no word divides: one
    channel a lane in every member of the tune space."""
    for spec in (
        "C=256,M=3,H=32,W=32,K=3,pad=1,bias=1,layout=nhwc,op=wgrad",
        "C=64,M=64,H=16,W=16,K=3,pad=1,groups=32,layout=nhwc,op=wgrad",
        "C=64,M=64,H=16,W=16,K=3,pad=1,groups=64,bias=1,layout=nhwc,op=wgrad",
        "C=7,M=7,H=16,W=16,K=3,pad=1,groups=7,layout=nhwc,op=wgrad",
    ):
        assert {v.vec for v in Wlane.space(parse_shape(spec), Precision.FP32)} == {1}, spec


@pytest.mark.parametrize(
    "spec, name, words",
    [
        (
            "C=64,M=64,H=9,W=9,K=3,pad=1,groups=32,layout=nhwc,op=wgrad",
            "wlane_t64_p8_s64_v2_fp32",
            "depthwise",
        ),
        (
            "C=64,M=64,H=9,W=9,K=3,pad=1,groups=64,bias=1,layout=nhwc,op=wgrad",
            "wlane_t64_p8_s64_v2_fp32",
            "bias",
        ),
        (
            "C=12,M=12,H=9,W=9,K=3,pad=1,groups=12,layout=nhwc,op=wgrad",
            "wlane_t64_p8_s64_v8_fp32",
            "divides",
        ),
        (
            "C=24,M=24,H=9,W=9,K=3,pad=1,groups=24,dtype=bf16,layout=nhwc,op=wgrad",
            "wlane_t64_p4_s64_v8_fp32",
            "--vec",
        ),
        (
            "C=16,M=16,H=9,W=8,K=3,pad=1,groups=16,layout=nhwc,op=wgrad",
            "wlane_t64_p9_s64_v4_fp32",
            "Wo=8",
        ),
        (
            "C=16,M=16,H=9,W=9,K=1,groups=16,dtype=bf16,layout=nhwc,op=wgrad",
            "wlane_t64_p8_s64_v8_fp32",
            "--pixels 4",
        ),
    ],
)
def test_limits_are_one_line_refusals(spec, name, words):
    assert_one_line_refusal(spec, name, words)


@settings(max_examples=DRAWN_COMPILES, deadline=None, suppress_health_check=list(HealthCheck))
@given(p=depthwise_wgrads())
def test_drawn_defaults_compile_without_spills(p):
    assert_compiles_without_spills(p, lambda: Wlane.default(p, Precision.FP32))


# ---- GPU tier ----


@pytest.mark.gpu
@pytest.mark.parametrize("shard", range(2))  # two draws, side by side
@settings(max_examples=16, **GPU_DRAWS)
@given(p=depthwise_wgrads(), batch=st.integers(1, 5), pick=st.integers(0, 10**6))
def test_drawn_problems_on_the_gpu(shard, p, batch, pick):
    """The default and one variant of tune's space against the float64 reference: words
    of each width and dtype, the padding on every side, runs cut short, slices with no
    rows at a small batch."""
    try:
        make_plan(p, Wlane.default(p, Precision.FP32))
    except SpecError:
        assume(False)
    verify_on_the_gpu(p, default_and_drawn(p, Wlane, Precision.FP32, pick), batch)


@pytest.mark.gpu
@pytest.mark.parametrize("spec", WIDE_ROWS)
def test_a_wide_rows_loop_on_the_gpu(spec):
    """The untuned pick and the tune space's last member (a word of channels where the
    layer takes words), their rows' middles looped, against float64 at batch 3."""
    p = parse_shape(spec)
    verify_on_the_gpu(p, [Wlane.default(p, Precision.FP32), Wlane.space(p, Precision.FP32)[-1]], 3)


@pytest.mark.gpu
@pytest.mark.parametrize("spec", LAYERS)
def test_the_networks_layers_at_their_batch(spec):
    """The untuned pick (one channel a lane) and the widest word, at batch 64."""
    p = parse_shape(spec)
    verify_on_the_gpu(p, [Wlane.default(p, Precision.FP32), _widest_word(p)], 64)
