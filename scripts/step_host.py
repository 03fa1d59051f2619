"""Host time of the autoencoder's training step (examples/autoencoder.py, B=128,
channels_last), specgen beside PyTorch+cuDNN, per math: the CPU time a step takes to
enqueue (process time, so waiting on the GPU does not count), then where specgen's goes
(cProfile, sorted by own time).

    PYTHONPATH=. python3 scripts/step_host.py [--math bf16]
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--math", choices=list(MATHS), action="append")
    args = ap.parse_args()
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
