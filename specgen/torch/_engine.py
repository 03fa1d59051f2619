"""The operator's engine: from PyTorch tensors to a ``ConvProblem``, the kernel chosen
for it (memoized per problem, device and math), and the launch on the tensors' current
stream with memory PyTorch allocates.  Nothing here synchronizes."""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, replace

import torch

from .. import tunedb
from ..choose import WGEMM_MIN_MAPS, Choice, choose, maths
from ..errors import SpecError
from ..runtime import Conv, device_arch, launch_words, weight_dtype
from ..shapes import ConvProblem, DType, Op, TensorLayout
from ..tensors import Role, w_shape

log = logging.getLogger("specgen.torch")

DTYPES = {torch.float32: DType.FP32, torch.float16: DType.FP16, torch.bfloat16: DType.BF16}
AUTOTUNE_BUDGET = int(os.environ.get("SPECGEN_AUTOTUNE_BUDGET", "24"))

_state = dict(autotune=os.environ.get("SPECGEN_AUTOTUNE", "") not in ("", "0"))
_lock = threading.Lock()


def autotune(enabled: bool = True) -> None:
    """Tune each new problem on its first call (``SPECGEN_AUTOTUNE=1`` does the same):
    the winner goes to specgen's results database, so later processes start from it."""
    _state["autotune"] = bool(enabled)


def autotuning() -> bool:
    return _state["autotune"]


@dataclass
class Kernel:
    """One problem's compiled kernel on one device."""

    problem: ConvProblem
    choice: Choice
    conv: Conv
    gather: torch.Tensor | None = None  # pack_weights' indices, for the ops that read w
    # the same gather read from channels_last weights' storage ([M][R][S][C/g]), and
    # whether it is the identity there (mrsc, untransformed: the storage itself serves)
    gather_cl: torch.Tensor | None = None
    storage_order: bool = False
    at_cl: torch.Tensor | None = None  # gather_cl as int32, for the operator's own gather


_kernels: dict[tuple, Kernel] = {}
_by_args: dict[tuple, Kernel] = {}
_gpu_names: dict[int, str] = {}


def layout_of(x: torch.Tensor) -> TensorLayout:
    """NHWC where the tensor is channels_last in memory, as PyTorch's convolution reads
    it: a tensor that is contiguous in both formats (one channel, or 1x1 images) is
    NHWC only where its strides are those that channels_last gives."""
    if not x.is_contiguous(memory_format=torch.channels_last):
        return TensorLayout.NCHW
    if not x.is_contiguous():
        return TensorLayout.NHWC
    N, C, H, W = x.shape
    last, first = (H * W * C, 1, W * C, C), (C * H * W, H * W, W, 1)
    return TensorLayout.NHWC if x.stride() == last and last != first else TensorLayout.NCHW


def computed_layout(op: Op, layout: TensorLayout, dtype: DType, w_size=None, groups=1):
    """The layout a problem is computed in: the tensors' own, except fp32 wgrad of a
    channels_last layer with few maps a group (``w_size`` [M][C/g][R][S]): there x and
    dy are copied to NCHW for ``wband`` (the autoencoder's 3-map layer: 1.0-1.2 ms in
    NHWC against 0.3 in NCHW, H200), unless tf32 is allowed and ``tcwgrad`` takes the
    layer (channels and maps per group multiples of 4).  Layers with maps enough stay
    in NHWC for ``wgemm``, which reads them in place."""
    if layout is TensorLayout.NHWC and op is Op.WGRAD and dtype is DType.FP32:
        if w_size is None:
            return TensorLayout.NCHW
        Mg, Cg = w_size[0] // groups, w_size[1]
        if Mg >= WGEMM_MIN_MAPS or (allow_tf32() and Cg % 4 == 0 and Mg % 4 == 0):
            return layout
        return TensorLayout.NCHW
    return layout


def dense(t: torch.Tensor, layout: TensorLayout) -> torch.Tensor:
    fmt = torch.channels_last if layout is TensorLayout.NHWC else torch.contiguous_format
    return t if t.is_contiguous(memory_format=fmt) else t.contiguous(memory_format=fmt)


def empty(size, like: torch.Tensor, layout: TensorLayout) -> torch.Tensor:
    """Every output the operator returns is allocated here (the tests poison it)."""
    fmt = torch.channels_last if layout is TensorLayout.NHWC else torch.contiguous_format
    return torch.empty(size, dtype=like.dtype, device=like.device, memory_format=fmt)


def dtype_of(t: torch.Tensor) -> DType:
    if t.dtype not in DTYPES:
        raise SpecError(
            f"specgen's convolution takes float32, float16 or bfloat16 tensors, got {t.dtype}"
        )
    return DTYPES[t.dtype]


def problem(op, x_size, w_size, bias, stride, pads, dilation, groups, dtype, layout):
    N, C, H, W = x_size
    M, _, R, S = w_size
    return ConvProblem(
        C=C,
        M=M,
        H=H,
        W=W,
        R=R,
        S=S,
        stride=tuple(stride),
        dil=tuple(dilation),
        pads=tuple(pads),
        groups=groups,
        bias=bias,
        dtype=dtype,
        layout=layout,
        op=op,
        batch=max(N, 1),
    )


def gpu_name(index: int) -> str:
    if index not in _gpu_names:
        _gpu_names[index] = torch.cuda.get_device_name(index)
    return _gpu_names[index]


def allow_tf32() -> bool:
    """As PyTorch's own convolution: tf32 math for fp32 tensors only where cuDNN may."""
    return bool(torch.backends.cudnn.allow_tf32)


def kernel(op, x_size, w_size, bias, stride, pads, dilation, groups, dtype, layout, device):
    """The memoized kernel of the problem these arguments describe (``problem``'s),
    looked up by the arguments themselves: a call that hits builds no problem."""
    tf32 = allow_tf32()
    key = (op, *x_size[1:], *w_size, bias, *stride, *pads, *dilation, groups, dtype, layout)
    k = _by_args.get((key, device.index, tf32))
    if k is None:
        p = problem(op, x_size, w_size, bias, stride, pads, dilation, groups, dtype, layout)
        k = _by_args[(key, device.index, tf32)] = kernel_for(p, device)
    return k


def kernel_for(p: ConvProblem, device: torch.device) -> Kernel:
    tf32 = allow_tf32()
    key = (replace(p, batch=1), device.index, tf32)
    k = _kernels.get(key)
    if k is not None:
        return k
    with _lock:
        k = _kernels.get(key)
        if k is None:
            k = _kernels[key] = _build(p, device.index, tf32)
    return k


def _build(p: ConvProblem, index: int, tf32: bool) -> Kernel:
    import cupy

    if torch.cuda.is_current_stream_capturing():
        raise SpecError(
            f"specgen has no kernel yet for {p.spec} and cannot compile one while a CUDA "
            "graph is being captured: run the model once before capturing "
            "(or call specgen.torch.warmup)"
        )
    gpu = gpu_name(index)
    with cupy.cuda.Device(index):
        arch = device_arch()
        if autotuning() and choose(p, gpu, tf32, arch).source != "tuned":
            _tune(p, gpu, tf32, arch)
        choice = choose(p, gpu, tf32, arch)
        conv = Conv(p, choice.variant)
        reads_w = p.op in (Op.FPROP, Op.DGRAD)
        gather = _gather(conv, index) if reads_w else None
    log.info("specgen: %s %s -> %s (%s)", p.op.value, p.spec, conv.plan.name, choice.why)
    k = Kernel(p, choice, conv, gather)
    if gather is not None:
        at = torch.as_tensor(channels_last_offsets(p), device=f"cuda:{index}")
        k.gather_cl = at[gather]
        k.storage_order = bool(torch.equal(k.gather_cl.cpu(), torch.arange(len(gather))))
        stored = weight_dtype(conv.plan.weight_format)
        if len(gather) < 2**31 and stored in (p.dtype.value, "fp32"):
            # the gather compiled now, outside any graph capture: its weights' dtype is
            # the problem's (the ops check it), so this is the one it will run
            k.at_cl = k.gather_cl.to(torch.int32)
            gather_kernel(index, p.dtype.value, stored)
    return k


def _tune(p: ConvProblem, gpu: str, tf32: bool, arch: str) -> None:
    """Tune every math the caller allows, once per problem across processes: the first
    process holds the lock while it tunes, the others wait and then read its winners."""
    from ..tune import run_tune

    with tunedb.locked(p.spec):
        if choose(p, gpu, tf32, arch).source == "tuned":
            return  # another process tuned it while this one waited
        for precision in maths(p, tf32):
            try:
                run_tune(p, precision, AUTOTUNE_BUDGET, log.info)
            except SpecError as e:
                log.info("specgen: no %s kernel tuned for %s (%s)", precision.value, p.spec, e)


def raw_stream(index: int) -> int:
    """The bare handle of the device's current PyTorch stream."""
    get = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # no Stream object per call
    return get(index) if get else torch.cuda.current_stream(index).cuda_stream


# The packed weights' storage, by ``runtime.weight_dtype`` of the plan's format.
STORED = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def pack_weights(k: Kernel, w: torch.Tensor) -> torch.Tensor:
    """The plan's weight format from PyTorch's [M][C/g][R][S], on the device, in one
    gather: fp32 (16-bit values are exact in it) or the 16-bit dtype of the tensor-core
    kernels, flipped and transposed for dgrad's forward view, laid out as the kernel
    reads them.  The gather's indices are the
    host packers (``runtime.dgrad_weights``, ``runtime.pack_weights``) applied once to
    the weights' own indices, so the two paths cannot disagree."""
    dtype = STORED[weight_dtype(k.conv.plan.weight_format)]
    if k.gather is None:  # PyTorch's own layout: at most one copy, cast and all
        if w.dtype is dtype and w.is_contiguous():
            return w
        return w.to(dtype, memory_format=torch.contiguous_format)
    if k.gather_cl is not None and w.is_contiguous(memory_format=torch.channels_last):
        # channels_last weights: their storage read as it lies, and for mrsc,
        # untransformed, that storage is the packed layout itself
        if k.storage_order:
            return w if w.dtype is dtype else w.to(dtype)
        if k.at_cl is not None and (w.dtype is dtype or dtype is torch.float32):
            return gather(w, k.at_cl, dtype)
        packed = w.as_strided((w.numel(),), (1,)).index_select(0, k.gather_cl)
    else:
        packed = w.reshape(-1).index_select(0, k.gather)
    return packed if packed.dtype is dtype else packed.to(dtype)


_gathers: dict[tuple, int] = {}  # (device, source dtype, target dtype) -> the gather kernel


def gather(w: torch.Tensor, at: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """w's storage read at ``at`` (int32 indices, on w's device) into ``dtype`` (w's
    own, or fp32 from a 16-bit w) by specgen's own gather kernel
    (``templates/torch/gather.cu.j2``), on the current stream: the values of
    ``index_select`` and a cast, in one launch and one allocation."""
    index = w.device.index
    func = gather_kernel(index, DTYPES[w.dtype].value, DTYPES[dtype].value)
    out = torch.empty(at.numel(), dtype=dtype, device=w.device)
    n = at.numel()
    words = (w.data_ptr(), at.data_ptr(), out.data_ptr(), n)
    on_device(
        index, launch_words, func, (-(-n // 256), 1, 1), (256, 1, 1), words, raw_stream(index)
    )
    return out


def on_device(index: int, fn, *args) -> None:
    """``fn(*args)`` with device ``index`` current, as a driver launch needs its
    function's context (switched only where another device is current)."""
    import cupy

    if cupy.cuda.runtime.getDevice() == index:
        fn(*args)
    else:
        with cupy.cuda.Device(index):
            fn(*args)


def gather_kernel(index: int, source: str, target: str) -> int:
    """The gather from dtype ``source`` to ``target`` on device ``index``, compiled and
    loaded on first use."""
    func = _gathers.get((index, source, target))
    if func is None:
        func = _gathers[(index, source, target)] = _load_gather(index, source, target)
    return func


def _load_gather(index: int, source: str, target: str) -> int:
    import cupy

    from ..compile import compile_source
    from ..runtime import gather_source

    name, text = gather_source(source, target)
    with cupy.cuda.Device(index):
        binary = compile_source(text, name, device_arch())
        module = cupy.cuda.function.Module()
        module.load(binary.cubin)
        _modules.append(module)  # the function lives as long as its module
        return module.get_function(name).ptr


_modules: list = []


def channels_last_offsets(p: ConvProblem):
    """Where each weight of PyTorch's [M][C/g][R][S] lies in a channels_last tensor's
    storage ([M][R][S][C/g]), by its flat logical index (a NumPy array)."""
    import numpy as np

    M, Cg, R, S = w_shape(p)
    at = np.arange(M * R * S * Cg, dtype=np.int64).reshape(M, R, S, Cg).transpose(0, 3, 1, 2)
    return np.ascontiguousarray(at).reshape(-1)


def _gather(conv: Conv, index: int):
    """The flat index of PyTorch's weight read at each packed position, on the device,
    or None where the packed layout is PyTorch's own."""
    import numpy as np

    from ..runtime import dgrad_weights
    from ..runtime import pack_weights as host_pack

    plan, p = conv.plan, conv.shape
    if plan.weight_format not in ("f32", "ckkm", "mrsc.fp16", "mrsc.bf16", "mrsc.fp32"):
        raise SpecError(
            f"{plan.name} packs weights as {plan.weight_format}, which the PyTorch operator "
            "does not serve"
        )
    if plan.weight_format == "f32" and not plan.weight_transform:
        return None
    ids = np.arange(p.weight_count, dtype=np.int64).reshape(w_shape(p))
    if plan.weight_transform == "dgrad":
        ids = dgrad_weights(ids, p.groups)
    return torch.as_tensor(host_pack(ids, plan.weight_format), device=f"cuda:{index}")


def launch(k: Kernel, tensors: dict, batch: int, device, w=None, bias=None) -> None:
    """Enqueue the kernel over ``tensors`` (Role -> dense tensor of the problem's layout)
    on the current stream; ``w`` and ``bias`` for the ops that read them."""
    if batch == 0:
        return
    stream = raw_stream(device.index)
    ptrs = {role: t.data_ptr() for role, t in tensors.items()}
    keep = []  # what must outlive the enqueue: PyTorch frees it in stream order
    if w is not None:
        packed = pack_weights(k, w)
        keep.append(packed)
        at = k.conv.upload_weights(
            packed.data_ptr(), packed.numel() * packed.element_size(), stream
        )
        ptrs[Role.W] = at or 0
    if bias is not None:
        if bias.dtype is not torch.float32 or not bias.is_contiguous():
            bias = bias.to(torch.float32).contiguous()
            keep.append(bias)
        ptrs[Role.BIAS] = bias.data_ptr()
    need = k.conv.scratch_bytes(batch)
    if need:
        scratch = torch.empty(need, dtype=torch.uint8, device=device)
        ptrs[Role.WORKSPACE] = scratch.data_ptr()
    on_device(device.index, k.conv.launcher(batch), ptrs, stream)
