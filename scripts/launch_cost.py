"""What one launch costs the host, by who makes it (B=128 autoencoder, bf16, channels
last): PyTorch's own small op; the driver's launch of a kernel that does nothing and of
specgen's kernels, on PyTorch's current stream and on a stream of its own; and each
layer's whole convolution through the operator beside F.conv2d (forward alone, and
forward with backward), under autocast.  Host microseconds a call: launches a thousand
calls, the queue drained every hundred; layers the median of calls onto an idle queue.  Nothing is checked.

    PYTHONPATH=. python3 scripts/launch_cost.py
"""

import sys
import time

import numpy as np
import torch

sys.path.insert(0, "examples")
sys.path.insert(0, "scripts")
from launch_micro import per_call  # noqa: E402
from step_host import ready_step  # noqa: E402

import specgen.torch as sg  # noqa: E402
from specgen.torch import _engine as E  # noqa: E402


def idle_call(fn, n=200):
    """Host microseconds of one call made onto an idle queue (median; warmed up)."""
    for _ in range(5):
        fn()
    used = []
    for _ in range(n):
        torch.cuda.synchronize()
        t = time.perf_counter_ns()
        fn()
        used.append(time.perf_counter_ns() - t)
    torch.cuda.synchronize()
    return float(np.median(used)) / 1e3


def main():
    import ctypes

    from cupy.cuda import driver as drv

    x, cu, ours, autocast, step = ready_step("bf16")
    dev = x.device
    legacy = E.raw_stream(dev.index)
    side = torch.cuda.Stream()
    small = torch.zeros(1024, device=dev)
    print(f"{torch.cuda.get_device_name()}: host us a call (current stream {legacy:#x})")
    print(f"  torch relu_ (1024 floats): {per_call(lambda: small.relu_()):.2f}")
    print(f"  torch empty (1024 floats): {per_call(lambda: torch.empty(1024, device=dev)):.2f}")
    # the operator's weight gather over no weights: a kernel that does nothing
    func = E.gather_kernel(dev.index, "bf16", "bf16")
    ptr = small.data_ptr()
    slots = (ctypes.c_uint64 * 4)(ptr, ptr, ptr, 0)
    params = (ctypes.c_void_p * 4)(*(ctypes.addressof(slots) + 8 * i for i in range(4)))
    at = ctypes.addressof(params)
    for name, stream in (("current", legacy), ("side", side.cuda_stream)):
        us = per_call(lambda: drv.launchKernel(func, 1, 1, 1, 32, 1, 1, 0, stream, at, 0))
        print(f"  driver launch, empty gather, {name} stream: {us:.2f}")
    seen = set()
    for k in E._kernels.values():
        launcher, _ = k.run(128)
        st = launcher.steps[0]
        if k.conv.plan.name in seen:
            continue
        seen.add(k.conv.plan.name)
        gx, gy, gz = st.grid
        bx, by, bz = st.block
        args = (st.func, gx, gy, gz, bx, by, bz, st.smem)
        cur = per_call(lambda: drv.launchKernel(*args, legacy, st.params_at, 0), 300)
        own = per_call(lambda: drv.launchKernel(*args, side.cuda_stream, st.params_at, 0), 300)
        print(
            f"  driver launch {k.conv.plan.name} (smem {st.smem}, {len(st.maps)} maps): "
            f"current {cur:.2f}, side {own:.2f}"
        )
    # each conv layer alone, forward and forward + backward, cuDNN beside specgen
    print("\n  layer (autocast bf16)            cuDNN fwd  specgen fwd  cuDNN f+b  specgen f+b")
    act = x
    for conv_cu, conv_sg in zip(
        [m for m in cu if isinstance(m, torch.nn.Conv2d)],
        [m for m in ours if isinstance(m, sg.Conv2d)],
    ):
        C = conv_cu.in_channels
        shapes = {(3, 256): 32, (256, 128): 16, (128, 128): 8, (128, 256): 16, (256, 3): 32}
        H = shapes[(C, conv_cu.out_channels)]
        act = torch.randn(128, C, H, H, device=dev).to(memory_format=torch.channels_last)
        act.requires_grad_(C != 3)
        row = []
        for m in (conv_cu, conv_sg):
            with torch.autocast("cuda", dtype=torch.bfloat16), torch.no_grad():
                row.append(idle_call(lambda: m(act)))
        for m in (conv_cu, conv_sg):

            def fb():
                with torch.autocast("cuda", dtype=torch.bfloat16):
                    y = m(act)
                y.backward(torch.ones_like(y))

            row.append(idle_call(fb))
        name = f"{C} -> {conv_cu.out_channels}"
        print(f"  {name:<32} {row[0]:9.1f} {row[1]:12.1f} {row[2]:10.1f} {row[3]:12.1f}")


if __name__ == "__main__":
    main()
