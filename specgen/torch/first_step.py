"""A model's first training step in a fresh process, the way a user's script meets it:
``python -m specgen.torch.first_step NAME BATCH IMAGE MODE ENGINE`` prints one JSON
line with the seconds the process took to import (PyTorch, and specgen's operator
where ENGINE is ``specgen``; either way specgen's package, whose ``model`` module
this uses), and from building the model to the end of its first
training step (forward, loss, backward, SGD; the GPU waited for), then the second
step's.  ``specgen model NAME --first-step`` runs it on cuDNN (``cudnn.benchmark``
on), and on specgen with an empty disk cache and again with that cache warm."""

from __future__ import annotations

import json
import sys
import time


def main(argv: list[str]) -> None:
    start = time.perf_counter()
    name, batch, image, mode_name, engine = argv
    import torch

    from . import model as m

    if engine == "specgen":
        import specgen.torch as sg
    imported = time.perf_counter() - start

    mode = m.MODES[mode_name]
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = mode.tf32
    torch.backends.cuda.matmul.allow_tf32 = mode.tf32

    begin = time.perf_counter()
    base = m.build(name)
    net = m._prepare(base, mode)
    if engine == "specgen":
        net = sg.convert(net)
    x, t = m._inputs(int(batch), int(image), mode, m._target(base, int(batch), int(image)))
    step = m.training_step(net, torch.optim.SGD(net.parameters(), lr=1e-3), x, t, mode)
    step()
    torch.cuda.synchronize()
    first = time.perf_counter() - begin
    begin = time.perf_counter()
    step()
    torch.cuda.synchronize()
    second = time.perf_counter() - begin
    print(
        json.dumps(
            dict(engine=engine, mode=mode_name, import_s=imported, first_s=first, second_s=second)
        )
    )


if __name__ == "__main__":
    main(sys.argv[1:])
