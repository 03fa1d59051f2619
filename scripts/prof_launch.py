"""Where the operator's launch path spends its host time in the bf16 autocast step
(B=128, channels_last): wall time per step of ``launch``, ``pack_weights`` and the
driver launches, over 200 steps, then cProfile's callees of ``launch``.

    PYTHONPATH=. python3 scripts/prof_launch.py
"""

import pstats
import sys
import time

import torch

sys.path.insert(0, "examples")
sys.path.insert(0, "scripts")
import autoencoder as ae  # noqa: E402
from step_host import models, profiled, setup  # noqa: E402

import specgen.runtime as R  # noqa: E402
from specgen.torch import _engine as E  # noqa: E402


def main():
    x, base = setup()
    _, ours, autocast = models(base, x, "bf16")
    step = ae.training_step(ours, x, 0.05, autocast)
    for _ in range(10):
        step()
    torch.cuda.synchronize()
    spent = {}

    def timed(name, fn):
        def run(*a, **k):
            t = time.perf_counter_ns()
            out = fn(*a, **k)
            spent[name] = spent.get(name, 0) + time.perf_counter_ns() - t
            return out

        return run

    E.launch = timed("launch", E.launch)
    E.pack_weights = timed("pack_weights", E.pack_weights)
    R.Launcher.__call__ = timed("Launcher.__call__", R.Launcher.__call__)
    steps = 200
    for _ in range(steps):
        step()
        torch.cuda.synchronize()
    for name, ns in spent.items():
        print(f"{name:<20} {ns / steps / 1e3:8.1f} us per step")
    pstats.Stats(profiled(step)).sort_stats("cumtime").print_callees("launch")


if __name__ == "__main__":
    main()
