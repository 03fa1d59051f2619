"""GPU tier: a convolution and the batch norm after it as one autograd node
(``specgen.torch._convnorm``).  Skipped without PyTorch or without a GPU.

The node runs the two modules' kernels in their order, so its values and gradients are
the two nodes' bit for bit: each check runs both on the same fresh random inputs, with
every tensor the kernels write poisoned with NaN before the launch, and asserts
equality (which NaN never passes); but for the convolutions' dw and db, whose split
sums some wgrad kernels add atomically, in an order that varies from run to run: those
agree to fp32's last bits of their largest value.  The two nodes' own numbers are checked against
float64 in tests/test_torch.py and tests/test_batchnorm.py; the gradient of a gradient,
which the node computes another way, is checked against float64 here."""

import copy
import random

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fp32_math")]

import specgen.torch as sg  # noqa: E402  (after the skip: it imports torch)
from specgen.torch import _batchnorm as B  # noqa: E402
from specgen.torch import _convnorm  # noqa: E402
from specgen.torch import _engine as E  # noqa: E402
from specgen.torch._convnorm import conv_norm  # noqa: E402

FORMATS = {"nchw": torch.contiguous_format, "nhwc": torch.channels_last}


@pytest.fixture(autouse=True)
def poisoned(monkeypatch):
    """Every tensor the convolution's and the batch norm's kernels write starts as NaN."""
    real, real_b, real_like = E.empty, B.empty, B.empty_like

    def nan_filled(size, like, layout, dtype=None):
        return real(size, like, layout, dtype).fill_(float("nan"))

    monkeypatch.setattr(E, "empty", nan_filled)
    monkeypatch.setattr(B, "empty", lambda n, like: real_b(n, like).fill_(float("nan")))
    monkeypatch.setattr(B, "empty_like", lambda x: real_like(x).fill_(float("nan")))


def pair(C, M, K, stride, bias, act, seed):
    """specgen's Conv2d and BatchNorm2d (its activation ``act``), on the GPU, with
    random weights and running statistics."""
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


def run(conv, bn, x, r, dy, fused: bool, bf16: bool):
    """The output, and the gradients of x, r and every parameter, from the one node
    (``fused``) or the two modules called in turn."""
    x, r = x.clone().requires_grad_(True), None if r is None else r.clone().requires_grad_(True)
    with torch.autocast("cuda", torch.bfloat16, enabled=bf16):
        out = conv_norm(conv, bn, x, r) if fused else bn(conv(x), r)
    kind = type(out.grad_fn).__name__
    out.backward(dy.to(out.dtype))
    grads = [x.grad, None if r is None else r.grad, *(p.grad for p in bn.parameters())]
    return out, kind, grads, [p.grad for p in conv.parameters()]


def same(a, b, what):
    """Equal, and finite."""
    assert torch.isfinite(a).all(), f"{what}: NaN or Inf"
    assert torch.equal(a, b), f"{what}: {(a.double() - b.double()).abs().max().item():.3g} apart"


def summed_alike(a, b, what):
    """Finite, and within fp32's last bits of the largest value: sums of the same
    terms, added in either order (a wgrad's atomic adds)."""
    assert torch.isfinite(a).all(), f"{what}: NaN or Inf"
    assert (a.double() - b.double()).abs().max() <= 2.0**-18 * b.double().abs().max(), what


CASES = [  # (C, M, K, stride, H, bias, act, residual, math, layout): each a draw of its own
    (64, 64, 3, 1, 14, False, "relu", True, "fp32", "nchw"),
    (64, 128, 3, 2, 14, False, "relu", False, "bf16", "nhwc"),
    (128, 256, 1, 2, 8, False, None, False, "tf32", "nhwc"),
    (32, 96, 1, 1, 9, True, "relu6", False, "fp32", "nhwc"),
    (24, 144, 1, 1, 7, False, None, True, "bf16", "nchw"),
    (3, 64, 7, 2, 32, False, "relu", False, "fp32", "nchw"),
]


def drawing(case, seed, dy_format=None):
    """A function of no arguments that draws fresh (x, r, dy) for a case's pair (r
    None where it adds no shortcut; dy as ``.to`` leaves it, or in ``dy_format``)."""
    C, M, K, stride, H, bias, act, residual, math, layout = case
    g = torch.Generator(device="cuda").manual_seed(seed)
    Ho = (H + 2 * (K // 2) - K) // stride + 1
    dtype = torch.bfloat16 if math == "bf16" else torch.float32
    shape = (4, M, Ho, Ho)

    def draw():
        x = torch.randn(4, C, H, H, device="cuda", generator=g)
        x = x.contiguous(memory_format=FORMATS[layout])
        dy = torch.randn(shape, device="cuda", generator=g).to(dtype)
        if dy_format is not None:
            dy = dy.contiguous(memory_format=dy_format)
        r = None
        if residual:
            r = torch.randn(shape, device="cuda", generator=g).to(dtype)
            r = r.contiguous(memory_format=FORMATS[layout])
        return x, r, dy

    return draw


def agree(first, second, bns):
    """Two calls' (output, gradients of x, r, gamma and beta, of w and b) equal, and
    their batch norms' statistics (``bns``, the two modules)."""
    (one, grads, dws), (two, grads2, dws2) = first, second
    same(one, two, "out")
    assert one.stride() == two.stride()
    for a, b, what in zip(grads, grads2, ("dx", "dr", "dgamma", "dbeta")):
        assert (a is None) == (b is None), what
        if a is not None:
            same(a, b, what)
    for a, b, what in zip(dws, dws2, ("dw", "db")):
        summed_alike(a, b, what)
    for a, b in zip(bns[0].buffers(), bns[1].buffers()):
        same(a, b, "running statistics")


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(map(str, c)))
def test_one_node_gives_the_two_modules_values_and_gradients_bit_for_bit(case):
    """conv_norm's one node (its grad_fn) against the same modules called in turn, on
    copies of the same modules: the output, the gradients of x, of the shortcut and of
    every parameter, the running statistics and the batch count, all equal."""
    C, M, K, stride, H, bias, act, residual, math, layout = case
    torch.backends.cudnn.allow_tf32 = math == "tf32"
    seed = random.randrange(1 << 30)
    conv, bn = pair(C, M, K, stride, bias, act, seed)
    conv2, bn2 = copy.deepcopy(conv), copy.deepcopy(bn)
    x, r, dy = drawing(case, seed)()
    one, kind, *first = run(conv, bn, x, r, dy, True, math == "bf16")
    two, kind2, *second = run(conv2, bn2, x, r, dy, False, math == "bf16")
    assert kind == "ConvNormFunctionBackward" and kind2 == "BatchNormFunctionBackward"
    agree((one, *first), (two, *second), (bn, bn2))
    assert int(bn.num_batches_tracked) == 1


def test_a_gradient_of_a_gradient_through_the_node_matches_float64():
    """create_graph through conv, batch norm, the shortcut and the ReLU as one node:
    the gradients of x, the shortcut, the weights, the convolution's bias and the batch
    norm's parameters differentiate again, as float64's do (fp32, fresh draws)."""
    conv, bn = pair(16, 32, 3, 1, True, "relu", random.randrange(1 << 30))
    x = torch.randn(4, 16, 6, 6, device="cuda").contiguous(memory_format=torch.channels_last)
    r = torch.randn(4, 32, 6, 6, device="cuda").contiguous(memory_format=torch.channels_last)
    dy = torch.randn(4, 32, 6, 6, device="cuda")
    params = [conv.weight, conv.bias, bn.weight, bn.bias]
    x64, r64 = (t.double().requires_grad_(True) for t in (x, r))
    p64 = [p.detach().double().requires_grad_(True) for p in params]
    y64 = F.conv2d(x64, p64[0], p64[1], padding=1)
    out64 = torch.relu(F.batch_norm(y64, None, None, p64[2], p64[3], True) + r64)
    wrt64 = [x64, r64, *p64]
    grads64 = torch.autograd.grad(out64, wrt64, dy.double(), create_graph=True)
    want = torch.autograd.grad(sum(g.square().sum() for g in grads64), [x64, *p64[:3]])
    x, r = x.requires_grad_(True), r.requires_grad_(True)
    out = conv_norm(conv, bn, x, r)
    assert type(out.grad_fn).__name__ == "ConvNormFunctionBackward"
    grads = torch.autograd.grad(out, [x, r, *params], dy, create_graph=True)
    for g, w, what in zip(grads, grads64, ("x", "r", "w", "b", "gamma", "beta")):
        assert torch.isfinite(g).all()
        assert (g.double() - w).abs().max() <= 1e-4 * (1 + w.abs().max()), what
    got = torch.autograd.grad(sum(g.square().sum() for g in grads), [x, *params[:3]])
    # the bias moves no output of the batch norm: float64's derivative is 0 up to its
    # rounding, fp32's that of sums of terms as large as the other derivatives' values
    scale = 1 + max(w.abs().max() for w in want)
    for g, w, what in zip(got, want, ("x", "w", "b", "gamma")):
        assert torch.isfinite(g).all()
        assert (g.double() - w).abs().max() <= 1e-3 * scale, f"d/d{what}"


def test_a_pair_called_again_takes_its_remembered_lookups_and_sees_a_change(monkeypatch):
    """A second call of the same modules on x of the same form finds the first call's
    lookups (it looks up no layer) and gives the two modules' values and gradients;
    after a change the lookups depend on (eps, channels_last weights) the next call
    looks up again, and with momentum None (1 added to the count each call) every
    call does; each gives the two modules' results."""
    case = (32, 48, 3, 1, 10, False, "relu", False, "fp32", "nchw")
    seed = random.randrange(1 << 30)
    conv, bn = pair(*case[:4], case[5], case[6], seed)
    conv2, bn2 = copy.deepcopy(conv), copy.deepcopy(bn)
    draw = drawing(case, seed)
    looked = []
    real = _convnorm.PACKAGE["eager_layer"]
    monkeypatch.setitem(_convnorm.PACKAGE, "eager_layer", lambda *a: looked.append(1) or real(*a))

    def twice():
        for _ in range(2):
            x, r, dy = draw()
            one = run(conv, bn, x, r, dy, True, False)
            two = run(conv2, bn2, x, r, dy, False, False)
            assert one[1] == "ConvNormFunctionBackward"
            agree(one[:1] + one[2:], two[:1] + two[2:], (bn, bn2))
        return len(looked)

    assert twice() == 1
    bn.eps = bn2.eps = 1e-3
    assert twice() == 2
    conv.to(memory_format=torch.channels_last), conv2.to(memory_format=torch.channels_last)
    assert twice() == 3
    bn.momentum = bn2.momentum = None
    assert twice() == 5


def test_a_hook_or_eval_mode_takes_the_two_modules():
    """A forward hook on the convolution sees its call, and eval mode runs the modules
    as they are: two nodes (or none), not one."""
    conv, bn = pair(8, 16, 3, 1, False, "relu", random.randrange(1 << 30))
    x = torch.randn(2, 8, 5, 5, device="cuda", requires_grad=True)
    seen = []
    handle = conv.register_forward_hook(lambda m, a, out: seen.append(out.shape))
    out = conv_norm(conv, bn, x)
    handle.remove()
    assert seen == [(2, 16, 5, 5)] and type(out.grad_fn).__name__ == "BatchNormFunctionBackward"
    assert type(conv_norm(conv, bn, x).grad_fn).__name__ == "ConvNormFunctionBackward"
    bn.eval()
    with torch.no_grad():
        want = torch.relu(
            F.batch_norm(conv(x), bn.running_mean, bn.running_var, bn.weight, bn.bias)
        )
        assert torch.equal(conv_norm(conv, bn, x), want)


def nodes_of(out) -> list[str]:
    """The names of the autograd nodes that ``out`` was computed through."""
    found, todo, seen = [], [out.grad_fn], set()
    while todo:
        f = todo.pop()
        if f is None or f in seen:
            continue
        seen.add(f)
        found.append(type(f).__name__)
        todo.extend(g for g, _ in f.next_functions)
    return found


@pytest.mark.parametrize("name", ["resnet18", "mobilenet_v2"])
def test_a_converted_network_trains_through_the_nodes_as_through_the_modules(name, monkeypatch):
    """A converted torchvision network takes one node for each convolution and its
    batch norm (resnet18: 20, mobilenet_v2: 52), and its output and every parameter's
    gradient are those of the same network whose pairs run as two modules, bit for bit
    (bf16 autocast, channels_last)."""
    torchvision = pytest.importorskip("torchvision")
    torch.manual_seed(random.randrange(1 << 30))
    model = sg.convert(getattr(torchvision.models, name)(num_classes=10)).cuda()
    model = model.to(memory_format=torch.channels_last)
    twin = copy.deepcopy(model)
    x = torch.randn(8, 3, 32, 32, device="cuda").contiguous(memory_format=torch.channels_last)

    seed = random.randrange(1 << 30)

    def step(m):
        torch.manual_seed(seed)  # the same dropout masks (mobilenet_v2's classifier)
        with torch.autocast("cuda", torch.bfloat16):
            out = m(x)
        nodes = nodes_of(out)
        out.float().square().sum().backward()
        convs = {id(c.weight) for c in m.modules() if isinstance(c, torch.nn.Conv2d)}
        return out, nodes, [(id(p) in convs, p.grad) for p in m.parameters()]

    out, nodes, grads = step(model)
    monkeypatch.setattr(_convnorm, "_bare", lambda *modules: False)  # the two modules' path
    out2, nodes2, grads2 = step(twin)
    assert nodes.count("ConvNormFunctionBackward") == {"resnet18": 20, "mobilenet_v2": 52}[name]
    assert "ConvNormFunctionBackward" not in nodes2
    same(out, out2, "out")
    for (conv, a), (_, b) in zip(grads, grads2):
        (summed_alike if conv else same)(a, b, "a parameter's gradient")
