"""Seed 003's training step (B=128, channels_last) with the model under
``torch.compile`` (default mode: Inductor fuses the pointwise ops, no CUDA graphs),
cuDNN's model beside specgen's, per math: the median of single steps and the mean of
steps back to back, the two alternated as ``examples/autoencoder.py`` does.

    PYTHONPATH=. python3 scripts/compiled_step.py [--math bf16] [--timed 50]
"""

import argparse
import sys

import torch

sys.path.insert(0, "examples")
sys.path.insert(0, "scripts")
import autoencoder as ae  # noqa: E402
from step_host import MATHS, models, setup  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--math", choices=list(MATHS), action="append")
    ap.add_argument("--timed", type=int, default=50)
    args = ap.parse_args()
    x, base = setup()
    print(f"{torch.cuda.get_device_name()}: compiled training step, ms (cuDNN / specgen)")
    for math in args.math or list(MATHS):
        torch._dynamo.reset()
        cu, ours, autocast = models(base, x, math)
        pair = [torch.compile(cu), torch.compile(ours)]
        t = ae.time_steps(pair, x, 0.05, args.timed, 10, autocast)
        single = t[0][0] / t[1][0]
        loop = t[0][1] / t[1][1]
        print(
            f"  {math:<5} single {t[0][0]:.3f} / {t[1][0]:.3f} ({single:.2f}x)   "
            f"back to back {t[0][1]:.3f} / {t[1][1]:.3f} ({loop:.2f}x)",
            flush=True,
        )


if __name__ == "__main__":
    main()
