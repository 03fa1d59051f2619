"""mmarows, one map's window rows on the tensor cores' n side: what the compiler makes of
it (CPU tier), its limits, a lane-by-lane NumPy model of its walk and quad pipeline, and
its numbers on the presets and drawn problems (GPU tier)."""

import re

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from problems import (
    DRAWN_COMPILES,
    GPU_DRAWS,
    assert_one_line_refusal,
    default_and_drawn,
    planned_space,
    verify_on_the_gpu,
)
from specgen.compile import compile_source
from specgen.errors import SpecError
from specgen.plan import make_plan
from specgen.reference import conv2d
from specgen.render import render
from specgen.shapes import PRESETS, Op, parse_shape
from specgen.strategies import Mmarows, default_set
from specgen.strategies.mmarows import pixel_words
from specgen.variants import Precision
from ptx import ptx_of

MX1_DGRAD = PRESETS["mx-layer1-bf16"].with_op(Op.DGRAD)
L1_DGRAD = PRESETS["layer1-bf16"].with_op(Op.DGRAD)


def own(p):
    return Precision(p.dtype.value)


@pytest.mark.parametrize("problem", [MX1_DGRAD, L1_DGRAD], ids=["mx-layer1", "layer1"])
def test_seed_dgrad_views_compile_without_spills(problem):
    """The one-channel layers' bf16 dgrad: one map, 12 or 4 channels; the walk's shared
    loads are 8 bytes, the lanes' sums cross by shfl.up, and the mma is bf16 m16n8k16."""
    (v,) = [x for x in default_set(problem) if x.key == "mmarows"]
    plan = make_plan(problem, v)
    binary = compile_source(render(plan), plan.name, plan.target("sm_90"))
    assert binary.spills == 0, (plan.name, binary.resources)
    ptx = ptx_of(plan)
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in ptx
    assert re.search(r"shfl\.sync\.up\.b32", ptx)
    assert re.search(r"ld\.shared\.v2\.u32", ptx)
    assert plan.view.M == 1 and plan.context["steps"] == plan.view.Ho + 7 - plan.view.pads[0]


def test_fit_takes_blocks_of_one_image_and_stages_of_at_most_24_mma():
    """As measured (H100, B=10000): mx-layer1's view (6 k steps a row) in stages of 4
    rows, layer1's (2 k steps) in stages of 8, both 16 columns of one image a warp."""
    mx = Mmarows.default(Mmarows.problem_for(MX1_DGRAD), Precision.BF16)
    l1 = Mmarows.default(Mmarows.problem_for(L1_DGRAD), Precision.BF16)
    assert (mx.images, mx.rows, l1.images, l1.rows) == (1, 4, 1, 8)
    assert make_plan(MX1_DGRAD, mx).context["warps"] == 5  # 72 columns in 5 groups of 16


@pytest.mark.parametrize(
    "spec,name,words",
    [
        ("C=12,M=2,H=20,W=20,K=7,dtype=bf16", "mmarows_i1_r4_bf16", "M=1 only"),
        ("C=12,M=1,H=20,W=20,K=9x3,dtype=bf16", "mmarows_i1_r4_bf16", "R at most 8"),
        ("C=12,M=1,H=20,W=20,K=5,pad=8x8x1x1,dtype=bf16", "mmarows_i1_r4_bf16", "at most 7"),
        ("C=6,M=1,H=20,W=20,K=5,dtype=bf16,layout=nhwc", "mmarows_i1_r4_bf16", "multiple of 4"),
        ("C=12,M=1,H=20,W=20,K=5,dtype=bf16", "mmarows_i1_r4_fp16", "--precision bf16"),
        ("C=12,M=1,H=20,W=20,K=5", "mmarows_i1_r4_bf16", "bf16 on bf16 tensors"),
        ("C=12,M=1,H=20,W=20,K=5,stride=2,dtype=bf16", "mmarows_i1_r4_bf16", "stride 2"),
        ("C=12,M=1,H=20,W=20,K=5,dil=2,dtype=bf16", "mmarows_i1_r4_bf16", "dilation 2"),
        ("C=72,M=1,H=20,W=20,K=7,dtype=bf16", "mmarows_i1_r4_bf16", "36 k steps"),
        ("C=12,M=1,H=20,W=20,K=5,dtype=bf16", "mmarows_i3_r4_bf16", "--images 1 or 2"),
        ("C=12,M=1,H=20,W=20,K=5,dtype=bf16", "mmarows_i1_r3_bf16", "1, 2, 4, 8 input rows"),
        ("C=12,M=1,H=20,W=600,K=5,dtype=bf16", "mmarows_i2_r4_bf16", "over 32"),
        ("C=64,M=1,H=20,W=512,K=4,dtype=bf16", "mmarows_i1_r8_bf16", "shared memory"),
    ],
)
def test_limits_are_one_line_refusals(spec, name, words):
    assert_one_line_refusal(spec, name, words)


def test_pixel_pitch_puts_a_warps_eleven_pixels_in_distinct_bank_pairs():
    """A warp's 8-byte loads touch pixels g + t (11 of them) at channel quad q: each
    pixel's two words must sit in banks no other pixel of the load uses."""
    for chans in range(1, 65):
        pw = pixel_words(chans)
        assert pw % 2 == 0 and pw >= 2 * -(-chans // 4)
        for q in range(-(-chans // 4)):
            banks = [(u * pw + 2 * q + half) % 32 for u in range(11) for half in (0, 1)]
            assert len(set(banks)) == 22, (chans, pw)


def test_tune_space_plans_or_refuses_in_one_line():
    for problem in (MX1_DGRAD, L1_DGRAD):
        assert len(planned_space(problem, Mmarows, Precision.BF16)) >= 5


@pytest.mark.parametrize(
    "problem",
    [
        MX1_DGRAD,
        L1_DGRAD,
        # a bare __launch_bounds__ let ptxas cap i2_r8 here at 128 registers and spill
        # (GPU tier draw, H100)
        parse_shape("C=8,M=1,H=18,W=33,K=1x5,pad=0x0x2x0,bias=1,act=relu,dtype=fp16,layout=nhwc"),
    ],
    ids=["mx-layer1", "layer1", "drawn-nhwc"],
)
def test_every_planned_variant_of_the_tune_space_compiles_without_spills(problem):
    for v in planned_space(problem, Mmarows, own(problem)):
        plan = make_plan(problem, v)
        binary = compile_source(render(plan), plan.name, plan.target("sm_90"))
        assert binary.spills == 0, (plan.name, binary.resources)


@st.composite
def mmarows_problems(draw):
    """Problems mmarows serves: one map (a forward pass with a bias and relu, or the dgrad
    view of a one-channel layer), windows up to 8 rows and any columns, every padding
    under the window, odd and even widths, both layouts and 16-bit dtypes."""
    op = draw(st.sampled_from(["fprop", "dgrad", "dgrad"]))
    dtype = draw(st.sampled_from(["bf16", "fp16"]))
    layout = draw(st.sampled_from(["nchw", "nchw", "nhwc"]))
    R, S = draw(st.integers(1, 8)), draw(st.integers(1, 9))
    chans = draw(st.integers(1, 16))
    if layout == "nhwc":
        chans = 4 * draw(st.integers(1, 4))
    C, M = (chans, 1) if op == "fprop" else (1, chans)
    H, W = draw(st.integers(R, 30)), draw(st.integers(S, 40))
    pads = [draw(st.integers(0, R - 1)), draw(st.integers(0, R - 1))]
    pads += [draw(st.integers(0, S - 1)), draw(st.integers(0, S - 1))]
    spec = (
        f"C={C},M={M},H={H},W={W},K={R}x{S},pad={'x'.join(map(str, pads))},"
        f"dtype={dtype},layout={layout},op={op}"
    )
    if op == "fprop" and draw(st.booleans()):
        spec += ",bias=1,act=relu"
    p = parse_shape(spec)
    try:
        make_plan(p, Mmarows.default(Mmarows.problem_for(p), own(p)))
    except SpecError:
        assume(False)  # none seen: every draw above is one it serves
    return p


@settings(max_examples=DRAWN_COMPILES, deadline=None, suppress_health_check=list(HealthCheck))
@given(p=mmarows_problems())
def test_drawn_defaults_compile_without_spills(p):
    plan = make_plan(p, Mmarows.default(Mmarows.problem_for(p), own(p)))
    binary = compile_source(render(plan), plan.name, plan.target("sm_90"))
    assert binary.spills == 0, (p.spec, plan.name, binary.resources)


def mmarows_model(x, w, plan):
    """The kernel's walk for one block, lane by lane, in float64: the stage rows as the
    fill lays them out, each warp's A and B fragments as its loads and the planner's k
    order build them, the fragment's sums split over the lanes (g, t) as mma leaves
    them, and the quad pipeline with its shfl.up.  x [images][C][H][W] of the forward
    view, w [C][R][S] (its one map); returns y [images][Ho][Wo]."""
    ctx = plan.context
    images, cols, warps, pw = ctx["images"], ctx["cols"], ctx["warps"], ctx["pw"]
    pl, shift, steps = ctx["pl"], ctx["shift"], ctx["steps"]
    sh, cq, H, W = ctx["s_steps"], ctx["c_quads"], ctx["H"], ctx["W"]
    Ho, Wo = ctx["Ho"], ctx["Wo"]
    C, R, S = w.shape
    span = ctx["row_words"] // pw
    y = np.full((images, Ho, Wo), np.nan)

    def k_of(k):  # k index -> (window column offset in the step, channel offset)
        return (k % 8) // 2, 2 * (k >= 8) + k % 2

    B = np.zeros((sh, cq, 16, 8))
    for h in range(sh):
        for q in range(cq):
            for k in range(16):
                a, dc = k_of(k)
                s, c = 4 * h + a, 4 * q + dc
                for r in range(8):
                    if r < R and s < S and c < C:
                        B[h, q, k, r] = w[c, r, s]
    for warp in range(warps):
        slots = [(i // cols, cols * warp + i % cols) for i in range(16)]
        pipe = {
            (g, t): dict(prev=[0.0, 0.0], h1=[0.0, 0.0], h2=[0.0, 0.0])
            for g in range(8)
            for t in range(4)
        }
        for iy in range(steps):
            Z = np.zeros((16, 8))
            if iy < H:
                buf = np.zeros((images, span, 4 * cq))
                buf[:, pl : pl + W, :C] = x[:, :, iy, :].transpose(0, 2, 1)
                for h in range(sh):
                    for q in range(cq):
                        A = np.zeros((16, 16))
                        for i, (img, col) in enumerate(slots):
                            for k in range(16):
                                a, dc = k_of(k)
                                A[i, k] = buf[img, col + 4 * h + a, 4 * q + dc]
                        Z += A @ B[h, q]
            sent = {lt: [pipe[lt]["h2"][0], pipe[lt]["h2"][1]] for lt in pipe}  # shfl sources
            for (g, t), st_ in pipe.items():
                for half, row in ((0, g), (1, g + 8)):
                    part = st_["prev"][half] + Z[row, 2 * t + 1]
                    st_["prev"][half] = Z[row, 2 * t]
                    got = part + (sent[(g, t - 1)][half] if t else 0.0)
                    st_["h2"][half] = st_["h1"][half]
                    st_["h1"][half] = got
                    oy = iy + shift
                    img, col = slots[row]
                    if t == 3 and 0 <= oy < Ho and col < Wo:
                        y[img, oy, col] = got
    return y


@pytest.mark.parametrize(
    "spec,images",
    [
        # mx-layer1's dgrad view, shrunk: 12 channels, 7x7, pad 6
        ("C=12,M=1,H=9,W=10,K=7,pad=6", 2),
        ("C=12,M=1,H=9,W=10,K=7,pad=6", 1),
        ("C=3,M=1,H=6,W=13,K=8x5,pad=2x0x4x1", 1),
        ("C=5,M=1,H=5,W=7,K=2x9,pad=1x1x0x8", 2),
    ],
)
def test_the_lane_model_is_the_convolution(spec, images):
    """The walk the kernel rests on (k order, fragment layout, the quad's two-step lag,
    the emitted row), with the plan's own numbers, against the reference (independent of
    it)."""
    p = parse_shape(spec + ",dtype=bf16")
    plan = make_plan(p, Mmarows(images=images, rows=4, precision=Precision.BF16))
    rng = np.random.default_rng()
    x = rng.standard_normal((images, p.C, p.H, p.W))
    w = rng.standard_normal((1, p.C, p.R, p.S))
    want = conv2d(x, w, p)[:, 0]
    got = mmarows_model(x, w[0], plan)
    np.testing.assert_allclose(got, want, rtol=1e-10, atol=1e-10)


# ---- GPU tier ----


@pytest.mark.gpu
@pytest.mark.parametrize("shard", range(2))  # two draws, side by side
@settings(max_examples=13, **GPU_DRAWS)
@given(p=mmarows_problems(), batch=st.integers(1, 5), pick=st.integers(0, 10**6))
def test_drawn_problems_on_the_gpu(shard, p, batch, pick):
    """The default and one variant of tune's space against the float64 reference: odd
    batches (a block's second image missing), widths that leave the last warp's columns
    idle, stages past the last row, the window's zeros on every side."""
    verify_on_the_gpu(p, default_and_drawn(p, Mmarows, own(p), pick), batch)


@pytest.mark.gpu
@pytest.mark.parametrize("problem", [MX1_DGRAD, L1_DGRAD], ids=["mx-layer1", "layer1"])
def test_seed_dgrad_views_at_a_large_batch_on_the_gpu(problem):
    verify_on_the_gpu(problem, [v for v in default_set(problem) if v.key == "mmarows"], 1001)
