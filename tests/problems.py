"""Hypothesis strategies for whole problems: what the CPU tier plans and compiles and
the GPU tier verifies numerically."""

import os

from hypothesis import HealthCheck, Phase, assume
from hypothesis import strategies as st

from specgen.errors import SpecError
from specgen.shapes import parse_shape
from specgen.strategies import Wgmma

# The settings of the GPU tier's drawn tests: no deadline (a compile takes seconds) and no
# shrinking (on the GPU machine it can outlast the tier; the failing spec is in the
# assertion message anyway).
# The drawn-problem compile sweeps of each strategy: a dozen problems each in the CPU
# tier (SPECGEN_DRAWN_EXAMPLES=N draws N instead, as test_cpu_build's sweeps do).
DRAWN_COMPILES = int(os.environ.get("SPECGEN_DRAWN_EXAMPLES", "0")) or 12

GPU_DRAWS = dict(
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
)


def parsed_or_rejected(spec: str):
    """The problem of a drawn spec, or the draw rejected where the grammar refuses it (a
    window larger than the padded image: PyTorch refuses it too)."""
    try:
        return parse_shape(spec)
    except SpecError:
        assume(False)


@st.composite
def tiled_wgrads(draw, channel_blocks: int, tail=st.just(""), unit: int = 64):
    """wgrad problems of 64-wide tiles (the warpgroup wgrads'): maps and channels a group
    multiples of ``unit`` (up to 3 x 64 maps and ``channel_blocks`` x 64 channels),
    windows up to 3x3 over maps of up to 13x13, stride, dilation, every padding, a bias
    (db) or none; ``tail``, drawn after the sizes, adds the dtype and layout."""
    groups = draw(st.sampled_from([1, 1, 2]))
    cg = unit * draw(st.integers(1, channel_blocks * 64 // unit))
    mg = unit * draw(st.integers(1, 3 * 64 // unit))
    R, S = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    H, W = draw(st.integers(R, 13)), draw(st.integers(S, 13))
    stride = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    dil = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    pads = "x".join(str(draw(st.integers(0, 2))) for _ in range(4))
    spec = (
        f"C={groups * cg},M={groups * mg},H={H},W={W},K={R}x{S},pad={pads},"
        f"stride={stride[0]}x{stride[1]},dil={dil[0]}x{dil[1]},groups={groups}"
        f"{draw(tail)},op=wgrad"
    )
    if draw(st.booleans()):
        spec += ",bias=1"
    return parsed_or_rejected(spec)


@st.composite
def problem_specs(draw, largest: int = 24):
    """An inline spec drawn over every key: stride 1-3, dilation 1-3, groups from dense
    to depthwise, windows 1x1 to 7x7 and rectangular, every padding form, bias and
    relu, the three dtypes and both layouts.  Only what PyTorch accepts is drawn."""
    groups = draw(st.sampled_from([1, 1, 2, 3, 4, "depthwise"]))
    per_group_c = draw(st.integers(1, 6))
    per_group_m = draw(st.integers(1, 6))
    if groups == "depthwise":
        groups = draw(st.integers(1, 12))
        per_group_c = 1
    C, M = groups * per_group_c, groups * per_group_m
    R, S = draw(st.integers(1, 7)), draw(st.integers(1, 7))
    if draw(st.booleans()):
        S = R
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    dil = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    H, W = draw(st.integers(1, largest)), draw(st.integers(1, largest))
    form = draw(st.sampled_from(["P", "PxQ", "TxBxLxR", "same", "valid"]))
    if form == "same" and stride != (1, 1):
        form = "valid"
    if form == "P":
        pad = str(draw(st.integers(0, 3)))
    elif form == "PxQ":
        pad = f"{draw(st.integers(0, 3))}x{draw(st.integers(0, 3))}"
    elif form == "TxBxLxR":
        pad = "x".join(str(draw(st.integers(0, 3))) for _ in range(4))
    else:
        pad = form
    window = str(R) if R == S else f"{R}x{S}"
    spec = (
        f"C={C},M={M},H={H},W={W},K={window},pad={pad},"
        f"stride={stride[0]}x{stride[1]},dil={dil[0]}x{dil[1]},groups={groups}"
    )
    if draw(st.booleans()):
        spec += ",bias=1"
    if draw(st.booleans()):
        spec += ",act=relu"
    spec += f",dtype={draw(st.sampled_from(['fp32', 'fp16', 'bf16']))}"
    spec += f",layout={draw(st.sampled_from(['nchw', 'nhwc']))}"
    try:
        return parse_shape(spec)
    except SpecError:
        assume(False)  # a window larger than the padded image: PyTorch refuses it too


def planned_space(p, cls, precision) -> list:
    """The members of the strategy's tune space (over ``p``'s view) that plan for ``p``;
    each one refused is refused in one line."""
    from specgen.plan import make_plan

    out = []
    for v in cls.space(cls.problem_for(p), precision):
        try:
            make_plan(p, v)
            out.append(v)
        except SpecError as e:
            assert "\n" not in str(e), (p.spec, v.name)
    return out


def that_plan(p, variants) -> list:
    """The variants whose plans for ``p`` are made (the others refused)."""
    from specgen.plan import make_plan

    out = []
    for v in variants:
        try:
            make_plan(p, v)
            out.append(v)
        except SpecError:
            pass
    return out


def default_and_drawn(p, cls, precision, pick: int) -> list:
    """The strategy's default for ``p`` and the ``pick``-th member (modulo) of its tune
    space that plans: what the tensor-core strategies' GPU tests verify on each drawn
    problem."""
    variants = [cls.default(cls.problem_for(p), precision)]
    space = planned_space(p, cls, precision)
    if space:
        variants.append(space[pick % len(space)])
    return variants


def verify_on_the_gpu(p, variants, batch: int) -> None:
    """Compile the variants in parallel, then check each against the float64 reference
    with fresh random inputs."""
    import os

    import numpy as np

    from specgen.parallel import precompile
    from specgen.runtime import device_arch
    from specgen.verify import verify_variant

    arch = device_arch()
    precompile([(p, v) for v in variants], arch, jobs=os.cpu_count() or 1)
    rng = np.random.default_rng()
    for v in variants:
        row = verify_variant(p, v, arch=arch, batch=batch, numbers=True, rng=rng)
        assert row.status == "PASS", (p.spec, v.name, row.problems)


def assert_one_line_refusal(spec: str, name: str, words: str) -> None:
    """Planning the named variant for the spec is refused in one line that says ``words``."""
    import pytest

    from specgen.plan import make_plan
    from specgen.strategies import parse_variant_name

    with pytest.raises(SpecError) as e:
        make_plan(parse_shape(spec), parse_variant_name(name))
    assert words in str(e.value) and "\n" not in str(e.value)


def assert_compiles_without_spills(p, variant_of) -> None:
    """The variant that ``variant_of()`` makes for the drawn problem ``p`` compiles for
    sm_90 without spilling; a draw its planner refuses is rejected."""
    from specgen.compile import compile_source
    from specgen.plan import make_plan
    from specgen.render import render

    try:
        plan = make_plan(p, variant_of())
    except SpecError:
        assume(False)
    binary = compile_source(render(plan), plan.name, plan.target("sm_90"))
    assert binary.spills == 0, (p.spec, plan.name, binary.resources)


@st.composite
def wgmma_problems(draw, ops=("fprop", "fprop", "dgrad"), least_stride=1):
    """Problems wgmma serves: channels and maps multiples of 8 per group (4 in fp32,
    multiplied as tf32), stride, dilation, every padding, bias and relu, the three
    dtypes; forward and dgrad (strided: a GEMM a stride phase)."""
    groups = draw(st.sampled_from([1, 1, 2, 3]))
    dtype = draw(st.sampled_from(["bf16", "fp16", "fp32"]))
    vec = 4 if dtype == "fp32" else 8
    cg = vec * draw(st.integers(1, 160 // vec))
    mg = vec * draw(st.integers(1, 192 // vec))
    op = draw(st.sampled_from(ops))
    R, S = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    H, W = draw(st.integers(R, 21)), draw(st.integers(S, 21))
    stride = (draw(st.integers(least_stride, 3)), draw(st.integers(1, 3)))
    dil = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    pads = "x".join(str(draw(st.integers(0, 2))) for _ in range(4))
    spec = (
        f"C={groups * cg},M={groups * mg},H={H},W={W},K={R}x{S},pad={pads},"
        f"stride={stride[0]}x{stride[1]},dil={dil[0]}x{dil[1]},groups={groups},"
        f"dtype={dtype},layout=nhwc,op={op}"
    )
    if op == "fprop" and draw(st.booleans()):
        spec += ",bias=1"
    if op == "fprop" and draw(st.booleans()):
        spec += ",act=relu"
    try:
        p = parse_shape(spec)
        Wgmma.problem_for(p)  # dgrad: padding past the window's reach has none
        return p
    except SpecError:
        assume(False)


@st.composite
def tma_problems(draw, heights=(1, 2, 4, 8, 16), widths=(2, 4, 8, 16, 32)):
    """Problems whose output rows the tma boxes take whole: stride 1, the output
    Ho x Wo a grid of ``heights`` by ``widths`` (powers of two by default, whose rows
    the power-of-two pixel tiles hold), any window, dilation and padding that give it;
    groups, channels past the chunk, maps past the tile, bias and relu, the three
    dtypes; forward and dgrad (whose forward view has the same grid)."""
    groups = draw(st.sampled_from([1, 1, 2]))
    dtype = draw(st.sampled_from(["bf16", "fp16", "fp32"]))
    vec = 4 if dtype == "fp32" else 8
    cg = vec * draw(st.integers(1, 160 // vec))
    mg = vec * draw(st.integers(1, 160 // vec))
    R, S = draw(st.sampled_from([1, 3, 5])), draw(st.sampled_from([1, 3]))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    Ho, Wo = draw(st.sampled_from(heights)), draw(st.sampled_from(widths))
    pads = [draw(st.integers(0, 2)) for _ in range(4)]
    H, W = Ho - pads[0] - pads[1] + dh * (R - 1), Wo - pads[2] - pads[3] + dw * (S - 1)
    assume(H >= 1 and W >= 1)
    spec = (
        f"C={groups * cg},M={groups * mg},H={H},W={W},K={R}x{S},pad={'x'.join(map(str, pads))},"
        f"dil={dh}x{dw},groups={groups},dtype={dtype},layout=nhwc"
    )
    op = draw(st.sampled_from(["fprop", "fprop", "dgrad"]))
    if op == "fprop" and draw(st.booleans()):
        spec += ",bias=1,act=relu"
    try:
        p = parse_shape(spec + f",op={op}")
        Wgmma.problem_for(p)  # dgrad: padding past the window's reach has none
        return p
    except SpecError:
        assume(False)


@st.composite
def i2c_problems(draw):
    """Problems for x's copy in im2col mode: maps of any size (odd sides, a tile's
    pixels ending inside rows and images), stride 1 to 3, dilation, every padding
    form; groups whose channels are whole chunks, channels past the chunk, maps past
    the tile, bias and relu, the three dtypes; forward and stride-1 dgrad."""
    dtype = draw(st.sampled_from(["bf16", "fp16", "fp32"]))
    vec, chunk = (4, 32) if dtype == "fp32" else (8, 64)
    groups = draw(st.sampled_from([1, 1, 2]))
    cg = chunk * draw(st.integers(1, 2)) if groups > 1 else vec * draw(st.integers(1, 160 // vec))
    mg = vec * draw(st.integers(1, 160 // vec))
    R, S = draw(st.sampled_from([1, 3, 5])), draw(st.sampled_from([1, 3, 7]))
    sh, sw = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    dh, dw = draw(st.integers(1, 2)), draw(st.integers(1, 2))
    H, W = draw(st.integers(3, 30)), draw(st.integers(3, 30))
    pads = [draw(st.integers(0, 3)) for _ in range(4)]
    spec = (
        f"C={groups * cg},M={groups * mg},H={H},W={W},K={R}x{S},pad={'x'.join(map(str, pads))},"
        f"stride={sh}x{sw},dil={dh}x{dw},groups={groups},dtype={dtype},layout=nhwc"
    )
    op = "dgrad" if (sh, sw) == (1, 1) and draw(st.booleans()) else "fprop"
    if op == "fprop" and draw(st.booleans()):
        spec += ",bias=1,act=relu"
    try:
        p = parse_shape(spec + f",op={op}")
        Wgmma.problem_for(p)
        return p
    except SpecError:
        assume(False)


def row_tma_problems():
    """``tma_problems`` on grids whose rows no power-of-two tile holds whole: 7 to 28
    rows of 12 to 56 pixels (``wgmma.row_tiles``: 112 pixels on 28x28 maps, 112 and 224
    on 56x56 ones, the networks' sizes)."""
    return tma_problems(heights=(4, 7, 8, 14, 28), widths=(12, 14, 24, 28, 40, 56))


@st.composite
def flat_tma_problems(draw):
    """1x1 layers at stride 1 without padding, whose tma box is the tile's run of the
    batch's pixels (``tcgemm.flat_pixels``): maps of any size (7x7, 28x28, odd sides),
    so that a tile ends inside an output row and past the batch; groups, channels past
    the chunk, maps past the tile, bias and relu, the three dtypes; forward and dgrad."""
    groups = draw(st.sampled_from([1, 1, 2]))
    dtype = draw(st.sampled_from(["bf16", "fp16", "fp32"]))
    vec = 4 if dtype == "fp32" else 8
    cg = vec * draw(st.integers(1, 160 // vec))
    mg = vec * draw(st.integers(1, 160 // vec))
    H, W = draw(st.sampled_from([1, 3, 7, 14, 28])), draw(st.sampled_from([1, 5, 7, 14, 28]))
    spec = (
        f"C={groups * cg},M={groups * mg},H={H},W={W},K=1,groups={groups},dtype={dtype},layout=nhwc"
    )
    op = draw(st.sampled_from(["fprop", "fprop", "dgrad"]))
    if op == "fprop" and draw(st.booleans()):
        spec += ",bias=1,act=relu"
    return parse_shape(spec + f",op={op}")


@st.composite
def depthwise_problems(draw, largest: int = 15, layout: str = "nhwc"):
    """Depthwise layers in channels-last (or ``layout``): stride, dilation, every padding
    form, rectangular windows, bias and ReLU, the three dtypes, forward and dgrad (the
    forward view at stride 1, the gather past it), channel counts that take 16-, 8-
    and 4-byte words."""
    C = draw(st.sampled_from([2, 4, 6, 8, 12, 16, 24, 40]))
    return _drawn_layer(draw, C, C, C, largest, taps=7, layout=layout)


@st.composite
def narrow_group_problems(draw, largest: int = 13):
    """Grouped layers of a few channels a group in channels-last (ResNeXt's): 1 to 8
    channels and 1 to 16 maps a group, stride, dilation, every padding form, rectangular
    windows, bias and ReLU, the three dtypes, forward and dgrad (the forward view at
    stride 1, the gather past it)."""
    cg = draw(st.sampled_from([1, 2, 4, 8, 12]))
    mg = draw(st.sampled_from([1, 2, 4, 8, 12, 16]))
    groups = draw(st.sampled_from([2, 3, 4, 8]))
    return _drawn_layer(draw, groups * cg, groups * mg, groups, largest, taps=5)


def _drawn_layer(draw, C, M, groups, largest, taps, layout: str = "nhwc"):
    """A drawn channels-last (or ``layout``) layer of these channels and groups: a window
    of 1 to ``taps`` a side, dilation, an image of up to ``largest`` a side, stride,
    every padding form within the window's reach, the three dtypes, fprop or dgrad, bias
    and ReLU on half the forward passes."""
    R, S = draw(st.integers(1, taps)), draw(st.integers(1, taps))
    dil = (draw(st.integers(1, 2)), draw(st.integers(1, 2)))
    H = draw(st.integers(dil[0] * (R - 1) + 1, largest))
    W = draw(st.integers(dil[1] * (S - 1) + 1, largest))
    op = draw(st.sampled_from(["fprop", "dgrad"]))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    reach = (dil[0] * (R - 1), dil[1] * (S - 1))
    pads = [draw(st.integers(0, reach[i // 2])) for i in range(4)]
    spec = (
        f"C={C},M={M},H={H},W={W},K={R}x{S},pad={'x'.join(map(str, pads))},"
        f"stride={stride[0]}x{stride[1]},dil={dil[0]}x{dil[1]},groups={groups},"
        f"dtype={draw(st.sampled_from(['fp32', 'fp16', 'bf16']))},layout={layout},op={op}"
    )
    if op == "fprop" and draw(st.booleans()):
        spec += ",bias=1,act=relu"
    return parsed_or_rejected(spec)


def assert_space_compiles_without_spills(p, cls) -> None:
    """Every member of the strategy's tune space that plans for ``p`` (in the tensors'
    own 16-bit math) compiles for sm_90 without spilling: the planner's register estimate
    refuses what would spill, so tune never times a spilling kernel."""
    from specgen.compile import compile_source
    from specgen.plan import make_plan
    from specgen.render import render
    from specgen.variants import Precision

    for v in planned_space(p, cls, Precision(p.dtype.value)):
        plan = make_plan(p, v)
        binary = compile_source(render(plan), plan.name, plan.target("sm_90"))
        assert binary.spills == 0, (plan.name, binary.resources)


# The stems of few input channels (mmafew's and wfew's): resnet's 7x7/2 at 224x224 and at
# 32x32, vgg's 3x3 with a bias; bf16, channels-last, the forward pass
STEM = "C=3,M=64,H=224,W=224,K=7,pad=3,stride=2,dtype=bf16,layout=nhwc"
STEM32 = STEM.replace("H=224,W=224", "H=32,W=32")
VGG_STEM = "C=3,M=64,H=224,W=224,K=3,pad=1,bias=1,dtype=bf16,layout=nhwc"


@st.composite
def few_channel_problems(draw, cls, op="fprop"):
    """Problems the few-channel strategies (mmafew, wfew) serve: 1-8 channels, maps a
    multiple of 16 up to 128, any window, stride and padding (wide, unequal), a bias (db
    in wgrad) and relu, both 16-bit dtypes; those the strategy's default plans for."""
    from specgen.plan import make_plan
    from specgen.variants import Precision

    dtype = draw(st.sampled_from(["bf16", "fp16"]))
    C, M = draw(st.integers(1, 8)), 16 * draw(st.integers(1, 8))
    R, S = draw(st.integers(1, 7)), draw(st.integers(1, 7))
    H, W = draw(st.integers(R, 40)), draw(st.integers(S, 40))
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    pads = "x".join(str(draw(st.integers(0, 4))) for _ in range(4))
    spec = (
        f"C={C},M={M},H={H},W={W},K={R}x{S},pad={pads},stride={stride[0]}x{stride[1]},"
        f"dtype={dtype},layout=nhwc,op={op}"
    )
    if draw(st.booleans()):
        spec += ",bias=1"
    if op == "fprop" and draw(st.booleans()):
        spec += ",act=relu"
    try:
        p = parse_shape(spec)
        make_plan(p, cls.default(p, Precision(dtype)))
        return p
    except SpecError:
        assume(False)


def shipped_layer_winners(key: str) -> list:
    """(problem, variant) of every winner ``specgen/layer_winners.json`` ships for
    strategy ``key``, on every GPU and in every math."""
    import json

    from specgen import tunedb
    from specgen.strategies import parse_variant_name

    shipped = json.loads(tunedb.LAYER_WINNERS.read_text())["winners"]
    out = []
    for table in shipped.values():
        for spec, maths in table.items():
            for entry in (e for entries in maths.values() for e in entries):
                if entry["variant"].startswith(key + "_"):
                    p = parse_shape(spec)
                    out.append((p, parse_variant_name(entry["variant"], p)))
    return out
