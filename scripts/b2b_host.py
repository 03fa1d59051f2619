"""Why the operator's eager steps queued back to back take longer than its single
steps (issue 14): the host's wall and process time per step on an idle queue and
back to back (before the final wait), the spread of the back-to-back steps' host wall
times (a periodic stall shows in the tail), and from a profiler trace of back-to-back
steps the CUDA runtime and driver calls by total host time (a hidden wait shows
there).  cuDNN beside specgen.

    PYTHONPATH=. python3 scripts/b2b_host.py [--math bf16] [--steps 50]
"""

import argparse
import sys
import time

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, "examples")
sys.path.insert(0, "scripts")
import autoencoder as ae  # noqa: E402
from step_host import MATHS, models, setup  # noqa: E402
from step_timeline import host_times  # noqa: E402


def back_to_back(step, steps):
    torch.cuda.synchronize()
    walls = []
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        t = time.perf_counter()
        step()
        walls.append(1e3 * (time.perf_counter() - t))
    t1, c1 = time.perf_counter(), time.process_time()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    return (
        1e3 * (t1 - t0) / steps,
        1e3 * (c1 - c0) / steps,
        1e3 * (t2 - t0) / steps,
        np.percentile(walls, [10, 50, 90, 100]),
    )


def runtime_calls(step, steps, top):
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    rows = []
    for e in prof.key_averages():
        if e.key.startswith(("cuda", "cu")) or "Synchronize" in e.key or "alloc" in e.key.lower():
            rows.append((e.cpu_time_total / steps / 1e3, e.count / steps, e.key))
    rows.sort(reverse=True)
    return rows[:top]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--math", choices=list(MATHS), default="bf16")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    x, base = setup()
    cu, ours, autocast = models(base, x, args.math)
    print(f"{torch.cuda.get_device_name()}, {args.math}, B=128 channels_last: ms per step")
    for who, model in (("cuDNN", cu), ("specgen", ours)):
        step = ae.training_step(model, x, 0.05, autocast)
        w, c = host_times(step)  # each step on an idle queue
        bw, bc, total, spread = back_to_back(step, args.steps)
        p10, p50, p90, top = spread
        print(
            f"\n{who}: idle queue host wall {w:.3f} process {c:.3f}; back to back host wall "
            f"{bw:.3f} process {bc:.3f}, with the drain {total:.3f}; a step's host wall p10 "
            f"{p10:.3f} p50 {p50:.3f} p90 {p90:.3f} max {top:.3f}"
        )
        print("  runtime/driver calls back to back (host ms per step, calls per step):")
        for ms, n, key in runtime_calls(step, 20, args.top):
            print(f"    {ms:7.3f} {n:6.1f}  {key[:90]}")


if __name__ == "__main__":
    main()
