"""A model's first training step in a fresh process, the way a user's script meets it:
``python -m specgen.torch.first_step NAME BATCH IMAGE MODE ENGINE`` prints one JSON
line of seconds:

* ``import_s``: PyTorch, torchvision, and specgen's operator where ENGINE is
  ``specgen`` (run as ``-m``, the package's own import comes before the clock starts;
  ``first_steps`` starts it with the process);
* ``setup_s``: the model built, converted and moved to the GPU (CUDA's start), and a
  batch made;
* ``first_s``: the first training step (forward, loss, backward, SGD; the GPU waited
  for): every kernel chosen, compiled or read from the disk cache, and loaded, where
  cuDNN times its candidates (``cudnn.benchmark``);
* ``second_s``: the second step.

``specgen model NAME --first-step`` runs it on cuDNN, and on specgen with an empty disk
cache and again with that cache warm."""

from __future__ import annotations

import importlib
import json
import sys
import time


def main(argv: list[str], start: float | None = None) -> None:
    """``start``: the process's ``perf_counter`` when it started, where imports came
    before ``main`` was called."""
    start = time.perf_counter() if start is None else start
    name, batch, image, mode_name, engine = argv
    import torch

    from . import model as m

    if engine == "specgen":
        import specgen.torch as sg
    if name not in m.BUILT_IN:  # as a script that builds a torchvision model
        importlib.import_module("torchvision")
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
    torch.cuda.synchronize()
    setup = time.perf_counter() - begin
    times = []
    for _ in range(2):
        begin = time.perf_counter()
        step()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - begin)
    report = dict(engine=engine, mode=mode_name, import_s=imported, setup_s=setup)
    print(json.dumps(dict(report, first_s=times[0], second_s=times[1])))


if __name__ == "__main__":
    main(sys.argv[1:])
