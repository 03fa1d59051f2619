"""Host time of the ways PyTorch allocates an operator's output (a channels_last bf16
activation and a contiguous one), each timed over many calls on an idle GPU, to pick
the cheapest for ``specgen.torch._engine.empty``.

    PYTHONPATH=. python3 scripts/alloc_micro.py
"""

import time

import torch


def us(fn, calls=20000):
    for _ in range(200):
        fn()
    t = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - t) / calls * 1e6


def main():
    dev = torch.device("cuda", 0)
    x = torch.empty(128, 256, 32, 32, dtype=torch.bfloat16, device=dev)
    cl = x.contiguous(memory_format=torch.channels_last)
    size = (128, 256, 32, 32)
    strides = cl.stride()
    dt, fmt = torch.bfloat16, torch.channels_last
    ways = [
        (
            "torch.empty(size, dtype, device, memory_format)",
            lambda: torch.empty(size, dtype=dt, device=dev, memory_format=fmt),
        ),
        (
            "  ... with like.dtype, like.device",
            lambda: torch.empty(size, dtype=cl.dtype, device=cl.device, memory_format=fmt),
        ),
        ("torch.empty(size, dtype, device)", lambda: torch.empty(size, dtype=dt, device=dev)),
        (
            "torch.empty_strided(size, strides, dtype, device)",
            lambda: torch.empty_strided(size, strides, dtype=dt, device=dev),
        ),
        ("like.new_empty(size)", lambda: cl.new_empty(size)),
        ("torch.empty_like(like)", lambda: torch.empty_like(cl)),
        ("like.new_empty_strided(size, strides)", lambda: cl.new_empty_strided(size, strides)),
    ]
    print(f"{torch.cuda.get_device_name()}: host us per allocation (median of 3 runs)")
    for what, fn in ways:
        print(f"{what:<52} {sorted(us(fn) for _ in range(3))[1]:>7.2f}")


if __name__ == "__main__":
    main()
