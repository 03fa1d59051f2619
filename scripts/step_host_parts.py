"""Where the host time of specgen's training step goes, by taking parts away: the CPU
time to enqueue one autoencoder step (B=128, channels_last) with PyTorch+cuDNN, with
specgen, with specgen's launches (weight packing, scratch, the driver call) stubbed out,
and with a bare autograd.Function that only allocates the outputs (the floor of any
operator written as a Python Function).  The stubbed steps compute nothing: they are
timed, never checked.

    PYTHONPATH=. python3 scripts/step_host_parts.py [--math bf16]
"""

import argparse
import sys

import torch

sys.path.insert(0, "examples")
sys.path.insert(0, "scripts")
import autoencoder as ae  # noqa: E402
from step_host import MATHS, host_ms, models, setup  # noqa: E402

from specgen.torch import _engine as E  # noqa: E402
from specgen.torch import _ops  # noqa: E402


class Bare(torch.autograd.Function):
    """Outputs allocated, nothing computed: the Python Function machinery alone."""

    @staticmethod
    def forward(ctx, x, weight, bias, lay):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        size = (x.shape[0], *lay.y_rest)
        return torch.empty(size, dtype=x.dtype, device=x.device, memory_format=torch.channels_last)

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        db = torch.empty(weight.shape[0], dtype=dy.dtype, device=dy.device)
        return (
            torch.empty_like(x),
            torch.empty_like(weight),
            db if ctx.has_bias else None,
            None,
        )


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--math", choices=list(MATHS), action="append")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    x, base = setup()
    print(f"{torch.cuda.get_device_name()}: host (CPU) ms to enqueue one step, median of 30")
    cols = ("cuDNN", "specgen", "no launch", "bare Function")
    print(f"{'math':<6} " + " ".join(f"{c:>13}" for c in cols))
    real_launch, real_apply = E.launch, _ops.Conv2dFunction.apply
    for math in args.math or list(MATHS):
        cu, ours, autocast = models(base, x, math)
        rows = {c: [] for c in cols}
        for _ in range(args.rounds):
            rows["cuDNN"].append(host_ms(ae.training_step(cu, x, 0.05, autocast)))
            rows["specgen"].append(host_ms(ae.training_step(ours, x, 0.05, autocast)))
            E.launch = lambda *a, **k: None
            rows["no launch"].append(host_ms(ae.training_step(ours, x, 0.05, autocast)))
            E.launch = real_launch
            _ops.Conv2dFunction.apply = Bare.apply
            rows["bare Function"].append(host_ms(ae.training_step(ours, x, 0.05, autocast)))
            _ops.Conv2dFunction.apply = real_apply
        print(f"{math:<6} " + " ".join(f"{min(rows[c]):>13.3f}" for c in cols))


if __name__ == "__main__":
    main()
