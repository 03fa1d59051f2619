"""GPU tier: a ResNet's residual stages as one autograd node (``specgen.torch._chain``).
Skipped without PyTorch, torchvision or a GPU.

The chain's node runs the blocks' pairs' kernels in the blocks' order, so its values,
gradients and running statistics are those of the blocks' own forwards (a node for
each pair) bit for bit: each check trains a converted network beside its copy with
chains off, on the same fresh random inputs, every tensor a replay allocates poisoned
with NaN, and asserts equality (which NaN never passes); but for the convolutions' dw,
whose split sums some wgrad kernels add atomically in an order that varies from run to
run: those agree to fp32's last bits of their largest value.  The pairs' own numbers
are checked against float64 in tests/test_torch.py and tests/test_batchnorm.py."""

import copy
import random

import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fp32_math")]

import specgen.torch as sg  # noqa: E402  (after the skip: it imports torch)
from specgen.torch import _chain, _replay  # noqa: E402
from test_convnorm import FORMATS, nodes_of, same, summed_alike  # noqa: E402
from test_replay import poison_replays  # noqa: E402


def networks(name: str, layout: str):
    """A converted torchvision network of 10 classes on the GPU, with random weights,
    and a copy of it."""
    torch.manual_seed(random.randrange(1 << 30))
    model = sg.convert(getattr(torchvision.models, name)(num_classes=10)).cuda()
    model = model.to(memory_format=FORMATS[layout])
    return model, copy.deepcopy(model)


def stages(model) -> tuple:
    return (model.layer1, model.layer2, model.layer3, model.layer4)


def step(m, x, chained: bool, math: str, monkeypatch, create_graph=False):
    """One training step's output, its autograd nodes, and (whether a convolution's,
    the gradient) for every parameter and x, with chains on or off."""
    monkeypatch.setattr(_chain, "ENABLED", chained)
    m.zero_grad(set_to_none=True)
    x = x.detach().clone().requires_grad_(x.requires_grad)
    with torch.autocast("cuda", torch.bfloat16, enabled=math == "bf16"):
        out = m(x)
    loss = out.float().square().sum()
    if create_graph:  # a gradient penalty: the gradients' own gradients
        params = [p for p in m.parameters() if p.requires_grad]
        grads = torch.autograd.grad(loss, params, create_graph=True)
        loss = sum(g.float().square().sum() for g in grads)
    loss.backward()
    convs = {id(c.weight) for c in m.modules() if isinstance(c, torch.nn.Conv2d)}
    grads = [(id(p) in convs, p.grad) for p in m.parameters()]
    return out, nodes_of(out), grads + [(False, x.grad)]


def agree(found, twin_found, model, twin):
    """Two steps' outputs, gradients and the networks' buffers (running statistics
    and counts) alike, as above."""
    (out, _, grads), (out2, _, grads2) = found, twin_found
    same(out, out2, "out")
    for (conv, a), (_, b) in zip(grads, grads2):
        assert (a is None) == (b is None), "a gradient on one side only"
        if a is not None:
            (summed_alike if conv else same)(a, b, "a gradient")
    for (name, a), (_, b) in zip(model.named_buffers(), twin.named_buffers()):
        same(a.double(), b.double(), name)


def draw(batch: int, image: int, layout: str, grad: bool = False):
    x = torch.randn(batch, 3, image, image, device="cuda")
    return x.contiguous(memory_format=FORMATS[layout]).requires_grad_(grad)


CASES = [  # (network, math, layout, batch, image)
    ("resnet18", "fp32", "nchw", 8, 32),
    ("resnet18", "bf16", "nhwc", 8, 32),
    ("resnet50", "bf16", "nhwc", 4, 64),
    ("resnet34", "tf32", "nhwc", 4, 32),  # layer4's 1x1 maps: cropped windows' weights
]


@pytest.mark.parametrize("case", CASES)
def test_a_chain_trains_a_resnet_as_its_blocks_do(case, monkeypatch):
    """From its second step on, a converted ResNet runs its four stages as one node
    (the stem's pair stays a node of its own), which records its forward and backward
    on the second step and replays them after; every step's output, gradient and
    running statistic is that of the same network with chains off (above)."""
    name, math, layout, batch, image = case
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", math == "tf32")
    model, twin = networks(name, layout)
    for k in range(4):
        if k == 3:
            poison_replays(monkeypatch)
        x = draw(batch, image, layout)
        found = step(model, x, True, math, monkeypatch)
        agree(found, step(twin, x, False, math, monkeypatch), model, twin)
        chains = found[1].count("ChainFunctionBackward")
        assert chains == (0 if k == 0 else 1), (k, chains)
        pairs = found[1].count("ConvNormFunctionBackward")  # the stem's, after the first
        assert pairs == (1 if k else len(_chain.program(stages(model))) + 1), (k, pairs)
    chain = _chain._memos[model].chain
    records = list(chain.records.values())
    assert len(records) == 1
    assert isinstance(records[0], _replay.Record), records[0].why
    assert records[0].replays == 2, records[0].replays
    backward = list(records[0].after.values())
    assert len(backward) == 1
    assert isinstance(backward[0], _replay.Record), backward[0].why
    assert backward[0].replays == 2
    # the gradients that meet are summed by launches, not PyTorch's add; the buffers
    # only launches touch lie in the stream's scratch
    adds = [st for st in backward[0].steps if getattr(st, "func", None) == torch.ops.aten.add.out]
    assert not adds and backward[0].arena > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_sum_of_two_gradients_is_pytorchs_add_bit_for_bit(dtype, monkeypatch):
    """specgen's sum (``_engine.summed``) of fresh random tensors, dense in either
    memory format, of a size whose last 16-byte run is short, gives PyTorch's add bit
    for bit into a tensor of a's strides, its output poisoned first; tensors it does
    not serve (strides unlike, a start off 16 bytes) take PyTorch's add."""
    from specgen.torch import _engine

    n, c = random.randrange(1, 5), random.choice([3, 5, 8, 13])
    fmt = random.choice(list(FORMATS.values()))
    a, b = (torch.randn(n, c, 7, 9, device="cuda").to(dtype, memory_format=fmt) for _ in "ab")
    off = torch.randn(n * c * 63 + 1, device="cuda", dtype=dtype)[1:].view(n, c, 7, 9)
    empty_like = torch.empty_like
    monkeypatch.setattr(torch, "empty_like", lambda t: empty_like(t).fill_(float("nan")))
    out = _engine.summed(a, b)
    moved = _engine.summed(a.contiguous(), off)
    unlike = _engine.summed(a.contiguous(), b.contiguous(memory_format=torch.channels_last))
    monkeypatch.undo()
    assert out.stride() == a.stride()
    same(out, a + b, "a + b")
    same(moved, a.contiguous() + off, "a + b off 16 bytes")
    same(unlike, a + b, "a + b of unlike strides")


def test_frozen_stages_and_an_input_that_wants_its_gradient(monkeypatch):
    """A chain whose first stage's parameters want no gradient, and an x that wants
    its own: the gradients of x and of every parameter that wants one are the
    blocks' own, and a frozen parameter gets none."""
    model, twin = networks("resnet18", "nchw")
    for m in (model, twin):
        for p in m.layer1.parameters():
            p.requires_grad_(False)
    for _ in range(3):
        x = draw(4, 32, "nchw", grad=True)
        found = step(model, x, True, "fp32", monkeypatch)
        agree(found, step(twin, x, False, "fp32", monkeypatch), model, twin)
    assert found[1].count("ChainFunctionBackward") == 1
    assert all(p.grad is None for p in model.layer1.parameters())
    assert found[2][-1][1] is not None  # x's


def test_a_new_batch_a_hook_and_eval_mode_leave_the_chain(monkeypatch):
    """A call that reads otherwise than the chain's last runs the blocks' forwards
    (a new batch size: then the chain again, for it); a hook on a block is called
    every call, and eval mode runs PyTorch's batch norm: both on the blocks' path."""
    model, twin = networks("resnet18", "nhwc")
    for batch in (4, 4, 6, 6, 6):
        x = draw(batch, 32, "nhwc")
        found = step(model, x, True, "bf16", monkeypatch)
        agree(found, step(twin, x, False, "bf16", monkeypatch), model, twin)
    assert found[1].count("ChainFunctionBackward") == 1
    seen = []
    handle = model.layer3[1].register_forward_hook(lambda *args: seen.append(1))
    for _ in range(2):
        x = draw(6, 32, "nhwc")
        found = step(model, x, True, "bf16", monkeypatch)
        agree(found, step(twin, x, False, "bf16", monkeypatch), model, twin)
        assert "ChainFunctionBackward" not in found[1]
    assert len(seen) == 2
    handle.remove()
    model.eval(), twin.eval()
    x = draw(6, 32, "nhwc")
    with torch.no_grad():
        same(model(x), twin(x), "eval out")


def test_a_gradient_of_the_chains_gradients(monkeypatch):
    """A gradient penalty (the parameters' gradients, differentiated again) through a
    chain: its node recomputes the pairs by differentiable ops, as each pair's node
    does, so the two agree to fp32's rounding of the recomputation, not bit for bit."""
    model, twin = networks("resnet18", "nchw")
    for _ in range(3):
        x = draw(2, 32, "nchw")
        found = step(model, x, True, "fp32", monkeypatch, create_graph=True)
        twin_found = step(twin, x, False, "fp32", monkeypatch, create_graph=True)
    assert found[1].count("ChainFunctionBackward") == 1
    for (_, a), (_, b) in zip(found[2], twin_found[2]):
        if a is None:
            assert b is None
            continue
        assert torch.isfinite(a).all()
        scale = b.double().abs().max()
        assert (a.double() - b.double()).abs().max() <= 1e-3 * scale


def test_a_training_step_with_a_chain_captured_as_a_cuda_graph(monkeypatch):
    """A step whose chain runs its node's body while a CUDA graph is captured (no
    replay records then), replayed on a new input, gives the output, gradients and
    running statistics of the same network's eager step with chains off (above)."""
    model, twin = networks("resnet18", "nhwc")
    static_x = draw(4, 32, "nhwc")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):  # the chain's memo and records, on the side stream
            step(model, static_x, True, "bf16", monkeypatch)
    torch.cuda.current_stream().wait_stream(side)
    model.zero_grad(set_to_none=False)  # gradients the graph adds into, in place
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        with torch.autocast("cuda", torch.bfloat16):
            static_out = model(static_x)
        static_out.float().square().sum().backward()
    x = draw(4, 32, "nhwc")
    static_x.copy_(x)
    with torch.no_grad():
        for p in model.parameters():
            p.grad.zero_()
        for a, b in zip(model.buffers(), twin.buffers()):
            a.copy_(b)  # the running statistics as the twin's before its step
    graph.replay()
    out, _, grads = step(twin, x, False, "bf16", monkeypatch)
    grads = grads[:-1]  # x's
    found = (static_out, [], [(c, p.grad) for p, (c, _) in zip(model.parameters(), grads)])
    agree(found, (out, [], grads), model, twin)
