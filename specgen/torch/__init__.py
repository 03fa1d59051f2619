"""specgen inside PyTorch: a drop-in ``conv2d`` and ``Conv2d`` that run specgen's
specialized kernels forward and backward.

    import specgen.torch as sg
    y = sg.conv2d(x, w, b, stride=1, padding=1)      # as torch.nn.functional.conv2d
    layer = sg.Conv2d(3, 256, 3, padding=1)          # as torch.nn.Conv2d
    model = sg.convert(model)                        # every nn.Conv2d of a model

The semantics are those of ``torch.nn.functional.conv2d``: batched (4-D) and unbatched
(3-D) input, padding as an int, a pair, 'same' or 'valid', stride, dilation, groups,
an optional bias.  Tensors are float32, float16 or bfloat16 on a CUDA device, in the
contiguous or the channels_last memory format (anything else is made contiguous);
autocast casts them as it does for PyTorch's convolution, and float32 tensors get tf32
math only where ``torch.backends.cudnn.allow_tf32`` allows it.  Kernels launch on the
current stream of the tensors' device, allocate through PyTorch and never wait.  What
the kernels do not serve (CPU or float64 tensors, arguments they refuse) runs on
PyTorch's own convolution, which computes it or raises PyTorch's exception;
``strict(True)`` or ``SPECGEN_STRICT=1`` refuses it instead (``SpecError``).

Each new problem gets a kernel once per process (the log of ``specgen.torch`` says
which and why): the tuned winner of this GPU in specgen's results database, else the
winner shipped for this GPU, else the planner's default.  ``autotune(True)`` or
``SPECGEN_AUTOTUNE=1`` tunes each new problem on its first call and keeps the winner
for later processes; ``warmup(model, example)`` does all of that before a timed run
or a CUDA graph capture.
"""

from __future__ import annotations

import os

import torch
import torch.nn.functional as F

from ..errors import SpecError
from . import _convnorm, _engine, _ops  # _ops registers torch.ops.specgen.*
from ._args import arguments as _arguments
from ._args import transposed as _transposed
from ._batchnorm import BatchNorm2d, batch_norm
from ._engine import autotune, autotuning
from ._pool import MaxPool2d, max_pool2d

__all__ = [
    "conv2d",
    "Conv2d",
    "conv1d",
    "Conv1d",
    "conv_transpose2d",
    "ConvTranspose2d",
    "batch_norm",
    "BatchNorm2d",
    "max_pool2d",
    "MaxPool2d",
    "convert",
    "warmup",
    "autotune",
    "autotuning",
    "strict",
    "SpecError",
]


def _check_shapes(input, weight, bias, groups) -> None:
    if input.shape[1] != weight.shape[1] * groups:
        raise SpecError(
            f"input of {input.shape[1]} channels for weights {tuple(weight.shape)} in "
            f"{groups} group(s): expected {weight.shape[1] * groups}"
        )
    if weight.shape[0] % groups:
        raise SpecError(f"groups={groups} must divide the {weight.shape[0]} output channels")
    if bias is not None and tuple(bias.shape) != (weight.shape[0],):
        raise SpecError(f"bias of shape {tuple(bias.shape)}, expected ({weight.shape[0]},)")


_strict = [os.environ.get("SPECGEN_STRICT", "") not in ("", "0")]


def strict(enabled: bool = True) -> None:
    """Refuse (a ``SpecError``) what specgen's kernels do not serve, instead of running
    PyTorch's own convolution for it; also ``SPECGEN_STRICT=1``."""
    _strict[0] = bool(enabled)


def strictness() -> bool:
    return _strict[0]


_fell_back: set = set()  # the problems already logged as run by PyTorch


def _pytorch(reason: SpecError, conv, input, weight, *args):
    """PyTorch's own convolution ``conv`` (``F.conv2d``, ``F.conv1d``) for what specgen
    does not serve (CPU or float64 tensors, arguments it refuses, a problem no strategy
    serves), logged once a problem at INFO: it computes what PyTorch computes, or raises
    the exception PyTorch raises.  Strict (``strict``), the refusal itself."""
    if _strict[0] or (input.is_cuda and torch.cuda.is_current_stream_capturing()):
        raise reason
    if torch.compiler.is_compiling():  # traced into a graph: PyTorch's op, not logged
        return conv(input, weight, *args)  # (torch.compile's tracer takes no logging)
    key = (tuple(input.shape), input.dtype, input.device.type, tuple(weight.shape), str(reason))
    if key not in _fell_back and len(_fell_back) < 4096:
        _fell_back.add(key)
        _engine.log.info(
            "specgen: PyTorch's convolution for input %s of %s on %s: %s",
            tuple(input.shape),
            input.dtype,
            input.device,
            reason,
        )
    return conv(input, weight, *args)


def _unserved(input, weight, bias) -> None:
    """The SpecError that says in one line why the kernels do not take these tensors
    (a CPU tensor, a dtype they lack), raised before any work; the layers' own checks
    cover the rest."""
    if not input.is_cuda or input.dtype not in _engine.DTYPES:
        _engine.check_tensors(input, weight, bias)


def conv2d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """``torch.nn.functional.conv2d`` on specgen's kernels; what they do not serve runs
    on PyTorch's own (``_pytorch``) unless ``strict``."""
    if input.is_meta:  # a trace of sizes alone (model.conv_layers): PyTorch's meta kernel,
        # the output in the input's memory format as the operator gives it
        y = F.conv2d(input, weight, bias, stride, padding, dilation, groups)
        return _engine.dense(y, _engine.layout_of(input)) if y.dim() == 4 else y
    given = (stride, padding, dilation, groups)
    try:
        if input.dim() not in (3, 4) or weight.dim() != 4:
            raise SpecError(
                f"conv2d takes a 3-D or 4-D input and 4-D weights, got {input.dim()}-D and "
                f"{weight.dim()}-D"
            )
        args = _arguments(stride, padding, dilation, weight)
        _unserved(input, weight, bias)
        return _conv2d(input, weight, bias, *args, groups)
    except SpecError as e:
        return _pytorch(e, F.conv2d, input, weight, bias, *given)


def _one(v, what: str) -> int:
    """A 1-D convolution's argument: an int or a 1-tuple."""
    if isinstance(v, int):
        return v
    if isinstance(v, (tuple, list)) and len(v) == 1 and isinstance(v[0], int):
        return v[0]
    raise SpecError(f"{what} of a 1-D convolution must be an int or a 1-tuple, got {v!r}")


def conv1d(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1):
    """``torch.nn.functional.conv1d`` on specgen's kernels: a 2-D convolution of height 1
    (the input and the weights seen with a row axis of one), what they do not serve on
    PyTorch's own, as ``conv2d``."""
    given = (bias, stride, padding, dilation, groups)
    try:
        if input.dim() not in (2, 3) or weight.dim() != 3:
            raise SpecError(
                f"conv1d takes a 2-D or 3-D input and 3-D weights, got {input.dim()}-D and "
                f"{weight.dim()}-D"
            )
        _unserved(input, weight, bias)
        pad = padding if isinstance(padding, str) else (0, _one(padding, "padding"))
        args = ((1, _one(stride, "stride")), pad, (1, _one(dilation, "dilation")), groups)
    except SpecError as e:
        return _pytorch(e, F.conv1d, input, weight, *given)
    return conv2d(input.unsqueeze(-2), weight.unsqueeze(-2), bias, *args).squeeze(-2)


def conv_transpose2d(
    input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1, dilation=1
):
    """``torch.nn.functional.conv_transpose2d`` on specgen's kernels: the dgrad of the
    convolution it is the adjoint of (same weights, stride, padding, dilation and
    groups), its input gradient on that convolution's fprop and its weight gradient on
    its wgrad, each differentiable in turn.  What they do not serve runs on PyTorch's
    own, as ``conv2d``."""
    given = (bias, stride, padding, output_padding, groups, dilation)
    if input.is_meta:
        return F.conv_transpose2d(input, weight, *given)
    try:
        if input.dim() not in (3, 4) or weight.dim() != 4:
            raise SpecError(
                f"conv_transpose2d takes a 3-D or 4-D input and 4-D weights, got "
                f"{input.dim()}-D and {weight.dim()}-D"
            )
        if isinstance(padding, str):
            raise SpecError(f"padding={padding!r}: a transposed convolution pads by ints")
        _unserved(input, weight, bias)
        stride, pads, dilation = _arguments(stride, padding, dilation, weight)
        unbatched = input.dim() == 3
        x = input.unsqueeze(0) if unbatched else input
        if x.shape[1] != weight.shape[0] or weight.shape[0] % groups:
            raise SpecError(
                f"input of {x.shape[1]} channels for transposed weights {tuple(weight.shape)} "
                f"in {groups} group(s)"
            )
        y_size, pads = _transposed(
            x.shape, weight.shape, stride, pads, output_padding, dilation, groups
        )
        if bias is not None and tuple(bias.shape) != (y_size[1],):
            raise SpecError(f"bias of shape {tuple(bias.shape)}, expected ({y_size[1]},)")
    except SpecError as e:
        return _pytorch(e, F.conv_transpose2d, input, weight, *given)
    compiling = torch.compiler.is_compiling()
    cast = False
    if torch.is_autocast_enabled("cuda"):
        dt = torch.get_autocast_dtype("cuda")
        x = x.to(dt)
        # fp32 weights on the eager path are cast by the operator, in the launch that
        # packs them (_engine.Cast), as conv2d's are
        cast = weight.dtype is torch.float32 and dt is not torch.float32 and not compiling
        if not cast:
            weight = weight.to(dt)
    if compiling:
        nhwc = _engine.layout_of(x) is _engine.TensorLayout.NHWC
        x = x.contiguous(memory_format=torch.channels_last if nhwc else torch.contiguous_format)
        args = (list(stride), list(pads), list(dilation), groups)
        y = torch.ops.specgen.conv2d_input(x, weight, y_size, *args, nhwc)
    else:
        try:
            args = (tuple(stride), tuple(pads), tuple(dilation), groups)
            lay, x = _engine.transposed_layer(x, weight, tuple(y_size), *args, cast)
        except SpecError as e:
            return _pytorch(e, F.conv_transpose2d, input, weight, *given)
        y = _ops.conv_transpose2d_eager(x, weight, lay)
    if bias is not None:
        y = y + bias.to(y.dtype).view(1, -1, 1, 1)
    return y.squeeze(0) if unbatched else y


def _conv2d(input, weight, bias, stride, pads, dilation, groups):
    """specgen's convolution of arguments as ``_arguments`` gives them."""
    unbatched = input.dim() == 3
    if unbatched:
        input = input.unsqueeze(0)
    if torch.compiler.is_compiling():
        input, weight, bias, _ = _autocast(input, weight, bias, compiling=True)
        _check_shapes(input, weight, bias, groups)
        y = torch.ops.specgen.conv2d(
            input, weight, bias, list(stride), list(pads), list(dilation), groups
        )
    else:
        lay, input, weight, bias = eager_layer(input, weight, bias, stride, pads, dilation, groups)
        y = _ops.conv2d_eager(input, weight, bias, lay)
    return y.squeeze(0) if unbatched else y


def _autocast(input, weight, bias, compiling=False):
    """The tensors as autocast hands them to the convolution where it is on (input and
    weights in its dtype, a 16-bit bias too), and whether the operator casts the fp32
    weights itself, in the launch that packs them for its kernels (``_engine.Cast``:
    on the eager path; traced, autocast's cast stays)."""
    if not (input.is_cuda and torch.is_autocast_enabled("cuda")):
        return input, weight, bias, False
    dt = torch.get_autocast_dtype("cuda")
    if input.dtype is not dt:  # a layer's output is in it already: no call
        input = input.to(dt)
    cast = weight.dtype is torch.float32 and dt is not torch.float32 and not compiling
    if not cast:
        weight = weight.to(dt)
    if bias is not None and bias.dtype is not torch.float32:
        bias = bias.to(dt)  # an fp32 bias stays: the kernels add it in fp32 anyway
    return input, weight, bias, cast


def eager_layer(input, weight, bias, stride, pads, dilation, groups):
    """The eager path's layer of a batched convolution (``_engine.layer``) and its
    tensors as its kernels take them (autocast's, x dense in the layer's layout), or
    the SpecError that says why the kernels do not serve it."""
    input, weight, bias, cast = _autocast(input, weight, bias)
    lay, input = _engine.layer(
        input, weight, bias, stride, pads, dilation, groups, _check_shapes, cast
    )
    return lay, input, weight, bias


class Conv2d(torch.nn.Conv2d):
    """``torch.nn.Conv2d`` (same constructor, parameters and state_dict) on specgen's
    kernels; a non-zero ``padding_mode`` pads through ``F.pad`` first, as PyTorch's does."""

    def _conv_forward(self, input, weight, bias):
        if self.padding_mode != "zeros":
            input = F.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            return conv2d(input, weight, bias, self.stride, 0, self.dilation, self.groups)
        return conv2d(input, weight, bias, self.stride, self.padding, self.dilation, self.groups)

    @classmethod
    def from_torch(cls, m: torch.nn.Module) -> torch.nn.Module:
        """The same layer, sharing ``m``'s parameters."""
        new = cls.__new__(cls)
        new.__dict__ = dict(m.__dict__)
        new._parameters = m._parameters
        new._buffers = m._buffers
        new._modules = m._modules
        return new


_convnorm.bind(Conv2d, _arguments, eager_layer)


class Conv1d(torch.nn.Conv1d):
    """``torch.nn.Conv1d`` (same constructor, parameters and state_dict) on specgen's
    kernels, as a 2-D convolution of height 1; a non-zero ``padding_mode`` pads through
    ``F.pad`` first, as PyTorch's does."""

    def _conv_forward(self, input, weight, bias):
        if self.padding_mode != "zeros":
            input = F.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            return conv1d(input, weight, bias, self.stride, 0, self.dilation, self.groups)
        return conv1d(input, weight, bias, self.stride, self.padding, self.dilation, self.groups)

    from_torch = classmethod(Conv2d.from_torch.__func__)


class ConvTranspose2d(torch.nn.ConvTranspose2d):
    """``torch.nn.ConvTranspose2d`` (same constructor, parameters and state_dict, and
    ``output_size`` in the call) on specgen's kernels."""

    def forward(self, input, output_size=None):
        if self.padding_mode != "zeros":
            raise ValueError("Only `zeros` padding mode is supported for ConvTranspose2d")
        output_padding = self._output_padding(
            input, output_size, self.stride, self.padding, self.kernel_size, 2, self.dilation
        )
        return conv_transpose2d(
            input,
            self.weight,
            self.bias,
            self.stride,
            self.padding,
            output_padding,
            self.groups,
            self.dilation,
        )

    from_torch = classmethod(Conv2d.from_torch.__func__)


BatchNorm2d.from_torch = classmethod(Conv2d.from_torch.__func__)

SPECGEN = {  # PyTorch's module -> ours
    torch.nn.Conv2d: Conv2d,
    torch.nn.Conv1d: Conv1d,
    torch.nn.ConvTranspose2d: ConvTranspose2d,
}


def convert(
    model: torch.nn.Module, batchnorm: bool = True, fuse: bool = True, pool: bool = True
) -> torch.nn.Module:
    """Every ``torch.nn.Conv2d``, ``Conv1d`` and ``ConvTranspose2d`` of ``model`` (the
    model itself too) replaced in place by specgen's, sharing its parameters, with
    ``batchnorm`` every ``torch.nn.BatchNorm2d`` too (its training-mode calls on
    specgen's kernels, ``BatchNorm2d``) and with ``pool`` every ``torch.nn.MaxPool2d``
    whose windows tile its input (``MaxPool2d``); with ``fuse`` as well, each batch norm takes the ReLU or ReLU6
    after it and each max pool the ReLU before it, where the model's structure shows
    it (an ``nn.Sequential``; torchvision's ResNet blocks, their shortcut's add too:
    ``_fuse``); returns the model.
    Its first call on CUDA tensors compiles the kernels of every convolution it will
    meet at once, a process a core, before running (as ``warmup`` does): one after
    another, as the layers meet them, they take minutes on a deep model."""
    table = {**SPECGEN, torch.nn.BatchNorm2d: BatchNorm2d} if batchnorm else dict(SPECGEN)
    if pool:
        table[torch.nn.MaxPool2d] = MaxPool2d
    converted = _convert(model, table)
    if batchnorm and fuse:
        from ._fuse import fuse as fused

        converted = fused(converted)
    if pool and fuse:
        from ._fuse import fuse_pools

        converted = fuse_pools(converted)
    if converted is model and not hasattr(model, AHEAD):  # a container, not one layer
        setattr(model, AHEAD, model.register_forward_pre_hook(_compile_ahead))
    return converted


def _convert(model: torch.nn.Module, table: dict) -> torch.nn.Module:
    ours = table.get(type(model))
    if ours is not None:
        return ours.from_torch(model)
    for name, child in model.named_children():
        setattr(model, name, _convert(child, table))
    return model


AHEAD = "_specgen_compile_ahead"  # the converted model's one-shot forward pre-hook


def _drop_ahead(model: torch.nn.Module) -> None:
    """The first call's compile-ahead hook removed, where the model has it."""
    handle = model.__dict__.pop(AHEAD, None)
    if handle is not None:
        handle.remove()


def _on_cuda(args) -> bool:
    return any(torch.is_tensor(a) and a.is_cuda for a in args)


def _compile_ahead(model: torch.nn.Module, args) -> None:
    """On the first call of a converted model on CUDA tensors: its kernels compiled at
    once (``_trace.precompile_model``; the backward's too where it will run), and where
    autotuning is on, every candidate it will time.  Never under torch.compile's
    tracing or a graph capture, where nothing may compile; a model that cannot be
    traced ahead compiles as it goes, as before."""
    if torch.compiler.is_compiling() or not _on_cuda(args):
        return
    if torch.cuda.is_available() and torch.cuda.is_current_stream_capturing():
        return
    _drop_ahead(model)
    from ._trace import precompile_model

    backward = model.training and torch.is_grad_enabled()
    try:
        precompile_model(model, args, backward, autotune=autotuning())
    except Exception as e:  # a head start only: never the reason a forward fails
        _engine.log.info("specgen: kernels not compiled ahead (%s); they compile as met", e)


def warmup(model: torch.nn.Module, *example, backward: bool = True) -> None:
    """Run ``model(*example)`` (and its backward where parameters need gradients) once,
    so that every convolution's kernels are chosen, tuned where autotuning is on and
    compiled: before a timed run, and before a CUDA graph capture, which cannot
    compile.  Every kernel is compiled first, at once, a process a core
    (``_trace.precompile_model``), and where autotuning is on every candidate it will
    time.  The parameters' ``.grad`` are left as they were."""
    from ._trace import precompile_model

    _drop_ahead(model)  # compiled here, not again by the first call
    precompile_model(model, example, backward, autotune=autotuning())
    out = model(*example)
    params = [p for p in model.parameters() if p.requires_grad]
    if backward and params and torch.is_tensor(out) and out.requires_grad:
        torch.autograd.grad(out.float().sum(), params, allow_unused=True)
    torch.cuda.synchronize()
