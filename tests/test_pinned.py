"""CPU tier: the constants and conventions that the other tests read from specgen itself,
pinned here by values derived without specgen (the formats' bit layouts, PyTorch's and
CUDA's documented rules), each with a negative control that shows the check can fail;
and the epilogue and the 16-bit rounding of every kernel, seen in the rendered source."""

import dataclasses
import re
from math import prod

import jinja2
import numpy as np
import pytest

from specgen import reference
from specgen.errors import SpecError
from specgen.plan import make_plan
from specgen.plan.common import MAX_THREADS, REGISTER_FILE, check_threads, registers_of
from specgen.render import render
from specgen.shapes import Feature, Op, parse_shape
from specgen.strategies import TABLE
from specgen.variants import Precision

# --- unit roundoffs, from the formats' bits --------------------------------------------


def _spacing_above_one(mantissa_bits: int) -> float:
    """The gap from 1 to the next number of a format that keeps ``mantissa_bits`` of
    fp32's 23: one unit in the last kept bit, set in 1.0's fp32 bit pattern."""
    one = np.array([1.0], dtype=np.float32).view(np.uint32)
    nxt = (one + np.uint32(1 << (23 - mantissa_bits))).view(np.float32)
    return float(nxt[0]) - 1.0


@pytest.mark.parametrize(
    "constant,bits",
    [("U_FP32", 23), ("U_HALF", 10), ("U_BF16", 7)],
)
def test_unit_roundoffs_are_half_a_unit_of_the_formats_last_bit(constant, bits):
    assert getattr(reference, constant) == _spacing_above_one(bits) / 2


def test_unit_roundoffs_agree_with_numpys_own_formats():
    assert reference.U_FP32 == float(np.finfo(np.float32).eps) / 2
    assert reference.U_HALF == float(np.finfo(np.float16).eps) / 2
    # fp16's smallest subnormal is 2^-24; its rounding error is at most half of it
    assert reference.ETA_HALF == float(np.finfo(np.float16).smallest_subnormal) / 2


def test_bf16_rounding_error_reaches_its_unit_roundoff_and_no_further():
    """Round fp32 values to bf16 (to nearest, ties to even, on the bits) and measure the
    worst relative error: it is U_BF16 within a hair, and 8x that would be no bound at
    all (the negative control: a bound 8x loose is never reached)."""
    rng = np.random.default_rng()
    x = rng.uniform(1.0, 2.0, 200_000).astype(np.float32)
    bits = x.view(np.uint32).astype(np.uint64)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    y = rounded.astype(np.uint32).view(np.float32).astype(np.float64)
    worst = float(np.max(np.abs(y - x) / np.abs(x)))
    assert 0.9 * reference.U_BF16 < worst <= reference.U_BF16
    assert worst < reference.U_BF16 * 8 / 4  # a bound 8x looser would be 4x slack at least


def test_compare_fails_an_error_just_past_its_bound_and_passes_one_just_inside():
    rng = np.random.default_rng()
    ref = rng.uniform(-1, 1, 1000)
    mag = np.abs(ref) + 1.0
    gamma = 1e-3
    inside = ref + 0.99 * gamma * mag * rng.choice([-1, 1], ref.shape)
    outside = inside.copy()
    outside[rng.integers(ref.size)] = np.nan
    assert reference.compare(inside, ref, mag, gamma)["ok"]
    assert not reference.compare(outside, ref, mag, gamma)["ok"]  # NaN never passes
    past = inside.copy()
    i = int(rng.integers(ref.size))
    past[i] = ref[i] + 1.01 * gamma * mag[i]
    assert not reference.compare(past, ref, mag, gamma)["ok"]


# --- pad='same', PyTorch's rule --------------------------------------------------------

# PyTorch (torch.nn.Conv2d, padding='same'): the total padding of a dimension is
# dilation * (kernel - 1); the smaller half goes first, the odd pixel at the end.
SAME = [
    ("K=3", (1, 1, 1, 1)),
    ("K=4", (1, 2, 1, 2)),
    ("K=2", (0, 1, 0, 1)),
    ("K=4x3", (1, 2, 1, 1)),
    ("K=4,dil=2", (3, 3, 3, 3)),
    ("K=2,dil=3x1", (1, 2, 0, 1)),
    ("K=5x6,dil=1x3", (2, 2, 7, 8)),
]


@pytest.mark.parametrize("window,pads", SAME, ids=[w for w, _ in SAME])
def test_same_padding_is_pytorchs(window, pads):
    p = parse_shape(f"C=2,M=3,H=17,W=19,{window},pad=same")
    assert p.pads == pads
    assert (p.Ho, p.Wo) == (p.H, p.W)


def test_the_reference_reads_same_padding_the_way_pytorch_does():
    """A 2x2 window of ones over a 3x3 image with pad=same sums each pixel with its right
    and lower neighbours (the odd pixel of padding at the end).  Worked by hand; the
    negative control is the flipped convention, which sums with the upper-left ones."""
    p = parse_shape("C=1,M=1,H=3,W=3,K=2,pad=same")
    x = np.arange(1.0, 10.0).reshape(1, 1, 3, 3)
    w = np.ones((1, 1, 2, 2))
    by_hand = np.array([[12.0, 16.0, 9.0], [24.0, 28.0, 15.0], [15.0, 17.0, 9.0]])
    flipped = np.array([[1.0, 3.0, 5.0], [5.0, 12.0, 16.0], [11.0, 24.0, 28.0]])
    y = reference.conv2d(x, w, p)[0, 0]
    assert np.array_equal(y, by_hand)
    assert not np.array_equal(y, flipped)


def test_same_padding_needs_stride_one():
    with pytest.raises(SpecError, match="pad=same needs stride 1"):
        parse_shape("C=1,M=1,H=9,W=9,K=3,pad=same,stride=2")


# --- CUDA's limit of 1024 threads a block, at the boundary ----------------------------


def test_the_thread_limit_is_cudas():
    assert MAX_THREADS == 1024  # CUDA C++ Programming Guide, compute capability 9.0


@pytest.mark.parametrize("block", [(1024, 1, 1), (32, 32, 1), (16, 16, 4), (8, 8, 16)])
def test_a_block_of_exactly_1024_threads_is_taken(block):
    check_threads(block, "")


@pytest.mark.parametrize("block", [(1056, 1, 1), (33, 32, 1), (32, 33, 1), (8, 8, 17)])
def test_one_warp_or_one_row_past_1024_threads_is_refused(block):
    with pytest.raises(SpecError, match="over the limit of 1024 threads"):
        check_threads(block, "")


def test_every_launch_is_held_to_1024_threads_whatever_its_strategy_planned(monkeypatch):
    """make_plan checks each launch's block itself, so a strategy whose own limits miss
    a block too large is refused before it is rendered."""
    from specgen.strategies.direct import Direct

    p = parse_shape("C=1,M=1,H=66,W=66,K=3,pad=1")
    v = Direct.default(p, Precision.FP32)
    plan = v.plan(p)
    wide = dataclasses.replace(plan.launches[0], block=(1056, 1, 1))
    monkeypatch.setattr(
        Direct, "plan", lambda self, problem: dataclasses.replace(plan, launches=(wide,))
    )
    with pytest.raises(SpecError, match="1056 threads is over the limit of 1024 threads"):
        make_plan(p, v)


@pytest.mark.parametrize(
    "threads,registers,fits",
    [(1024, 64, True), (1024, 65, False), (768, 80, True), (768, 81, False), (256, 255, True)],
)
def test_a_block_fits_an_sm_only_within_its_register_file(threads, registers, fits):
    """65536 registers an SM, a warp's in units of 256: 1024 threads at 64 take them all,
    at 65 (72 a thread as allocated) they cannot be resident; 768 at 81 take 88 a thread
    as allocated, 67584 in all."""
    assert (registers_of(threads, registers) <= REGISTER_FILE) is fits


def test_verify_reports_a_block_over_the_register_file():
    """check_resources reads the compiler's registers against each launch's block: a
    kernel that compiled but could never be resident is a problem on the CPU."""
    from specgen.compile import compile_source
    from specgen.strategies.direct import Direct
    from specgen.verify import check_resources

    p = parse_shape("C=1,M=1,H=66,W=66,K=3,pad=1")
    plan = make_plan(p, Direct.default(p, Precision.FP32))
    binary = compile_source(render(plan), plan.name, plan.target("sm_90"))
    assert not check_resources(plan, binary)[1]
    threads = prod(plan.launches[0].block)

    def reporting(registers):
        r = dataclasses.replace(binary.resources[plan.name], registers=registers)
        return dataclasses.replace(binary, resources={plan.name: r})

    assert not check_resources(plan, reporting(REGISTER_FILE // threads))[1]
    (problem,) = check_resources(plan, reporting(REGISTER_FILE // threads + 8))[1]
    assert f"{threads} threads" in problem and "over an SM's 65536" in problem


def test_direct_plans_a_1024_thread_tile_and_refuses_the_next():
    """Direct's block is tile x tile threads (one output each): 32 plans, 33 does not."""
    from specgen.strategies.direct import Direct

    p = parse_shape("C=1,M=1,H=66,W=66,K=3,pad=1")
    plan = make_plan(p, Direct(tile=32, coarsening=(1, 1, 1)))
    assert max(l.block[0] * l.block[1] * l.block[2] for l in plan.launches) == 1024
    with pytest.raises(SpecError, match="1024 threads"):
        make_plan(p, Direct(tile=33, coarsening=(1, 1, 1)))


# --- the epilogue and the 16-bit rounding, in every kernel ------------------------------


def _macros(**context):
    from specgen.render import TEMPLATES

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATES)), undefined=jinja2.StrictUndefined
    )
    return env.get_template("common/epilogue.j2").make_module(context)


def test_the_epilogue_adds_the_bias_then_takes_the_relu():
    assert str(_macros(bias=True, relu=True, dtype="fp32").epilogue("acc", "m")) == (
        "fmaxf(acc + __ldg(&bias[m]), 0.0f)"
    )
    assert str(_macros(bias=True, relu=False, dtype="fp32").epilogue("acc", "m", "b")) == "acc + b"
    assert str(_macros(bias=False, relu=False, dtype="fp32").epilogue("acc", "m")) == "acc"
    assert str(_macros(bias=False, relu=False, dtype="bf16").narrow("v")) == "float_to_bf16(v)"


# Problems on which each forward strategy serving a bias can be planned: plain fp32,
# 16-bit NCHW and NHWC, wide channels, one-channel 7x7 windows, odd shapes.
EPILOGUE_PROBLEMS = [
    "C=4,M=16,H=40,W=40,K=7",
    "C=16,M=16,H=20,W=20,K=3,pad=1",
    "C=16,M=16,H=20,W=20,K=3,pad=1,dtype=bf16",
    "C=64,M=64,H=16,W=16,K=3,pad=1,dtype=bf16,layout=nhwc",
    "C=256,M=256,H=16,W=16,K=3,pad=1,dtype=bf16,layout=nhwc",
    "C=64,M=64,H=16,W=16,K=3,pad=1,dtype=fp16,layout=nhwc",
    "C=1,M=12,H=72,W=72,K=7,dtype=bf16",
    "C=12,M=1,H=72,W=72,K=7,dtype=bf16",
    "C=12,M=24,H=33,W=33,K=7,dtype=bf16",
    "C=3,M=256,H=32,W=32,K=3,pad=1,dtype=bf16,layout=nhwc",
    "C=256,M=3,H=32,W=32,K=3,pad=1,dtype=bf16,layout=nhwc",
    "C=32,M=32,H=16,W=16,K=3,pad=1,groups=32,dtype=bf16,layout=nhwc",
    "C=3,M=64,H=32,W=32,K=7,pad=3,stride=2,dtype=bf16,layout=nhwc",  # a stem (mmafew)
    "C=32,M=32,H=16,W=16,K=3,pad=1,groups=32,dtype=bf16",  # depthwise in NCHW (dwplane)
]
FORWARD = [
    cls for cls in TABLE if Op.FPROP in cls.ops and {Feature.BIAS, Feature.ACT} <= set(cls.serves)
]


def _planned_with_epilogue(cls, epilogue: bool):
    tail = ",bias=1,act=relu" if epilogue else ""
    for spec in EPILOGUE_PROBLEMS:
        p = parse_shape(spec + tail)
        for precision in cls.precisions:
            try:
                v = cls.default(cls.problem_for(p), precision)
                return p, v, make_plan(p, v)
            except SpecError:
                continue
    pytest.fail(f"{cls.key}: no problem of EPILOGUE_PROBLEMS plans; add one it serves")


def _body(source: str, name: str) -> str:
    """The kernels' code after their signatures (where bias is only declared)."""
    return source[source.index("{", source.index(f"{name}(")) :]


@pytest.mark.parametrize("cls", FORWARD, ids=[c.key for c in FORWARD])
def test_every_forward_kernel_reads_the_bias_and_applies_the_relu(cls):
    """Each strategy serving a bias, rendered for a problem with bias=1,act=relu: its
    kernel reads bias[...] and takes a max with zero.  The negative control is the same
    strategy without the epilogue, where neither is found: the check can fail."""
    p, v, plan = _planned_with_epilogue(cls, True)
    body = _body(render(plan), plan.launches[0].kernel)
    assert re.search(r"\bbias\s*\[", body), (cls.key, p.spec, "the bias is never read")
    assert "fmaxf(" in body, (cls.key, p.spec, "no relu")
    q, w, bare = _planned_with_epilogue(cls, False)
    body = _body(render(bare), bare.launches[0].kernel)
    assert not re.search(r"\bbias\s*\[", body) and "fmaxf(" not in body, (cls.key, q.spec)


def _first_plan(cls, p):
    for precision in cls.precisions:
        try:
            return make_plan(p, cls.default(cls.problem_for(p), precision))
        except SpecError:
            continue
    return None


FORWARD16 = [cls for cls in FORWARD if Feature.DTYPE16 in cls.serves]


@pytest.mark.parametrize("cls", FORWARD16, ids=[c.key for c in FORWARD16])
def test_every_16bit_kernel_rounds_its_outputs_to_nearest_even(cls):
    """A 16-bit problem's kernel narrows its outputs with float_to_<dtype> or pack2, whose
    PTX is cvt.rn (round to nearest, ties to even, as PyTorch rounds)."""
    checked = []
    for dtype in ("bf16", "fp16"):
        for spec in EPILOGUE_PROBLEMS:
            p = parse_shape(re.sub(r",dtype=\w+", "", spec) + f",dtype={dtype}")
            plan = _first_plan(cls, p)
            if plan is None:
                continue
            source = render(plan)
            cvt = "bf16" if dtype == "bf16" else "f16"
            assert re.search(rf"cvt\.rn\.{cvt}(x2)?\.f32", source), (cls.key, p.spec)
            body = _body(source, plan.launches[0].kernel)
            assert re.search(rf"float_to_{dtype}\(|pack2\(", body), (cls.key, p.spec)
            checked.append(p.spec)
            break
    assert checked, f"{cls.key}: no 16-bit problem of EPILOGUE_PROBLEMS plans"


def test_a_precision_is_never_looser_than_its_dtype():
    """Sanity of the table the tolerance reads: every precision a strategy names exists."""
    assert {p for cls in TABLE for p in cls.precisions} <= set(Precision)


def test_the_operators_layout_transpose_compiles_for_every_dtype():
    """The transpose the operator moves tensors between memory formats with: one kernel
    a dtype, no spills, its tile in shared memory (33 words a row of 32 for fp32)."""
    from specgen.compile import compile_source
    from specgen.runtime import transpose_source

    for dtype, word in (("fp32", 4), ("bf16", 2), ("fp16", 2)):
        name, text = transpose_source(dtype)
        binary = compile_source(text, name, "sm_90")
        assert binary.spills == 0
        assert binary.resources[name].smem == 32 * 33 * word
