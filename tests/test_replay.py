"""GPU tier: the operator's nodes replayed from their records (``specgen.torch._replay``):
the conv and batch norm node, the convolution's and the batch norm's.  Skipped without
PyTorch or without a GPU.

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
cupy = pytest.importorskip("cupy")

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fp32_math")]

import specgen.torch as sg  # noqa: E402  (after the skip: it imports torch)
from specgen.torch import _batchnorm as B  # noqa: E402
from specgen.torch import _chain, _convnorm, _ops, _replay  # noqa: E402
from specgen.torch._convnorm import conv_norm  # noqa: E402
from test_convnorm import CASES, FORMATS, agree, drawing, pair, same, summed_alike  # noqa: E402


def run(conv, bn, x, r, dy, bf16):
    x, r = x.clone().requires_grad_(True), None if r is None else r.clone().requires_grad_(True)
    with torch.autocast("cuda", torch.bfloat16, enabled=bf16):
        out = conv_norm(conv, bn, x, r)
    out.backward(dy.to(out.dtype))
    grads = [x.grad, None if r is None else r.grad, *(p.grad for p in bn.parameters())]
    return out, grads, [p.grad for p in conv.parameters()]


def replayed(monkeypatch, records: dict, call, twin, draw):
    """``call`` (replay on) and ``twin`` (replay off, over copies of the same modules)
    on the same draws: warm-up calls until the node's forward and backward are
    recorded, then both on fresh inputs, the replay's allocations NaN; their results,
    and that the forward and the backward were replays (but a backward whose body
    uploads weights to __constant__, which is run as usual)."""
    records.clear()
    for _ in range(_replay.TRIES):  # the first call builds the kernels; then one records
        inputs = draw()
        call(*inputs)
        monkeypatch.setattr(_replay, "ENABLED", False)
        twin(*inputs)
        monkeypatch.setattr(_replay, "ENABLED", True)
    (record,) = records.values()
    assert isinstance(record, _replay.Record), record.why
    (after,) = record.after.values()
    if not isinstance(after, _replay.Record):  # a body that a replay cannot do
        assert after.why == "weights uploaded to __constant__", after.why
        after = SimpleNamespace(replays=0)
    before = (record.replays, after.replays)
    with monkeypatch.context() as m:
        poison_replays(m)
        inputs = draw()
        first = call(*inputs)
        m.setattr(_replay, "ENABLED", False)
        second = twin(*inputs)
    assert record.replays == before[0] + 1
    assert after.replays in (0, before[1] + 1)
    return first, second


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_a_replayed_node_gives_the_bodys_values_and_gradients_bit_for_bit(case, monkeypatch):
    """A conv and batch norm node replayed against a copy of the same modules whose
    node runs its body: the output, every gradient, the running statistics, all equal."""
    C, M, K, stride, H, bias, act, residual, math, layout = case
    torch.backends.cudnn.allow_tf32 = math == "tf32"
    seed = random.randrange(1 << 30)
    conv, bn = pair(C, M, K, stride, bias, act, seed)
    conv2, bn2 = copy.deepcopy(conv), copy.deepcopy(bn)
    draw = drawing(case, seed, FORMATS[layout])  # dy as the output lies (else copied)
    bf16 = math == "bf16"
    first, second = replayed(
        monkeypatch,
        _convnorm._forwards,
        lambda *inputs: run(conv, bn, *inputs, bf16),
        lambda *inputs: run(conv2, bn2, *inputs, bf16),
        draw,
    )
    agree(first, second, (bn, bn2))


@pytest.mark.parametrize("graphed", [True, False])
def test_replays_as_one_graph_or_one_by_one_give_the_bodys_results(graphed, monkeypatch):
    """A conv and batch norm node called step after step on fresh inputs: its replays,
    forward and backward, launch their kernels as one CUDA graph, its nodes' arguments
    set for each (or one by one, with ``GRAPHED`` off); each step's output, gradients and
    statistics are those of the body's path, bit for bit."""
    monkeypatch.setattr(_replay, "GRAPHED", graphed)
    case = CASES[0]
    C, M, K, stride, H, bias, act, residual, math, layout = case
    seed = random.randrange(1 << 30)
    conv, bn = pair(C, M, K, stride, bias, act, seed)
    conv2, bn2 = copy.deepcopy(conv), copy.deepcopy(bn)
    draw = drawing(case, seed, FORMATS[layout])
    _convnorm._forwards.clear()
    for _ in range(6):
        inputs = draw()
        first = run(conv, bn, *inputs, False)
        monkeypatch.setattr(_replay, "ENABLED", False)
        second = run(conv2, bn2, *inputs, False)
        monkeypatch.setattr(_replay, "ENABLED", True)
        agree(first, second, (bn, bn2))
    (record,) = _convnorm._forwards.values()
    (after,) = record.after.values()
    assert record.replays >= 3 and after.replays >= 3
    if graphed:
        assert (record.graphed, after.graphed) == (record.replays, after.replays)
    else:
        assert record.graphed == after.graphed == 0


def gradients(module, x, dy, bf16):
    """module(x) under autocast (bf16), and the gradients of x and the parameters."""
    x = x.clone().requires_grad_(True)
    with torch.autocast("cuda", torch.bfloat16, enabled=bf16):
        out = module(x)
    out.backward(dy.to(out.dtype))
    return out, x.grad, [p.grad for p in module.parameters()]


CONVS = [  # (C, M, K, stride, groups, bias, math, layout)
    (32, 64, 3, 1, 1, True, "fp32", "nchw"),
    (64, 64, 3, 2, 1, False, "bf16", "nhwc"),
    (48, 96, 1, 1, 1, True, "tf32", "nhwc"),
    (32, 32, 3, 1, 32, False, "bf16", "nhwc"),
]


@pytest.mark.parametrize("case", CONVS, ids=lambda c: "-".join(map(str, c)))
def test_a_replayed_convolution_gives_the_bodys_values_and_gradients(case, monkeypatch):
    """specgen's Conv2d, its node replayed, against a copy whose node runs its body:
    the output and dx equal, dw and db to the last bits of fp32 (atomic sums)."""
    C, M, K, stride, groups, bias, math, layout = case
    torch.backends.cudnn.allow_tf32 = math == "tf32"
    torch.manual_seed(random.randrange(1 << 30))
    conv = sg.Conv2d(C, M, K, stride, K // 2, groups=groups, bias=bias).cuda()
    conv = conv.to(memory_format=FORMATS[layout])
    twin = copy.deepcopy(conv)
    H, bf16 = 12, math == "bf16"
    Ho = (H + 2 * (K // 2) - K) // stride + 1

    def draw():
        x = torch.randn(4, C, H, H, device="cuda").contiguous(memory_format=FORMATS[layout])
        dy = torch.randn(4, M, Ho, Ho, device="cuda")  # cast to y's dtype as it comes
        return x, dy.contiguous(memory_format=FORMATS[layout])

    (y, dx, dws), (y2, dx2, dws2) = replayed(
        monkeypatch,
        _ops._forwards,
        lambda x, dy: gradients(conv, x, dy, bf16),
        lambda x, dy: gradients(twin, x, dy, bf16),
        draw,
    )
    same(y, y2, "y")
    same(dx, dx2, "dx")
    for a, b in zip(dws, dws2):
        summed_alike(a, b, "dw or db")


@pytest.mark.parametrize("act", [None, "relu"])
@pytest.mark.parametrize("math,layout", [("fp32", "nchw"), ("bf16", "nhwc")])
def test_a_replayed_batch_norm_gives_the_bodys_values_and_gradients(math, layout, act, monkeypatch):
    """specgen's BatchNorm2d (and its fused ReLU), its node replayed, against a copy
    whose node runs its body: y, dx, dgamma, dbeta and the running statistics equal."""
    torch.manual_seed(random.randrange(1 << 30))
    bn = sg.BatchNorm2d(48).cuda()
    bn.activation = act
    twin = copy.deepcopy(bn)
    dtype = torch.bfloat16 if math == "bf16" else torch.float32

    def draw():
        x = torch.randn(4, 48, 9, 9, device="cuda").to(dtype)
        x = x.contiguous(memory_format=FORMATS[layout])
        return x, torch.randn_like(x)

    (y, dx, dws), (y2, dx2, dws2) = replayed(
        monkeypatch,
        B._forwards,
        lambda x, dy: gradients(bn, x, dy, False),
        lambda x, dy: gradients(twin, x, dy, False),
        draw,
    )
    for a, b, what in [(y, y2, "y"), (dx, dx2, "dx"), *zip(dws, dws2, ("dgamma", "dbeta"))]:
        same(a, b, what)
    for a, b in zip(bn.buffers(), twin.buffers()):
        same(a, b, "running statistics")


def poison_replays(m) -> None:
    """With monkeypatch ``m``: every tensor a replay allocates starts as NaN (floats
    filled with it, bytes, which packed weights are, with all ones, which read as NaN
    in every float dtype), and so do the buffers it places in the stream's scratch
    (``_replay.arena_at``)."""
    allocate, arena_at = _replay.allocate, _replay.arena_at

    def poisoned(*spec):
        t = allocate(*spec)
        return t.fill_(float("nan") if t.is_floating_point() else 255)

    def poisoned_arena(scratch, start, nbytes, stream):
        at = arena_at(scratch, start, nbytes, stream)
        cupy.cuda.runtime.memsetAsync(at, 255, nbytes, stream)
        return at

    m.setattr(_replay, "allocate", poisoned)
    m.setattr(_replay, "arena_at", poisoned_arena)


def test_a_converted_network_replays_its_nodes_and_trains_as_without(monkeypatch):
    """resnet18, converted (bf16 autocast, channels_last): after warm-up steps each of
    its 20 nodes' forwards and backwards is replayed (the stem's over channels widened
    by a zero fill and a copy, the last block's from a dout it copies), and a step's
    output and every parameter's gradient are those of the same network with replay
    off, bit for bit (but the convolutions' dw, as above)."""
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(random.randrange(1 << 30))
    model = sg.convert(torchvision.models.resnet18(num_classes=10)).cuda()
    model = model.to(memory_format=torch.channels_last)
    twin = copy.deepcopy(model)
    convs = {id(c.weight) for c in model.modules() if isinstance(c, torch.nn.Conv2d)}

    monkeypatch.setattr(_chain, "ENABLED", False)  # each pair a node (test_chain.py: chains)

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
    assert all(isinstance(a, _replay.Record) for a in afters), [a.why for a in afters]
    counts = [r.replays for r in records], [a.replays for a in afters]
    poison_replays(monkeypatch)
    x = torch.randn(8, 3, 32, 32, device="cuda").contiguous(memory_format=torch.channels_last)
    out, grads = step(model, x, True)
    out2, grads2 = step(twin, x, False)
    forwards = sum(r.replays for r in records) - sum(counts[0])
    backwards = sum(a.replays for a in afters) - sum(counts[1])
    assert forwards == 20 and backwards == len(afters) >= 20, (forwards, backwards)
    same(out, out2, "out")
    for (conv, a), (_, b) in zip(grads, grads2):
        (summed_alike if conv else same)(a, b, "a parameter's gradient")
