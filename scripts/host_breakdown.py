"""The operator's host time in one autoencoder step (B=128, channels_last), function
by function: each of specgen's functions on the path is wrapped in a timer, and the
table gives its calls and its inclusive microseconds per step (the timers' own cost
included, about half a microsecond a call), beside the whole step's process time with
and without the timers.  Nothing is checked: the step runs as it does in training.

    PYTHONPATH=. python3 scripts/host_breakdown.py [--math bf16]
"""

import argparse
import sys

import torch

sys.path.insert(0, "examples")
sys.path.insert(0, "scripts")
import autoencoder as ae  # noqa: E402
from step_host import MATHS, Tally, host_ms, models, setup  # noqa: E402

import specgen.runtime as R  # noqa: E402
import specgen.torch as sg  # noqa: E402
from specgen.torch import _engine as E  # noqa: E402
from specgen.torch import _ops  # noqa: E402

# (owner, attribute, label): each replaced by a timed wrapper
PATH = [
    (sg, "conv2d", "torch.conv2d (whole forward)"),
    (_ops.Conv2dFunction, "apply", "Conv2dFunction.apply"),
    (_ops.Conv2dFunction, "backward", "Conv2dFunction.backward"),
    (E, "layer", "E.layer (lookup)"),
    (E, "forward", "E.forward"),
    (E, "input_grad", "E.input_grad"),
    (E, "weight_grads", "E.weight_grads"),
    (E, "dense", "E.dense"),
    (E, "empty", "E.empty"),
    (E, "launch", "E.launch"),
    (E, "pack_weights", "E.pack_weights"),
    (E.Gather, "__call__", "Gather.__call__"),
    (E, "raw_stream", "E.raw_stream"),
    (E, "on_device", "E.on_device"),
    (R.Conv, "upload_weights", "Conv.upload_weights"),
    (E.Kernel, "run", "Kernel.run"),
    (R.Launcher, "__call__", "Launcher.__call__"),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--math", choices=list(MATHS), default="bf16")
    ap.add_argument("--steps", type=int, default=200)
    args = ap.parse_args()
    x, base = setup()
    cu, ours, autocast = models(base, x, args.math)
    step = ae.training_step(ours, x, 0.05, autocast)
    plain = {"cuDNN": host_ms(ae.training_step(cu, x, 0.05, autocast)), "specgen": host_ms(step)}
    tally = Tally()
    spent, calls = tally.spent, tally.calls

    def timed(label, fn, static):
        run = tally.wrap(fn, label)
        return staticmethod(run) if static else run

    for owner, name, label in PATH:
        raw = owner.__dict__.get(name) if isinstance(owner, type) else None
        static = isinstance(raw, staticmethod)
        setattr(owner, name, timed(label, getattr(owner, name), static))
    # Conv2d._conv_forward reads conv2d from the package's globals
    sg.Conv2d._conv_forward.__globals__["conv2d"] = sg.conv2d
    with_timers = host_ms(step)
    spent.clear(), calls.clear()
    for _ in range(args.steps):
        step()
        torch.cuda.synchronize()
    print(f"{torch.cuda.get_device_name()}, {args.math}: host ms per step (process time, median)")
    for k, v in plain.items():
        print(f"  {k:<10} {v:.3f}")
    print(f"  specgen with the timers {with_timers:.3f}\n")
    print(f"{'function':<32} {'calls':>6} {'us/step':>9} {'us/call':>9}")
    for _, _, label in PATH:
        if label in spent:
            n = calls[label] / args.steps
            us = spent[label] / args.steps / 1e3
            print(f"{label:<32} {n:>6.0f} {us:>9.1f} {us / n:>9.2f}")


if __name__ == "__main__":
    main()
