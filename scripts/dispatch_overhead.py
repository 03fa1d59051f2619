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

    # specgen's parts, each alone
    from specgen.shapes import Op
    from specgen.tensors import Role
    from specgen.torch import _engine as E

    ops = torch.ops.specgen
    xd, wd, bd = x.detach(), w.detach(), b.detach()
    y = sg.conv2d(xd, wd, bd, 1, 1)
    dy = torch.ones_like(y)
    args = ([1, 1], [1, 1, 1, 1], [1, 1], 1)
    lay, _ = E.layer(xd, wd, bd, (1, 1), (1, 1, 1, 1), (1, 1), 1)
    k, kd = lay.kernel(Op.FPROP, True, 1), lay.kernel(Op.DGRAD, False, 1)
    parts = [
        ("op conv2d", lambda: ops.conv2d(xd, wd, bd, *args)),
        ("op conv2d_input", lambda: ops.conv2d_input(dy, wd, list(x.shape), *args, False)),
        ("op conv2d_weight_bias", lambda: ops.conv2d_weight_bias(xd, dy, list(w.shape), *args)),
        ("pack_weights fprop", lambda: E.pack_weights(k, wd)),
        ("pack_weights dgrad", lambda: E.pack_weights(kd, wd)),
        ("torch.empty", lambda: torch.empty(y.shape, device="cuda")),
        (
            "enqueue fprop",
            lambda: k.conv.enqueue(
                {
                    Role.X: xd.data_ptr(),
                    Role.Y: y.data_ptr(),
                    Role.W: wd.data_ptr(),
                    Role.BIAS: bd.data_ptr(),
                },
                1,
                0,
                E.raw_stream(xd.device.index),
            ),
        ),
    ]
    print(f"\n{'part':<24} {'us':>8}")
    for what, fn in parts:
        print(f"{what:<24} {per_call_us(fn, 1000):>8.1f}")
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
