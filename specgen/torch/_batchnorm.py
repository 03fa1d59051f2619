"""Batch norm in training mode on specgen's own kernels (``templates/torch/batchnorm.cu.j2``
for channels_last tensors, ``batchnorm_nchw.cu.j2`` for contiguous ones):
``torch.nn.functional.batch_norm``'s values and running statistics.

The convolutions of a converted network leave most of its training step to batch norm:
PyTorch's channels_last kernels took 3.8 of the 9.0 ms of resnet50's bf16 step (B=32,
224x224, nvidia-h200, ``docs/measurements/prof-resnet50-bf16-kinds-2026-11-29-h200-80ed2a4.log``),
its statistics pass 1.4 ms for 0.7 GB read; cuDNN's NCHW kernels 5.5 of 17 ms of the
tf32 step.  Here the forward is three launches (sums a block, the statistics, y) and
the backward three (sums a block, the terms, dx), each pass one read of its tensors.

What they do not serve runs on PyTorch's own batch norm: eval mode, tensors dense in
neither memory format, CPU or float64 tensors, parameters or statistics that are not
float32, fewer than two values a channel (PyTorch raises), torch.compile's tracing.
"""

from __future__ import annotations

import struct

import torch
import torch.nn.functional as F

from ..runtime import BN_THREADS, _Step, batchnorm_shape, batchnorm_source
from . import _engine
from ._ops import _apply_of

STORED = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
KERNELS = ("stats", "finalize", "apply", "reduce", "dfinalize", "dapply")
# Blocks an SM: of the passes that sum (four loads in flight a thread)
# and of the passes that write.
SUM_BLOCKS, WRITE_BLOCKS = 4, 8


def kernel_layout(x, weight, bias, running_mean, running_var, training: bool) -> str | None:
    """ "nhwc" or "nchw", the layout the kernels read x in, or None where they do not
    serve the call: channels_last where x is dense in it and a 16-byte copy divides the
    channels, else NCHW where x is contiguous."""
    if not training or not x.is_cuda or x.dim() != 4 or x.dtype not in STORED:
        return None
    if torch.compiler.is_compiling():
        return None
    N, C, H, W = x.shape
    if N * H * W < 2 or C > MAX_CHANNELS:
        return None
    device = x.get_device()
    for t in (weight, bias, running_mean, running_var):
        if t is not None and (t.dtype is not torch.float32 or t.get_device() != device):
            return None
        if t is not None and (t.shape != (C,) or not t.is_contiguous()):
            return None
    if (weight is None) != (bias is None) or (running_mean is None) != (running_var is None):
        return None
    copy = 4 if x.dtype is torch.float32 else 8
    if x.is_contiguous(memory_format=torch.channels_last) and not C % copy:
        if not x.data_ptr() % 16:
            return "nhwc"
    if x.is_contiguous():
        return "nchw"
    return None


MAX_CHANNELS = 65535  # the NCHW kernels' grid y


class Kernels:
    """The six launches of one problem (device, layout, dtype, channels, pixels, eps,
    affine, running statistics), their arguments bound but the tensors'."""

    def __init__(self, index: int, layout: str, x_size, dtype: str, eps: float, affine, running):
        N, C, H, W = x_size
        P = N * H * W  # the values a channel
        nchw = layout == "nchw"
        name, text = batchnorm_source(dtype, C, eps, affine, running, H * W if nchw else None)
        names = [f"{name}_{k}" for k in KERNELS]
        s, f, a, r, df, da = _engine.load_functions(index, names[0], text, names)
        sms = torch.cuda.get_device_properties(index).multi_processor_count
        if nchw:  # a block a channel's run of values: at least four a thread
            block, tiles, rows = (BN_THREADS, 1, 1), C, -(-P // (4 * BN_THREADS))
        else:  # a block a tile of channels by rows of pixels
            V, L, R = batchnorm_shape(dtype, C)
            block, tiles, rows = (L, R, 1), C // (L * V), -(-P // R)
        self.GX = min(rows, max(1, -(-sms * SUM_BLOCKS // tiles)))
        gxa = min(rows, max(1, -(-sms * WRITE_BLOCKS // tiles)))
        grid, agrid, cols = (self.GX, tiles, 1), (gxa, tiles, 1), ((C + 31) // 32, 1, 1)
        T = "t"  # a tensor's address, given at each launch
        self.stats = _Step(s, grid, block, 0, [(T, 0), (T, 0), (None, P)])
        tail = [(None, P), (None, self.GX)]
        self.finalize = _Step(f, cols, (32, 32, 1), 0, [(T, 0)] * 8 + tail + [(T, 0)])
        self.apply = _Step(a, agrid, block, 0, [(T, 0), (T, 0), (T, 0), (None, P)])
        self.reduce = _Step(r, grid, block, 0, [(T, 0), (T, 0), (T, 0), (T, 0), (None, P)])
        self.dfinalize = _Step(df, cols, (32, 32, 1), 0, [(T, 0)] * 6 + tail)
        self.dapply = _Step(da, agrid, block, 0, [(T, 0), (T, 0), (T, 0), (T, 0), (None, P)])
        self.index, self.C, self.eps = index, C, eps
        # one fp32 allocation a pass: the forward's blocks' sums, then the saved
        # statistics (mean, 1/std) and y's terms (a, b, mean); the backward's sums, dx's
        # terms (a, k, b, mean), dgamma and dbeta
        self.part = 2 * C * self.GX


_kernels: dict[tuple, Kernels] = {}


def kernels(x, layout: str, eps: float, affine: bool, running: bool) -> Kernels:
    key = (x.get_device(), layout, x.dtype, x.shape, eps, affine, running)
    k = _kernels.get(key)
    if k is None:
        if len(_kernels) >= _engine.LAYERS_KEPT:
            _kernels.clear()
        index, dtype = x.get_device(), STORED[x.dtype]
        k = _kernels[key] = Kernels(index, layout, x.shape, dtype, float(eps), affine, running)
    return k


def _bits(f: float) -> int:
    """A float argument's slot: its fp32 bits in the low four bytes."""
    return struct.unpack("<I", struct.pack("<f", f))[0]


def empty(size: int, like: torch.Tensor) -> torch.Tensor:
    """fp32 scratch: the blocks' sums, the statistics, the terms, dgamma and dbeta (the
    tests poison it)."""
    return torch.empty(size, dtype=torch.float32, device=like.device)


def empty_like(x: torch.Tensor) -> torch.Tensor:
    """y or dx, dense as x is (the tests poison it)."""
    return torch.empty_like(x)


class BatchNormFunction(torch.autograd.Function):
    """Batch norm over the batch's statistics: y, the running statistics updated in
    place; dx, dgamma and dbeta in the backward.  The last argument is the call's
    ``Kernels`` and momentum (``call``)."""

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, call):
        k, momentum = call
        C, F4 = k.C, 4  # bytes an fp32
        scratch = empty(k.part + 5 * C, x)
        part = scratch.data_ptr()
        saved, terms = part + F4 * k.part, part + F4 * (k.part + 2 * C)
        y = empty_like(x)
        at = [0 if t is None else t.data_ptr() for t in (weight, bias, running_mean, running_var)]
        xa = x.data_ptr()
        _engine.launch_steps(
            k.index,
            (k.stats, (xa, part)),
            (k.finalize, (part, xa, *at, saved, terms, momentum)),
            (k.apply, (xa, terms, y.data_ptr())),
        )
        ctx.save_for_backward(x, weight)
        ctx.kernels, ctx.scratch = k, scratch  # the statistics: no input's or output's
        return y

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        k = ctx.kernels
        if torch.is_grad_enabled():  # create_graph: gradients that differentiate again
            return (*_differentiable(ctx, x, weight, dy), None, None, None)
        if dy.stride() != x.stride() or dy.data_ptr() % 16:
            dy = torch.empty_like(x).copy_(dy)
        want_x, want_w, want_b = ctx.needs_input_grad[:3]
        C, F4 = k.C, 4
        saved = ctx.scratch.data_ptr() + F4 * k.part
        grads = empty(k.part + 6 * C, x)
        part = grads.data_ptr()
        terms = part + F4 * k.part
        dw = grads[k.part + 4 * C : k.part + 5 * C] if want_w else None
        db = grads[k.part + 5 * C :] if want_b else None
        dwa = part + F4 * (k.part + 4 * C) if want_w else 0
        dba = part + F4 * (k.part + 5 * C) if want_b else 0
        ya, xa, wa = dy.data_ptr(), x.data_ptr(), 0 if weight is None else weight.data_ptr()
        calls = [
            (k.reduce, (ya, xa, saved, part)),
            (k.dfinalize, (part, wa, saved, dwa, dba, terms)),
        ]
        dx = None
        if want_x:
            dx = empty_like(x)
            calls.append((k.dapply, (ya, xa, terms, dx.data_ptr())))
        _engine.launch_steps(k.index, *calls)
        return dx, dw, db, None, None, None


def _differentiable(ctx, x, weight, dy):
    """dx, dgamma and dbeta as functions of x, the weights and dy that autograd can
    differentiate again (a backward with ``create_graph``: gradient penalties), from
    PyTorch's batch norm over the same batch statistics."""
    want_x, want_w, want_b = ctx.needs_input_grad[:3]
    wrt = [t for t, want in ((x, want_x), (weight, want_w)) if want]
    found = []
    if wrt:
        y = F.batch_norm(x, None, None, weight, None, True, 0.0, ctx.kernels.eps)
        found = list(torch.autograd.grad(y, wrt, dy, create_graph=True))
    dx = found.pop(0) if want_x else None
    dw = found.pop(0) if want_w else None
    db = dy.sum((0, 2, 3), dtype=torch.float32) if want_b else None
    return dx, dw, db


_apply = _apply_of(BatchNormFunction)


def batch_norm(
    x, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5
):
    """``torch.nn.functional.batch_norm`` on specgen's kernels where they serve it
    (``kernel_layout``), else PyTorch's."""
    layout = kernel_layout(x, weight, bias, running_mean, running_var, training)
    if layout is None:
        return F.batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps)
    k = kernels(x, layout, eps, weight is not None, running_mean is not None)
    return _apply(x, weight, bias, running_mean, running_var, (k, _bits(momentum)))


class BatchNorm2d(torch.nn.BatchNorm2d):
    """``torch.nn.BatchNorm2d`` (same constructor, parameters, buffers and state_dict)
    whose training-mode calls run on specgen's kernels where they serve them."""

    def forward(self, input):
        self._check_input_dim(input)
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # the cumulative average, as PyTorch's
                factor = 1.0 / float(self.num_batches_tracked)
        training = self.training or (self.running_mean is None and self.running_var is None)
        tracked = not self.training or self.track_running_stats
        return batch_norm(
            input,
            self.running_mean if tracked else None,
            self.running_var if tracked else None,
            self.weight,
            self.bias,
            training,
            factor,
            self.eps,
        )
