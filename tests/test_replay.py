"""GPU tier: a conv and batch norm node replayed from its record (``specgen.torch._replay``).
Skipped without PyTorch or without a GPU.

A replay makes the recorded call's allocations and launches again, so its values and
gradients are those of the node's body run as usual, bit for bit: each check records a
node, then replays it on fresh random inputs, with every tensor the replay allocates
poisoned with NaN, beside the same modules on the body's path, and asserts equality
(which NaN never passes); but for the convolutions' dw and db, whose split sums some
wgrad kernels add atomically, in an order that varies from run to run: those agree to
fp32's last bits of their largest value."""

import copy
import random
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

pytestmark = pytest.mark.gpu

import specgen.torch as sg  # noqa: E402  (after the skip: it imports torch)
from specgen.torch import _convnorm, _replay  # noqa: E402
from specgen.torch._convnorm import conv_norm  # noqa: E402

FORMATS = {"nchw": torch.contiguous_format, "nhwc": torch.channels_last}


@pytest.fixture(autouse=True)
def fp32_math():
    before = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32 = before


def same(a, b, what):
    assert torch.isfinite(a).all(), f"{what}: NaN or Inf"
    assert torch.equal(a, b), f"{what}: {(a.double() - b.double()).abs().max().item():.3g} apart"


def summed_alike(a, b, what):
    assert torch.isfinite(a).all(), f"{what}: NaN or Inf"
    assert (a.double() - b.double()).abs().max() <= 2.0**-18 * b.double().abs().max(), what


def pair(C, M, K, stride, bias, act, seed):
    torch.manual_seed(seed)
    conv = sg.Conv2d(C, M, K, stride=stride, padding=K // 2, bias=bias).cuda()
    bn = sg.BatchNorm2d(M).cuda()
    with torch.no_grad():
        bn.weight.copy_(1 + 0.5 * torch.randn(M))
        bn.bias.copy_(torch.randn(M))
        bn.running_mean.copy_(torch.randn(M))
        bn.running_var.copy_(0.5 + torch.rand(M))
    bn.activation = act
    return conv, bn


def run(conv, bn, x, r, dy, bf16):
    x, r = x.clone().requires_grad_(True), None if r is None else r.clone().requires_grad_(True)
    with torch.autocast("cuda", torch.bfloat16, enabled=bf16):
        out = conv_norm(conv, bn, x, r)
    out.backward(dy.to(out.dtype))
    grads = [x.grad, None if r is None else r.grad, *(p.grad for p in bn.parameters())]
    return out, grads, [p.grad for p in conv.parameters()]


CASES = [  # (C, M, K, stride, H, bias, act, residual, math, layout)
    (64, 64, 3, 1, 14, False, "relu", True, "fp32", "nchw"),
    (64, 128, 3, 2, 14, False, "relu", False, "bf16", "nhwc"),
    (128, 256, 1, 2, 8, False, None, False, "tf32", "nhwc"),
    (32, 96, 1, 1, 9, True, "relu6", False, "fp32", "nhwc"),
    (24, 144, 1, 1, 7, False, None, True, "bf16", "nchw"),
    (3, 64, 7, 2, 32, False, "relu", False, "fp32", "nchw"),
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_a_replayed_node_gives_the_bodys_values_and_gradients_bit_for_bit(case, monkeypatch):
    """The node recorded on warm-up calls, then replayed on fresh inputs (the replay's
    allocations NaN), against a copy of the same modules whose node runs its body
    (replay off): the output, every gradient, the running statistics, all equal; and
    the forward and the backward were replays."""
    C, M, K, stride, H, bias, act, residual, math, layout = case
    torch.backends.cudnn.allow_tf32 = math == "tf32"
    seed = random.randrange(1 << 30)
    conv, bn = pair(C, M, K, stride, bias, act, seed)
    conv2, bn2 = copy.deepcopy(conv), copy.deepcopy(bn)
    g = torch.Generator(device="cuda").manual_seed(seed)
    Ho = (H + 2 * (K // 2) - K) // stride + 1
    dtype = torch.bfloat16 if math == "bf16" else torch.float32
    shape = (4, M, Ho, Ho)

    def draw():
        x = torch.randn(4, C, H, H, device="cuda", generator=g)
        x = x.contiguous(memory_format=FORMATS[layout])
        dy = torch.randn(shape, device="cuda", generator=g).to(dtype)
        dy = dy.contiguous(memory_format=FORMATS[layout])  # as the output's (else copied)
        r = None
        if residual:
            r = torch.randn(shape, device="cuda", generator=g).to(dtype)
            r = r.contiguous(memory_format=FORMATS[layout])
        return x, r, dy

    _convnorm._forwards.clear()
    for _ in range(_replay.TRIES):  # the first call builds the kernels; then one records
        inputs = draw()
        run(conv, bn, *inputs, math == "bf16")
        monkeypatch.setattr(_replay, "ENABLED", False)
        run(conv2, bn2, *inputs, math == "bf16")
        monkeypatch.setattr(_replay, "ENABLED", True)
    (record,) = _convnorm._forwards.values()
    assert isinstance(record, _replay.Record), record.why
    (after,) = record.after.values()
    if not isinstance(after, _replay.Record):  # a body that a replay cannot do
        assert after.why == "weights uploaded to __constant__", after.why
        after = SimpleNamespace(replays=0)
    before = (record.replays, after.replays)
    monkeypatch.setattr(_replay, "allocate", _poisoned(_replay.allocate))
    x, r, dy = draw()
    one, grads, dws = run(conv, bn, x, r, dy, math == "bf16")
    monkeypatch.setattr(_replay, "ENABLED", False)
    two, grads2, dws2 = run(conv2, bn2, x, r, dy, math == "bf16")
    assert record.replays == before[0] + 1
    assert after.replays in (0, before[1] + 1)
    same(one, two, "out")
    assert one.stride() == two.stride()
    for a, b, what in zip(grads, grads2, ("dx", "dr", "dgamma", "dbeta")):
        assert (a is None) == (b is None), what
        if a is not None:
            same(a, b, what)
    for a, b, what in zip(dws, dws2, ("dw", "db")):
        summed_alike(a, b, what)
    for a, b in zip(bn.buffers(), bn2.buffers()):
        same(a, b, "running statistics")


def _poisoned(allocate):
    """Allocations that start as NaN: floats filled with it, bytes (packed weights)
    with all ones, which read as NaN in every float dtype."""

    def poisoned(*spec):
        t = allocate(*spec)
        return t.fill_(float("nan") if t.is_floating_point() else 255)

    return poisoned


def test_a_converted_network_replays_its_nodes_and_trains_as_without(monkeypatch):
    """resnet18, converted (bf16 autocast, channels_last): after warm-up steps each of
    its 20 nodes' forwards is replayed, and each backward but those whose body runs a
    PyTorch op (a copy), and a step's output and every parameter's gradient are those
    of the same network with replay off, bit for bit (but the convolutions' dw, as
    above)."""
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(random.randrange(1 << 30))
    model = sg.convert(torchvision.models.resnet18(num_classes=10)).cuda()
    model = model.to(memory_format=torch.channels_last)
    twin = copy.deepcopy(model)
    convs = {id(c.weight) for c in model.modules() if isinstance(c, torch.nn.Conv2d)}

    def step(m, x, enabled):
        monkeypatch.setattr(_replay, "ENABLED", enabled)
        m.zero_grad(set_to_none=True)
        with torch.autocast("cuda", torch.bfloat16):
            out = m(x)
        out.float().square().sum().backward()
        return out, [(id(p) in convs, p.grad) for p in m.parameters()]

    _convnorm._forwards.clear()
    for _ in range(_replay.TRIES):
        x = torch.randn(8, 3, 32, 32, device="cuda").contiguous(memory_format=torch.channels_last)
        step(model, x, True)
        step(twin, x, False)
    records = list(_convnorm._forwards.values())
    assert len(records) == 20
    assert all(isinstance(r, _replay.Record) for r in records), [r.why for r in records]
    afters = [a for r in records for a in r.after.values()]
    refused = [a.why for a in afters if not isinstance(a, _replay.Record)]
    assert all(why.endswith(" ran") for why in refused), refused  # a PyTorch op: a copy
    afters = [a for a in afters if isinstance(a, _replay.Record)]
    counts = [r.replays for r in records], [a.replays for a in afters]
    monkeypatch.setattr(_replay, "allocate", _poisoned(_replay.allocate))
    x = torch.randn(8, 3, 32, 32, device="cuda").contiguous(memory_format=torch.channels_last)
    out, grads = step(model, x, True)
    out2, grads2 = step(twin, x, False)
    forwards = sum(r.replays for r in records) - sum(counts[0])
    backwards = sum(a.replays for a in afters) - sum(counts[1])
    assert forwards == 20 and backwards == len(afters) >= 20 - len(refused), (forwards, backwards)
    same(out, out2, "out")
    for (conv, a), (_, b) in zip(grads, grads2):
        (summed_alike if conv else same)(a, b, "a parameter's gradient")
