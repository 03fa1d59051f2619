"""The operator's fallback: what specgen's kernels do not serve runs on PyTorch's own
convolution (CPU and float64 tensors, arguments it refuses), logged once a problem, and
raises what PyTorch raises; strict, it is refused.  These run wherever PyTorch is, a GPU
or not (the GPU cases are in test_torch.py)."""

import logging

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import specgen.torch as sg  # noqa: E402  (after the skip: it imports torch)
from specgen.errors import SpecError  # noqa: E402


@pytest.fixture(autouse=True)
def not_strict():
    sg.strict(False)
    yield
    sg.strict(False)


def test_cpu_and_float64_tensors_compute_what_pytorch_computes():
    """A converted model moved to the CPU runs, and in float64 it passes gradcheck: the
    values are PyTorch's own, bit for bit."""
    for dtype in (torch.float32, torch.float64):
        x = torch.randn(2, 3, 9, 9, dtype=dtype, requires_grad=True)
        w = torch.randn(4, 3, 3, 3, dtype=dtype, requires_grad=True)
        b = torch.randn(4, dtype=dtype, requires_grad=True)
        assert torch.equal(sg.conv2d(x, w, b, 2, 1), F.conv2d(x, w, b, 2, 1))
        assert torch.equal(sg.conv2d(x[0], w, None, 1, "same"), F.conv2d(x[0], w, None, 1, "same"))
    assert torch.autograd.gradcheck(lambda *t: sg.conv2d(*t, 1, 1), (x, w, b))
    model = sg.convert(torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU()))
    assert isinstance(model[0], sg.Conv2d)
    y = model.cpu()(torch.randn(1, 3, 8, 8))
    assert y.shape == (1, 8, 6, 6)


def test_a_fallback_is_logged_once_a_problem(caplog):
    x, w = torch.randn(1, 2, 6, 6), torch.randn(3, 2, 3, 3)
    with caplog.at_level(logging.INFO, logger="specgen.torch"):
        for _ in range(3):
            sg.conv2d(x, w)
        sg.conv2d(torch.randn(1, 2, 7, 7), w)
    said = [r.getMessage() for r in caplog.records if "PyTorch's convolution" in r.getMessage()]
    assert len(said) == 2 and "CUDA" in said[0] and "(1, 2, 6, 6)" in said[0]


@pytest.mark.parametrize(
    "args",
    [
        dict(stride=0),
        dict(stride=-1),
        dict(dilation=0),
        dict(padding=-1),
        dict(padding="full"),
        dict(padding="same", stride=2),
        dict(groups=2),  # 3 channels in 2 groups
    ],
)
def test_argument_errors_are_pytorchs(args):
    """Every argument error is the exception PyTorch raises, with its message."""
    x, w = torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3)
    with pytest.raises(Exception) as theirs:
        F.conv2d(x, w, **args)
    with pytest.raises(type(theirs.value)) as ours:
        sg.conv2d(x, w, **args)
    assert str(ours.value) == str(theirs.value)


def test_strict_refuses_in_one_line(monkeypatch):
    sg.strict(True)
    with pytest.raises(SpecError, match="CUDA"):
        sg.conv2d(torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3))
    with pytest.raises(SpecError, match="non-positive stride"):
        sg.conv2d(torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3), stride=0)


@pytest.mark.parametrize(
    "args",
    [dict(), dict(stride=2, padding=1), dict(padding="same", dilation=2), dict(groups=3)],
)
def test_conv1d_off_the_gpu_is_pytorchs(args):
    x = torch.randn(2, 6, 17, requires_grad=True)
    w = torch.randn(9, 6 // args.get("groups", 1), 3, requires_grad=True)
    b = torch.randn(9)
    assert torch.equal(sg.conv1d(x, w, b, **args), F.conv1d(x, w, b, **args))
    assert torch.equal(sg.conv1d(x[0], w, b, **args), F.conv1d(x[0], w, b, **args))


@pytest.mark.parametrize(
    "args", [dict(stride=0), dict(stride=(1, 1)), dict(padding=-1), dict(padding="full")]
)
def test_conv1d_argument_errors_are_pytorchs(args):
    x, w = torch.randn(1, 3, 8), torch.randn(4, 3, 3)
    with pytest.raises(Exception) as theirs:
        F.conv1d(x, w, **args)
    with pytest.raises(type(theirs.value)) as ours:
        sg.conv1d(x, w, **args)
    assert str(ours.value) == str(theirs.value)


def test_convert_takes_conv1d_modules_with_their_state():
    model = torch.nn.Sequential(
        torch.nn.Conv1d(4, 8, 5, padding=2, padding_mode="circular"),
        torch.nn.ReLU(),
        torch.nn.Conv2d(8, 8, 1),
    )
    ref = torch.nn.Sequential(model[0], model[1])
    x = torch.randn(3, 4, 20)
    want = ref(x)
    sg.convert(model)
    assert type(model[0]) is sg.Conv1d and type(model[2]) is sg.Conv2d
    assert model[0].weight is ref[0].weight
    assert torch.equal(model[1](model[0](x)), want)
    assert model[0].state_dict().keys() == torch.nn.Conv1d(4, 8, 5).state_dict().keys()
