"""GPU tier: specgen's convolution as a PyTorch operator.  Skipped without PyTorch or
without a GPU.

Every numerical check compares with PyTorch's own convolution and autograd on float64
copies of the same values, within the error bound of the kernel that specgen chose for
the problem (``verify.tolerance``), on fresh random inputs, with the output's memory
poisoned with NaN before the call so that an unwritten element fails."""

import subprocess
import sys
from dataclasses import replace
from types import SimpleNamespace

import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

from problems import problem_specs
from specgen.errors import SpecError
from specgen.shapes import Act, ConvProblem, Op, TensorLayout
from specgen.verify import tolerance

torch = pytest.importorskip("torch")
F = torch.nn.functional

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("fp32_math")]

from specgen.torch import _engine as E  # noqa: E402  (after the skip: it imports torch)
import specgen.torch as sg  # noqa: E402

DT = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def kernel(p: ConvProblem):
    """The kernel the operator runs for ``p``, in the layout it computes it in."""
    index = torch.cuda.current_device()
    p = E.computed(p, index, torch.backends.cudnn.allow_tf32)
    return E.kernel_for(p, torch.device("cuda", index))


@pytest.fixture(autouse=True)
def poisoned(monkeypatch):
    """Every output the operator allocates starts as NaN, so an unwritten element fails."""
    real = E.empty

    def nan_filled(size, like, layout, dtype=None):
        return real(size, like, layout, dtype).fill_(float("nan"))

    monkeypatch.setattr(E, "empty", nan_filled)


def check(out, ref, mag, plan, batch, largest, max_w, what):
    gamma, absolute = tolerance(plan, batch, largest, max_w)
    out = out.double()
    assert torch.isfinite(out).all(), f"{what}: NaN or Inf (an element left unwritten?)"
    err = (out - ref).abs()
    bound = gamma * mag + absolute + 1e-30
    ratio = float((err / bound).max()) if err.numel() else 0.0
    assert ratio <= 1.0, f"{what}: error {ratio:.2f}x its bound ({plan.name})"


def torch_args(p: ConvProblem):
    """PyTorch's padding argument for the problem: 'same' where its pads are those."""
    pt, pb, pl, pr = p.pads
    if (pt, pl) == (pb, pr):
        return (pt, pl)
    return "same"


@st.composite
def torch_problems(draw):
    """Drawn problems (stride, dilation, groups, windows, dtypes, layouts) whose padding
    PyTorch's conv2d can spell: symmetric, or 'same'."""
    p = draw(problem_specs(largest=14))
    p = replace(p, act=Act.NONE)
    pt, pb, pl, pr = p.pads
    if (pt, pl) != (pb, pr):
        same = [d * (k - 1) for d, k in zip(p.dil, (p.R, p.S))]
        if not (p.stride == (1, 1) and [pt + pb, pl + pr] == same and pt == same[0] // 2):
            try:
                p = replace(p, pads=(pt, pt, pl, pl))
            except SpecError:
                assume(False)
    return p


def tensors(p: ConvProblem, batch: int, grad: bool):
    dt = DT[p.dtype.value]
    x = torch.randn(batch, p.C, p.H, p.W, device="cuda").to(dt)
    if p.layout is TensorLayout.NHWC:
        x = x.contiguous(memory_format=torch.channels_last)
    w = (torch.randn(p.M, p.Cg, p.R, p.S, device="cuda") / p.reduction**0.5).to(dt)
    b = (torch.randn(p.M, device="cuda") * 0.5).to(dt) if p.bias else None
    for t in (x, w, b):
        if t is not None:
            t.requires_grad_(grad)
    return x, w, b


SETTINGS = dict(
    max_examples=12,
    deadline=None,
    suppress_health_check=list(HealthCheck),
    phases=(Phase.explicit, Phase.reuse, Phase.generate),
)


@settings(**SETTINGS)
@given(p=torch_problems(), batch=st.integers(1, 3))
def test_forward_matches_pytorch_in_float64(p, batch):
    x, w, b = tensors(p, batch, grad=False)
    p = replace(p, layout=E.layout_of(x))  # as the operator reads x (C=1: either order)
    pad = torch_args(p)
    ref = F.conv2d(
        x.double(), w.double(), None if b is None else b.double(), p.stride, pad, p.dil, p.groups
    )
    mag = F.conv2d(x.double().abs(), w.double().abs(), None, p.stride, pad, p.dil, p.groups)
    if b is not None:
        mag += b.double().abs()[None, :, None, None]
    y = sg.conv2d(x, w, b, p.stride, pad, p.dil, p.groups)
    assert y.dtype == x.dtype and y.shape == ref.shape
    # PyTorch's memory format, as its convolution gives it in the tensors' own dtype
    # (its float64 path for dilated problems returns contiguous y whatever x is).
    own = F.conv2d(x, w, b, p.stride, pad, p.dil, p.groups)
    for fmt in (torch.contiguous_format, torch.channels_last):
        assert y.is_contiguous(memory_format=fmt) == own.is_contiguous(memory_format=fmt)
    torch.cuda.synchronize()
    plan = kernel(p).conv.plan
    check(y, ref, mag, plan, batch, float(x.abs().max()), float(w.abs().max()), "y")


@settings(**SETTINGS)
@given(p=torch_problems(), batch=st.integers(1, 3))
def test_gradients_match_pytorch_autograd_in_float64(p, batch):
    x, w, b = tensors(p, batch, grad=True)
    p = replace(p, layout=E.layout_of(x))  # as the operator reads x (C=1: either order)
    pad = torch_args(p)
    y = sg.conv2d(x, w, b, p.stride, pad, p.dil, p.groups)
    dy = torch.randn_like(y)
    leaves = [x, w] + ([b] if b is not None else [])
    doubles = [t.detach().double().requires_grad_() for t in leaves]
    ref_y = F.conv2d(
        doubles[0],
        doubles[1],
        doubles[2] if b is not None else None,
        p.stride,
        pad,
        p.dil,
        p.groups,
    )
    refs = torch.autograd.grad(ref_y, doubles, dy.double())
    # The sums of the terms' magnitudes: the same gradients of |x|, |w| and |dy|.
    absd = [t.detach().abs().requires_grad_() for t in doubles[:2]]
    mags = torch.autograd.grad(
        F.conv2d(absd[0], absd[1], None, p.stride, pad, p.dil, p.groups), absd, dy.double().abs()
    )
    db_mag = dy.double().abs().sum((0, 2, 3))
    grads = torch.autograd.grad(y, leaves, dy)
    torch.cuda.synchronize()
    largest = max(float(x.abs().max()), float(dy.abs().max()))
    dgrad = kernel(p.with_op(Op.DGRAD)).conv.plan
    check(grads[0], refs[0], mags[0], dgrad, batch, largest, float(w.abs().max()), "dx")
    wgrad = kernel(p.with_op(Op.WGRAD)).conv.plan
    check(grads[1], refs[1], mags[1], wgrad, batch, largest, 0.0, "dw")
    if b is not None:
        check(grads[2], refs[2], db_mag, wgrad, batch, largest, 0.0, "db")
    for g, t in zip(grads, leaves):
        assert g.dtype == t.dtype and g.shape == t.shape


def test_bias_alone_and_input_alone():
    """Each gradient is computed only where asked: db from bgrad, dx from dgrad alone."""
    p = ConvProblem(C=5, M=7, H=12, W=10, R=3, S=3, pads=(1, 1, 1, 1), bias=True)
    x, w, b = tensors(p, 2, grad=False)
    b.requires_grad_()
    y = sg.conv2d(x, w, b, 1, 1)
    (db,) = torch.autograd.grad(y, [b], torch.ones_like(y))
    torch.testing.assert_close(db, torch.full_like(db, 2 * 12 * 10), rtol=1e-6, atol=0)
    x.requires_grad_()
    y = sg.conv2d(x, w, b, 1, 1)
    dy = torch.randn_like(y)
    (dx,) = torch.autograd.grad(y, [x], dy)
    ref = torch.nn.grad.conv2d_input(x.shape, w.double(), dy.double(), 1, 1)
    torch.testing.assert_close(dx.double(), ref, rtol=1e-4, atol=1e-4)


def test_unbatched_input_and_the_padding_forms():
    x = torch.randn(3, 11, 9, device="cuda")
    w = torch.randn(4, 3, 2, 3, device="cuda")
    for pad in (0, 1, (2, 1), "same", "valid"):
        ref = F.conv2d(x.double(), w.double(), padding=pad)
        got = sg.conv2d(x, w, padding=pad)
        assert got.shape == ref.shape, pad
        torch.testing.assert_close(got.double(), ref, rtol=1e-4, atol=1e-4)


def test_opcheck():
    """Schema, fake (shape, dtype, memory format), autograd registration and the
    AOT-dispatch path, as torch.library.opcheck tests them."""
    x = torch.randn(2, 6, 9, 8, device="cuda", requires_grad=True)
    w = torch.randn(4, 3, 3, 3, device="cuda", requires_grad=True)
    b = torch.randn(4, device="cuda", requires_grad=True)
    args = [
        (x, w, b, [1, 1], [1, 1, 1, 1], [1, 1], 2),
        (x, w, None, [2, 1], [0, 0, 1, 1], [1, 2], 2),
    ]
    xl = x.detach().bfloat16().contiguous(memory_format=torch.channels_last).requires_grad_()
    args.append((xl, w.detach().bfloat16().requires_grad_(), None, [1, 1], [1, 1, 1, 1], [1, 1], 2))
    for a in args:
        torch.library.opcheck(torch.ops.specgen.conv2d.default, a)


def test_torch_compile_fullgraph_matches_eager():
    model = torch.nn.Sequential(
        sg.Conv2d(3, 16, 3, padding=1), torch.nn.ReLU(), sg.Conv2d(16, 8, 3, stride=2)
    ).cuda()
    x = torch.randn(4, 3, 16, 16, device="cuda")
    eager = model(x)
    compiled = torch.compile(model, fullgraph=True)
    torch.testing.assert_close(compiled(x), eager, rtol=0, atol=0)
    loss = compiled(x).square().sum()
    loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


def test_cuda_graph_replay():
    model = sg.Conv2d(8, 8, 3, padding=1).cuda()
    static_x = torch.randn(2, 8, 12, 12, device="cuda")
    sg.warmup(model, static_x)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        model(static_x)  # PyTorch's advice: warm up on the capture stream's side
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = model(static_x)
    for _ in range(2):
        static_x.copy_(torch.randn_like(static_x))
        graph.replay()
        torch.testing.assert_close(static_y, model(static_x), rtol=0, atol=0)


def test_a_first_step_leaves_no_exception_for_the_garbage_collector():
    """A converted model's first training step chooses its kernels inside autograd's
    backward, where the fits pass over refused candidates.  An exception kept from it
    holds its frames, and through them that step's autograd graph, in a cycle: a CUDA
    graph captured before a collection (PyTorch no longer collects first) accumulates
    on the kept graph's eager-stream nodes and fails.  The step leaves no refusal and
    no tensor among the collector's garbage (before the fix, shufflenet_v2's left 510
    refusals whose frames held the step's tensors).  Odd sizes: problems no earlier
    test of the process has chosen kernels for."""
    import gc

    net = torch.nn.Sequential(
        torch.nn.Conv2d(3, 24, 7, stride=2, padding=3, bias=False),  # mmafew's, wfew's fits
        torch.nn.BatchNorm2d(24),
        torch.nn.ReLU(),
        torch.nn.Conv2d(24, 24, 3, padding=1, groups=3),  # groups of 8: dwlane's
    )
    fmt = torch.channels_last
    net = sg.convert(net.cuda().to(torch.bfloat16).to(memory_format=fmt))
    x = torch.randn(3, 3, 37, 41, device="cuda", dtype=torch.bfloat16)
    x = x.contiguous(memory_format=fmt)
    kinds = (SpecError, torch.Tensor)
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        net(x).float().square().sum().backward()
        torch.cuda.synchronize()
        gc.collect()
        kept = sorted({type(o).__name__ for o in gc.garbage if isinstance(o, kinds)})
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert kept == []
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in net.parameters())


def test_a_new_problem_inside_capture_is_one_clear_error():
    x = torch.randn(1, 2, 5, 7, device="cuda")
    w = torch.randn(3, 2, 1, 1, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(SpecError, match="warmup"):
        with torch.cuda.graph(graph):
            sg.conv2d(x, w)


def test_launches_on_the_current_stream_without_waiting():
    x = torch.randn(8, 16, 32, 32, device="cuda")
    w = torch.randn(16, 16, 3, 3, device="cuda")
    sg.conv2d(x, w, padding=1)  # compiled before the timing-sensitive part
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        torch.cuda._sleep(2_000_000_000)  # about a second of GPU time
        y = sg.conv2d(x, w, padding=1)
        busy = not s.query()
    assert busy  # the operator returned while the stream was still sleeping
    s.synchronize()
    torch.testing.assert_close(
        y.double(), F.conv2d(x.double(), w.double(), padding=1), rtol=1e-4, atol=1e-4
    )


def test_channels_last_in_channels_last_out_like_pytorch():
    x = torch.randn(2, 8, 10, 10, device="cuda").contiguous(memory_format=torch.channels_last)
    w = torch.randn(4, 8, 3, 3, device="cuda")
    y = sg.conv2d(x, w, padding=1)
    assert y.is_contiguous(memory_format=torch.channels_last)
    assert y.stride() == F.conv2d(x, w, padding=1).stride()
    odd = torch.randn(2, 10, 10, 8, device="cuda").permute(0, 3, 2, 1)  # neither format
    torch.testing.assert_close(
        sg.conv2d(odd, w, padding=1), F.conv2d(odd, w, padding=1), rtol=1e-4, atol=1e-4
    )


def test_bf16_autocast_casts_like_pytorch():
    model = torch.nn.Conv2d(8, 16, 3, padding=1).cuda()
    ours = sg.convert(torch.nn.Sequential(torch.nn.Conv2d(8, 16, 3, padding=1))).cuda()
    ours[0].load_state_dict(model.state_dict())
    x = torch.randn(4, 8, 12, 12, device="cuda")
    with torch.autocast("cuda", dtype=torch.bfloat16):
        ref, got = model(x), ours(x)
    assert got.dtype == ref.dtype == torch.bfloat16
    exact = F.conv2d(
        x.bfloat16().double(),
        model.weight.bfloat16().double(),
        model.bias.double(),  # specgen adds an fp32 bias uncast (cuDNN rounds it first)
        padding=1,
    )
    assert float((got.double() - exact).abs().max()) <= 2**-7 * float(exact.abs().max()) + 1e-3
    got.float().sum().backward()
    assert ours[0].weight.grad.dtype == torch.float32  # autocast's cast back
    assert ours[0].bias.grad.dtype == torch.float32
    db = torch.full_like(model.bias, float(x.shape[0] * 12 * 12))  # dy is all ones
    torch.testing.assert_close(ours[0].bias.grad, db, rtol=2**-8, atol=0)


def test_tf32_follows_cudnn_allow_tf32():
    x = torch.randn(10, 16, 20, 20, device="cuda")
    w = torch.randn(16, 16, 5, 5, device="cuda")
    p = E.problem(
        Op.FPROP,
        x.shape,
        w.shape,
        False,
        [1, 1],
        [2, 2, 2, 2],
        [1, 1],
        1,
        E.DType.FP32,
        TensorLayout.NCHW,
    )
    sg.conv2d(x, w, padding=2)
    assert kernel(p).choice.variant.precision.value == "fp32"
    torch.backends.cudnn.allow_tf32 = True
    sg.conv2d(x, w, padding=2)
    assert kernel(p).choice.variant.precision.value in ("fp32", "tf32")


def test_module_state_dict_and_padding_modes():
    for mode in ("zeros", "reflect", "replicate", "circular"):
        ref = torch.nn.Conv2d(3, 5, 3, padding=1, padding_mode=mode).cuda()
        ours = sg.Conv2d(3, 5, 3, padding=1, padding_mode=mode).cuda()
        ours.load_state_dict(ref.state_dict())
        assert ours.state_dict().keys() == ref.state_dict().keys()
        x = torch.randn(2, 3, 9, 9, device="cuda")
        torch.testing.assert_close(ours(x), ref(x), rtol=1e-4, atol=1e-4)


def test_convert_shares_parameters():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.ReLU()).cuda()
    weight = model[0].weight
    sg.convert(model)
    assert isinstance(model[0], sg.Conv2d) and model[0].weight is weight


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: (torch.randn(1, 3, 8, 8), torch.randn(4, 3, 3, 3)), "CUDA tensors"),
        (
            lambda: (
                torch.randn(1, 3, 8, 8, device="cuda"),
                torch.randn(4, 3, 3, 3, device="cuda").half(),
            ),
            "dtype",
        ),
        (
            lambda: (
                torch.randn(1, 3, 8, 8, device="cuda").double(),
                torch.randn(4, 3, 3, 3, device="cuda").double(),
            ),
            "float32",
        ),
        (
            lambda: (
                torch.randn(1, 5, 8, 8, device="cuda"),
                torch.randn(4, 3, 3, 3, device="cuda"),
            ),
            "channels",
        ),
        (
            lambda: (
                torch.randn(1, 3, 2, 2, device="cuda"),
                torch.randn(4, 3, 3, 3, device="cuda"),
            ),
            "larger than",
        ),
    ],
)
def test_bad_input_is_one_clear_exception(make, match):
    """Strict (``sg.strict``), what the kernels do not serve is one clear SpecError;
    otherwise PyTorch's own convolution takes it and computes it or raises PyTorch's
    exception with PyTorch's message."""
    x, w = make()
    sg.strict(True)
    try:
        with pytest.raises(SpecError, match=match):
            sg.conv2d(x, w)
    finally:
        sg.strict(False)
    try:
        want = F.conv2d(x, w)
    except Exception as theirs:
        with pytest.raises(type(theirs)) as ours:
            sg.conv2d(x, w)
        assert str(ours.value) == str(theirs)
    else:
        assert torch.equal(sg.conv2d(x, w), want)


def test_an_empty_batch():
    x = torch.randn(0, 3, 8, 8, device="cuda", requires_grad=True)
    w = torch.randn(4, 3, 3, 3, device="cuda", requires_grad=True)
    b = torch.randn(4, device="cuda", requires_grad=True)
    y = sg.conv2d(x, w, b)
    assert y.shape == (0, 4, 6, 6)
    dx, dw, db = torch.autograd.grad(y.sum(), [x, w, b])
    assert dx.shape == x.shape and not dw.any() and not db.any()


def test_the_eager_path_and_the_registered_op_agree_bit_for_bit():
    """specgen.torch.conv2d runs an autograd.Function in eager mode and the registered
    op under torch.compile: the same kernels, so the same bits, forward and backward."""
    x = torch.randn(3, 6, 11, 9, device="cuda", requires_grad=True)
    w = torch.randn(8, 3, 3, 3, device="cuda", requires_grad=True)
    b = torch.randn(8, device="cuda", requires_grad=True)
    eager = sg.conv2d(x, w, b, (2, 1), 1, 1, 2)
    traced = torch.ops.specgen.conv2d(x, w, b, [2, 1], [1, 1, 1, 1], [1, 1], 2)
    assert torch.equal(eager, traced)
    dy = torch.randn_like(eager)
    for g, h in zip(
        torch.autograd.grad(eager, [x, w, b], dy), torch.autograd.grad(traced, [x, w, b], dy)
    ):
        assert torch.equal(g, h)


def test_a_call_that_finds_its_layer_builds_and_checks_nothing(monkeypatch):
    """The eager path looks up its layer by the tensors' sizes, strides, dtypes and
    devices: the first call builds the problem and checks the tensors, a repeat does
    neither (forward and backward), and a call that differs in any of those (here the
    bias's shape) is checked again and refused."""
    x = torch.randn(2, 4, 9, 7, device="cuda", requires_grad=True)
    w = torch.randn(6, 4, 3, 3, device="cuda", requires_grad=True)
    b = torch.randn(6, device="cuda", requires_grad=True)
    torch.autograd.grad(sg.conv2d(x, w, b, padding=1).sum(), [x, w, b])

    def refuse(*args, **kwargs):
        raise AssertionError("a repeated call built a problem or checked its tensors")

    with monkeypatch.context() as m:
        m.setattr(E, "problem", refuse)
        m.setattr(E, "check_tensors", refuse)
        y = sg.conv2d(x, w, b, padding=1)
        dy = torch.randn_like(y)
        grads = torch.autograd.grad(y, [x, w, b], dy)
    doubles = [t.detach().double().requires_grad_() for t in (x, w, b)]
    refs = torch.autograd.grad(F.conv2d(*doubles, padding=1), doubles, dy.double())
    for g, r in zip(grads, refs):
        torch.testing.assert_close(g.double(), r, rtol=1e-4, atol=1e-4)
    with pytest.raises(RuntimeError):  # PyTorch's own refusal, through the fallback
        sg.conv2d(x, w, torch.randn(5, device="cuda"), padding=1)


def test_many_batch_sizes_of_one_layer():
    """A loader of ragged batches: more batch sizes than a kernel keeps bound launches
    for (``BATCHES_KEPT``), each still computed in full."""
    w = torch.randn(5, 3, 3, 3, device="cuda")
    for batch in range(1, E.BATCHES_KEPT + 4):
        x = torch.randn(batch, 3, 8, 6, device="cuda")
        ref = F.conv2d(x.double(), w.double(), padding=1)
        torch.testing.assert_close(sg.conv2d(x, w, padding=1).double(), ref, rtol=1e-4, atol=1e-4)


def test_the_split_k_scratch_is_one_a_stream_reused_and_never_read_before_written():
    """Two layers whose wgrad sums batch slices in scratch share one workspace on the
    stream, which a repeated call reuses (no allocation); filled with NaN between the
    calls, it changes no gradient: the kernels write every partial sum they read."""
    torch.manual_seed(0)
    layers = [(16, 32, 16), (32, 8, 12)]  # (C, M, H=W)
    stream = E.raw_stream(torch.cuda.current_device())
    key = (torch.cuda.current_device(), stream)
    E._workspaces.pop(key, None)
    needs, held = [], None
    for round_ in range(3):
        for C, M, H in layers:
            x = torch.randn(6, C, H, H, device="cuda", requires_grad=True)
            w = torch.randn(M, C, 3, 3, device="cuda", requires_grad=True)
            y = sg.conv2d(x, w, None, 1, 1)
            dy = torch.randn_like(y)
            (dw,) = torch.autograd.grad(y, [w], dy)
            p = ConvProblem(C=C, M=M, H=H, W=H, R=3, S=3, pads=(1, 1, 1, 1), op=Op.WGRAD)
            if round_ == 0:
                needs.append(kernel(p).run(6)[1])
            ref = torch.nn.grad.conv2d_weight(x.double(), w.shape, dy.double(), 1, 1)
            torch.testing.assert_close(dw.double(), ref, rtol=1e-4, atol=1e-3)
            E._workspaces[key].fill_(255)  # NaN in every float of it
        if round_ == 0:
            held = E._workspaces[key]
    assert all(needs), f"both layers' wgrad use scratch ({needs}): the test needs them to"
    assert E._workspaces[key] is held and held.numel() >= max(needs)


def test_autotune_tunes_a_new_problem_once_and_keeps_its_winner(tmp_path, monkeypatch):
    """SPECGEN_AUTOTUNE: the first call of a new problem tunes it (a small budget here),
    records the winner in specgen's database and runs it; a later process would find it
    there (the choice's source says so)."""
    from specgen import tunedb
    from specgen.choose import choose

    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(E, "AUTOTUNE_BUDGET", 3)
    sg.autotune(True)
    try:
        x = torch.randn(2, 5, 13, 11, device="cuda")
        w = torch.randn(7, 5, 3, 3, device="cuda")
        y = sg.conv2d(x, w, padding=1)
    finally:
        sg.autotune(False)
    p = E.problem(
        Op.FPROP,
        x.shape,
        w.shape,
        False,
        [1, 1],
        [1, 1, 1, 1],
        [1, 1],
        1,
        E.DType.FP32,
        TensorLayout.NCHW,
    )
    gpu = torch.cuda.get_device_name()
    assert tunedb.winners(p.spec, gpu)["fp32"]["variant"] == kernel(p).choice.variant.name
    assert kernel(p).choice.source == "tuned"
    assert choose(p, gpu).source == "tuned"  # what the next process reads
    torch.testing.assert_close(
        y.double(), F.conv2d(x.double(), w.double(), padding=1), rtol=1e-4, atol=1e-4
    )


def rel_l2(got, ref) -> float:
    got = got.double()
    assert torch.isfinite(got).all(), "NaN or Inf (an element left unwritten?)"
    return float((got - ref).norm() / ref.norm().clamp_min(1e-300))


def summed_bound(terms: int, u: float) -> float:
    """A relative bound for values that went through up to three chained sums of at most
    ``terms`` products each in a unit roundoff ``u`` (fp32 sums): 3 n u."""
    return 3 * terms * u


@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("stride,dil,groups", [(1, 1, 1), (2, 1, 2), (1, 2, 1)])
def test_double_backward_matches_pytorch_in_float64(stride, dil, groups, channels_last):
    """A gradient penalty (the norm of dL/dx, differentiated again in x and w) and a
    Hessian-vector product through specgen's ops, eager and registered, against the same
    on PyTorch in float64: the gradient ops are differentiable in turn."""
    B, C, M, H = 2, 4, 6, 9
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(B, C, H, H, device="cuda").contiguous(memory_format=fmt)
    w = torch.randn(M, C // groups, 3, 3, device="cuda") / 3
    b = torch.randn(M, device="cuda")
    v = torch.randn(B, M, *F.conv2d(x, w, None, stride, 1, dil, groups).shape[2:], device="cuda")

    def penalty(conv, x, w, b):
        y = conv(x, w, b, stride, 1, dil, groups)
        (gx,) = torch.autograd.grad(
            (y * v.to(y.dtype)).sum() + y.square().sum(), [x], create_graph=True
        )
        return gx.square().sum()

    leaves = [t.detach().clone().requires_grad_() for t in (x, w, b)]
    got = torch.autograd.grad(penalty(sg.conv2d, *leaves), leaves)
    doubles = [t.detach().double().requires_grad_() for t in (x, w, b)]
    want = torch.autograd.grad(penalty(F.conv2d, *doubles), doubles)
    bound = summed_bound(B * H * H * max(C, M) * 9, 2.0**-24)
    for name, g, r in zip(("x", "w", "b"), got, want):
        assert g.shape == r.shape and g.dtype == torch.float32
        assert rel_l2(g, r) <= bound, f"d penalty / d{name}: {rel_l2(g, r):.2e} > {bound:.2e}"
    # the registered ops alone (torch.compile's path), a Hessian-vector product in w
    args = ([stride] * 2, [1, 1, 1, 1], [dil] * 2, groups)
    leaves = [t.detach().clone().requires_grad_() for t in (x, w)]
    y = torch.ops.specgen.conv2d(*leaves[:1], leaves[1], None, *args)
    (gw,) = torch.autograd.grad(y.square().sum(), [leaves[1]], create_graph=True)
    (hv,) = torch.autograd.grad((gw * w).sum(), [leaves[0]])
    xd, wd = (t.detach().double().requires_grad_() for t in (x, w))
    yd = F.conv2d(xd, wd, None, stride, 1, dil, groups)
    (gwd,) = torch.autograd.grad(yd.square().sum(), [wd], create_graph=True)
    (hvd,) = torch.autograd.grad((gwd * w.double()).sum(), [xd])
    assert rel_l2(hv, hvd) <= bound


TRANSPOSED = [  # (C_in, C_out, H, W, kernel, stride, padding, output_padding, groups, dilation)
    (4, 6, 7, 5, 3, 1, 0, 0, 1, 1),
    (8, 4, 6, 6, 4, 2, 1, 0, 1, 1),
    (6, 9, 5, 7, 3, 2, 1, 1, 3, 1),
    (4, 4, 8, 8, (3, 5), (2, 1), (1, 2), (1, 0), 2, 1),
    (5, 3, 6, 4, 3, 1, 2, 0, 1, 2),
    (16, 8, 14, 14, 2, 2, 0, 0, 1, 1),  # a U-Net's up-sampling
]


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("channels_last", [False, True])
@pytest.mark.parametrize("case", TRANSPOSED)
def test_conv_transpose2d_matches_pytorch_in_float64(case, channels_last, dtype):
    """Values and the three gradients of ``conv_transpose2d`` (dgrad forward, fprop and
    wgrad backward) against PyTorch in float64 on the same (rounded) values."""
    Ci, Co, H, W, k, stride, padding, out_pad, groups, dil = case
    k = (k, k) if isinstance(k, int) else k
    dt = DT[dtype]
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(2, Ci, H, W, device="cuda").to(dt).contiguous(memory_format=fmt)
    w = (torch.randn(Ci, Co // groups, *k, device="cuda") / (Ci * k[0] * k[1]) ** 0.5).to(dt)
    b = torch.randn(Co, device="cuda").to(dt)
    args = (stride, padding, out_pad, groups, dil)
    leaves = [t.detach().clone().requires_grad_() for t in (x, w, b)]
    y = sg.conv_transpose2d(*leaves, *args)
    doubles = [t.detach().double().requires_grad_() for t in (x, w, b)]
    ref = F.conv_transpose2d(*doubles, *args)
    assert y.shape == ref.shape and y.dtype == dt
    dy = torch.randn_like(ref).to(dt)
    got = torch.autograd.grad(y, leaves, dy)
    want = torch.autograd.grad(ref, doubles, dy.double())
    terms = 2 * H * W * max(Ci, Co) * k[0] * k[1]
    u = 2.0**-8 if dtype == "bf16" else 0.0  # the 16-bit output's own rounding
    bound = summed_bound(terms, 2.0**-24) + u
    for name, g, r in (("y", y, ref),) + tuple(zip(("dx", "dw", "db"), got, want)):
        assert rel_l2(g, r) <= bound, f"{name}: {rel_l2(g, r):.2e} > {bound:.2e}"


def test_conv_transpose2d_module_convert_and_output_size():
    m = torch.nn.Sequential(torch.nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1)).cuda()
    x = torch.randn(2, 4, 5, 5, device="cuda")
    want = m[0](x, output_size=[10, 10])
    sg.convert(m)
    assert type(m[0]) is sg.ConvTranspose2d
    got = m[0](x, output_size=[10, 10])
    assert got.shape == want.shape == (2, 6, 10, 10)
    assert rel_l2(got, want.double()) <= summed_bound(2 * 25 * 6 * 9, 2.0**-24)


@pytest.mark.parametrize("channels_last", [False, True])
def test_conv_transpose2d_double_backward_matches_pytorch_in_float64(channels_last):
    """A gradient penalty through ``conv_transpose2d`` (the norm of dL/dx, differentiated
    again in x and w): the eager path's backward hands a graph-building backward to the
    registered ops, whose derivatives are specgen's kernels, against PyTorch in float64."""
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(2, 6, 5, 5, device="cuda").contiguous(memory_format=fmt)
    w = torch.randn(6, 4, 4, 4, device="cuda") / 12
    b = torch.randn(4, device="cuda")

    def penalty(conv, x, w, b):
        y = conv(x, w, b, 2, 1)
        (gx,) = torch.autograd.grad(y.square().sum(), [x], create_graph=True)
        return gx.square().sum()

    leaves = [t.detach().clone().requires_grad_() for t in (x, w, b)]
    got = torch.autograd.grad(penalty(sg.conv_transpose2d, *leaves), leaves[:2])
    doubles = [t.detach().double().requires_grad_() for t in (x, w, b)]
    want = torch.autograd.grad(penalty(F.conv_transpose2d, *doubles), doubles[:2])
    bound = summed_bound(2 * 100 * 6 * 16, 2.0**-24)
    for name, g, r in zip(("x", "w"), got, want):
        assert g.shape == r.shape and g.dtype == torch.float32
        assert rel_l2(g, r) <= bound, f"d penalty / d{name}: {rel_l2(g, r):.2e} > {bound:.2e}"


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("channels_last", [False, True])
def test_conv_transpose2d_under_autocast_casts_fp32_weights_to_the_bits_of_casting_first(
    dtype, channels_last
):
    """Under autocast the eager transposed convolution casts the model's fp32 weights in
    the launch that packs them for its dgrad kernel and, where dx is wanted, its fprop
    (``E.Cast``): y and dx the bits of the same call on weights PyTorch cast first, dw
    in fp32, within one 16-bit rounding of that call's."""
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(4, 16, 8, 8, device="cuda").to(DT[dtype]).contiguous(memory_format=fmt)
    w32 = (torch.randn(16, 8, 4, 4, device="cuda") / 8).requires_grad_()
    x.requires_grad_()
    with torch.autocast("cuda", dtype=DT[dtype]):
        y = sg.conv_transpose2d(x, w32, None, 2, 1)
    dy = torch.randn_like(y)
    got = torch.autograd.grad(y, [x, w32], dy)
    w16 = w32.detach().to(DT[dtype]).requires_grad_()
    ref_y = sg.conv_transpose2d(x, w16, None, 2, 1)
    ref = torch.autograd.grad(ref_y, [x, w16], dy)
    assert y.dtype == DT[dtype] and torch.equal(y, ref_y)
    assert torch.equal(got[0], ref[0]), "dx"
    assert got[1].dtype == torch.float32
    assert rel_l2(got[1].to(DT[dtype]), ref[1].double()) <= 2.0**-7, "dw"
    casts = [c for lay in E._layers.values() for c in lay.casts.values() if c is not None]
    assert any(c.cast and len(c.sizes) == 2 for c in casts)


@pytest.mark.parametrize(
    "dtype,C,M,H,stride",
    [
        ("fp32", 64, 64, 16, 1),
        ("fp32", 32, 64, 16, 2),
        ("fp32", 16, 32, 12, 1),
        ("bf16", 64, 64, 16, 1),
        ("bf16", 32, 64, 16, 2),
    ],
)
@pytest.mark.parametrize("channels_last", [False, True])
def test_one_gather_packs_the_weights_for_fprop_and_dgrad(dtype, C, M, H, stride, channels_last):
    """Outside autocast, where the forward kernel and dgrad's both pack the weights, the
    forward packs them for both in one gather (``Layer.packing``) and the backward's
    dgrad reads its share: y and dx the bits of each kernel packing its own
    (``_engine.forward`` and ``input_grad`` on the weights), dw that of wgrad alone."""
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(4, C, H, H, device="cuda").to(DT[dtype]).contiguous(memory_format=fmt)
    w = (torch.randn(M, C, 3, 3, device="cuda") / (3 * C**0.5)).to(DT[dtype])
    x.requires_grad_(), w.requires_grad_()
    y = sg.conv2d(x, w, None, stride, 1)
    dy = torch.randn_like(y)
    dx, dw = torch.autograd.grad(y, [x, w], dy)
    lay, xd = E.layer(x.detach(), w.detach(), None, (stride,) * 2, (1,) * 4, (1, 1), 1)
    assert torch.equal(y, E.forward(lay, xd, w.detach(), None))
    dyd = E.dense(dy, lay.layout)
    assert torch.equal(dx, E.input_grad(lay, dyd, w.detach()))
    assert torch.equal(dw, E.weight_grads(lay, xd, dyd, False, lay.fp32_dw))
    ops = ((Op.FPROP, False), (Op.DGRAD, False))
    both = [lay.kernel(op, False, 4) for op, _ in ops]
    assert E.Cast.serves(both, w.dtype, lay.w_format), "these layers' two kernels pack"
    packing = lay.casts.get((ops, w.dtype))
    assert packing is not None and not packing.cast and len(packing.sizes) == 2


@pytest.mark.parametrize("C,M", [(16, 32), (3, 16), (16, 3)])
@pytest.mark.parametrize(
    "dtype,tf32",
    [("fp32", False), ("fp32", True), ("bf16", False), ("fp16", False)],
)
def test_channels_last_weights_pack_from_their_storage_like_contiguous_ones(dtype, tf32, C, M):
    """channels_last weights are packed from their storage as it lies (for an untransformed
    mrsc kernel, read in place; else by specgen's gather, widened to fp32 where the kernel
    reads fp32, as mma does for 3 channels): the same kernel must give the same bits,
    forward and through dgrad's flipped weights, as with the weights contiguous."""
    torch.backends.cudnn.allow_tf32 = tf32
    x = torch.randn(4, C, 12, 12, device="cuda", dtype=DT[dtype])
    x = x.contiguous(memory_format=torch.channels_last).requires_grad_()
    w = torch.randn(M, C, 3, 3, device="cuda", dtype=DT[dtype])
    w_cl = w.contiguous(memory_format=torch.channels_last)
    assert not w_cl.is_contiguous()
    outs = []
    for weights in (w, w_cl):
        y = sg.conv2d(x, weights, padding=1)
        (dx,) = torch.autograd.grad(y, [x], torch.ones_like(y))
        outs.append((y, dx))
    assert torch.equal(outs[0][0], outs[1][0]) and torch.equal(outs[0][1], outs[1][1])


@pytest.mark.parametrize("H,stride", [(1, 1), (2, 2)])
@pytest.mark.parametrize("dtype,tf32", [("fp32", False), ("fp32", True), ("bf16", False)])
@pytest.mark.parametrize("channels_last", [False, True])
def test_a_cropped_windows_weights_pack_in_one_gather_as_index_select_would(
    H, stride, dtype, tf32, channels_last
):
    """A layer whose maps are smaller than its window (resnet's layer4 at 32x32 images:
    1x1 maps of 3x3 taps, and 2x2 maps at stride 2 into 1x1) runs its kernels over the
    taps that reach a pixel, reading a view of the weights (``Layer.window``) that is
    dense in neither memory format: its packing is one launch of specgen's gather at
    the packed order's places in the view's strides, which a replay can record, and
    gives the bits of PyTorch's index_select of the view (the packing before it),
    weights contiguous or channels_last, fresh random values each run."""
    from specgen.runtime import weight_dtype

    torch.backends.cudnn.allow_tf32 = tf32
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(4, 32, H, H, device="cuda", dtype=DT[dtype]).contiguous(memory_format=fmt)
    w = torch.randn(64, 32, 3, 3, device="cuda", dtype=DT[dtype]).contiguous(memory_format=fmt)
    lay, _ = E.layer(x, w, None, (stride,) * 2, (1,) * 4, (1, 1), 1)
    cropped = 0
    for op in (Op.FPROP, Op.DGRAD):
        k = lay.kernel(op, False, 4)
        view = lay.window(w, k)
        if view is w or k.gather is None or k.at is None:
            continue
        cropped += 1
        stored = E.STORED[weight_dtype(k.conv.plan.weight_format)]
        want = view.reshape(-1).index_select(0, k.gather).to(stored)
        assert torch.equal(E.pack_weights(k, view), want), op
        assert isinstance(k.packs[(view.dtype, view.stride())], E.Gather), op
    assert cropped, "no kernel of these layers reads a cropped window through a gather"


@pytest.mark.parametrize(
    "C,M,layout", [(16, 32, "nhwc"), (3, 16, "nhwc"), (16, 3, "nhwc"), (8, 8, "nchw")]
)
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
@pytest.mark.parametrize("weights", ["contiguous", "channels_last"])
def test_autocast_casts_fp32_weights_in_one_launch_to_the_bits_of_casting_first(
    dtype, C, M, layout, weights
):
    """Under autocast the operator casts the model's fp32 weights itself, in one launch
    that also packs them for the forward kernel and for dgrad's (``E.Cast``): the
    same bits as calling it with the weights cast by PyTorch first, forward and dx,
    and one launch fewer than a cast and a gather wherever dx is wanted.  dw and db
    come in fp32 as autocast gives them, dw in the weights' memory format: where the
    wgrad kernel writes them so (its second pass, ``Kernel.grads32``), its fp32 sums
    unrounded, which round to the bits of the 16-bit path; else those bits widened."""
    fmt = torch.channels_last if layout == "nhwc" else torch.contiguous_format
    x = torch.randn(4, C, 12, 12, device="cuda").contiguous(memory_format=fmt)
    w32 = torch.randn(M, C, 3, 3, device="cuda")
    if weights == "channels_last":
        w32 = w32.contiguous(memory_format=torch.channels_last)
    b = torch.randn(M, device="cuda")
    x16 = x.to(DT[dtype]).requires_grad_()
    w32.requires_grad_(), b.requires_grad_()
    with torch.autocast("cuda", dtype=DT[dtype]):
        y = sg.conv2d(x16, w32, b, padding=1)
    dy = torch.randn_like(y)
    got = torch.autograd.grad(y, [x16, w32, b], dy)
    assert got[1].dtype == torch.float32 and got[2].dtype == torch.float32
    fmt_w = torch.channels_last if weights == "channels_last" else torch.contiguous_format
    assert got[1].is_contiguous(memory_format=fmt_w)
    w16 = w32.detach().to(DT[dtype]).requires_grad_()
    b2 = b.detach().requires_grad_()
    ref_y = sg.conv2d(x16, w16, b2, padding=1)
    ref = torch.autograd.grad(ref_y, [x16, w16, b2], dy)
    assert torch.equal(y, ref_y)
    assert torch.equal(got[0], ref[0])
    wide = [
        k
        for k in E._kernels.values()
        if k.grads32
        and k.problem.spec
        == E.problem(
            Op.WGRAD,
            x.shape,
            w32.shape,
            True,
            (1, 1),
            (1, 1, 1, 1),
            (1, 1),
            1,
            E.DTYPES[DT[dtype]],
            E.layout_of(x),
        ).spec
    ]
    if wide:  # fp32 sums as they are: rounded, the 16-bit path's bits
        assert torch.equal(got[1].to(DT[dtype]), ref[1]), "dw"
        assert torch.equal(got[2].to(DT[dtype]).float(), ref[2]), "db"
    else:
        assert torch.equal(got[1], ref[1].float()) and torch.equal(got[2], ref[2].float())
    if layout == "nhwc" and min(C, M) >= 8:
        assert wide, "the tensor-core wgrad wrote dw and db in fp32"
    casts = [c for lay in E._layers.values() for c in lay.casts.values() if c is not None]
    assert any(c.cast and len(c.sizes) == 2 for c in casts), "dgrad's packing came with the cast"


def test_tf32_wgrad_of_channels_last_fp32_on_tensor_cores_within_its_bound():
    """With tf32 allowed, fp32 channels_last wgrad runs tcwgrad in tf32 on the tensors
    as they lie (no NCHW copies): dw and db against float64 autograd, within tf32's
    rounding of x and dy (2 u of 2^-11 a product) plus fp32 sums, of the magnitudes."""
    torch.backends.cudnn.allow_tf32 = True
    cl = torch.channels_last
    x = torch.randn(6, 16, 12, 12, device="cuda").contiguous(memory_format=cl)
    w = torch.randn(32, 16, 3, 3, device="cuda").contiguous(memory_format=cl)
    b = torch.randn(32, device="cuda")
    x.requires_grad_()
    w.requires_grad_()
    b.requires_grad_()
    y = sg.conv2d(x, w, b, padding=1)
    g = torch.randn_like(y)
    dx, dw, db = torch.autograd.grad(y, [x, w, b], g)
    p = E.problem(
        Op.WGRAD,
        x.shape,
        w.shape,
        True,
        [1, 1],
        [1, 1, 1, 1],
        [1, 1],
        1,
        E.DType.FP32,
        TensorLayout.NHWC,
    )
    assert kernel(p).choice.variant.name.startswith("tcwgrad_")
    x64, g64 = x.detach().double(), g.double()
    ref = torch.nn.grad.conv2d_weight(x64, w.shape, g64, padding=1)
    mag = torch.nn.grad.conv2d_weight(x64.abs(), w.shape, g64.abs(), padding=1)
    assert bool(((dw.double() - ref).abs() <= 4 * 2**-11 * mag + 1e-5).all())
    assert torch.allclose(db.double(), g64.sum((0, 2, 3)), rtol=1e-5, atol=1e-4)


def _off_by_one_element(shape, dtype, channels_last):
    """A dense tensor whose data starts one element into its storage (a view at an
    offset, as slicing a larger tensor gives): 2 bytes off a 16-byte boundary for 16-bit."""
    N, C, H, W = shape
    base = torch.randn(N * C * H * W + 1, device="cuda").to(dtype)[1:]
    if channels_last:
        t = base.view(N, H, W, C).permute(0, 3, 1, 2)
        assert t.is_contiguous(memory_format=torch.channels_last)
    else:
        t = base.view(N, C, H, W)
    assert t.data_ptr() % 16 != 0
    return t


@pytest.mark.parametrize(
    "xshape,wshape,channels_last",
    [
        ((4, 64, 8, 8), (64, 64, 3, 3), True),  # 16-byte cp.async (wgmma, tcgemm)
        ((3, 1, 30, 30), (4, 1, 7, 7), False),  # 4-byte cp.async of x's rows (mmastrip)
    ],
)
def test_a_tensor_that_starts_off_alignment_is_read_as_an_aligned_one(
    xshape, wshape, channels_last
):
    """Inputs that are dense but start off a 16-byte boundary give the same bits as
    their aligned copies, forward and backward (the operator copies them; the kernels'
    vector copies would otherwise read across the boundary or fault)."""
    dtype = torch.bfloat16
    x = _off_by_one_element(xshape, dtype, channels_last).requires_grad_()
    w = torch.randn(wshape, device="cuda").to(dtype).requires_grad_()
    pad = wshape[-1] // 2
    y = sg.conv2d(x, w, padding=pad)
    x2 = x.detach().clone().requires_grad_()
    y2 = sg.conv2d(x2, w, padding=pad)
    assert torch.equal(y, y2)
    dy = _off_by_one_element(tuple(y.shape), dtype, channels_last)
    for g, h in zip(
        torch.autograd.grad(y, [x, w], dy), torch.autograd.grad(y2, [x2, w], dy.clone())
    ):
        assert torch.equal(g, h)


def test_fp32_grads_widen_the_wgrads_that_can_and_leave_the_rest_one_kernel():
    """Under autocast's cast wgrad is asked for dw and db in fp32: a kernel whose
    second pass is ``tc_sums`` gets a widened copy of its own (the plain one stays for
    calls without the cast); one whose pass cannot is the plain kernel itself, not a
    second compile of it."""
    dev = torch.device("cuda", torch.cuda.current_device())
    args = (True, (1, 1), (1, 1, 1, 1), (1, 1), 1, E.DType.BF16)
    nhwc = E.problem(Op.WGRAD, (4, 16, 12, 12), (32, 16, 3, 3), *args, TensorLayout.NHWC)
    wide, plain = E.kernel_for(nhwc, dev, None, "mrsc"), E.kernel_for(nhwc, dev)
    assert wide.grads32 == "mrsc" and plain.grads32 == "" and wide is not plain
    from specgen.render import render

    assert "float* __restrict__ dw" in render(wide.conv.plan)
    nchw = E.problem(Op.WGRAD, (4, 8, 12, 12), (8, 8, 3, 3), *args, TensorLayout.NCHW)
    k = E.kernel_for(nchw, dev, None, "mcrs")
    assert k.grads32 == "" and k is E.kernel_for(nchw, dev)


@pytest.mark.parametrize("tf32", [False, True])
def test_fp32_channels_last_weights_get_dw_in_their_layout(tf32):
    """fp32 channels_last weights: wgrad writes dw in their layout where its second pass
    can (tcwgrad's, in tf32), so autograd has no copy to make for .grad; the values are
    those of contiguous weights, bit for bit, and db comes with them."""
    torch.backends.cudnn.allow_tf32 = tf32
    cl = torch.channels_last
    x = torch.randn(4, 16, 12, 12, device="cuda").contiguous(memory_format=cl)
    w = torch.randn(32, 16, 3, 3, device="cuda")
    b = torch.randn(32, device="cuda")
    x.requires_grad_()
    grads = []
    for weights in (w, w.contiguous(memory_format=cl)):
        weights = weights.clone().requires_grad_()
        bias = b.clone().requires_grad_()
        y = sg.conv2d(x, weights, bias, padding=1)
        grads.append(torch.autograd.grad(y, [weights, bias], torch.ones_like(y)))
    (dw, db), (dw_cl, db_cl) = grads
    assert torch.equal(dw, dw_cl) and torch.equal(db, db_cl)
    assert dw.is_contiguous()
    # this problem's wgrad under this math, widened (keys: problem, device, tf32, format)
    this = (Op.WGRAD, 16, 32, 12, E.DType.FP32, tf32, "mrsc")
    wide = [
        k
        for (p, _, math, fmt), k in E._kernels.items()
        if (p.op, p.C, p.M, p.H, p.dtype, math, fmt) == this and k.grads32
    ]
    if tf32:
        assert wide, "tcwgrad wrote dw in the weights' channels_last layout"
    if wide:
        assert dw_cl.is_contiguous(memory_format=cl)


@pytest.mark.parametrize("mode", ["fp32", "tf32", "bf16"])
@pytest.mark.parametrize("stride", [1, 2])
def test_wide_nchw_layers_run_on_tensor_cores(mode, stride):
    """A wide layer of contiguous (NCHW) tensors: each op's kernel is a tensor-core one
    (fp32 in three tf32 products, tf32 where allowed, bf16): fp32 tensors' forward pass
    and dgrad in place (wgplanar; a strided dgrad a GEMM a stride phase),
    their wgrad where its kernel is faster, the
    rest in NHWC with the tensors copied there and back; y, dx, dw and db NCHW like
    PyTorch's, each within the bound of the kernel that ran, against float64 autograd."""
    torch.backends.cudnn.allow_tf32 = mode == "tf32"
    dt = torch.bfloat16 if mode == "bf16" else torch.float32
    x = torch.randn(3, 64, 13, 16, device="cuda", dtype=dt, requires_grad=True)
    w = (torch.randn(96, 64, 3, 3, device="cuda") / 24).to(dt).requires_grad_()
    b = torch.randn(96, device="cuda", dtype=dt, requires_grad=True)
    y = sg.conv2d(x, w, b, stride, 1)
    dy = torch.randn_like(y)
    dx, dw, db = torch.autograd.grad(y, [x, w, b], dy)
    assert y.is_contiguous() and dx.is_contiguous() and dw.is_contiguous()
    d64 = [t.detach().double().requires_grad_() for t in (x, w, b)]
    y64 = F.conv2d(*d64, stride, 1)
    refs = torch.autograd.grad(y64, d64, dy.double())
    a64 = [t.detach().abs() for t in d64[:2]]
    ymag = F.conv2d(*a64, d64[2].detach().abs(), stride, 1)
    a64 = [t.requires_grad_() for t in a64]
    mags = torch.autograd.grad(F.conv2d(*a64, None, stride, 1), a64, dy.double().abs())
    p = E.problem(
        Op.FPROP,
        x.shape,
        w.shape,
        True,
        [stride] * 2,
        [1] * 4,
        [1, 1],
        1,
        E.dtype_of(x),
        TensorLayout.NCHW,
    )
    largest = max(float(x.abs().max()), float(dy.abs().max()))
    for op, got, ref, mag in (
        (Op.FPROP, y, y64, ymag),
        (Op.DGRAD, dx, refs[0], mags[0]),
        (Op.WGRAD, dw, refs[1], mags[1]),
    ):
        q = replace(p, op=op, bias=op is not Op.DGRAD)
        k = kernel(q)
        want = TensorLayout.NHWC if mode == "bf16" else TensorLayout.NCHW
        if op is not Op.WGRAD or mode == "bf16":  # fp32 tensors' wgrad: where it is faster
            assert k.problem.layout is want, (op, k.conv.plan.name)
        assert k.choice.variant.tensor_core, (op, k.conv.plan.name)
        check(got, ref.detach(), mag, k.conv.plan, 3, largest, float(w.abs().max()), op.value)
    assert torch.allclose(db.double(), dy.double().sum((0, 2, 3)), rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("mode", ["fp32", "tf32", "bf16", "autocast"])
@pytest.mark.parametrize(
    "x_size,w_size,stride,pad,kept",
    [
        ((4, 64, 1, 1), (96, 64, 3, 3), 2 * [1], 1, (1, 1)),  # resnet18's layer4 at 32x32
        ((4, 64, 2, 2), (96, 64, 3, 3), 2 * [2], 1, (2, 2)),  # its layer4.0.conv1
        ((3, 32, 2, 3), (48, 32, 5, 5), 2 * [1], 2, (3, 5)),  # rows alone
    ],
)
def test_a_window_wider_than_its_maps_runs_its_taps_that_meet_x(
    mode, x_size, w_size, stride, pad, kept
):
    """A window wider than the maps it slides over: the operator computes each op over
    the taps that meet x (``choose.cropped``), the forward pass and dgrad reading the
    kept taps of the weights (packed, under autocast cast too, from their offset), wgrad
    writing dw there and zeros past them; fp32 and tf32 in NCHW, bf16 and autocast (fp32
    channels_last weights, dw back in fp32 and in their format) in NHWC.  y, dx, dw and
    db within the bound of the kernel that ran, against float64 autograd."""
    torch.backends.cudnn.allow_tf32 = mode == "tf32"
    dt = torch.bfloat16 if mode == "bf16" else torch.float32
    fmt = torch.channels_last if mode in ("bf16", "autocast") else torch.contiguous_format
    x = torch.randn(x_size, device="cuda", dtype=dt).contiguous(memory_format=fmt)
    x.requires_grad_()
    w = (torch.randn(w_size, device="cuda") / 24).to(dt).contiguous(memory_format=fmt)
    w.requires_grad_()
    b = torch.randn(w_size[0], device="cuda", dtype=dt, requires_grad=True)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=mode == "autocast"):
        y = sg.conv2d(x, w, b, stride, pad)
    dy = torch.randn_like(y)
    dx, dw, db = torch.autograd.grad(y, [x, w, b], dy)
    assert dw.dtype is w.dtype and dw.shape == w.shape
    if w.dtype is torch.float32:  # fp32 weights get dw in their memory format
        assert dw.is_contiguous(memory_format=fmt)
    math = torch.bfloat16 if mode == "autocast" else dt  # what the kernels were handed
    d64 = [t.detach().to(math).double().requires_grad_() for t in (x, w, b)]
    y64 = F.conv2d(*d64, stride, pad)
    refs = torch.autograd.grad(y64, d64, dy.double())
    a64 = [t.detach().abs() for t in d64[:2]]
    ymag = F.conv2d(*a64, d64[2].detach().abs(), stride, pad)
    a64 = [t.requires_grad_() for t in a64]
    mags = torch.autograd.grad(F.conv2d(*a64, None, stride, pad), a64, dy.double().abs())
    layout = TensorLayout.NHWC if fmt is torch.channels_last else TensorLayout.NCHW
    args = (stride, [pad] * 4, [1, 1], 1)
    p = E.problem(Op.FPROP, x.shape, w.shape, True, *args, E.dtype_of(x.to(math)), layout)
    largest = max(float(x.abs().max()), float(dy.abs().max()))
    for op, got, ref, mag in (
        (Op.FPROP, y, y64, ymag),
        (Op.DGRAD, dx, refs[0], mags[0]),
        (Op.WGRAD, dw, refs[1], mags[1]),
    ):
        k = kernel(replace(p, op=op, bias=op is not Op.DGRAD))
        assert (k.problem.R, k.problem.S) == kept, (op, k.conv.plan.name)
        check(
            got, ref.detach(), mag, k.conv.plan, x.shape[0], largest, float(w.abs().max()), op.value
        )
    past = torch.ones(w_size, dtype=torch.bool, device="cuda")
    r0 = next(r for r in range(w_size[2]) if refs[1][:, :, r].abs().sum() > 0)
    s0 = next(s for s in range(w_size[3]) if refs[1][:, :, :, s].abs().sum() > 0)
    past[:, :, r0 : r0 + kept[0], s0 : s0 + kept[1]] = False
    assert not dw[past].any()  # zeros where no tap meets x, as float64's
    sums = dy.double().sum((0, 2, 3))
    assert torch.allclose(db.double(), sums, rtol=1e-2, atol=1e-2 * float(sums.abs().max()))


@pytest.mark.parametrize(
    "mode,K,stride,channels_last,maps",
    [
        ("bf16", 7, 2, True, 64),
        ("bf16", 7, 2, False, 64),
        ("fp16", 7, 2, True, 64),
        ("tf32", 7, 2, False, 64),
        ("autocast", 7, 2, True, 64),
        ("bf16", 7, 2, True, 40),
        ("autocast", 7, 2, False, 40),
    ],
)
def test_a_first_layers_wgrad_runs_on_tensor_cores(mode, K, stride, channels_last, maps):
    """A network's first layer (3 channels, x needing no gradient): its weight gradient
    runs on a tensor-core kernel, in 16 bits over x's own channels (``wfew``, maps a
    multiple of 16), else over x's channels padded with zeros
    (``choose.computed_problem``); dw's three channels come back within that kernel's
    bound against float64, in the weights' dtype (fp32 under autocast, whose cast
    reaches fp32 weights, and then in their memory format), with db."""
    torch.backends.cudnn.allow_tf32 = mode == "tf32"
    dt = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mode, torch.float32)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(4, 3, 37, 41, device="cuda", dtype=dt).contiguous(memory_format=fmt)
    w = (torch.randn(maps, 3, K, K, device="cuda") / K).to(dt).contiguous(memory_format=fmt)
    w.requires_grad_()
    b = torch.randn(maps, device="cuda", dtype=dt, requires_grad=True)
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=mode == "autocast"):
        y = sg.conv2d(x, w, b, stride, K // 2)
    dy = torch.randn_like(y)
    dw, db = torch.autograd.grad(y, [w, b], dy)
    assert dw.dtype is w.dtype and dw.shape == w.shape
    if w.dtype is torch.float32:  # fp32 weights get dw in their memory format
        assert dw.is_contiguous(memory_format=fmt)
    math = torch.bfloat16 if mode == "autocast" else dt  # what the kernel was handed
    x64, dy64 = x.to(math).double(), dy.double()
    w64 = w.detach().to(math).double().requires_grad_()
    ref = torch.autograd.grad(F.conv2d(x64, w64, None, stride, K // 2), w64, dy64)[0]
    a64 = w64.detach().abs().requires_grad_()
    mag = torch.autograd.grad(F.conv2d(x64.abs(), a64, None, stride, K // 2), a64, dy64.abs())[0]
    layout = TensorLayout.NHWC if channels_last else TensorLayout.NCHW
    args = ([stride] * 2, [K // 2] * 4, [1, 1], 1)
    p = E.problem(Op.WGRAD, x.shape, w.shape, True, *args, E.dtype_of(x.to(math)), layout)
    k = kernel(p)
    own = mode != "tf32" and maps % 16 == 0
    assert k.problem.C == (3 if own else 4 if mode == "tf32" else 8), k.conv.plan.name
    assert (k.choice.variant.key == "wfew") == own, k.conv.plan.name
    assert k.choice.variant.tensor_core, k.conv.plan.name
    largest = max(float(x.abs().max()), float(dy.abs().max()))
    check(dw, ref, mag, k.conv.plan, x.shape[0], largest, float(w.abs().max()), "wgrad")
    sums = dy64.sum((0, 2, 3))
    assert torch.allclose(db.double(), sums, rtol=1e-2, atol=1e-2 * float(sums.abs().max()))


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("shape", [(3, 5, 7, 9), (2, 64, 33, 31), (1, 40, 1, 1), (2, 1, 6, 6)])
def test_the_layout_transpose_equals_pytorchs_copy_both_ways(dtype, shape):
    """The operator's own transpose between the memory formats (poisoned outputs, tiles
    cut by every edge): bit for bit PyTorch's copy, and the same values."""
    x = torch.randn(shape, device="cuda").to(DT[dtype])
    last = E.dense(x, TensorLayout.NHWC)
    assert last.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(last, x)
    back = E.dense(last, TensorLayout.NCHW)
    assert back.is_contiguous() and torch.equal(back, x)


def test_a_launch_from_a_thread_that_made_no_cuda_call_runs():
    """The driver's launch needs a current context, which CUDA's runtime makes current
    at a thread's first call of it: the autograd engine's device thread reaches a
    backward that starts at specgen's output before any PyTorch launch.  A new thread
    that has made no CUDA call launches the operator's transpose, and it runs."""
    import threading

    x = torch.randn(3, 40, 6, 5, device="cuda")
    E.dense(x, TensorLayout.NHWC)  # the transpose built (its launch bound) here
    step = next(s for key, s in E._transposes.items() if key[1:] == (x.dtype, 3, 40, 30))
    y = torch.full_like(x, float("nan"), memory_format=torch.channels_last)
    torch.cuda.synchronize()
    errors = []

    def launch():
        try:
            E.launch_step(step, x.device.index, x.data_ptr(), y.data_ptr())
        except Exception as e:  # the driver's error, to be asserted on in the test's thread
            errors.append(e)

    thread = threading.Thread(target=launch)
    thread.start()
    thread.join()
    assert not errors, errors
    assert torch.equal(y, x)


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
@pytest.mark.parametrize(
    "args", [dict(), dict(stride=2, padding=1), dict(padding="same", dilation=3), dict(groups=4)]
)
def test_conv1d_runs_as_a_2d_convolution_of_height_1(dtype, args):
    """sg.conv1d and a converted nn.Conv1d on the GPU: specgen's kernels (the problem's
    height 1; strict, so that no fallback stands in), values and gradients against
    float64 within a tolerance of the dtype."""
    sg.strict(True)
    try:
        _conv1d_against_float64(dtype, args)
    finally:
        sg.strict(False)


def _conv1d_against_float64(dtype, args):
    x = torch.randn(3, 16, 40, device="cuda", dtype=DT[dtype], requires_grad=True)
    w = (torch.randn(8, 16 // args.get("groups", 1), 5, device="cuda") / 6).to(DT[dtype])
    w.requires_grad_()
    y = sg.conv1d(x, w, None, **args)
    d64 = [t.detach().double().requires_grad_() for t in (x, w)]
    y64 = F.conv1d(*d64, None, **args)
    dy = torch.randn_like(y)
    grads = torch.autograd.grad(y, [x, w], dy)
    refs = torch.autograd.grad(y64, d64, dy.double())
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == "fp32" else dict(rtol=2e-2, atol=5e-2)
    torch.testing.assert_close(y.double(), y64.detach(), **tol)
    for g, r in zip(grads, refs):
        torch.testing.assert_close(g.double(), r, **tol)
    model = sg.convert(torch.nn.Conv1d(16, 8, 3, padding=1)).cuda()
    assert type(model) is sg.Conv1d and model(x.float().detach()).shape == (3, 8, 40)


_SAMPLES = """
import sys, torch
from torch.testing._internal.common_methods_invocations import op_db
name, dtype, path = sys.argv[1], getattr(torch, sys.argv[2]), sys.argv[3]
(op,) = [o for o in op_db if o.name == name and not o.variant_test_name]
plain = lambda a: a.detach() if torch.is_tensor(a) else a
samples = op.sample_inputs("cpu", dtype)
torch.save([(s.input.detach(), [plain(a) for a in s.args], s.kwargs) for s in samples], path)
"""


def _opinfo_samples(name: str, dtype, tmp_path):
    """PyTorch's own OpInfo samples of ``name`` (its test suite's; expecttest needed),
    on the GPU with gradients.  They are drawn in a child process: importing PyTorch's
    test suite freezes ``torch.backends`` flags for the rest of the process, and the
    other tests here set ``cudnn.allow_tf32``."""
    pytest.importorskip("expecttest")
    path = tmp_path / "samples.pt"
    subprocess.run(
        [sys.executable, "-c", _SAMPLES, name, str(dtype).split(".")[1], str(path)], check=True
    )
    grad = lambda t: t.cuda().requires_grad_() if torch.is_tensor(t) else t
    return [
        SimpleNamespace(input=grad(x), args=[grad(a) for a in args], kwargs=kwargs)
        for x, args, kwargs in torch.load(path)
    ]


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("name", ["nn.functional.conv_transpose2d", "nn.functional.conv1d"])
def test_pytorchs_opinfo_samples_against_float64(name, dtype, tmp_path):
    """Every OpInfo sample of PyTorch's conv_transpose2d and conv1d, strict (on
    specgen's kernels, or refused for the one documented reason), values and gradients
    against PyTorch in float64 on the same values."""
    ours = {
        "nn.functional.conv_transpose2d": sg.conv_transpose2d,
        "nn.functional.conv1d": sg.conv1d,
    }
    theirs = {
        "nn.functional.conv_transpose2d": F.conv_transpose2d,
        "nn.functional.conv1d": F.conv1d,
    }
    u = {"fp32": 0.0, "fp16": 2.0**-11, "bf16": 2.0**-8}[dtype]  # the output's rounding
    sg.strict(True)
    try:
        for sample in _opinfo_samples(name, DT[dtype], tmp_path):
            leaves = [sample.input] + [a for a in sample.args if torch.is_tensor(a)]
            try:
                y = ours[name](sample.input, *sample.args, **sample.kwargs)
            except SpecError as e:
                assert "past the stride" in str(e), str(e)
                continue
            doubles = [t.detach().double().requires_grad_() for t in leaves]
            it = iter(doubles[1:])
            args = [next(it) if torch.is_tensor(a) else a for a in sample.args]
            ref = theirs[name](doubles[0], *args, **sample.kwargs)
            assert y.shape == ref.shape and y.dtype == sample.input.dtype
            dy = torch.randn_like(ref).to(y.dtype)
            got = torch.autograd.grad(y, leaves, dy)
            want = torch.autograd.grad(ref, doubles, dy.double())
            terms = max(t.numel() for t in leaves)
            bound = summed_bound(terms, 2.0**-24) + 2 * u
            for what, g, r in [("y", y, ref), *zip(("dx", "dw", "db"), got, want)]:
                err = rel_l2(g, r)
                assert err <= bound, f"{name} {sample.kwargs}: {what} {err:.2e} > {bound:.2e}"
    finally:
        sg.strict(False)


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("channels_last", [False, True])
def test_expanded_weights_are_read_as_their_values(dtype, channels_last):
    """Weights with zero strides (a sum's gradient as autograd hands it, which the
    gradient ops' own gradients take as weights) give the convolution of their values:
    the kernels never read the one stored element as if it were the whole tensor."""
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    x = torch.randn(2, 6, 9, 8, device="cuda", dtype=DT[dtype]).to(memory_format=fmt)
    w = torch.randn((), device="cuda", dtype=DT[dtype]).expand(4, 3, 3, 3)
    sg.strict(True)
    try:
        y = sg.conv2d(x, w, padding=1, groups=2)
    finally:
        sg.strict(False)
    ref = F.conv2d(x.double(), w.double(), padding=1, groups=2)
    u = {"fp32": 2.0**-24, "fp16": 2.0**-11, "bf16": 2.0**-8}[dtype]
    assert rel_l2(y, ref) <= summed_bound(27, 2.0**-24) + 2 * u


def test_the_gradient_ops_pass_opcheck_with_their_autograd():
    """The backward ops, now differentiable, as torch.library.opcheck tests them:
    schema, fake, autograd registration, AOT dispatch."""
    dy = torch.randn(2, 4, 9, 8, device="cuda", requires_grad=True)
    x = torch.randn(2, 6, 9, 8, device="cuda", requires_grad=True)
    w = torch.randn(4, 3, 3, 3, device="cuda", requires_grad=True)
    args = ([1, 1], [1, 1, 1, 1], [1, 1], 2)
    ops = torch.ops.specgen
    torch.library.opcheck(ops.conv2d_input.default, (dy, w, [2, 6, 9, 8], *args, False))
    torch.library.opcheck(ops.conv2d_weight.default, (x, dy, [4, 3, 3, 3], *args))
    torch.library.opcheck(ops.conv2d_weight_bias.default, (x, dy, [4, 3, 3, 3], *args))
    torch.library.opcheck(ops.conv2d_bias.default, (dy, [4, 3, 3, 3], [2, 6, 9, 8], *args))


def test_conv_transpose2d_under_torch_compile_and_a_cuda_graph():
    """A U-Net's up-sampling as torch.compile(fullgraph=True) traces it (the same bits
    as eager, gradients finite) and as a CUDA graph replays it."""
    model = torch.nn.Sequential(
        sg.ConvTranspose2d(8, 4, 4, stride=2, padding=1), torch.nn.ReLU(), sg.Conv2d(4, 3, 3)
    ).cuda()
    x = torch.randn(2, 8, 6, 6, device="cuda")
    eager = model(x)
    compiled = torch.compile(model, fullgraph=True)
    torch.testing.assert_close(compiled(x), eager, rtol=0, atol=0)
    compiled(x).square().sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    static_x = x.clone()
    sg.warmup(model, static_x)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        model(static_x)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        static_y = model(static_x)
    static_x.copy_(torch.randn_like(static_x))
    graph.replay()
    torch.testing.assert_close(static_y, model(static_x), rtol=0, atol=0)


@pytest.mark.parametrize("name", ["mobilenet_v2", "resnet18"])
def test_a_converted_torchvision_model_trains_as_close_to_float64_as_cudnn_in_bf16(name):
    """A whole model under bf16 autocast, channels_last (its depthwise layers on dwlane,
    its first layer's wgrad padded where the operator pads it): the output and every
    conv weight gradient finite, and no further from float64 than twice cuDNN's."""
    pytest.importorskip("torchvision")
    from specgen.torch import model as m

    found = m.accuracy(m.build(name), 8, 112, m.MODES["bf16"], sg.convert)
    (y_cudnn, dw_cudnn), (y_ours, dw_ours) = found["cuDNN"], found["specgen"]
    assert y_ours == y_ours and dw_ours == dw_ours, f"{name}: a non-finite output or gradient"
    assert y_ours <= 2 * y_cudnn and dw_ours <= 2 * dw_cudnn, found
