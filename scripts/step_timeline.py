"""Host against GPU in the autoencoder's training step (B=128, channels_last), cuDNN
beside specgen: the host's wall and process time to enqueue one step, and from a
profiler trace of steps run back to back, the GPU's busy time and span per step, its
kernels per step and the kernels that take the most of it.  Where the span exceeds the
busy time, the GPU waited on the host; where the two match, the step is GPU-bound.

    PYTHONPATH=. python3 scripts/step_timeline.py [--math bf16]
"""

import argparse
import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, "examples")
sys.path.insert(0, "scripts")
import autoencoder as ae  # noqa: E402
from step_host import MATHS, models, setup  # noqa: E402


def host_times(step, steps=30):
    """Median wall and process ms to enqueue one step, each on an idle GPU."""
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    wall, cpu = [], []
    for _ in range(steps):
        t, c = time.perf_counter(), time.process_time()
        step()
        wall.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
        torch.cuda.synchronize()
    return 1e3 * statistics.median(wall), 1e3 * statistics.median(cpu)


def gpu_trace(step, steps=20):
    """(busy ms, span ms, kernels) per step, and {kernel name: total ms} per step."""
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    spans, names = [], {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA and e.time_range.end > 0:
            spans.append((e.time_range.start, e.time_range.end))
            names[e.name] = names.get(e.name, 0) + (e.time_range.end - e.time_range.start)
    spans.sort()
    busy, reach = 0.0, None
    for a, b in spans:
        if reach is None or a > reach:
            busy += b - a
            reach = b
        elif b > reach:
            busy += b - reach
            reach = b
    span = spans[-1][1] - spans[0][0] if spans else 0.0
    per = {n: t / steps / 1e3 for n, t in names.items()}
    return busy / steps / 1e3, span / steps / 1e3, len(spans) / steps, per


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--math", choices=list(MATHS), action="append")
    ap.add_argument("--top", type=int, default=12)
    args = ap.parse_args()
    x, base = setup()
    print(f"{torch.cuda.get_device_name()}: one step, ms (B=128, channels_last)")
    for math in args.math or ["bf16"]:
        cu, ours, autocast = models(base, x, math)
        for who, model in (("cuDNN", cu), ("specgen", ours)):
            step = ae.training_step(model, x, 0.05, autocast)
            wall, cpu = host_times(step)
            busy, span, kernels, per = gpu_trace(step)
            print(
                f"\n{math} {who}: host wall {wall:.3f}, host process {cpu:.3f}; GPU busy "
                f"{busy:.3f}, span {span:.3f}, {kernels:.0f} kernels a step"
            )
            for name, ms in sorted(per.items(), key=lambda kv: -kv[1])[: args.top]:
                print(f"  {ms:7.3f}  {name[:100]}")


if __name__ == "__main__":
    main()
