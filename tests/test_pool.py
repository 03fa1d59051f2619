"""GPU tier: max pool on specgen's kernels (``specgen.torch.max_pool2d``, ``MaxPool2d``),
the ReLU before it fused or not.  Skipped without PyTorch or without a GPU.

A max pool selects: its output and gradient are values of x and of dy, so every check
is for equality with PyTorch's max pool (after PyTorch's ReLU) and autograd on the same
tensors: values drawn from a few levels so that windows hold ties, with NaN and -inf
among them, y and dx poisoned with NaN and the windows' bytes with a place no window
has before the launch, so that an unwritten element fails."""

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
F = torch.nn.functional

pytestmark = pytest.mark.gpu

import specgen.torch as sg  # noqa: E402  (after the skip: it imports torch)
from specgen.torch import _pool as P  # noqa: E402

DT = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
LAYOUT = {"nhwc": torch.channels_last, "nchw": torch.contiguous_format}
NOWHERE = 119  # a byte no window of up to 4x4 places has


@pytest.fixture(autouse=True)
def poisoned(monkeypatch):
    real_empty, real_places = P.empty, P.empty_places
    monkeypatch.setattr(
        P, "empty", lambda size, like, fmt: real_empty(size, like, fmt).fill_(float("nan"))
    )
    monkeypatch.setattr(P, "empty_places", lambda n, like: real_places(n, like).fill_(NOWHERE))


def drawn(N, C, H, W, dtype, fmt, seed):
    """x of a few levels (ties), about 2% NaN and 2% -inf, and a gradient dy of y's size."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    kind = dict(device="cuda", generator=g)
    x = torch.randint(-4, 5, (N, C, H, W), **kind).float() / 2
    odd = torch.rand(N, C, H, W, **kind)
    x = torch.where(odd < 0.02, float("nan"), torch.where(odd > 0.98, float("-inf"), x))
    return x.to(DT[dtype]).contiguous(memory_format=fmt)


def same(got, want, what):
    """Equal values, NaN where the other has NaN."""
    assert got.shape == want.shape and got.dtype == want.dtype, what
    assert torch.equal(got.isnan(), want.isnan()), f"{what}: NaN in other places"
    assert torch.equal(got.nan_to_num(0.0), want.nan_to_num(0.0)), f"{what}: values differ"


def pytorchs(x, window, act, dy):
    """PyTorch's values and gradient, from its kernels for contiguous tensors: its
    channels_last backward sends a window of -inf's gradient to the plane's first pixel,
    its contiguous one to the window's first, as specgen's kernels do in both layouts."""
    x = x.detach().contiguous().requires_grad_()
    y = F.max_pool2d(torch.relu(x) if act else x, window)
    y.backward(dy.contiguous())
    return y.detach(), x.grad


def ours(x, window, act, dy):
    x = x.detach().clone().requires_grad_()
    y = sg.max_pool2d(x, window, activation=act)
    assert y.grad_fn is not None and "MaxPoolFunction" in type(y.grad_fn).__name__
    y.backward(dy)
    return y.detach(), x.grad


@settings(
    max_examples=30, deadline=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck)
)
@given(
    N=st.integers(1, 4),
    C=st.integers(1, 70),
    H=st.integers(4, 40),
    W=st.integers(4, 40),
    KH=st.integers(1, 4),
    KW=st.integers(1, 4),
    dtype=st.sampled_from(list(DT)),
    layout=st.sampled_from(list(LAYOUT)),
    act=st.sampled_from([None, "relu"]),
    seed=st.integers(0, 2**31 - 1),
)
def test_drawn_max_pools_equal_pytorchs(N, C, H, W, KH, KW, dtype, layout, act, seed):
    x = drawn(N, C, H, W, dtype, LAYOUT[layout], seed)
    dy = torch.randn(N, C, H // KH, W // KW, device="cuda").to(x.dtype)
    dy = dy.contiguous(memory_format=LAYOUT[layout])
    want_y, want_dx = pytorchs(x, (KH, KW), act, dy)
    got_y, got_dx = ours(x, (KH, KW), act, dy)
    same(got_y, want_y, "y")
    same(got_dx, want_dx, "dx")
    assert got_y.is_contiguous(memory_format=LAYOUT[layout])
    assert got_dx.is_contiguous(memory_format=LAYOUT[layout])


@pytest.mark.parametrize("layout", list(LAYOUT))
def test_a_dy_of_other_strides_is_read_as_it_lies(layout):
    x = drawn(3, 16, 24, 20, "fp32", LAYOUT[layout], 7)
    dy = torch.randn(3, 16, 10, 12, device="cuda").transpose(2, 3)  # dense in neither format
    want = pytorchs(x, 2, "relu", dy)
    got = ours(x, 2, "relu", dy)
    same(got[0], want[0], "y")
    same(got[1], want[1], "dx")


@pytest.mark.parametrize("act", [None, "relu"])
def test_a_backward_with_create_graph_differentiates_again(act):
    x = drawn(2, 8, 13, 11, "fp32", LAYOUT["nhwc"], 3)
    x = torch.nan_to_num(x, nan=0.25, neginf=-3.0)
    v = torch.randn(2, 8, 13, 11, device="cuda")
    found = []
    for pool in (lambda t: F.max_pool2d(torch.relu(t) if act else t, 2), None):
        xr = x.detach().clone().requires_grad_()
        dy = torch.randn(
            2, 8, 6, 5, device="cuda", generator=torch.Generator("cuda").manual_seed(1)
        )
        dy.requires_grad_()
        y = pool(xr) if pool else sg.max_pool2d(xr, 2, activation=act)
        (dx,) = torch.autograd.grad(y, xr, dy, create_graph=True)
        (ddy,) = torch.autograd.grad((dx * v).sum(), dy)
        found.append((dx.detach(), ddy))
    same(found[1][0], found[0][0], "dx")
    same(found[1][1], found[0][1], "d(dx . v)/ddy")


def test_a_converted_sequence_runs_its_pools_on_the_kernels():
    torch.manual_seed(0)
    base = torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(inplace=True), torch.nn.MaxPool2d(2)
    ).cuda()
    ours_ = sg.convert(torch.nn.Sequential(*[m for m in base]))  # the same modules
    assert ours_[2].activation == "relu"
    x = torch.randn(4, 3, 32, 32, device="cuda")
    y = ours_(x)
    assert "MaxPoolFunction" in type(y.grad_fn).__name__
    conv = ours_[0](x)
    same(y, F.max_pool2d(torch.relu(conv), 2), "y")
