import cProfile, pstats, sys, copy, time
import numpy as np, torch

sys.path.insert(0, "examples")
sys.path.insert(0, "scripts")
import autoencoder as ae
import specgen.torch as sg

torch.manual_seed(0)
x = (
    ae.photographs_as_patches(128, np.random.default_rng(0))
    .cuda()
    .contiguous(memory_format=torch.channels_last)
)
base = ae.autoencoder().cuda()
torch.backends.cudnn.allow_tf32 = True
ours = sg.convert(copy.deepcopy(base)).to(memory_format=torch.channels_last)
with torch.autocast("cuda", dtype=torch.bfloat16):
    sg.warmup(ours, x)
step = ae.training_step(ours, x, 0.05, torch.bfloat16)
for _ in range(10):
    step()
torch.cuda.synchronize()
# wall time of the enqueue of each part, without the profiler: 200 steps
from specgen.torch import _engine as E
import specgen.runtime as R

acc = {}


def timed(name, fn):
    def w(*a, **k):
        t = time.perf_counter_ns()
        r = fn(*a, **k)
        acc[name] = acc.get(name, 0) + time.perf_counter_ns() - t
        return r

    return w


E.launch = timed("launch", E.launch)
E.pack_weights = timed("pack_weights", E.pack_weights)
R.Launcher.__call__ = timed("Launcher.__call__", R.Launcher.__call__)
import torch as T

orig_empty = T.empty
steps = 200
for _ in range(steps):
    step()
    torch.cuda.synchronize()
for k, v in acc.items():
    print(f"{k:<20} {v / steps / 1e3:8.1f} us per step")
pr = cProfile.Profile()
pr.enable()
for _ in range(20):
    step()
pr.disable()
torch.cuda.synchronize()
st = pstats.Stats(pr)
st.sort_stats("cumtime").print_callees("launch")
