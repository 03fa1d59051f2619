"""Where the eager step's host time goes, without timers on the path: the autoencoder's
training step (B=128, channels_last) timed whole (the host's wall time to enqueue it
onto an idle queue) with pieces of the operator taken out, each alternated step by step
with PyTorch+cuDNN's step (the host's drift is large from second to second):

- ``specgen``: as it runs;
- ``no cuLaunch``: the driver's launch call skipped (the launchers' Python runs);
- ``no driver``: every launch skipped at ``on_device`` (the launcher and the driver);
- ``no launch``: ``E.launch`` skipped (weights' packing, scratch, pointers too);
- ``no engine``: the Function's forward and backward only allocate their outputs.

Nothing is checked: the numbers the pieces leave out are not correct.

    PYTHONPATH=. python3 scripts/host_ablation.py [--math bf16] [--rounds 3]
"""

import argparse
import sys
import time

import numpy as np
import torch

sys.path.insert(0, "examples")
sys.path.insert(0, "scripts")
import autoencoder as ae  # noqa: E402
from step_host import MATHS, models, setup  # noqa: E402

import specgen.runtime as R  # noqa: E402
from specgen.shapes import TensorLayout  # noqa: E402
from specgen.torch import _engine as E  # noqa: E402
from specgen.torch import _ops  # noqa: E402


def paired_ms(first, second, pairs=150):
    """The host's wall time to enqueue each of two steps onto an idle queue, the two
    alternated step by step (which goes first alternating too), so that the host's
    drift meets both alike: the medians of each, ms, and the median ratio of a pair."""
    for _ in range(5):
        first(), second()
    torch.cuda.synchronize()
    a, b = [], []
    for i in range(pairs):
        order = ((first, a), (second, b)) if i % 2 == 0 else ((second, b), (first, a))
        for step, into in order:
            torch.cuda.synchronize()
            t = time.perf_counter()
            step()
            into.append(time.perf_counter() - t)
    torch.cuda.synchronize()
    a, b = np.array(a), np.array(b)
    return 1e3 * np.median(a), 1e3 * np.median(b), float(np.median(b / a))


class _Nothing(torch.autograd.Function):
    """A convolution's outputs allocated, nothing computed, forward or backward."""

    @staticmethod
    def forward(ctx, x, weight, bias, lay):
        ctx.save_for_backward(x, weight)
        ctx.lay = lay
        return E.empty((x.shape[0], *lay.y_rest), x, lay.layout)

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        lay = ctx.lay
        dx = E.empty(tuple(x.shape), dy, lay.layout) if ctx.needs_input_grad[0] else None
        dw = E.empty(lay.w_size, dy, TensorLayout.NCHW)
        db = E.empty((lay.w_size[0],), dy, TensorLayout.NCHW)
        return dx, dw, db, None


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--math", choices=list(MATHS), action="append")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--only", action="append", help="just this variant (repeatable)")
    args = ap.parse_args()
    x, base = setup()
    raw = dict(on_device=E.on_device, launch=E.launch, fn=_ops.Conv2dFunction)
    eager = getattr(_ops, "conv2d_eager", None)  # the eager entry, where this package has one
    variants = {
        "specgen": {},
        "no cuLaunch": {},  # the launcher's Python runs, the driver's call does not
        "no driver": {"on_device": lambda *a: None},
        "no launch": {"launch": lambda *a, **k: None},
    }
    for math in args.math or ["bf16"]:
        cu, ours, autocast = models(base, x, math)
        cudnn = ae.training_step(cu, x, 0.05, autocast)
        step = ae.training_step(ours, x, 0.05, autocast)
        names = args.only or [*variants, "no engine"]
        found = {k: [] for k in names}
        for _ in range(args.rounds):
            for name, patch in variants.items():
                if name not in names:
                    continue
                for attr, fn in patch.items():
                    setattr(E, attr, fn)
                if name == "no cuLaunch":
                    R._launch_kernel[:] = [lambda *a: None]
                found[name].append(paired_ms(cudnn, step))
                R._launch_kernel.clear()
                for attr in patch:
                    setattr(E, attr, raw[attr])
            if "no engine" in names:
                _ops.Conv2dFunction = _Nothing
                if eager is not None:
                    _ops.conv2d_eager = _Nothing.apply
                found["no engine"].append(paired_ms(cudnn, step))
                _ops.Conv2dFunction = raw["fn"]
                if eager is not None:
                    _ops.conv2d_eager = eager
        print(f"\n{torch.cuda.get_device_name()}, {math}: host ms a step, per round")
        print("  (each: cuDNN's median / this one's median / the median of their ratio)")
        for name, runs in found.items():
            print(f"  {name:<10} " + "   ".join(f"{c:.3f} / {o:.3f} / {r:.3f}" for c, o, r in runs))


if __name__ == "__main__":
    main()
