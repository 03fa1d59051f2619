"""The operator's bookkeeping around a kernel, with the launch stubbed: what
``weight_grads`` allocates, hands the kernel and returns, for grouped layers and for a
first layer's wgrad over padded channels.  These run wherever PyTorch is, a GPU or not
(the kernels' numbers are the GPU tier's, test_torch.py)."""

from dataclasses import dataclass, replace

import pytest

torch = pytest.importorskip("torch")

from specgen.shapes import ConvProblem, DType, Op, TensorLayout  # noqa: E402
from specgen.tensors import Role  # noqa: E402
from specgen.torch import _engine as E  # noqa: E402


@dataclass
class Kernel:
    problem: ConvProblem
    grads32: str = ""


@dataclass
class Layer:
    """A layer whose wgrad is computed as ``computed`` (the problem ``choose.
    computed_problem`` gives), on the CPU."""

    computed: ConvProblem
    w_size: tuple
    device: torch.device = torch.device("cpu")
    pads: tuple = (1,) * 4  # the layer's own, whose window ``computed`` may crop
    dilation: tuple = (1, 1)
    w_stride: tuple | None = None
    window = E.Layer.window
    crop_offset = E.Layer.crop_offset

    def kernel(self, op, bias, batch, grads32=""):
        assert op is Op.WGRAD
        return Kernel(replace(self.computed, batch=batch), grads32)


@pytest.fixture
def launched(monkeypatch):
    """The tensors each stubbed launch was given; it writes dw's elements' own indices
    (and db's) so that what comes back can be traced to where the kernel wrote it."""
    seen = []

    def launch(k, tensors, batch, device, w=None, bias=None):
        seen.append(tensors)
        for role in (Role.DW, Role.DB):
            if role in tensors:
                t = tensors[role]
                t.copy_(torch.arange(t.numel(), dtype=t.dtype).reshape(t.shape))

    monkeypatch.setattr(E, "launch", launch)
    return seen


def problem(**kw):
    base = dict(C=32, M=32, H=10, W=10, R=3, S=3, pads=(1,) * 4, op=Op.WGRAD)
    return ConvProblem(**dict(base, **kw))


@pytest.mark.parametrize("groups", [1, 4, 32])
@pytest.mark.parametrize("layout", [TensorLayout.NCHW, TensorLayout.NHWC])
def test_a_grouped_wgrad_returns_its_groups_channels(launched, groups, layout):
    """dw is [M][C/groups][R][S], allocated so and returned as the kernel wrote it."""
    fmt = torch.channels_last if layout is TensorLayout.NHWC else torch.contiguous_format
    p = problem(groups=groups, layout=layout)
    lay = Layer(p, (32, 32 // groups, 3, 3))
    x = torch.randn(2, 32, 10, 10).contiguous(memory_format=fmt)
    dy = torch.randn(2, 32, 10, 10).contiguous(memory_format=fmt)
    dw, db = E.weight_grads(lay, x, dy, bias=True)
    (given,) = launched
    assert given[Role.DW].shape == dw.shape == (32, 32 // groups, 3, 3)
    assert torch.equal(dw, given[Role.DW]) and db.shape == (32,)
    assert given[Role.X] is x or torch.equal(given[Role.X], x)


def test_a_first_layers_wgrad_over_padded_channels_gives_back_its_own(launched):
    """A 3-channel wgrad computed over 8 channels: x reaches the kernel with five zero
    channels after its own, and dw comes back [M][3][R][S], the kernel's first three
    channels' sums, dense, in fp32 in the weights' format where grads32 asks."""
    nhwc = TensorLayout.NHWC
    p = problem(C=8, M=16, R=7, S=7, pads=(3,) * 4, dtype=DType.BF16, layout=nhwc)
    lay = Layer(p, (16, 3, 7, 7))
    x = torch.randn(2, 3, 10, 10, dtype=torch.bfloat16).contiguous(
        memory_format=torch.channels_last
    )
    dy = torch.randn(2, 16, 10, 10, dtype=torch.bfloat16).contiguous(
        memory_format=torch.channels_last
    )
    for grads32, fmt in (("", torch.contiguous_format), ("mrsc", torch.channels_last)):
        launched.clear()
        dw = E.weight_grads(lay, x, dy, bias=False, grads32=grads32)
        (given,) = launched
        wide = given[Role.X]
        assert wide.shape == (2, 8, 10, 10) and wide.is_contiguous(
            memory_format=torch.channels_last
        )
        assert torch.equal(wide[:, :3], x) and not wide[:, 3:].any()
        assert given[Role.DW].shape == (16, 8, 7, 7)
        assert dw.shape == (16, 3, 7, 7) and dw.is_contiguous(memory_format=fmt)
        assert torch.equal(dw, given[Role.DW][:, :3])
        assert dw.dtype is (torch.float32 if grads32 else torch.bfloat16)


def test_a_cropped_window_gives_back_zeros_past_its_taps(launched):
    """A 3x3 wgrad over 1x1 maps computed as a 1x1 one (``choose.cropped``): dw comes
    back [M][C][3][3], the kernel's sums at the centre tap and zeros at the other
    eight, dense in the tensors' dtype, or in fp32 in the weights' format where grads32
    asks."""
    p = problem(C=8, M=16, H=1, W=1, R=1, S=1, pads=(0,) * 4)
    lay = Layer(p, (16, 8, 3, 3))
    x, dy = torch.randn(2, 8, 1, 1), torch.randn(2, 16, 1, 1)
    for grads32, fmt in (("", torch.contiguous_format), ("mrsc", torch.channels_last)):
        launched.clear()
        dw = E.weight_grads(lay, x, dy, bias=False, grads32=grads32)
        (given,) = launched
        assert given[Role.DW].shape == (16, 8, 1, 1)
        assert dw.shape == (16, 8, 3, 3) and dw.is_contiguous(memory_format=fmt)
        assert torch.equal(dw[:, :, 1:2, 1:2], given[Role.DW])
        dw[:, :, 1, 1] = 0
        assert not dw.any()


def test_the_wgrads_compiled_ahead_write_dw_in_the_weights_order():
    """precompile_model's order for each layer's fp32 dw: the weights' own memory format
    under autocast's cast, channels_last fp32 weights' outside it, none for weights the
    operator's wgrad writes in the tensors' dtype."""
    from specgen.torch._trace import dw_orders

    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), torch.nn.Conv2d(8, 8, 1))
    assert dw_orders(model, autocast=True) == {"0": "mcrs", "1": "mcrs"}
    assert dw_orders(model, autocast=False) == {}
    model = model.to(memory_format=torch.channels_last)
    assert dw_orders(model, autocast=True) == {"0": "mrsc", "1": "mrsc"}
    assert dw_orders(model, autocast=False) == {"0": "mrsc", "1": "mrsc"}
    assert dw_orders(model.half(), autocast=True) == {}


@pytest.mark.parametrize(
    "dgrad,wgrad,moved",
    [
        (TensorLayout.NHWC, TensorLayout.NHWC, True),
        (TensorLayout.NHWC, TensorLayout.NCHW, False),
        (TensorLayout.NCHW, TensorLayout.NCHW, False),
    ],
)
def test_dy_is_moved_once_for_dgrad_and_wgrad_where_both_compute_in_the_other_layout(
    dgrad, wgrad, moved
):
    """An NCHW layer whose dgrad and wgrad both compute in NHWC gets dy in NHWC once,
    for both (each then finds it dense there); otherwise dy dense in the layer's layout,
    as it came, and a channels_last dy goes straight to NHWC kernels."""

    class Both:
        layout = TensorLayout.NCHW

        def kernel(self, op, bias, batch, grads32=""):
            layout = dgrad if op is Op.DGRAD else wgrad
            return Kernel(problem(op=op, layout=layout, batch=batch), grads32)

    dy = torch.randn(2, 32, 10, 10)
    out = E.shared_dy(Both(), dy, bias=True)
    assert torch.equal(out, dy)
    assert out.is_contiguous(memory_format=torch.channels_last) is moved
    assert (out is dy) is not moved
    cl = dy.contiguous(memory_format=torch.channels_last)
    assert (E.shared_dy(Both(), cl, bias=True) is cl) is moved


@pytest.mark.parametrize("op", [Op.FPROP, Op.DGRAD])
@pytest.mark.parametrize("groups", [1, 2])
@pytest.mark.parametrize("dtype, layout", [(DType.FP32, "nchw"), (DType.BF16, "nhwc")])
def test_storage_offsets_read_the_packed_order_from_either_memory_format(op, groups, dtype, layout):
    """Read at ``storage_offsets``, a weight tensor's storage (contiguous or
    channels_last) gives the weights in the order the kernel's packing puts them
    (``_packed_ids``: PyTorch's own order, ckkm or mrsc, dgrad's flip and swap too)."""
    from types import SimpleNamespace

    from specgen.choose import choose
    from specgen.plan import make_plan

    p = ConvProblem(
        batch=2, C=8, M=16, H=9, W=7, R=3, S=2, pads=(1, 1, 0, 1), groups=groups,
        dtype=dtype, layout=TensorLayout(layout), op=op,
    )  # fmt: skip
    plan = make_plan(p, choose(p, "NVIDIA H200", False, "sm_90").variant)
    k = SimpleNamespace(problem=p, conv=SimpleNamespace(plan=plan, shape=p))
    ids = E._packed_ids(k.conv)
    w = torch.randn(E.w_shape(p), dtype=torch.float64)
    for form in (torch.contiguous_format, torch.channels_last):
        stored = w.contiguous(memory_format=form)
        flat = torch.as_strided(stored, (stored.numel(),), (1,))  # the storage in order
        at = torch.as_tensor(E.storage_offsets(k, stored.stride()))
        want = w.reshape(-1) if ids is None else w.reshape(-1)[torch.as_tensor(ids)]
        assert torch.equal(flat[at], want)


@pytest.mark.parametrize("op", [Op.FPROP, Op.DGRAD])
@pytest.mark.parametrize("dtype, layout", [(DType.FP32, "nchw"), (DType.BF16, "nhwc")])
def test_a_cropped_windows_packing_reads_its_taps_from_the_whole_weights(op, dtype, layout):
    """The packing of a kernel whose window ``computed`` cropped (resnet18's layer4.0.conv1
    at 32x32: 2x2 of 3x3 taps) reads the whole weights' storage, contiguous or
    channels_last, at ``storage_offsets`` in their strides plus ``Layer.crop_offset``:
    the kept taps' values in the kernel's packed order, as the view ``Layer.window``
    gives them, copied dense."""
    from types import SimpleNamespace

    from specgen.choose import choose, cropped
    from specgen.plan import make_plan

    whole = ConvProblem(
        batch=128, C=16, M=32, H=2, W=2, R=3, S=3, pads=(1,) * 4, stride=(2, 2),
        dtype=dtype, layout=TensorLayout(layout), op=op,
    )  # fmt: skip
    p = cropped(whole)
    assert (p.R, p.S) == (2, 2)
    plan = make_plan(p, choose(p, "NVIDIA H200", False, "sm_90").variant)
    k = SimpleNamespace(problem=p, conv=SimpleNamespace(plan=plan, shape=p))
    w = torch.randn(32, 16, 3, 3, dtype=torch.float64)
    for form in (torch.contiguous_format, torch.channels_last):
        stored = w.contiguous(memory_format=form)
        lay = Layer(p, (32, 16, 3, 3), w_stride=stored.stride())
        flat = torch.as_strided(stored, (stored.numel(),), (1,))
        at = torch.as_tensor(E.storage_offsets(k, stored.stride()) + lay.crop_offset(k))
        kept = lay.window(stored, k).contiguous()
        want = torch.as_tensor(E.storage_offsets(k, kept.stride()))
        assert torch.equal(flat[at], kept.reshape(-1)[want])
