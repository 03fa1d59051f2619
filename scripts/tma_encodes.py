"""How often the operator's launches encode a tensor map in the autoencoder's training
step (B=128, channels_last): a TMA kernel's map is encoded once per address its tensor
is found at (``tma.BoundMap``), so a step that meets new addresses pays the driver's
encoding again.  Counts the encodings per step over steady-state steps, by kernel and
tensor.  Nothing is checked.

    PYTHONPATH=. python3 scripts/tma_encodes.py [--math bf16]
"""

import argparse
import sys

import torch

sys.path.insert(0, "examples")
sys.path.insert(0, "scripts")
from step_host import MATHS, Tally, ready_step  # noqa: E402

from specgen import tma  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--math", choices=list(MATHS), default="bf16")
    ap.add_argument("--steps", type=int, default=50)
    args = ap.parse_args()
    x, cu, ours, autocast, step = ready_step(args.math, warm=10)
    raw, tally = tma.encode, Tally()
    tma.encode = tally.wrap(raw, lambda m, ptr, images: (m.role.value, tuple(m.dims)))
    for _ in range(args.steps):
        step()
        torch.cuda.synchronize()
    tma.encode = raw
    count, spent = tally.calls, sum(tally.spent.values())
    total = sum(count.values())
    print(f"{torch.cuda.get_device_name()}, {args.math}: tensor maps encoded a step")
    print(f"  all: {total / args.steps:.2f} a step, {spent / max(total, 1) / 1e3:.1f} us each")
    for key, n in sorted(count.items(), key=lambda kv: -kv[1]):
        print(f"  {key[0]} {key[1]}: {n / args.steps:.2f} a step")


if __name__ == "__main__":
    main()
