"""GPU tier: every default variant of every preset, and random shapes, checked against
the float64 reference with fresh random inputs and a NaN-poisoned output."""

import os

import numpy as np
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from specgen.parallel import precompile
from specgen.shapes import PRESETS, Act, square
from specgen.strategies import default_set
from specgen.verify import verify_variant

from problems import problem_specs

pytestmark = pytest.mark.gpu

CASES = [(s, v) for s in PRESETS.values() for v in default_set(s)]


@pytest.fixture(scope="module")
def arch():
    from specgen.runtime import device_arch

    return device_arch()


@pytest.fixture(scope="module")
def compiled(arch):
    return precompile(CASES, arch, jobs=os.cpu_count() or 1)


def verify_default_set(problem, batch, arch):
    """Every variant of the problem's default set passes its numerical check."""
    variants = default_set(problem)
    assert variants, "every problem gets at least one variant"
    precompile([(problem, v) for v in variants], arch, jobs=os.cpu_count() or 1)
    rng = np.random.default_rng()
    for v in variants:
        row = verify_variant(problem, v, arch=arch, batch=batch, numbers=True, rng=rng)
        assert row.status == "PASS", (problem.spec, v.name, row.problems)


@pytest.mark.parametrize("shape,variant", CASES, ids=[f"{s.name}-{v.name}" for s, v in CASES])
def test_preset_variant(shape, variant, arch, compiled):
    row = verify_variant(shape, variant, arch=arch, batch=3, numbers=True)
    assert row.status == "PASS", row.problems


@settings(
    max_examples=16,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
)
@given(
    K=st.sampled_from([1, 3, 5, 7]),
    C=st.integers(1, 32),
    M=st.integers(1, 32),
    H=st.integers(7, 29),
    W=st.integers(7, 29),
    padfrac=st.floats(0, 1),
    batch=st.integers(1, 3),
    bias=st.booleans(),
    relu=st.booleans(),
)
def test_random_shapes(K, C, M, H, W, padfrac, batch, bias, relu, arch):
    """Every strategy on the presets' kind of problem, with and without the epilogue
    (bias, relu) that each applies before its store."""
    pad = int(padfrac * (K // 2) + 0.5) if K > 1 else 0
    act = Act.RELU if relu else Act.NONE
    shape = square(C, M, H, W, K, min(pad, K // 2), bias=bias, act=act)
    verify_default_set(shape, batch, arch)


# No shrinking: on the GPU machine it can take longer than the whole tier, and the
# failing problem's spec is in the assertion message anyway.
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
)
@given(p=problem_specs(largest=29), batch=st.integers(1, 3))
def test_random_problems(p, batch, arch):
    """Stride, dilation, groups (depthwise too), rectangular windows, every padding
    form, bias and relu, fp32/fp16/bf16 tensors, NCHW and NHWC: every strategy that
    serves the drawn problem computes it within its bound."""
    verify_default_set(p, batch, arch)
