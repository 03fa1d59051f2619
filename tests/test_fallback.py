"""The operator's fallback: what specgen's kernels do not serve runs on PyTorch's own
convolution (CPU and float64 tensors, arguments it refuses), logged once a problem, and
raises what PyTorch raises; strict, it is refused.  These run wherever PyTorch is, a GPU
or not (the GPU cases are in test_torch.py)."""

import copy
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


def _transposed_cases(rng, count):
    """Drawn transposed convolutions: stride, dilation, padding, output padding below the
    stride, groups, rectangular windows."""
    out = []
    while len(out) < count:
        g = int(rng.integers(1, 4))
        ci, co = g * int(rng.integers(1, 4)), g * int(rng.integers(1, 4))
        k = (int(rng.integers(1, 5)), int(rng.integers(1, 5)))
        s = (int(rng.integers(1, 4)), int(rng.integers(1, 4)))
        d = (int(rng.integers(1, 3)), int(rng.integers(1, 3)))
        p = (int(rng.integers(0, 3)), int(rng.integers(0, 3)))
        op = (int(rng.integers(0, max(s[0], d[0]))), int(rng.integers(0, max(s[1], d[1]))))
        h, w = int(rng.integers(1, 7)), int(rng.integers(1, 7))
        size = [
            (n - 1) * st - 2 * pp + dd * (kk - 1) + o + 1
            for n, st, pp, dd, kk, o in zip((h, w), s, p, d, k, op)
        ]
        if min(size) >= 1:
            out.append((ci, co, h, w, k, s, p, op, g, d))
    return out


def test_a_transposed_convolution_is_the_dgrad_of_its_adjoint_convolution():
    """What ``conv_transpose2d`` runs on the GPU, replayed in float64 on the CPU: the
    output size and the pads of the adjoint convolution (``_args.transposed``), and
    that convolution's dgrad (``reference.conv2d_dgrad``) equal PyTorch's
    ``conv_transpose2d`` on 60 drawn problems, output paddings up to the dilation."""
    import numpy as np

    from specgen import reference
    from specgen.shapes import DType, Op, TensorLayout
    from specgen.torch import _engine as E
    from specgen.torch._args import transposed

    rng = np.random.default_rng()
    served = 0
    for ci, co, h, w, k, s, p, op, g, d in _transposed_cases(rng, 60):
        x = torch.randn(2, ci, h, w, dtype=torch.float64)
        wt = torch.randn(ci, co // g, *k, dtype=torch.float64)
        want = F.conv_transpose2d(x, wt, None, s, p, op, g, d)
        try:
            y_size, pads = transposed(x.shape, wt.shape, s, (p[0], p[0], p[1], p[1]), op, d, g)
        except SpecError:  # an output padding past the stride and the padding: PyTorch's
            assert any(o >= st and o > pp + st - 1 for o, st, pp in zip(op, s, p))
            continue
        served += 1
        assert y_size == list(want.shape)
        conv = E.problem(
            Op.DGRAD, y_size, wt.shape, False, s, pads, d, g, DType.FP32, TensorLayout.NCHW
        )
        assert E.out_size(y_size, wt.shape, s, pads, d)[2:] == [h, w]
        got = reference.conv2d_dgrad(x.numpy(), wt.numpy(), conv)
        assert np.allclose(got, want.numpy(), rtol=1e-12, atol=1e-12)
    assert served >= 40


def test_conv_transpose2d_off_the_gpu_is_pytorchs():
    """On the CPU and in float64: PyTorch's values and gradients, bit for bit; the
    module with ``output_size``, ``convert``, and PyTorch's exceptions for bad
    arguments; strict, a SpecError."""
    for dtype in (torch.float32, torch.float64):
        x = torch.randn(2, 4, 5, 6, dtype=dtype, requires_grad=True)
        w = torch.randn(4, 3, 3, 3, dtype=dtype, requires_grad=True)
        b = torch.randn(6, dtype=dtype, requires_grad=True)
        args = (2, 1, 1, 2, 1)  # stride, padding, output_padding, groups, dilation
        got, want = sg.conv_transpose2d(x, w, b, *args), F.conv_transpose2d(x, w, b, *args)
        assert torch.equal(got, want)
        dy = torch.randn_like(want)
        for g, r in zip(
            torch.autograd.grad(got, (x, w, b), dy), torch.autograd.grad(want, (x, w, b), dy)
        ):
            assert torch.equal(g, r)
    model = torch.nn.Sequential(torch.nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1))
    want = model[0](x.detach().float(), output_size=[10, 12])
    sg.convert(model)
    assert type(model[0]) is sg.ConvTranspose2d
    assert torch.equal(model[0](x.detach().float(), output_size=[10, 12]), want)
    with pytest.raises(RuntimeError, match="output padding must be smaller"):
        sg.conv_transpose2d(x.detach().float(), w.detach().float(), None, 1, 0, 1)
    with pytest.raises(RuntimeError):
        sg.conv_transpose2d(x.detach().float(), w.detach().float()[:3])  # channels
    sg.strict(True)
    with pytest.raises(SpecError):
        sg.conv_transpose2d(x.detach().float(), w.detach().float())


def test_the_ddp_example_trains_two_ranks_on_the_cpu(tmp_path):
    """examples/ddp.py under torchrun with gloo on the CPU, where the operator runs
    PyTorch's convolution: both ranks train, and specgen's losses are cuDNN's model's
    bit for bit, each as far from the float64 copy's as fp32 rounding takes it (the GPU
    run, NCCL and specgen's kernels, is the figure that counts)."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root), CUDA_VISIBLE_DEVICES="")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    cmd += ["--standalone", str(root / "examples" / "ddp.py"), "--steps", "2", "--batch", "4"]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["world"] == 2 and len(report["ranks"]) == 2
    assert report["max_loss_difference"] == 0.0
    # fp32 beside the float64 reference: as far as fp32's rounding takes it, and no further
    drift = report["max_drift_from_float64"]
    assert drift["cudnn"] == drift["specgen"] and 0 < drift["cudnn"] < 1e-5


# Run apart (its registrations last as long as its process): the registered ops' CPU
# kernels replaced by PyTorch's convolution and its gradients in float64, so that
# gradcheck and gradgradcheck test the ops' own autograd formulas, the ones specgen's
# kernels run under on the GPU.
_FORMULAS = r"""
import torch, torch.nn.functional as F
from torch.nn.grad import conv2d_input as dgrad, conv2d_weight as wgrad
import specgen.torch  # registers torch.ops.specgen.*

def two(p):
    assert p[0] == p[1] and p[2] == p[3]
    return (p[0], p[2])

kernels = dict(
    conv2d=lambda x, w, b, s, p, d, g: F.conv2d(x, w, b, s, two(p), d, g),
    conv2d_input=lambda dy, w, size, s, p, d, g, cl: dgrad(size, w, dy, s, two(p), d, g),
    conv2d_weight=lambda x, dy, size, s, p, d, g: wgrad(x, size, dy, s, two(p), d, g),
    conv2d_weight_bias=lambda x, dy, size, s, p, d, g: (
        wgrad(x, size, dy, s, two(p), d, g), dy.sum((0, 2, 3))),
    conv2d_bias=lambda dy, wsize, xsize, s, p, d, g: dy.sum((0, 2, 3)),
)
lib = torch.library.Library("specgen", "IMPL")
# replacing a Python kernel is opt-in where PyTorch's Library.impl takes allow_override
import inspect
over = {"allow_override": True} if "allow_override" in inspect.signature(lib.impl).parameters else {}
for name, fn in kernels.items():
    lib.impl(name, fn, "CPU", **over)
ops = torch.ops.specgen
f64 = dict(dtype=torch.float64, requires_grad=True)
args = ([2, 1], [1, 1, 2, 2], [1, 2], 2)
x, w, b = torch.randn(2, 4, 7, 6, **f64), torch.randn(6, 2, 3, 3, **f64), torch.randn(6, **f64)
conv = lambda x, w, b: ops.conv2d(x, w, b, *args)
assert torch.autograd.gradcheck(conv, (x, w, b))
assert torch.autograd.gradgradcheck(conv, (x, w, b))
# conv_transpose2d's forward: dgrad of the adjoint convolution, differentiable twice
y = torch.randn(2, 6, 4, 6, **f64)
up = lambda y, w: ops.conv2d_input(y, w, [2, 4, 7, 6], *args, False)
assert torch.autograd.gradgradcheck(up, (y, w))
wg = lambda x, dy: ops.conv2d_weight_bias(x, dy, [6, 2, 3, 3], *args)
assert torch.autograd.gradgradcheck(wg, (x, y))
print("ok")
"""


def test_the_gradient_ops_autograd_passes_gradgradcheck():
    """conv2d's gradients, their gradients, and the transposed convolution's, by the
    formulas the registered ops carry (their kernels here PyTorch's, in float64)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, PYTHONPATH=str(root))
    run = subprocess.run(
        [sys.executable, "-c", _FORMULAS], env=env, capture_output=True, text=True, timeout=240
    )
    assert run.returncode == 0 and run.stdout.strip() == "ok", run.stderr[-3000:]


def test_a_traced_transposed_convolution_is_its_adjoint_convolutions_ops():
    """``conv_layers`` (what warmup compiles and ``specgen model --plan`` lists) holds a
    ConvTranspose2d call as the convolution it is the adjoint of: its forward that
    one's dgrad, its gradients that one's fprop and wgrad, the sizes matching PyTorch's."""
    from specgen.shapes import Op
    from specgen.torch._engine import out_size
    from specgen.torch._trace import conv_layers

    up = torch.nn.ConvTranspose2d(8, 4, 3, stride=2, padding=1, output_padding=1)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2, padding=1), up)
    x = torch.randn(2, 3, 16, 16)
    first, second = conv_layers(model, x)
    assert not first.transposed and first.ops() == [Op.FPROP, Op.WGRAD]
    assert second.transposed and second.ops() == [Op.DGRAD, Op.FPROP, Op.WGRAD]
    y = model(x)
    assert second.x_size == tuple(y.shape) and second.w_size == tuple(up.weight.shape)
    h = model[0](x)
    assert out_size(second.x_size, second.w_size, second.stride, second.pads, second.dilation) == (
        list(h.shape)
    )


def test_a_converted_models_first_cuda_call_compiles_every_kernel_at_once(monkeypatch):
    """The first call on CUDA tensors traces the model and compiles its kernels at once
    (the backward's too in training with gradients on), then never again; CPU calls
    leave it for later; a copy of the model keeps its own; under autotuning, with every
    candidate the tunes will time.  (Stand-ins for the CUDA tensors and the compiler:
    this runs wherever PyTorch is.)"""
    from specgen.torch import _trace

    calls = []

    def compiles(m, ex, back, autotune=False):
        calls.append((back, True) if autotune else back)

    monkeypatch.setattr(_trace, "precompile_model", compiles)
    model = sg.convert(torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU()))
    x = torch.randn(1, 3, 8, 8)
    assert torch.equal(model(x), F.relu(F.conv2d(x, model[0].weight, model[0].bias)))
    assert calls == []  # on the CPU: PyTorch's convolution, nothing to compile
    monkeypatch.setattr(sg, "_on_cuda", lambda args: True)
    twin = copy.deepcopy(model).eval()
    model(x)
    model(x)
    assert calls == [True]
    with torch.no_grad():
        twin(x)
    assert calls == [True, False]
    sg.autotune(True)
    try:
        fresh = sg.convert(torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3)))
        fresh(x)  # its candidates compiled ahead too; the tunes run as it goes
    finally:
        sg.autotune(False)
    assert calls == [True, False, (True, True)]

    def fails(m, ex, back, autotune=False):
        raise KeyError("a model the meta trace cannot run")

    monkeypatch.setattr(_trace, "precompile_model", fails)
    odd = sg.convert(torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3)))
    assert torch.equal(odd(x), F.conv2d(x, odd[0].weight, odd[0].bias))  # runs regardless


def test_torch_compile_takes_a_converted_model_off_the_gpu():
    """fullgraph=True traces the fallback (and the first call's compile-ahead hook)
    without a break: the values and the input's gradient are eager PyTorch's."""
    model = sg.convert(
        torch.nn.Sequential(
            torch.nn.Conv2d(3, 8, 3), torch.nn.ReLU(), torch.nn.ConvTranspose2d(8, 4, 3, stride=2)
        )
    )
    compiled = torch.compile(model, fullgraph=True, backend="eager")
    x = torch.randn(2, 3, 9, 9, requires_grad=True)
    y = compiled(x)
    (dx,) = torch.autograd.grad(y.sum(), x)
    ref = F.conv_transpose2d(
        F.relu(F.conv2d(x, model[0].weight, model[0].bias)), model[2].weight, model[2].bias, 2
    )
    torch.testing.assert_close(y, ref)
    torch.testing.assert_close(dx, torch.autograd.grad(ref.sum(), x)[0])


class _OnCuda:
    """A stand-in for a CUDA tensor where only what the eager path's lookup reads off a
    tensor is asked (sizes, strides, dtype, device, memory format): a CPU tensor's."""

    is_cuda = True
    device = torch.device("cuda", 0)

    def __init__(self, t):
        self.t, self.shape, self.dtype = t, t.shape, t.dtype

    def stride(self):
        return self.t.stride()

    def get_device(self):
        return 0

    def dim(self):
        return self.t.dim()

    def is_contiguous(self, memory_format=torch.contiguous_format):
        return self.t.is_contiguous(memory_format=memory_format)

    def contiguous(self, memory_format=torch.contiguous_format):
        return _OnCuda(self.t.contiguous(memory_format=memory_format))


def test_the_eager_lookup_keeps_a_layer_a_call_and_tells_transposed_calls_apart():
    """``_engine.layer`` and ``transposed_layer`` find one layer for repeated calls of
    the same tensors and arguments (a hit checks nothing and returns x as it is, or
    dense), another for another output size of a transposed convolution, and never mix
    a convolution's entry with a transposed one's; a bad dtype is one SpecError."""
    from specgen.shapes import DType, TensorLayout
    from specgen.torch import _engine as E

    E._eager.clear()
    x = _OnCuda(torch.empty(2, 8, 9, 9))
    w = _OnCuda(torch.empty(16, 8, 3, 3))
    args = ((2, 2), (1, 1, 1, 1), (1, 1), 1)
    lay, xd = E.layer(x, w, None, *args)
    assert xd is x and lay.layout is TensorLayout.NCHW and lay.dtype is DType.FP32
    assert lay.x_rest == (8, 9, 9) and lay.y_rest == (16, 5, 5)
    assert E.layer(x, w, None, *args)[0] is lay and len(E._eager) == 1
    # the transposed convolution of a [2, 16, 5, 5] input with these weights: this
    # layer's dgrad, for two output sizes (output padding 0 and 1)
    dy = _OnCuda(torch.empty(2, 16, 5, 5))
    t9, _ = E.transposed_layer(dy, w, (2, 8, 9, 9), *args)
    t10, _ = E.transposed_layer(dy, w, (2, 8, 10, 10), *args[:1], (1, 2, 1, 2), *args[2:])
    assert t9 is lay and t10 is not lay and t10.x_rest == (8, 10, 10)
    assert len(E._eager) == 3
    cl = _OnCuda(torch.empty(2, 8, 9, 9).contiguous(memory_format=torch.channels_last))
    lay_cl, xd = E.layer(cl, w, None, *args)
    assert lay_cl.layout is TensorLayout.NHWC and xd is cl
    strided = _OnCuda(torch.empty(2, 9, 9, 8).permute(0, 3, 2, 1))
    _, xd = E.layer(strided, w, None, *args)
    assert xd is not strided and xd.is_contiguous()
    with pytest.raises(SpecError, match="float64"):
        E.layer(_OnCuda(torch.empty(2, 8, 9, 9, dtype=torch.float64)), w, None, *args)
    E._eager.clear()


def test_one_launch_packs_two_kernels_weights_where_both_pack_them_or_it_rounds():
    """``Cast.serves``, read off stand-in kernels: autocast's rounding cast always
    serves; outside it one gather serves two kernels that both pack the weights into one
    stored dtype it writes (the weights' own or fp32), not a kernel that reads them as
    they lie, nor two stored dtypes, nor one kernel."""
    from types import SimpleNamespace as NS

    from specgen.shapes import DType
    from specgen.torch import _engine as E

    def kernel(dtype, fmt, gather=True, storage_order=False):
        return NS(
            problem=NS(dtype=dtype),
            conv=NS(plan=NS(weight_format=fmt)),
            gather=object() if gather else None,
            storage_order=storage_order,
        )

    f32, b16 = kernel(DType.FP32, "mrsc.fp32"), kernel(DType.BF16, "mrsc.bf16")
    cl, plain = torch.channels_last, torch.contiguous_format
    assert E.Cast.serves([b16], torch.float32, plain)  # autocast: rounds, one kernel too
    assert E.Cast.serves([f32, f32], torch.float32, plain)
    assert E.Cast.serves([b16, b16], torch.bfloat16, cl)
    wide = [kernel(DType.BF16, "f32"), kernel(DType.BF16, "mrsc.fp32")]
    assert E.Cast.serves(wide, torch.bfloat16, plain)  # both stored fp32
    assert not E.Cast.serves([f32], torch.float32, plain)
    assert not E.Cast.serves([f32, kernel(DType.FP32, "f32", gather=False)], torch.float32, plain)
    assert not E.Cast.serves([b16, kernel(DType.BF16, "mrsc.fp32")], torch.bfloat16, plain)
    in_place = kernel(DType.BF16, "mrsc.bf16", storage_order=True)
    assert not E.Cast.serves([b16, in_place], torch.bfloat16, cl)
    assert E.Cast.serves([b16, in_place], torch.bfloat16, plain)


@pytest.mark.parametrize(
    "args, message",
    [
        (
            ([1, 1], [1, 1], [1, 1], 1),
            r"padding as 4 ints \(top, bottom, left, right\), got padding=\[1, 1\]",
        ),
        (([1], [1, 1, 1, 1], [1, 1], 1), r"stride as 2 ints, got stride=\[1\]"),
        (([1, 1], [1, 1, 1, 1], [1, 1, 1], 1), r"dilation as 2 ints"),
        (([0, 1], [1, 1, 1, 1], [1, 1], 1), "non-positive stride"),
        (([1, 1], [1, 1, 1, 1], [1, 0], 1), "non-positive dilation"),
        (([1, 1], [1, -1, 1, 1], [1, 1], 1), "negative padding"),
        (([1, 1], [1, 1, 1, 1], [1, 1], 0), "non-positive groups"),
    ],
)
def test_the_registered_ops_refuse_malformed_arguments_as_pytorch_does(args, message):
    """Called directly, every registered op (and its fake, which torch.compile traces)
    checks its argument lists before reading a tensor: a RuntimeError naming the
    argument, where a 2-int padding (aten's form) used to end in an IndexError deep in
    the engine."""
    ops = torch.ops.specgen
    x, dy = torch.randn(2, 4, 8, 8), torch.randn(2, 6, 8, 8)
    w = torch.randn(6, 4, 3, 3)
    calls = [
        lambda: ops.conv2d(x, w, None, *args),
        lambda: ops.conv2d_input(dy, w, [2, 4, 8, 8], *args, False),
        lambda: ops.conv2d_weight(x, dy, [6, 4, 3, 3], *args),
        lambda: ops.conv2d_weight_bias(x, dy, [6, 4, 3, 3], *args),
        lambda: ops.conv2d_bias(dy, [6, 4, 3, 3], [2, 4, 8, 8], *args),
    ]
    for call in calls:
        with pytest.raises(RuntimeError, match=message):
            call()
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x, dy = torch.empty(2, 4, 8, 8, device="cuda"), torch.empty(2, 6, 8, 8, device="cuda")
        w = torch.empty(6, 4, 3, 3, device="cuda")
        for call in calls:
            with pytest.raises(RuntimeError, match=message):
                call()


def test_well_formed_arguments_still_reach_the_tensor_checks():
    """The argument check lets a well-formed call through to the tensors' own check:
    CPU tensors are refused in one line, as before."""
    x, w = torch.randn(2, 4, 8, 8), torch.randn(6, 4, 3, 3)
    with pytest.raises(SpecError, match="runs on CUDA tensors"):
        torch.ops.specgen.conv2d(x, w, None, [1, 1], [1, 1, 1, 1], [1, 1], 1)
