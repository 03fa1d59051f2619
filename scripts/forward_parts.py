"""Where one layer's forward call spends its host time under autocast (bf16, B=128,
channels_last), on an idle queue: the whole ``specgen.torch`` call beside F.conv2d,
then its pieces alone (the layer's lookup, the weights' cast, the kernel's launch with
the weights cast already).  Host microseconds a call, median.  Nothing is checked.

    PYTHONPATH=. python3 scripts/forward_parts.py
"""

import sys

import torch

sys.path.insert(0, "scripts")
from launch_cost import idle_call  # noqa: E402
from step_host import ready_step  # noqa: E402

import specgen.torch as sg  # noqa: E402
from specgen.torch import _engine as E  # noqa: E402

SIZES = {(3, 256): 32, (256, 128): 16, (128, 128): 8, (128, 256): 16, (256, 3): 32}


def main():
    x, cu, ours, autocast, step = ready_step("bf16")
    dev = x.device
    print(f"{torch.cuda.get_device_name()}: host us a forward call, idle queue, median")
    print(f"  {'layer':<12} {'F.conv2d':>9} {'specgen':>8} {'lookup':>7} {'cast':>6} {'launch':>7}")
    for m in ours:
        if not isinstance(m, sg.Conv2d):
            continue
        C, M = m.in_channels, m.out_channels
        H = SIZES[(C, M)]
        act = torch.randn(128, C, H, H, device=dev).to(torch.bfloat16)
        act = act.contiguous(memory_format=torch.channels_last).requires_grad_(C != 3)
        args = (m.stride, (1, 1, 1, 1), (1, 1), 1)
        row = []
        with torch.autocast("cuda", dtype=torch.bfloat16):
            row.append(idle_call(lambda: torch.nn.functional.conv2d(act, m.weight, m.bias, 1, 1)))
            row.append(idle_call(lambda: m(act)))
            row.append(idle_call(lambda: E.layer(act, m.weight, m.bias, *args, cast=True)))
        lay, _ = E.layer(act, m.weight, m.bias, *args, cast=True)
        cast = lay.cast(True, 128, C != 3)
        row.append(idle_call(lambda: cast(m.weight)))
        packed, w, _ = cast(m.weight)
        row.append(idle_call(lambda: E.forward(lay, act, w, m.bias)))
        print(f"  {f'{C} -> {M}':<12} " + " ".join(f"{v:8.1f}" for v in row))


if __name__ == "__main__":
    main()
