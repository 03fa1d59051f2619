"""GPU tier: batch norm in training mode on specgen's kernels (``specgen.torch.batch_norm``,
``BatchNorm2d``).  Skipped without PyTorch or without a GPU.

Every check compares with PyTorch's batch norm and autograd on float64 copies of the same
values, on fresh random inputs far from zero (the sums are taken of x minus its first
pixel), with y, dx and the statistics' and gradients' vectors poisoned with NaN before
the launch, so that an unwritten element fails."""

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

torch = pytest.importorskip("torch")
F = torch.nn.functional

pytestmark = pytest.mark.gpu

from specgen.torch import _batchnorm as B  # noqa: E402  (after the skip: it imports torch)
import specgen.torch as sg  # noqa: E402

DT = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
# a stored value's rounding: half an ulp of the output's dtype
UNIT = {"fp32": 2.0**-24, "fp16": 2.0**-11, "bf16": 2.0**-8}
# fp32 sums over the batch: the error of a sum of n terms is at most about its depth
# (the rows a thread adds, the block's rows, the blocks' partial sums) times the unit
# times the sum of the terms' magnitudes; 2**-15 bounds that for the sizes drawn here
SUMS = 2.0**-15


@pytest.fixture(autouse=True)
def poisoned(monkeypatch):
    """Every tensor the kernels write starts as NaN."""
    real_empty, real_like = B.empty, B.empty_like
    monkeypatch.setattr(B, "empty", lambda n, like: real_empty(n, like).fill_(float("nan")))
    monkeypatch.setattr(B, "empty_like", lambda x: real_like(x).fill_(float("nan")))


def inputs(N, C, H, W, dtype, seed, fmt=None):
    """x far from zero (a channel's mean up to 8 of its spreads) in memory format
    ``fmt`` (channels_last by default), and a gradient dy."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    kind = dict(device="cuda", generator=g)
    mean = 8 * torch.randn(1, C, 1, 1, **kind)
    spread = 0.1 + torch.rand(1, C, 1, 1, **kind)
    x = (mean + spread * torch.randn(N, C, H, W, **kind)).to(DT[dtype])
    dy = torch.randn(N, C, H, W, **kind).to(DT[dtype])
    fmt = fmt or torch.channels_last
    return x.contiguous(memory_format=fmt), dy.contiguous(memory_format=fmt)


def close(got, want, bound, what):
    got = got.double()
    assert torch.isfinite(got).all(), f"{what}: NaN or Inf (an element left unwritten?)"
    err = (got - want).abs()
    worst = (err - bound).max().item()
    assert worst <= 0, f"{what}: error {err.max().item():.3g} past its bound by {worst:.3g}"


LAYOUT = {"nhwc": torch.channels_last, "nchw": torch.contiguous_format}


def check(N, C, H, W, dtype, affine, running, momentum, seed, layout="nhwc"):
    x, dy = inputs(N, C, H, W, dtype, seed, LAYOUT[layout])
    g = torch.Generator(device="cuda").manual_seed(seed + 1)
    w = (1 + 0.5 * torch.randn(C, device="cuda", generator=g)) if affine else None
    b = torch.randn(C, device="cuda", generator=g) if affine else None
    rm = torch.randn(C, device="cuda", generator=g) if running else None
    rv = (0.5 + torch.rand(C, device="cuda", generator=g)) if running else None
    copies = [t.double().clone() if t is not None else None for t in (x, w, b, rm, rv)]
    x64, w64, b64, rm64, rv64 = copies
    for t in (x, w, b, x64, w64, b64):
        if t is not None:
            t.requires_grad_(True)
    assert B.kernel_layout(x, w, b, rm, rv, True) == layout or H * W == 1
    y = sg.batch_norm(x, rm, rv, w, b, True, momentum, 1e-5)
    y64 = F.batch_norm(x64, rm64, rv64, w64, b64, True, momentum, 1e-5)
    assert y.dtype is x.dtype and y.stride() == x.stride()
    close(y, y64.detach(), UNIT[dtype] * y64.detach().abs() + 2e-5 * (1 + y64.detach().abs()), "y")
    if running:
        close(rm, rm64, 1e-5 * (rm64.abs() + rv64.sqrt()), "running_mean")
        close(rv, rv64, 1e-5 * rv64.abs() + 1e-6, "running_var")
    y.backward(dy)
    y64.backward(dy.double())
    dx64 = x64.grad
    close(x.grad, dx64, UNIT[dtype] * dx64.abs() + 1e-4 * dx64.abs().max(), "dx")
    if affine:
        var, mean = torch.var_mean(x64.detach(), (0, 2, 3), correction=0, keepdim=True)
        xhat = (x64.detach() - mean) / (var + 1e-5).sqrt()
        terms = (dy.double() * xhat).abs().sum((0, 2, 3)) + dy.double().abs().sum((0, 2, 3))
        close(w.grad, w64.grad, SUMS * terms, "dgamma")
        close(b.grad, b64.grad, SUMS * terms, "dbeta")


SIZES = [  # (N, C, H, W): resnet50's widths and a stem's, lanes that are not 32, one pixel
    (32, 64, 28, 28),
    (8, 2048, 7, 7),
    (4, 96, 9, 11),
    (3, 144, 5, 5),
    (64, 24, 1, 1),
    (2, 8, 1, 3),
]


@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("size", SIZES, ids=lambda s: "x".join(map(str, s)))
def test_batch_norm_matches_float64(size, dtype, layout):
    check(*size, dtype, True, True, 0.1, seed=hash(size) % 1000, layout=layout)


@settings(
    max_examples=12,
    deadline=None,
    phases=[Phase.generate],
    suppress_health_check=list(HealthCheck),
)
@given(
    N=st.integers(1, 9),
    lanes=st.integers(1, 80),
    H=st.integers(1, 13),
    W=st.integers(1, 13),
    dtype=st.sampled_from(["bf16", "fp16", "fp32"]),
    affine=st.booleans(),
    running=st.booleans(),
    momentum=st.sampled_from([0.1, 0.01, 0.5]),
    seed=st.integers(0, 10**6),
    odd=st.integers(0, 7),
)
def test_drawn_batch_norms_match_float64(
    N, lanes, H, W, dtype, affine, running, momentum, seed, odd
):
    """channels_last where a 16-byte copy divides the channels, else NCHW (any count)."""
    C = lanes * (4 if dtype == "fp32" else 8) + odd
    if N * H * W < 2:
        N = 2
    layout = "nchw" if odd else "nhwc"
    check(N, C, H, W, dtype, affine, running, momentum, seed, layout)


@pytest.mark.parametrize("momentum", [None, 0.1])
def test_the_module_runs_our_kernels_in_training_and_pytorchs_elsewhere(momentum):
    """BatchNorm2d in training mode updates num_batches_tracked and the running stats as
    PyTorch's does, in either memory format (the finalize kernel counts the batch), on
    the cumulative average too (momentum None); in eval mode and on tensors dense in
    neither memory format it is PyTorch's batch norm, bit for bit."""
    torch.manual_seed(0)
    ref = torch.nn.BatchNorm2d(64, momentum=momentum).cuda()
    ours = sg.convert(torch.nn.Sequential(torch.nn.BatchNorm2d(64, momentum=momentum).cuda()))[0]
    assert type(ours) is sg.BatchNorm2d
    for step in range(3):
        form = torch.contiguous_format if step == 1 else torch.channels_last
        x = (3 + torch.randn(8, 64, 6, 6, device="cuda")).contiguous(memory_format=form)
        want = ref(x).double()
        close(ours(x), want, 1e-5 * (1 + want.abs()), f"y, step {step}")
    assert ours.num_batches_tracked.dtype is torch.int64
    assert int(ours.num_batches_tracked) == int(ref.num_batches_tracked) == 3
    close(ours.running_mean, ref.running_mean.double(), 1e-5, "running_mean")
    close(ours.running_var, ref.running_var.double(), 1e-5, "running_var")
    x = torch.randn(4, 64, 5, 5, device="cuda")[:, :, 1:]  # dense in neither format
    assert (
        B.kernel_layout(x, ours.weight, ours.bias, ours.running_mean, ours.running_var, True)
        is None
    )
    ref.load_state_dict(ours.state_dict())  # eval reads the running stats: the same ones
    ours.eval(), ref.eval()
    xl = x.contiguous(memory_format=torch.channels_last)
    assert torch.equal(ours(xl), ref(xl)) and torch.equal(ours(x), ref(x))
    ours.train(), ref.train()
    assert torch.equal(ours(x), ref(x))  # training, but not dense: PyTorch's
    assert int(ours.num_batches_tracked) == int(ref.num_batches_tracked) == 4


def test_a_captured_step_replays_with_new_inputs():
    """Forward and backward captured as a CUDA graph: each replay computes from the
    values in its inputs then."""
    layer = sg.BatchNorm2d(128).cuda()
    x = torch.randn(16, 128, 7, 7, device="cuda").contiguous(memory_format=torch.channels_last)
    x.requires_grad_(True)
    for _ in range(2):  # kernels compiled and loaded before the capture
        layer(x).square().sum().backward()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = layer(x)
        y.square().sum().backward()
    for seed in (1, 2):
        with torch.no_grad():
            x.copy_(torch.randn(x.shape, generator=torch.Generator().manual_seed(seed)) * 2 + 1)
        graph.replay()
        w, b = layer.weight.double(), layer.bias.double()
        want = F.batch_norm(x.detach().double(), None, None, w, b, True)
        close(y, want, 1e-5 * (1 + want.abs()), f"replay {seed}")


@pytest.mark.parametrize(
    "fmt", [torch.channels_last, torch.contiguous_format], ids=["nhwc", "nchw"]
)
def test_a_gradient_of_a_gradient_matches_float64(fmt):
    """A backward with create_graph (a gradient penalty) gives gradients that autograd
    differentiates again: dx's square summed, differentiated in x and the weights."""
    x, dy = inputs(4, 32, 5, 5, "fp32", seed=7, fmt=fmt)
    layer = sg.BatchNorm2d(32).cuda()
    with torch.no_grad():
        layer.weight.uniform_(0.5, 1.5)
    x64, w64 = x.double().requires_grad_(True), layer.weight.detach().double().requires_grad_(True)
    y64 = F.batch_norm(x64, None, None, w64, None, True)
    (dx64,) = torch.autograd.grad(y64, x64, dy.double(), create_graph=True)
    want = torch.autograd.grad(dx64.square().sum(), [x64, w64])
    x.requires_grad_(True)
    (dx,) = torch.autograd.grad(layer(x), x, dy, create_graph=True)
    assert dx.grad_fn is not None, "dx is not differentiable"
    got = torch.autograd.grad(dx.square().sum(), [x, layer.weight])
    for g, w, what in zip(got, want, ("x", "weight")):
        close(g, w, 1e-4 * w.abs().max().item(), f"d(penalty)/d{what}")


ACT64 = {None: lambda v: v, "relu": torch.relu, "relu6": lambda v: v.clamp(0, 6)}


@pytest.mark.parametrize("layout", ["nhwc", "nchw"])
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("act,residual", [("relu", False), ("relu6", False), ("relu", True), (None, True)])  # fmt: skip
def test_fused_activation_and_residual_match_float64(layout, dtype, act, residual):
    """y = act(batch norm of x + r) from one kernel; the backward's dy gated by the
    stored y as PyTorch's in-place activation gates it (the float64 reference takes the
    same gate, which agrees with float64's own but where the value is within a
    rounding of the activation's edges), and r's gradient the gated dy."""
    N, C, H, W = 8, 64, 9, 9
    fmt = LAYOUT[layout]
    x, dy = inputs(N, C, H, W, dtype, 11, fmt)
    g = torch.Generator(device="cuda").manual_seed(12)
    w = 1 + 0.5 * torch.randn(C, device="cuda", generator=g)
    b = 2 * torch.randn(C, device="cuda", generator=g)  # relu6 cuts at both ends
    rm, rv = torch.zeros(C, device="cuda"), torch.ones(C, device="cuda")
    shape = dict(device="cuda", generator=g)
    r = torch.randn(N, C, H, W, **shape).to(DT[dtype]).contiguous(memory_format=fmt)
    x64, w64, b64, r64 = (t.double().clone().requires_grad_(True) for t in (x, w, b, r))
    for t in (x, w, b, r):
        t.requires_grad_(True)
    y = sg.batch_norm(
        x, rm, rv, w, b, True, 0.1, 1e-5, residual=r if residual else None, activation=act
    )
    assert y.stride() == x.stride()
    pre64 = F.batch_norm(x64, None, None, w64, b64, True, 0.1, 1e-5) + (r64 if residual else 0)
    y64 = ACT64[act](pre64)
    close(y, y64.detach(), UNIT[dtype] * y64.detach().abs() + 2e-5 * (1 + y64.detach().abs()), "y")
    y.backward(dy)
    if act:  # the gate from our stored y; where float64's differs, the value is at an edge
        yd = y.detach().double()
        gate = (yd > 0) & (yd < 6) if act == "relu6" else yd > 0
        edge = pre64.detach().abs().clamp_max((pre64.detach() - 6).abs())
        own = (pre64 > 0) & (pre64 < 6) if act == "relu6" else pre64 > 0
        assert (edge[gate != own] <= 2 * UNIT[dtype] * 6 + 1e-4).all()
        g64 = dy.double() * gate
    else:
        g64 = dy.double()
    pre64.backward(g64)
    close(x.grad, x64.grad, UNIT[dtype] * x64.grad.abs() + 1e-4 * x64.grad.abs().max(), "dx")
    var, mean = torch.var_mean(x64.detach(), (0, 2, 3), correction=0, keepdim=True)
    xhat = (x64.detach() - mean) / (var + 1e-5).sqrt()
    terms = (g64 * xhat).abs().sum((0, 2, 3)) + g64.abs().sum((0, 2, 3))
    close(w.grad, w64.grad, SUMS * terms, "dgamma")
    close(b.grad, b64.grad, SUMS * terms, "dbeta")
    if residual:
        close(r.grad, r64.grad, UNIT[dtype] * r64.grad.abs(), "dr")
    else:
        assert r.grad is None


def test_a_fused_gradient_of_a_gradient_matches_float64():
    """create_graph through batch norm with the shortcut added and the ReLU applied:
    dx and dr differentiate again, as PyTorch's unfused ops do (fp32, fixed draws)."""
    x, dy = inputs(4, 32, 5, 5, "fp32", seed=9)
    r = torch.randn_like(x)
    w = torch.rand(32, device="cuda") + 0.5
    x64, w64, r64 = (t.double().requires_grad_(True) for t in (x, w, r))
    pre64 = F.batch_norm(x64, None, None, w64, None, True) + r64
    grads64 = torch.autograd.grad(torch.relu(pre64), (x64, r64), dy.double(), create_graph=True)
    want = torch.autograd.grad(sum(g.square().sum() for g in grads64), (x64, w64))
    x, w, r = (t.requires_grad_(True) for t in (x, w, r))
    b = torch.zeros(32, device="cuda")
    assert B.kernel_layout(x, w, b, None, None, True) == "nhwc"  # our kernels, not PyTorch's
    y = sg.batch_norm(x, None, None, w, b, True, residual=r, activation="relu")
    grads = torch.autograd.grad(y, (x, r), dy, create_graph=True)
    got = torch.autograd.grad(sum(g.square().sum() for g in grads), (x, w))
    for g, w_, what in zip(got, want, ("x", "weight")):
        close(g, w_, 1e-4 * w_.abs().max().item(), f"d(penalty)/d{what}")


def test_a_densenet_whose_batch_norms_apply_its_relus_trains_as_unfused():
    """A small DenseNet converted (bf16 autocast, channels_last): each layer's two batch
    norms apply the ReLU after them, and its output and every gradient are those of the
    same model converted without fusing, bit for bit (but the convolutions' dw, whose
    split sums some wgrad kernels add atomically: to fp32's last bits)."""
    torchvision = pytest.importorskip("torchvision")
    import copy
    import random

    from test_convnorm import same, summed_alike

    torch.manual_seed(random.randrange(1 << 30))
    base = torchvision.models.DenseNet(8, (2, 2), 16, bn_size=2, num_classes=10)
    fused = sg.convert(copy.deepcopy(base)).cuda().to(memory_format=torch.channels_last)
    plain = sg.convert(copy.deepcopy(base), fuse=False).cuda()
    plain = plain.to(memory_format=torch.channels_last)
    relus = [m for m in fused.modules() if isinstance(m, sg.BatchNorm2d) and m.activation]
    assert len(relus) == 2 * 4 + 2  # the 4 layers', the stem's and the transition's
    x = torch.randn(8, 3, 32, 32, device="cuda").contiguous(memory_format=torch.channels_last)
    for _ in range(2):  # a second step: the nodes replayed
        grads = []
        for m in (fused, plain):
            m.zero_grad(set_to_none=True)
            with torch.autocast("cuda", torch.bfloat16):
                out = m(x)
            out.float().square().sum().backward()
            grads.append((out, [(n, p.grad) for n, p in m.named_parameters()]))
        (one, a), (two, b) = grads
        same(one, two, "out")
        for (name, g), (_, h) in zip(a, b):
            (summed_alike if "conv" in name else same)(g, h, name)
