"""Host microseconds of the pieces of one eager convolution call under bf16 autocast
(the autoencoder's 256 -> 128 layer, B=128, channels_last), against the floor an
``autograd.Function`` sets: a bare Function (through ``Function.apply`` and through the
C entry beneath it), an allocation, autocast's queries, the layer's lookup, the cast,
the forward launch, the launcher alone, the driver alone, and dw's cast back to fp32.
A thousand calls each, the queue drained every hundred.  Nothing is checked.

    PYTHONPATH=. python3 scripts/host_pieces.py
"""

import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, "examples")
sys.path.insert(0, "scripts")
from launch_micro import per_call  # noqa: E402
from step_host import ready_step  # noqa: E402

import specgen.torch as sg  # noqa: E402
from specgen.tensors import Role  # noqa: E402
from specgen.torch import _engine as E  # noqa: E402


class Bare(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, size):
        ctx.save_for_backward(x, weight)
        return torch.empty_strided(
            size,
            (size[1] * size[2] * size[3], 1, size[1] * size[3], size[1]),
            dtype=x.dtype,
            device=x.device,
        )

    @staticmethod
    def backward(ctx, dy):
        return None, None, None, None


def main():
    x, cu, ours, autocast, step = ready_step("bf16")
    dev = x.device
    m = [l for l in ours if isinstance(l, sg.Conv2d)][1]
    mc = [l for l in cu if isinstance(l, torch.nn.Conv2d)][1]
    act = torch.randn(128, 256, 16, 16, device=dev).to(torch.bfloat16)
    act = act.contiguous(memory_format=torch.channels_last).requires_grad_(True)
    size = (128, 128, 16, 16)
    rows = []

    def row(name, fn):
        rows.append((name, per_call(fn)))

    with torch.autocast("cuda", dtype=torch.bfloat16):
        row("F.conv2d (cuDNN), autocast", lambda: mc(act))
        row("specgen Conv2d, autocast", lambda: m(act))
        row("bare Function.apply", lambda: Bare.apply(act, m.weight, m.bias, size))
        base = super(torch.autograd.Function, Bare).apply
        row("bare Function, C entry", lambda: base(act, m.weight, m.bias, size))
        with torch.no_grad():
            row("specgen Conv2d, autocast, no_grad", lambda: m(act))
    row(
        "torch.empty_strided",
        lambda: torch.empty_strided(size, (32768, 1, 2048, 128), dtype=torch.bfloat16, device=dev),
    )
    row("torch.empty (1-D)", lambda: torch.empty(4096, dtype=torch.bfloat16, device=dev))
    row(
        "is_autocast_enabled + dtype",
        lambda: (torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda")),
    )
    row("torch.compiler.is_compiling", torch.compiler.is_compiling)
    args = ((1, 1), (1, 1, 1, 1), (1, 1), 1)
    row("E.layer lookup", lambda: E.layer(act, m.weight, m.bias, *args, cast=True))
    lay, _ = E.layer(act, m.weight, m.bias, *args, cast=True)
    cast = lay.cast(True, 128, True)
    row("lay.cast lookup", lambda: lay.cast(True, 128, True))
    row("cast(weight): 2 allocs + launch", lambda: cast(m.weight))
    packed, w, _ = cast(m.weight)
    row("E.forward (ready)", lambda: E.forward(lay, act, w, m.bias))
    k = lay.kernel(E.Op.FPROP, True, 128)
    launcher, _ = k.run(128)
    y = E.forward(lay, act, w, m.bias)
    ptrs = {
        Role.X: act.data_ptr(),
        Role.Y: y.data_ptr(),
        Role.W: w[0],
        Role.BIAS: m.bias.data_ptr(),
    }
    stream = E.raw_stream(dev.index)
    row("launcher(ptrs, stream)", lambda: launcher(ptrs, stream))
    from specgen.runtime import _driver_launch

    launch = _driver_launch()
    st = launcher.steps[0]
    row("driver launch alone", lambda: launch(*st.head, stream, st.params_at, 0))
    dw = torch.randn(128, 256, 3, 3, device=dev).to(torch.bfloat16)
    row(
        "dw.to(fp32, channels_last)",
        lambda: dw.to(torch.float32, memory_format=torch.channels_last),
    )
    row(
        "x.is_contiguous(channels_last)",
        lambda: act.is_contiguous(memory_format=torch.channels_last),
    )
    row(
        "x.shape, x.stride(), dtype, get_device",
        lambda: (act.shape, act.stride(), act.dtype, act.get_device()),
    )
    print(f"{torch.cuda.get_device_name()}: host us a call (1000 calls, median-free mean)")
    for name, us in rows:
        print(f"  {name:<42} {us:7.2f}")


if __name__ == "__main__":
    main()
