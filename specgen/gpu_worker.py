"""Dask's preload for the GPU workers of an embedded tune cluster (``dist.connect``):
``dist.prepare`` (CUDA contexts, PyTorch imported, the card's ceilings) begun in a
thread as the worker starts, so that it runs beside the rest of the cluster's start
rather than after it.  A failure here is not the worker's: ``prepare_gpus``'s task runs
``prepare`` again and reports it."""

from __future__ import annotations

import threading


def _prepare() -> None:
    from .dist import prepare

    try:
        prepare()
    except Exception:  # said by the task that runs it again
        pass


def dask_setup(worker) -> None:
    """Dask calls this once in each worker process that preloads this module."""
    threading.Thread(target=_prepare, name="specgen-prepare", daemon=True).start()
