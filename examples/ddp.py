"""A converted model trained with DistributedDataParallel, beside the same model on
cuDNN: the same initial weights and the same batches on every rank.

    torchrun --nproc-per-node 2 examples/ddp.py [--steps 20] [--batch 64] [--model unet]
                                                [--image 32] [--bf16] [--lr RATE]
                                                [--rounds 4] [--timed 30]

Each rank (NCCL on GPUs, one GPU a rank; gloo on the CPU, where the operator runs
PyTorch's own convolution) trains two copies of a model from one seed: specgen's
(``sg.convert``) and PyTorch's, on its own shard of each batch, SGD with momentum,
gradients averaged by DDP, and a third copy in float64 (PyTorch's convolution) as the
losses' reference.  Rank 0 prints each step's three losses and, at the end, the largest
difference of cuDNN's and specgen's losses and of each from float64's, over the losses'
size, the kernels' devices, and the training step of cuDNN and specgen timed after
warm-up (CUDA events; the two in alternating rounds, median of the steps), one JSON line.
``--model unet`` is a small U-Net with ConvTranspose2d up-sampling, ``resnet18`` the
torchvision one (torchvision needed); ``--bf16`` trains both under bf16 autocast with
channels_last tensors.  With ``--nproc-per-node 1`` it is the one-GPU comparison.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

import specgen.torch as sg
from specgen.torch.model import UNet


def build(name: str) -> nn.Module:
    if name == "unet":
        return UNet()  # specgen model's built-in U-Net
    import torchvision

    return getattr(torchvision.models, name)(num_classes=10)


def batches(name: str, steps: int, batch: int, seed: int, image: int = 32):
    """The same batches on every rank (each takes its shard): images and targets."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(steps):
        x = torch.randn(batch, 3, image, image, generator=g)
        if name == "unet":
            yield x, x.clone()  # denoising: the clean image from a noisy one
        else:
            yield x, torch.randint(0, 10, (batch,), generator=g)


def loss_of(name: str, out, target):
    return F.mse_loss(out, target) if name == "unet" else F.cross_entropy(out, target)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch", type=int, default=64, help="the global batch, split over ranks")
    ap.add_argument("--model", default="unet", help="unet, or a torchvision model name")
    ap.add_argument("--timed", type=int, default=30, help="steps timed a model each round")
    ap.add_argument("--rounds", type=int, default=4, help="timing rounds, the order alternating")
    ap.add_argument("--image", type=int, default=32, help="image side in pixels")
    ap.add_argument("--bf16", action="store_true", help="bf16 autocast, channels_last tensors")
    ap.add_argument("--lr", type=float, help="SGD's rate (0.01 for the U-Net, else 0.001)")
    args = ap.parse_args()
    # A classifier on random labels at 0.01 diverges (resnet50 at 96x96: the loss from
    # 2.6 to 22 in 20 steps), and two diverging runs' losses part however close their
    # kernels are; at 0.001 it stays near ln(10).
    lr = args.lr or (0.01 if args.model == "unet" else 0.001)

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", rank))
    device = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
        torch.backends.cudnn.benchmark = True
        torch.backends.cudnn.allow_tf32 = False  # fp32 on both sides
    if args.batch % world:
        raise SystemExit(f"--batch {args.batch} does not split over {world} ranks")
    shard = args.batch // world

    torch.manual_seed(0)
    base = build(args.model)
    # float64: the losses' reference (PyTorch's own convolution; specgen's operator falls
    # back to it for float64 tensors too), from the same weights and batches
    reference = copy.deepcopy(base).double().to(device)
    models = {"cudnn": base.to(device), "specgen": sg.convert(copy.deepcopy(base)).to(device)}
    amp = torch.bfloat16 if args.bf16 else None
    fmt = torch.channels_last if args.bf16 else torch.contiguous_format
    for m in models.values():
        # before the wrap: DDP lays its gradient buckets out in the parameters' strides,
        # and a gradient in other strides is copied into its bucket at every step
        m.to(memory_format=fmt)
    runs = {}
    for k, m in (*models.items(), ("float64", reference)):
        wrapped = DDP(m, device_ids=[device.index] if cuda else None)
        runs[k] = (wrapped, torch.optim.SGD(wrapped.parameters(), lr=lr, momentum=0.9))

    def step(which, x, t):
        model, opt = runs[which]
        opt.zero_grad(set_to_none=True)
        if which == "float64":
            loss = loss_of(
                args.model, model(x.double()), t.double() if t.is_floating_point() else t
            )
        else:
            with torch.autocast(device.type, dtype=amp, enabled=amp is not None):
                loss = loss_of(args.model, model(x).float(), t)
        loss.backward()
        opt.step()
        return loss

    losses = {k: [] for k in runs}
    for x, t in batches(args.model, args.steps, args.batch, seed=1, image=args.image):
        x = x[rank * shard : (rank + 1) * shard].to(device).contiguous(memory_format=fmt)
        t = t[rank * shard : (rank + 1) * shard].to(device)
        for k in runs:
            loss = step(k, x, t).detach()
            dist.all_reduce(loss)  # the global batch's mean loss
            losses[k].append(float(loss) / world)
        if rank == 0:
            print(
                f"step {len(losses['cudnn']):3d}  cudnn {losses['cudnn'][-1]:.6f}  "
                f"specgen {losses['specgen'][-1]:.6f}  float64 {losses['float64'][-1]:.6f}",
                flush=True,
            )

    scale = max(abs(v) for v in losses["float64"])
    diff = max(abs(a - b) for a, b in zip(losses["cudnn"], losses["specgen"])) / scale
    # how far each run's losses drift from float64's over the same steps: the reordering
    # of fp32 (or bf16) sums, to which the cuDNN-specgen difference is compared
    drift = {
        k: max(abs(a - b) for a, b in zip(losses[k], losses["float64"])) / scale for k in models
    }
    # the devices specgen's layers (and so their kernels) were built for on this rank
    devices = sorted({lay.index for lay in sg._engine._layers.values()})
    times, rounds = {}, []
    if cuda:
        x, t = next(batches(args.model, 1, args.batch, seed=2, image=args.image))
        x, t = x[:shard].to(device).contiguous(memory_format=fmt), t[:shard].to(device)
        for k in models:
            for _ in range(5):
                step(k, x, t)
        # the two models in turns, the order swapped each round (cuDNN first, then
        # specgen first, ...): a drift of the host or of the other rank's pace falls on
        # both alike; each round's medians are reported beside the medians of all steps
        samples = {k: [] for k in models}
        for r in range(args.rounds):
            medians = {}
            for k in list(models)[:: 1 if r % 2 == 0 else -1]:
                taken = []
                for _ in range(args.timed):
                    start = torch.cuda.Event(enable_timing=True)
                    stop = torch.cuda.Event(enable_timing=True)
                    start.record()
                    step(k, x, t)
                    stop.record()
                    stop.synchronize()
                    taken.append(start.elapsed_time(stop))
                medians[k] = statistics.median(taken)
                samples[k] += taken
            rounds.append(medians)
        times = {k: statistics.median(v) for k, v in samples.items()}
    report = dict(
        model=args.model,
        math="bf16 autocast, channels_last" if args.bf16 else "fp32",
        image=args.image,
        world=world,
        batch=args.batch,
        steps=args.steps,
        lr=lr,
        max_loss_difference=diff,
        max_drift_from_float64=drift,
        kernel_devices=devices,
        device=str(device),
        step_ms=times,
        cudnn_over_specgen=times["cudnn"] / times["specgen"] if times else None,
        rounds=[dict(r, cudnn_over_specgen=r["cudnn"] / r["specgen"]) for r in rounds],
        gpu=torch.cuda.get_device_name(device) if cuda else "cpu",
        date=time.strftime("%Y-%m-%d"),
    )
    gathered = [None] * world
    dist.all_gather_object(gathered, report)
    if rank == 0:
        print(json.dumps(dict(report, ranks=gathered)))
    # the DDP wrappers hold the process group: dropped first, so that it ends here and
    # not in the interpreter's exit, where its threads may outlive what they wait on
    runs.clear()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
