"""Batch norm in training mode on specgen's own kernels (``templates/torch/batchnorm.cu.j2``):
``torch.nn.functional.batch_norm``'s values and running statistics, for the channels_last
tensors of the operator's tensor-core convolutions.

The convolutions of a converted network leave most of its training step to batch norm:
PyTorch's channels_last kernels took 3.8 of the 9.1 ms of resnet50's bf16 step (B=32,
224x224, nvidia-h200, ``docs/measurements/prof-resnet50-bf16-kinds-2026-11-29-h200-80ed2a4.log``),
its statistics pass 1.4 ms for 0.7 GB read.  Here the forward is three launches (sums
a block, the statistics, y) and the backward three (sums a block, the terms, dx), each
pass one read of its tensors at full width.

What they do not serve runs on PyTorch's own batch norm: eval mode, tensors that are not
dense channels_last (NCHW; the kernels read a pixel's channels as one row), CPU or
float64 tensors, parameters or statistics that are not float32, channels not a multiple
of a 16-byte copy, fewer than two values a channel (PyTorch raises), torch.compile's
tracing.
"""

from __future__ import annotations

import struct

import torch
import torch.nn.functional as F

from ..runtime import _Step, batchnorm_shape, batchnorm_source
from . import _engine

STORED = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
KERNELS = ("stats", "finalize", "apply", "reduce", "dfinalize", "dapply")
# Blocks an SM: of the passes that sum (each thread's four copies of 16 bytes in flight)
# and of the passes that write.
SUM_BLOCKS, WRITE_BLOCKS = 4, 8


def served(x, weight, bias, running_mean, running_var, training: bool) -> bool:
    """Whether specgen's kernels take this call of ``F.batch_norm``."""
    if not training or not x.is_cuda or x.dim() != 4 or x.dtype not in STORED:
        return False
    if torch.compiler.is_compiling():
        return False
    N, C, H, W = x.shape
    if N * H * W < 2 or not x.is_contiguous(memory_format=torch.channels_last):
        return False
    if C % (4 if x.dtype is torch.float32 else 8) or x.data_ptr() % 16:
        return False
    for t in (weight, bias, running_mean, running_var):
        if t is not None and (t.dtype is not torch.float32 or t.device != x.device):
            return False
        if t is not None and (t.shape != (C,) or not t.is_contiguous()):
            return False
    return (weight is None) == (bias is None) and (running_mean is None) == (running_var is None)


class Kernels:
    """The six launches of one problem (device, dtype, channels, pixels, eps, affine,
    running statistics), their arguments bound but the tensors'."""

    def __init__(self, index: int, dtype: str, C: int, P: int, eps: float, affine, running):
        name, text = batchnorm_source(dtype, C, eps, affine, running)
        funcs = _engine.load_functions(
            index, f"{name}_stats", text, [f"{name}_{k}" for k in KERNELS]
        )
        V, L, R = batchnorm_shape(dtype, C)
        tiles = C // (L * V)
        sms = torch.cuda.get_device_properties(index).multi_processor_count
        rows = -(-P // R)  # the block rows that cover the pixels
        self.GX = min(rows, max(1, sms * SUM_BLOCKS // tiles))
        gxa = min(rows, max(1, sms * WRITE_BLOCKS // tiles))
        block, cols = (L, R, 1), (32, 32, 1)
        grid, agrid, fgrid = (self.GX, tiles, 1), (gxa, tiles, 1), (-(-C // 32), 1, 1)
        s, f, a, r, df, da = funcs
        T = "t"  # a tensor's address, given at each launch
        self.stats = _Step(s, grid, block, 0, [(T, 0), (T, 0), (None, P)])
        self.finalize = _Step(
            f, fgrid, cols, 0, [(T, 0)] * 8 + [(None, P), (None, self.GX), (T, 0)]
        )
        self.apply = _Step(a, agrid, block, 0, [(T, 0), (T, 0), (T, 0), (None, P)])
        self.reduce = _Step(r, grid, block, 0, [(T, 0), (T, 0), (T, 0), (T, 0), (None, P)])
        self.dfinalize = _Step(df, fgrid, cols, 0, [(T, 0)] * 6 + [(None, P), (None, self.GX)])
        self.dapply = _Step(da, agrid, block, 0, [(T, 0), (T, 0), (T, 0), (T, 0), (None, P)])
        self.index, self.C = index, C


_kernels: dict[tuple, Kernels] = {}


def kernels(x, eps: float, affine: bool, running: bool) -> Kernels:
    N, C, H, W = x.shape
    index = x.device.index
    key = (index, x.dtype, C, N * H * W, float(eps), affine, running)
    k = _kernels.get(key)
    if k is None:
        if len(_kernels) >= _engine.LAYERS_KEPT:
            _kernels.clear()
        k = _kernels[key] = Kernels(index, STORED[x.dtype], C, N * H * W, eps, affine, running)
    return k


def _at(t) -> int:
    return 0 if t is None else t.data_ptr()


def _bits(f: float) -> int:
    """A float argument's slot: its fp32 bits in the low four bytes."""
    return struct.unpack("<I", struct.pack("<f", f))[0]


def empty(size: int, like: torch.Tensor) -> torch.Tensor:
    """An fp32 vector of the statistics or the gradients' terms (the tests poison it)."""
    return torch.empty(size, dtype=torch.float32, device=like.device)


def empty_like(x: torch.Tensor) -> torch.Tensor:
    """y or dx, dense as x is (the tests poison it)."""
    return torch.empty_like(x)


class BatchNormFunction(torch.autograd.Function):
    """Batch norm over the batch's statistics: y, the running statistics updated in
    place; dx, dgamma and dbeta in the backward."""

    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, momentum, eps):
        k = kernels(x, eps, weight is not None, running_mean is not None)
        C = k.C
        part = empty(2 * C * k.GX, x)
        saved, terms = empty(2 * C, x), empty(2 * C, x)
        y = empty_like(x)
        i = k.index
        _engine.launch_step(k.stats, i, x.data_ptr(), part.data_ptr())
        args = (part, x, weight, bias, running_mean, running_var, saved, terms)
        _engine.launch_step(k.finalize, i, *map(_at, args), _bits(momentum))
        _engine.launch_step(k.apply, i, x.data_ptr(), terms.data_ptr(), y.data_ptr())
        ctx.save_for_backward(x, weight, saved)
        ctx.kernels = k
        ctx.mark_non_differentiable(saved)
        return y

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, dy):
        x, weight, saved = ctx.saved_tensors
        k = ctx.kernels
        dy = dy.contiguous(memory_format=torch.channels_last)
        if dy.data_ptr() % 16 or dy.stride() != x.stride():
            dy = torch.empty_like(x).copy_(dy)
        want_x, want_w, want_b = ctx.needs_input_grad[:3]
        C, i = k.C, k.index
        part, terms = empty(2 * C * k.GX, x), empty(3 * C, x)
        dw = empty(C, x) if want_w else None
        db = empty(C, x) if want_b else None
        _engine.launch_step(
            k.reduce, i, dy.data_ptr(), x.data_ptr(), saved.data_ptr(), part.data_ptr()
        )
        args = (part, weight, saved, dw, db, terms)
        _engine.launch_step(k.dfinalize, i, *map(_at, args))
        dx = None
        if want_x:
            dx = empty_like(x)
            _engine.launch_step(
                k.dapply, i, dy.data_ptr(), x.data_ptr(), terms.data_ptr(), dx.data_ptr()
            )
        return dx, dw, db, None, None, None, None


def batch_norm(
    x, running_mean, running_var, weight=None, bias=None, training=False, momentum=0.1, eps=1e-5
):
    """``torch.nn.functional.batch_norm`` on specgen's kernels where they serve it
    (``served``), else PyTorch's."""
    if not served(x, weight, bias, running_mean, running_var, training):
        return F.batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps)
    return BatchNormFunction.apply(x, weight, bias, running_mean, running_var, float(momentum), eps)


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
