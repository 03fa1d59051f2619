"""specgen's convolution as PyTorch custom operators: the forward pass and the three
backward ops it differentiates through (``torch.ops.specgen.*``).  Each has an exact
fake implementation (shape, dtype, memory format), so that ``torch.compile`` traces
them without running a kernel; autograd of ``conv2d`` calls specgen's own dgrad, wgrad
and bias-gradient kernels.

The arguments are normalized by ``specgen.torch.conv2d`` before they get here: 4-D
tensors, stride and dilation as 2 ints, padding as 4 (top, bottom, left, right)."""

from __future__ import annotations

from functools import partial
from typing import List, Optional

import torch
from torch import Tensor

from ..shapes import Op, TensorLayout
from . import _engine as E
from . import _replay
from ._args import refusal

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


out_size = E.out_size


def _fmt(channels_last: bool):
    return torch.channels_last if channels_last else torch.contiguous_format


def _layout(channels_last: bool) -> TensorLayout:
    return TensorLayout.NHWC if channels_last else TensorLayout.NCHW


# (name, values it takes): the ops' normalized arguments, as ``specgen.torch`` passes them
_LENGTHS = (("stride", 2), ("padding", 4), ("dilation", 2))


def _checked(stride, padding, dilation, groups) -> None:
    """The arguments of a registered op checked before any tensor is read, as PyTorch's
    convolution checks its own: a RuntimeError that names the argument, where a list of
    another length or a value no convolution takes would fail deeper down or compute
    something else."""
    for (name, n), values in zip(_LENGTHS, (stride, padding, dilation)):
        if len(values) != n:
            raise RuntimeError(
                f"specgen's convolution ops take {name} as {n} ints"
                + (" (top, bottom, left, right)" if name == "padding" else "")
                + f", got {name}={list(values)}"
            )
    message = refusal(stride, padding, dilation)
    if message:
        raise RuntimeError(message)
    if groups < 1:
        raise RuntimeError("non-positive groups is not supported")


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
    _checked(stride, padding, dilation, groups)
    lay, x = E.layer(x, weight, bias, tuple(stride), tuple(padding), tuple(dilation), groups)
    return E.forward(lay, x, weight, bias)


@_fake("conv2d")
def _(x, weight, bias, stride, padding, dilation, groups):
    _checked(stride, padding, dilation, groups)
    size = out_size(x.shape, weight.shape, stride, padding, dilation)
    fmt = _fmt(E.layout_of(x) is TensorLayout.NHWC)
    return torch.empty(size, dtype=x.dtype, device=x.device, memory_format=fmt)


def _layer(t: Tensor, weight: Optional[Tensor], x_size, layout, w_size, args):
    """The layer a gradient op of the registered path runs on (its arguments and
    tensors checked)."""
    _checked(*args)
    E.check_tensors(t, weight)
    w_stride = None if weight is None else weight.stride()
    return E.layer_of(x_size, layout, E.dtype_of(t), t.get_device(), w_size, w_stride, *args)


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
    layout = _layout(channels_last)
    args = (stride, padding, dilation, groups)
    lay = _layer(dy, weight, x_size, layout, weight.shape, args)
    return E.input_grad(lay, E.dense(dy, layout), weight)


@_fake("conv2d_input")
def _(dy, weight, x_size, stride, padding, dilation, groups, channels_last):
    _checked(stride, padding, dilation, groups)
    fmt = _fmt(channels_last)
    return torch.empty(x_size, dtype=dy.dtype, device=dy.device, memory_format=fmt)


def _weight_grads(x, dy, w_size, stride, padding, dilation, groups, bias: bool):
    lay = _layer(x, None, x.shape, E.layout_of(x), w_size, (stride, padding, dilation, groups))
    return E.weight_grads(lay, x, dy, bias)


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
    _checked(stride, padding, dilation, groups)
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
    _checked(stride, padding, dilation, groups)
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
    layout = E.layout_of(dy)
    lay = _layer(dy, None, x_size, layout, w_size, (stride, padding, dilation, groups))
    return E.bias_grad(lay, E.dense(dy, layout))


@_fake("conv2d_bias")
def _(dy, w_size, x_size, stride, padding, dilation, groups):
    _checked(stride, padding, dilation, groups)
    return dy.new_empty(w_size[0])


def _setup(ctx, inputs, output):
    x, weight, bias, stride, padding, dilation, groups = inputs
    ctx.save_for_backward(x, weight)
    ctx.has_bias = bias is not None
    ctx.args = (stride, padding, dilation, groups)


def _gradients(ctx, input_grad, weight_grads, bias_grad, needs=None):
    """dx, dw and db where autograd asks for them (``needs``: whether x, w and b want
    gradients, by default the first three of ``ctx.needs_input_grad``): dgrad, wgrad
    with db fused where both are wanted, bgrad alone; each passed in as a function of
    no arguments (``weight_grads`` of whether db comes with it), by either path."""
    need_x, need_w, need_b = needs or ctx.needs_input_grad[:3]
    need_b = need_b and ctx.has_bias
    dx = input_grad() if need_x else None
    dw = db = None
    if need_w:
        grads = weight_grads(need_b)
        dw, db = grads if need_b else (grads, None)
    elif need_b:
        db = bias_grad()
    return dx, dw, db


def _backward(ctx, dy):
    """The registered path: the gradients from the registered dgrad, wgrad (db fused)
    and bgrad ops, which torch.compile traces."""
    x, weight = ctx.saved_tensors
    args = ctx.args
    nhwc = E.layout_of(x) is TensorLayout.NHWC
    dy = dy.contiguous(memory_format=_fmt(nhwc))
    ops = torch.ops.specgen
    x_size, w_size = list(x.shape), list(weight.shape)

    def weight_grads(bias):
        op = ops.conv2d_weight_bias if bias else ops.conv2d_weight
        return op(x, dy, w_size, *args)

    dx, dw, db = _gradients(
        ctx,
        lambda: ops.conv2d_input(dy, weight, x_size, *args, nhwc),
        weight_grads,
        lambda: ops.conv2d_bias(dy, w_size, x_size, *args),
    )
    return dx, dw, db, None, None, None, None


torch.library.register_autograd("specgen::conv2d", _backward, setup_context=_setup, lib=_lib)


# The gradient ops are differentiable in turn, so that a gradient of a gradient
# (``create_graph=True``: gradient penalties, Hessian-vector products) runs on specgen's
# kernels too.  Each is linear in each of its tensors, and its derivatives are the
# convolution's other ops: dgrad's are fprop (in dy) and wgrad (in w); wgrad's are
# dgrad (in x) and fprop (in dy); bgrad's is its gradient broadcast back over dy.


def _setup_input(ctx, inputs, output):
    dy, weight, x_size, stride, padding, dilation, groups, channels_last = inputs
    ctx.save_for_backward(dy, weight)
    ctx.args = (stride, padding, dilation, groups)


def _input_backward(ctx, g):
    dy, weight = ctx.saved_tensors
    ops, need_dy, need_w = torch.ops.specgen, *ctx.needs_input_grad[:2]
    g = g.contiguous(memory_format=_fmt(E.layout_of(dy) is TensorLayout.NHWC))
    d_dy = ops.conv2d(g, weight, None, *ctx.args) if need_dy else None
    d_w = ops.conv2d_weight(g, dy, list(weight.shape), *ctx.args) if need_w else None
    return d_dy, d_w, None, None, None, None, None, None


torch.library.register_autograd(
    "specgen::conv2d_input", _input_backward, setup_context=_setup_input, lib=_lib
)


def _setup_weight(ctx, inputs, output):
    x, dy, w_size, stride, padding, dilation, groups = inputs
    ctx.save_for_backward(x, dy)
    ctx.args = (stride, padding, dilation, groups)


def _weight_backward(ctx, g, g_bias=None):
    """For conv2d_weight (``g``) and conv2d_weight_bias (``g`` and ``g_bias``)."""
    x, dy = ctx.saved_tensors
    ops, need_x, need_dy = torch.ops.specgen, *ctx.needs_input_grad[:2]
    nhwc = E.layout_of(x) is TensorLayout.NHWC
    d_x = ops.conv2d_input(dy, g, list(x.shape), *ctx.args, nhwc) if need_x else None
    d_dy = None
    if need_dy:
        d_dy = ops.conv2d(x, g, None, *ctx.args)
        if g_bias is not None:
            d_dy = d_dy + g_bias.to(d_dy.dtype).view(1, -1, 1, 1)
    return d_x, d_dy, None, None, None, None, None


torch.library.register_autograd(
    "specgen::conv2d_weight", _weight_backward, setup_context=_setup_weight, lib=_lib
)
torch.library.register_autograd(
    "specgen::conv2d_weight_bias", _weight_backward, setup_context=_setup_weight, lib=_lib
)


def _setup_bias(ctx, inputs, output):
    ctx.dy_shape = inputs[0].shape


def _bias_backward(ctx, g):
    return g.view(1, -1, 1, 1).expand(ctx.dy_shape), None, None, None, None, None, None


torch.library.register_autograd(
    "specgen::conv2d_bias", _bias_backward, setup_context=_setup_bias, lib=_lib
)


class Conv2dFunction(torch.autograd.Function):
    """The eager path: the same kernels and gradients as ``torch.ops.specgen.conv2d``
    (both run ``_engine``'s ops on the same layers), without a trip through the
    dispatcher for each op and with the layer found once, in the forward:
    ``specgen.torch.conv2d`` takes it unless torch.compile is tracing, which needs the
    registered op.  ``x`` comes dense in the layer's layout (``_engine.layer``)."""

    # forward takes ctx itself: with a separate setup_context, every apply binds the
    # arguments through inspect.signature, a fifth of the eager path's host time.
    # Each is replayed from its record where the call allows (``_replay``).
    @staticmethod
    def forward(ctx, x, weight, bias, lay):
        ctx.save_for_backward(x, weight)
        b = None if bias is None else (bias.dtype, bias.stride())
        key = (lay, x.shape[0], weight.dtype, b, ctx.needs_input_grad)
        body = partial(conv_forward, ctx, x, weight, bias, lay, ctx.needs_input_grad[0])
        return _replay.forward(ctx, _forwards, key, (x, weight, bias), body, CONV_SET)

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        if torch.is_grad_enabled():  # create_graph: the registered, differentiable ops
            return (*_differentiable(ctx, ctx.lay, x, weight, dy), None)
        body = partial(conv_backward, ctx, x, weight, dy, ctx.needs_input_grad[:3])
        inputs = (dy, x, weight, getattr(ctx, "packed", None))
        return (*_replay.backward(ctx, (dy.stride(), dy.dtype), inputs, body), None)


# What ``conv_forward`` sets on ctx: a replay sets them as it would.  The eager
# convolution's forward records by key.
CONV_SET = ("lay", "has_bias", "cast", "dgrad_w", "packed")
_forwards: dict = {}


def conv_forward(ctx, x, weight, bias, lay, dgrad: bool):
    """y of the eager path's convolution, and on ``ctx`` what ``conv_backward`` needs
    but the tensors its caller saves (x and weight); ``dgrad``: whether x wants its
    gradient.  Shared by ``Conv2dFunction`` and the node that runs a batch norm after
    the convolution (``_convnorm``)."""
    ctx.lay, ctx.has_bias = lay, bias is not None
    ctx.cast = weight.dtype is not x.dtype
    # autocast, and the model's fp32 weights: cast and packed for the forward kernel,
    # and for dgrad's where dx is wanted, in one launch (``E.Cast``; the backward
    # hands dw and db back in fp32, dw in the weights' memory format); else, where dx
    # is wanted, packed for both kernels in one gather where both pack them
    fprop = (Op.FPROP, ctx.has_bias)
    ops = (fprop, (Op.DGRAD, False)) if dgrad else (fprop,)
    packing = lay.packing(ops, x.shape[0], weight.dtype) if ctx.cast or dgrad else None
    ctx.dgrad_w = None  # dgrad packs the saved weights itself
    if packing is None:
        return E.forward(lay, x, weight, bias)
    packed, w, dgrad_w = packing(weight)
    if dgrad:  # dgrad's packing, kept for it
        ctx.packed, ctx.dgrad_w = packed, dgrad_w
    return E.forward(lay, x, w, bias)


def conv_backward(ctx, x, weight, dy, needs):
    """dx, dw and db of the eager path's convolution from dy (``needs``: whether x, w
    and b want them), with what ``conv_forward`` left on ``ctx``."""
    lay = ctx.lay
    order = lay.dw_order if ctx.cast else lay.fp32_dw  # dw's order, where it comes in fp32
    need_x, need_w = needs[:2]
    if need_x and need_w:
        dy = E.shared_dy(lay, dy, needs[2] and ctx.has_bias, order)
    else:
        dy = E.dense(dy, lay.layout)
    w = weight if ctx.dgrad_w is None else ctx.dgrad_w
    dx, dw, db = _gradients(
        ctx,
        lambda: E.input_grad(lay, dy, w),
        lambda bias: E.weight_grads(lay, x, dy, bias, order),
        lambda: E.bias_grad(lay, dy),
        needs,
    )
    if ctx.cast and dw is not None and dw.dtype is not torch.float32:
        # a kernel that writes dw in the tensors' dtype: to fp32 in the weights'
        # memory format in one op, where autograd would cast it and then copy it
        dw = dw.to(torch.float32, memory_format=lay.w_format)
    return dx, dw, db


def _differentiable(ctx, lay, x, weight, dy):
    """The eager path's gradients as the registered ops compute them, each one
    differentiable in turn: for a backward that builds a graph (``create_graph``).
    Under autocast the weights are cast as the forward cast them, so that the graph
    reaches the fp32 parameters."""
    args = (list(lay.stride), list(lay.pads), list(lay.dilation), lay.groups)
    nhwc = lay.layout is TensorLayout.NHWC
    dy = dy.contiguous(memory_format=_fmt(nhwc))
    w = weight.to(x.dtype) if ctx.cast else weight
    ops = torch.ops.specgen
    x_size, w_size = list(x.shape), list(w.shape)

    def weight_grads(bias):
        grads = (ops.conv2d_weight_bias if bias else ops.conv2d_weight)(x, dy, w_size, *args)
        if ctx.cast:  # dw (and db) back to the parameters' fp32
            return tuple(t.float() for t in grads) if bias else grads.float()
        return grads

    return _gradients(
        ctx,
        lambda: ops.conv2d_input(dy, w, x_size, *args, nhwc),
        weight_grads,
        lambda: ops.conv2d_bias(dy, w_size, x_size, *args),
    )


class ConvTranspose2dFunction(torch.autograd.Function):
    """The eager path of ``conv_transpose2d``: the adjoint of the convolution of layer
    ``lay`` applied to x (its dgrad kernel, x in the place of dy), x's gradient that
    convolution's fprop of y's and the weights' its wgrad (y's gradient in the place of
    x, x in dy's); the same kernels and gradients as the registered ``conv2d_input``
    and its derivatives, without the dispatcher's trip for each op.  Under autocast
    the fp32 weights are cast and packed for dgrad and, where dx is wanted, fprop in
    one launch, as ``Conv2dFunction`` does for its two."""

    @staticmethod
    def forward(ctx, x, weight, lay):
        ctx.lay = lay
        ctx.cast = weight.dtype is not x.dtype
        ctx.save_for_backward(x, weight)
        need_dx = ctx.needs_input_grad[0]
        ops = ((Op.DGRAD, False), (Op.FPROP, False)) if need_dx else ((Op.DGRAD, False),)
        packing = lay.packing(ops, x.shape[0], weight.dtype) if ctx.cast or need_dx else None
        ctx.fprop_w = None  # fprop packs the saved weights itself
        if packing is None:
            return E.input_grad(lay, x, weight)
        packed, w, fprop_w = packing(weight)
        if need_dx:  # fprop's packing, kept for it
            ctx.packed, ctx.fprop_w = packed, fprop_w
        return E.input_grad(lay, x, w)

    @staticmethod
    def backward(ctx, g):
        x, weight = ctx.saved_tensors
        lay = ctx.lay
        need_x, need_w = ctx.needs_input_grad[:2]
        if torch.is_grad_enabled():  # create_graph: the registered, differentiable ops
            args = (list(lay.stride), list(lay.pads), list(lay.dilation), lay.groups)
            g = g.contiguous(memory_format=lay.fmt)
            w = weight.to(x.dtype) if ctx.cast else weight
            ops = torch.ops.specgen
            dx = ops.conv2d(g, w, None, *args) if need_x else None
            dw = ops.conv2d_weight(g, x, list(w.shape), *args) if need_w else None
            return dx, dw.float() if ctx.cast and need_w else dw, None
        g = E.dense(g, lay.layout)
        dx = dw = None
        if need_x:
            dx = E.forward(lay, g, weight if ctx.fprop_w is None else ctx.fprop_w, None)
        if need_w:
            dw = E.weight_grads(lay, g, x, False, lay.dw_order if ctx.cast else lay.fp32_dw)
            if ctx.cast and dw.dtype is not torch.float32:
                dw = dw.to(torch.float32, memory_format=lay.w_format)
        return dx, dw, None


def _apply_of(function):
    """``function.apply`` without its Python layer where functorch's transforms are off
    (as they are but under vmap or grad): that layer then only unwraps dead functorch
    wrappers before the C entry beneath it, and costs the host 6 of a bare apply's
    21 us (H200, ``docs/measurements/host-pieces-2026-11-27-h200-before.log``); this
    does the same unwrapping (of the tensors before the last argument, the layer) and
    enters directly.  ``function.apply`` itself where PyTorch lacks either hook."""
    functorch = getattr(torch._C, "_functorch", None)
    active = getattr(torch._C, "_are_functorch_transforms_active", None)
    unwrap = getattr(functorch, "unwrap_if_dead", None)
    if active is None or unwrap is None:
        return function.apply
    enter = super(torch.autograd.Function, function).apply
    slow = function.apply

    def apply(*args):
        if active():
            return slow(*args)
        return enter(*(None if t is None else unwrap(t) for t in args[:-1]), args[-1])

    return apply


conv2d_eager = _apply_of(Conv2dFunction)
conv_transpose2d_eager = _apply_of(ConvTranspose2dFunction)
