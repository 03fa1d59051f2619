"""The operator's engine: from PyTorch tensors to a ``ConvProblem``, the kernel chosen
for it (memoized per problem, device and math), and the launch on the tensors' current
stream with memory PyTorch allocates.  Nothing here synchronizes."""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import dataclass, field, replace

import torch

from .. import tunedb
from ..choose import WGEMM_MIN_MAPS, Choice, choose, computed_problem, crop_origin, maths
from ..choose import search_floor, searched_math, three_tf32_suits
from ..errors import SpecError
from ..plan import make_plan
from ..runtime import (
    Conv,
    _driver_launch,
    _Step,
    device_arch,
    recording,
    sum_source,
    transpose_source,
)
from ..runtime import channels_last_offsets, packed_ids, weight_dtype
from ..shapes import ConvProblem, DType, Op, TensorLayout
from ..strategies.wlane import MAX_ACCUMULATORS as LANE_SUMS
from ..strategies.wsplit import with_fp32_grads
from ..tensors import Role, w_shape
from ..variants import Precision

log = logging.getLogger("specgen.torch")

DTYPES = {torch.float32: DType.FP32, torch.float16: DType.FP16, torch.bfloat16: DType.BF16}
AUTOTUNE_BUDGET = int(os.environ.get("SPECGEN_AUTOTUNE_BUDGET", "24"))

# the batch sizes whose bound launches one kernel keeps (past these, it starts over)
BATCHES_KEPT = 16
LAYERS_KEPT = 4096  # the eager path's lookups kept (past these, it starts over)

_state = dict(autotune=os.environ.get("SPECGEN_AUTOTUNE", "") not in ("", "0"))
_lock = threading.Lock()


def autotune(enabled: bool = True) -> None:
    """Tune each new problem on its first call (``SPECGEN_AUTOTUNE=1`` does the same):
    the winner goes to specgen's results database, so later processes start from it."""
    _state["autotune"] = bool(enabled)


def autotuning() -> bool:
    return _state["autotune"]


# Kernels compiling in the background (``parallel.Compiling``, keyed by problem spec):
# under autotuning a model's candidates, which its problems' tunes wait for one problem
# at a time (``compiled_behind``) while the rest still compile.
_behind: list = []


def compile_behind(items: list, arch: str) -> None:
    """Compile ``items`` ((problem, variant[, grads32]) in the order the run will meet
    their problems) in the background, a process a core but the one this process
    keeps for its own work (the tunes' launches)."""
    from ..parallel import Compiling

    _behind.append(Compiling(items, arch, max(1, (os.cpu_count() or 1) - 1)))


# The longest a problem waits for its kernels in the background (a pool whose worker
# died never finishes its task); past it, what is missing compiles where it is needed.
BEHIND_WAIT_S = 600


def compiled_behind(p: ConvProblem) -> None:
    """Until the background compiles hold no kernel of ``p`` still compiling (at most
    BEHIND_WAIT_S)."""
    for c in list(_behind):
        if not c.wait(p.spec, BEHIND_WAIT_S):
            log.info(
                "specgen: %s's kernels still compiling after %d s; going on", p.spec, BEHIND_WAIT_S
            )
    _behind[:] = [c for c in _behind if not c.over]


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
    # gather and gather_cl as int32, for the operator's own gather kernel
    at: torch.Tensor | None = None
    at_cl: torch.Tensor | None = None
    # memos of the calls: batch -> (launcher, scratch bytes), and (weights' dtype,
    # strides) -> how pack_weights packs such weights
    runs: dict = field(default_factory=dict)
    packs: dict = field(default_factory=dict)
    constant: bool = False  # the plan reads its weights from __constant__ memory
    # wgrad's dw and db in fp32, dw in the weights' memory format ("mcrs" or "mrsc"),
    # where the plan was asked for that and its second pass renders it; else ""
    grads32: str = ""

    def __post_init__(self):
        self.constant = bool(self.conv.plan.const_bytes)

    def run(self, batch: int):
        """The launches bound at this batch and the scratch bytes they need."""
        r = self.runs.get(batch)
        if r is None:
            if len(self.runs) >= BATCHES_KEPT:  # a loader of ragged batches: start over
                self.runs.clear()
                self.conv.forget_launchers()
            r = self.runs[batch] = (self.conv.launcher(batch), self.conv.scratch_bytes(batch))
        return r


_kernels: dict[tuple, Kernel] = {}
_gpu_names: dict[int, str] = {}
_archs: dict[int, str] = {}


def layout_of(x: torch.Tensor) -> TensorLayout:
    """NHWC where the tensor is channels_last in memory, as PyTorch's convolution reads
    it: a tensor that is contiguous in both formats (one channel, or 1x1 images) is
    NHWC only where its strides are those that channels_last gives."""
    if not x.is_contiguous(memory_format=torch.channels_last):
        return TensorLayout.NCHW
    if not x.is_contiguous():
        return TensorLayout.NHWC
    return TensorLayout.NHWC if x.stride() == channels_last_strides(x.shape) else TensorLayout.NCHW


def channels_last_strides(size) -> tuple | None:
    """The strides of a channels_last tensor of 4-D ``size``, or None where that memory
    format is also the contiguous one (one channel, or a single pixel a channel)."""
    N, C, H, W = size
    last, first = (H * W * C, 1, W * C, C), (C * H * W, H * W, W, 1)
    return last if last != first else None


def computed_layout(
    op: Op, layout: TensorLayout, dtype: DType, w_size=None, groups=1, tf32=None, nchw=None
):
    """The layout a problem is computed in: the tensors' own, except fp32 wgrad of a
    channels-last layer (``w_size`` [M][C/g][R][S]) that neither ``wlane`` (few maps a
    group) nor, where tf32 is allowed, ``tcwgrad`` (channels and maps per group
    multiples of 4) takes in place: there x and dy are copied to NCHW where
    ``tc3wgrad`` takes the layer's NCHW problem ``nchw`` (the autoencoder's 256 -> 128
    layer at B=128: 0.29 ms with the copies' 0.02 against wgemm's 0.57 in NHWC, H200),
    else for maps too few for ``wgemm`` (for ``wtap`` or ``wband``); wgemm takes the rest
    in place."""
    if layout is TensorLayout.NHWC and op is Op.WGRAD and dtype is DType.FP32:
        if w_size is None:
            return TensorLayout.NCHW
        Mg, Cg, taps = w_size[0] // groups, w_size[1], w_size[2] * w_size[3]
        tf32 = allow_tf32() if tf32 is None else tf32
        if Mg * taps <= LANE_SUMS:
            return layout
        if tf32 and Cg % 4 == 0 and Mg % 4 == 0:
            return layout
        if nchw is not None and three_tf32_suits(nchw):
            return TensorLayout.NCHW
        return layout if Mg >= WGEMM_MIN_MAPS else TensorLayout.NCHW
    return layout


def dense(t: torch.Tensor, layout: TensorLayout) -> torch.Tensor:
    """``t`` dense in ``layout``'s memory format: itself where it is, through the
    operator's own transpose where it is dense in the other one, else PyTorch's copy."""
    fmt = torch.channels_last if layout is TensorLayout.NHWC else torch.contiguous_format
    if t.is_contiguous(memory_format=fmt):
        return t
    other = layout.other
    if (
        t.is_cuda
        and t.dim() == 4
        and t.dtype in DTYPES
        and t.is_contiguous(memory_format=FORMATS[other])
    ):
        return transposed(t, layout)
    return t.contiguous(memory_format=fmt)


GRID_Z = 65535  # images a transpose launch covers (blockIdx.z)
_transposes: dict[tuple, _Step] = {}  # (device, dtype, N, A, B) -> its bound launch


def transposed(t: torch.Tensor, layout: TensorLayout) -> torch.Tensor:
    """The 4-D tensor ``t``, dense in the other layout, copied into ``layout`` by one
    launch of the operator's transpose (``templates/torch/transpose.cu.j2``) on the
    current stream."""
    N, C, H, W = t.shape
    out = empty(tuple(t.shape), t, layout)
    if t.numel() == 0:
        return out
    A, B = (C, H * W) if layout is TensorLayout.NHWC else (H * W, C)
    index = t.device.index
    done = 0
    while done < N:  # batches past the grid's z limit in slices
        n = min(N - done, GRID_Z)
        key = (index, t.dtype, n, A, B)
        step = _transposes.get(key)
        if step is None:
            if len(_transposes) >= LAYERS_KEPT:
                _transposes.clear()
            func = _load(index, *transpose_source(DTYPES[t.dtype].value))
            grid = (-(-B // 32), -(-A // 32), n)
            binding = [(Role.X, 0), (Role.Y, 0), (None, A), (None, B)]
            step = _transposes[key] = _Step(func, grid, (32, 8, 1), 0, binding)
        at = done * A * B * t.element_size()
        launch_step(step, index, t.data_ptr() + at, out.data_ptr() + at)
        done += n
    return out


_sums: dict[tuple, _Step] = {}  # (device, dtype, values) -> its bound launch


def summed(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a + b in a new tensor, dense as a is: by one launch of the operator's sum
    (``templates/torch/sum.cu.j2``) where a and b are CUDA tensors of one size, dtype
    (fp32, bf16 or fp16) and dense strides, 16-byte aligned; else by PyTorch's add.
    Each value rounds as PyTorch's add rounds it, and a replay records the launch
    (``_replay``) where it would record the add as an op of its own."""
    out = torch.empty_like(a)
    if not (
        a.is_cuda
        and a.dtype is b.dtype
        and a.dtype in DTYPES
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.device == b.device
        and out.stride() == a.stride()  # a dense (``empty_like`` keeps a dense tensor's)
        and not (a.data_ptr() % ALIGNED or b.data_ptr() % ALIGNED)
    ):
        return torch.add(a, b, out=out)
    n, index = a.numel(), a.device.index
    if n == 0:
        return out
    key = (index, a.dtype, n)
    step = _sums.get(key)
    if step is None:
        if len(_sums) >= LAYERS_KEPT:
            _sums.clear()
        func = _load(index, *sum_source(DTYPES[a.dtype].value))
        runs = -(-n // (16 // a.element_size()))  # a thread a 16-byte run
        binding = [("t", 0), ("t", 0), ("t", 0), (None, n)]
        step = _sums[key] = _Step(func, (-(-runs // 256), 1, 1), (256, 1, 1), 0, binding)
    launch_step(step, index, a.data_ptr(), b.data_ptr(), out.data_ptr())
    return out


_step_lock = threading.Lock()


def launch_step(step: _Step, index: int, *addresses: int) -> None:
    """``step`` launched on device ``index``'s current stream at these addresses (in
    the order of its binding's roles)."""
    launch_steps(index, (step, addresses))


def launch_steps(index: int, *calls) -> None:
    """Each (step, addresses) of ``calls`` launched in order on device ``index``'s
    current stream, under one hold of the slots' lock."""
    stream, launch = raw_stream(index), _driver_launch()
    rec = recording()
    with _step_lock:  # the slots are shared
        for step, addresses in calls:
            for (i, _, _), at in zip(step.fill, addresses):
                step.slots[i] = at
            if rec is not None:
                rec.launched(step, [])
            on_device(index, launch, *step.head, stream, step.params_at, 0)


_strides: dict[tuple, tuple] = {}  # (size, layout) -> its strides in that memory format


def empty(size: tuple, like: torch.Tensor, layout: TensorLayout, dtype=None) -> torch.Tensor:
    """Every output the operator returns is allocated here (the tests poison it), in
    ``like``'s dtype (or ``dtype``) on its device: with the strides that ``torch.empty``
    gives the size in the layout's memory format, read off its first allocation, then
    by ``empty_strided``, which costs the host a third less a call (4.2 against 6.5 us,
    H200, ``docs/measurements/alloc-micro-2026-11-24-h200.log``)."""
    dtype = dtype or like.dtype
    strides = _strides.get((size, layout))
    if strides is None:
        fmt = torch.channels_last if layout is TensorLayout.NHWC else torch.contiguous_format
        t = torch.empty(size, dtype=dtype, device=like.device, memory_format=fmt)
        if len(_strides) >= LAYERS_KEPT:
            _strides.clear()
        _strides[(size, layout)] = t.stride()
        return t
    return torch.empty_strided(size, strides, dtype=dtype, device=like.device)


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


def computed(p: ConvProblem, index: int, tf32: bool) -> ConvProblem:
    """The problem as the operator computes it on device ``index``
    (``choose.computed_problem``): ``p``, or its twin in the other layout (an NCHW op
    that only in NHWC gets a tensor-core kernel), the tensors copied there and back
    around the launch; for a wgrad of a few channels, over more channels, zeros."""
    return computed_problem(p, gpu_name(index), tf32, arch_of(index))


def arch_of(index: int) -> str:
    """The device's architecture as specgen names it ("sm_90"), read once."""
    if index not in _archs:
        major, minor = torch.cuda.get_device_capability(index)
        _archs[index] = f"sm_{major}{minor}"
    return _archs[index]


def allow_tf32() -> bool:
    """As PyTorch's own convolution: tf32 math for fp32 tensors only where cuDNN may."""
    return bool(torch.backends.cudnn.allow_tf32)


class Layer:
    """One convolution's arguments on one device under one math: the problem of each
    op it runs (fprop, and dgrad, wgrad and bgrad for its gradients), their kernels
    chosen and compiled on first use, and what every call needs already worked out
    (the output's size and memory format, the device, the layout wgrad computes in),
    so that a call looks up nothing but its layer.  ``layer`` and ``layer_of`` find
    it; building one validates the arguments, so a call that finds one checks nothing."""

    def __init__(self, x_rest, layout, dtype, index, w_size, w_stride, args, tf32):
        self.stride, self.pads, self.dilation, self.groups = args
        self.x_rest, self.layout, self.dtype = tuple(x_rest), layout, dtype
        self.w_size, self.w_stride, self.index, self.tf32 = tuple(w_size), w_stride, index, tf32
        self.device = torch.device("cuda", index)
        self.fmt = FORMATS[layout]
        self.y_rest = tuple(out_size((1, *x_rest), w_size, *args[:3])[1:])
        # the layout wgrad computes in: the tensors' own but for fp32 few-map layers
        nchw = None  # the NCHW wgrad problem, where fp32 channels_last wgrad may copy there
        if layout is TensorLayout.NHWC and dtype is DType.FP32:
            nchw = problem(Op.WGRAD, (1, *x_rest), w_size, False, *args, dtype, TensorLayout.NCHW)
        self.wgrad_layout = computed_layout(Op.WGRAD, layout, dtype, w_size, args[3], tf32, nchw)
        self.kernels: dict = {}
        self.casts: dict = {}  # (ops, the weights' dtype) -> Cast, or None
        # the weights' memory format, which their gradient goes back in: dw in fp32 from
        # wgrad in that order ("mrsc" or "mcrs", ``weight_grads``) under autocast's cast,
        # and for fp32 channels_last weights, which autograd would otherwise copy dw into
        cl = w_stride is not None and tuple(w_stride) == channels_last_strides(w_size)
        self.w_format = torch.channels_last if cl else torch.contiguous_format
        self.dw_order = fp32_dw_order(cl, cast=True)
        self.fp32_dw = fp32_dw_order(cl, cast=False, fp32=dtype is DType.FP32)
        self.problem(Op.FPROP, False, 1)  # a problem no convolution has fails here, once

    def problem(self, op: Op, bias: bool, batch: int) -> ConvProblem:
        layout = self.wgrad_layout if op is Op.WGRAD else self.layout
        return problem(
            op,
            (batch, *self.x_rest),
            self.w_size,
            bias,
            self.stride,
            self.pads,
            self.dilation,
            self.groups,
            self.dtype,
            layout,
        )

    def kernel(self, op: Op, bias: bool, batch: int, grads32: str = "") -> Kernel:
        """The op's kernel, chosen for the batch of its first call (as ``kernel_for``;
        ``grads32`` for wgrad under the autocast cast).  Its problem's layout is the one
        the op computes in (``computed``): the tensors' own, or the other one with the
        tensors copied there and back."""
        k = self.kernels.get((op, bias, grads32))
        if k is None:
            p = computed(self.problem(op, bias, batch), self.index, self.tf32)
            k = self.kernels[(op, bias, grads32)] = kernel_for(p, self.device, self.tf32, grads32)
        return k

    def window(self, w: torch.Tensor, k: Kernel) -> torch.Tensor:
        """PyTorch's weights ``w`` ([M][C/g][R][S]), or dw of their size, as kernel ``k``
        of the layer reads or writes them: a view of the taps its cropped window keeps
        (``choose.cropped``), else ``w``."""
        origin = crop_origin(self.pads, self.dilation, self.w_size[2:], k.problem)
        if origin is None:
            return w
        (r, s), R, S = origin, k.problem.R, k.problem.S
        return w[:, :, r : r + R, s : s + S]

    def crop_offset(self, k: Kernel) -> int:
        """The elements from the weights' start to the first tap kernel ``k`` reads
        (``window``), in the weights' strides: 0 where its window is whole."""
        origin = crop_origin(self.pads, self.dilation, self.w_size[2:], k.problem)
        return 0 if origin is None else origin[0] * self.w_stride[2] + origin[1] * self.w_stride[3]

    def packing(self, ops: tuple, batch: int, source: torch.dtype) -> "Cast | None":
        """The layer's weights (of dtype ``source`` and its ``w_stride``) packed for the
        kernels of ``ops`` (one or two (op, bias) pairs) in one launch (``Cast``):
        rounded too where ``source`` is fp32 and the layer's dtype 16-bit (autocast's
        cast).  None where one launch of the same dtype serves them no better than
        ``pack_weights`` (``Cast.serves``).  Built once per ops and dtype."""
        key = (ops, source)
        c = self.casts.get(key, False)
        if c is False:
            kernels = [self.kernel(op, bias, batch) for op, bias in ops]
            serves = Cast.serves(kernels, source, self.w_format)
            c = self.casts[key] = (
                Cast(
                    kernels,
                    self.w_stride,
                    self.index,
                    source,
                    [self.crop_offset(k) for k in kernels],
                )
                if serves
                else None
            )
        return c


FORMATS = {TensorLayout.NCHW: torch.contiguous_format, TensorLayout.NHWC: torch.channels_last}

_layers: dict[tuple, Layer] = {}  # layer_of's arguments -> the layer
_eager: dict[tuple, tuple] = {}  # the eager path's key -> (layer, whether x is dense)


def fp32_dw_order(channels_last: bool, cast: bool, fp32: bool = True) -> str:
    """The order wgrad writes dw in, in fp32, for weights of that memory format: under
    autocast's cast always ("mrsc" for channels_last weights, "mcrs" for contiguous
    ones), outside it for fp32 channels_last weights only, which autograd would
    otherwise copy dw into; "" where dw comes in the tensors' dtype as PyTorch lays it."""
    if cast:
        return "mrsc" if channels_last else "mcrs"
    return "mrsc" if fp32 and channels_last else ""


def layer_of(x_size, layout, dtype, index, w_size, w_stride, stride, pads, dilation, groups):
    """The layer of these arguments (sizes, ``dtype`` a DType) under the math that
    ``allow_tf32`` allows now."""
    args = (tuple(stride), tuple(pads), tuple(dilation), groups)
    tf32 = allow_tf32()
    key = (tuple(x_size[1:]), layout, dtype, index, tuple(w_size), w_stride, args, tf32)
    found = _layers.get(key)
    if found is None:
        found = _layers[key] = Layer(x_size[1:], layout, dtype, index, w_size, w_stride, args, tf32)
    return found


def layer(x, weight, bias, stride, pads, dilation, groups, check=None, cast=False):
    """The layer of these tensors and arguments (tuples), and x made dense in its
    layout, keyed by what PyTorch reads off the tensors in well under a microsecond
    each (sizes, strides, dtypes, devices): a miss checks the tensors (``check(x,
    weight, bias, groups)`` first where given, then ``check_tensors``: one clear
    SpecError for what no kernel serves) and finds the layer; a hit checks nothing.
    ``cast``: autocast is on and fp32 weights are the layer's to cast (``Cast``)."""
    biased = None if bias is None else (bias.shape, bias.dtype, bias.get_device())
    args = (stride, pads, dilation, groups)
    return _eager_layer(biased, x, weight, bias, x.shape, args, check, cast)


def transposed_layer(x, weight, y_size, stride, pads, dilation, groups, cast=False):
    """The layer a transposed convolution of x runs as the dgrad of (its input x in
    the place of dy, ``y_size`` that of the layer's input), and x made dense in its
    layout: found, checked and kept as ``layer`` finds a convolution's."""
    args = (stride, pads, dilation, groups)
    return _eager_layer(("transposed", y_size), x, weight, None, y_size, args, None, cast)


def _eager_layer(extra, x, weight, bias, x_size, args, check, cast):
    """``layer``'s lookup, and ``transposed_layer``'s: keyed by the tensors' sizes,
    strides, dtypes and devices, ``extra`` (what else tells two calls apart: the bias,
    a transposed convolution's output size), the arguments, the math allowed and
    ``cast``; ``x_size`` the layer's input size."""
    key = (
        x.shape,
        x.stride(),
        x.dtype,
        x.get_device(),
        weight.shape,
        weight.stride(),
        weight.dtype,
        weight.get_device(),
        extra,
        args,
        torch.backends.cudnn.allow_tf32,
        cast,
    )
    found = _eager.get(key)
    if found is None:
        if check is not None:
            check(x, weight, bias, args[3])
        check_tensors(x, weight, bias, cast)
        lay = layout_of(x)
        dtype, index = DTYPES[x.dtype], x.get_device()
        found = layer_of(x_size, lay, dtype, index, weight.shape, weight.stride(), *args)
        if len(_eager) >= LAYERS_KEPT:  # a stream of new shapes: start over
            _eager.clear()
        found = _eager[key] = (found, x.is_contiguous(memory_format=FORMATS[lay]))
    lay, is_dense = found
    return lay, (x if is_dense else x.contiguous(memory_format=lay.fmt))


def check_tensors(x, weight=None, bias=None, cast=False) -> None:
    """One clear SpecError for tensors no kernel takes together: not on CUDA, on two
    devices, of two dtypes (but fp32 weights for 16-bit x where ``cast``: autocast's,
    cast by the operator), of a dtype specgen has no kernels for; a bias in fp32 or
    the tensors' dtype, on their device."""
    for t in (x, weight):
        if t is None:
            continue
        if not t.is_cuda:
            raise SpecError(f"specgen's convolution runs on CUDA tensors, got one on {t.device}")
        if t.device != x.device:
            raise SpecError(f"tensors on {x.device} and {t.device}: put them on one device")
        if t.dtype != x.dtype and not (cast and t is weight and t.dtype == torch.float32):
            raise SpecError(
                f"tensors of {x.dtype} and {t.dtype}: specgen's convolution takes one "
                "dtype for all (autocast casts them for you)"
            )
    dtype_of(x)
    if bias is not None:
        if bias.dtype != x.dtype and bias.dtype != torch.float32:
            raise SpecError(f"a bias of {bias.dtype} for tensors of {x.dtype}: give it in either")
        if bias.device != x.device:
            raise SpecError(
                f"tensors on {x.device} and a bias on {bias.device}: put them on one device"
            )


def out_size(x_size, w_size, stride, padding, dilation) -> list:
    N, _, H, W = x_size
    M, _, R, S = w_size
    Ho = (H + padding[0] + padding[1] - dilation[0] * (R - 1) - 1) // stride[0] + 1
    Wo = (W + padding[2] + padding[3] - dilation[1] * (S - 1) - 1) // stride[1] + 1
    return [N, M, Ho, Wo]


def kernel_for(
    p: ConvProblem, device: torch.device, tf32: bool | None = None, grads32: str = ""
) -> Kernel:
    """The problem's kernel on the device, chosen and compiled once per process.
    ``grads32`` ("mcrs" or "mrsc"; wgrad under autocast's cast): its plan with the
    second pass writing dw and db in fp32, dw in the weights' memory format, where that
    pass can (``Kernel.grads32`` says whether it does); else the kernel itself."""
    tf32 = allow_tf32() if tf32 is None else tf32
    key = (replace(p, batch=1), device.index, tf32, grads32)
    k = _kernels.get(key)
    if k is not None:
        return k
    with _lock:
        k = _kernels.get(key)
        if k is None:
            k = _kernels[key] = _build(p, device.index, tf32, grads32)
            if grads32 and not k.grads32:  # the same kernel as without: one of it
                k = _kernels[key] = _kernels.setdefault(key[:3] + ("",), k)
    return k


def _build(p: ConvProblem, index: int, tf32: bool, grads32: str = "") -> Kernel:
    import cupy

    if torch.cuda.is_current_stream_capturing():
        raise SpecError(
            f"specgen has no kernel yet for {p.spec} and cannot compile one while a CUDA "
            "graph is being captured: run the model once before capturing "
            "(or call specgen.torch.warmup)"
        )
    gpu = gpu_name(index)
    compiled_behind(p)  # its candidates, or its pick, where they compile in the background
    with cupy.cuda.Device(index):
        arch = device_arch()
        if autotuning() and choose(p, gpu, tf32, arch).source != "tuned":
            _tune(p, gpu, tf32, arch)
        choice = choose(p, gpu, tf32, arch)
        plan = make_plan(p, choice.variant)
        wide = with_fp32_grads(plan, grads32) if grads32 else None
        conv = Conv(p, choice.variant, plan=wide or plan)
        reads_w = p.op in (Op.FPROP, Op.DGRAD)
        gather = _gather(conv, index) if reads_w else None
    out = f", dw and db in fp32 ({grads32})" if wide else ""
    log.info("specgen: %s %s -> %s (%s)%s", p.op.value, p.spec, plan.name, choice.why, out)
    k = Kernel(p, choice, conv, gather, grads32=grads32 if wide else "")
    if gather is not None:
        at = torch.as_tensor(channels_last_offsets(p), device=f"cuda:{index}")
        k.gather_cl = at[gather]
        k.storage_order = bool(torch.equal(k.gather_cl.cpu(), torch.arange(len(gather))))
        stored = weight_dtype(conv.plan.weight_format)
        if len(gather) < 2**31 and stored in (p.dtype.value, "fp32"):
            # the gather compiled now, outside any graph capture: its weights' dtype is
            # the problem's (the ops check it), so this is the one it will run
            k.at, k.at_cl = k.gather.to(torch.int32), k.gather_cl.to(torch.int32)
            gather_kernel(index, p.dtype.value, stored)
    return k


def _tune(p: ConvProblem, gpu: str, tf32: bool, arch: str) -> None:
    """Tune every math the caller allows, once per problem across processes: the first
    process holds the lock while it tunes, the others wait and then read its winners.
    Only strategies whose math is as fast as the untuned pick's are searched, the pick
    among them (``tune.prune``): where it runs on the tensor cores, the CUDA cores'
    spaces are left out, and a 16-bit layer's fp32 math with them."""
    from ..tune import run_tune

    with tunedb.locked(p.spec):
        pick = choose(p, gpu, tf32, arch)
        if pick.source == "tuned":
            return  # another process tuned it while this one waited
        for precision, floor in tuned_maths(p, pick, tf32):
            try:
                run_tune(p, precision, AUTOTUNE_BUDGET, log.info, floor=floor, keep=(pick.variant,))
            except SpecError as e:
                log.info("specgen: no %s kernel tuned for %s (%s)", precision.value, p.spec, e)


def tuned_maths(p: ConvProblem, pick, tf32: bool) -> list[tuple[Precision, int]]:
    """(precision, floor) of each math autotuning searches for ``p`` given its untuned
    ``pick``: every math the caller allows, from the pick's speed class up
    (``search_floor``), but fp32 math for a 16-bit layer on its own tensor cores."""
    floor = search_floor(p, pick.variant)
    return [
        (precision, floor) for precision in maths(p, tf32) if searched_math(p, precision, floor)
    ]


def autotune_items(p: ConvProblem, gpu: str, tf32: bool, arch: str) -> list[tuple]:
    """(problem, variant) of every candidate autotuning ``p`` will compile (``_tune``'s,
    at its batch and budget), so that a model's are compiled at once ahead of its first
    step; none where ``p`` is tuned already or the planner refuses it."""
    from ..tune import tune_space

    try:
        pick = choose(p, gpu, tf32, arch)
    except SpecError:
        return []
    if pick.source == "tuned":
        return []
    items = []
    for precision, floor in tuned_maths(p, pick, tf32):
        try:
            space = tune_space(p, precision, AUTOTUNE_BUDGET, floor=floor, keep=(pick.variant,))
        except SpecError:
            continue
        items += [(p, v) for v in space]
    return items


def _stream_of(index: int) -> int:
    return torch.cuda.current_stream(index).cuda_stream


# The bare handle of device ``index``'s current PyTorch stream: PyTorch's own accessor
# where it has one (no Stream object a call), read once.
raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or _stream_of


# The packed weights' storage, by ``runtime.weight_dtype`` of the plan's format.
STORED = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def pack_weights(k: Kernel, w: torch.Tensor) -> torch.Tensor:
    """The plan's weight format from PyTorch's [M][C/g][R][S], on the device, in one
    gather: fp32 (16-bit values are exact in it) or the 16-bit dtype of the tensor-core
    kernels, flipped and transposed for dgrad's forward view, laid out as the kernel
    reads them.  The gather's indices are the
    host packers (``runtime.dgrad_weights``, ``runtime.pack_weights``) applied once to
    the weights' own indices, so the two paths cannot disagree.  How is decided once
    per dtype and strides of the weights (``_packing``)."""
    key = (w.dtype, w.stride())
    how = k.packs.get(key)
    if how is None:
        how = k.packs[key] = _packing(k, w)
    return how(w)


def _packing(k: Kernel, w: torch.Tensor):
    """How pack_weights packs weights of w's dtype and strides for k: a function of them."""
    dtype = STORED[weight_dtype(k.conv.plan.weight_format)]
    if k.gather is None:  # PyTorch's own layout: at most one copy, cast and all
        if w.dtype is dtype and w.is_contiguous():
            return _as_they_are
        # not .to(dtype, memory_format=...): it returns an expanded tensor (strides 0,
        # as autograd hands a sum's gradient) itself, and the kernel would read past it
        return lambda w: w.to(dtype).contiguous()
    if k.gather_cl is not None and w.is_contiguous(memory_format=torch.channels_last):
        # channels_last weights: their storage read as it lies, and for mrsc,
        # untransformed, that storage is the packed layout itself
        if k.storage_order:
            return _as_they_are if w.dtype is dtype else (lambda w: w.to(dtype))
        if k.at_cl is not None and (w.dtype is dtype or dtype is torch.float32):
            return Gather(k.at_cl, w.dtype, dtype)
        at = k.gather_cl
        return lambda w: w.as_strided((w.numel(),), (1,)).index_select(0, at).to(dtype)
    if k.at is not None and (w.dtype is dtype or dtype is torch.float32):
        if w.is_contiguous():
            return Gather(k.at, w.dtype, dtype)  # one launch for index_select's and the cast's
        # other strides (a cropped window's view of the whole weights, ``Layer.window``):
        # the gather at the packed order's places in them, from the view's first weight
        at = storage_offsets(k, w.stride())
        if at.size and at.max() < 2**31:
            return Gather(torch.as_tensor(at.astype("int32"), device=k.at.device), w.dtype, dtype)
    at = k.gather
    return lambda w: w.reshape(-1).index_select(0, at).to(dtype)


def _as_they_are(w: torch.Tensor) -> torch.Tensor:
    return w


_gathers: dict[tuple, int] = {}  # (device, source dtype, target dtype) -> the gather kernel


class Direct:
    """One launch of an operator's own kernel over ``n`` items in blocks of 256, its
    arguments bound once (``binding`` as ``runtime._Step``'s): a call writes the
    addresses of the binding's roles, in their order, straight into the argument slots
    and launches on the device's current stream."""

    def __init__(self, func: int, n: int, binding: list, index: int):
        self.step = _Step(func, (-(-n // 256), 1, 1), (256, 1, 1), 0, binding)
        self.index = index

    def __call__(self, *addresses: int) -> None:
        launch_step(self.step, self.index, *addresses)


class Gather:
    """Weights' storage read at ``at`` (int32 indices, on their device) into ``dtype``
    (their own, or fp32 from 16-bit weights) by specgen's own gather kernel
    (``templates/torch/gather.cu.j2``), on the current stream: the values of
    ``index_select`` and a cast, in one launch and one allocation, its arguments bound
    once."""

    def __init__(self, at: torch.Tensor, source: torch.dtype, dtype: torch.dtype):
        index = at.device.index
        func = gather_kernel(index, DTYPES[source].value, DTYPES[dtype].value)
        n = at.numel()
        binding = [(Role.W, 0), (None, at.data_ptr()), (Role.Y, 0), (None, n)]
        self.launch = Direct(func, n, binding, index)
        self.at, self.n, self.dtype, self.device = at, n, dtype, at.device

    def __call__(self, w: torch.Tensor) -> torch.Tensor:
        out = torch.empty(self.n, dtype=self.dtype, device=self.device)
        self.launch(w.data_ptr(), out.data_ptr())
        return out


_devices: list = []  # the process's CUDA device count, once read
# Whether this thread has a CUDA context current: the runtime makes the primary one
# current lazily, at a thread's first runtime call, and the driver's launch needs one.
# The autograd engine's device thread may reach a node's backward before it makes any
# (a backward that starts at specgen's output): that thread sets the device once.
_thread = threading.local()


def on_device(index: int, fn, *args) -> None:
    """``fn(*args)`` with device ``index`` current, as a driver launch needs its
    function's context (switched only where another device is current; with one
    device in the process, it always is, once this thread has a context)."""
    if not _devices:
        _devices.append(torch.cuda.device_count())
    if _devices[0] == 1:
        if not getattr(_thread, "context", False):
            _set_device(index)
        fn(*args)
        return
    import cupy

    if cupy.cuda.runtime.getDevice() == index:
        if not getattr(_thread, "context", False):
            _set_device(index)
        fn(*args)
    else:
        with cupy.cuda.Device(index):
            fn(*args)


def _set_device(index: int) -> None:
    """The device set on this thread through the runtime, which makes its primary
    context current (CUDA 12 and later), as a PyTorch op's first launch would."""
    import cupy

    cupy.cuda.runtime.setDevice(index)
    _thread.context = True


def gather_kernel(index: int, source: str, target: str) -> int:
    """The gather from dtype ``source`` to ``target`` on device ``index``, compiled and
    loaded on first use."""
    func = _gathers.get((index, source, target))
    if func is None:
        func = _gathers[(index, source, target)] = _load_gather(index, source, target)
    return func


def _load_gather(index: int, source: str, target: str) -> int:
    from ..runtime import gather_source

    return _load(index, *gather_source(source, target))


def _load(index: int, name: str, text: str) -> int:
    """The function ``name`` of CUDA source ``text``, compiled and loaded on device
    ``index`` once (its module kept for the process's life)."""
    return load_functions(index, name, text, (name,))[0]


_loaded: dict[tuple, int] = {}  # (device, function name) -> the function


def load_functions(index: int, name: str, text: str, names: tuple) -> tuple:
    """The functions ``names`` of CUDA source ``text`` (``name`` its first), compiled
    once and loaded on device ``index`` once."""
    found = tuple(_loaded.get((index, n)) for n in names)
    if None in found:
        found = _compile_and_load(index, name, text, names)
        _loaded.update({(index, n): f for n, f in zip(names, found)})
    return found


def _compile_and_load(index: int, name: str, text: str, names: tuple) -> tuple:
    """The functions ``names`` of ``text`` (``name`` its first)."""
    import cupy

    from ..compile import compile_source

    with cupy.cuda.Device(index):
        binary = compile_source(text, name, device_arch())
        module = cupy.cuda.function.Module()
        module.load(binary.cubin)
        _modules.append(module)  # the functions live as long as their module
        return tuple(module.get_function(n).ptr for n in names)


_modules: list = []


def _packed_ids(conv: Conv):
    """``runtime.packed_ids`` of conv's plan, where the operator serves its format."""
    plan = conv.plan
    if plan.weight_format not in ("f32", "ckkm", "mrsc.fp16", "mrsc.bf16", "mrsc.fp32"):
        raise SpecError(
            f"{plan.name} packs weights as {plan.weight_format}, which the PyTorch operator "
            "does not serve"
        )
    return packed_ids(plan, conv.shape)


def _gather(conv: Conv, index: int):
    """``_packed_ids`` on the device, or None where the packed layout is PyTorch's own."""
    ids = _packed_ids(conv)
    return None if ids is None else torch.as_tensor(ids, device=f"cuda:{index}")


def storage_offsets(k: Kernel, w_stride):
    """Where each weight of k's packed layout lies in the storage of weights of these
    strides (of PyTorch's [M][C/g][R][S]): a NumPy array."""
    import numpy as np

    # each logical weight's offset, summed from one small axis at a time, then read
    # at the packed order's ids (unravelling every id took resnet50 a second)
    offset = np.zeros((), dtype=np.int64)
    for n, stride in zip(w_shape(k.problem), w_stride):
        offset = np.add.outer(offset, np.arange(n, dtype=np.int64) * stride)
    ids = _packed_ids(k.conv)
    return offset.reshape(-1) if ids is None else offset.reshape(-1)[ids]


def _rounds(source: torch.dtype, k: Kernel) -> bool:
    """Whether weights of dtype ``source`` are rounded for kernel ``k``: fp32 weights of
    a 16-bit layer, autocast's."""
    return source is torch.float32 and k.problem.dtype is not DType.FP32


class Cast:
    """The weights packed for one or two kernels of a layer (the forward kernel and
    dgrad's, in either order) by one launch on the current stream, where they took one a
    kernel: under autocast, the model's fp32 weights rounded to the layer's 16-bit dtype
    by the operator's cast (``templates/torch/cast.cu.j2``), which does the work of
    autocast's cast, a re-layout for the kernels that read fp32 weights and dgrad's
    gather in the backward; else weights of the layer's dtype by the gather
    (``templates/torch/gather.cu.j2``) over both packings at once.  Built once per
    layer, ops and weights' dtype; ``Layer.packing`` finds it."""

    def __init__(
        self,
        kernels: list,
        w_stride,
        index: int,
        source: torch.dtype = torch.float32,
        origins: list | None = None,
    ):
        """``origins``: for each kernel, the elements from the weights' start to the
        first it reads (a cropped window's first kept tap, ``Layer.crop_offset``)."""
        import numpy as np

        if torch.cuda.is_current_stream_capturing():
            raise SpecError(
                "specgen cannot set up its weight packing while a CUDA graph is being "
                "captured: run the model once before capturing (or call specgen.torch.warmup)"
            )
        origins = origins or [0] * len(kernels)
        at = [storage_offsets(k, w_stride) + o for k, o in zip(kernels, origins)]
        stored = [weight_dtype(k.conv.plan.weight_format) for k in kernels]
        dtype = kernels[0].problem.dtype.value
        self.cast = _rounds(source, kernels[0])
        for k, kind in zip(kernels, stored):
            if kind not in ("fp32", dtype):
                raise SpecError(f"{k.conv.plan.name} reads {kind} weights from {dtype} tensors")
        self.sizes = [len(a) for a in at]
        self.dtypes = [STORED[kind] for kind in stored]
        # both packings in one allocation, the second from the first 16-byte boundary
        # past the first's; each packing's bytes (a __constant__ upload's count)
        nbytes = [n * d.itemsize for n, d in zip(self.sizes, self.dtypes)]
        self.first_bytes, self.second_bytes = nbytes[0], nbytes[-1]
        self.second = -(-nbytes[0] // ALIGNED) * ALIGNED if len(at) == 2 else 0
        self.nbytes = self.second + nbytes[-1]
        if not self.cast:  # one gather: the gap between the packings reads weight 0
            gap = self.second // self.dtypes[0].itemsize - self.sizes[0] if len(at) == 2 else 0
            at = [at[0], np.zeros(gap, dtype=np.int64), *at[1:]]
        offsets = np.concatenate(at)
        if offsets.max(initial=0) >= 2**31:
            raise SpecError(
                "weights past 2**31 elements are more than the operator's packing indexes"
            )
        self.at = torch.as_tensor(offsets.astype(np.int32), device=f"cuda:{index}")
        n = len(offsets)
        if self.cast:
            from ..runtime import cast_source

            func = _load(index, *cast_source(dtype, stored[0], stored[-1]))
            binding = [(Role.W, 0), (None, self.at.data_ptr()), (Role.Y, 0), (Role.DX, 0)]
            binding += [(None, self.sizes[0]), (None, n)]
        else:
            func = gather_kernel(index, DTYPES[source].value, stored[0])
            binding = [(Role.W, 0), (None, self.at.data_ptr()), (Role.Y, 0), (None, n)]
        self.launch = Direct(func, n, binding, index)
        self.device = self.at.device

    @staticmethod
    def serves(kernels: list, source: torch.dtype, w_format) -> bool:
        """Whether one launch serves these kernels better than ``pack_weights`` for each:
        always where it rounds fp32 weights to the layer's 16-bit dtype (autocast's
        cast); else, for weights of dtype ``source`` (in memory format ``w_format``), where
        both of two kernels pack them (neither reads them as they lie) into one stored
        dtype the gather writes from ``source`` (the same, or fp32)."""
        if _rounds(source, kernels[0]):
            return True
        if len(kernels) != 2:
            return False
        stored = {weight_dtype(k.conv.plan.weight_format) for k in kernels}
        if len(stored) != 1 or stored.pop() not in (DTYPES[source].value, "fp32"):
            return False
        cl = w_format is torch.channels_last
        return all(k.gather is not None and not (cl and k.storage_order) for k in kernels)

    def __call__(self, w: torch.Tensor) -> tuple[torch.Tensor, tuple, tuple]:
        """The packed weights in one new allocation (held for as long as a kernel is to
        read them), and the first kernel's packing and the second's as (address, bytes)
        for ``launch`` (the second the first's where there is one kernel)."""
        packed = torch.empty(self.nbytes, dtype=torch.uint8, device=self.device)
        a = packed.data_ptr()
        if self.cast:
            self.launch(w.data_ptr(), a, a + self.second)
        else:
            self.launch(w.data_ptr(), a)
        return packed, (a, self.first_bytes), (a + self.second, self.second_bytes)


# Bytes: the widest access a kernel makes (16-byte cp.async copies, uint4 stores).
ALIGNED = 16
READ = (Role.X, Role.DY)  # the inputs a caller hands in; outputs are allocated here


def _aligned(t: torch.Tensor, keep: list) -> torch.Tensor:
    """t, or a copy of it where its data starts off a 16-byte boundary (a view at an
    offset into a larger tensor): the kernels' vector copies read whole aligned units.
    The copy keeps t's strides, so a dense tensor stays dense in its format."""
    if t.data_ptr() % ALIGNED:
        t = t.clone()
        keep.append(t)
    return t


def launch(k: Kernel, tensors: dict, batch: int, device, w=None, bias=None) -> None:
    """Enqueue the kernel over ``tensors`` (Role -> dense tensor of the problem's layout)
    on the current stream of ``device`` (a torch.device); ``w`` and ``bias`` for the
    ops that read them, ``w`` PyTorch's weights or, packed already (by ``Cast``, 16-byte
    aligned), their (address, bytes)."""
    if batch == 0:
        return
    index = device.index
    stream = raw_stream(index)
    keep = []  # what must outlive the enqueue: PyTorch frees it in stream order
    ptrs = {}
    for role, t in tensors.items():
        at = t.data_ptr()
        if at % ALIGNED and role in READ:  # outputs are ours, and aligned
            at = _aligned(t, keep).data_ptr()
        ptrs[role] = at
    if w is not None:
        if isinstance(w, tuple):
            at, nbytes = w
        else:
            packed = _aligned(pack_weights(k, w), keep)
            keep.append(packed)
            at, nbytes = packed.data_ptr(), packed.numel() * packed.element_size()
        if k.constant:  # the plan reads them from __constant__: copied there first
            rec = recording()
            if rec is not None:  # a copy, no launch: not replayed
                rec.failed = "weights uploaded to __constant__"
            k.conv.upload_weights(at, nbytes, stream)
            at = 0
        ptrs[Role.W] = at
    if bias is not None:
        if bias.dtype is not torch.float32 or not bias.is_contiguous():
            bias = bias.to(torch.float32).contiguous()
            keep.append(bias)
        ptrs[Role.BIAS] = _aligned(bias, keep).data_ptr()
    launcher, need = k.run(batch)
    if need:
        ptrs[Role.WORKSPACE] = workspace(need, device, stream, keep)
    on_device(index, launcher, ptrs, stream)


# The scratch of the kernels that need some (split-K partial sums), one a stream of a
# device, kept from call to call as cuBLAS keeps its workspace: the launches of one
# stream run in order, so they can share it, and a call allocates nothing.  It grows to
# the largest need seen (the one it replaces is freed in that stream's order).  Under
# CUDA graph capture a call gets scratch of its own from the graph's pool instead, so
# that no graph holds the eager path's.
_workspaces: dict[tuple, torch.Tensor] = {}


def workspace(need: int, device: torch.device, stream: int, keep: list) -> int:
    """The address of ``need`` bytes of scratch for a launch on ``stream`` of ``device``
    (``keep`` holds what must outlive the enqueue)."""
    if torch.cuda.is_current_stream_capturing():
        found = torch.empty(need, dtype=torch.uint8, device=device)
    else:
        found = _workspaces.get((device.index, stream))
        if found is None or found.numel() < need:
            found = torch.empty(need, dtype=torch.uint8, device=device)
            _workspaces[(device.index, stream)] = found
    keep.append(found)  # held to the enqueue, even where another thread replaces it
    rec = recording()
    if rec is not None:
        rec.scratch(found, need, device)
    return found.data_ptr()


# The operator's four ops on a layer's dense tensors (``Layer``): each allocates its
# outputs (through ``empty``) and launches its kernel; the eager Function and the
# registered ops both call these, so the two paths run the same kernels.


def forward(lay: Layer, x, w, bias):
    """y of the convolution (x dense in the layer's layout; ``w`` as ``launch``)."""
    N = x.shape[0]
    k = lay.kernel(Op.FPROP, bias is not None, N)
    w = w if isinstance(w, tuple) else lay.window(w, k)
    computed = k.problem.layout
    if computed is lay.layout:  # the common case: x is dense in it already
        y = empty((N, *lay.y_rest), x, computed)
        launch(k, {Role.X: x, Role.Y: y}, N, lay.device, w=w, bias=bias)
        return y
    x = dense(x, computed)
    y = empty((N, *lay.y_rest), x, computed)
    launch(k, {Role.X: x, Role.Y: y}, N, lay.device, w=w, bias=bias)
    return dense(y, lay.layout)


def input_grad(lay: Layer, dy, w):
    """dx: the adjoint of the convolution applied to dy (dgrad; dy dense; ``w`` as
    ``launch``)."""
    N = dy.shape[0]
    k = lay.kernel(Op.DGRAD, False, N)
    w = w if isinstance(w, tuple) else lay.window(w, k)
    computed = k.problem.layout
    if computed is not lay.layout:
        dy = dense(dy, computed)
    dx = empty((N, *lay.x_rest), dy, computed)
    launch(k, {Role.DY: dy, Role.DX: dx}, N, lay.device, w=w)
    return dx if computed is lay.layout else dense(dx, lay.layout)


def shared_dy(lay: Layer, dy, bias: bool, grads32: str = ""):
    """dy for a backward that runs both dgrad and wgrad (``bias``: db fused into wgrad;
    ``grads32`` as ``weight_grads``): dense in the layout both kernels compute in, else
    in the layer's; moved at most once for the two, instead of once in each."""
    N = dy.shape[0]
    dgrad = lay.kernel(Op.DGRAD, False, N).problem.layout
    wgrad = lay.kernel(Op.WGRAD, bias, N, grads32).problem.layout
    return dense(dy, dgrad if dgrad is wgrad else lay.layout)


def weight_grads(lay: Layer, x, dy, bias: bool, grads32: str = ""):
    """dw, and db with it where ``bias`` (wgrad, db fused), in the layout the layer
    computes them in (x and dy copied there where it is not theirs).  ``grads32``
    ("mcrs" or "mrsc": fp32 weights' memory format, under autocast's cast or for fp32
    tensors): both in fp32, dw in that format, where the kernel writes them so
    (``Kernel.grads32``); else in the tensors' dtype and PyTorch's [M][C/g][R][S],
    and the caller (or autograd) makes them what the weights need."""
    N = x.shape[0]
    k = lay.kernel(Op.WGRAD, bias, N, grads32)
    C, layout = x.shape[1], k.problem.layout
    x = dense(x, layout) if k.problem.C == C else widened(x, k.problem.C, layout)
    dy = dense(dy, layout)
    w_size = (lay.w_size[0], k.problem.Cg, k.problem.R, k.problem.S)  # [M][C/g][R][S] computed
    lay32 = TensorLayout.NHWC if k.grads32 == "mrsc" else TensorLayout.NCHW
    dw = empty(w_size, x, lay32, torch.float32 if k.grads32 else None)
    out = {Role.X: x, Role.DY: dy, Role.DW: dw}
    if bias:
        db_size = (lay.w_size[0],)
        out[Role.DB] = empty(db_size, x, TensorLayout.NCHW, torch.float32 if k.grads32 else None)
    if N == 0:  # an empty sum
        dw.zero_()
        out.get(Role.DB, dw).zero_()
    launch(k, out, N, lay.device)
    if k.problem.Cg != lay.w_size[1]:  # the padded channels' sums dropped
        dw = dense(dw[:, : lay.w_size[1]], lay32)
    if (k.problem.R, k.problem.S) != lay.w_size[2:]:  # the taps past its window: zero
        kept = dw
        dw = empty(lay.w_size, x, lay32, kept.dtype).zero_()
        lay.window(dw, k).copy_(kept)
    return (dw, out[Role.DB]) if bias else dw


def widened(t: torch.Tensor, channels: int, layout: TensorLayout) -> torch.Tensor:
    """``t`` with zero channels after its own up to ``channels``, dense in ``layout``:
    what a wgrad over padded channels reads (``choose.computed_problem``)."""
    N, C, H, W = t.shape
    out = empty((N, channels, H, W), t, layout)
    out[:, C:].zero_()
    out[:, :C].copy_(t)
    return out


def bias_grad(lay: Layer, dy):
    """db: dy summed over the batch and the output pixels (bgrad; dy dense)."""
    N = dy.shape[0]
    k = lay.kernel(Op.BGRAD, True, N)
    db = empty((lay.w_size[0],), dy, TensorLayout.NCHW)
    if N == 0:  # an empty sum
        db.zero_()
    launch(k, {Role.DY: dy, Role.DB: db}, N, lay.device)
    return db
