"""Timing on the GPU: CUDA events, warm-up, the median of many launches, inputs rotated
when they fit in L2, each variant verified first, cuDNN timed in the same run."""

from __future__ import annotations

import functools
import statistics
import time
from dataclasses import asdict, dataclass, replace

import numpy as np

from . import measured
from .errors import SpecError
from .shapes import Act, ConvProblem, DType, Op, TensorLayout
from .tensors import INPUTS, Role, from_storage, outputs, role_shape, to_storage, w_shape
from .variants import Precision, Variant

WARMUP = 3
REPS = 25
L2_ROTATE_BYTES = 3 * 60 * 2**20  # rotate inputs until they span 3x the H200's L2


@dataclass
class Timing:
    label: str  # variant name or cudnn-fp32 / cudnn-tf32 / cudnn-fp16
    precision: str
    ms: float  # median
    p10: float
    p90: float
    tflops: float = 0.0
    gbs: float = 0.0
    x_floor: float = 0.0
    x_cudnn: float | None = None  # our time over cuDNN's of the same precision class
    verified: str = ""


def time_launches(launch, reps=REPS, warmup=WARMUP, rotate=1) -> list[float]:
    """launch(i) runs once with input set i % rotate; returns ms per launch.  Every
    launch sits between its own pair of CuPy events on the current stream (``held``)."""
    import cupy

    def pair():
        return cupy.cuda.Event(), cupy.cuda.Event()

    return held(launch, reps, warmup, rotate, pair, cupy.cuda.get_elapsed_time)


def held(launch, reps, warmup, rotate, pair, elapsed, stream=None) -> list[float]:
    """The timed launches (``time_launches``), all queued behind ``hold``: a kernel that
    keeps the stream busy until the host has queued them, so that the GPU runs them back
    to back and the host's launch overhead (tens of microseconds from Python, as long
    as some kernels here, and longer through PyTorch) stays out of the figures.  The
    hold lasts twice what the warm-up says queueing takes; where the host took longer
    after all, the launches are timed once more behind a longer hold.  ``pair()``: a
    start and a stop event; ``elapsed(start, stop)``: their ms; ``stream``: the CuPy
    stream the launches go to (the current one)."""
    queue_ms = _queue_ms(launch, warmup, rotate, reps)
    while True:
        events = [pair() for _ in range(reps)]
        hold(queue_ms, stream)
        start_host = time.perf_counter()
        for i, (start, stop) in enumerate(events):
            start.record()
            launch(i % rotate)
            stop.record()
        host_ms = (time.perf_counter() - start_host) * 1e3
        events[-1][1].synchronize()
        if host_ms <= queue_ms or queue_ms >= HOLD_MS_MAX:
            return [elapsed(start, stop) for start, stop in events]
        queue_ms = min(HOLD_MS_MAX, 2 * host_ms)


# A kernel that spins on the GPU's global timer for a given number of nanoseconds.
_HOLD = r"""
extern "C" __global__ void specgen_hold(unsigned long long ns) {
    unsigned long long start, now;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    do {
        __nanosleep(1000);
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
    } while (now - start < ns);
}
"""
HOLD_MS_MAX = 50.0


def _queue_ms(launch, warmup: int, rotate: int, reps: int) -> float:
    """The warm-up launches run; returns twice the host time the timed ones should take
    to queue: the fastest warm-up launch's (the first may compile, or search cuDNN's
    algorithms) and two event records' each."""
    seconds = []
    for i in range(warmup):
        t = time.perf_counter()
        launch(i % rotate)
        seconds.append(time.perf_counter() - t)
    fastest = min(seconds, default=1e-4)
    return min(HOLD_MS_MAX, 2 * reps * (fastest * 1e3 + 0.02))


def hold(ms: float, stream=None) -> None:
    """Keep the current CuPy stream (or ``stream``) busy on the GPU for ``ms``."""
    import cupy

    with stream or cupy.cuda.get_current_stream():
        _hold_kernel()((1,), (1,), (np.uint64(ms * 1e6),))


@functools.cache
def _hold_kernel():
    import cupy

    return cupy.RawKernel(_HOLD, "specgen_hold")


def summarize(label, precision, times, shape, batch, ceil) -> Timing:
    ms = statistics.median(times)
    q = np.percentile(times, [10, 90])
    flops, nbytes = shape.flops(batch), shape.bytes_moved(batch)
    floor = floor_ms(shape, batch, ceil)
    return Timing(
        label,
        precision,
        ms,
        float(q[0]),
        float(q[1]),
        flops / ms / 1e9,
        nbytes / ms / 1e6,
        ms / floor,
    )


def floor_ms(shape: ConvProblem, batch: int, ceil: dict, tensor: bool = False) -> float:
    """max(bytes / copy bandwidth, flops / fp32 rate); tensor-core kernels: memory only."""
    mem = shape.bytes_moved(batch) / ceil["copy_bytes_per_s"] * 1e3
    if tensor:
        return mem
    return max(mem, shape.flops(batch) / ceil["fp32_flops_per_s"] * 1e3)


def device_name() -> str:
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
    name = props["name"]
    return name.decode() if isinstance(name, bytes) else name


def ceilings(refresh: bool = False) -> dict:
    """Copy bandwidth (bytes read + written) and the fp32 rate of cuBLAS SGEMM,
    measured once per device and cached."""
    import cupy

    name = device_name()
    entry = None if refresh else measured.ceilings(name)
    if entry is not None:
        return entry
    a = cupy.empty(2**28, dtype=np.float32)  # 1 GiB
    b = cupy.empty_like(a)
    t = statistics.median(time_launches(lambda i: b.__setitem__(Ellipsis, a), reps=10))
    copy = 2 * a.nbytes / t * 1e3
    a = b = None  # the 2 GiB freed before the SGEMM's buffers
    n = 8192
    rng = cupy.random.default_rng()
    x = rng.standard_normal((n, n), dtype=np.float32)
    y = rng.standard_normal((n, n), dtype=np.float32)
    with cupy.cuda.Device():
        import os

        os.environ["CUPY_TF32"] = "0"  # pure fp32: the rate a fp32 kernel is held to
        t = statistics.median(time_launches(lambda i: cupy.matmul(x, y), reps=10))
    result = dict(device=name, copy_bytes_per_s=copy, fp32_flops_per_s=2 * n**3 / t * 1e3)
    measured.record(name, result)
    return result


def cudnn_timings(shape: ConvProblem, xs, w, b, batch, ceil, only=None) -> list[Timing]:
    """cuDNN through PyTorch with cudnn.benchmark, on the same inputs, as a user would
    run the problem: conv2d with its bias, then the activation; for the backward ops
    ``aten.convolution_backward`` as autograd calls it, beside a real x (dgrad) or w
    (wgrad) in the tensors' memory format, with db where the layer has a bias.  (Not
    ``torch.nn.grad.conv2d_input``: its x is a zero-strided view, and cuDNN then takes
    the dgrad of a channels-last dy through a format it must convert to.)  An
    fp32 problem is also timed in tf32 and, converted to 16 bits channels-last, in fp16
    and bf16; a 16-bit problem in its own dtype and layout.  The backward ops of an
    unequally padded problem have no cuDNN call of their own: not timed.  ``only``: the
    one precision to time ("fp32", "tf32", "fp16" or "bf16")."""
    try:
        import torch
    except ImportError:
        return []
    import cupy

    torch.backends.cudnn.benchmark = True
    F = torch.nn.functional
    pt, pb, pl, pr = shape.pads
    equal = pt == pb and pl == pr
    if shape.op is not Op.FPROP and not equal:
        return []
    conv_args = (shape.stride, (pt, pl) if equal else 0, shape.dil, shape.groups)
    tw = None if w is None else torch.as_tensor(cupy.asarray(w), device="cuda")
    tb = None if b is None else torch.as_tensor(cupy.asarray(b), device="cuda")
    x_size = (batch, shape.C, shape.H, shape.W)

    stride, pad, dil = list(shape.stride), [pt, pl], list(shape.dil)

    def run(t, w, bias, like):
        if shape.op is Op.FPROP:
            x = t[Role.X]
            if not equal:  # conv2d pads equally; an unequal padding is a pad first
                x = F.pad(x, (pl, pr, pt, pb))
            y = F.conv2d(x, w, bias, *conv_args)
            return F.relu(y) if shape.act is Act.RELU else y
        dy = t[Role.DY]
        if shape.op is Op.BGRAD:
            return dy.sum((0, 2, 3))
        geometry = (stride, pad, dil, False, [0, 0], shape.groups)
        backward = torch.ops.aten.convolution_backward
        if shape.op is Op.DGRAD:
            dx, _, _ = backward(dy, like, w, None, *geometry, [True, False, False])
            return dx
        bias_sizes = [shape.M] if shape.bias else None
        return backward(dy, t[Role.X], like, bias_sizes, *geometry, [False, True, shape.bias])

    def like(dtype, fmt):
        """The tensor beside dy that the backward op takes for its shape and format."""
        if shape.op not in (Op.DGRAD, Op.WGRAD):
            return None
        size = x_size if shape.op is Op.DGRAD else w_shape(shape)
        return torch.empty(size, dtype=dtype, device="cuda").contiguous(memory_format=fmt)

    nhwc = shape.layout is TensorLayout.NHWC

    def nchw(x):
        t = torch.as_tensor(cupy.asarray(from_storage(x, shape.dtype, cupy)), device="cuda")
        return t.permute(0, 3, 1, 2) if nhwc else t

    tx = [{r: nchw(t) for r, t in s.items()} for s in xs]
    out = []
    if shape.dtype is DType.FP32:
        for label, precision, tf32 in (("cudnn-fp32", "fp32", False), ("cudnn-tf32", "tf32", True)):
            if only not in (None, precision):
                continue
            torch.backends.cudnn.allow_tf32 = tf32
            fmt32 = torch.channels_last if nhwc else torch.contiguous_format
            x32 = like(torch.float32, fmt32)
            f = lambda i: run(tx[i], tw, tb, x32)  # noqa: E731
            out.append(summarize(label, precision, torch_times(f, len(tx)), shape, batch, ceil))
        torch.backends.cudnn.allow_tf32 = True
        halves = (torch.float16, torch.bfloat16)
    else:
        halves = (torch.float16 if shape.dtype is DType.FP16 else torch.bfloat16,)
    # fp32 problems are timed in fp16 and bf16 the way cuDNN runs fastest, channels-last.
    last = shape.dtype is DType.FP32 or shape.layout is TensorLayout.NHWC
    fmt = torch.channels_last if last else torch.contiguous_format
    for half in halves:
        if only not in (None, "fp16" if half is torch.float16 else "bf16"):
            continue
        hx = [{r: t.to(half).contiguous(memory_format=fmt) for r, t in s.items()} for s in tx]
        hw = None if tw is None else tw.to(half).contiguous(memory_format=fmt)
        hb = None if tb is None else tb.to(half)
        name = "fp16" if half is torch.float16 else "bf16"
        hl = like(half, fmt)
        f = lambda i: run(hx[i], hw, hb, hl)  # noqa: E731
        out.append(summarize(f"cudnn-{name}", name, torch_times(f, len(hx)), shape, batch, ceil))
    return out


def torch_times(f, rotate):
    """As time_launches, for work PyTorch queues (cuDNN's convolution, specgen's
    operator): torch's events on torch's current stream, the launches held there."""
    import cupy
    import torch

    def pair():
        return torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    stream = cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream)
    return held(f, REPS, WARMUP, rotate, pair, lambda a, b: a.elapsed_time(b), stream)


def input_sets(shape: ConvProblem, batch: int, rng) -> list[dict]:
    """Enough fresh random inputs of the op (Role -> array, as ``random_inputs`` makes
    them) that rotating them defeats the L2, in the problem's storage dtype and layout."""
    import cupy

    from .verify import random_activations

    per_image = sum(np.prod(role_shape(r, shape, 1)) * shape.dtype.bytes for r in INPUTS[shape.op])
    count = max(1, min(8, -(-L2_ROTATE_BYTES // int(batch * per_image))))
    # drawn on the GPU: on the host, drawing and copying them was most of a many-problem
    # tune's time, and slowed as more GPU workers shared the host
    device_rng = cupy.random.default_rng(int(rng.integers(1 << 62)))
    return [random_activations(shape, batch, device_rng, cupy) for _ in range(count)]


# How a 16-bit channels-last wgrad is timed: as the PyTorch operator runs it under
# autocast for a converted model's channels_last weights, dw and db in fp32 and dw as
# [M][R][S][C/groups], where the plan can write them so (``with_fp32_grads``); else as
# bench does, in the tensors' dtype as [M][C/groups][R][S].  Timed in bench's layout,
# resnet50's wgrads took wgwdsm winners that ran slower in the operator (layer3.0.conv1
# 0.0215 to 0.0276 ms, H200, 2026-11-29): their direct 2-byte stores at a stride of R*S
# cost what the operator never pays.
OPERATOR_GRADS = "mrsc"


def timed_grads(shape: ConvProblem) -> str:
    """``OPERATOR_GRADS`` for a 16-bit channels-last wgrad, else ""."""
    wgrad16 = shape.op is Op.WGRAD and shape.dtype is not DType.FP32
    return OPERATOR_GRADS if wgrad16 and shape.layout is TensorLayout.NHWC else ""


def timed_plan(shape: ConvProblem, v: Variant):
    """The plan a candidate is timed as (``timed_grads``): where the problem's grads are
    the operator's fp32 ones and the plan's sums' pass can write them so, that plan;
    else its own."""
    from .plan import make_plan
    from .strategies.wsplit import with_fp32_grads

    plan = make_plan(shape, v)
    grads = timed_grads(shape)
    return (with_fp32_grads(plan, grads) or plan) if grads else plan


def operator_pack(shape: ConvProblem, plan) -> "np.ndarray | None":
    """Where the PyTorch operator packs ``plan``'s weights in a launch of its own every
    call, the offset of each packed weight in the weights' storage as the model holds
    them (channels_last beside NHWC activations, contiguous beside NCHW ones); else
    None.  fp32 layers only: a 16-bit layer's pack rides in the launch that stands for
    autocast's cast of its fp32 weights (``Layer.packing``), and a plan of PyTorch's
    own order, or of the storage's (``Kernel.storage_order``), packs nothing."""
    from .runtime import channels_last_offsets, packed_ids

    if shape.dtype is not DType.FP32 or shape.op not in (Op.FPROP, Op.DGRAD):
        return None
    ids = packed_ids(plan, shape)
    if ids is None:
        return None
    at = channels_last_offsets(shape) if shape.layout is TensorLayout.NHWC else None
    offsets = ids if at is None else at[ids]
    return None if np.array_equal(offsets, np.arange(len(offsets))) else offsets


# How a tune times a candidate whose weights the operator packs a call (``operator_pack``):
# with the operator's own gather before each launch, so that a kernel reading PyTorch's
# order (wgcols) meets the packed ones at what the step pays.  mobilenet_v2's
# features.7.conv.2 tf32 dgrad took 0.0107 ms alone packed, 0.0136 in its layer table
# with the gather, and 0.0126 reading w's columns (H200, 2026-11-30).
def with_operator_pack(conv, shape: ConvProblem, w, launch):
    """``launch(i)`` preceded by the operator's gather of ``w`` (PyTorch's [M][C/g][R][S],
    on the host) into ``conv``'s packed weights, where the operator packs them a call;
    else ``launch`` itself."""
    import cupy

    offsets = operator_pack(shape, conv.plan)
    if offsets is None or conv.w is None or conv.w.dtype != np.float32:
        return launch
    host = cupy.asnumpy(w).astype(np.float32)
    if shape.layout is TensorLayout.NHWC:
        host = host.transpose(0, 2, 3, 1)  # the channels_last storage
    storage = cupy.asarray(np.ascontiguousarray(host).reshape(-1))
    at = cupy.asarray(offsets.astype(np.int32))
    n = len(offsets)
    gather = _fp32_gather()
    grid = (-(-n // 256),)

    def packed(i):
        gather(grid, (256,), (storage, at, conv.w, np.int32(n)))
        launch(i)

    return packed


@functools.cache
def _fp32_gather():
    """The operator's fp32-to-fp32 weight gather as a CuPy kernel, built once for every
    candidate a tune times (as the engine keeps its gathers, ``_engine._gathers``)."""
    import cupy

    from .runtime import gather_source

    name, text = gather_source("fp32", "fp32")
    return cupy.RawKernel(text, name)


def bench_variant(
    shape: ConvProblem, variant: Variant, batch: int, xs, w, b, ceil, conv=None, pack=False
) -> Timing:
    """``conv`` timed (else the plan the tune times, ``timed_plan``): its outputs
    poisoned with NaN first, in fp32 where its plan writes the operator's fp32 grads;
    with the operator's weight pack before each launch where ``pack`` asks and the
    operator packs them a call (``with_operator_pack``)."""
    import cupy

    from .runtime import Conv

    conv = conv or Conv(shape, variant, plan=timed_plan(shape, variant))
    conv.set_weights(w, b)
    wide = bool(conv.plan.context.get("grads32"))
    outs = {}
    for r in outputs(shape):
        nan = cupy.full(role_shape(r, shape, batch), np.nan, np.float32)
        outs[r] = nan if wide else to_storage(nan, shape.dtype, cupy)

    def launch(i):
        conv.run(xs[i], outs)

    if pack:
        launch = with_operator_pack(conv, shape, w, launch)
    times = time_launches(launch, rotate=len(xs))
    t = summarize(conv.plan.name, variant.precision.value, times, shape, batch, ceil)
    t.x_floor = t.ms / floor_ms(shape, batch, ceil, tensor=variant.precision is not Precision.FP32)
    stored = (o if wide else from_storage(o, shape.dtype, cupy) for o in outs.values())
    if not all(bool(cupy.isfinite(o).all()) for o in stored):
        t.verified = "NaN in timed output"
    return t


def format_timings(shape: ConvProblem, batch: int, rows: list[Timing], ceil) -> str:
    fl = floor_ms(shape, batch, ceil)
    mem = floor_ms(shape, batch, ceil, tensor=True)
    head = f"{'kernel':<46} {'prec':<5} {'ms':>8} {'p10-p90':>15} {'TFLOP/s':>8} {'GB/s':>7} {'x floor':>8} {'vs cuDNN':>9}"
    lines = [
        f"{shape.slug} B={batch}: floor {fl:.3f} ms (fp32), memory floor {mem:.3f} ms; "
        f"copy {ceil['copy_bytes_per_s'] / 1e12:.2f} TB/s, SGEMM {ceil['fp32_flops_per_s'] / 1e12:.1f} TFLOP/s",
        head,
        "-" * len(head),
    ]
    for r in rows:
        vs = "-" if r.x_cudnn is None else f"{1 / r.x_cudnn:.2f}x"
        lines.append(
            f"{r.label:<46} {r.precision:<5} {r.ms:>8.3f} {f'{r.p10:.3f}-{r.p90:.3f}':>15} {r.tflops:>8.1f} "
            f"{r.gbs:>7.0f} {r.x_floor:>8.2f} {vs:>9}" + (f"  {r.verified}" if r.verified else "")
        )
    return "\n".join(lines)


def attach_cudnn_ratio(rows: list[Timing], dtype: DType = DType.FP32) -> None:
    """Speed-up over cuDNN of the same precision class (fp32 with fp32; tf32 with tf32;
    fp16 with fp16; bf16 with bf16), stored as our time / cuDNN's.  With 16-bit tensors every kernel
    is held to cuDNN in that dtype, whatever its math."""
    ref = {r.precision: r.ms for r in rows if r.label.startswith("cudnn")}
    for r in rows:
        if r.label.startswith("cudnn"):
            continue
        key = r.precision if dtype is DType.FP32 else dtype.value
        if key in ref:
            r.x_cudnn = r.ms / ref[key]


def to_json(rows: list[Timing]) -> list[dict]:
    return [asdict(r) for r in rows]


def report_key(shape: ConvProblem) -> str:
    """A problem's key in bench's variant lists and report: its slug, and its op after a
    space where that is not the forward pass (``--op all`` times every op of one slug)."""
    return shape.slug if shape.op is Op.FPROP else f"{shape.slug} {shape.op.value}"


def run_bench(shapes, batch, variants, best, echo) -> dict:
    """Verify then time each variant of each shape, with cuDNN and the floor;
    ``variants``: the variants to time by ``report_key``, the default set where none."""
    import cupy

    from .runtime import Conv, device_arch
    from .strategies import default_set
    from .verify import draw_trial, random_inputs, verify_variant

    ceil = ceilings()
    arch = device_arch()
    rng = np.random.default_rng()
    report = dict(device=device_name(), ceilings=ceil, shapes={})
    for shape in shapes:
        b = batch or shape.batch
        # the defaults as the operator fits them: to the batch being timed (an inline
        # spec's own batch is 1, where wgmma's tf32 default took b64x128 at 0.095 ms
        # against b256x128's 0.066 at B=128, H200)
        fitted = replace(shape, batch=b)
        if best:
            from .choose import best_picks

            try:
                chosen = [v for v, _ in best_picks(shape, device_name())] or default_set(fitted)
            except SpecError as e:
                echo(f"{shape.slug}: not timed: {e}")
                continue
        else:
            chosen = (variants or {}).get(report_key(shape)) or default_set(fitted)
        xs = input_sets(shape, b, rng)
        _, w, bias = random_inputs(shape, 1, rng)
        rows = cudnn_timings(shape, xs, w, bias, b, ceil)
        trial = draw_trial(shape, min(b, 8), rng)  # one set of inputs for the chosen
        for v in chosen:
            check = verify_variant(
                shape, v, arch=arch, batch=trial.batch, numbers=True, trial=trial
            )
            if not check.ok:
                echo(f"{check.name}: not timed, verification failed: {'; '.join(check.problems)}")
                continue
            t = bench_variant(shape, v, b, xs, w, bias, ceil, Conv(shape, v))
            t.verified = t.verified or f"verified, err/bound {check.bound_ratio:.2f}"
            rows.append(t)
        attach_cudnn_ratio(rows, shape.dtype)
        echo(format_timings(shape, b, rows, ceil))
        echo("")
        report["shapes"][report_key(shape)] = dict(
            batch=b,
            spec=shape.spec,  # op included: the plot reads the problem back from it
            floor_ms=floor_ms(shape, b, ceil),
            memory_floor_ms=floor_ms(shape, b, ceil, True),
            rows=to_json(rows),
        )
        del xs
        cupy.get_default_memory_pool().free_all_blocks()
    return report
