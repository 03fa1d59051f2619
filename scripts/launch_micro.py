"""Host microseconds of each piece of the operator's launch (``E.launch``) for the
autoencoder's kernels in bf16 (B=128, channels_last), a thousand calls each, the queue
drained every hundred: the whole ``E.launch``, the bound launcher alone, the driver's
launch alone through CuPy and through ctypes, the weights' packing, and PyTorch's own
launch of a small kernel for scale.  Nothing is checked.

    PYTHONPATH=. python3 scripts/launch_micro.py
"""

import ctypes
import sys
import time

import torch

sys.path.insert(0, "examples")
sys.path.insert(0, "scripts")
from step_host import ready_step  # noqa: E402

from specgen.tensors import Role  # noqa: E402
from specgen.torch import _engine as E  # noqa: E402


def per_call(fn, n=1000):
    torch.cuda.synchronize()
    spent = 0
    for i in range(n):
        t = time.perf_counter_ns()
        fn()
        spent += time.perf_counter_ns() - t
        if i % 100 == 99:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return spent / n / 1e3


def main():
    from cupy.cuda import driver as drv

    x, cu, ours, autocast, step = ready_step("bf16")
    dev = x.device
    index = dev.index
    stream = E.raw_stream(index)
    small = torch.zeros(1024, device=dev)
    print(f"{torch.cuda.get_device_name()}: host us per call")
    print(f"  torch.relu_ on 1024 floats: {per_call(lambda: small.relu_()):.2f}")
    print(f"  raw_stream: {per_call(lambda: E.raw_stream(index)):.2f}")
    libcuda = ctypes.CDLL("libcuda.so.1")
    for k in E._kernels.values():
        p = k.conv.plan
        if p.shape.op.value != "fprop":
            continue
        N = 128
        shape = p.shape
        xs = torch.randn(N, shape.H, shape.W, shape.C, device=dev).to(torch.bfloat16)
        xs = xs.permute(0, 3, 1, 2)  # channels_last view
        ys = torch.empty(N, shape.Ho, shape.Wo, shape.M, device=dev, dtype=torch.bfloat16)
        ys = ys.permute(0, 3, 1, 2)
        w = torch.randn(shape.M, shape.R, shape.S, shape.C, device=dev).to(torch.bfloat16)
        w = w.permute(0, 3, 1, 2)
        b = torch.randn(shape.M, device=dev) if shape.bias else None
        tensors = {Role.X: xs, Role.Y: ys}
        launcher, _ = k.run(N)
        ptrs = {Role.X: xs.data_ptr(), Role.Y: ys.data_ptr(), Role.W: w.data_ptr()}
        if b is not None:
            ptrs[Role.BIAS] = b.data_ptr()
        st = launcher.steps[0]
        launcher(ptrs, stream)
        gx, gy, gz = st.grid
        bx, by, bz = st.block
        cu_launch = libcuda.cuLaunchKernel
        cu_launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [ctypes.c_void_p] * 3
        args = (st.func, gx, gy, gz, bx, by, bz, st.smem, stream, st.params_at, None)
        print(f"\n  {p.name} ({len(launcher.steps)} launch(es), {len(st.maps)} tensor maps)")
        print(f"    E.launch: {per_call(lambda: E.launch(k, tensors, N, dev, w=w, bias=b)):.2f}")
        print(f"    pack_weights: {per_call(lambda: E.pack_weights(k, w)):.2f}")
        print(f"    launcher: {per_call(lambda: launcher(ptrs, stream)):.2f}")
        print(
            "    cupy drv.launchKernel: " f"{per_call(lambda: drv.launchKernel(*args[:-1], 0)):.2f}"
        )
        print(f"    ctypes cuLaunchKernel: {per_call(lambda: cu_launch(*args)):.2f}")


if __name__ == "__main__":
    main()
