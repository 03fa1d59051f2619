"""CPU tier: rendering, generated/ in sync, NVRTC for sm_90 with the planned resources,
the compile cache."""

import os
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from problems import problem_specs

from specgen.compile import cache_key, compile_source, options_for
from specgen.parallel import precompile
from specgen.plan import make_plan
from specgen.render import render
from specgen.shapes import PRESETS, Op
from specgen import tunedb
from specgen.strategies import default_set, parse_variant_name
from specgen.strategies.direct import Direct
from specgen.variants import Precision, split_problem_tags
from specgen.verify import check_resources

GENERATED = Path(__file__).resolve().parent.parent / "generated"
# Every op's default set of every preset: what generated/ holds (rendered and compared).
PROBLEMS = [s.with_op(op) for s in PRESETS.values() for op in Op]
ALL = [(s, v) for s in PROBLEMS for v in default_set(s)]


def code_path(plan) -> str:
    """A kernel's name less its sizes and its 16-bit I/O tag: the strategy, its choices
    (layout, weights, unroll, gather, feed ...), the math, the op and the tensors'
    layout.  Kernels of one code path differ in numbers the planner derived, not in the
    template's branches; fp32 math on 16-bit tensors differs from fp32 tensors only in
    the loads and stores of templates/common/dtype.j2, whose rounding test_pinned.py
    checks in every kernel (and 16-bit shipped winners and drawn problems compile here)."""
    return re.sub(r"_io(bf|fp)#", "", re.sub(r"[0-9]+", "#", plan.name))


def _compiled_sweep(items):
    """Of each code path, the kernel with the shortest source (NVRTC's time grows with
    it: layer2's unrolled 7x7 tiles take 5-10 s each), and every kernel shipped as a
    winner, which is what the operator runs.  ``verify --all-shapes --op all`` compiles
    and checks every member of every default set on the GPU machine;
    SPECGEN_FULL_SWEEP=1 does it here."""
    if os.environ.get("SPECGEN_FULL_SWEEP"):
        return list(items)
    shortest: dict[str, tuple[int, int]] = {}
    keep = set()
    for i, (s, v) in enumerate(items):
        plan = make_plan(s, v)
        size = len(render(plan))
        if code_path(plan) not in shortest or size < shortest[code_path(plan)][0]:
            shortest[code_path(plan)] = (size, i)
        if v.name in _shipped(s):
            keep.add(i)
    keep |= {i for _, i in shortest.values()}
    return [items[i] for i in sorted(keep)]


def _shipped(problem) -> set[str]:
    names = [split_problem_tags(n) for n in tunedb.shipped_names(problem.slug)]
    return {v for v, tags in names if tags.get("op", Op.FPROP) is problem.op}


SWEEP = _compiled_sweep(ALL)


@pytest.fixture(scope="module")
def compiled():
    """Without pytest-xdist: the sweep compiled once, on every core.  Under xdist each
    worker compiles its own tests' kernels into the shared cache."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return {}
    return precompile(SWEEP, "sm_90", jobs=os.cpu_count() or 1)


@pytest.mark.parametrize(
    "shape,variant", SWEEP, ids=[f"{s.name}-{v.kernel_name(s)}" for s, v in SWEEP]
)
def test_compiles_for_sm90_without_spills_and_as_planned(shape, variant, compiled):
    plan = make_plan(shape, variant)
    assert compiled.get(plan.name) is None, compiled[plan.name]
    binary = compile_source(render(plan), plan.name, plan.target("sm_90"))
    stats, problems = check_resources(plan, binary)
    assert not problems, problems
    assert stats["spills"] == 0


def test_the_sweep_covers_every_code_path_and_every_shipped_winner():
    """The compiled sweep is a cover, not a sample: each code path of generated/ and each
    shipped winner is in it."""
    swept = {make_plan(s, v).name for s, v in SWEEP}
    assert {code_path(make_plan(s, v)) for s, v in ALL} == {
        code_path(make_plan(s, v)) for s, v in SWEEP
    }
    for s in PROBLEMS:
        for name in _shipped(s):
            assert parse_variant_name(name).kernel_name(s) in swept, (s.name, name)


def test_layer2_tile16_file_is_what_the_brief_asks():
    """No loop over the 7x7 window, exactly 3136 constant floats, an exact shared array."""
    from specgen.cli import build_variant

    shape = PRESETS["layer2"]
    plan = make_plan(shape, build_variant(shape, tile=16))
    src = render(plan)
    assert "__constant__ float wc[3136];" in src
    assert f"__shared__ float xs[{plan.static_smem // 4}];" in src
    assert "for (int p" not in src and "for (int q" not in src
    body = src[src.index("float acc[") :]
    assert (
        body.count("fmaf(") == shape.K**2 * 4 * 8
    )  # window x (4 columns x 8 maps), channel loop kept
    binary = compile_source(src, plan.name, "sm_90")
    assert binary.resources[plan.name].spills == 0


def test_render_is_deterministic_and_strict():
    """Another process with another hash seed plans and renders the same bytes (set and
    dict orders never reach the source), and a missing value is an error."""
    import subprocess
    import sys

    shape = PRESETS["layer2-bf16"].with_op(Op.DGRAD)
    plan = make_plan(shape, default_set(shape)[-1])
    script = (
        "import sys; from specgen.shapes import PRESETS, Op; from specgen.plan import make_plan;"
        "from specgen.render import render; from specgen.strategies import default_set;"
        "s = PRESETS['layer2-bf16'].with_op(Op.DGRAD);"
        "sys.stdout.write(render(make_plan(s, default_set(s)[-1])))"
    )
    for seed in ("1", "2"):
        env = dict(os.environ, PYTHONHASHSEED=seed)
        out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True)
        assert out.returncode == 0, out.stderr.decode()
        assert out.stdout.decode() == render(plan)
    shape = PRESETS["layer1"]
    broken = make_plan(shape, default_set(shape)[0])
    del broken.context["tiles_x"]
    import jinja2

    with pytest.raises(jinja2.UndefinedError):
        render(broken)


def test_generated_is_in_sync():
    """generated/ holds exactly the default set of every preset, as render writes it today."""
    expected = {Path(s.slug) / f"{v.kernel_name(s)}.cu": (s, v) for s, v in ALL}
    found = {p.relative_to(GENERATED) for p in GENERATED.glob("*/*.cu")}
    assert found == set(expected), "generated/ is stale: run `make generated`"
    for rel, (s, v) in expected.items():
        assert (GENERATED / rel).read_text() == render(
            make_plan(s, v)
        ), f"{rel} is stale: run `make generated`"


def test_cache_key_covers_source_and_arch():
    assert cache_key("a", "sm_90") != cache_key("b", "sm_90")
    assert cache_key("a", "sm_90") != cache_key("a", "sm_80")
    assert not any(o.startswith("-I") for o in options_for("sm_90")), "no CUDA headers are used"


def _register_hungry(bounds: str) -> str:
    """A kernel that keeps 96 loaded floats live, under the given launch bounds."""
    return bounds + """
extern "C" __global__ void BOUNDS k(const float* __restrict__ x, float* __restrict__ y)
{
    float v[96];
#pragma unroll
    for (int i = 0; i < 96; ++i)
        v[i] = x[threadIdx.x + 1024 * i];
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < 96; ++i)
        s = fmaf(s, v[i], v[95 - i]);
#pragma unroll
    for (int i = 0; i < 96; ++i)
        y[threadIdx.x + 1024 * i] = v[i] * s;
}
"""


def test_spilling_launch_bounds_fall_back_to_the_alternative(tmp_path, monkeypatch):
    """(1024, 2) caps ptxas at 32 registers: 96 live floats spill.  A source that offers
    a second choice gets it, and the cache remembers which; one that does not keeps its
    spills for verify to report."""
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path))
    with_alt = _register_hungry(
        "#ifndef SPECGEN_ALT_BOUNDS\n#define BOUNDS __launch_bounds__(1024, 2)\n"
        "#else\n#define BOUNDS __launch_bounds__(128, 1)\n#endif"
    )
    b = compile_source(with_alt, "k")
    assert b.defines == ("SPECGEN_ALT_BOUNDS",) and b.spills == 0, b.resources
    assert compile_source(with_alt, "k").defines == b.defines  # from the cache
    fixed = compile_source(_register_hungry("#define BOUNDS __launch_bounds__(1024, 2)"), "k")
    assert fixed.defines == () and fixed.spills > 0


def test_a_register_cap_is_the_third_choice(tmp_path, monkeypatch):
    """Where both bounds spill, a source offering a register cap is compiled under it
    too, and the cap is kept where it spills least; where the second bound does not
    spill, the second is kept."""
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path))

    def offering(second):
        return _register_hungry(
            "#ifdef SPECGEN_REGISTER_CAP\n#define BOUNDS __maxnreg__(200)\n#else\n"
            "#ifndef SPECGEN_ALT_BOUNDS\n#define BOUNDS __launch_bounds__(1024, 2)\n"
            f"#else\n#define BOUNDS __launch_bounds__({second})\n#endif\n#endif"
        )

    b = compile_source(offering("1024, 1"), "k")
    assert b.defines == ("SPECGEN_REGISTER_CAP",) and b.spills == 0, b.resources
    b = compile_source(offering("128, 1"), "k")
    assert b.defines == ("SPECGEN_ALT_BOUNDS",) and b.spills == 0, b.resources


def test_every_compile_reports_resources_even_a_repeated_one(tmp_path, monkeypatch):
    """NVRTC's own cache (12.9+) answers a program it has seen with an empty log; a
    source differing only in comments compiles to the same PTX.  Each compile, the
    third included, must still carry ptxas's report."""
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path))
    body = 'extern "C" __global__ void k(float* __restrict__ y) { y[threadIdx.x] = 2.0f; }'
    for comment in ("// one\n", "// two\n", "// one\n"):
        b = compile_source(comment + body, "k", cache=False)
        assert "k" in b.resources, b.log


# CI runs a fixed draw (whether ptxas spills is the compiler's call, and a new spill
# should fail a change that can be looked into, not a submission at random);
# SPECGEN_DRAWN_EXAMPLES=N draws N fresh problems.
HUNT = int(os.environ.get("SPECGEN_DRAWN_EXAMPLES", "0"))


@settings(
    max_examples=HUNT or 6,
    derandomize=not HUNT,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
@given(p=problem_specs(largest=20))
def test_drawn_problems_compile_for_sm90_without_spills(p):
    """Every member of a drawn problem's default set compiles with the planned
    resources (for the plain stride-1 problems that the presets cover, direct only)."""
    variants = default_set(p)
    if not p.unusual():
        variants = [v for v in variants if type(v) is Direct]
    for v in variants:
        plan = make_plan(p, v)
        binary = compile_source(render(plan), plan.name, plan.target("sm_90"))
        stats, problems = check_resources(plan, binary)
        assert not problems, (p.spec, v.name, problems)


@pytest.mark.parametrize(
    "spec,name",
    [
        # a 1x5 register tile unrolled over 8 channels of a 5x5 window spilled (GPU tier draw)
        ("C=8,M=31,H=20,W=12,K=5,pad=1,bias=1", "stream_t4_m31_c8_r1x5_fp32"),
        # 30 k steps of a C=19 3x3 window as straight-line code spilled (GPU tier draws)
        ("C=19,M=28,H=10,W=27,K=3,pad=0,bias=1", "mmapersist_t8_r24x32_tf32"),
        ("C=19,M=8,H=17,W=16,K=3,pad=1,bias=1,act=relu", "mmapersist_t17_r8x64_tf32"),
        # x's address summed in 64 bits: ptxas kept the gather in 32 registers and spilled
        ("C=4,M=2,H=11,W=14,K=4,pad=1,stride=3,dil=2x1,dtype=bf16", "implicit_t64_r1x1_fp32"),
        # GPU-tier draws of 2026-11-23: implicit's gather loop unrolled spilled 8-16 bytes;
        # stream's fit gave one map a thread 5 channels a chunk and spilled 568 bytes
        ("C=1,M=10,H=10,W=39,K=9,pad=0,dtype=fp16", "implicit_t64_r1x1_fp32"),
        (
            "C=8,M=8,H=22,W=8,K=3x7,pad=3,stride=2,dil=3x1,groups=2,dtype=fp16,layout=nhwc",
            "implicit_t64_r1x1_fp32",
        ),
        ("C=5,M=29,H=26,W=12,K=5,pad=0", "default stream"),
        # mmapersist's fit gave 4 pixel tiles a warp for a 3-tile image: 488 bytes spilled
        ("C=3,M=9,H=20,W=7,K=7,pad=1,bias=1", "default mmapersist"),
        # and 4 tiles of a 50-pixel image, 21 tf32 steps unrolled: 640 bytes (GPU tier draw)
        ("C=14,M=14,H=12,W=7,K=3,pad=0,act=relu", "default mmapersist"),
        # and 3 tiles of a 55-pixel image over 27 tf32 steps, with a bias: 20 bytes (GPU
        # tier draw, 2026-11-24)
        ("C=17,M=1,H=7,W=13,K=3,pad=0,bias=1,act=relu", "default mmapersist"),
        # 16-bit mmapersist at two blocks an SM, 4 pixel tiles a warp: 8 bytes spilled
        # under either bound until its second became one block an SM (GPU tier draw)
        ("C=11,M=3,H=34,W=40,K=5,pad=1,bias=1,act=relu,dtype=fp16", "default mmapersist"),
        # persist's fit let a 16-bit problem's block reach 504 threads: 350 bytes spilled
        ("C=1,M=18,H=35,W=30,K=7,pad=3,dtype=fp16", "default persist"),
        # mmastrip's 16 maps x 4 rows over a dgrad view's 6 unrolled channels spilled 8
        # bytes at two blocks an SM (NVRTC 13): its second bound is one block an SM
        ("C=16,M=6,H=17,W=25,K=5,pad=1,dtype=bf16,op=dgrad", "mmastrip_t17_r16x4_yd_bf16"),
        # mmatoep's 2 maps x 3 column tiles over 9 unrolled channels spilled 104 bytes
        # (GPU tier draw, NVRTC 12 and 13): its second choice keeps the channel loop
        ("C=9,M=6,H=39,W=39,K=7,pad=3,act=relu,dtype=fp16", "mmatoep_t39_r2x3_m6_fp16"),
        # phased's m loop unrolled over 3 maps x 2 channels x 49 taps of 16-bit dy: 8 bytes
        ("C=2,M=3,H=38,W=40,K=7,pad=0,dtype=bf16,op=dgrad", "phased_t4_m2_wconst_fp32"),
        # direct's fit at x2 m5: 180 constant weights at a run-time index over 12 spread
        # columns under the channel loop, 72 bytes (GPU tier's draw, 2026-11-24)
        ("C=6,M=5,H=17,W=29,K=6,pad=0,stride=3x2,dil=2x3,dtype=bf16,layout=nhwc", "default direct"),
        # mma under a bare __launch_bounds__(128): ptxas aimed at 16 blocks an SM, 32
        # registers, and spilled 8 bytes (GPU tier draw, 2026-11-24); its second bound
        # is one block an SM
        ("C=29,M=16,H=16,W=7,K=1,pad=0,bias=1,act=relu", "mma_t64_tf32"),
        # direct's fit at x2 m2 with global weights: 162 weights and 90 pixel loads a
        # channel of a 9x9 window, 24 bytes at 255 registers (GPU tier draw, 2026-11-24)
        ("C=13,M=30,H=22,W=18,K=9,pad=3,bias=1,dtype=bf16", "default direct"),
        # 16-bit mmapersist at 224 threads: 36 bytes under its first bound, 8 at one
        # block an SM (255 registers); its third choice caps registers at 192 (GPU tier
        # draw, 2026-11-29)
        ("C=8,M=16,H=21,W=34,K=7,pad=0,bias=1,act=relu,dtype=fp16", "default mmapersist"),
        # direct's fit at x2 m3 took its spread-pixel rules for an unrolled channel loop,
        # which 392 loads kept: 16 bytes at 255 registers (GPU tier draw, 2026-11-29)
        (
            "C=16,M=12,H=19,W=25,K=7,pad=1,stride=1x2,dil=1x3,groups=4,bias=1,layout=nhwc",
            "default direct",
        ),
        # direct's fit at x4 m4: 144 constant weights over 12 spread columns for 9 under
        # the channel loop, 72 bytes (GPU tier draw, 2026-11-24, NVRTC 13 and 12.9)
        (
            "C=6,M=4,H=28,W=8,K=6,pad=0,stride=1x2,dil=2x1,bias=1,act=relu,dtype=bf16,"
            "layout=nhwc",
            "default direct",
        ),
        # stream's 1x1 layers of 24 and 32 channels unrolled whole: 696 and 1944 bytes
        # at 255 registers (googlenet's and mnasnet's fp32 dgrads, 2026-11-28)
        ("C=512,M=24,H=14,W=14,K=1,op=dgrad", "stream_t8_m128_c24_r8x7_fp32_dgrad"),
        ("C=32,M=128,H=14,W=14,K=1", "stream_t8_m128_c32_r8x7_fp32"),
        # wgmma's widest pixel tile for 8 pixels (regnet's squeeze layers at B=8), in
        # tf32: 16 bytes (2026-11-28); the fit now takes the narrowest that holds them
        ("C=12,M=104,H=1,W=1,K=1,bias=1,layout=nhwc", "default wgmma"),
        # stream's chunk of 336 channels for a block of 4 threads (efficientnet_b0's
        # squeeze layers): 588 weight copies a thread, 3896 bytes (2026-11-28)
        ("C=672,M=28,H=1,W=1,K=1,bias=1", "default stream"),
    ],
)
def test_variants_that_once_spilled_do_not(spec, name):
    from specgen.shapes import parse_shape
    from specgen.strategies import parse_variant_name

    p = parse_shape(spec)
    if name.startswith("default "):
        v = next(v for v in default_set(p) if v.key == name.split()[1])
    else:
        v = parse_variant_name(name, p)
    plan = make_plan(p, v)
    binary = compile_source(render(plan), plan.name, plan.target("sm_90"))
    stats, problems = check_resources(plan, binary)
    assert not problems and stats["spills"] == 0, problems


@pytest.mark.parametrize(
    "spec",
    [
        "C=1,M=4,H=86,W=86,K=7,dtype=bf16",
        "C=4,M=16,H=40,W=40,K=7,dtype=fp16",
        "C=1,M=12,H=72,W=72,K=7,dtype=bf16",
        "C=12,M=24,H=33,W=33,K=7,dtype=bf16",
        "C=1,M=4,H=86,W=86,K=7,dtype=fp16,op=dgrad",
        "C=12,M=24,H=33,W=33,K=7,dtype=bf16,op=dgrad",
        "C=4,M=16,H=40,W=40,K=7,dtype=bf16,op=wgrad",
        "C=12,M=24,H=33,W=33,K=7,dtype=fp16,op=wgrad",
    ],
)
def test_16bit_seven_by_seven_layers_compile_clean_on_their_tensor_core_kernels(spec):
    """The planner's tensor-core kernels for the seeds' 7x7 layers in 16 bits (mmahwc,
    mmatoep, mmafold, mmastrip, mmapersist; mmarows for one-map dgrad views; wstrip for
    wgrad), and dgrad views, compile for sm_90 with no spills."""
    from specgen.choose import planned
    from specgen.shapes import parse_shape

    p = parse_shape(spec)
    v = planned(p, allow_tf32=False).variant
    tensor_core = ("mmahwc", "mmatoep", "mmafold", "mmastrip", "mmapersist", "mmarows", "wstrip")
    assert v.key in tensor_core, v.name
    plan = make_plan(p, v)
    binary = compile_source(render(plan), plan.name, plan.target("sm_90"))
    stats, problems = check_resources(plan, binary)
    assert not problems and stats["spills"] == 0, problems


def test_direct_keeps_the_channel_loop_where_unrolled_loads_would_spill():
    """6 channels x 4 rows x 14 columns of global loads unrolled spilled under NVRTC 13
    (GPU tier draw, H200): the default keeps the channel loop there, and compiles clean."""
    from specgen.shapes import parse_shape

    p = parse_shape(
        "C=18,M=3,H=27,W=17,K=4,pad=1x3,stride=3x2,dil=3,groups=3,dtype=bf16,layout=nhwc"
    )
    v = Direct.default(p, Precision.FP32)
    assert not v.unroll, v.name
    plan = make_plan(p, v)
    binary = compile_source(render(plan), plan.name, plan.target("sm_90"))
    stats, problems = check_resources(plan, binary)
    assert not problems and stats["spills"] == 0, problems


@settings(
    max_examples=HUNT or 6,
    derandomize=not HUNT,
    deadline=None,
    suppress_health_check=list(HealthCheck),
)
@given(p=problem_specs(largest=20))
def test_drawn_backward_problems_compile_for_sm90_without_spills(p):
    """Each backward op's default set of a drawn problem (stride, dilation, groups,
    padding forms, dtypes, layouts) compiles with the planned resources."""
    from specgen.shapes import Op

    for op in (Op.DGRAD, Op.WGRAD, Op.BGRAD):
        q = p.with_op(op)
        variants = default_set(q)
        assert variants, (q.spec, "no strategy serves it")
        if op is Op.DGRAD and not p.unusual():
            variants = [v for v in variants if type(v).__name__ in ("Direct", "Phased")]
        for v in variants:
            plan = make_plan(q, v)
            binary = compile_source(render(plan), plan.name, plan.target("sm_90"))
            stats, problems = check_resources(plan, binary)
            assert not problems, (q.spec, v.name, problems)


@pytest.mark.parametrize(
    "source,target",
    [("bf16", "bf16"), ("fp16", "fp16"), ("fp32", "fp32"), ("bf16", "fp32"), ("fp16", "fp32")],
)
def test_the_operators_weight_gather_compiles_without_spills(source, target):
    """The PyTorch operator's own gather (channels_last weights into a plan's layout,
    widened to fp32 where the plan reads fp32): it compiles for sm_90 without spills;
    the GPU tier's bit-for-bit test of channels_last weights runs it."""
    from specgen.runtime import gather_source

    name, text = gather_source(source, target)
    binary = compile_source(text, name, "sm_90")
    assert binary.spills == 0 and set(binary.resources) == {name}


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("a", ["fp32", "16"])
@pytest.mark.parametrize("b", ["fp32", "16"])
def test_the_operators_autocast_weight_cast_compiles_without_spills(dtype, a, b):
    """The PyTorch operator's autocast cast (fp32 weights rounded to 16 bits into two
    packed layouts, each 16-bit or widened back to fp32) compiles for sm_90 without
    spills, and rounds with PTX's round-to-nearest-even conversion, as PyTorch does."""
    from specgen.runtime import cast_source

    a, b = (dtype if v == "16" else v for v in (a, b))
    name, text = cast_source(dtype, a, b)
    assert f"cvt.rn.{'bf16' if dtype == 'bf16' else 'f16'}.f32" in text
    binary = compile_source(text, name, "sm_90")
    assert binary.spills == 0 and set(binary.resources) == {name}


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_the_operators_sum_compiles_without_spills(dtype):
    """The PyTorch operator's sum of two gradients (a residual block's input's) compiles
    for sm_90 without spills; 16-bit sums round once from fp32 with PTX's
    round-to-nearest-even conversion, as PyTorch's add does, and fp32 sums add alone.
    tests/test_chain.py checks its sums bit for bit against autograd's."""
    from specgen.runtime import sum_source

    name, text = sum_source(dtype)
    rounds = f"cvt.rn.{'bf16' if dtype == 'bf16' else 'f16'}.f32"
    assert (rounds in text) == (dtype != "fp32") and "fma" not in text
    binary = compile_source(text, name, "sm_90")
    assert binary.spills == 0 and set(binary.resources) == {name}


# The autoencoder's layers as the PyTorch operator meets them under bf16 autocast
# (channels_last, bias), and one fp16 layer of groups: their wgrad plans on the kernels
# whose second pass is backward/tc_sums.j2.
FP32_GRADS = [
    "C=3,M=256,H=32,W=32,K=3,pad=1,bias=1,dtype=bf16,layout=nhwc,op=wgrad",
    "C=256,M=128,H=16,W=16,K=3,pad=1,bias=1,dtype=bf16,layout=nhwc,op=wgrad",
    "C=128,M=128,H=8,W=8,K=3,pad=1,bias=1,dtype=bf16,layout=nhwc,op=wgrad",
    "C=256,M=3,H=32,W=32,K=3,pad=1,bias=1,dtype=bf16,layout=nhwc,op=wgrad",
    "C=32,M=64,H=10,W=10,K=3,pad=1,groups=2,dtype=fp16,layout=nhwc,op=wgrad",
]


@pytest.mark.parametrize("spec", FP32_GRADS)
@pytest.mark.parametrize("grads32", ["mcrs", "mrsc"])
def test_wgrads_second_pass_writes_fp32_grads_in_the_weights_format(spec, grads32):
    """The PyTorch operator's wgrad under autocast: the second pass of every tensor-core
    wgrad of these layers' default sets, rendered with dw and db in fp32 and dw in
    either memory format of the weights, compiles for sm_90 without spills; its dw and
    db are float pointers, and the main kernel's source is the plan's own (wgwdsm,
    whose one kernel sums the slices, writes them itself)."""
    from specgen.shapes import parse_shape
    from specgen.strategies.wsplit import with_fp32_grads

    p = parse_shape(spec)
    served = 0
    for v in default_set(p):
        plan = make_plan(p, v)
        wide = with_fp32_grads(plan, grads32)
        if wide is None:
            assert plan.context.get("second_pass") is None, v.name
            continue
        served += 1
        src, text = render(plan), render(wide)
        # the pass's kernel: the second, or wgwdsm's one, which stores dw itself
        name = f"{plan.name}_reduce(" if len(plan.launches) > 1 else f"{plan.name}("
        kernel = text[text.index(name) :]
        signature = kernel[: kernel.index(")")]
        assert "float* __restrict__ dw" in signature
        assert ("float* __restrict__ db" in signature) == p.bias
        if len(plan.launches) > 1:
            assert src[: src.rindex("// ws[0..")] == text[: text.rindex("// ws[0..")]
        binary = compile_source(text, wide.name, wide.target("sm_90"))
        stats, problems = check_resources(wide, binary)
        assert not problems and stats["spills"] == 0, (v.name, problems)
    assert served, f"no tensor-core wgrad in {spec}'s default set"


@pytest.mark.parametrize(
    "spec",
    [
        "C=512,M=2048,H=7,W=7,K=1,pad=0,dtype=bf16,layout=nhwc,op=wgrad",
        "C=64,M=96,H=9,W=9,K=1,pad=0,bias=1,groups=2,dtype=fp16,layout=nhwc,op=wgrad",
    ],
)
def test_a_one_tap_wgrad_writes_both_fp32_orders_as_one(spec):
    """A 1x1 window's dw is [M][C/g] in either memory format of the weights, so the
    operator's fp32 grads in PyTorch's contiguous order render as the channels_last
    order's, whose channel pairs go in 8-byte stores (the operator reads a 1x1 layer's
    weights as contiguous); a 3x3 window's two orders stay two sources."""
    from specgen.shapes import parse_shape
    from specgen.strategies.wsplit import with_fp32_grads

    p = parse_shape(spec)
    wide = [make_plan(p, v) for v in default_set(p)]
    wide = [(with_fp32_grads(plan, "mcrs"), plan) for plan in wide]
    wide = [(w, plan) for w, plan in wide if w is not None]
    assert wide, f"no tensor-core wgrad in {spec}'s default set"
    for w, plan in wide:
        assert w.context["grads32"] == "mrsc"
        assert render(w) == render(with_fp32_grads(plan, "mrsc"))
    p3 = parse_shape(spec.replace("K=1,pad=0", "K=3,pad=1"))
    plan = next(
        plan
        for plan in (make_plan(p3, v) for v in default_set(p3))
        if with_fp32_grads(plan, "mcrs")
    )
    assert render(with_fp32_grads(plan, "mcrs")) != render(with_fp32_grads(plan, "mrsc"))


@pytest.mark.parametrize(
    "spec, splits, ways",
    [
        ("C=5,M=6,H=9,W=9,K=3,pad=1,bias=1,op=wgrad", 63, 1),
        ("C=5,M=6,H=9,W=9,K=3,pad=1,bias=1,op=wgrad", 64, 32),
        ("C=64,M=64,H=9,W=9,K=3,pad=1,op=wgrad", 1056, 1),
        ("C=16,M=24,H=9,W=9,K=3,pad=1,bias=1,dtype=bf16,layout=nhwc,op=wgrad", 132, 16),
        ("C=16,M=16,H=9,W=9,K=3,pad=1,dtype=bf16,layout=nhwc,op=wgrad", 66, 16),
    ],
)
def test_the_second_pass_shares_a_column_among_its_ways(spec, splits, ways):
    """A slice row of many slices and few sums is added by several warps a column, as
    many as keep the pass within ``SUM_THREADS`` threads: the launch's block is 32
    columns of ``slice_ways`` warps (or 256 columns of one thread), its grid covers the
    row, the kernel's launch bounds and shared sums match that block, each way's slices
    are counted out, and it compiles for sm_90 without spills."""
    from dataclasses import replace

    from specgen.shapes import parse_shape
    from specgen.strategies.tcwgrad import Tcwgrad
    from specgen.strategies.wsplit import SUM_THREADS, Wsplit, slice_ways

    p = parse_shape(spec)
    if p.layout.value == "nchw":
        v = replace(Wsplit.default(p, Precision.FP32), splits=splits)
    else:
        v = replace(Tcwgrad.default(p, Precision.BF16), splits=splits)
    plan = make_plan(p, v)
    row = p.weight_count + (p.M if p.bias else 0)
    assert slice_ways(splits, row) == ways
    assert ways == 1 or row * ways <= SUM_THREADS < (row * 2 * ways if ways < 32 else 1 << 62)
    (second,) = [launch for launch in plan.launches if launch.kernel.endswith("_reduce")]
    columns = 256 if ways == 1 else 32
    assert second.block == (columns * ways, 1, 1)
    assert second.grid[0] == -(-row // columns)
    src = render(plan)
    kernel = src[src.index(f"__launch_bounds__({columns * ways})\n{plan.name}_reduce(") :]
    assert (f"part[{ways}][32]" in kernel) == (ways > 1)
    if ways > 1:
        assert f"i < {-(-splits // ways)}; ++i" in kernel
    binary = compile_source(src, plan.name, plan.target("sm_90"))
    assert binary.spills == 0, binary.resources
