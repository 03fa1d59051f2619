"""Load a compiled variant on the GPU and launch it: the Python side of each strategy
(weight upload, batch chunks past the grid limit, im2col segments, launch order)."""

from __future__ import annotations

import numpy as np

from .compile import Binary, compile_source
from .errors import SpecError
from .plan import Plan, make_plan
from .render import render
from .shapes import ConvProblem, Op
from .tensors import BATCHED, INPUTS, STORAGE, Role, outputs, role_shape, w_shape
from .variants import Variant

DEFAULT_WORKSPACE = 256 * 2**20  # bytes of im2col scratch, unless the caller says otherwise


def gpu_available() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:  # no driver, no device, or no CuPy: all mean "no GPU here"
        return False


def device_arch() -> str:
    import cupy

    return "sm_" + cupy.cuda.Device().compute_capability


def pack_weights(w: np.ndarray, fmt: str) -> np.ndarray:
    """The host-side layout each plan asks for: plain fp32, fp32 transposed to
    [C][K][K][M] (a tap's maps adjacent, for 16-byte copies), or each weight as the
    half2 pair (w, w) in one 32-bit word for half2 arithmetic."""
    w = np.asarray(w, dtype=np.float32)
    if fmt == "ckkm":
        return np.ascontiguousarray(w.transpose(1, 2, 3, 0)).reshape(-1)
    w = np.ascontiguousarray(w).reshape(-1)
    if fmt == "f32":
        return w
    bits = w.astype(np.float16).view(np.uint16).astype(np.uint32)
    return bits | (bits << 16)


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
        self.binary = binary or compile_source(render(self.plan), self.plan.name, device_arch())
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
            ptr = self.module.get_global_var("wc")
            if not isinstance(ptr, cupy.cuda.MemoryPointer):  # a bare address in some CuPys
                mem = cupy.cuda.UnownedMemory(int(ptr), host.nbytes, self.module)
                ptr = cupy.cuda.MemoryPointer(mem, 0)
            cupy.ndarray(host.shape, host.dtype, memptr=ptr).set(host)
            self.w = None
        else:
            self.w = cupy.asarray(host)

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
        """Role -> array in, Role -> array out (allocated unless given)."""
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
        for role in outputs(s):
            if role not in out:
                out[role] = cupy.empty(role_shape(role, s, batch), dtype=dtype)
        bufs = {**inputs, **out, Role.W: self.w, Role.BIAS: self.bias}
        if self.plan.workspace_bytes:
            if self.scratch is None:
                self.scratch = cupy.empty(self.plan.workspace_bytes // 4, dtype=np.float32)
            bufs[Role.WORKSPACE] = self.scratch
        if self.plan.workspace_per_image:
            self._segments(bufs, batch)
        else:
            for launch in self.plan.launches:
                self._launch(launch, bufs, batch)
        return out

    def _segments(self, bufs, batch):
        """im2col: unroll then multiply, one segment of images at a time."""
        import cupy

        per_image = self.plan.workspace_per_image
        seg = min(
            batch, max(1, self.workspace // per_image), *(l.max_batch for l in self.plan.launches)
        )
        xu = cupy.empty(seg * per_image // 4, dtype=np.float32)
        for b0 in range(0, batch, seg):
            b1 = min(batch, b0 + seg)
            part = {r: (t[b0:b1] if r in BATCHED else t) for r, t in bufs.items()}
            part[Role.WORKSPACE] = xu
            for launch in self.plan.launches:
                self._launch(launch, part, b1 - b0)

    def _launch(self, launch, bufs, batch):
        f = self.functions[launch.kernel]
        step = launch.max_batch
        for b0 in range(0, batch, step):
            n = min(step, batch - b0)
            args = []
            for role in launch.args:
                if role is Role.BATCH:
                    args.append(np.int32(n))
                elif role in BATCHED:  # this launch's images
                    args.append(bufs[role][b0 : b0 + n])
                else:
                    args.append(bufs[role])
            grid = launch.grid_for(n, self.resident.get(launch.kernel))
            f(grid, launch.block, tuple(args), shared_mem=launch.dynamic_smem)


def dgrad_weights(w: np.ndarray, groups: int) -> np.ndarray:
    """w[M][C/g][R][S] -> the weights of dgrad's forward view, [C][M/g][R][S]: flipped in
    R and S, the two channel axes swapped within each group."""
    M, Cg, R, S = w.shape
    g = w.reshape(groups, M // groups, Cg, R, S)[:, :, :, ::-1, ::-1]
    return np.ascontiguousarray(g.transpose(0, 2, 1, 3, 4)).reshape(groups * Cg, M // groups, R, S)
