"""CPU tier: what the conv and batch norm node's remembered lookups depend on
(``specgen.torch._convnorm._form``): a pair of modules called again reads the same
form where nothing its lookups use has changed (an optimizer's step and the running
statistics' updates are in place), and another form where anything has.  The node
itself runs on the GPU (tests/test_convnorm.py, tests/test_replay.py).  Skipped without
PyTorch."""

import gc
import random
import weakref

import pytest

torch = pytest.importorskip("torch")

import specgen.torch as sg  # noqa: E402  (after the skip: it imports torch)
from specgen.torch import _convnorm  # noqa: E402
from specgen.torch._convnorm import _form  # noqa: E402


def modules():
    C, M = random.randrange(2, 9), random.randrange(2, 17)
    conv, bn = sg.Conv2d(C, M, 3, padding=1, bias=False), sg.BatchNorm2d(M)
    x = torch.randn(random.randrange(1, 5), C, 6, 6)
    return conv, bn, x


def test_a_step_in_place_reads_the_same_form():
    conv, bn, x = modules()
    form = _form(conv, bn, x, None)
    with torch.no_grad():
        conv.weight.sub_(0.1 * torch.randn_like(conv.weight))
        bn.weight.add_(1.0)
        bn.running_mean.mul_(0.9)
        bn.running_var.add_(0.1)
    bn.num_batches_tracked.add_(1)
    assert _form(conv, bn, torch.randn_like(x), None) == form


def _retyped(m, name, tensor_of):
    """Module ``m``'s parameter or buffer ``name`` given new data (as ``module.to`` does)."""
    t = getattr(m, name)
    t.data = tensor_of(t.data)


CHANGES = {  # what changes -> (conv, bn, x) -> (x, residual) after changing it
    "batch": lambda c, b, x: (torch.cat([x, x]), None),
    "channels_last x": lambda c, b, x: (x.contiguous(memory_format=torch.channels_last), None),
    "x's dtype": lambda c, b, x: (x.double(), None),
    "a residual": lambda c, b, x: (x, torch.randn(x.shape[0], c.out_channels, 6, 6)),
    "stride": lambda c, b, x: setattr(c, "stride", (2, 2)) or (x, None),
    "dilation": lambda c, b, x: setattr(c, "dilation", (2, 2)) or (x, None),
    "padding": lambda c, b, x: setattr(c, "padding", (0, 0)) or (x, None),
    "momentum None": lambda c, b, x: setattr(b, "momentum", None) or (x, None),
    "eps": lambda c, b, x: setattr(b, "eps", 1e-3) or (x, None),
    "activation": lambda c, b, x: setattr(b, "activation", "relu") or (x, None),
    "no running stats": lambda c, b, x: setattr(b, "track_running_stats", False) or (x, None),
    "a new weight": lambda c, b, x: setattr(c, "weight", torch.nn.Parameter(c.weight + 0))
    or (x, None),
    "the weight's data replaced": lambda c, b, x: _retyped(c, "weight", torch.clone) or (x, None),
    "channels_last weights": lambda c, b, x: c.to(memory_format=torch.channels_last) and (x, None),
    "gamma's data replaced": lambda c, b, x: _retyped(b, "weight", torch.clone) or (x, None),
    "a new running var": lambda c, b, x: setattr(b, "running_var", b.running_var + 0) or (x, None),
    "a new count": lambda c, b, x: setattr(b, "num_batches_tracked", torch.tensor(0)) or (x, None),
}


@pytest.mark.parametrize("what", CHANGES)
def test_a_change_the_lookups_read_reads_another_form(what):
    conv, bn, x = modules()
    form = _form(conv, bn, x, None)
    x2, r = CHANGES[what](conv, bn, x)
    assert _form(conv, bn, x2, r) != form


def test_a_residual_of_another_layout_or_alignment_reads_another_form():
    conv, bn, x = modules()
    shape = (x.shape[0], conv.out_channels, 6, 6)
    r = torch.randn(shape)
    form = _form(conv, bn, x, r)
    assert _form(conv, bn, x, torch.randn(shape)) == form
    assert _form(conv, bn, x, r.contiguous(memory_format=torch.channels_last)) != form
    off = torch.randn(r.numel() + 1)[1:].view(shape)  # 4 bytes past a 16-byte boundary
    assert _form(conv, bn, x, off) != form


def test_autocast_and_tf32_read_another_form(monkeypatch):
    conv, bn, x = modules()
    form = _form(conv, bn, x, None)
    allowed = torch.backends.cudnn.allow_tf32
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", not allowed)
    assert _form(conv, bn, x, None) != form
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", allowed)
    torch.set_autocast_enabled("cuda", True)
    try:
        assert _form(conv, bn, x, None) != form
    finally:
        torch.set_autocast_enabled("cuda", False)
    assert _form(conv, bn, x, None) == form


def test_another_convolution_before_the_same_batch_norm_reads_another_form():
    conv, bn, x = modules()
    other = sg.Conv2d(conv.in_channels, conv.out_channels, 3, padding=1, bias=False)
    other.weight = conv.weight
    assert _form(other, bn, x, None) != _form(conv, bn, x, None)


def test_a_remembered_call_goes_with_its_batch_norm():
    """The lookups are kept by the batch norm module: a model let go takes its
    parameters with it."""
    conv, bn, x = modules()
    _convnorm._remember(conv, bn, _form(conv, bn, x, None), (conv.weight,), None)
    assert _convnorm._calls.get(bn) is not None
    before = len(_convnorm._calls)
    weight = weakref.ref(conv.weight)
    del conv, bn
    gc.collect()
    assert len(_convnorm._calls) == before - 1 and weight() is None
