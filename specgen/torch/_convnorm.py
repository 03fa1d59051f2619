"""A convolution and the batch norm after it as one autograd node (``conv_norm``): the
same kernels, in the same order, as the two modules called one after the other, and
the same values and gradients, bit for bit.

An eager training step of a network of small layers waits on the host, and each
autograd node costs it twice: its forward's ``apply`` (the node built, the tensors
saved) and its backward's turn in the engine. ResNet's and MobileNet's every
convolution is followed by a batch norm, so the pair as one node halves both.

``conv_norm`` takes the node where both modules would run specgen's kernels on the
eager path, neither has a hook (nor are there global ones: a hook sees each module's
call) and x is a batched CUDA tensor; else it calls the two modules.  The fused
forms of ``_fuse`` and ``_torchvision`` call it: ``run_fused`` runs a sequence's modules
so (``FusedSequential``), and ``shortcut`` a residual block's downsampling pair."""

from __future__ import annotations

import threading
import weakref
from contextlib import contextmanager
from functools import partial

import torch
import torch.nn.functional as F
from torch.nn.modules import module as _module

from ..errors import SpecError
from . import _batchnorm as B
from . import _engine, _replay
from ._ops import CONV_SET, _apply_of, conv2d_eager, conv_backward, conv_forward


class ConvNormFunction(torch.autograd.Function):
    """act(batch_norm(conv(x, weight, bias)) + r): the convolution's forward
    (``_ops.conv_forward``), then the batch norm's over its output
    (``_batchnorm.norm_forward``); the backward the batch norm's, then the
    convolution's from the gradient it gives.  The last argument is the convolution's
    layer and the batch norm's call (``batch_norm``'s)."""

    @staticmethod
    def forward(ctx, x, weight, bias, gamma, beta, running_mean, running_var, r, call):
        lay, norm = call
        inputs = (x, weight, bias, gamma, beta, running_mean, running_var, r)
        b = None if bias is None else (bias.dtype, bias.stride())
        key = (lay, norm, x.shape[0], weight.dtype, b, ctx.needs_input_grad)
        body = partial(_forward, ctx, *inputs, call)
        out, saved = _replay.forward(ctx, _forwards, key, inputs, body, SET)
        ctx.save_for_backward(x, weight, bias, *saved)  # saved: y, gamma (and out: the gate)
        return out

    @staticmethod
    def backward(ctx, dout):
        saved = ctx.saved_tensors
        x, weight, bias, y, gamma, *rest = saved
        out = rest[0] if rest else None
        if torch.is_grad_enabled():  # create_graph: gradients that differentiate again
            return _differentiable(ctx, x, weight, bias, gamma, out, dout)
        inputs = (dout, *saved, ctx.scratch, getattr(ctx, "packed", None))
        body = partial(_backward, ctx, x, weight, y, gamma, out, dout)
        return _replay.backward(ctx, (dout.stride(), dout.dtype), inputs, body)


# What the forward's body sets on ctx (``conv_forward``'s and ``norm_forward``'s): a
# replay sets them as the body would.  The forward's records by key.
SET = CONV_SET + B.SET
_forwards: dict = {}


def _forward(ctx, x, weight, bias, gamma, beta, running_mean, running_var, r, call):
    """The node's forward: out, and what the backward reads besides x, weight and bias."""
    lay, norm = call
    y = conv_forward(ctx, x, weight, bias, lay, ctx.needs_input_grad[0])
    return B.norm_forward(ctx, y, gamma, beta, running_mean, running_var, r, norm)


def _backward(ctx, x, weight, y, gamma, out, dout):
    """The node's gradients: the batch norm's backward, then the convolution's."""
    needs = ctx.needs_input_grad
    conv = needs[:3]
    dy, dgamma, dbeta, dr = B.norm_backward(
        ctx, y, gamma, out, dout, (any(conv), needs[3], needs[4], needs[7])
    )
    dx = dw = db = None
    if any(conv):
        dx, dw, db = conv_backward(ctx, x, weight, dy, conv)
    return dx, dw, db, dgamma, dbeta, None, None, dr, None


def _differentiable(ctx, x, weight, bias, gamma, out, dout):
    """The node's gradients as functions that autograd can differentiate again (a
    backward with ``create_graph``): dout gated by the activation, then the gradients
    of PyTorch's batch norm over the batch's statistics of the convolution, recomputed
    by the registered, differentiable op."""
    needs, k, lay = ctx.needs_input_grad, ctx.kernels, ctx.lay
    dz = dout if out is None else B.gated(dout, out, k.act)
    w = weight.to(x.dtype) if ctx.cast else weight
    args = (list(lay.stride), list(lay.pads), list(lay.dilation), lay.groups)
    y = torch.ops.specgen.conv2d(x, w, bias, *args)
    norm = F.batch_norm(y, None, None, gamma, None, True, 0.0, k.eps)
    wanted = [(x, needs[0]), (weight, needs[1]), (bias, needs[2]), (gamma, needs[3])]
    wrt = [t for t, want in wanted if want]
    found = list(torch.autograd.grad(norm, wrt, dz, create_graph=True)) if wrt else []
    dx, dw, db, dgamma = (found.pop(0) if want else None for _, want in wanted)
    dbeta = dz.sum((0, 2, 3), dtype=torch.float32) if needs[4] else None
    return dx, dw, db, dgamma, dbeta, None, None, dz if needs[7] else None, None


_apply = _apply_of(ConvNormFunction)
# What the package hands over as it is imported (``bind``): its ``Conv2d``, the
# normalizer of its arguments and the finder of its eager layer.
PACKAGE: dict = {}


def bind(conv2d: type, arguments, eager_layer) -> None:
    PACKAGE.update(Conv2d=conv2d, arguments=arguments, eager_layer=eager_layer)


def pair(conv, bn) -> bool:
    """Whether modules ``conv`` and ``bn``, called in turn, run as one node where the
    call serves it: specgen's ``Conv2d`` and ``BatchNorm2d``."""
    return type(conv) is PACKAGE["Conv2d"] and type(bn) is B.BatchNorm2d


def conv_norm(conv, bn, x, residual=None):
    """``bn(conv(x), residual)`` for specgen's ``Conv2d`` and ``BatchNorm2d`` modules,
    as one autograd node where both run specgen's kernels (module docstring)."""
    if not (bn.training and x.is_cuda and x.dim() == 4 and _bare(conv, bn)):
        return bn(conv(x), residual)
    if not pair(conv, bn) or conv.padding_mode != "zeros" or torch.compiler.is_compiling():
        return bn(conv(x), residual)
    form = _form(conv, bn, x, residual)
    found = _calls.get(bn)
    if found is not None and found[0] == form:
        _collect(bn, found[1], found[2])
        return _apply(x, *found[1], residual, found[2])
    try:
        args = PACKAGE["arguments"](conv.stride, conv.padding, conv.dilation, conv.weight)
        found = PACKAGE["eager_layer"](x, conv.weight, conv.bias, *args, conv.groups)
        lay, x_in, weight, bias = found
    except SpecError:  # the modules' calls take PyTorch's path, and log it
        return bn(conv(x), residual)
    running_mean, running_var, _, factor, count = bn.state()
    kernels = _kernels(lay, x_in, bn, running_mean, running_var, residual)
    if kernels is None:  # as the two modules' calls: PyTorch's batch norm after ours
        y = conv2d_eager(x_in, weight, bias, lay)
        return B.batch_norm(
            y,
            running_mean,
            running_var,
            bn.weight,
            bn.bias,
            True,
            factor,
            bn.eps,
            residual=residual,
            activation=bn.activation,
            num_batches_tracked=count,
        )
    counted = B.counted_at(count, running_mean is not None, lay.index)
    norm = (kernels, B._bits(factor), counted)
    tensors = (weight, bias, bn.weight, bn.bias, running_mean, running_var)
    kept = bn.momentum is not None and (counted or count is None)  # no count added here
    if kept and x_in is x and weight is conv.weight and bias is conv.bias:
        _remember(conv, bn, form, tensors, (lay, norm))
        _collect(bn, tensors, (lay, norm))
    return _apply(x_in, *tensors, residual, (lay, norm))


# Where a chain of pairs (``_chain``) runs its blocks' forwards, what each pair's node
# is handed that a later call may take again, in turn: (bn, its tensors after x, its
# last argument).
_collecting = threading.local()


@contextmanager
def collecting(into: list):
    """Within: each pair's node that takes remembered lookups (``_calls``) appends
    (bn, the tensors it is handed after x, its last argument) to ``into``."""
    before = getattr(_collecting, "into", None)
    _collecting.into = into
    try:
        yield
    finally:
        _collecting.into = before


def _collect(bn, tensors, last) -> None:
    into = getattr(_collecting, "into", None)
    if into is not None:
        into.append((bn, tensors, last))


# The last call's lookups of each pair of modules, by its batch norm (the entry goes
# with the module): what the call read (``_form``, the convolution's id among it), the
# tensors it handed to the node after x, and its last argument.  A later call that
# reads the same finds the same and takes them.  Where the batch norm's momentum is
# None (a cumulative average: the count read, 1 added each call) or its count is added
# to here, x was copied or cast, or the weights, no call takes them.  An entry holds
# the tensors whose ids its form reads, so that no other tensor can take one of them.
_calls: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _form(conv, bn, x, residual) -> tuple:
    """What ``conv_norm``'s lookups depend on, read from the modules and tensors in a
    few microseconds: x's and the residual's sizes, strides, dtypes and devices, the
    autocast and tf32 state (``_math``) and the modules (``_modules_form``)."""
    r = None
    if residual is not None:
        r = (residual.shape, residual.stride(), residual.dtype, residual.get_device())
        r += (residual.data_ptr() % 16,)
    head = (x.shape, x.stride(), x.dtype, x.get_device(), _math())
    return head, r, _modules_form(conv, bn)


def _math() -> tuple:
    """The autocast dtype (False where autocast is off) and whether tf32 is allowed."""
    return torch.is_autocast_enabled("cuda") and torch.get_autocast_dtype("cuda"), _tf32()


def _modules_form(conv, bn) -> tuple:
    """Which convolution, the modules' arguments, and each parameter and buffer they
    read (its id and its data's address: a tensor given new data, as ``module.to``
    does, reads otherwise)."""
    marks = tuple(None if t is None else (id(t), t.data_ptr()) for t in _read(conv, bn))
    return (
        id(conv),
        (conv.stride, conv.padding, conv.dilation, conv.groups),
        (bn.momentum, bn.eps, bn.activation, bn.track_running_stats),
        marks,
    )


_tf32 = getattr(torch._C, "_get_cudnn_allow_tf32", None) or _engine.allow_tf32


def _read(conv, bn) -> tuple:
    """The parameters and buffers of the two modules that a call reads."""
    p, q, b = conv._parameters, bn._parameters, bn._buffers
    return (
        p["weight"],
        p["bias"],
        q.get("weight"),
        q.get("bias"),
        b.get("running_mean"),
        b.get("running_var"),
        b.get("num_batches_tracked"),
    )


def _remember(conv, bn, form, tensors, last) -> None:
    _calls[bn] = (form, tensors, last, _read(conv, bn))


def _bare(*modules) -> bool:
    """Whether calling these modules runs their forwards alone: no hook of theirs and
    no global one (``torch.nn.Module``'s own test for its fast path)."""
    for m in modules:
        if m._forward_hooks or m._forward_pre_hooks or m._backward_hooks:
            return False
        if m._backward_pre_hooks:
            return False
    return not (
        _module._global_forward_hooks
        or _module._global_forward_pre_hooks
        or _module._global_backward_hooks
        or _module._global_backward_pre_hooks
    )


_plans: dict[tuple, tuple] = {}  # (layer, batch, the batch norm's form) -> kernels, y's


def _kernels(lay, x, bn, running_mean, running_var, residual):
    """The batch norm's kernels over the output of the convolution of x (dense in
    layer ``lay``'s layout), or None where they do not serve this call: as
    ``_batchnorm.batch_norm`` decides for that output (``kernel_layout``, and a residual
    they read as they read it, ``_alike``)."""
    affine, running = bn.weight is not None, running_mean is not None
    N, act, added = x.shape[0], bn.activation, residual is not None
    key = (lay, N, x.dtype, bn.eps, affine, running, act, added)
    plan = _plans.get(key)
    if plan is None:
        if len(_plans) >= _engine.LAYERS_KEPT:
            _plans.clear()
        size = (N, *lay.y_rest)
        y = torch.empty(size, dtype=x.dtype, device="meta", memory_format=lay.fmt)
        layout = B.planned_layout(y, None, None, None, None)
        k = None
        if layout is not None:
            form = (bn.eps, affine, running, act, added)
            k = B.kernels_for(lay.index, layout, x.dtype, y.shape, *form)
        plan = _plans[key] = (k, y.shape, y.stride())
    k, size, stride = plan
    stats = (running_mean, running_var)
    if k is None or not B.parameters_serve(size[1], lay.index, bn.weight, bn.bias, *stats):
        return None
    if residual is not None and not (
        residual.dtype is x.dtype
        and residual.shape == size
        and residual.stride() == stride
        and residual.get_device() == lay.index
        and not residual.data_ptr() % 16
    ):
        return None
    return k


class FusedSequential(torch.nn.Sequential):
    """``nn.Sequential`` (the same modules and state_dict) that runs each convolution
    followed by a batch norm as one autograd node (``run_fused``)."""

    runs_pairs = True

    def forward(self, input):
        return run_fused(self, input)


def run_fused(seq: torch.nn.Sequential, input):
    """``seq``'s modules applied in turn to ``input``, each ``Conv2d`` with the
    ``BatchNorm2d`` after it by ``conv_norm``; an activation's place that the batch norm
    before it fills (``Fused``) passes its input on uncalled where it has no hooks."""
    for m, bn in steps(tuple(seq._modules.values())):
        if bn is not None:
            input = conv_norm(m, bn, input)
        elif type(m) is not B.Fused or not _bare(m):
            input = m(input)
    return input


def steps(modules: tuple):
    """(module, the batch norm after it) for each convolution of ``modules`` that runs
    with the next as one node (``pair``), else (module, None), in turn."""
    i, n = 0, len(modules)
    while i < n:
        if i + 1 < n and pair(modules[i], modules[i + 1]):
            yield modules[i], modules[i + 1]
            i += 2
        else:
            yield modules[i], None
            i += 1


def shortcut(downsample, x):
    """A residual block's shortcut of x: x itself, or its ``downsample`` (torchvision's
    is a ``Conv2d`` and a ``BatchNorm2d`` in a sequence: one node, ``run_fused``)."""
    if downsample is None:
        return x
    if type(downsample) is FusedSequential and _bare(downsample):
        return run_fused(downsample, x)
    return downsample(x)
