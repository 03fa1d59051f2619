"""choose.cropped: a window wider than the maps it slides over, cropped to the taps that
meet x.  CPU tier: the cropped problem computes the same forward pass, dgrad and wgrad as
the whole window in the float64 reference, on fresh random tensors."""

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from problems import parsed_or_rejected
from specgen import reference
from specgen.choose import computed_problem, crop_origin, cropped, planned
from specgen.shapes import ConvProblem, Op, TensorLayout, parse_shape
from tuned import winner


def test_resnet18s_last_layers_at_32x32():
    """resnet18's 3x3 layers at 32x32 (B=128): over 1x1 maps only the centre tap meets
    x, a 1x1 layer unpadded; layer4.0.conv1 (2x2 maps, stride 2) keeps the 2x2 taps at
    the bottom right, its padding on the far sides alone; over 2x2 maps at stride 1
    every tap meets x."""
    last = replace(parse_shape("C=512,M=512,H=1,W=1,K=3,pad=1"), batch=128)
    for op in (Op.FPROP, Op.DGRAD, Op.WGRAD):
        small = cropped(replace(last, op=op))
        assert (small.R, small.S, small.pads) == (1, 1, (0, 0, 0, 0))
        assert crop_origin(last.pads, last.dil, (3, 3), small) == (1, 1)
    strided = replace(parse_shape("C=256,M=512,H=2,W=2,K=3,pad=1,stride=2"), batch=128)
    small = cropped(strided)
    assert (small.R, small.S, small.pads, small.Ho) == (2, 2, (0, 1, 0, 1), 1)
    assert crop_origin(strided.pads, strided.dil, (3, 3), small) == (1, 1)
    whole = replace(parse_shape("C=256,M=256,H=2,W=2,K=3,pad=1"), batch=128)
    assert cropped(whole) is whole and crop_origin(whole.pads, whole.dil, (3, 3), whole) is None
    assert cropped(replace(last, op=Op.BGRAD)).R == 3  # bgrad has no window


def test_the_operator_computes_the_cropped_problem():
    """computed_problem crops the window before it picks the layout: the layer the
    operator computes over 1x1 maps is a 1x1 one, in either layout."""
    last = replace(parse_shape("C=512,M=512,H=1,W=1,K=3,pad=1"), batch=128)
    for layout in TensorLayout:
        for op in (Op.FPROP, Op.DGRAD, Op.WGRAD):
            p = computed_problem(replace(last, op=op, layout=layout), "some GPU", True, "sm_90")
            assert (p.R, p.S, p.pads) == (1, 1, (0, 0, 0, 0)), (op, layout)


@st.composite
def small_maps(draw):
    """Problems whose windows may overhang their maps: maps of 1 to 5 pixels a side,
    windows up to 5x5, stride and dilation up to 3, every padding up to 3, groups."""
    H, W = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    R, S = draw(st.integers(1, 5)), draw(st.integers(1, 5))
    pads = [draw(st.integers(0, 3)) for _ in range(4)]
    stride = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    dil = (draw(st.integers(1, 3)), draw(st.integers(1, 3)))
    groups = draw(st.sampled_from([1, 2]))
    spec = (
        f"C={2 * groups},M={3 * groups},H={H},W={W},K={R}x{S},pad={'x'.join(map(str, pads))},"
        f"stride={stride[0]}x{stride[1]},dil={dil[0]}x{dil[1]},groups={groups}"
    )
    return parsed_or_rejected(spec)


@settings(max_examples=300, deadline=None)
@given(p=small_maps(), seed=st.integers(0, 2**31 - 1))
def test_the_cropped_window_computes_every_op_alike(p: ConvProblem, seed: int):
    """Drawn problems, the float64 reference: the forward pass and dgrad of the cropped
    problem over the kept taps equal those of the whole window, and wgrad's dw equals
    the cropped one's at the kept taps and is zero past them.  The output's size is the
    same, the padding at least 0."""
    small = cropped(p)
    assert (small.Ho, small.Wo) == (p.Ho, p.Wo) and min(small.pads) >= 0
    origin = crop_origin(p.pads, p.dil, (p.R, p.S), small)
    if origin is None:
        assert small is p
        return
    rows = slice(origin[0], origin[0] + small.R)
    cols = slice(origin[1], origin[1] + small.S)
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((2, p.C, p.H, p.W))
    w = rng.standard_normal((p.M, p.Cg, p.R, p.S))
    dy = rng.standard_normal((2, p.M, p.Ho, p.Wo))
    kept = w[:, :, rows, cols]
    y, y_small = reference.conv2d(x, w, p), reference.conv2d(x, kept, small)
    np.testing.assert_allclose(y_small, y, rtol=1e-12, atol=1e-12)
    dx = reference.conv2d_dgrad(dy, w, p)
    np.testing.assert_allclose(reference.conv2d_dgrad(dy, kept, small), dx, rtol=1e-12, atol=1e-12)
    dw = reference.conv2d_wgrad(x, dy, p)
    np.testing.assert_allclose(
        reference.conv2d_wgrad(x, dy, small), dw[:, :, rows, cols], rtol=1e-12, atol=1e-12
    )
    past = np.ones(dw.shape, dtype=bool)
    past[:, :, rows, cols] = False
    assert not dw[past].any()  # the taps cropped away meet x nowhere


def test_a_window_that_meets_x_everywhere_or_would_lose_its_padding_stays():
    """No crop where every tap meets x, nor where the cropped padding would go below 0
    (a dilated window past small maps)."""
    for spec in ("C=8,M=8,H=4,W=4,K=3,pad=1", "C=8,M=8,H=7,W=7,K=5,pad=2,stride=2"):
        p = parse_shape(spec)
        assert cropped(p) is p


@pytest.mark.parametrize("op", [Op.FPROP, Op.DGRAD, Op.WGRAD])
def test_a_cropped_problem_has_a_kernel(op):
    """The operator's pick for resnet18's last 3x3 layer at 32x32 (B=128), cropped to
    1x1: a tensor-core kernel in tf32 and in bf16."""
    from specgen.choose import choose
    from specgen.shapes import DType

    last = replace(parse_shape("C=512,M=512,H=1,W=1,K=3,pad=1"), batch=128, op=op)
    for p in (last, replace(last, dtype=DType.BF16, layout=TensorLayout.NHWC)):
        q = computed_problem(p, "some GPU", True, "sm_90")
        assert choose(q, "some GPU", True, "sm_90").variant.tensor_core


def record(p: ConvProblem, gpu: str, ms: float = 0.01) -> None:
    """The planner's pick for ``p`` as if a tune had measured it in ``ms``."""
    v = planned(p, True).variant
    winner(p, v.name, ms, v.precision.value, gpu, batch=p.batch)


def test_a_measured_whole_window_stays_until_its_crop_is_measured(tmp_path, monkeypatch):
    """A crop keeping more than a third of the taps (4 of 9: resnet18's layer4.0.conv1
    at 32x32) trades a measured winner of the whole window only for a measured one of
    the cropped window that takes no longer; untuned, the cropped window.  A crop to a
    third or less (1 of 9) is taken whatever is measured."""
    gpu = "GPU X"
    whole = replace(parse_shape("C=256,M=512,H=2,W=2,K=3,pad=1,stride=2"), batch=128)
    small = cropped(whole)
    assert (small.R, small.S) == (2, 2)

    def measured(folder, *timed):
        monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path / folder))
        for p, ms in timed:
            record(p, gpu, ms)
        return computed_problem(whole, gpu, True, "sm_90")

    assert measured("untuned").R == 2
    assert measured("whole", (whole, 0.01)).R == 3
    assert measured("both", (whole, 0.01), (small, 0.008)).R == 2
    assert measured("slower", (whole, 0.01), (small, 0.012)).R == 3
    last = replace(parse_shape("C=512,M=512,H=1,W=1,K=3,pad=1"), batch=128)
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path / "last"))
    record(last, gpu)
    assert computed_problem(last, gpu, True, "sm_90").R == 1


def test_a_whole_model_tune_searches_both_forms_of_a_window_wider_than_its_maps():
    """dist.searched lists a layer whose window overhangs its maps whole and cropped,
    each in every math and where both have tensor-core kernels both layouts, so that
    the two forms' winners decide (``_crop_pays``); a layer whose every tap meets x
    once."""
    from specgen import dist

    conv1 = replace(parse_shape("C=256,M=512,H=2,W=2,K=3,pad=1,stride=2"), batch=128)
    windows = {(s[0].R, s[0].S) for s in dist.searched([conv1], "", "sm_90")}
    assert windows == {(3, 3), (2, 2)}
    whole = replace(parse_shape("C=256,M=256,H=4,W=4,K=3,pad=1"), batch=128)
    assert {(s[0].R, s[0].S) for s in dist.searched([whole], "", "sm_90")} == {(3, 3)}
