"""drow (fp32 dgrad, a lane a dx row): the rotation of the window's rows over the lanes
and the planned taps of each part of a row, replayed in NumPy against the float64
adjoint; the planner's limits and refusals.  The kernels themselves run in the GPU tier
(every preset's default set holds drow's default and its shipped winners)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from problems import problem_specs

from specgen.cli import main
from specgen.errors import SpecError
from specgen.plan import make_plan
from specgen.reference import conv2d_dgrad
from specgen.shapes import PRESETS, DType, Op, TensorLayout, parse_shape
from specgen.strategies import default_set, parse_variant_name
from specgen.strategies.drow import Drow


def _replay_drow(p, dy, w, plan):
    """dx the way the drow kernel computes it: lane l of every column keeps the row u
    with (u + pt) % R == l; at dy row i it adds, for every map, the part's planned taps
    through window row r = (l - i) mod R, and stores its row where r is 0 or dy's rows
    are done (rows past dx dropped), then starts over."""
    c = plan.context
    B = dy.shape[0]
    dx = np.full((B, p.C, p.H, p.W), np.nan)
    for part in c["parts"]:
        acc = np.zeros((B, p.C, p.R, part["n"]))  # [image][channel][lane][column]
        for i in range(p.Ho):
            for lane in range(p.R):
                r = (lane - i) % p.R
                for ch in part["chunks"]:
                    for jj, taps in ch["cols"]:
                        j = 4 * ch["q"] + jj
                        for s, x in taps:
                            acc[:, :, lane, x] += dy[:, :, i, j] @ w[:, :, r, s]
            for lane in range(p.R):
                r = (lane - i) % p.R
                if r == 0 or i == p.Ho - 1:
                    y = i + r - c["pt"]
                    if 0 <= y < p.H:
                        assert np.isnan(dx[:, :, y, part["x0"] : part["x1"]]).all(), "stored twice"
                        dx[:, :, y, part["x0"] : part["x1"]] = acc[:, :, lane]
                    elif not c["rows_checked"]:
                        raise AssertionError(f"row {y} past dx, and the store is not checked")
                    acc[:, :, lane] = 0
    return dx


def _drow_problem(p):
    return replace(
        p.with_op(Op.DGRAD),
        layout=TensorLayout.NCHW,
        dtype=DType.FP32,
        stride=(1, 1),
        dil=(1, 1),
        groups=1,
    )


@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
@given(p=problem_specs(largest=9))
def test_drow_replay_gives_the_input_gradient(p):
    """Padding of every form (wide, unequal), rectangular windows, rows cut in parts:
    the rotation and the planned taps give every dx pixel once, with its value."""
    p = _drow_problem(p)
    rng = np.random.default_rng()
    dy = rng.standard_normal((2, p.M, p.Ho, p.Wo))
    w = rng.standard_normal((p.M, p.C, p.R, p.S))
    for parts in (1, 2):
        try:
            plan = make_plan(p, replace(Drow.default(p, Drow().precision), parts=parts))
        except SpecError:
            continue  # a row too narrow to cut
        dx = _replay_drow(p, dy, w, plan)
        assert not np.isnan(dx).any(), "a dx pixel nobody stores"
        np.testing.assert_allclose(dx, conv2d_dgrad(dy, w, p), rtol=1e-11, atol=1e-11)


def test_drow_multiplies_only_what_reaches_dx():
    """No tap is planned past a row's ends: on the 7x7 layers a column's lanes make
    exactly Ho x Wo x R x S multiplies a (map, channel), where the forward view makes
    H x W x R x S, the rest on the zeros it pads dy with."""
    for name in ("layer1", "layer2", "mx-layer1", "mx-layer2"):
        p = PRESETS[name].with_op(Op.DGRAD)
        for parts in (1, 2):
            c = make_plan(p, replace(Drow.default(p, Drow().precision), parts=parts)).context
            taps = sum(
                len(t) for part in c["parts"] for ch in part["chunks"] for _, t in ch["cols"]
            )
            # a lane's taps a (map, dy row), over the Ho dy rows and R lanes of a column
            assert p.Ho * p.R * taps == p.Ho * p.Wo * p.R * p.S, (name, parts)


def test_drow_is_in_the_7x7_default_sets_and_ships_their_winners():
    for name in ("layer1", "layer2", "mx-layer1", "mx-layer2"):
        keys = [v.key for v in default_set(PRESETS[name].with_op(Op.DGRAD))]
        assert keys.count("drow") >= 1, name


def test_drow_names_round_trip():
    v = Drow(images=9, maps=2, stages=3, parts=1, blocks=1, gather=True)
    assert v.name == "drow_n9_m2_q3_x1_b1_gc_fp32"
    assert parse_variant_name(v.name) == v
    assert parse_variant_name("drow_n8_m8_q3_x1_b2_gl_fp32").gather is False


@pytest.mark.parametrize(
    "spec, args, needle",
    [
        ("layer2-bf16", [], "drow cannot serve bf16 tensors"),
        ("C=4,M=16,H=40,W=40,K=7,layout=nhwc", [], "drow cannot serve nhwc"),
        ("layer2", ["--maps", "3"], "drow m3 must divide the 16 maps"),
        ("layer2", ["--images", "40"], "over 1024 threads; choose --images 36"),
        (
            "C=1,M=200,H=346,W=346,K=7",
            ["--images", "48", "--parts", "3"],
            "in each of 3 parts, 1056 threads, over 1024 threads; choose --images 45",
        ),
        (
            "C=1,M=210,H=346,W=346,K=7",
            ["--images", "45", "--parts", "3"],
            "over the 2^32 its 32-bit offsets reach; choose --images 44",
        ),
        ("layer2", ["--stages", "1"], "the ring needs at least 2 stages"),
        ("layer2", ["--parts", "30"], "choose --parts 1 or 2"),
        ("C=1,M=2,H=300,W=300,K=3", ["--parts", "1"], "over 128; choose --parts 3"),
        ("ae-enc2", [], "drow keeps all 256 x 128 x 3 x 3 weights in shared memory"),
        ("C=4,M=16,H=40,W=40,K=7,stride=2", [], "drow cannot serve stride 2"),
        ("layer2", ["--images", "36", "--maps", "16", "--stages", "4"], "over the sm_90 limit"),
    ],
)
def test_drow_refuses_in_one_line(spec, args, needle, tmp_path):
    r = CliRunner().invoke(
        main,
        ["emit", "--shape", spec, "--op", "dgrad", "--strategy", "drow", "--out", str(tmp_path)]
        + args,
    )
    assert r.exit_code == 2, r.output
    assert needle in r.output and r.output.count("\n") == 1, r.output


def test_drow_plans_one_row_a_lane_within_the_register_file():
    """The fit keeps a lane's row in one part up to 128 columns and cuts wider ones."""
    p = parse_shape("C=1,M=2,H=300,W=300,K=3").with_op(Op.DGRAD)
    v = Drow.default(p, Drow().precision)
    assert v.parts == 3
    assert make_plan(p, v).context["width"] <= 128


@pytest.mark.parametrize(
    "spec,at_the_limit",
    [
        ("C=3,M=16,H=1024,W=1024,K=3,pad=1,op=dgrad", True),  # 2400 B spilled at 7 images
        ("C=16,M=16,H=64,W=256,K=7,pad=3,op=dgrad", True),  # 960 B at 2 images
        ("C=3,M=16,H=64,W=256,K=3,pad=1,op=dgrad", False),  # the warps' fill decides
    ],
)
def test_wide_rows_take_the_images_whose_lanes_keep_their_row_in_registers(spec, at_the_limit):
    """A row cut in parts keeps up to 128 columns a lane: the fit takes no more images
    than the register file leaves that many registers a lane for, and the kernel compiles
    without spills; one image more is refused in one line."""
    from specgen.compile import compile_source
    from specgen.render import render
    from specgen.verify import check_resources

    p = parse_shape(spec)
    v = Drow.default(p, Drow().precision)
    plan = make_plan(p, v)
    stats, problems = check_resources(plan, compile_source(render(plan), plan.name, "sm_90"))
    assert not problems and stats["spills"] == 0, (v.name, problems)
    if at_the_limit:
        with pytest.raises(SpecError, match="registers"):
            make_plan(p, replace(v, images=v.images + 1))
