"""Host time of a training step, specgen beside PyTorch+cuDNN, per math.

The CPU time a step takes to enqueue (process time, so waiting on the GPU does not
count), then where specgen's goes (cProfile, sorted by own time; cupy's
``launchKernel`` calls are its launches).  The autoencoder's step (examples/autoencoder.py, B=128, channels_last), or
with ``--model`` the step ``specgen model`` times (a torchvision model or unet, fp32 and
tf32 in NCHW, bf16 autocast in channels_last).

    PYTHONPATH=. python3 scripts/step_host.py [--math bf16]
    PYTHONPATH=. python3 scripts/step_host.py --model resnet18 --batch 128 --image 32 --math fp32
"""

import argparse
import copy
import cProfile
import pstats
import sys
import time

import numpy as np
import torch

sys.path.insert(0, "examples")
import autoencoder as ae  # noqa: E402

import specgen.torch as sg  # noqa: E402

MATHS = {"fp32": (False, None), "tf32": (True, None), "bf16": (True, torch.bfloat16)}


def host_ms(step, steps=30):
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    used = []
    for _ in range(steps):
        t = time.process_time()
        step()
        used.append(time.process_time() - t)
        torch.cuda.synchronize()  # the next step starts on an idle queue
    return 1e3 * float(np.median(used))


class Tally:
    """Calls and host nanoseconds, by key, of the functions ``wrap`` times (the dev
    scripts' timers on the operator's path)."""

    def __init__(self):
        self.spent, self.calls = {}, {}

    def wrap(self, fn, key):
        """``fn`` timed: each call's host time added under ``key``, or under
        ``key(*args)`` where it is a function of the call's arguments."""

        def run(*a, **k):
            t = time.perf_counter_ns()
            try:
                return fn(*a, **k)
            finally:
                name = key(*a, **k) if callable(key) else key
                self.spent[name] = self.spent.get(name, 0) + time.perf_counter_ns() - t
                self.calls[name] = self.calls.get(name, 0) + 1

        return run


def profiled(step, steps=20) -> cProfile.Profile:
    """cProfile's record of ``steps`` steps (the GPU drained after)."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        step()
    prof.disable()
    torch.cuda.synchronize()
    return prof


def setup():
    """The batch (B=128, channels_last) and the model's initial weights, on the GPU."""
    torch.manual_seed(0)
    x = ae.photographs_as_patches(128, np.random.default_rng(0)).cuda()
    return x.contiguous(memory_format=torch.channels_last), ae.autoencoder().cuda()


def models(base, x, math):
    """cuDNN's model and specgen's (its kernels chosen and compiled), both channels_last,
    with PyTorch set for ``math``; and the autocast dtype of that math."""
    tf32, autocast = MATHS[math]
    torch.backends.cudnn.allow_tf32 = tf32
    torch.backends.cudnn.benchmark = True
    cu = copy.deepcopy(base).to(memory_format=torch.channels_last)
    ours = sg.convert(copy.deepcopy(base)).to(memory_format=torch.channels_last)
    with torch.autocast("cuda", dtype=autocast, enabled=autocast is not None):
        sg.warmup(ours, x)
    return cu, ours, autocast


def ready_step(math: str, warm: int = 1):
    """The batch, cuDNN's model and specgen's, autocast's dtype, and specgen's training
    step, run ``warm`` times and drained: what the dev scripts start from."""
    x, base = setup()
    cu, ours, autocast = models(base, x, math)
    step = ae.training_step(ours, x, 0.05, autocast)
    for _ in range(warm):
        step()
    torch.cuda.synchronize()
    return x, cu, ours, autocast, step


def model_steps(name: str, batch: int, image: int, math: str) -> dict:
    """cuDNN's and specgen's training steps of ``specgen model``'s model ``name``, set up
    as it sets them up (``cudnn.benchmark`` on, tf32 as the math says), each run once."""
    from specgen.torch import model as m

    mode = m.MODES[math]
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = mode.tf32
    torch.backends.cudnn.benchmark = True
    base = m.build(name)
    x, t = m._inputs(batch, image, mode, m._target(base, batch, image), seed=1)
    steps = {}
    for who in ("cuDNN", "specgen"):
        net = m._prepare(copy.deepcopy(base), mode)
        net = sg.convert(net) if who == "specgen" else net
        steps[who] = m.training_step(net, torch.optim.SGD(net.parameters(), lr=1e-3), x, t, mode)
        steps[who]()
    torch.cuda.synchronize()
    return steps


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--math", choices=list(MATHS), action="append")
    ap.add_argument("--model", help="a model of specgen model (default: the autoencoder)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--image", type=int, default=224)
    args = ap.parse_args()
    if args.model:
        print(
            f"{torch.cuda.get_device_name()}: {args.model}, B={args.batch}, {args.image}x{args.image}"
        )
        print("host (CPU) time to enqueue one step, ms")
        print(f"{'math':<6} {'cuDNN':>8} {'specgen':>8}")
        profiles = []
        for math in args.math or list(MATHS):
            steps = model_steps(args.model, args.batch, args.image, math)
            print(f"{math:<6} {host_ms(steps['cuDNN']):>8.3f} {host_ms(steps['specgen']):>8.3f}")
            profiles.append((math, profiled(steps["specgen"])))
        for math, prof in profiles:
            print(f"\nspecgen {math}: 20 steps, by own time")
            pstats.Stats(prof).sort_stats("tottime").print_stats(30)
        return
    x, base = setup()
    print(f"{torch.cuda.get_device_name()}: host (CPU) time to enqueue one step, ms")
    print(f"{'math':<6} {'cuDNN':>8} {'specgen':>8}")
    profiles = []
    for math in args.math or list(MATHS):
        cu, ours, autocast = models(base, x, math)
        step = ae.training_step(ours, x, 0.05, autocast)
        print(
            f"{math:<6} {host_ms(ae.training_step(cu, x, 0.05, autocast)):>8.3f} {host_ms(step):>8.3f}"
        )
        profiles.append((math, profiled(step)))
    for math, prof in profiles:
        print(f"\nspecgen {math}: 20 steps, by own time")
        pstats.Stats(prof).sort_stats("tottime").print_stats(22)


if __name__ == "__main__":
    main()
