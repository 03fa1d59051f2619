"""``specgen model NAME``: a torchvision model's convolutions (or the built-in U-Net's,
``unet``) on specgen, beside cuDNN.

Three steps, each its own function so that scripts can call them:

* ``conv_layers``: the model's ``nn.Conv2d`` layers as one forward pass meets them (on
  the meta device, no GPU needed): each layer's input size, arguments, and whether its
  input needs a gradient (the first layer's does not, so it has no dgrad).
* ``plan_rows``: per layer and op, the problem and the kernel specgen picks for it
  (``choose``), and the layout it computes in (an NCHW op copied to NHWC where only
  there a tensor-core kernel takes it).
* ``run``: on a GPU, per math (fp32; tf32; bf16 autocast with channels_last tensors):
  the output and the conv weights' gradients against float64, beside cuDNN's; the
  training step (forward, cross-entropy, backward, SGD) timed beside cuDNN's in the same
  run, eagerly and as one CUDA graph; and each layer's ops timed alone.
* ``first_steps`` (``--first-step``): the first training step of a fresh process on
  cuDNN, and on specgen with an empty disk cache and then with it warm
  (``first_step``, one child process each; the imports timed apart).
"""

from __future__ import annotations

import copy
import functools
import os
import statistics
from pathlib import Path

import torch
import torch.nn.functional as F

from ..errors import SpecError
from ..files import atomic_write
from ..parallel import precompile
from ..shapes import DType, Op, TensorLayout
from ._trace import ConvLayer, Mode, Row, conv_layers, on_meta, plan_rows

# name -> (batch, image side) of the table; any torchvision classifier works.
MODELS = {
    "resnet18": (64, 224),
    "resnet34": (64, 224),
    "resnet50": (32, 224),
    "vgg11": (32, 224),
    "vgg16": (32, 224),
    "mobilenet_v2": (64, 224),
    "mobilenet_v3_large": (64, 224),
    "efficientnet_b0": (64, 224),
    "densenet121": (32, 224),
    "regnet_y_400mf": (64, 224),
    "inception_v3": (32, 299),  # its auxiliary head needs 299-pixel images
    "unet": (32, 128),
}


class UNet(torch.nn.Module):
    """A small U-Net (``specgen model unet``, ``examples/ddp.py``): two levels down with
    strided convolutions, two up with transposed ones, skip connections added, an
    image out; every op of the operator (conv2d, conv_transpose2d, their gradients)."""

    def __init__(self, width: int = 32):
        super().__init__()
        w, nn = width, torch.nn
        self.inp = nn.Conv2d(3, w, 3, padding=1)
        self.down1 = nn.Conv2d(w, 2 * w, 3, stride=2, padding=1)
        self.down2 = nn.Conv2d(2 * w, 4 * w, 3, stride=2, padding=1)
        self.mid = nn.Conv2d(4 * w, 4 * w, 3, padding=1)
        self.up2 = nn.ConvTranspose2d(4 * w, 2 * w, 4, stride=2, padding=1)
        self.up1 = nn.ConvTranspose2d(2 * w, w, 4, stride=2, padding=1)
        self.out = nn.Conv2d(w, 3, 3, padding=1)

    def forward(self, x):
        a = F.relu(self.inp(x))
        b = F.relu(self.down1(a))
        c = F.relu(self.mid(F.relu(self.down2(b))))
        b = F.relu(self.up2(c)) + b
        a = F.relu(self.up1(b)) + a
        return self.out(a)


BUILT_IN = {"unet": UNet}  # models of specgen's own: an image in, an image out


MODES = {
    "fp32": Mode("fp32", DType.FP32, TensorLayout.NCHW, False),
    "tf32": Mode("tf32", DType.FP32, TensorLayout.NCHW, True),
    "bf16": Mode("bf16", DType.BF16, TensorLayout.NHWC, False),
}


def build(name: str):
    """The built-in model ``name``, else the torchvision one (random weights), or
    SpecError."""
    if name in BUILT_IN:
        return BUILT_IN[name]()
    try:
        import torchvision
    except ImportError:
        raise SpecError("specgen model needs torchvision: pip install 'specgen[model]'") from None
    try:
        try:  # no pretrained backbone either (segmentation and detection models)
            return torchvision.models.get_model(name, weights=None, weights_backbone=None)
        except TypeError:  # a model without a backbone option
            return torchvision.models.get_model(name, weights=None)
    except (ValueError, KeyError):
        some = ", ".join(MODELS)
        raise SpecError(f"torchvision has no model '{name}' (some that do: {some})") from None


def build_sizes(name: str):
    """``build(name)`` for its layers' sizes alone: on the meta device, no weights
    initialised (2 s saved for resnet50), or on the CPU where the constructor computes
    from tensors' values (regnet's widths)."""
    try:
        with torch.device("meta"):
            return build(name)
    except (NotImplementedError, RuntimeError):
        return build(name)


def batch_norms(net, convert) -> str:
    """What ``convert`` makes of ``net``'s batch norms, max pools and residual stages,
    in a line (``_fuse.describe``, ``describe_pools`` and ``_chain.describe``), from a
    copy converted on the CPU."""
    from ._chain import describe as describe_chains
    from ._fuse import describe, describe_pools

    converted = convert(copy.deepcopy(net).cpu())
    lines = (describe(converted), describe_pools(converted), describe_chains(converted))
    return "; ".join(filter(None, lines))


def layers_of(net, name: str, batch: int, image: int) -> list[ConvLayer]:
    """``conv_layers`` of ``net`` on ``batch`` images of ``image`` pixels a side, or a
    SpecError where the model's own forward pass refuses them: inception_v3's auxiliary
    head below 299 pixels, a video model's 5-D input, a detection model's targets."""
    try:
        return conv_layers(net, torch.empty(batch, 3, image, image, device="meta"))
    except SpecError:
        raise
    except Exception as e:  # the model's own code: any of its errors
        text = str(e).strip().splitlines()[0] if str(e).strip() else ""
        why = (
            text
            if isinstance(e, (RuntimeError, ValueError)) and text
            else f"{type(e).__name__}: {text}"
        )
        raise SpecError(f"{name} does not run on {image}x{image} images: {why}") from None


def format_rows(rows: list[Row], timed: bool) -> str:
    head = ["layer", "problem", "op", "in", "kernel", "source"]
    if timed:
        head += ["specgen ms", "cuDNN ms", "speedup"]
    lines = [head]
    for r in rows:
        line = [r.layer, r.spec, r.op, r.computed, r.kernel, r.source]
        if timed:
            ok = r.specgen_ms and r.cudnn_ms
            line += [
                f"{r.specgen_ms:.4f}" if r.specgen_ms else "-",
                f"{r.cudnn_ms:.4f}" if r.cudnn_ms else "-",
                f"{r.cudnn_ms / r.specgen_ms:.2f}x" if ok else "-",
            ]
        lines.append(line)
    return _columns(lines)


def _columns(lines: list[list]) -> str:
    """Rows of cells as left-aligned columns two spaces apart."""
    widths = [max(len(str(line[i])) for line in lines) for i in range(len(lines[0]))]
    return "\n".join(
        "  ".join(str(c).ljust(w) for c, w in zip(line, widths)).rstrip() for line in lines
    )


SLOW = 0.8  # the speed against cuDNN's below which a layer op is slow (issue 44's floor)


def slow_rows(rows: list[Row]) -> list[Row]:
    """The timed rows whose op ran below ``SLOW`` times cuDNN's speed."""
    return [r for r in rows if r.specgen_ms and r.cudnn_ms and r.cudnn_ms < SLOW * r.specgen_ms]


def slow_problems(title: str, batch: int, path: str, found: dict[str, list[Row]]) -> str:
    """A problems file of the slow rows of each mode run (``found``: mode -> its timed
    rows), each problem once (a spec serves fp32 and tf32 alike: a tune searches both
    maths), as ``specgen tune --problems`` reads it; its comments say what it holds and
    the tune that takes it."""
    specs = {}  # spec -> the modes it was slow in
    for mode, rows in found.items():
        for r in slow_rows(rows):
            specs.setdefault(r.spec, []).append(mode)
    lines = [
        f"# {title}: {len(specs)} layer op(s) below {SLOW}x cuDNN in {', '.join(found)}",
        f"# specgen tune --problems {path} --batch {batch}",
    ]
    lines += [f"{spec}  # {', '.join(modes)}" for spec, modes in specs.items()]
    return "\n".join(lines) + "\n"


def format_op_sums(rows: list[Row]) -> str:
    """The timed rows summed by op: where a model's kernels lose to cuDNN's at a glance
    (each distinct problem once, as the rows hold them: not weighted by its layers)."""
    head = ["op", "problems", "specgen ms", "cuDNN ms", "speedup", f"below {SLOW}x"]
    lines = [head]
    timed = [r for r in rows if r.specgen_ms and r.cudnn_ms]
    for op in (*dict.fromkeys(r.op for r in timed), "all"):
        mine = [r for r in timed if op in (r.op, "all")]
        ours, theirs = sum(r.specgen_ms for r in mine), sum(r.cudnn_ms for r in mine)
        slow = len(slow_rows(mine))
        ratio = f"{theirs / ours:.2f}x" if ours else "-"  # "all" of no timed row
        lines.append([op, len(mine), f"{ours:.3f}", f"{theirs:.3f}", ratio, slow])
    return _columns(lines)


# -- on a GPU -------------------------------------------------------------------------


def median_ms(fn, reps: int = 20, warmup: int = 3) -> float:
    """The median of ``reps`` timings of ``fn`` with CUDA events, after ``warmup`` calls."""
    return alternated_ms({0: fn}, reps, warmup)[0]


def _prepare(model, mode: Mode):
    fmt = torch.channels_last if mode.layout is TensorLayout.NHWC else torch.contiguous_format
    return model.cuda().to(memory_format=fmt)


def _inputs(batch: int, image: int, mode: Mode, target: tuple | None, seed: int = 0):
    """A batch and its targets (``_target``): class indices of the output's shape
    without its class axis, or (``target`` None) images to match."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(batch, 3, image, image, device="cuda", generator=g)
    if mode.layout is TensorLayout.NHWC:
        x = x.contiguous(memory_format=torch.channels_last)
    if target is None:
        return x, torch.randn(batch, 3, image, image, device="cuda", generator=g)
    classes, *pixels = target
    return x, torch.randint(0, classes, (batch, *pixels), device="cuda", generator=g)


def _main_output(out):
    """The output a loss is taken of: a segmentation model's ``out`` entry, a model's
    first output where training adds auxiliary ones (inception_v3, googlenet)."""
    if isinstance(out, dict):
        return out["out"]
    if isinstance(out, (tuple, list)):
        return out[0]
    return out


def _forward_backward(model, x, t, mode: Mode, seed: int | None = None):
    """Forward, loss (cross-entropy on classes, a pixel's or the image's; mean squared
    error on images; in fp32, or float64 for the float64 reference) and backward."""
    if seed is not None:  # the same dropout masks in every run that compares
        torch.manual_seed(seed)
    with torch.autocast("cuda", dtype=mode.autocast, enabled=mode.autocast is not None):
        out = _main_output(model(x))
        wide = out if out.dtype is torch.float64 else out.float()
        if t.is_floating_point():
            loss = F.mse_loss(wide, t.to(wide.dtype))
        else:
            loss = F.cross_entropy(wide, t)
    loss.backward()
    return out.detach().double()


def training_step(model, opt, x, t, mode: Mode):
    """One training step of ``model`` on (``x``, ``t``) as a function of no arguments:
    gradients cleared, forward, loss and backward, the optimizer's step."""

    def step():
        opt.zero_grad(set_to_none=True)
        _forward_backward(model, x, t, mode)
        opt.step()

    return step


CONVS = (torch.nn.Conv2d, torch.nn.ConvTranspose2d)


def _conv_grads(model) -> list[torch.Tensor]:
    return [
        m.weight.grad.detach().double()
        for m in model.modules()
        if isinstance(m, CONVS) and m.weight.grad is not None
    ]


def _rel(a: torch.Tensor, ref: torch.Tensor) -> float:
    return float((a - ref).norm() / ref.norm().clamp_min(1e-300))


def _no_dropout(model):
    """``model`` with its dropout layers in eval mode, torchvision's stochastic depth
    (efficientnet's, convnext's dropped residual branches) among them: their masks are
    drawn per dtype (fp32 and float64 runs draw different ones from one seed), and a
    different mask is no error of the convolutions.  Batch norm keeps training mode."""
    random = _random_layers()
    for m in model.modules():
        if isinstance(m, random):
            m.eval()
    return model


def _random_layers() -> tuple[type, ...]:
    """The module types whose training-mode output is random."""
    try:
        from torchvision.ops import StochasticDepth
    except ImportError:
        return (torch.nn.modules.dropout._DropoutNd,)
    return (torch.nn.modules.dropout._DropoutNd, StochasticDepth)


def accuracy(base, batch: int, image: int, mode: Mode, convert) -> dict:
    """The output's and the conv weight gradients' relative errors (norm of the
    difference over the norm of float64's; for the gradients the worst layer) of
    cuDNN's and specgen's run of ``base`` in ``mode``, both against float64 on cuDNN
    (train mode: batch norm on the batch's statistics, the same for all three; dropout
    off, ``_no_dropout``)."""
    x, t = _inputs(batch, image, mode, _target(base, batch, image))
    ref = _no_dropout(copy.deepcopy(base).cuda().double())
    out64 = _forward_backward(ref, x.double(), t, MODES["fp32"], seed=0)
    g64 = _conv_grads(ref)
    found = {}
    for who in ("cuDNN", "specgen"):
        m = _no_dropout(_prepare(copy.deepcopy(base), mode))
        if who == "specgen":
            m = convert(m)
        out = _forward_backward(m, x, t, mode, seed=0)
        grads = _conv_grads(m)
        if not torch.isfinite(out).all() or any(not torch.isfinite(g).all() for g in grads):
            found[who] = (float("nan"), float("nan"))
            continue
        found[who] = (_rel(out, out64), max(_rel(g, r) for g, r in zip(grads, g64)))
    return found


def _target(model, batch: int, image: int) -> tuple | None:
    """What the loss compares the main output with (``_main_output``, its size from a
    forward pass on the meta device): (classes,) for a classifier, (classes, H, W) for
    a model that classifies each pixel (segmentation), None for an image-to-image model
    (the built-in ones)."""
    if type(model) in BUILT_IN.values():
        return None
    out = _main_output(on_meta(model, torch.empty(batch, 3, image, image, device="meta")))
    return (out.shape[1], *out.shape[2:])


def step_ms(base, batch: int, image: int, mode: Mode, convert, graph: bool, reps: int) -> dict:
    """The training step's median ms on cuDNN (``cudnn.benchmark`` on) and on specgen,
    eager and, where ``graph``, captured as one CUDA graph and replayed.  The two
    models' steps are timed in turn (``alternated_ms``): an eager step waits on the
    host, whose speed drifts over seconds, and the drift then weighs on both alike."""
    x, t = _inputs(batch, image, mode, _target(base, batch, image), seed=1)
    runs = {}
    for who in ("cuDNN", "specgen"):
        m = _prepare(copy.deepcopy(base), mode)
        if who == "specgen":
            m = convert(m)
        opt = torch.optim.SGD(m.parameters(), lr=1e-3)
        runs[who] = (m, opt, training_step(m, opt, x, t, mode))
    steps = {who: step for who, (_, _, step) in runs.items()}
    found = {(who, "eager"): ms for who, ms in alternated_ms(steps, reps).items()}
    if graph:
        replays = {}
        for who, (m, opt, step) in runs.items():
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(3):
                    step()
            torch.cuda.current_stream().wait_stream(side)
            captured = _captured(m, opt, x, t, mode)
            if isinstance(captured, str):
                found[(who, "graph")] = captured
            else:
                replays[who] = captured.replay
        found.update({(who, "graph"): ms for who, ms in alternated_ms(replays, reps).items()})
    return found


def alternated_ms(fns: dict, reps: int, warmup: int = 3) -> dict:
    """Each function's median ms (CUDA events) over ``reps`` rounds, a round timing
    every function once, in turn, after ``warmup`` calls of each."""
    for fn in fns.values():
        for _ in range(warmup):
            fn()
    times = {who: [] for who in fns}
    for _ in range(reps):
        for who, fn in fns.items():
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times[who].append(a.elapsed_time(b))
    return {who: statistics.median(ts) for who, ts in times.items()}


def format_steps(summary: list[tuple], graph: bool) -> str:
    """The training-step table: for each (mode, errors, times) of ``run``, cuDNN's and
    specgen's eager step and, where ``graph``, the captured one, and their errors
    against float64; a capture that failed shows as failed, and why, below."""
    lines = [
        "training step (forward, loss, backward, SGD), median ms; "
        "speedup = cuDNN / specgen; errors: relative to float64 (output, worst conv dw)"
    ]
    head = f"{'mode':<6} {'cuDNN':>9} {'specgen':>9} {'speedup':>8}"
    if graph:
        head += f" {'cuDNN graph':>12} {'specgen graph':>14} {'speedup':>8}"
    head += f"  {'cuDNN err (y, dw)':>20}  {'specgen err (y, dw)':>20}"
    lines.append(head)
    failed = []  # (mode, who, why) of each capture that failed
    for mode, err, t in summary:
        cu, ours = t[("cuDNN", "eager")], t[("specgen", "eager")]
        line = f"{mode.name:<6} {cu:9.3f} {ours:9.3f} {cu / ours:7.2f}x"
        if graph:
            graphs = {who: t[(who, "graph")] for who in ("cuDNN", "specgen")}
            failed += [(mode.name, who, v) for who, v in graphs.items() if isinstance(v, str)]
            gc, go = graphs.values()
            cells = [f"{v:.3f}" if isinstance(v, float) else "failed" for v in (gc, go)]
            ratio = "-" if "failed" in cells else f"{gc / go:.2f}x"
            line += f" {cells[0]:>12} {cells[1]:>14} {ratio:>8}"
        ce, se = err["cuDNN"], err["specgen"]
        line += f"  {ce[0]:9.2e} {ce[1]:9.2e}   {se[0]:9.2e} {se[1]:9.2e}"
        lines.append(line)
    for name, who, why in failed:
        lines.append(f"{name} on {who}: the CUDA graph's capture failed: {why}")
    return "\n".join(lines)


def _captured(m, opt, x, t, mode: Mode):
    """The step captured as one CUDA graph, or why the capture failed (one line), which
    the step table shows in its place."""
    g = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    # a capture that fails leaves the device's random generator in its capturing state,
    # where its next draw (the layer table's inputs) raises: its state before, put back
    rng = torch.cuda.default_generators[torch.cuda.current_device()]
    before = rng.clone_state()
    try:
        with torch.cuda.graph(g):
            _forward_backward(m, x, t, mode)
            opt.step()
    except RuntimeError as e:  # PyTorch's CUDA errors: the capture's own, not the step's
        torch.cuda.synchronize()
        rng.graphsafe_set_state(before)
        return str(e).splitlines()[0]
    return g


def layer_times(layers: list[ConvLayer], rows: list[Row], mode: Mode, sg) -> None:
    """Each row's op timed alone on specgen's kernel and on cuDNN, in the row: the
    median of ``bench.REPS`` launches of each, the GPU's time (``held_ms``)."""
    from . import _engine

    dt = {DType.FP32: torch.float32, DType.BF16: torch.bfloat16, DType.FP16: torch.float16}
    fmt = torch.channels_last if mode.layout is TensorLayout.NHWC else torch.contiguous_format
    by_spec = {}
    for layer in layers:
        for op in layer.ops():
            by_spec.setdefault((layer.problem(op, mode).spec, op.value), layer)
    for r in rows:
        layer = by_spec[(r.spec, r.op)]
        kind = dict(device="cuda", dtype=dt[mode.dtype])
        x = torch.randn(layer.x_size, **kind).contiguous(memory_format=fmt)
        w = torch.randn(layer.w_size, **kind) / (layer.w_size[1] * layer.w_size[2]) ** 0.5
        w = w.contiguous(memory_format=fmt)  # as the model's weights are
        b = torch.randn(layer.w_size[0], **kind) if layer.bias else None
        pads = (layer.pads[0], layer.pads[2])
        args = (layer.stride, pads, layer.dilation, layer.groups)
        y = F.conv2d(x, w, b, *args)
        dy = torch.randn_like(y)
        lay, xs = _engine.layer(x, w, b, layer.stride, layer.pads, layer.dilation, layer.groups)
        dys = _engine.dense(dy, lay.layout)
        cu = {
            "fprop": lambda: F.conv2d(x, w, b, *args),
            "dgrad": lambda: torch.ops.aten.convolution_backward(
                dy, x, w, None, *args[:2], args[2], False, [0, 0], args[3], [True, False, False]
            ),
            "wgrad": lambda: torch.ops.aten.convolution_backward(
                dy,
                x,
                w,
                [w.shape[0]] if b is not None else None,
                *args[:2],
                args[2],
                False,
                [0, 0],
                args[3],
                [False, True, b is not None],
            ),
        }
        # The table times each op as the step runs it.  Under autocast the step packs
        # the forward kernel's weights and dgrad's with autocast's cast, in one launch
        # (``_engine.Cast``) that stands where cuDNN's step runs autocast's own cast,
        # which cuDNN's row does not time either: both run on weights packed so; and
        # the model's fp32 bias reaches the operator uncast (``specgen.torch._autocast``).
        # Timed with a 16-bit bias and weights packed per call, efficientnet_b0's
        # squeeze-and-excitation layers took 0.0118 ms where their kernel took 0.0044.
        wk, bk = w, b  # the weights and bias the row's kernel reads
        if mode.autocast is not None:
            if r.op in ("fprop", "dgrad"):
                k = lay.kernel(Op(r.op), r.op == "fprop" and b is not None, x.shape[0])
                packed = _engine.pack_weights(k, lay.window(w, k))
                wk = (packed.data_ptr(), packed.numel() * packed.element_size())
            bk = None if b is None else b.float()
        # and takes dw (db) in fp32 in the weights' memory format where the fp32
        # parameters want them so: under autocast's cast, or fp32 channels_last weights
        grads32 = lay.dw_order if mode.autocast is not None else lay.fp32_dw
        ours = {
            "fprop": lambda: _engine.forward(lay, xs, wk, bk),
            "dgrad": lambda: _engine.input_grad(lay, dys, wk),
            "wgrad": lambda: _engine.weight_grads(lay, xs, dys, b is not None, grads32),
        }
        r.cudnn_ms = held_ms(cu[r.op])
        r.specgen_ms = held_ms(ours[r.op])


def held_ms(fn) -> float:
    """The median GPU time of ``fn``'s launches, queued behind ``bench.held``'s hold: a
    layer's op is often shorter than the host's path to launch it (PyTorch's or the
    operator's), and timed one call at a time its figure would be the host's."""
    from ..bench import torch_times

    return statistics.median(torch_times(lambda i: fn(), 1))


def run(
    name: str,
    batch: int,
    image: int,
    modes: list[Mode],
    reps: int,
    graph: bool,
    layers_too: bool,
    echo,
    progress,
    first_too: bool = False,
    batchnorm: bool = True,
    fuse: bool = True,
    slow_out: str | None = None,
) -> None:
    """The whole of ``specgen model NAME`` on this GPU: per mode, the accuracy, the
    training step and (``layers_too``) the per-layer table, printed through ``echo``;
    what it is doing through ``progress``.  With the layers, each mode's step is
    printed before its layers are timed (the long part: a run stopped there keeps its
    steps), and the steps of every mode together at the end where there are several.
    The model is converted with batch norm and max pool on specgen's kernels too
    where ``batchnorm``, fused with the ReLUs beside them where ``fuse``
    (``specgen.torch.convert``'s).  ``slow_out``: with the layers, a path that each
    mode's timed layers rewrite whole (``slow_problems``), so that a run stopped later
    keeps the modes it timed."""
    import specgen.torch as sg

    from ._engine import arch_of, gpu_name

    torch.backends.cudnn.benchmark = True
    base = build(name)
    layers = layers_of(base, name, batch, image)
    gpu, arch = gpu_name(torch.cuda.current_device()), arch_of(torch.cuda.current_device())
    convert = functools.partial(sg.convert, batchnorm=batchnorm, fuse=fuse, pool=batchnorm)
    echo(
        f"{name}, batch {batch}, {image}x{image} images, {len(layers)} conv calls; {gpu}; "
        f"in specgen's run {batch_norms(base, convert)}"
    )
    summary = []
    slow = {}  # mode -> its timed rows, for ``slow_out``
    for mode in modes:
        torch.backends.cudnn.allow_tf32 = mode.tf32
        torch.backends.cuda.matmul.allow_tf32 = mode.tf32
        rows = plan_rows(layers, mode, gpu, arch)
        # every pick compiled at once, one process a core: the operator then finds
        # each kernel in the disk cache instead of compiling them one after another
        picks = [r.pick for r in rows if r.pick]
        precompile(picks, arch, os.cpu_count() or 1, f"[{mode.name}] compiling {len(picks)}")
        progress(f"[{mode.name}] accuracy against float64")
        err = accuracy(base, batch, image, mode, convert)
        progress(f"[{mode.name}] training step, cuDNN and specgen")
        t = step_ms(base, batch, image, mode, convert, graph, reps)
        summary.append((mode, err, t))
        if layers_too:
            echo("\n" + format_steps(summary[-1:], graph))
            progress(f"[{mode.name}] {len(rows)} layer ops timed alone")
            layer_times(layers, rows, mode, sg)
            echo(
                f"\n{mode.name} ({mode.dtype.value}, {mode.layout.value}"
                f"{', tf32 allowed' if mode.tf32 else ''}), per layer op, median ms:"
            )
            echo(format_rows(rows, timed=True))
            echo("\nsummed by op:")
            echo(format_op_sums(rows))
            if slow_out:
                slow[mode.name] = rows
                title = f"specgen model {name} --batch {batch} --image {image}"
                text = slow_problems(title, batch, slow_out, slow)
                try:
                    atomic_write(Path(slow_out), text.encode())
                except OSError as e:  # the tables above are printed: only the file is lost
                    raise SpecError(f"cannot write --slow-out {slow_out}: {e.strerror or e}")
    if not layers_too or len(summary) > 1:
        echo("\n" + format_steps(summary, graph))
    if first_too:
        found = {}
        for mode in modes:
            progress(f"[{mode.name}] first training steps in fresh processes")
            for who, r in first_steps(name, batch, image, mode).items():
                found[(mode.name, who)] = r
        echo("\n" + format_first_steps(found))


# -- the first step, in fresh processes ------------------------------------------------

FIRST = ("cuDNN", "specgen, cold cache", "specgen, warm cache")


# a first-step process as ``first_steps`` starts it (``specgen.torch.first_step``): its
# clock from before any import
LAUNCH = (
    "import time; start = time.perf_counter(); import sys; "
    "from specgen.torch.first_step import main; main(sys.argv[1:], start)"
)


def first_steps(name: str, batch: int, image: int, mode: Mode, child=None) -> dict:
    """The model's first training step in three fresh processes (``first_step``): on
    cuDNN; on specgen with an empty disk cache (every kernel compiled; nothing tuned);
    on specgen again with that cache.  Returns FIRST's names -> the child's report.
    ``child(args, env)``: runs one and returns its JSON line (a stand-in in tests)."""
    import json
    import subprocess
    import sys
    import tempfile

    def run(args, env):
        done = subprocess.run(
            [sys.executable, "-c", LAUNCH, *args],
            env=env,
            capture_output=True,
            text=True,
        )
        if done.returncode:
            tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise SpecError(f"the first-step process failed: {tail}")
        return done.stdout.strip().splitlines()[-1]

    child = child or run
    args = [name, str(batch), str(image), mode.name]
    found = {}
    with tempfile.TemporaryDirectory(prefix="specgen-cold-") as cold:
        env = dict(os.environ, SPECGEN_CACHE_DIR=cold)
        for who, engine in zip(FIRST, ("cudnn", "specgen", "specgen")):
            found[who] = json.loads(child(args + [engine], env))
    return found


def format_first_steps(found: dict[str, dict]) -> str:
    """The three first steps as a table, against the issue's targets: specgen's cold
    first step within cuDNN's plus 20 s, its warm first step within 3 s."""
    lines = [
        "first training step in a fresh process (s): imports; model built, on the GPU "
        "(CUDA's start) and a batch made; first step; second step; targets: first step "
        "cold <= cuDNN's + 20 s, warm <= 3 s"
    ]
    lines.append(f"{'mode':<6} {'run':<22} {'import':>7} {'setup':>7} {'first':>8} {'second':>8}")
    for (mode, who), r in found.items():
        lines.append(
            f"{mode:<6} {who:<22} {r['import_s']:7.2f} {r['setup_s']:7.2f} "
            f"{r['first_s']:8.2f} {r['second_s']:8.3f}"
        )
    return "\n".join(lines)
