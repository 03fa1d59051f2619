"""The operator's host cost per call, where the GPU work is too small to hide it: wall
time of many calls on a tiny problem (one 8x8 image), specgen beside PyTorch's own
convolution, forward and forward+backward, then where specgen's time goes (cProfile).

    PYTHONPATH=. python3 scripts/dispatch_overhead.py
"""

import cProfile
import pstats
import time

import torch
import torch.nn.functional as F

import specgen.torch as sg


def per_call_us(fn, calls=2000):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def main():
    x = torch.randn(1, 8, 8, 8, device="cuda", requires_grad=True)
    w = torch.randn(8, 8, 3, 3, device="cuda", requires_grad=True)
    b = torch.randn(8, device="cuda", requires_grad=True)

    def fwd(conv):
        return lambda: conv(x.detach(), w.detach(), b.detach(), 1, 1)

    def both(conv):
        def run():
            y = conv(x, w, b, 1, 1)
            torch.autograd.grad(y, [x, w, b], torch.ones_like(y))

        return run

    torch.backends.cudnn.benchmark = True
    rows = [
        ("forward", per_call_us(fwd(F.conv2d)), per_call_us(fwd(sg.conv2d))),
        ("forward + backward", per_call_us(both(F.conv2d)), per_call_us(both(sg.conv2d))),
    ]
    print(f"{torch.cuda.get_device_name()}: host time per call, us (tiny problem)")
    print(f"{'':<20} {'PyTorch':>9} {'specgen':>9}")
    for what, a, c in rows:
        print(f"{what:<20} {a:>9.1f} {c:>9.1f}")
    prof = cProfile.Profile()
    run = both(sg.conv2d)
    prof.enable()
    for _ in range(500):
        run()
    prof.disable()
    torch.cuda.synchronize()
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
