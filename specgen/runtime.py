"""Load a compiled variant on the GPU and launch it: the Python side of each strategy
(weight upload, batch chunks past the grid limit, im2col segments, launch order)."""

from __future__ import annotations

import ctypes
import hashlib
import threading

import numpy as np

from .compile import Binary, compile_source
from .errors import SpecError
from .plan import Plan, make_plan
from .render import render
from .shapes import ConvProblem, Op
from .tensors import BATCHED, INPUTS, STORAGE, Role, outputs, role_shape, w_shape
from .tma import BoundMap
from .variants import Variant

DEFAULT_WORKSPACE = 256 * 2**20  # bytes of im2col scratch, unless the caller says otherwise


def gpu_available() -> bool:
    return gpu_count() > 0


def gpu_count() -> int:
    """The GPUs this process sees; 0 without a driver, a device or CuPy."""
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount()
    except Exception:  # no driver, no device, or no CuPy: all mean "no GPU here"
        return 0


def device_arch() -> str:
    import cupy

    return "sm_" + cupy.cuda.Device().compute_capability


def pack_weights(w: np.ndarray, fmt: str) -> np.ndarray:
    """The host-side layout each plan asks for: plain fp32, fp32 transposed to
    [C][K][K][M] (a tap's maps adjacent, for 16-byte copies), [M][R][S][C/g] in a
    16-bit dtype or fp32 (``mrsc.bf16``, ``mrsc.fp32``: a tap's channels adjacent, as
    tensor cores read them),
    or each weight as the half2 pair (w, w) in one 32-bit word for half2 arithmetic.  Integer arrays pass
    through f32 and ckkm unchanged: packing the weights' own indices gives the gather
    that the PyTorch operator packs with on the device."""
    w = np.asarray(w)
    if w.dtype.kind == "f" or fmt == "h2dup":
        w = w.astype(np.float32)
    if fmt == "ckkm":
        return np.ascontiguousarray(w.transpose(1, 2, 3, 0)).reshape(-1)
    if fmt.startswith("mrsc."):
        w = np.ascontiguousarray(w.transpose(0, 2, 3, 1)).reshape(-1)
        if w.dtype.kind != "f" or fmt == "mrsc.fp32":
            return w
        return to_bits16(w, fmt.split(".")[1])
    w = np.ascontiguousarray(w).reshape(-1)
    if fmt == "f32":
        return w
    bits = w.astype(np.float16).view(np.uint16).astype(np.uint32)
    return bits | (bits << 16)


def to_bits16(w: np.ndarray, dtype: str) -> np.ndarray:
    """fp32 values as the 16-bit words of ``dtype`` (fp16 or bf16), rounded to nearest
    even: NumPy has no bfloat16, so its bits are rounded from fp32's by hand."""
    if dtype == "fp16":
        return w.astype(np.float16).view(np.uint16)
    bits = w.astype(np.float32).view(np.uint32).astype(np.uint64)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def weight_dtype(fmt: str) -> str:
    """The storage dtype of a packed weight format: fp32, or the dtype named after the
    dot (``mrsc.bf16``, ``mrsc.fp32``)."""
    return fmt.split(".")[1] if "." in fmt else "fp32"


class Conv:
    """One variant, compiled for the GPU present and ready to launch."""

    def __init__(
        self,
        shape: ConvProblem,
        variant: Variant,
        *,
        plan: Plan | None = None,
        binary: Binary | None = None,
        workspace: int = DEFAULT_WORKSPACE,
        max_blocks: int | None = None,
    ):
        """``max_blocks`` caps a persistent grid below what the device holds, so that
        verification can make every block walk several work items."""
        import cupy

        self.shape = shape
        self.plan = plan or make_plan(shape, variant)
        self.binary = binary or compile_source(
            render(self.plan), self.plan.name, self.plan.target(device_arch())
        )
        self.module = cupy.cuda.function.Module()
        self.module.load(self.binary.cubin)
        self.functions = {}
        for launch in self.plan.launches:
            f = self.module.get_function(launch.kernel)
            if launch.dynamic_smem:
                # Over 48 KiB of dynamic shared memory needs the per-function opt-in.
                from cupy.cuda import driver as drv

                attr = getattr(drv, "CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES", 8)
                drv.funcSetAttribute(f.ptr, attr, launch.dynamic_smem)
            self.functions[launch.kernel] = f
        self.resident = {
            l.kernel: min(self._resident(l), max_blocks or 2**31)
            for l in self.plan.launches
            if l.persistent
        }
        self.workspace = workspace
        self.scratch = None  # the plan's fixed workspace, allocated on the first run
        self.w = None
        self.bias = None
        self._image_bytes = {}
        self._launchers = {}  # batch -> Launcher

    def _resident(self, launch) -> int:
        """Blocks of a persistent kernel the whole device holds at once."""
        import cupy
        from cupy.cuda import driver as drv

        f = self.functions[launch.kernel]
        per_sm = drv.occupancyMaxActiveBlocksPerMultiprocessor(
            f.ptr, launch.threads, launch.dynamic_smem
        )
        if per_sm < 1:
            raise SpecError(f"{launch.kernel} cannot be resident on this device (occupancy 0)")
        sms = cupy.cuda.Device().attributes["MultiProcessorCount"]
        return per_sm * sms

    def set_weights(self, w=None, bias=None) -> None:
        """Weights (and the bias, when the problem's op reads one) as float values of
        any float dtype; they are packed to the plan's format, fp32 at heart (exact for
        16-bit values).  wgrad and bgrad read neither."""
        import cupy

        s = self.shape
        if s.op in (Op.WGRAD, Op.BGRAD):
            if w is not None or bias is not None:
                raise SpecError(f"op={s.op.value} reads no weights or bias; pass none")
            return
        if w is None or tuple(w.shape) != w_shape(s):
            got = None if w is None else tuple(w.shape)
            raise SpecError(f"weights of shape {got}, expected {w_shape(s)}")
        if (bias is not None) != s.bias:
            raise SpecError(f"the problem {'has' if s.bias else 'has no'} bias; pass it or not")
        if bias is not None:
            if tuple(bias.shape) != (s.M,):
                raise SpecError(f"bias of shape {tuple(bias.shape)}, expected ({s.M},)")
            self.bias = cupy.asarray(cupy.asnumpy(bias).astype(np.float32))
        host = cupy.asnumpy(w)
        if self.plan.weight_transform == "dgrad":
            host = dgrad_weights(host, s.groups)
        host = pack_weights(host, self.plan.weight_format)
        if self.plan.const_bytes:
            cupy.cuda.runtime.memcpy(
                self.const_address(),
                host.ctypes.data,
                host.nbytes,
                cupy.cuda.runtime.memcpyHostToDevice,
            )
            self.w = None
        else:
            self.w = cupy.asarray(host)

    def const_address(self) -> int:
        """Device address of the ``__constant__`` weights of a plan that keeps them there."""
        ptr = self.module.get_global_var("wc")
        return int(ptr.ptr if hasattr(ptr, "ptr") else ptr)  # a bare address in some CuPys

    def upload_weights(self, ptr: int, nbytes: int, stream_ptr: int) -> int | None:
        """Weights already packed in device memory (``ptr``): for a plan that reads them
        from ``__constant__`` memory, copy them there on the stream and return None;
        else return ``ptr`` for the launch to read them from."""
        import cupy

        if not self.plan.const_bytes:
            return ptr
        if nbytes != self.plan.const_bytes:
            raise SpecError(f"{nbytes} B of packed weights, expected {self.plan.const_bytes}")
        rt = cupy.cuda.runtime
        rt.memcpyAsync(self.const_address(), ptr, nbytes, rt.memcpyDeviceToDevice, stream_ptr)
        return None

    def __call__(self, *inputs, out=None):
        """The op's inputs in the order of ``tensors.INPUTS`` (x for fprop, dy for
        dgrad and bgrad, x and dy for wgrad); its output, or the tuple of them (wgrad
        with a bias: dw and db), written into ``out`` when given."""
        roles = INPUTS[self.shape.op]
        if len(inputs) != len(roles):
            raise SpecError(
                f"op={self.shape.op.value} takes {', '.join(r.value for r in roles)}; "
                f"got {len(inputs)} tensor(s)"
            )
        outs = outputs(self.shape)
        given = None
        if out is not None:
            given = dict(zip(outs, out if isinstance(out, (tuple, list)) else (out,)))
        result = self.run(dict(zip(roles, inputs)), given)
        return result[outs[0]] if len(outs) == 1 else tuple(result[r] for r in outs)

    def run(self, inputs: dict, out: dict | None = None) -> dict:
        """Role -> CuPy array in, Role -> array out (allocated unless given), on CuPy's
        current stream."""
        import cupy

        s = self.shape
        dtype = np.dtype(STORAGE[s.dtype])
        batch = next(iter(inputs.values())).shape[0]
        for role, t in inputs.items():
            want = role_shape(role, s, batch)
            if tuple(t.shape) != want or t.dtype != dtype:
                raise SpecError(
                    f"{role.value} of shape {tuple(t.shape)} {t.dtype}, expected {want} {dtype} "
                    f"({s.dtype.value}, {s.layout.value})"
                )
        out = dict(out or {})
        wide = self.plan.context.get("grads32")  # dw and db in fp32 (``with_fp32_grads``)
        for role in outputs(s):
            if role not in out:
                kind = np.float32 if wide and role in (Role.DW, Role.DB) else dtype
                out[role] = cupy.empty(role_shape(role, s, batch), dtype=kind)
        ptrs = {r: t.data.ptr for r, t in {**inputs, **out}.items()}
        need = self.scratch_bytes(batch)
        if need and (self.scratch is None or self.scratch.nbytes < need):
            self.scratch = cupy.empty(need, dtype=np.uint8)
        self.enqueue(ptrs, batch, self.scratch.data.ptr if need else 0)
        return out

    def scratch_bytes(self, batch: int) -> int:
        """Device scratch one call at this batch needs: the plan's fixed workspace and
        its share of each image of the batch, or im2col's unrolled segment."""
        if self.plan.workspace_per_image:
            return self._segment(batch) * self.plan.workspace_per_image
        return self.plan.workspace_bytes + batch * self.plan.batch_workspace

    def _segment(self, batch: int) -> int:
        per_image = self.plan.workspace_per_image
        return min(
            batch, max(1, self.workspace // per_image), *(l.max_batch for l in self.plan.launches)
        )

    def enqueue(self, ptrs: dict, batch: int, scratch: int = 0, stream=None) -> None:
        """Launch the plan on ``stream`` (a CuPy stream, a bare stream handle, or None
        for CuPy's current one) over device addresses: Role -> the first byte of each
        input and output tensor, and of the weights and bias where the caller packed
        them itself (else those that ``set_weights`` uploaded).  ``scratch``:
        ``scratch_bytes(batch)`` of device memory.  Nothing here allocates or waits, so
        it can be captured in a graph."""
        bufs = dict(ptrs)
        if Role.W not in bufs and self.w is not None:
            bufs[Role.W] = self.w.data.ptr
        if Role.BIAS not in bufs and self.bias is not None:
            bufs[Role.BIAS] = self.bias.data.ptr
        if self.scratch_bytes(batch):
            if not scratch:
                raise SpecError(f"{self.plan.name} needs {self.scratch_bytes(batch)} B of scratch")
            bufs[Role.WORKSPACE] = scratch
        self.launcher(batch)(bufs, stream_handle(stream))

    def launcher(self, batch: int) -> "Launcher":
        """The plan's launches at this batch, bound once: grids, argument slots and
        the batch chunks and im2col segments, so a call fills addresses and launches."""
        bound = self._launchers.get(batch)
        if bound is None:
            bound = self._launchers[batch] = Launcher(
                [
                    self._step(launch, first, images)
                    for seg_first, seg_images in self._segments(batch)
                    for launch in self.plan.launches
                    for first, images in _chunks(seg_first, seg_images, launch.max_batch)
                ]
            )
        return bound

    def forget_launchers(self) -> None:
        """Drop the launches bound so far (a caller that meets many batch sizes)."""
        self._launchers.clear()

    def _segments(self, batch: int):
        """(first image, images): im2col unrolls and multiplies a segment at a time;
        every other plan takes the batch whole."""
        seg = self._segment(batch) if self.plan.workspace_per_image else batch
        return [(b0, min(batch, b0 + seg) - b0) for b0 in range(0, batch, seg)]

    def image_bytes(self, role: Role) -> int:
        """Bytes of one image of a batched tensor."""
        if role not in self._image_bytes:
            count = int(np.prod(role_shape(role, self.shape, 1)))
            self._image_bytes[role] = count * self.shape.dtype.bytes
        return self._image_bytes[role]

    def _step(self, launch, first: int, images: int) -> "_Step":
        """One driver launch of ``launch`` over images [first, first + images)."""
        grid = launch.grid_for(images, self.resident.get(launch.kernel))
        binding = []
        for r in launch.args:
            if r is Role.BATCH:
                binding.append((None, images))  # the image count, a literal
            else:
                binding.append((r, first * self.image_bytes(r) if r in BATCHED else 0))
        for m in launch.maps:  # a tensor map, encoded for each address the role is at
            offset = first * self.image_bytes(m.role) if m.role in BATCHED else 0
            binding.append((m.role, BoundMap(m, images), offset))
        f = self.functions[launch.kernel]
        return _Step(f.ptr, grid, launch.block, launch.dynamic_smem, binding)


def _chunks(first: int, images: int, step: int):
    """[first, first + images) cut into launches of at most ``step`` images."""
    return [(b0, min(step, first + images - b0)) for b0 in range(first, first + images, step)]


def stream_handle(stream) -> int:
    """A stream's bare handle: from a CuPy stream, an int, or CuPy's current stream."""
    if isinstance(stream, int):
        return stream
    if stream is None:
        import cupy

        stream = cupy.cuda.get_current_stream()
    return stream.ptr


class _Step:
    """One kernel launch through the driver, its arguments bound: each parameter is an
    8-byte slot (a device address, or the image count in the low four bytes, which is
    what an ``int`` parameter reads) and ``params`` the array of the slots' addresses
    that ``cuLaunchKernel`` copies from; a tensor map's entry there points at its
    128-byte encoding for the address its tensor is at (binding ``(role, BoundMap,
    byte offset)``)."""

    def __init__(self, func: int, grid, block, smem: int, binding):
        self.func, self.grid, self.block, self.smem = func, grid, block, smem
        self.head = (func, *grid, *block, smem)  # cuLaunchKernel's arguments before the stream
        self.slots = (ctypes.c_uint64 * len(binding))()
        base = ctypes.addressof(self.slots)
        self.params = (ctypes.c_void_p * len(binding))(*(base + 8 * i for i in range(len(binding))))
        self.params_at = ctypes.addressof(self.params)
        self.fill = []  # (slot, role, byte offset) filled at each call
        self.maps = []  # (parameter, role, tma.BoundMap, byte offset): pointed at per call
        for i, (role, value, *offset) in enumerate(binding):
            if offset:
                self.maps.append((i, role, value, offset[0]))
            elif role is None:
                self.slots[i] = value
            else:
                self.fill.append((i, role, value))


# The C type a stored dtype's values travel in, and its name in PTX's cvt.
WORDS = {"fp32": "float", "bf16": "unsigned short", "fp16": "unsigned short"}
PTX = {"bf16": "bf16", "fp16": "f16"}


def gather_source(source: str, target: str) -> tuple[str, str]:
    """The gather kernel's name and CUDA source from dtype ``source`` to ``target``."""
    from .render import render_template

    name = f"gather_{source}_{target}"
    text = render_template(
        "torch/gather.cu.j2",
        name=name,
        source=source,
        target=target,
        word_in=WORDS[source],
        word_out=WORDS[target],
    )
    return name, text


def transpose_source(dtype: str) -> tuple[str, str]:
    """The operator's layout transpose for tensors of ``dtype``: its name and source."""
    from .render import render_template

    name = f"transpose_{dtype}"
    return name, render_template("torch/transpose.cu.j2", name=name, word=WORDS[dtype])


def sum_source(dtype: str) -> tuple[str, str]:
    """The operator's sum of two tensors of ``dtype`` (``templates/torch/sum.cu.j2``):
    its name and source."""
    from .render import render_template

    name = f"sum_{dtype}"
    text = render_template(
        "torch/sum.cu.j2",
        name=name,
        dtype=dtype,
        word=WORDS[dtype],
        per=16 // (4 if dtype == "fp32" else 2),
        ptx=PTX.get(dtype),
    )
    return name, text


_launch_kernel: list = []  # the driver's cuLaunchKernel through CuPy, once imported
# The recorder of this thread's launches, where a node's call is being recorded to be
# replayed (``specgen.torch._replay``): ``RECORDING.rec``, else absent or None.
RECORDING = threading.local()


def recording():
    """This thread's recorder (``RECORDING.rec``), or None where no call is recorded."""
    return getattr(RECORDING, "rec", None)


def _driver_launch():
    """CuPy's cuLaunchKernel: (function, grid x y z, block x y z, shared bytes, stream,
    address of the parameters' addresses, extra)."""
    if not _launch_kernel:
        from cupy.cuda import driver as drv

        _launch_kernel.append(drv.launchKernel)
    return _launch_kernel[0]


def cast_source(dtype: str, a: str, b: str) -> tuple[str, str]:
    """The autocast weight cast's name and CUDA source: fp32 weights rounded to ``dtype``
    (bf16 or fp16), its two packed outputs stored as ``a`` and ``b`` (``dtype`` itself,
    or fp32 holding the rounded value)."""
    from .render import render_template

    name = f"cast_{dtype}_{a}_{b}"
    words = {"fp32": "float", dtype: WORDS[dtype]}
    text = render_template(
        "torch/cast.cu.j2",
        name=name,
        dtype=dtype,
        a=a,
        b=b,
        words=words,
        ptx=PTX[dtype],
    )
    return name, text


# specgen's batch norm (``templates/torch/batchnorm.cu.j2``): a block is lanes of one
# 16-byte copy of channels each, by rows of pixels, THREADS at most.
BN_THREADS = 256
BN_LANES = 32  # the most lanes a block spans: a tile of 32 copies of channels


def batchnorm_shape(dtype: str, C: int) -> tuple[int, int, int]:
    """The batch norm kernels' block over ``C`` channels of ``dtype``: (values a copy,
    lanes, rows).  The lanes are the most copies up to ``BN_LANES`` that divide the
    channels' copies, so the tiles cover ``C`` exactly; SpecError where a copy does
    not divide ``C``."""
    V = 4 if dtype == "fp32" else 8
    if C % V:
        raise SpecError(f"batch norm over {C} channels of {dtype}: not a multiple of {V}")
    L = max(d for d in range(1, BN_LANES + 1) if (C // V) % d == 0)
    return V, L, BN_THREADS // L


ACTIVATIONS = ("relu", "relu6")  # what batch norm's kernels can apply to their output


def batchnorm_source(
    dtype: str,
    C: int,
    eps: float,
    affine: bool,
    running: bool,
    HW: int | None = None,
    act: str | None = None,
    residual: bool = False,
) -> tuple[str, str]:
    """The batch norm kernels' common name and CUDA source over ``C`` channels of
    ``dtype``, channels_last, or (``HW`` given) NCHW with planes of ``HW`` pixels:
    ``eps`` baked in, with or without affine terms and running statistics (their
    momentum an argument: PyTorch's cumulative average changes it a step).  With
    ``residual`` a tensor of x's shape is added to the output, and ``act`` (one of
    ``ACTIVATIONS``) applied last: y = act(batch norm of x + r), the backward's
    gradient gated by the stored output."""
    from .render import render_template

    if act is not None and act not in ACTIVATIONS:
        raise SpecError(f"batch norm's kernels apply {' or '.join(ACTIVATIONS)}, not {act}")
    consts = f"{float(eps)!r}/{affine}/{running}".encode()
    tag = hashlib.sha1(consts).hexdigest()[:8]
    extra = (f"_{act}" if act else "") + ("_add" if residual else "")
    epilogue = "(x - mean) a + b" + (" + r" if residual else "")
    gated = {None: "dy", "relu": "dy where y > 0, else 0", "relu6": "dy where 0 < y < 6, else 0"}
    common = dict(
        dtype=dtype,
        C=C,
        threads=BN_THREADS,
        word=WORDS[dtype],
        ptx=PTX.get(dtype),
        eps=repr(float(eps)),
        affine=affine,
        running=running,
        act=act,
        residual=residual,
        epilogue=f"{act}({epilogue})" if act else epilogue,
        gated=gated[act],
        columns=(C + 31) // 32,  # the statistics' and terms' blocks, 32 channels each
    )
    if HW is not None:
        name = f"bn_{dtype}_c{C}_hw{HW}{extra}_{tag}"
        return name, render_template("torch/batchnorm_nchw.cu.j2", name=name, HW=HW, **common)
    V, L, R = batchnorm_shape(dtype, C)
    name = f"bn_{dtype}_c{C}{extra}_{tag}"
    text = render_template(
        "torch/batchnorm.cu.j2",
        name=name,
        V=V,
        L=L,
        R=R,
        CT=L * V,
        GY=C // (L * V),
        **common,
    )
    return name, text


POOL_THREADS = 256
POOL_NONE = 255  # a max pool's byte where no gradient flows
POOL_ACTIVATIONS = ("relu",)  # what the max pool's kernels can apply to their input first


def maxpool_source(
    dtype: str, layout: str, C: int, H: int, W: int, KH: int, KW: int, act: str | None = None
) -> tuple[str, str]:
    """The max pool kernels' common name and CUDA source over ``C`` channels of HxW
    pixels of ``dtype`` in ``layout`` ("nchw" or "nhwc"): KHxKW windows at a stride of
    their own size, no padding, the floor of the outputs (``templates/torch/maxpool.cu.j2``);
    with ``act`` (one of ``POOL_ACTIVATIONS``) applied to the input first."""
    from .render import render_template

    if act is not None and act not in POOL_ACTIVATIONS:
        raise SpecError(
            f"max pool's kernels apply {' or '.join(POOL_ACTIVATIONS)} first, not {act}"
        )
    if layout not in ("nchw", "nhwc") or min(KH, KW) < 1 or KH > H or KW > W:
        raise SpecError(f"max pool {KH}x{KW} over {H}x{W} {layout}: not served")
    if KH * KW >= POOL_NONE:
        raise SpecError(
            f"max pool {KH}x{KW}: a window's places are counted in a byte below {POOL_NONE}"
        )
    name = f"maxpool_{dtype}_{layout}_c{C}_{H}x{W}_k{KH}x{KW}" + (f"_{act}" if act else "")
    text = render_template(
        "torch/maxpool.cu.j2",
        name=name,
        dtype=dtype,
        layout=layout,
        word=WORDS[dtype],
        C=C,
        H=H,
        W=W,
        KH=KH,
        KW=KW,
        Ho=H // KH,
        Wo=W // KW,
        Hb=-(-H // KH),  # the backward's windows: the rows and columns past the last too
        Wb=-(-W // KW),
        rows_left=H % KH,  # rows and columns that no window takes
        cols_left=W % KW,
        # a window's (r, s) from its first pixel, in words
        offset="r * W + s" if layout == "nchw" else "(r * W + s) * C",
        act=act,
        nowhere=POOL_NONE,
        threads=POOL_THREADS,
    )
    return name, text


class Launcher:
    """A plan's launches at one batch, in order.  The argument slots are shared, so a
    call fills and launches them under a lock (the driver copies them at the launch)."""

    def __init__(self, steps: list):
        self.steps = steps
        self.lock = threading.Lock()

    def __call__(self, bufs: dict, stream: int) -> None:
        launch = _driver_launch()
        rec = recording()
        with self.lock:
            for st in self.steps:
                slots = st.slots
                for i, role, offset in st.fill:
                    slots[i] = bufs[role] + offset
                if st.maps:
                    params = st.params
                    for i, role, bound, offset in st.maps:
                        params[i] = bound.address(bufs[role] + offset)
                if rec is not None:
                    rec.launched(st, [(i, b, bufs[r] + o) for i, r, b, o in st.maps])
                launch(*st.head, stream, st.params_at, 0)


def dgrad_weights(w: np.ndarray, groups: int) -> np.ndarray:
    """w[M][C/g][R][S] -> the weights of dgrad's forward view, [C][M/g][R][S]: flipped in
    R and S, the two channel axes swapped within each group."""
    M, Cg, R, S = w.shape
    g = w.reshape(groups, M // groups, Cg, R, S)[:, :, :, ::-1, ::-1]
    return np.ascontiguousarray(g.transpose(0, 2, 1, 3, 4)).reshape(groups * Cg, M // groups, R, S)


def packed_ids(plan: Plan, p: ConvProblem) -> np.ndarray | None:
    """The flat index of PyTorch's weight (of its [M][C/g][R][S]) that ``plan`` reads at
    each packed position, or None where the packed layout is PyTorch's own: the host
    packers applied once to the weights' own indices, so that a gather by them on the
    device (the operator's) and the host's packing cannot disagree."""
    if plan.weight_format == "f32" and not plan.weight_transform:
        return None
    ids = np.arange(p.weight_count, dtype=np.int64).reshape(w_shape(p))
    if plan.weight_transform == "dgrad":
        ids = dgrad_weights(ids, p.groups)
    return pack_weights(ids, plan.weight_format)


def channels_last_offsets(p: ConvProblem) -> np.ndarray:
    """Where each weight of PyTorch's [M][C/g][R][S] lies in a channels_last tensor's
    storage ([M][R][S][C/g]), by its flat logical index."""
    M, Cg, R, S = w_shape(p)
    at = np.arange(M * R * S * Cg, dtype=np.int64).reshape(M, R, S, Cg).transpose(0, 3, 1, 2)
    return np.ascontiguousarray(at).reshape(-1)
