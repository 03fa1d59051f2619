"""Seed 003's CIFAR-style autoencoder trained on specgen's convolutions, beside the
same model on cuDNN: the same initial weights, the same batches, step by step.

    PYTHONPATH=. python3 examples/autoencoder.py [--steps 40] [--batch 128] [--channels-last]

The data are 32x32 patches cut from the photographs that scikit-image bundles (no
download).  Three copies of the model train on the same batches: float64 on PyTorch
(the reference), float32 on cuDNN, float32 on specgen.  Both float32 runs drift from
the float64 one by their own rounding; specgen's losses agree with cuDNN's "within
what fp32 reordering allows" when its drift from float64 is of the size of cuDNN's.
Then the training step is timed at the batch size in fp32, tf32 and bf16 autocast,
specgen beside cuDNN in the same run (CUDA events, warm-up, median of many steps).
With --channels-last both models and the batch are timed in channels_last memory, as
PyTorch users lay out a network for tensor cores: under bf16 autocast specgen's 16-bit
layers then run on its NHWC tensor-core kernels (wgmma, tcgemm, tcwgrad).
"""

from __future__ import annotations

import argparse
import copy
import json
import logging
import statistics
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

import specgen.torch as sg


def autoencoder() -> nn.Sequential:
    """Seed 003's layers: 3x3 convolutions with padding 1 and bias, ReLU, 2x2 max-pool,
    nearest 2x upsampling; the last convolution has no activation."""
    return nn.Sequential(
        nn.Conv2d(3, 256, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(256, 128, 3, padding=1),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(128, 128, 3, padding=1),
        nn.ReLU(),
        nn.Upsample(scale_factor=2, mode="nearest"),
        nn.Conv2d(128, 256, 3, padding=1),
        nn.ReLU(),
        nn.Upsample(scale_factor=2, mode="nearest"),
        nn.Conv2d(256, 3, 3, padding=1),
    )


def photographs_as_patches(count: int, rng: np.random.Generator) -> torch.Tensor:
    """``count`` random 32x32 RGB patches in [0, 1] from scikit-image's bundled
    photographs (grey ones repeated over the three channels)."""
    from skimage import data

    names = ["astronaut", "coffee", "chelsea", "rocket", "camera", "cat", "hubble_deep_field"]
    images = []
    for name in names:
        img = np.asarray(getattr(data, name)(), dtype=np.float32)
        img = img / 255.0 if img.max() > 1.5 else img
        if img.ndim == 2:
            img = np.repeat(img[:, :, None], 3, axis=2)
        images.append(img[:, :, :3])
    patches = np.empty((count, 3, 32, 32), np.float32)
    for i in range(count):
        img = images[rng.integers(len(images))]
        r, c = rng.integers(img.shape[0] - 32), rng.integers(img.shape[1] - 32)
        patches[i] = img[r : r + 32, c : c + 32].transpose(2, 0, 1)
    return torch.from_numpy(patches)


def train(model, batches, lr, dtype=torch.float32):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    losses = []
    for x in batches:
        x = x.to(dtype)
        loss = F.mse_loss(model(x), x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def training_step(model, x, lr, autocast=None):
    """One training step as a function: forward (under autocast where given), MSE
    against the input, backward, SGD."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)

    def step():
        with torch.autocast("cuda", dtype=autocast, enabled=autocast is not None):
            loss = F.mse_loss(model(x), x)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def time_steps(models, x, lr, steps, warmup, autocast=None, rounds=5):
    """Two figures of one training step (forward, MSE, backward, SGD) for each model, by
    CUDA events: the median of ``steps`` single steps, each waited for (the host's launch
    latency shows), and the median over ``rounds`` rounds of the mean of ``steps`` steps
    queued back to back (the throughput of a training loop, where the host runs ahead of
    the GPU); plus the p10 and p90 of the first.  The models alternate, step by step and
    round by round, the one that goes first alternating too: the host's speed drifts by
    a tenth and more from second to second, and so it meets every model alike."""
    fns = [training_step(m, x, lr, autocast) for m in models]
    for fn in fns:
        for _ in range(warmup):
            fn()
    order = list(range(len(fns)))
    single = [[] for _ in fns]
    for i in range(steps):
        for j in order if i % 2 == 0 else order[::-1]:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fns[j]()
            end.record()
            end.synchronize()
            single[j].append(start.elapsed_time(end))
    loop = [[] for _ in fns]
    for r in range(rounds):
        for j in order if r % 2 == 0 else order[::-1]:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(steps):
                fns[j]()
            end.record()
            end.synchronize()
            loop[j].append(start.elapsed_time(end) / steps)
    return [
        (
            statistics.median(times),
            statistics.median(means),
            np.percentile(times, 10),
            np.percentile(times, 90),
        )
        for times, means in zip(single, loop)
    ]


def time_graphed(model, x, lr, steps, autocast=None) -> float:
    """The step captured once in a CUDA graph and replayed ``steps`` times back to back:
    ms per step with no host work between the kernels, so the figure is the GPU's alone
    (PyTorch's recipe for whole-network capture: warm up on a side stream, capture
    forward, backward and the optimizer's step, replay)."""
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    static_x = x.clone()

    def step():
        # autocast's cache of cast weights must be off under capture (PyTorch's docs)
        on = autocast is not None
        with torch.autocast("cuda", dtype=autocast, enabled=on, cache_enabled=False):
            loss = F.mse_loss(model(static_x), static_x)
        loss.backward()
        opt.step()

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            opt.zero_grad(set_to_none=True)
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        step()
    for _ in range(3):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        graph.replay()
    end.record()
    end.synchronize()
    return start.elapsed_time(end) / steps


def plot_losses(losses: dict, gpu: str, path: str) -> None:
    """The loss per step of each copy, and each fp32 copy's drift from float64."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (top, bottom) = plt.subplots(2, 1, figsize=(7, 6), sharex=True)
    steps = range(len(losses["float64"]))
    for key, label, style in (
        ("float64", "float64 (PyTorch)", "k-"),
        ("cudnn", "fp32, cuDNN", "C0--"),
        ("specgen", "fp32, specgen", "C1:"),
    ):
        top.plot(steps, losses[key], style, label=label)
    top.set_ylabel("MSE loss")
    top.legend()
    top.set_title(f"seed 003's autoencoder, B=128, same weights and batches ({gpu})")
    ref = losses["float64"]
    for key, label, style in (("cudnn", "cuDNN fp32", "C0o-"), ("specgen", "specgen fp32", "C1s-")):
        drift = [abs(a - b) / abs(b) for a, b in zip(losses[key], ref)]
        bottom.semilogy(steps, [max(d, 1e-12) for d in drift], style, label=label, markersize=3)
    bottom.set_ylabel("relative drift from float64")
    bottom.set_xlabel("training step")
    bottom.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


def profile(model, x, lr, autocast) -> str:
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
        time_steps([model], x, lr, 5, 0, autocast, rounds=1)
    return prof.key_averages().table(
        sort_by="cuda_time_total", row_limit=25, max_name_column_width=70
    )


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=40, help="training steps compared")
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--timed", type=int, default=50, help="steps timed per configuration")
    ap.add_argument(
        "--channels-last",
        action="store_true",
        help="time the steps with the models and the batch in channels_last memory",
    )
    ap.add_argument("--json", help="write the results here too")
    ap.add_argument("--plot", help="draw the loss curves here (PNG; needs matplotlib)")
    ap.add_argument(
        "--replot", metavar="JSON", help="only draw --plot from an earlier run's --json, then exit"
    )
    ap.add_argument(
        "--profile",
        action="store_true",
        help="print where the GPU time of a step goes (torch.profiler), each math",
    )
    args = ap.parse_args()
    if args.replot:
        with open(args.replot) as f:
            saved = json.load(f)
        plot_losses(saved["losses"], saved.get("gpu", ""), args.plot or "losses.png")
        return 0
    logging.basicConfig(level=logging.INFO, format="%(message)s")  # a line per kernel chosen
    torch.manual_seed(0)
    rng = np.random.default_rng(0)
    dev = torch.device("cuda")
    data = photographs_as_patches(args.batch * args.steps, rng).to(dev)
    batches = list(data.split(args.batch))

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cuda.matmul.allow_tf32 = False
    base = autoencoder().to(dev)
    ref64 = copy.deepcopy(base).double()
    cudnn32 = copy.deepcopy(base)
    ours32 = sg.convert(copy.deepcopy(base))
    t0 = time.time()
    sg.warmup(ours32, batches[0])
    print(f"specgen kernels ready in {time.time() - t0:.1f} s", file=sys.stderr)

    l64 = train(ref64, batches, args.lr, torch.float64)
    lcu = train(cudnn32, batches, args.lr)
    lsg = train(ours32, batches, args.lr)
    print(
        f"{'step':>4} {'float64':>12} {'cuDNN fp32':>12} {'specgen fp32':>12} "
        f"{'cuDNN drift':>11} {'specgen drift':>13}"
    )
    drift_cu, drift_sg = [], []
    for i, (a, b, c) in enumerate(zip(l64, lcu, lsg)):
        drift_cu.append(abs(b - a) / abs(a))
        drift_sg.append(abs(c - a) / abs(a))
        print(
            f"{i:>4} {a:>12.6f} {b:>12.6f} {c:>12.6f} {drift_cu[-1]:>11.2e} {drift_sg[-1]:>13.2e}"
        )
    worst_cu, worst_sg = max(drift_cu), max(drift_sg)
    agree = worst_sg <= 10 * max(worst_cu, 1e-6)
    print(
        f"largest relative drift from float64 over {args.steps} steps: cuDNN {worst_cu:.2e}, "
        f"specgen {worst_sg:.2e}: {'agree' if agree else 'DISAGREE'} (specgen within 10x "
        "cuDNN's own drift)"
    )

    rows = []
    x = batches[0]
    layout = torch.channels_last if args.channels_last else torch.contiguous_format
    x = x.contiguous(memory_format=layout)
    for label, tf32, autocast in (
        ("fp32", False, None),
        ("tf32", True, None),
        ("bf16 autocast", True, torch.bfloat16),
    ):
        torch.backends.cudnn.allow_tf32 = tf32
        torch.backends.cuda.matmul.allow_tf32 = tf32
        cu = copy.deepcopy(base).to(memory_format=layout)
        ours = sg.convert(copy.deepcopy(base)).to(memory_format=layout)
        with torch.autocast("cuda", dtype=autocast, enabled=autocast is not None):
            sg.warmup(ours, x)
        torch.backends.cudnn.benchmark = True
        t_cu, t_sg = time_steps([cu, ours], x, args.lr, args.timed, 10, autocast)
        g_cu = time_graphed(cu, x, args.lr, args.timed, autocast)
        g_sg = time_graphed(ours, x, args.lr, args.timed, autocast)
        if args.profile:
            for who, model in (("cuDNN", cu), ("specgen", ours)):
                print(f"\n{who}, {label}: GPU time of 5 steps by kernel")
                print(profile(model, x, args.lr, autocast))
        rows.append(
            dict(
                math=label,
                cudnn_ms=t_cu[0],
                specgen_ms=t_sg[0],
                cudnn_loop_ms=t_cu[1],
                specgen_loop_ms=t_sg[1],
                cudnn_p10_p90=t_cu[2:],
                specgen_p10_p90=t_sg[2:],
                cudnn_graph_ms=g_cu,
                specgen_graph_ms=g_sg,
            )
        )
    print(
        f"\ntraining step at B={args.batch} on {torch.cuda.get_device_name()}"
        f"{', channels_last' if args.channels_last else ''}, ms: the median "
        f"of {args.timed} single steps, the median over 5 rounds of the mean of {args.timed} "
        "steps back to back (cuDNN's and specgen's alternated, step by step and round by "
        f"round), and the mean of {args.timed} replays of the step captured in a CUDA graph"
    )
    head = f"{'cuDNN':>8} {'specgen':>8} {'speedup':>8}"
    print(f"{'math':<14} {head} {head} {head}")
    print(f"{'':<14} {'single steps':>26} {'back to back':>26} {'CUDA graph':>26}")
    for r in rows:
        cells = []
        for cu, sg_ in (("cudnn_ms", "specgen_ms"), ("cudnn_loop_ms", "specgen_loop_ms")):
            cells.append(f"{r[cu]:>8.3f} {r[sg_]:>8.3f} {r[cu] / r[sg_]:>7.2f}x")
        g = r["cudnn_graph_ms"], r["specgen_graph_ms"]
        cells.append(f"{g[0]:>8.3f} {g[1]:>8.3f} {g[0] / g[1]:>7.2f}x")
        print(f"{r['math']:<14} " + " ".join(cells))
    if args.plot:
        plot_losses(
            dict(float64=l64, cudnn=lcu, specgen=lsg), torch.cuda.get_device_name(), args.plot
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump(
                dict(
                    losses=dict(float64=l64, cudnn=lcu, specgen=lsg),
                    steps=rows,
                    agree=agree,
                    gpu=torch.cuda.get_device_name(),
                    channels_last=args.channels_last,
                ),
                f,
                indent=1,
            )
    return 0 if agree else 1


if __name__ == "__main__":
    sys.exit(main())
