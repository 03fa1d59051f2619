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
from functools import partial

import torch
import torch.nn.functional as F

from ..runtime import BN_THREADS, _Step, batchnorm_shape, batchnorm_source
from . import _engine, _replay
from ._ops import _apply_of

STORED = {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}
KERNELS = ("stats", "finalize", "apply", "reduce", "dfinalize", "dapply")
# Blocks an SM: of the passes that sum (four loads in flight a thread)
# and of the passes that write.
SUM_BLOCKS, WRITE_BLOCKS = 4, 8


def kernel_layout(x, weight, bias, running_mean, running_var, training: bool) -> str | None:
    """ "nhwc" or "nchw", the layout the kernels read x in, or None where they do not
    serve the call: channels_last where x is dense in it, a 16-byte copy divides the
    channels and x starts on 16 bytes, else NCHW where x is contiguous
    (``planned_layout``), on one CUDA device in training mode outside torch.compile's
    tracing."""
    if not training or not x.is_cuda or torch.compiler.is_compiling():
        return None
    layout = planned_layout(x, weight, bias, running_mean, running_var, device=x.get_device())
    if layout == "nhwc" and x.data_ptr() % 16:
        return "nchw" if x.is_contiguous() else None
    return layout


def planned_layout(
    x, weight, bias, running_mean, running_var, dtype=None, device=None
) -> str | None:
    """``kernel_layout``'s decision from sizes, dtypes and strides (a trace on the meta
    device takes it too, where x's ``dtype`` may be autocast's rather than its own):
    None where the sizes, the dtypes or the forms of the parameters and statistics are
    not the kernels', or (``device`` given) one of them lies on another device."""
    dtype = dtype or x.dtype
    if x.dim() != 4 or dtype not in STORED:
        return None
    N, C, H, W = x.shape
    if N * H * W < 2 or C > MAX_CHANNELS:
        return None
    if not parameters_serve(C, device, weight, bias, running_mean, running_var):
        return None
    copy = 4 if dtype is torch.float32 else 8
    if x.is_contiguous(memory_format=torch.channels_last) and not C % copy:
        return "nhwc"
    if x.is_contiguous():
        return "nchw"
    return None


def parameters_serve(C: int, device, weight, bias, running_mean, running_var) -> bool:
    """Whether the kernels read these parameters and statistics for C channels: each
    None or C contiguous fp32 values (on ``device``, where it is given), the weights
    and the bias both given or neither, the two statistics both or neither."""
    for t in (weight, bias, running_mean, running_var):
        if t is not None and (t.dtype is not torch.float32 or t.shape != (C,)):
            return False
        if t is not None and (not t.is_contiguous() or device not in (None, t.get_device())):
            return False
    return (weight is None) == (bias is None) and (running_mean is None) == (running_var is None)


MAX_CHANNELS = 65535  # the NCHW kernels' grid y


class Kernels:
    """The six launches of one problem (device, layout, dtype, channels, pixels, eps,
    affine, running statistics, the activation and whether a residual is added), their
    arguments bound but the tensors'."""

    def __init__(
        self,
        index: int,
        layout: str,
        x_size,
        dtype: str,
        eps: float,
        affine,
        running,
        act=None,
        residual=False,
    ):
        N, C, H, W = x_size
        P = N * H * W  # the values a channel
        nchw = layout == "nchw"
        name, text = source(layout, x_size, dtype, eps, affine, running, act, residual)
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
        self.finalize = _Step(f, cols, (32, 32, 1), 0, [(T, 0)] * 8 + tail + [(T, 0)] * 2)
        # apply (x, terms, r, y), reduce (dy, x, y, saved, part), dapply (dy, x, y,
        # terms, dx, dr): an address 0 where the kernel reads or writes no such tensor
        self.apply = _Step(a, agrid, block, 0, [(T, 0)] * 4 + [(None, P)])
        self.reduce = _Step(r, grid, block, 0, [(T, 0)] * 5 + [(None, P)])
        self.dfinalize = _Step(df, cols, (32, 32, 1), 0, [(T, 0)] * 6 + tail)
        self.dapply = _Step(da, agrid, block, 0, [(T, 0)] * 6 + [(None, P)])
        self.index, self.C, self.eps, self.act = index, C, eps, act
        # one fp32 allocation a pass: the forward's blocks' sums, then the saved
        # statistics (mean, 1/std) and y's terms (a, b, mean); the backward's sums, dx's
        # terms (a, k, b, mean), dgamma and dbeta
        self.part = 2 * C * self.GX


def source(layout: str, x_size, dtype: str, eps, affine, running, act, residual):
    """The name and text of one problem's kernels (``Kernels``' arguments but the
    device): what ``Kernels`` loads and a first call compiles ahead (``planned_form``)."""
    N, C, H, W = x_size
    HW = H * W if layout == "nchw" else None
    return batchnorm_source(dtype, C, float(eps), affine, running, HW, act, residual)


_kernels: dict[tuple, Kernels] = {}


def kernels(x, layout: str, eps: float, affine: bool, running: bool, act=None, residual=False):
    """The kernels over x in ``layout`` (``kernels_for``)."""
    size, index = x.shape, x.get_device()
    return kernels_for(index, layout, x.dtype, size, eps, affine, running, act, residual)


def kernels_for(index, layout, dtype, size, eps, affine, running, act=None, residual=False):
    """The kernels of one problem on device ``index``, x of torch ``dtype`` and ``size``
    (``Kernels``), built once; the convolution and batch norm node finds its own here
    from the convolution's output size."""
    key = (index, layout, dtype, size, eps, affine, running, act, residual)
    k = _kernels.get(key)
    if k is None:
        if len(_kernels) >= _engine.LAYERS_KEPT:
            _kernels.clear()
        args = (float(eps), affine, running, act, residual)
        k = _kernels[key] = Kernels(index, layout, size, STORED[dtype], *args)
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
    """Batch norm over the batch's statistics, a residual added (``r``, or None) and the
    activation applied where the kernels bake them in: y, the running statistics
    updated in place; dx, dgamma, dbeta and the residual's gradient in the backward.
    The last argument is the call's ``Kernels``, momentum and the address of the count
    its finalize adds 1 to, or 0 (``batch_norm``)."""

    # Each is replayed from its record where the call allows (``_replay``).
    @staticmethod
    def forward(ctx, x, weight, bias, running_mean, running_var, r, call):
        inputs = (x, weight, bias, running_mean, running_var, r)
        body = partial(norm_forward, ctx, *inputs, call)
        key = (call, ctx.needs_input_grad)
        y, saved = _replay.forward(ctx, _forwards, key, inputs, body, SET)
        ctx.save_for_backward(*saved)
        return y

    @staticmethod
    def backward(ctx, dy):
        saved = ctx.saved_tensors
        x, weight, *rest = saved
        y = rest[0] if rest else None
        if torch.is_grad_enabled():  # create_graph: gradients that differentiate again
            dx, dw, db, dr = _differentiable(ctx, x, weight, y, dy)
            return dx, dw, db, None, None, dr, None
        wants = (*ctx.needs_input_grad[:3], ctx.needs_input_grad[5])
        body = partial(norm_backward, ctx, x, weight, y, dy, wants)
        inputs = (dy, *saved, ctx.scratch)
        dx, dw, db, dr = _replay.backward(ctx, (dy.stride(), dy.dtype), inputs, body)
        return dx, dw, db, None, None, dr, None


# What ``norm_forward`` sets on ctx: a replay sets them as it would.  The batch norm's
# forward records by key.
SET = ("kernels", "scratch")
_forwards: dict = {}


def norm_forward(ctx, x, weight, bias, running_mean, running_var, r, call):
    """y of ``BatchNormFunction``'s forward, and the tensors its backward reads (x,
    weight and, where an activation gates dy, y), which the caller saves; the statistics
    and the kernels on ``ctx``.  Shared with the node that runs the convolution before
    it (``_convnorm``)."""
    k, momentum, batches = call
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
        (k.finalize, (part, xa, *at, saved, terms, momentum, batches)),
        (k.apply, (xa, terms, 0 if r is None else r.data_ptr(), y.data_ptr())),
    )
    ctx.kernels, ctx.scratch = k, scratch  # the statistics: no input's or output's
    # the backward's gate reads the output, as PyTorch's in-place one does
    return y, ((x, weight, y) if k.act else (x, weight))


def norm_backward(ctx, x, weight, y, dy, wants):
    """dx, dgamma, dbeta and the residual's gradient from dy (``wants``: whether each
    is wanted; None for those that are not), with what ``norm_forward`` left on
    ``ctx``; ``y`` the output where an activation gates dy, else None."""
    k = ctx.kernels
    if dy.stride() != x.stride() or dy.data_ptr() % 16:
        dy = torch.empty_like(x).copy_(dy)
    want_x, want_w, want_b, want_r = wants
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
    out = 0 if y is None else y.data_ptr()
    calls = [
        (k.reduce, (ya, xa, out, saved, part)),
        (k.dfinalize, (part, wa, saved, dwa, dba, terms)),
    ]
    dx = empty_like(x) if want_x else None
    # the residual's gradient: dy gated by the activation (the kernel writes it), or
    # dy itself where there is none
    dr = (empty_like(x) if k.act else dy) if want_r else None
    if want_x or (want_r and k.act):
        ends = [0 if t is None or t is dy else t.data_ptr() for t in (dx, dr)]
        calls.append((k.dapply, (ya, xa, out, terms, *ends)))
    _engine.launch_steps(k.index, *calls)
    return dx, dw, db, dr


GATES = {  # an activation's gradient from its output, as PyTorch's in-place backward
    "relu": lambda y: y > 0,
    "relu6": lambda y: (y > 0) & (y < 6),
}


def gated(dy, y, act: str):
    """dy where activation ``act`` passed its input, else 0, read off its output ``y``
    (as PyTorch's in-place activation's backward reads it), differentiable in dy."""
    return torch.where(GATES[act](y.detach()), dy, torch.zeros_like(dy))


def _differentiable(ctx, x, weight, y, dy):
    """dx, dgamma, dbeta and the residual's gradient as functions of x, the weights and
    dy that autograd can differentiate again (a backward with ``create_graph``: gradient
    penalties), from PyTorch's batch norm over the same batch statistics; dy gated by
    the activation first, where there is one."""
    want_x, want_w, want_b = ctx.needs_input_grad[:3]
    if y is not None:
        dy = gated(dy, y, ctx.kernels.act)
    wrt = [t for t, want in ((x, want_x), (weight, want_w)) if want]
    found = []
    if wrt:
        norm = F.batch_norm(x, None, None, weight, None, True, 0.0, ctx.kernels.eps)
        found = list(torch.autograd.grad(norm, wrt, dy, create_graph=True))
    dx = found.pop(0) if want_x else None
    dw = found.pop(0) if want_w else None
    db = dy.sum((0, 2, 3), dtype=torch.float32) if want_b else None
    return dx, dw, db, dy if ctx.needs_input_grad[5] else None


_apply = _apply_of(BatchNormFunction)

# The activations the kernels apply after a batch norm (``runtime.ACTIVATIONS``, in its
# order), each with the module it stands for after one (``_fuse``) and PyTorch's own
# function, which applies it where the kernels do not run.
ACTIVATIONS = {
    "relu": (torch.nn.ReLU, torch.relu),
    "relu6": (torch.nn.ReLU6, lambda y: F.hardtanh(y, 0.0, 6.0)),
}


def batch_norm(
    x,
    running_mean,
    running_var,
    weight=None,
    bias=None,
    training=False,
    momentum=0.1,
    eps=1e-5,
    *,
    residual=None,
    activation=None,
    num_batches_tracked=None,
):
    """``torch.nn.functional.batch_norm`` on specgen's kernels where they serve it
    (``kernel_layout``), else PyTorch's; with ``residual`` (a tensor of x's size) added
    to its output and ``activation`` ("relu", "relu6" or None) applied after, in the
    same kernel: act(batch_norm(x) + residual).  ``num_batches_tracked`` (a module's
    count, or None): 1 is added to it, by the kernel that updates the running
    statistics where it serves the call (a launch fewer a call)."""
    if activation is not None and activation not in ACTIVATIONS:
        names = ", ".join(map(repr, ACTIVATIONS))
        raise ValueError(f"activation must be {names} or None, got {activation!r}")
    layout = kernel_layout(x, weight, bias, running_mean, running_var, training)
    if layout is not None and residual is not None and not _alike(residual, x):
        layout = None
    served = layout is not None and running_mean is not None
    counted = counted_at(num_batches_tracked, served, x.get_device())
    if layout is None:
        y = F.batch_norm(x, running_mean, running_var, weight, bias, training, momentum, eps)
        y = y if residual is None else y + residual
        return y if activation is None else ACTIVATIONS[activation][1](y)
    affine, running = weight is not None, running_mean is not None
    k = kernels(x, layout, eps, affine, running, activation, residual is not None)
    call = (k, _bits(momentum), counted)
    return _apply(x, weight, bias, running_mean, running_var, residual, call)


def counted_at(n, served: bool, index: int) -> int:
    """The address of count ``n`` (a module's ``num_batches_tracked``, or None) where
    the kernels that update the running statistics (``served``: they run, and there are
    statistics) add 1 to it: one int64 on their device ``index``; else 0, with 1 added
    here where there is a count."""
    if n is None:
        return 0
    if served and n.dtype is torch.int64 and n.numel() == 1 and n.get_device() == index:
        return n.data_ptr()
    n.add_(1)
    return 0


def _alike(r, x) -> bool:
    """Whether the kernels read residual ``r`` as they read x: its size, dtype, device
    and strides, and a 16-byte start."""
    if r.dtype is not x.dtype or r.shape != x.shape or r.stride() != x.stride():
        return False
    return r.get_device() == x.get_device() and not r.data_ptr() % 16


def planned_form(m, x, residual, dtype=None) -> tuple | None:
    """``source``'s arguments for the kernels module ``m`` (specgen's, in training mode)
    will load for input x and ``residual`` (sizes and strides; meta tensors serve) of
    ``dtype`` (by default x's): what a model's first call compiles ahead.  None where
    PyTorch's batch norm will run it."""
    dtype = dtype or x.dtype
    tracked = m.track_running_stats and m.running_mean is not None
    rm, rv = (m.running_mean, m.running_var) if tracked else (None, None)
    layout = planned_layout(x, m.weight, m.bias, rm, rv, dtype) if m.training else None
    unlike = residual is not None and (residual.shape, residual.stride()) != (x.shape, x.stride())
    if layout is None or unlike:  # a residual the kernels cannot read: PyTorch's path
        return None
    affine, running = m.weight is not None, rm is not None
    return (
        layout,
        tuple(x.shape),
        STORED[dtype],
        m.eps,
        affine,
        running,
        m.activation,
        residual is not None,
    )


class BatchNorm2d(torch.nn.BatchNorm2d):
    """``torch.nn.BatchNorm2d`` (same constructor, parameters, buffers and state_dict)
    whose training-mode calls run on specgen's kernels where they serve them.  Where
    ``convert`` fuses the activation that follows it (``activation``, "relu" or "relu6"),
    it applies that too, after adding ``residual`` where a call passes one (a residual
    block's shortcut): act(batch norm of input + residual), in eval mode as well."""

    activation = None  # set by convert where it fuses the activation after

    def extra_repr(self):
        fused = f", activation={self.activation}" if self.activation else ""
        return super().extra_repr() + fused

    def forward(self, input, residual=None):
        self._check_input_dim(input)
        running_mean, running_var, training, factor, count = self.state()
        return batch_norm(
            input,
            running_mean,
            running_var,
            self.weight,
            self.bias,
            training,
            factor,
            self.eps,
            residual=residual,
            activation=self.activation,
            num_batches_tracked=count,
        )

    def state(self) -> tuple:
        """A call's running statistics (None where it neither reads nor updates them),
        whether it normalizes by the batch's statistics, the momentum, and the count
        that ``batch_norm`` adds 1 to (None where that is done already, or there is
        none), as ``torch.nn.BatchNorm2d.forward`` works them out."""
        factor = 0.0 if self.momentum is None else self.momentum
        count = None  # the count batch_norm adds 1 to, in its kernel where it can
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            if self.momentum is None:  # the cumulative average, as PyTorch's: the count read
                self.num_batches_tracked.add_(1)
                factor = 1.0 / float(self.num_batches_tracked)
            else:
                count = self.num_batches_tracked
        training = self.training or (self.running_mean is None and self.running_var is None)
        tracked = not self.training or self.track_running_stats
        if not tracked:
            return None, None, training, factor, count
        return self.running_mean, self.running_var, training, factor, count


class Fused(torch.nn.Identity):
    """The place of an activation that the layer next to it applies (``by``: the batch
    norm before it, or the max pool after it): passes its input on."""

    def __init__(self, activation: torch.nn.Module, by: str = "the batch norm before it"):
        super().__init__()
        self.was, self.by = repr(activation), by

    def extra_repr(self):
        return f"{self.was}, applied by {self.by}"
