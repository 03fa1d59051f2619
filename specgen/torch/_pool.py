"""Max pooling on specgen's own kernels (``templates/torch/maxpool.cu.j2``): the values
and gradients of ``torch.nn.functional.max_pool2d``, and where ``convert`` fuses the
ReLU before it, of ``max_pool2d(relu(x))``.

PyTorch's max pool saves an int64 index an output and its backward scatters through
them: in vgg11's fp32 training step (B=32, 224x224) its five backward calls took 1.88 ms
and the forwards 0.60 ms, its ten ReLUs 1.11 ms both ways (nvidia-h200,
``docs/measurements/kprof-vgg11-fp32-maxpool-2026-11-30-h200-472e9dd.log``, cuDNN's model).  Here a window's
forward writes its maximum and one byte, the maximum's place in the window (none where
the ReLU before it passes no gradient), and the backward writes each input's gradient
from that byte: one pass over each tensor, the ReLU's two passes gone.

The windows served are those that tile the input: the stride the window's size, no
padding or dilation, PyTorch's floor of the outputs, no indices returned (``convert``
leaves PyTorch's module in place of any other); fp32, bf16 and fp16 tensors, contiguous
or channels_last, on a CUDA device outside torch.compile's tracing.  Every other call
runs PyTorch's max pool (after the ReLU, where one is fused).  The values and gradients
are PyTorch's bit for bit, NaN too; a window of -inf sends its gradient to its first
pixel, as PyTorch's kernel for contiguous tensors does (its channels_last one sends it
to the plane's first).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.modules.utils import _pair

from ..runtime import POOL_THREADS, _Step, maxpool_source
from . import _engine
from ._batchnorm import STORED  # the dtypes the kernels take, by their names in the templates

MAX_IMAGES = 65535  # the kernels' grid y: an image a row of blocks


def window_of(kernel_size, stride, padding, dilation, ceil_mode, return_indices):
    """(KH, KW), the window where it tiles the input as the kernels take it (module
    docstring), else None."""
    kernel = _pair(kernel_size)
    stride = kernel if stride is None or stride == [] else _pair(stride)
    if ceil_mode or return_indices or _pair(padding) != (0, 0) or _pair(dilation) != (1, 1):
        return None
    return kernel if stride == kernel else None


def kernel_layout(x, window) -> str | None:
    """ "nchw" or "nhwc", how the kernels read x, or None where they do not serve the
    call: x 4-D on a CUDA device, of a stored dtype, contiguous or channels_last, the
    window inside the image, 1 to ``MAX_IMAGES`` images of fewer than 2**31 values,
    outside torch.compile's tracing."""
    if window is None or not x.is_cuda or x.dim() != 4 or x.dtype not in STORED:
        return None
    N, C, H, W = x.shape
    if torch.compiler.is_compiling() or H < window[0] or W < window[1]:
        return None
    if not 0 < N <= MAX_IMAGES or C * H * W >= 2**31:  # the grid's y; an image's int offsets
        return None
    if x.is_contiguous():
        return "nchw"
    if x.is_contiguous(memory_format=torch.channels_last):
        return "nhwc"
    return None


class Kernels:
    """The forward and backward launches of one call's problem (device, layout, x's
    size and dtype, the window, the activation), their tensors given at each launch."""

    def __init__(self, index: int, layout: str, size, dtype, window, act):
        N, C, H, W = size
        KH, KW = window
        name, text = maxpool_source(STORED[dtype], layout, C, H, W, KH, KW, act)
        forward, backward = _engine.load_functions(
            index, f"{name}_forward", text, (f"{name}_forward", f"{name}_backward")
        )
        Ho, Wo = H // KH, W // KW
        self.out, self.outputs = (N, C, Ho, Wo), N * C * Ho * Wo
        self.index, self.layout, self.window = index, layout, window
        self.format = torch.channels_last if layout == "nhwc" else torch.contiguous_format
        T = "t"  # a tensor's address, given at each launch
        block = (POOL_THREADS, 1, 1)
        windows = C * Ho * Wo  # an image's; the backward's run on past the last whole ones
        grid = (-(-windows // POOL_THREADS), N, 1)
        self.forward = _Step(forward, grid, block, 0, [(T, 0)] * 3)
        windows = C * -(-H // KH) * -(-W // KW)
        grid = (-(-windows // POOL_THREADS), N, 1)
        self.backward = _Step(backward, grid, block, 0, [(T, 0)] * 3)


_kernels: dict[tuple, Kernels] = {}


def kernels(x, layout: str, window, act) -> Kernels:
    """The kernels of x's call (``Kernels``), built once."""
    key = (x.get_device(), layout, tuple(x.shape), x.dtype, window, act)
    k = _kernels.get(key)
    if k is None:
        if len(_kernels) >= _engine.LAYERS_KEPT:
            _kernels.clear()
        k = _kernels[key] = Kernels(*key)
    return k


def empty(size, like: torch.Tensor, memory_format) -> torch.Tensor:
    """y, dx and the places' bytes (the tests poison them)."""
    return torch.empty(size, dtype=like.dtype, device=like.device, memory_format=memory_format)


def empty_places(n: int, like: torch.Tensor) -> torch.Tensor:
    """The windows' bytes (the tests poison them)."""
    return torch.empty(n, dtype=torch.uint8, device=like.device)


class MaxPoolFunction(torch.autograd.Function):
    """y of the kernels' forward and its places' bytes, which the backward reads in
    place of x; the last argument is the call's ``Kernels``."""

    @staticmethod
    def forward(ctx, x, k):
        y = empty(k.out, x, k.format)
        places = empty_places(k.outputs, x)
        _engine.launch_steps(k.index, (k.forward, (x.data_ptr(), y.data_ptr(), places.data_ptr())))
        ctx.k, ctx.places = k, places
        ctx.x_size = x.shape
        return y

    @staticmethod
    def backward(ctx, dy):
        k = ctx.k
        if torch.is_grad_enabled():  # create_graph: a gradient that differentiates again
            return _differentiable(k, ctx.places, dy, ctx.x_size), None
        if not dy.is_contiguous(memory_format=k.format):
            dy = dy.contiguous(memory_format=k.format)
        dx = empty(ctx.x_size, dy, k.format)
        _engine.launch_steps(
            k.index, (k.backward, (dy.data_ptr(), ctx.places.data_ptr(), dx.data_ptr()))
        )
        return dx, None


def _places(k: Kernels, places: torch.Tensor) -> torch.Tensor:
    """The places' bytes as an (N, C, Ho, Wo) view, however the kernels laid them."""
    N, C, Ho, Wo = k.out
    if k.layout == "nhwc":
        return places.view(N, Ho, Wo, C).permute(0, 3, 1, 2)
    return places.view(N, C, Ho, Wo)


def _differentiable(k: Kernels, places, dy, x_size) -> torch.Tensor:
    """dx as PyTorch ops of dy (a backward with ``create_graph``): each window's
    gradient at its place, zero elsewhere and in the rows and columns no window takes."""
    KH, KW = k.window
    N, C, Ho, Wo = k.out
    at = torch.arange(KH * KW, device=dy.device).view(KH, KW)
    hit = _places(k, places)[..., None, None] == at  # N, C, Ho, Wo, KH, KW
    g = torch.where(hit, dy[..., None, None], torch.zeros((), dtype=dy.dtype, device=dy.device))
    g = g.permute(0, 1, 2, 4, 3, 5).reshape(N, C, Ho * KH, Wo * KW)
    H, W = x_size[2:]
    return F.pad(g, (0, W - Wo * KW, 0, H - Ho * KH))


ACTIVATIONS = {"relu": (torch.nn.ReLU, torch.relu)}  # what the kernels apply first


def max_pool2d(
    x,
    kernel_size,
    stride=None,
    padding=0,
    dilation=1,
    ceil_mode=False,
    return_indices=False,
    *,
    activation=None,
):
    """``torch.nn.functional.max_pool2d`` on specgen's kernels where they serve it
    (module docstring), else PyTorch's; with ``activation`` ("relu" or None) applied to
    x first, in the same kernel: max_pool2d(relu(x))."""
    if activation is not None and activation not in ACTIVATIONS:
        raise ValueError(f"activation must be 'relu' or None, got {activation!r}")
    window = window_of(kernel_size, stride, padding, dilation, ceil_mode, return_indices)
    layout = kernel_layout(x, window)
    if layout is None:
        if activation is not None:
            x = ACTIVATIONS[activation][1](x)
        return F.max_pool2d(x, kernel_size, stride, padding, dilation, ceil_mode, return_indices)
    return MaxPoolFunction.apply(x, kernels(x, layout, window, activation))


class MaxPool2d(torch.nn.MaxPool2d):
    """``torch.nn.MaxPool2d`` (same constructor and state) whose calls run on specgen's
    kernels where they serve them.  Where ``convert`` fuses the ReLU before it
    (``activation`` "relu"), it applies that to its input first, in every mode."""

    activation = None  # set by convert where it fuses the ReLU before it

    @classmethod
    def from_torch(cls, m: torch.nn.MaxPool2d) -> torch.nn.Module:
        """The same pool as ours where the kernels serve its window, else ``m`` itself
        (its calls would all run PyTorch's max pool)."""
        args = (m.kernel_size, m.stride, m.padding, m.dilation, m.ceil_mode, m.return_indices)
        if window_of(*args) is None:
            return m
        new = cls.__new__(cls)
        new.__dict__ = dict(m.__dict__)
        return new

    def extra_repr(self):
        fused = f", activation={self.activation} first" if self.activation else ""
        return super().extra_repr() + fused

    def forward(self, input):
        return max_pool2d(
            input,
            self.kernel_size,
            self.stride,
            self.padding,
            self.dilation,
            self.ceil_mode,
            self.return_indices,
            activation=self.activation,
        )
