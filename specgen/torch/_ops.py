"""specgen's convolution as PyTorch custom operators: the forward pass and the three
backward ops it differentiates through (``torch.ops.specgen.*``).  Each has an exact
fake implementation (shape, dtype, memory format), so that ``torch.compile`` traces
them without running a kernel; autograd of ``conv2d`` calls specgen's own dgrad, wgrad
and bias-gradient kernels.

The arguments are normalized by ``specgen.torch.conv2d`` before they get here: 4-D
tensors, stride and dilation as 2 ints, padding as 4 (top, bottom, left, right)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import List, Optional

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from ..errors import SpecError
from ..shapes import Op, TensorLayout
from ..tensors import Role
from . import _engine as E

# The ops are defined on a Library and their Python kernels registered for the CUDA
# and CPU dispatch keys directly: the same dispatcher entries that
# ``torch.library.custom_op`` makes, without its per-call wrapper (which cost more host
# time than the launch itself on small layers).  CPU tensors reach the kernel too, which
# refuses them in one line.
_lib = torch.library.Library("specgen", "DEF")


def _op(schema: str):
    def register(fn):
        name = schema.split("(")[0]
        _lib.define(schema)
        for key in ("CUDA", "CPU"):
            _lib.impl(name, fn, key)
        return fn

    return register


def _fake(name: str):
    return torch.library.register_fake(f"specgen::{name}", lib=_lib)


def out_size(x_size, w_size, stride, padding, dilation) -> list:
    N, _, H, W = x_size
    M, _, R, S = w_size
    Ho = (H + padding[0] + padding[1] - dilation[0] * (R - 1) - 1) // stride[0] + 1
    Wo = (W + padding[2] + padding[3] - dilation[1] * (S - 1) - 1) // stride[1] + 1
    return [N, M, Ho, Wo]


def _fmt(channels_last: bool):
    return torch.channels_last if channels_last else torch.contiguous_format


def _nhwc(layout: TensorLayout) -> bool:
    return layout is TensorLayout.NHWC


def _check(*tensors: Tensor) -> None:
    first = tensors[0]
    for t in tensors:
        if not t.is_cuda:
            raise SpecError(f"specgen's convolution runs on CUDA tensors, got one on {t.device}")
        if t.device != first.device:
            raise SpecError(f"tensors on {first.device} and {t.device}: put them on one device")
        if t.dtype != first.dtype:
            raise SpecError(
                f"tensors of {first.dtype} and {t.dtype}: specgen's convolution takes one "
                "dtype for all (autocast casts them for you)"
            )
    E.dtype_of(first)


def _check_bias(bias: Tensor, x: Tensor) -> None:
    """The bias in the tensors' dtype or in fp32, which the kernels add in (autocast
    leaves an fp32 bias as it is: casting it would cost two copies a call)."""
    if bias.dtype != x.dtype and bias.dtype != torch.float32:
        raise SpecError(f"a bias of {bias.dtype} for tensors of {x.dtype}: give it in either")
    if bias.device != x.device:
        raise SpecError(
            f"tensors on {x.device} and a bias on {bias.device}: put them on one device"
        )


@_op(
    "conv2d(Tensor x, Tensor weight, Tensor? bias, int[] stride, int[] padding, int[] dilation, "
    "int groups) -> Tensor"
)
def conv2d(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    stride: List[int],
    padding: List[int],
    dilation: List[int],
    groups: int,
) -> Tensor:
    _check(x, weight)
    if bias is not None:
        _check_bias(bias, x)
    layout = E.layout_of(x)
    x = E.dense(x, layout)
    k = E.kernel(
        Op.FPROP,
        x.shape,
        weight.shape,
        bias is not None,
        stride,
        padding,
        dilation,
        groups,
        E.dtype_of(x),
        layout,
        x.device,
    )
    y = E.empty(out_size(x.shape, weight.shape, stride, padding, dilation), x, layout)
    E.launch(k, {Role.X: x, Role.Y: y}, x.shape[0], x.device, w=weight, bias=bias)
    return y


@_fake("conv2d")
def _(x, weight, bias, stride, padding, dilation, groups):
    size = out_size(x.shape, weight.shape, stride, padding, dilation)
    fmt = _fmt(_nhwc(E.layout_of(x)))
    return torch.empty(size, dtype=x.dtype, device=x.device, memory_format=fmt)


@_op(
    "conv2d_input(Tensor dy, Tensor weight, int[] x_size, int[] stride, int[] padding, "
    "int[] dilation, int groups, bool channels_last) -> Tensor"
)
def conv2d_input(
    dy: Tensor,
    weight: Tensor,
    x_size: List[int],
    stride: List[int],
    padding: List[int],
    dilation: List[int],
    groups: int,
    channels_last: bool,
) -> Tensor:
    """dx: the adjoint of the convolution applied to dy (dgrad)."""
    _check(dy, weight)
    layout = TensorLayout.NHWC if channels_last else TensorLayout.NCHW
    dy = E.dense(dy, layout)
    k = E.kernel(
        Op.DGRAD,
        x_size,
        weight.shape,
        False,
        stride,
        padding,
        dilation,
        groups,
        E.dtype_of(dy),
        layout,
        dy.device,
    )
    dx = E.empty(x_size, dy, layout)
    E.launch(k, {Role.DY: dy, Role.DX: dx}, x_size[0], dy.device, w=weight)
    return dx


@_fake("conv2d_input")
def _(dy, weight, x_size, stride, padding, dilation, groups, channels_last):
    fmt = _fmt(channels_last)
    return torch.empty(x_size, dtype=dy.dtype, device=dy.device, memory_format=fmt)


def _weight_grads(x, dy, w_size, stride, padding, dilation, groups, bias: bool):
    _check(x, dy)
    layout = E.computed_layout(Op.WGRAD, E.layout_of(x), E.dtype_of(x), w_size, groups)
    x, dy = E.dense(x, layout), E.dense(dy, layout)
    args = (stride, padding, dilation, groups, E.dtype_of(x), layout, x.device)
    k = E.kernel(Op.WGRAD, x.shape, w_size, bias, *args)
    dw = E.empty(w_size, x, TensorLayout.NCHW)
    out = {Role.X: x, Role.DY: dy, Role.DW: dw}
    if bias:
        out[Role.DB] = E.empty([w_size[0]], x, TensorLayout.NCHW)
    if x.shape[0] == 0:  # an empty sum
        dw.zero_()
        out.get(Role.DB, dw).zero_()
    E.launch(k, out, x.shape[0], x.device)
    return (dw, out[Role.DB]) if bias else dw


@_op(
    "conv2d_weight(Tensor x, Tensor dy, int[] w_size, int[] stride, int[] padding, "
    "int[] dilation, int groups) -> Tensor"
)
def conv2d_weight(
    x: Tensor,
    dy: Tensor,
    w_size: List[int],
    stride: List[int],
    padding: List[int],
    dilation: List[int],
    groups: int,
) -> Tensor:
    """dw: dy times x, summed over the batch and the output pixels (wgrad)."""
    return _weight_grads(x, dy, w_size, stride, padding, dilation, groups, bias=False)


@_fake("conv2d_weight")
def _(x, dy, w_size, stride, padding, dilation, groups):
    return x.new_empty(w_size)


@_op(
    "conv2d_weight_bias(Tensor x, Tensor dy, int[] w_size, int[] stride, int[] padding, "
    "int[] dilation, int groups) -> (Tensor, Tensor)"
)
def conv2d_weight_bias(
    x: Tensor,
    dy: Tensor,
    w_size: List[int],
    stride: List[int],
    padding: List[int],
    dilation: List[int],
    groups: int,
) -> tuple[Tensor, Tensor]:
    """dw and db from one kernel (wgrad with the bias gradient fused)."""
    return _weight_grads(x, dy, w_size, stride, padding, dilation, groups, bias=True)


@_fake("conv2d_weight_bias")
def _(x, dy, w_size, stride, padding, dilation, groups):
    return x.new_empty(w_size), x.new_empty(w_size[0])


@_op(
    "conv2d_bias(Tensor dy, int[] w_size, int[] x_size, int[] stride, int[] padding, "
    "int[] dilation, int groups) -> Tensor"
)
def conv2d_bias(
    dy: Tensor,
    w_size: List[int],
    x_size: List[int],
    stride: List[int],
    padding: List[int],
    dilation: List[int],
    groups: int,
) -> Tensor:
    """db: dy summed over the batch and the output pixels (bgrad)."""
    _check(dy)
    layout = E.layout_of(dy)
    dy = E.dense(dy, layout)
    args = (stride, padding, dilation, groups, E.dtype_of(dy), layout, dy.device)
    k = E.kernel(Op.BGRAD, x_size, w_size, True, *args)
    db = E.empty([w_size[0]], dy, TensorLayout.NCHW)
    if dy.shape[0] == 0:  # an empty sum
        db.zero_()
    E.launch(k, {Role.DY: dy, Role.DB: db}, dy.shape[0], dy.device)
    return db


@_fake("conv2d_bias")
def _(dy, w_size, x_size, stride, padding, dilation, groups):
    return dy.new_empty(w_size[0])


def _setup(ctx, inputs, output):
    x, weight, bias, stride, padding, dilation, groups = inputs
    ctx.save_for_backward(x, weight)
    ctx.has_bias = bias is not None
    ctx.args = (stride, padding, dilation, groups)


def _gradients(ctx, dy, call):
    """dx, dw and db where asked, from specgen's dgrad, wgrad (db fused) and bgrad
    kernels; ``call``: the registered ops (traced) or their kernels (eager)."""
    x, weight = ctx.saved_tensors
    stride, padding, dilation, groups = ctx.args
    need_x, need_w, need_b = ctx.needs_input_grad[:3]
    nhwc = _nhwc(E.layout_of(x))
    dy = dy.contiguous(memory_format=_fmt(nhwc))
    dx = dw = db = None
    if need_x:
        dx = call.conv2d_input(dy, weight, list(x.shape), stride, padding, dilation, groups, nhwc)
    w_size = list(weight.shape)
    if need_w and ctx.has_bias and need_b:
        dw, db = call.conv2d_weight_bias(x, dy, w_size, stride, padding, dilation, groups)
    elif need_w:
        dw = call.conv2d_weight(x, dy, w_size, stride, padding, dilation, groups)
    elif ctx.has_bias and need_b:
        db = call.conv2d_bias(dy, w_size, list(x.shape), stride, padding, dilation, groups)
    return dx, dw, db, None, None, None, None


def _backward(ctx, dy):
    return _gradients(ctx, dy, torch.ops.specgen)


torch.library.register_autograd("specgen::conv2d", _backward, setup_context=_setup, lib=_lib)

# The kernels themselves, for the eager path.
kernels = SimpleNamespace(
    conv2d_input=conv2d_input,
    conv2d_weight=conv2d_weight,
    conv2d_weight_bias=conv2d_weight_bias,
    conv2d_bias=conv2d_bias,
)


class Conv2dFunction(torch.autograd.Function):
    """The eager path: the same kernels and gradients as ``torch.ops.specgen.conv2d``,
    without a trip through the dispatcher for each op (a third of the host time of a
    small layer's forward and backward).  ``specgen.torch.conv2d`` takes it unless
    torch.compile is tracing, which needs the registered op."""

    # forward takes ctx itself: with a separate setup_context, every apply binds the
    # arguments through inspect.signature, a fifth of the eager path's host time.
    @staticmethod
    def forward(ctx, x, weight, bias, stride, padding, dilation, groups):
        y = conv2d(x, weight, bias, stride, padding, dilation, groups)
        _setup(ctx, (x, weight, bias, stride, padding, dilation, groups), y)
        return y

    @staticmethod
    @once_differentiable  # the gradient kernels have no gradients of their own: say so
    def backward(ctx, dy):
        return _gradients(ctx, dy, kernels)
