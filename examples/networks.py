"""The seeds' 7x7 networks at B=10000 through specgen's PyTorch operator, beside cuDNN
in the same run: layer1 -> ReLU -> 2x2 max-pool -> layer2 (the ECE408 LeNet variant)
and the MXNet-era pair, fp32 (tf32 off on both sides).

    PYTHONPATH=. python3 examples/networks.py [--batch 10000]

Each convolution is timed alone through ``specgen.torch.conv2d`` (dispatch included:
the Python wrapper, the custom op, weight packing and the launch) and through
``torch.nn.functional.conv2d``; then the whole network's forward pass and its training
step (forward and backward of the convolutions, pooling and ReLU).  CUDA events,
warm-up, the median of many runs.
"""

from __future__ import annotations

import argparse
import logging
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

import specgen.torch as sg
from specgen.torch.model import median_ms

NETWORKS = {
    "ece408": ((1, 4, 86), (4, 16)),  # layer1, layer2 (shapes.md)
    "mxnet": ((1, 12, 72), (12, 24)),  # mx-layer1, mx-layer2
}


def network(first, second) -> nn.Sequential:
    (c1, m1, _), (c2, m2) = first, second
    return nn.Sequential(
        nn.Conv2d(c1, m1, 7, bias=False),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(c2, m2, 7, bias=False),
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=10000)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    print(f"{torch.cuda.get_device_name()}, B={args.batch}, fp32, median ms")
    print(f"{'network':<8} {'what':<26} {'cuDNN':>8} {'specgen':>8} {'speedup':>8}")
    for name, (first, second) in NETWORKS.items():
        torch.manual_seed(0)
        ref = network(first, second).to(dev)
        ours = sg.convert(network(first, second).to(dev))
        ours.load_state_dict(ref.state_dict())
        x = torch.rand(args.batch, first[0], first[2], first[2], device=dev)
        with torch.no_grad():
            h = F.max_pool2d(F.relu(ref[0](x)), 2)
            rows = []
            total_cu = total_sg = 0.0
            for i, inp in ((0, x), (3, h)):
                w = ref[i].weight
                t_cu = median_ms(lambda: F.conv2d(inp, w))
                t_sg = median_ms(lambda: sg.conv2d(inp, w))
                total_cu, total_sg = total_cu + t_cu, total_sg + t_sg
                rows.append((f"conv {tuple(w.shape)}", t_cu, t_sg))
            rows.append(("both convolutions", total_cu, total_sg))
            rows.append(("forward pass", median_ms(lambda: ref(x)), median_ms(lambda: ours(x))))
        x.requires_grad_(False)

        def step(model):
            out = model(x)
            torch.autograd.grad(out.sum(), list(model.parameters()))

        rows.append(
            (
                "training step (fwd+bwd)",
                median_ms(lambda: step(ref), 10),
                median_ms(lambda: step(ours), 10),
            )
        )
        for what, a, b in rows:
            print(f"{name:<8} {what:<26} {a:>8.3f} {b:>8.3f} {a / b:>7.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
