"""A model's convolutions as a forward pass meets them, traced on the meta device, and
the kernels the operator will pick for them: what ``specgen model`` lists and times,
and what ``specgen.torch.warmup`` compiles at once before a model's first call."""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass

import torch

from ..choose import choose, computed_problem
from ..errors import SpecError
from ..parallel import Source, precompile
from ..shapes import DType, Op, TensorLayout
from ._args import arguments

log = logging.getLogger("specgen.torch")


@dataclass(frozen=True)
class Mode:
    """One math a model is run in: the convolutions' dtype and their tensors' memory
    format (None: as traced), and whether fp32 tensors may use tf32 (as
    ``torch.backends.cudnn.allow_tf32``)."""

    name: str
    dtype: DType | None
    layout: TensorLayout | None
    tf32: bool

    @property
    def autocast(self) -> torch.dtype | None:
        return {DType.BF16: torch.bfloat16, DType.FP16: torch.float16}.get(self.dtype)


@dataclass(frozen=True)
class ConvLayer:
    """One convolution call as a forward pass meets it."""

    name: str
    x_size: tuple[int, int, int, int]
    w_size: tuple[int, int, int, int]
    stride: tuple[int, int]
    pads: tuple[int, int, int, int]
    dilation: tuple[int, int]
    groups: int
    bias: bool
    needs_dx: bool  # its input needs a gradient (not the model's input)
    needs_dw: bool = True  # its weights do
    dtype: DType = DType.FP32  # its input's, as traced (autocast is the mode's)
    layout: TensorLayout = TensorLayout.NCHW
    # a transposed convolution, held as the convolution it is the adjoint of (sizes,
    # pads; its bias is added apart): its forward is that one's dgrad, its input
    # gradient that one's fprop, its weight gradient that one's wgrad
    transposed: bool = False

    def problem(self, op: Op, mode: Mode):
        from ._engine import problem

        bias = self.bias and op in (Op.FPROP, Op.WGRAD)
        args = (self.stride, self.pads, self.dilation, self.groups)
        dtype, layout = mode.dtype or self.dtype, mode.layout or self.layout
        return problem(op, self.x_size, self.w_size, bias, *args, dtype, layout)

    def ops(self, backward: bool = True) -> list[Op]:
        """The ops of the convolution (of the adjoint one, for a transposed layer) that
        the forward pass, and where ``backward`` the gradients, run."""
        forward, input_grad = (Op.DGRAD, Op.FPROP) if self.transposed else (Op.FPROP, Op.DGRAD)
        if not backward:
            return [forward]
        return [
            forward,
            *([input_grad] if self.needs_dx else []),
            *([Op.WGRAD] if self.needs_dw else []),
        ]


def on_meta(model, *example):
    """``model``'s output on ``example`` computed on the meta device: meta tensors of the
    same sizes, dtypes and memory formats stand in for the parameters, the buffers and
    the example (``torch.func.functional_call``), so nothing is copied or computed."""

    def meta(t):
        if not torch.is_tensor(t):
            return t
        return torch.empty_like(t, device="meta").requires_grad_(t.requires_grad)

    params = {n: meta(p) for n, p in model.named_parameters()}
    buffers = {n: meta(b) for n, b in model.named_buffers()}
    return torch.func.functional_call(model, (params, buffers), tuple(meta(e) for e in example))


def conv_layers(model, *example) -> list[ConvLayer]:
    """Every ``nn.Conv2d`` and ``nn.ConvTranspose2d`` call (specgen's too) of one
    forward pass of ``model`` on ``example``, in order (a layer called twice is listed
    twice; a transposed one as its adjoint convolution), traced on the meta device
    (``on_meta``)."""
    return traced(model, *example)[0]


def traced(model, *example, cast=None) -> tuple[list[ConvLayer], list[tuple[str, str]]]:
    """``conv_layers``, and the (name, source) of the batch norm kernels the same pass
    will load (specgen's ``BatchNorm2d`` in training mode, ``_batchnorm.planned_form``),
    each once, from one trace on the meta device.  ``cast``: autocast's dtype, which the
    trace does not apply (meta tensors are no CUDA tensors): the batch norms of an fp32
    trace then read the convolutions' outputs in it."""
    from ._batchnorm import BatchNorm2d, planned_form, source
    from ._engine import DTYPES, layout_of

    found: list[ConvLayer] = []
    forms: dict[tuple, None] = {}  # each batch norm problem once, in order

    def norm_hook(m, args, kwargs):
        residual = args[1] if len(args) > 1 else kwargs.get("residual")
        x = args[0]
        dtype = cast if cast is not None and x.dtype is torch.float32 else None
        form = planned_form(m, x, residual, dtype)
        if form is not None:
            forms[form] = None

    names = {m: n for n, m in model.named_modules()}

    def hook(m, args):
        x, w = args[0], m.weight
        stride, pads, dilation = arguments(m.stride, m.padding, m.dilation, w)
        size = tuple(x.shape)
        if isinstance(m, torch.nn.ConvTranspose2d):
            found.extend(_transposed_layer(m, args, names[m], stride, pads, dilation))
            return
        if m.padding_mode != "zeros":  # padded by F.pad first, then convolved unpadded
            pt, pb, pl, pr = pads
            size, pads = (*size[:2], size[2] + pt + pb, size[3] + pl + pr), (0, 0, 0, 0)
        found.append(
            ConvLayer(
                names[m],
                size,
                tuple(w.shape),
                stride,
                pads,
                dilation,
                m.groups,
                m.bias is not None,
                x.requires_grad,
                w.requires_grad,
                DTYPES.get(x.dtype, DType.FP32),
                layout_of(x) if x.dim() == 4 else TensorLayout.NCHW,
            )
        )

    kinds = (torch.nn.Conv2d, torch.nn.ConvTranspose2d)
    handles = [m.register_forward_pre_hook(hook) for m in model.modules() if isinstance(m, kinds)]
    # a batch norm's output is its input's size, dtype and memory format: the trace
    # takes it as that rather than run PyTorch's batch norm on the meta device, in
    # Python (0.3 s of resnet50's first step on the H200's host)
    norms = [m for m in model.modules() if isinstance(m, BatchNorm2d)]
    handles += [m.register_forward_pre_hook(norm_hook, with_kwargs=True) for m in norms]
    sized = [m for m in norms if "forward" not in m.__dict__]
    for m in sized:
        m.forward = functools.partial(_sized_like, m)
    try:
        on_meta(model, *example)
    finally:
        for h in handles:
            h.remove()
        for m in sized:
            del m.forward
    sources = dict(source(*form) for form in forms)  # one set a source (NHWC: any plane size)
    return found, list(sources.items())


def _sized_like(m, input, residual=None):
    """Batch norm ``m``'s output on the meta device, uncomputed (``traced``): the
    gradient flows on through it where it would."""
    grads = [t.requires_grad for t in (input, residual, m.weight, m.bias) if t is not None]
    return torch.empty_like(input).requires_grad_(torch.is_grad_enabled() and any(grads))


def _transposed_layer(m, args, name, stride, pads, dilation) -> list[ConvLayer]:
    """A ``ConvTranspose2d`` call as the adjoint convolution the operator runs it on
    (``_args.transposed``); none where it runs on PyTorch's."""
    from ._args import transposed
    from ._engine import DTYPES, layout_of

    x, w = args[0], m.weight
    output_size = args[1] if len(args) > 1 else None
    extra = m._output_padding(x, output_size, m.stride, m.padding, m.kernel_size, 2, m.dilation)
    size = tuple(x.shape) if x.dim() == 4 else (1, *x.shape)
    try:
        y_size, conv_pads = transposed(size, w.shape, stride, pads, extra, dilation, m.groups)
    except SpecError:
        return []
    layout = layout_of(x) if x.dim() == 4 else TensorLayout.NCHW
    dtype = DTYPES.get(x.dtype, DType.FP32)
    args = (stride, conv_pads, dilation, m.groups)
    return [
        ConvLayer(
            name,
            tuple(y_size),
            tuple(w.shape),
            *args,
            False,
            x.requires_grad,
            w.requires_grad,
            dtype,
            layout,
            transposed=True,
        )
    ]


@dataclass
class Row:
    layer: str
    spec: str
    op: str
    computed: str  # the layout the op runs in, and " C=N" where its channels are padded
    kernel: str
    source: str
    specgen_ms: float | None = None
    cudnn_ms: float | None = None
    pick: tuple | None = None  # (the problem as computed, its variant), for precompiling


def plan_rows(
    layers: list[ConvLayer], mode: Mode, gpu: str, arch: str, backward: bool = True
) -> list[Row]:
    """Per distinct (problem, op) of the layers (the forward pass alone where not
    ``backward``): the layout it is computed in and the kernel specgen picks on ``gpu``."""
    rows, seen = [], set()
    for layer in layers:
        for op in layer.ops(backward):
            p = layer.problem(op, mode)
            if p in seen:
                continue
            seen.add(p)
            p = computed_problem(p, gpu, mode.tf32, arch)
            pick = None
            try:
                c = choose(p, gpu, mode.tf32, arch)
                kernel, source, pick = c.variant.kernel_name(p), c.source, (p, c.variant)
            except SpecError as e:
                kernel, source = "-", str(e)
            given = layer.problem(op, mode)
            # the layout computed in, the channels where they are padded, and the window
            # where it is cropped to the taps that meet x
            at = p.layout.value + (f" C={p.C}" if p.C != given.C else "")
            at += f" K={p.R}x{p.S}" if (p.R, p.S) != (given.R, given.S) else ""
            rows.append(Row(layer.name, given.spec, op.value, at, kernel, source, pick=pick))
    return rows


def dw_orders(model, autocast: bool) -> dict[str, str]:
    """Layer name -> the order its wgrad writes an fp32 dw in, where it does
    (``Layer.dw_order`` for fp32 weights under autocast's cast, ``Layer.fp32_dw`` for
    fp32 channels_last weights): the wgrad kernel the operator runs for that layer is
    that one (``with_fp32_grads``), not the plan as it stands, and is compiled ahead so.
    resnet50's 23 wgrads under bf16 autocast otherwise compiled one after another at its
    first backward."""
    from ._engine import channels_last_strides, fp32_dw_order

    out = {}
    for name, m in model.named_modules():
        w = getattr(m, "weight", None)
        if not isinstance(m, torch.nn.Conv2d) or not torch.is_tensor(w) or w.dim() != 4:
            continue
        if w.dtype is torch.float32:  # autocast casts fp32 weights only
            cl = tuple(w.stride()) == channels_last_strides(tuple(w.shape))
            out[name] = fp32_dw_order(cl, cast=autocast)
    return {name: order for name, order in out.items() if order}


def precompile_model(
    model, example, backward: bool = True, index: int | None = None, autotune: bool = False
) -> int:
    """Compile the kernels of every convolution ``model`` meets on ``example``, and of
    every batch norm of specgen's it runs in training mode, at once, one process a
    core, as the operator will pick them on the example's device now
    (its dtype, or autocast's where it is on; its memory format; tf32 as cuDNN may):
    the operator's first calls then find them in the disk cache instead of compiling
    one after another.  ``index``: the device, where not the example's.  Returns how
    many were compiled; 0 where the example is not on a CUDA device or the model cannot
    be traced on the meta device (its kernels then compile as the run meets them).
    ``autotune``: every candidate autotuning will verify and time for each problem
    (``_engine.autotune_items``) too, in the background (``_engine.compile_behind``),
    the problems in the order the run meets them (the forward pass's, then the
    backward's, last layer first): the run goes on at once, and each problem's tune
    waits for its own candidates only, rather than every tune for every compile or each
    tune compiling its own with a pool of its own.  Returns how many were handed to it."""
    from ._engine import DTYPES, allow_tf32, arch_of, autotune_items, compile_behind, gpu_name

    if index is None:  # the example's device
        x = next((e for e in example if torch.is_tensor(e) and e.is_cuda), None)
        if x is None:
            return 0
        index = x.device.index
    cast = torch.get_autocast_dtype("cuda") if torch.is_autocast_enabled("cuda") else None
    try:
        layers, norms = traced(model, *example, cast=cast)
    except (RuntimeError, NotImplementedError, TypeError, ValueError, SpecError) as e:
        log.info("specgen: the model was not traced ahead (%s); kernels compile as met", e)
        return 0
    mode = Mode("as called", DTYPES.get(cast), None, allow_tf32())
    gpu, arch = gpu_name(index), arch_of(index)
    rows = plan_rows(layers, mode, gpu, arch, backward)
    orders = dw_orders(model, autocast=cast is not None)
    if autotune:  # in the order met: the forward pass, then each layer's gradients, last first
        first = {name: i for i, name in enumerate(dict.fromkeys(r.layer for r in rows))}
        back = sorted((r for r in rows if r.op != Op.FPROP.value), key=lambda r: -first[r.layer])
        rows = [r for r in rows if r.op == Op.FPROP.value] + back

    def pick_of(r):
        return (*r.pick, orders.get(r.layer, "")) if r.op == Op.WGRAD.value else r.pick

    sources = [(Source(name, text), None) for name, text in norms]  # batch norm's
    if not autotune:
        picks = [pick_of(r) for r in rows if r.pick] + sources
        precompile(picks, arch, os.cpu_count() or 1, f"compiling {len(picks)} kernels")
        return len(picks)
    precompile(sources, arch, os.cpu_count() or 1, f"compiling {len(sources)} batch norms")
    items = []
    for r in rows:
        if r.pick:
            items += [pick_of(r), *autotune_items(r.pick[0], gpu, mode.tf32, arch)]
    items = list(dict.fromkeys(items))
    log.info("specgen: compiling %d kernels in the background, each tune waiting", len(items))
    compile_behind(items, arch)
    return len(items)
