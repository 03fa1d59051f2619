"""CPU tier for the backward ops: the float64 references against the definition, the
algebra each strategy builds on (dgrad's forward view, the stride phases, wgrad's
work items) replayed in NumPy, the problem model's refusals, and the CLI."""

import itertools
from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, assume, given, settings
from problems import problem_specs

from specgen.cli import main
from specgen.errors import SpecError
from specgen.plan import make_plan
from specgen.reference import (
    bias_grad,
    conv2d,
    conv2d_dgrad,
    conv2d_wgrad,
    gradients_loop,
)
from specgen.render import render
from specgen.runtime import dgrad_weights
from specgen.shapes import PRESETS, Act, DType, Op, TensorLayout, parse_shape
from specgen.strategies import default_set, parse_variant_name
from specgen.strategies.phased import Phased
from specgen.strategies.tiled import Tiled
from specgen.strategies.wsplit import Wsplit
from specgen.tensors import Role, outputs

SMALL = settings(
    max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True
)


def _operands(p, batch, rng):
    x = rng.standard_normal((batch, p.C, p.H, p.W))
    w = rng.standard_normal((p.M, p.Cg, p.R, p.S))
    dy = rng.standard_normal((batch, p.M, p.Ho, p.Wo))
    return x, w, dy


@SMALL
@given(p=problem_specs(largest=9))
def test_references_match_the_definition(p):
    """dx, dw and db from the vectorized references equal the sums that walking the
    forward loop sends back, on problems with stride, dilation, groups and padding."""
    rng = np.random.default_rng()
    x, w, dy = _operands(p, 2, rng)
    dx, dw, db = gradients_loop(x, w, dy, p)
    np.testing.assert_allclose(conv2d_dgrad(dy, w, p), dx, rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(conv2d_wgrad(x, dy, p), dw, rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(bias_grad(dy), db, rtol=1e-11, atol=1e-11)


@SMALL
@given(p=problem_specs(largest=9))
def test_gradients_are_the_adjoint(p):
    """<conv(x, w), dy> = <x, dgrad(dy, w)> = <w, wgrad(x, dy)>: the three passes are one
    bilinear form, whatever the geometry."""
    rng = np.random.default_rng()
    x, w, dy = _operands(p, 2, rng)
    y = conv2d(x, w, p, epilogue=False)
    forms = (
        np.vdot(y, dy),
        np.vdot(x, conv2d_dgrad(dy, w, p)),
        np.vdot(w, conv2d_wgrad(x, dy, p)),
    )
    np.testing.assert_allclose(forms[1:], [forms[0]] * 2, rtol=1e-9, atol=1e-9)


@SMALL
@given(p=problem_specs(largest=9))
def test_dgrad_view_is_a_forward_convolution(p):
    """At stride 1, dx = conv(dy, w flipped and transposed per group) over the view's
    padding: the problem every forward strategy is handed for dgrad."""
    p = p.with_op(Op.DGRAD)
    try:
        view = p.dgrad_view()
    except SpecError as e:
        assert p.stride != (1, 1) or "past the window's reach" in str(e)
        assume(False)  # drawn again: every counted draw reaches the check
    assert (view.C, view.M, view.H, view.W) == (p.M, p.C, p.Ho, p.Wo)
    assert (view.Ho, view.Wo) == (p.H, p.W)
    rng = np.random.default_rng()
    _, w, dy = _operands(p, 2, rng)
    got = conv2d(dy, dgrad_weights(w, p.groups), view, epilogue=False)
    np.testing.assert_allclose(got, conv2d_dgrad(dy, w, p), rtol=1e-11, atol=1e-11)


def _replay_phased(p, dy, w):
    """dx from the plan's phases, taps and dy offsets, the way the kernels index."""
    ctx = make_plan(p, Phased.default(p, Phased().precision)).context
    dx = np.full((dy.shape[0], p.C, p.H, p.W), np.nan)
    Mg, Cg, (sh, sw) = p.Mg, p.Cg, p.stride
    for ph in ctx["phases"]:
        for i in range(ph["Hq"]):
            for j in range(ph["Wq"]):
                acc = np.zeros((dy.shape[0], p.C))
                for t in ph["taps"]:
                    oy, ox = i + t["oy"], j + t["ox"]
                    if 0 <= oy < p.Ho and 0 <= ox < p.Wo:
                        for g in range(p.groups):
                            d = dy[:, g * Mg : (g + 1) * Mg, oy, ox]
                            wt = w[g * Mg : (g + 1) * Mg, :, t["r"], t["s"]]
                            acc[:, g * Cg : (g + 1) * Cg] += d @ wt
                dx[:, :, ph["a"] + sh * i, ph["b"] + sw * j] = acc
    return dx


@SMALL
@given(p=problem_specs(largest=11))
def test_phased_replay_covers_every_pixel_with_its_taps(p):
    """Every dx pixel belongs to exactly one phase (none left NaN), and the phase's
    taps and literal dy offsets give the adjoint's value."""
    p = p.with_op(Op.DGRAD)
    rng = np.random.default_rng()
    _, w, dy = _operands(p, 2, rng)
    np.testing.assert_allclose(
        _replay_phased(p, dy, w), conv2d_dgrad(dy, w, p), rtol=1e-11, atol=1e-11
    )


@SMALL
@given(p=problem_specs(largest=9))
def test_wsplit_items_cover_every_weight_once(p):
    """The kernel's item -> (maps, channel, tap row) decoding and its workspace index
    write each dw entry (and each db entry, from the items of channel 0, row 0) once."""
    p = p.with_op(Op.WGRAD)
    plan = make_plan(p, Wsplit.default(p, Wsplit().precision))
    c = plan.context
    hits = np.zeros(c["row"], dtype=int)
    for item in range(c["items"]):
        r, ch, gm = item % c["R"], item // c["R"] % c["Cg"], item // (c["R"] * c["Cg"])
        m0 = gm * c["mb"]
        for i in range(c["mb"]):
            for s in range(c["S"]):
                hits[(m0 + i) * c["Cg"] * c["RS"] + ch * c["RS"] + r * c["S"] + s] += 1
            if c["with_db"] and ch == 0 and r == 0:
                hits[c["weights"] + m0 + i] += 1
    assert (hits == 1).all()


def test_wgrad_error_bound_follows_the_summation_tree():
    """At B=10000 layer1's weights are sums of 64 million terms; the plan's tree (a
    thread's pixels of its slice, shuffles, warps, slices) is far shallower."""
    from specgen.verify import summation_terms

    p = PRESETS["layer1"].with_op(Op.WGRAD)
    plan = make_plan(p, Wsplit.default(p, Wsplit().precision))
    terms = summation_terms(plan, 10000)
    assert terms < 10000 * p.Ho * p.Wo / 1000
    per_thread, slices, rest = plan.sum_depth
    assert terms == per_thread * -(-10000 // slices) + rest


def test_ops_name_their_kernels_and_share_the_folder():
    p = PRESETS["layer2"]
    names = {
        op: make_plan(p.with_op(op), v).name for op in Op for v in default_set(p.with_op(op))[:1]
    }
    assert names[Op.FPROP].endswith("_fp32")
    for op in (Op.DGRAD, Op.WGRAD, Op.BGRAD):
        assert names[op].endswith("_" + op.value)
        assert p.with_op(op).slug == "layer2"


def test_forward_strategies_serve_stride_one_dgrad_through_the_view():
    p = PRESETS["layer2"].with_op(Op.DGRAD)
    plan = make_plan(p, Tiled.default(p.dgrad_view(), Tiled().precision))
    assert plan.view == p.dgrad_view() and plan.weight_transform == "dgrad"
    for launch in plan.launches:
        assert Role.X not in launch.args and Role.DY in launch.args and Role.DX in launch.args
    kinds = {type(v).__name__ for v in default_set(p)}
    assert {"Persist", "Stream", "Tiled", "Phased"} <= kinds
    strided = parse_shape("C=4,M=8,H=12,W=12,K=3,stride=2,pad=1,op=dgrad")
    assert [type(v) for v in default_set(strided)] == [Phased]


def test_outputs_per_op():
    p = parse_shape("C=4,M=8,H=12,W=12,K=3,bias=1")
    assert outputs(p) == (Role.Y,)
    assert outputs(p.with_op(Op.DGRAD)) == (Role.DX,)
    assert outputs(p.with_op(Op.WGRAD)) == (Role.DW, Role.DB)
    assert outputs(p.with_op(Op.BGRAD)) == (Role.DB,)
    assert not p.with_op(Op.DGRAD).bias and p.with_op(Op.WGRAD).bias


@pytest.mark.parametrize(
    "spec,needle",
    [
        ("C=4,M=8,H=12,W=12,K=3,act=relu,op=wgrad", "act=relu is part of the forward pass"),
        ("C=4,M=8,H=12,W=12,K=3,bias=1,op=dgrad", "op=dgrad does not read the bias"),
        ("C=4,M=8,H=12,W=12,K=3,op=backward", "op=backward is not fprop, dgrad, wgrad or bgrad"),
    ],
)
def test_spec_refusals(spec, needle):
    with pytest.raises(SpecError, match=needle):
        parse_shape(spec)


def test_spec_round_trips_the_op():
    p = parse_shape("C=4,M=8,H=12,W=12,K=3,stride=2,op=wgrad,bias=1")
    assert p.op is Op.WGRAD and parse_shape(p.spec) == p
    assert p.with_op(Op.FPROP).act is Act.NONE


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--op", "sideways"], "unknown op 'sideways'"),
        (["--op", "wgrad", "--strategy", "direct"], "direct computes fprop, not op=wgrad"),
        (["--strategy", "phased"], "phased computes dgrad, not op=fprop"),
        (["--op", "dgrad", "--strategy", "wsplit"], "wsplit computes wgrad and bgrad"),
        (["--op", "wgrad", "--maps", "3"], "wband m3 must divide the 16 maps"),
    ],
)
def test_cli_refuses_in_one_line(args, needle, tmp_path):
    r = CliRunner().invoke(main, ["emit", "--shape", "layer2", "--out", str(tmp_path), *args])
    assert r.exit_code == 2, r.output
    assert needle in r.output and len(r.output.strip().splitlines()) == 1, r.output


def test_cli_emits_each_op(tmp_path):
    for op in ("dgrad", "wgrad", "bgrad"):
        r = CliRunner().invoke(
            main, ["emit", "--shape", "layer2", "--op", op, "--all", "--out", str(tmp_path)]
        )
        assert r.exit_code == 0, r.output
    names = sorted(f.name for f in (tmp_path / "layer2").glob("*.cu"))
    assert any(n.startswith("phased_") and n.endswith("_dgrad.cu") for n in names)
    assert any(n.startswith("persist_") and n.endswith("_dgrad.cu") for n in names)
    assert any(n.startswith("wsplit_") and n.endswith("_wgrad.cu") for n in names)
    assert any(n.startswith("wsplit_") and n.endswith("_bgrad.cu") for n in names)


def _replay_wband(p, x, dy, plan):
    """dw (and db) the way the wband kernel computes them: bands staged with their zero
    padding at the planned strides, runs of pixels sliding x, every block's sums."""
    c = plan.context
    B = x.shape[0]
    sh, sw, dh, dw_ = c["sh"], c["sw"], c["dh"], c["dw"]
    dw = np.full((p.M, p.Cg, p.R, p.S), np.nan)
    db = np.zeros(p.M)
    for block in range(p.groups * c["mbs"] * p.Cg):
        ch, gm = block % p.Cg, block // p.Cg
        m0, xc = gm * c["mb"], gm // c["mbs"] * p.Cg + ch
        acc = np.zeros((p.R, c["mb"], p.S))
        for n in range(B):
            for b in range(c["bands"]):
                oy0 = b * c["rows"]
                xs = np.zeros(c["x_band"])
                for k in range(c["x_rows"]):
                    for j in range(c["x_cols"]):
                        iy, ix = oy0 * sh - c["pt"] + k, j - c["pl"]
                        if 0 <= iy < p.H and 0 <= ix < p.W:
                            xs[k * c["x_stride"] + j] = x[n, xc, iy, ix]
                ds = np.zeros(c["dy_band"])
                for i in range(c["mb"]):
                    for k in range(c["rows"]):
                        for j in range(c["wo_pad"]):
                            if oy0 + k < p.Ho and j < p.Wo:
                                ds[i * c["dy_plane"] + k * c["dy_stride"] + j] = dy[
                                    n, m0 + i, oy0 + k, j
                                ]
                for r in range(p.R):
                    for u in range(c["units"]):
                        k, j0 = u % c["rows"], u // c["rows"] * c["L"]
                        xr = (k * sh + r * dh) * c["x_stride"] + j0 * sw
                        dr = k * c["dy_stride"] + j0
                        for j in range(c["L"]):
                            for i in range(c["mb"]):
                                d = ds[i * c["dy_plane"] + dr + j]
                                for s in range(p.S):
                                    acc[r, i, s] += d * xs[xr + j * sw + s * dw_]
                                if ch == 0 and r == 0:
                                    db[m0 + i] += d
        dw[m0 : m0 + c["mb"], ch] = acc.transpose(1, 0, 2)
    return dw, db


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(p=problem_specs(largest=8))
def test_wband_replay_gives_the_weight_gradient(p):
    from specgen.strategies.wband import Wband

    p = p.with_op(Op.WGRAD)
    try:
        plan = make_plan(p, Wband.default(p, Wband().precision))
    except SpecError:
        assume(False)  # a window too tall for one warp per tap row, say; drawn again
    rng = np.random.default_rng()
    x, _, dy = _operands(p, 2, rng)
    dw, db = _replay_wband(p, x, dy, plan)
    np.testing.assert_allclose(dw, conv2d_wgrad(x, dy, p), rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(db, bias_grad(dy), rtol=1e-11, atol=1e-11)


def _stage_wtap(p, c, x, dy, n, oy0, xc0, m0):
    """A band's buffer as the kernel's copies fill it (NaN where none writes): each
    warp's rounds of rows, each lane's copies along a row, the planes at their literal
    offsets, zeros where a copy's source is not the image's."""
    buf = np.full(c["buffer"], np.nan)
    for t, src, plane, first, rows_of in (
        ("x", x[n, xc0 : xc0 + c["cb"]], c["x_plane"], oy0 * c["sh"] - c["pt"], p.H),
        ("dy", dy[n, m0 : m0 + c["mb"]], c["dy_plane"], oy0, p.Ho),
    ):
        g, at = c[f"{t}_copy"] // 4, (0 if t == "x" else c["x_band"])
        lead = c["pl"] if t == "x" else 0
        for warp, lane, i, q in itertools.product(
            range(c["warps"]), range(32), range(c[f"{t}_iters"]), range(c[f"{t}_rounds"])
        ):
            if i == c[f"{t}_iters"] - 1 and warp >= c[f"{t}_tail_warps"]:
                continue
            if q == c[f"{t}_rounds"] - 1 and lane >= c[f"{t}_tail_lanes"]:
                continue
            if t == "dy" and q == c["dy_rounds"] - 1 and c["dy_flat_tail"]:
                continue  # the rows' last chunks: below, a lane each
            row = first + warp + c["warps"] * i
            inside = 0 <= row < rows_of
            assert inside or not c[f"{t}_rows_inside"], (t, row)
            col = (lane + 32 * q) * g - lead
            width = src.shape[-1]
            off = min(max(col, 0), width - g)
            dst = (
                at
                + c[f"{t}_stride"] * warp
                + g * lane
                + c[f"{t}_round_words"] * i
                + c[f"{t}_round_bytes"] // 4 * q
            )
            for k in range(src.shape[0]):
                d = dst + plane * k
                if inside and 0 <= col < width:
                    buf[d : d + g] = src[k, row, off : off + g]
                else:
                    buf[d : d + g] = 0.0
    if c["dy_flat_tail"]:  # copy j (lane j % 32 of round j / 32): chunk j % tail of round
        # j / tail % iters, map j / (tail iters)
        tail, iters, g = c["dy_tail_lanes"], c["dy_iters"], c["dy_copy"] // 4
        assert c["dy_tail_rounds"] == 1 or 32 % (tail * iters) == 0
        copies = range(32 * c["dy_tail_rounds"])
        for warp, lane in itertools.product(range(c["warps"]), copies):
            tc, ti, tm = lane % tail, lane // tail % iters, lane // (tail * iters)
            if lane >= tail * iters * c["mb"] or (ti == iters - 1 and warp >= c["dy_tail_warps"]):
                continue
            row = oy0 + warp + c["warps"] * ti
            col = g * (32 * (c["dy_rounds"] - 1) + tc)
            at = c["x_band"] + c["dy_stride"] * warp + c["dy_plane"] * tm + c["dy_round_words"] * ti
            at += (c["dy_round_bytes"] * (c["dy_rounds"] - 1) + c["dy_copy"] * tc) // 4
            buf[at : at + g] = dy[n, m0 + tm, row, col : col + g]
    return buf


def _wtap_sum(c, t):
    """The channel, map group and window-row group whose sums thread t keeps (group RL:
    db), and its row split, as the kernel reads them off the planned numbers."""
    at, ri = t % c["pairs"], min(t // c["pairs"], c["splits_rows"] - 1)
    return (*_wtap_pair(c, at), ri)


def _wtap_pair(c, at):
    if c["with_db"] and at >= c["tap_pairs"]:
        return 0, at - c["tap_pairs"], c["RL"]
    return at // c["channel_pairs"], at // c["RL"] % c["MG"], at % c["RL"]


def _replay_wtap(p, x, dy, plan):
    """dw (and db) the way the wtap kernel computes them: every block's bands staged
    by its copies (``_stage_wtap``), every lane's window row (or the
    row of ones) sliding under the steps' vector loads, the row splits and the slices
    added in order."""
    c = plan.context
    B = x.shape[0]
    ws = np.full((c["splits"], c["row"]), np.nan)
    R, S, mb, cb, LM, LR = p.R, p.S, c["mb"], c["cb"], c["LM"], c["LR"]
    for item in range(p.groups * c["mbs"] * c["cbs"]):
        c0, gm = item % c["cbs"] * cb, item // c["cbs"]
        m0, xc0 = gm * mb, gm // c["mbs"] * p.Cg + item % c["cbs"] * cb
        for k_slice in range(c["splits"]):
            acc = np.zeros((c["threads"], LM, LR, S))  # a thread's sums
            for n in range(k_slice, B, c["splits"]):
                for b in range(c["bands"]):
                    oy0 = b * c["rows"]
                    buf = _stage_wtap(p, c, x, dy, n, oy0, xc0, m0)
                    ones = np.ones(c["x_cols"])
                    valid = min(c["rows"], p.Ho - oy0)
                    for t in range(c["threads"]):
                        ci, mi, slot, ri = _wtap_sum(c, t)
                        xtap = c["dh"] * c["x_stride"]
                        if slot == c["RL"]:
                            xl, xrow, xtap = ones, 0, 0
                        else:
                            xl = buf[ci * c["x_plane"] + slot * LR * xtap :]
                            xrow = c["sh"] * c["x_stride"]
                        dl = buf[c["x_band"] + mi * c["dy_plane"] :]
                        for k, l, r in itertools.product(
                            range(ri, valid, c["splits_rows"]), range(LM), range(LR)
                        ):
                            xr = xl[k * xrow + r * xtap :]
                            dr = dl[l * c["MG"] * c["dy_plane"] + k * c["dy_stride"] :]
                            xv = np.zeros(c["window"])
                            xv[: c["pre"]] = xr[: c["pre"]]
                            for j in range(c["steps"]):
                                d = dr[c["P"] * j : c["P"] * j + c["P"]]
                                at = c["shift"] * j + c["pre"]
                                xv[c["pre"] :] = xr[at : at + c["shift"]]
                                for i in range(min(c["P"], p.Wo - c["P"] * j)):
                                    for s_ in range(S):
                                        acc[t, l, r, s_] += d[i] * xv[i * c["sw"] + s_ * c["dw"]]
                                xv[: c["pre"]] = xv[c["shift"] : c["shift"] + c["pre"]]
            for t in range(c["pairs"]):  # split 0 adds the others, in order
                sums = sum(acc[t + c["pairs"] * r] for r in range(c["splits_rows"]))
                ci, mi, slot, _ = _wtap_sum(c, t)
                for l, r in itertools.product(range(LM), range(LR)):
                    m = m0 + mi + c["MG"] * l  # a lane's maps: mi, mi + MG, ...
                    if slot < c["RL"]:
                        at = m * p.Cg * R * S + (c0 + ci) * R * S + (slot * LR + r) * S
                        ws[k_slice, at : at + S] = sums[l, r]
                    elif c0 == 0 and r == 0:
                        ws[k_slice, c["weights"] + m] = sums[l, 0, 0]
    total = ws.sum(0)  # the reduce: slices in order (any order is exact in float64)
    return total[: c["weights"]].reshape(p.M, p.Cg, R, S), total[c["weights"] :]


@pytest.mark.parametrize("lane_tile", ["one map, one row", "maps and rows"])
@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(p=problem_specs(largest=8))
def test_wtap_replay_gives_the_weight_gradient(lane_tile, p):
    """Stride, dilation, groups, padding of every form: wtap's bands, lanes (one map
    and window row each, or up to 4 maps and every row that fits), vector steps and
    sliding window, as planned, give dw and db."""
    from specgen.strategies.wtap import MAX_LANE_SUMS, Wtap

    p = replace(p.with_op(Op.WGRAD), layout=TensorLayout.NCHW, dtype=DType.FP32, bias=True)
    v = replace(Wtap.default(p, Wtap().precision), splits=2)
    if lane_tile == "maps and rows":
        lm = max(d for d in range(1, 5) if v.maps % d == 0)
        lr = max(d for d in range(1, p.R + 1) if p.R % d == 0 and lm * d * p.S <= MAX_LANE_SUMS)
        v = replace(v, regtile=(lm, lr))
    try:
        plan = make_plan(p, v)
    except SpecError:
        assume(False)  # a row too long to unroll, say; drawn again
    x, _, dy = _operands(p, 3, np.random.default_rng())
    dw, db = _replay_wtap(p, x, dy, plan)
    np.testing.assert_allclose(dw, conv2d_wgrad(x, dy, p), rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(db, bias_grad(dy), rtol=1e-11, atol=1e-11)


def test_wtap_space_searches_lane_tiles():
    """tune's wtap space holds lanes of one map and row, of 2 maps, and on a wide 3x3
    layer the fit's 4 maps x 3 rows and 2 x 3; most of each plan."""
    from specgen.strategies.wtap import Wtap
    from specgen.variants import Precision

    for preset, tiles in (
        ("layer2", {(1, 1), (2, 1)}),
        ("ae-enc2", {(1, 1), (2, 1), (4, 3), (2, 3)}),
    ):
        p = PRESETS[preset].with_op(Op.WGRAD)
        space = Wtap.space(p, Precision.FP32)
        assert {v.regtile for v in space} == tiles
        for tile in tiles:
            planned = 0
            for v in (v for v in space if v.regtile == tile):
                try:
                    make_plan(p, v)
                    planned += 1
                except SpecError:
                    pass
            assert planned > 0, (preset, tile)


def test_wtap_replay_of_short_rows_copied_a_lane_a_chunk_in_rounds_of_32():
    """ae-enc2's rows (16 outputs: 4 copies of 16 bytes) over 4 warps of 2 rows and 32
    maps: 256 copies a warp, in 8 rounds of every lane, each round 4 maps on; with a
    drawn band and warps whose last round of rows leaves some out, and a batch over the
    slices; the buffers they fill still give dw."""
    for spec, name in (
        ("ae-enc2", "wtap_t8_m32_c16_p4_r4x3_w1_q3_s12_fp32_wgrad"),
        ("C=16,M=20,H=14,W=8,K=3,pad=1,bias=1", "wtap_t7_m20_c4_p4_r2x3_w3_q2_s2_fp32_wgrad"),
    ):
        p = parse_shape(spec).with_op(Op.WGRAD)
        c = make_plan(p, parse_variant_name(name)).context
        assert c["dy_flat_tail"] and c["dy_tail_rounds"] > 1, (spec, c["dy_tail_rounds"])
    p = parse_shape("C=16,M=20,H=14,W=8,K=3,pad=1,bias=1").with_op(Op.WGRAD)
    plan = make_plan(p, parse_variant_name("wtap_t7_m20_c4_p4_r2x3_w3_q2_s2_fp32_wgrad"))
    c = plan.context
    assert c["dy_tail_warps"] < c["warps"] and c["dy_tail_last_lanes"] < 32
    x, _, dy = _operands(p, 3, np.random.default_rng())
    dw, db = _replay_wtap(p, x, dy, plan)
    np.testing.assert_allclose(dw, conv2d_wgrad(x, dy, p), rtol=1e-11, atol=1e-11)
    np.testing.assert_allclose(db, bias_grad(dy), rtol=1e-11, atol=1e-11)


def test_wtap_replay_of_rows_whose_last_chunks_take_a_lane_each():
    """mx-layer1's rows (66 outputs: a round of 32 copies and one more) in bands of 13
    over 10 warps, the last round's rows in 3 of them: the rows' last chunks are
    copied a lane each, and the buffer they fill still gives dw."""
    p = parse_shape("C=1,M=4,H=45,W=72,K=7").with_op(Op.WGRAD)
    plan = make_plan(p, parse_variant_name("wtap_t13_m4_c1_p4_r1x1_w11_q2_s2_fp32_wgrad"))
    c = plan.context
    assert c["dy_flat_tail"] and c["dy_iters"] == 2 and c["dy_tail_warps"] < c["warps"]
    x, _, dy = _operands(p, 3, np.random.default_rng())
    dw, _ = _replay_wtap(p, x, dy, plan)
    np.testing.assert_allclose(dw, conv2d_wgrad(x, dy, p), rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize(
    "spec, args, needle",
    [
        ("layer2-bf16", [], "wtap sums fp32 tensors; for bf16 use --strategy wstrip"),
        ("C=4,M=16,H=40,W=40,K=7,layout=nhwc", [], "wtap reads NCHW tensors"),
        ("layer2", ["--maps", "3"], "wtap m3 must divide the 16 maps of a group"),
        ("layer2", ["--chans", "3"], "wtap c3 must divide the 4 channels of a group"),
        ("layer2", ["--warps", "8"], "over 768 (where ptxas spills); choose --warps 3"),
        ("layer2", ["--tile", "40"], "wtap t40: the band is at most Ho=34 rows"),
        ("layer2", ["--stages", "5"], "wtap q5: the band ring has 2, 3 or 4 buffers"),
        ("layer2", ["--tile", "34", "--stages", "4"], "choose a smaller --tile or --stages"),
        ("layer1", ["--tile", "80", "--warps", "1"], "over the sm_90 limit"),
    ],
)
def test_wtap_refuses_in_one_line(spec, args, needle, tmp_path):
    r = CliRunner().invoke(
        main,
        ["emit", "--shape", spec, "--op", "wgrad", "--strategy", "wtap", "--out", str(tmp_path)]
        + args,
    )
    assert r.exit_code == 2, r.output
    assert needle in r.output and r.output.count("\n") == 1, r.output


def _replay_flane(p, x, w, b, plan):
    """y the way the flane kernel computes it (the forward counterpart of wlane, on the
    same planned runs): every run of every row, each lane's channels, the weights as
    staged (zero past C), the lanes added, the epilogue."""
    c = plan.context
    B = x.shape[0]
    y = np.full((B, p.M, p.Ho, p.Wo), np.nan)
    ws = np.zeros((c["taps"], c["cpad"], 4))
    ws[:, : p.C, : p.M] = w.reshape(p.M, p.C, c["taps"]).transpose(2, 1, 0)
    for orow in range(B * p.Ho):
        n, ho = divmod(orow, p.Ho)
        for run in c["runs"]:
            acc = np.zeros((32, run["count"], p.M))  # each lane's sums
            for lane in range(32):
                for i in range(c["lanes"]):
                    ch = lane + 32 * i
                    for r, hi_at in c["tap_rows"]:
                        hi = ho * c["sh"] + hi_at
                        if not 0 <= hi < p.H:
                            continue
                        xs = {
                            q: (x[n, ch, hi, at // p.C] if ch < p.C else 0.0)
                            for q, at in run["loads"]
                        }
                        for j, s, q in run["fmas"]:
                            acc[lane, j] += xs[q] * ws[r * p.S + s, ch, : p.M]
            out = acc.sum(0)
            if p.bias:
                out = out + b
            if p.act is Act.RELU:
                out = np.maximum(out, 0.0)
            y[n, :, ho, run["w0"] : run["w0"] + run["count"]] = out.T
    return y


@settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(p=problem_specs(largest=8))
def test_flane_replay_gives_the_forward_pass(p):
    """Stride, dilation, padding of every form, bias and relu: flane's planned runs,
    lanes and staged weights give y."""
    from specgen.strategies.flane import Flane

    p = replace(p, layout=TensorLayout.NHWC, groups=1, M=min(p.M, 4), C=p.Cg)
    try:
        plan = make_plan(p, Flane.default(p, Flane().precision))
    except SpecError:
        assume(False)  # drawn again: every counted draw reaches the check
    rng = np.random.default_rng()
    x, w, _ = _operands(p, 2, rng)
    b = rng.standard_normal(p.M)
    y = _replay_flane(p, x, w, b, plan)
    np.testing.assert_allclose(
        y, conv2d(x, w, p, bias=b if p.bias else None), rtol=1e-11, atol=1e-11
    )


def test_wsplit_atomic_adds_into_fp32_gradients_only():
    """The atomic variant needs no workspace and clears dw and db first; 16-bit tensors
    are refused (each block's sum would be rounded), in one line."""
    p = parse_shape("C=8,M=12,H=13,W=11,K=3,groups=2,bias=1,op=wgrad")
    plan = make_plan(p, Wsplit(atomic=True, maps=3, splits=4))
    assert plan.workspace_bytes == 0
    assert [l.kernel.rsplit("_", 1)[-1] for l in plan.launches] == ["zero", "wgrad"]
    assert plan.launches[0].args == (Role.DW, Role.DB)
    assert Role.WORKSPACE not in plan.launches[1].args
    with pytest.raises(SpecError, match="choose --slices"):
        make_plan(p.__class__(**{**p.__dict__, "dtype": p.dtype.BF16}), Wsplit(atomic=True, maps=3))


def test_cli_takes_the_atomic_switch(tmp_path):
    r = CliRunner().invoke(
        main,
        ["emit", "--shape", "layer2", "--op", "bgrad", "--strategy", "wsplit", "--atomic"]
        + ["--out", str(tmp_path)],
    )
    assert r.exit_code == 0, r.output
    assert "_at_fp32_bgrad.cu" in r.output


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("op", [Op.WGRAD, Op.BGRAD])
def test_reduction_inputs_make_the_bound_tight(op, dtype):
    """verify's inputs for the batch reductions: the sum of the terms' magnitudes that
    the bound scales is within a small factor of each gradient itself, so that an error
    of a few percent of a weight cannot pass; and nothing overflows a 16-bit dtype."""
    from specgen.tensors import from_storage
    from specgen.verify import random_inputs, references

    p = parse_shape(f"C=3,M=4,H=12,W=12,K=3,pad=1,bias=1,dtype={dtype}").with_op(op)
    inputs, _, _ = random_inputs(p, 64, np.random.default_rng())
    values = {r: from_storage(t, p.dtype).astype(np.float64) for r, t in inputs.items()}
    assert all(np.isfinite(v).all() and np.abs(v).max() > 0 for v in values.values())
    for ref, magnitude in references(p, values, None, None, np).values():
        assert np.isfinite(ref).all() and np.abs(ref).max() < 60000
        assert np.median(magnitude / np.abs(ref)) < 2.0


def test_tune_names_a_strategy_that_does_not_compute_the_op_before_asking_for_a_gpu():
    r = CliRunner().invoke(
        main, ["tune", "--shape", "layer2", "--op", "dgrad", "--strategy", "wband"]
    )
    assert r.exit_code == 2 and "wband computes wgrad, not op=dgrad" in r.output, r.output


def test_best_picks_each_ops_shipped_winners(tmp_path):
    """--best is per op: layer1's shipped dgrad and wgrad winners, and for an op with
    none shipped, the tune command that would find one."""
    run = CliRunner().invoke
    for op, prefix in (("dgrad", "drow_"), ("wgrad", "wtap_")):
        r = run(
            main,
            ["emit", "--shape", "layer1", "--op", op, "--best", "--gpu", "NVIDIA H200"]
            + ["--out", str(tmp_path)],
        )
        assert r.exit_code == 0, r.output
        written = list((tmp_path / "layer1").glob(f"*_{op}.cu"))
        assert written and all(f.name.startswith(prefix) for f in written), written
    r = run(main, ["emit", "--shape", "ae-enc2", "--op", "bgrad", "--best", "--gpu", "NVIDIA H200"])
    assert r.exit_code == 2 and "specgen tune --shape ae-enc2 --op bgrad" in r.output, r.output


def test_wgemm_stores_16_bytes_only_where_every_slice_row_is_aligned():
    """A slice row of dw and db of 366 sums puts odd slices off a 16-byte boundary: the
    GPU tier met a misaligned float4 store there; such rows get scalar stores."""
    from specgen.strategies import BY_KEY

    W = BY_KEY["wgemm"]
    for spec, vector in (
        ("C=4,M=6,H=15,W=17,K=5x3,pad=2,stride=3x1,dil=1x2,bias=1,op=wgrad", False),
        ("C=256,M=128,H=16,W=16,K=3,pad=1,bias=1,op=wgrad", True),
    ):
        p = parse_shape(spec)
        plan = make_plan(p, W.default(p, W.precisions[0]))
        epilogue = render(plan).split("The slice's sums")[1]
        assert ("float4" in epilogue) is vector, spec
        assert vector is (plan.context["row"] % 4 == 0)


@pytest.mark.parametrize("groups", [1, 3])
@pytest.mark.parametrize("fmt", ["f32", "ckkm"])
@pytest.mark.parametrize("transform", [False, True])
def test_packing_the_weights_indices_gives_the_gather_of_the_packed_weights(groups, fmt, transform):
    """The PyTorch operator packs weights on the device with one gather whose indices are
    the host packer applied to the weights' own indices: the same layout, exactly."""
    from specgen.runtime import pack_weights

    base = np.random.default_rng().standard_normal((6, 2, 3, 5)).astype(np.float32)
    ids = np.arange(base.size).reshape(base.shape)
    values = dgrad_weights(base, groups) if transform else base
    ids = dgrad_weights(ids, groups) if transform else ids
    gather = pack_weights(ids, fmt)
    assert gather.dtype.kind == "i"
    assert np.array_equal(pack_weights(values, fmt), base.reshape(-1)[gather])


def _replay_wgemm(p, x, dy, plan):
    """dw (and db) the way the wgemm kernels compute them: each block's chunks loaded by
    each thread at the template's indices (its pixel kk, its rows of dy and columns of
    im2col(x), zeros where the window meets the padding), multiplied, written to its
    slice's workspace row at the planned offsets, then the slices added in order."""
    c = plan.context
    BK, rows, P, Wo = c["BK"], c["rows_per_pass"], c["P"], c["Wo"]
    sh, sw, dh, dw_, pt, pl = c["sh"], c["sw"], c["dh"], c["dw"], c["pt"], c["pl"]
    xf, dyf = x.reshape(x.shape[0], -1), dy.reshape(dy.shape[0], -1)

    def load(t, n, pq0, g, m0, n0, As, Bs):
        kk = t % BK
        pq = pq0 + kk
        live, (pp, q) = pq < P, divmod(pq, Wo)
        for e in range(c["EA"]):
            m = t // BK + e * rows
            ok = live and m0 + m < p.Mg
            As[kk, m] = dyf[n, (g * p.Mg + m0 + m) * P + pq] if ok else 0.0
        for e in range(c["EB"]):
            col = n0 + t // BK + e * rows
            ch, tap = divmod(col, p.R * p.S)
            h = pp * sh + tap // p.S * dh - pt
            w = q * sw + tap % p.S * dw_ - pl
            ok = live and col < c["CgRS"] and 0 <= h < p.H and 0 <= w < p.W
            Bs[kk, t // BK + e * rows] = xf[n, ((g * p.Cg + ch) * p.H + h) * p.W + w] if ok else 0.0

    total = _replay_wgemm_blocks(p, dy, plan, load)
    dw = total[: c["weights"]].reshape(p.M, p.Cg, p.R, p.S)
    return dw, (total[c["weights"] :] if p.bias else None)


def _replay_wgemm_nhwc(p, x, dy, plan):
    """The same for NHWC tensors: each thread copies a group of VA maps of dy and VB
    channels of one tap of x (columns ordered (r, s, c)) at its pixels of each chunk,
    and the second kernel turns (r, s, c) back into dw's [M][C/g][R][S]."""
    c = plan.context
    BM, BN, VA, VB, P, Wo = c["BM"], c["BN"], c["VA"], c["VB"], c["P"], c["Wo"]
    sh, sw, dh, dw_, pt, pl = c["sh"], c["sw"], c["dh"], c["dw"], c["pt"], c["pl"]
    xf = x.transpose(0, 2, 3, 1).reshape(x.shape[0], -1)  # as NHWC memory holds them
    dyf = dy.transpose(0, 2, 3, 1).reshape(dy.shape[0], -1)

    def load(t, n, pq0, g, m0, n0, As, Bs):
        av, ka = t % (BM // VA), t // (BM // VA)
        bv, kb = t % (BN // VB), t // (BN // VB)
        for e in range(c["EA"]):
            kk = ka + e * c["a_rows"]
            pq = pq0 + kk
            ok = pq < P and m0 + av * VA < p.Mg
            for i in range(VA):
                at = pq * p.M + g * p.Mg + m0 + av * VA + i
                As[kk, av * VA + i] = dyf[n, at] if ok else 0.0
        col = n0 + bv * VB
        tap, ch = divmod(col, p.Cg)
        for e in range(c["EB"]):
            kk = kb + e * c["b_rows"]
            pq = pq0 + kk
            h = pq // Wo * sh + tap // p.S * dh - pt
            w = pq % Wo * sw + tap % p.S * dw_ - pl
            ok = pq < P and col < c["CgRS"] and 0 <= h < p.H and 0 <= w < p.W
            for i in range(VB):
                at = (h * p.W + w) * p.C + g * p.Cg + ch + i
                Bs[kk, bv * VB + i] = xf[n, at] if ok else 0.0

    total = _replay_wgemm_blocks(p, dy, plan, load)
    dw = total[: c["weights"]].reshape(p.M, p.R, p.S, p.Cg).transpose(0, 3, 1, 2)
    return dw, (total[c["weights"] :] if p.bias else None)


def _replay_wgemm_blocks(p, dy, plan, load):
    """wgemm's blocks, slices and chunks, each chunk's shared tiles filled by ``load``
    (thread, image, first pixel, group, first map, first column, As, Bs) and multiplied;
    each slice's workspace row as the main kernel writes it, db's rows as its own kernel
    does, and the slices added in order (NaN where nothing was written)."""
    c = plan.context
    B = dy.shape[0]
    BM, BN, BK, cpi, splits, CgRS = c["BM"], c["BN"], c["BK"], c["cpi"], c["splits"], c["CgRS"]
    ws = np.full((splits, c["row"]), np.nan)
    for bx, by, split in np.ndindex(-(-CgRS // BN), c["map_blocks"] * p.groups, splits):
        g, m0, n0 = by // c["map_blocks"], by % c["map_blocks"] * BM, bx * BN
        acc = np.zeros((BM, BN))
        images = -(-(B - split) // splits) if B > split else 0
        for j in range(images * cpi):
            n = split + j // cpi * splits
            As, Bs = np.full((BK, BM), np.nan), np.full((BK, BN), np.nan)
            for t in range(c["threads"]):
                load(t, n, j % cpi * BK, g, m0, n0, As, Bs)
            acc += As.T @ Bs  # NaN here: an element of a chunk no thread loaded
        mm, cc = min(BM, p.Mg - m0), min(BN, CgRS - n0)
        for i in range(mm):
            start = (g * p.Mg + m0 + i) * CgRS + n0
            ws[split, start : start + cc] = acc[i, :cc]
    if p.bias:  # the db kernel: each slice's images, every pixel
        for m, split in np.ndindex(p.M, splits):
            ws[split, c["weights"] + m] = dy[split::splits, m].sum()
    return ws.sum(axis=0)


def test_wgemm_thread_tiles_cover_the_block_tile_once():
    """The 8x8 sums of the threads (rows ty*4.. and +BM/2, columns tx*4.. and +BN/2)
    tile the block's BM x BN exactly, for every block tile the planner accepts."""
    from specgen.strategies.wgemm import Wgemm

    p = PRESETS["ae-enc2"].with_op(Op.WGRAD)
    for bm, bn in [(32, 32), (64, 128), (128, 128), (256, 128), (128, 256)]:
        c = make_plan(p, Wgemm(blocktile=(bm, bn), chunk=8, splits=4)).context
        cover = np.zeros((bm, bn), int)
        for t in range(c["threads"]):
            tx, ty = t % c["TX"], t // c["TX"]
            ms = [ty * 4 + i % 4 + i // 4 * (bm // 2) for i in range(8)]
            ns = [tx * 4 + j % 4 + j // 4 * (bn // 2) for j in range(8)]
            cover[np.ix_(ms, ns)] += 1
        assert (cover == 1).all(), (bm, bn)


@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(p=problem_specs(largest=8))
def test_wgemm_replay_gives_the_weight_gradient(p):
    """wgemm's loaders, padding and tiles on drawn problems (stride, dilation, groups,
    every padding form, partial tiles and chunks) against the float64 reference."""
    from specgen.strategies.wgemm import Wgemm

    p = p.with_op(Op.WGRAD)
    nhwc = p.layout is TensorLayout.NHWC
    try:  # NHWC: a thread keeps one group of 64 maps or columns (32 threads cannot)
        plan = make_plan(p, Wgemm(blocktile=(64, 64) if nhwc else (32, 32), chunk=8, splits=3))
    except SpecError:
        assert nhwc and p.dtype is not DType.FP32  # 16-bit NHWC: the tensor cores' work
        assume(False)  # drawn again: every counted draw reaches the check
    x, _, dy = _operands(p, 2, np.random.default_rng())
    dw, db = (_replay_wgemm_nhwc if nhwc else _replay_wgemm)(p, x, dy, plan)
    np.testing.assert_allclose(dw, conv2d_wgrad(x, dy, p), rtol=1e-11, atol=1e-11)
    if p.bias:
        np.testing.assert_allclose(db, bias_grad(dy), rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize(
    "spec",
    [
        "C=8,M=12,H=7,W=9,K=3,pad=1,bias=1,layout=nhwc",  # 16-byte copies both sides
        "C=3,M=8,H=9,W=6,K=3x2,pad=2x0,stride=2,bias=1,layout=nhwc",  # 4-byte x
        "C=8,M=6,H=8,W=8,K=3,dil=2,pad=same,groups=2,layout=nhwc",  # 4-byte dy, groups
    ],
)
def test_wgemm_nhwc_replay_gives_the_weight_gradient(spec):
    """wgemm's NHWC loaders where 16-byte copies apply and where they do not, replayed
    at a tile with partial map and column tiles, against the float64 reference."""
    from specgen.strategies.wgemm import Wgemm

    p = parse_shape(spec).with_op(Op.WGRAD)
    plan = make_plan(p, Wgemm(blocktile=(64, 64), chunk=8, splits=3))
    assert (plan.context["VA"], plan.context["VB"]) == (
        4 if p.Mg % 4 == 0 else 1,
        4 if p.Cg % 4 == 0 else 1,
    )
    x, _, dy = _operands(p, 4, np.random.default_rng())
    dw, db = _replay_wgemm_nhwc(p, x, dy, plan)
    np.testing.assert_allclose(dw, conv2d_wgrad(x, dy, p), rtol=1e-11, atol=1e-11)
    if p.bias:
        np.testing.assert_allclose(db, bias_grad(dy), rtol=1e-11, atol=1e-11)
