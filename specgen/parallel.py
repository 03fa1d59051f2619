"""Compile many variants at once: NVRTC runs on the CPU, one process per core."""

from __future__ import annotations

import multiprocessing
import sys
from concurrent.futures import ProcessPoolExecutor, as_completed

import click

from .compile import cache_writable, compile_source
from .errors import SpecError
from .plan import make_plan
from .render import render


def _compile_one(shape, variant, arch):
    plan = make_plan(shape, variant)
    try:
        compile_source(render(plan), plan.name, plan.target(arch))
        return plan.name, None
    except (RuntimeError, SpecError) as e:  # a compile error, or an architecture it needs
        return plan.name, str(e)


def precompile(items, arch: str, jobs: int, label: str = "compiling") -> dict[str, str | None]:
    """Fill the disk cache for every (shape, variant); returns name -> error or None.
    With no writable cache there is nothing to fill: each variant compiles when used."""
    results = {}
    if not cache_writable(arch):
        return results
    if jobs <= 1 or len(items) <= 1:
        for shape, v in items:
            name, err = _compile_one(shape, v, arch)
            results[name] = err
        return results
    ctx = multiprocessing.get_context("spawn")  # a CUDA context must not be forked
    with ProcessPoolExecutor(max_workers=jobs, mp_context=ctx) as pool:
        futures = [pool.submit(_compile_one, s, v, arch) for s, v in items]
        with click.progressbar(length=len(futures), label=label, file=sys.stderr) as bar:
            for f in as_completed(futures):
                name, err = f.result()
                results[name] = err
                bar.update(1)
    return results
