"""The operator's host path per kernel in the autoencoder's step (B=128, channels_last):
for every kernel a step launches, its variant, how its weights are packed (as they
lie, a cast, specgen's gather, index_select), its scratch bytes, and the host
microseconds of its ``E.launch`` calls per step; then the step's host time with
Python's garbage collector as it is, frozen, and off (a collection in the middle of a
step is host time too).  Nothing is checked.

    PYTHONPATH=. python3 scripts/op_paths.py [--math bf16]
"""

import argparse
import gc
import sys

import torch

sys.path.insert(0, "examples")
sys.path.insert(0, "scripts")
import autoencoder as ae  # noqa: E402
from step_host import MATHS, Tally, host_ms, models, setup  # noqa: E402

from specgen.torch import _engine as E  # noqa: E402


def how_packed(fn) -> str:
    if fn is E._as_they_are:
        return "as they lie"
    if isinstance(fn, E.Gather):
        return f"gather -> {fn.dtype}"
    return getattr(fn, "__qualname__", type(fn).__name__)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--math", choices=list(MATHS), action="append")
    ap.add_argument("--steps", type=int, default=100)
    args = ap.parse_args()
    x, base = setup()
    for math in args.math or ["bf16", "tf32"]:
        cu, ours, autocast = models(base, x, math)
        step = ae.training_step(ours, x, 0.05, autocast)
        step()
        torch.cuda.synchronize()
        tally, raw = Tally(), E.launch
        spent, calls = tally.spent, tally.calls
        E.launch = tally.wrap(raw, lambda k, *a, **kw: k.conv.plan.name)
        for _ in range(args.steps):
            step()
            torch.cuda.synchronize()
        E.launch = raw
        print(f"\n{torch.cuda.get_device_name()}, {math}: E.launch per kernel, per step")
        print(f"{'us/step':>8} {'calls':>5}  kernel; weights packed; scratch bytes")
        for k in E._kernels.values():
            name = k.conv.plan.name
            if name not in spent:
                continue
            packs = ", ".join(how_packed(f) for f in k.packs.values()) or "-"
            need = max((r[1] for r in k.runs.values()), default=0)
            us = spent[name] / args.steps / 1e3
            print(f"{us:8.1f} {calls[name] / args.steps:5.1f}  {name}; {packs}; {need}")
        plain = host_ms(step)
        gc.freeze()
        frozen = host_ms(step)
        gc.disable()
        off = host_ms(step)
        gc.enable()
        gc.unfreeze()
        cudnn = host_ms(ae.training_step(cu, x, 0.05, autocast))
        print(
            f"host ms per step (process, median of 30): specgen {plain:.3f}, gc frozen "
            f"{frozen:.3f}, gc off {off:.3f}; cuDNN {cudnn:.3f}"
        )


if __name__ == "__main__":
    main()
