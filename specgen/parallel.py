"""Compile many variants at once: NVRTC runs on the CPU, one process per core."""

from __future__ import annotations

import multiprocessing
import signal
import sys
import threading
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass

import click

from .compile import cache_writable, cached, compile_source
from .errors import SpecError
from .plan import make_plan
from .render import render
from .strategies.wsplit import with_fp32_grads


@dataclass(frozen=True)
class Source:
    """A kernel source of the operator's own to fill the cache with (batch norm's): its
    first function's name and its text, compiled for the arch as given.  It stands in
    an item's place of the shape, with None for the variant."""

    name: str
    text: str


def _plan(shape, variant, grads32: str = ""):
    """The plan compiled for (shape, variant): with ``grads32`` ("mcrs" or "mrsc"), the
    wgrad the PyTorch operator runs for fp32 weights, its sums written in fp32 in that
    order where its second pass can (``with_fp32_grads``)."""
    plan = make_plan(shape, variant)
    return (with_fp32_grads(plan, grads32) or plan) if grads32 else plan


def _compile_one(shape, variant, arch, grads32: str = ""):
    if isinstance(shape, Source):
        try:
            compile_source(shape.text, shape.name, arch)
            return shape.name, None
        except RuntimeError as e:
            return shape.name, str(e)
    try:
        plan = _plan(shape, variant, grads32)
    except SpecError as e:  # a plan refused: that item's error, not the rest's
        return variant.name, str(e)
    try:
        compile_source(render(plan), plan.name, plan.target(arch))
        return plan.name, None
    except (RuntimeError, SpecError) as e:  # a compile error, or an architecture it needs
        return plan.name, str(e)


def _in_cache(results, arch, shape, variant, grads32: str = "") -> bool:
    """Whether the variant's kernel is in the disk cache already (noted in
    ``results``); one the planner refuses is left to ``_compile_one`` to report."""
    if isinstance(shape, Source):
        if cached(shape.text, arch):
            results[shape.name] = None
            return True
        return False
    try:
        plan = _plan(shape, variant, grads32)
        if not cached(render(plan), plan.target(arch)):
            return False
    except SpecError:
        return False
    results[plan.name] = None
    return True


def _ignore_interrupts():
    """A worker leaves Ctrl-C to its parent, which ends every worker at once (the
    terminal sends SIGINT to the whole process group)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


@contextmanager
def _started_ignoring_interrupts():
    """Worker processes started inside ignore Ctrl-C from their first instruction: an
    ignored signal stays ignored across exec, where a handler does not, so this process
    ignores SIGINT while the pool starts them (milliseconds).  ``_ignore_interrupts``
    comes only once a worker has imported specgen; a Ctrl-C before then printed the
    worker's traceback and killed it mid-start (2 busy cores).  Only the main thread
    may set a handler; elsewhere the workers are started as they are."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _compile_item(item):
    shape, variant, arch, *grads32 = item
    return _compile_one(shape, variant, arch, *grads32)


@contextmanager
def _main_left_alone():
    """Worker processes started inside do not run the caller's main script.

    A spawned worker re-imports ``__main__`` (from its file, or by its module name under
    ``python -m``) before its first task, so a script that converts a model at top level,
    with no ``if __name__ == "__main__"`` guard, would run again in every worker: timing
    and training beside its parent.  The workers need only specgen's own functions, so
    while the pool starts, ``__main__`` names neither a file nor a module."""
    main = sys.modules.get("__main__")
    if main is None:  # an embedding interpreter may have none
        yield
        return
    saved = {k: main.__dict__[k] for k in ("__file__", "__spec__") if k in main.__dict__}
    try:
        main.__dict__.pop("__file__", None)
        main.__spec__ = None
        yield
    finally:
        main.__dict__.pop("__spec__", None)
        main.__dict__.update(saved)


@contextmanager
def apart(fn, *args):
    """``fn(*args)`` in a spawned process of its own, for work that should not share
    this one's interpreter lock (importing PyTorch beside Dask's event loop, say):
    yields its future.  The process starts with ``__main__`` left alone and Ctrl-C
    ignored, as compile workers do; it is told to end with the block, and killed where
    the block ends in an exception (an interrupt: nothing waits for its work)."""
    from concurrent.futures import ProcessPoolExecutor

    pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
    try:
        with _main_left_alone(), _started_ignoring_interrupts():
            future = pool.submit(fn, *args)  # the process starts here
        yield future
    except BaseException:
        for process in list((getattr(pool, "_processes", None) or {}).values()):
            process.kill()
        raise
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def _pool(processes: int):
    """A pool of compile workers: spawned (a CUDA context must not be forked), with
    ``__main__`` left alone and Ctrl-C left to this process."""
    ctx = multiprocessing.get_context("spawn")
    with _main_left_alone(), _started_ignoring_interrupts():
        return ctx.Pool(processes, initializer=_ignore_interrupts)


def precompile(items, arch: str, jobs: int, label: str = "compiling") -> dict[str, str | None]:
    """Fill the disk cache for every (shape, variant) or (shape, variant, grads32) (the
    wgrad the operator runs for fp32 weights, ``_plan``), or (``Source``, None); returns
    name -> error or None, a plan the planner refuses under its variant's name.  (Raised
    in a worker, a refusal once ended the pool, and the cleanup below then waited forever
    on the task queue's lock, which a killed idle worker held.)
    With no writable cache there is nothing to fill: each variant compiles when used.
    Interrupted (Ctrl-C, or SIGTERM through the CLI), it ends its workers at once rather
    than finish the queue; every cache entry is whole (written, then renamed)."""
    results = {}
    if not cache_writable(arch):
        return results
    items = [it for it in items if not _in_cache(results, arch, *it)]
    if not items:  # a warm cache: no worker processes started (a second or two)
        return results
    if jobs <= 1 or len(items) <= 1:
        for shape, v, *grads32 in items:
            name, err = _compile_one(shape, v, arch, *grads32)
            results[name] = err
        return results
    pool = _pool(min(jobs, len(items)))
    try:
        work = pool.imap_unordered(_compile_item, [(s, v, arch, *g) for s, v, *g in items])
        with click.progressbar(length=len(items), label=label, file=sys.stderr) as bar:
            for name, err in work:
                results[name] = err
                bar.update(1)
        pool.close()
        pool.join()
    except BaseException:  # an interrupt mid-compile, or while the workers were exiting
        # a compile's entry is not renamed until whole: there is nothing to save
        _end_now(pool)
        raise
    return results


def _end_now(pool) -> None:
    """``pool`` ended at once: its workers killed, then its own cleanup.  terminate()'s
    SIGTERM alone is not enough: a worker that Ctrl-C caught while it was still starting
    (before it ignores SIGINT) was seen to live on, and terminate() then waited for it
    forever (2 busy cores).  But a worker waiting for work holds the task queue's read
    lock, and killed it never lets go: terminate()'s drain of the queue then waited on
    that lock forever (Ctrl-C while the last compiles ran, with workers idle).  With no
    worker left to read the queue, the drain takes a lock of its own."""
    workers = list(getattr(pool, "_pool", ()))
    for worker in workers:
        worker.kill()
    for worker in workers:
        worker.join()
    pool._inqueue._rlock = multiprocessing.get_context("spawn").Lock()
    pool.terminate()
    pool.join()


def _compile_numbered(numbered):
    i, item = numbered
    return i, _compile_item(item)


class Compiling:
    """``precompile``'s work in the background: the items go to a pool of ``jobs``
    processes in the order given, and the caller goes on, waiting only for the items of
    one key (``wait``) where it needs them.  A model's autotuning tunes the problems it
    meets first while the candidates of the ones it meets later still compile.  ``key``
    groups the items (default: their problem's spec); ``results`` maps each finished
    kernel's name to its error or None, as ``precompile`` returns them."""

    def __init__(self, items, arch: str, jobs: int, key=lambda item: item[0].spec):
        items = list(items)
        self.results: dict[str, str | None] = {}
        self._keys = [key(it) for it in items]
        self._left = Counter(self._keys)
        self._changed = threading.Condition()
        self.over = not items or not cache_writable(arch)
        if self.over:
            return
        self._pool = _pool(min(jobs, len(items)))
        numbered = list(enumerate((s, v, arch, *g) for s, v, *g in items))
        work = self._pool.imap_unordered(_compile_numbered, numbered)
        threading.Thread(target=self._collect, args=(work,), daemon=True).start()

    def _collect(self, work) -> None:
        try:
            for i, (name, err) in work:
                with self._changed:
                    self.results[name] = err
                    self._left[self._keys[i]] -= 1
                    self._changed.notify_all()
            self._pool.close()
            self._pool.join()
        except BaseException:  # the workers gone (the process ending): nothing to save
            self._pool.terminate()
        finally:
            with self._changed:
                self.over = True
                self._changed.notify_all()

    def wait(self, key, timeout: float | None = None) -> bool:
        """Until every item of ``key`` is compiled (at once where it has none), or
        ``timeout`` seconds have passed; returns whether they are."""
        with self._changed:
            return self._changed.wait_for(lambda: self.over or self._left[key] <= 0, timeout)

    def join(self) -> dict[str, str | None]:
        """Until every item is compiled; returns ``results``."""
        with self._changed:
            self._changed.wait_for(lambda: self.over)
        return self.results
