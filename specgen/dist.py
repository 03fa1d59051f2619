"""Tuning many problems at once on Dask distributed: every problem x op x candidate a
work item, fanned out over a cluster's workers, every finished item recorded once in
the results database by the client.

The engine is Dask's (``distributed``, the ``dist`` extra): an embedded
``LocalCluster`` of processes by default, or an existing cluster (``--scheduler``)
whose workers may be on other hosts.  The client alone writes the database, in the
order results arrive, so no two workers race on one file; an item already there (by
its key: problem, batch, variant, source hash, and the compiler it was built with) is
not sent again, so an interrupted run resumes where it stopped.  A worker that dies
mid-item has its items run again elsewhere (Dask's own rescheduling); one that kills
every worker it meets is recorded as failed, with the reason.

Two phases, pipelined: the compile phase on CPU processes (each item planned,
rendered, compiled for the architecture and its resources checked against the plan;
``--compile-only`` runs it alone, with no GPU), and the GPU phase on GPU workers, one
per GPU (pinned with ``CUDA_VISIBLE_DEVICES``, Dask resource ``GPU=1``), one problem in
one math a task, started once its items' compiles have ended: each candidate verified
against float64 and timed beside cuDNN's time for the problem on that card, then the
three best timed again together, interleaved; the fastest is the winner the operator
then uses.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import datetime
import faulthandler
import logging
import os
import threading
import time
from dataclasses import asdict, dataclass, replace
from typing import NamedTuple

from . import tunedb
from .errors import SpecError
from .shapes import ConvProblem, DType, Op, parse_shape
from .variants import Precision

DIST_EXTRA = "tuning on Dask needs dask and distributed: pip install 'specgen[dist]'"


@dataclass(frozen=True)
class Item:
    """One candidate of one problem: what a worker gets, and the key its record has."""

    spec: str  # the problem, with its op
    batch: int
    precision: str
    variant: str
    source: str  # the hash of its rendered source

    @property
    def key(self) -> tuple:
        return (self.spec, self.batch, self.variant, self.source)

    @property
    def group(self) -> tuple:
        """The problem and math whose winner this item competes for."""
        return (self.spec, self.batch, self.precision)

    def problem(self) -> ConvProblem:
        return replace(parse_shape(self.spec), batch=self.batch)


def problems_file(path) -> list[ConvProblem]:
    """One spec a line (presets' names too); blank lines and ``#`` comments skipped.
    A bad line is one SpecError naming it."""
    try:
        text = open(path, encoding="utf-8").read()
    except (OSError, UnicodeDecodeError) as e:
        raise SpecError(f"cannot read --problems {path}: {getattr(e, 'strerror', None) or e}")
    out = []
    for number, line in enumerate(text.splitlines(), start=1):
        spec = line.split("#", 1)[0].strip()
        if not spec:
            continue
        try:
            out.append(parse_shape(spec))
        except SpecError as e:
            raise SpecError(f"--problems {path} line {number}: {e}") from None
    if not out:
        raise SpecError(f"--problems {path} names no problem")
    return out


def searched(problems, gpu: str, arch: str | None = None, strategy=None) -> list[tuple]:
    """What a whole-model tune searches: (problem, precision, floor, keep) for each
    problem and each math a PyTorch user gets for it (``choose.maths``, tf32 allowed),
    the problem in the layout the operator computes that math in (``choose.
    computed_problem``: an NCHW layer whose tensor-core pick is in NHWC is tuned there,
    a few-channel wgrad over its padded channels; a window wider than its maps both
    whole and cropped to the taps that meet x, ``choose.cropped``),
    from the untuned pick's speed class up (``tune.prune``, ``choose.search_floor``), the
    pick kept.  fp32 math of a 16-bit layer whose own pick is on the tensor cores is
    left out: it is slower, and never picked (depthwise layers aside).  An op of fp32
    tensors is searched in both layouts where the other has tensor-core kernels too
    (every op on sm_90a, ``wgplanar`` reading NCHW; the wgrads elsewhere, ``tc3wgrad`` in
    NCHW and ``tcwgrad`` in NHWC): the operator then computes it where its winner with
    the tensors moved there is faster (``choose.computed_layout``).  The layout it
    computes in follows the winners, so a search of that one alone would never time the
    other again (resnet18's 14x14 fp32 layers stayed on an NHWC winner that the NCHW
    kernels had come to beat), and a compile phase without them (``gpu`` "") would
    compile another set than the timed one.  ``strategy`` (a ``Variant`` class): that
    strategy's space alone (``strategy_searches``)."""
    from .choose import computed_problem, cropped, maths

    if strategy is not None:
        return strategy_searches(problems, gpu, arch, strategy)
    out = []
    # a window wider than its maps in both forms, whole and cropped to the taps that meet
    # x: the operator takes the crop by the two forms' measured winners (choose._crop_pays)
    forms = [form for p in problems for form in dict.fromkeys((p, cropped(p)))]
    for p in forms:
        for precision in maths(p, allow_tf32=True):
            tf32 = precision is Precision.TF32
            try:
                q = computed_problem(p, gpu, tf32, arch, crop=False)
            except SpecError:
                out.append((p, precision, 0, ()))
                continue
            other = replace(q, layout=q.layout.other)
            # (not a first layer's over padded channels: the operator looks its other
            # layout up unpadded)
            both = (
                p.op is not Op.BGRAD
                and p.dtype is DType.FP32
                and q.C == p.C
                and _on_tensor_cores(other, tf32, arch)
            )
            for r in sorted((q, other) if both else (q,), key=lambda r: r.layout.value):
                out += _search(r, precision, arch, gpu)
    return list(dict.fromkeys(out))


def strategy_searches(problems, gpu: str, arch: str | None, strategy) -> list[tuple]:
    """``searched`` narrowed to one strategy, asked for by name: its searches (the same
    problems, maths and layouts) where the strategy computes the op in a math it has,
    each over the whole of its space (no floor), the strategy's key a fifth member.
    With ``gpu`` named, the kernel the operator runs there now is kept beside the space
    where it is of that math (the planner's pick only where it is that kernel), so the
    winner is one that ran faster than it in the same run: a winner shipped on its
    tune's time beside an older tune's (resnet18's layer3.0.conv1 wgrad at 32x32,
    0.0098 ms against 0.0099) had run 0.0102 ms against that kernel's 0.0066 in the
    model's layer table; and where the shipped winner was the planner's pick and was
    left out, a wdw-only tune recorded a winner twice its time (mobilenet_v2's 7x7
    depthwise wgrad of 960 channels, 0.035 ms against wlane's 0.014), which the
    operator then ran.  A search whose problem the strategy cannot serve lists no
    items."""
    out = []
    for p, precision, _, _ in searched(problems, gpu, arch):
        if precision not in strategy.precisions:
            continue
        try:
            strategy.problem_for(p)
        except SpecError:
            continue  # another op
        now = running(p, precision, gpu, arch)
        out.append((p, precision, 0, (now,) if now else (), strategy.key))
    return list(dict.fromkeys(out))


def running(p: ConvProblem, precision: Precision, gpu: str, arch: str | None):
    """The kernel the operator runs for ``p`` on ``gpu`` now (its tuned or shipped
    winner, else the planner's pick: ``choose.choose``) where it is of ``precision``'s
    math; None where it is not, where ``gpu`` is "" (a compile phase) or where nothing
    serves ``p``."""
    from .choose import choose

    if not gpu:
        return None
    try:
        now = choose(p, gpu, precision is Precision.TF32, arch).variant
    except SpecError:
        return None
    return now if now.precision is precision else None


def _on_tensor_cores(p: ConvProblem, tf32: bool, arch: str | None) -> bool:
    """Whether the planner's pick for ``p`` runs on the tensor cores."""
    from .choose import planned

    try:
        return planned(p, tf32, arch).variant.tensor_core
    except SpecError:
        return False


def _search(p: ConvProblem, precision: Precision, arch: str | None, gpu: str = "") -> list[tuple]:
    """``searched``'s search of ``p`` in ``precision``: from its pick's speed class up,
    the pick kept, where the pick is of that math; from the bottom where it is not and
    the math is worth searching (``choose.searched_math``); one that finds nothing
    where the planner refuses the problem.  With ``gpu`` named, the kernel the operator
    runs there now (its shipped or tuned winner, ``choose.choose``) is kept too where it
    is of that math and at or above the floor, so that a tune that samples its space
    times the kernel its winner replaces beside it, and never ends slower than that."""
    from .choose import planned, search_floor, searched_math, speed_class

    tf32 = precision is Precision.TF32
    try:
        pick = planned(p, tf32, arch).variant
    except SpecError:
        return [(p, precision, 0, ())]
    floor = search_floor(p, pick)
    if pick.precision is precision:
        keep = (pick,)
        now = running(p, precision, gpu, arch)
        if now not in (None, pick) and speed_class(now) >= floor:
            keep += (now,)
        return [(p, precision, floor, keep)]
    return [(p, precision, 0, ())] if searched_math(p, precision, floor) else []


def work_items(searches, budget: int | None, client=None, stored=False) -> list[Item]:
    """Each search's candidates (``searched``), pruned and sampled to ``budget`` as the
    operator's autotune does, one ``Item`` each.  With ``client``, the searches are
    listed on its workers without a GPU, one task each, and put back in their order:
    planning every candidate of resnet50's 204 searches takes 7-8 s on one core, all of
    it before the first item can run.  ``stored``: searches listed before under the
    same code come from ``listings``, and the rest are stored there once listed."""
    from . import listings

    found = {}
    for s, pairs in (listings.items(searches, budget) if stored else {}).items():
        p, precision = s[0], s[1].value
        found[s] = [Item(p.spec, p.batch, precision, v, h) for v, h in pairs]
    todo = [s for s in searches if s not in found]
    if client is None or not todo:
        listed = [search_items(s, budget) for s in todo]
    else:
        gpus = set(gpu_workers(client))
        cpus = [a for a in client.scheduler_info()["workers"] if a not in gpus] or None
        futures = client.map(search_items, todo, budget=budget, workers=cpus, pure=False)
        listed = client.gather(futures)
    if stored:
        pairs = [[(it.variant, it.source) for it in its] for its in listed]
        listings.store_items(dict(zip(todo, pairs)), budget)
    found.update(zip(todo, listed))
    return list(dict.fromkeys(it for s in searches for it in found[s]))


def search_items(search: tuple, budget: int | None) -> list[Item]:
    """One search's items: the candidates ``run_tune`` would time (``tune_space``: pruned
    from its floor up, the pick kept, sampled); none where the planner refuses all."""
    from .strategies import strategy_class
    from .tune import source_hash, tune_space

    p, precision, floor, keep, *named = search  # (a strategy's key: ``strategy_searches``)
    strategy = strategy_class(named[0]) if named else None
    try:
        space = tune_space(p, precision, budget, strategy=strategy, floor=floor, keep=keep)
    except SpecError:
        return []
    return [Item(p.spec, p.batch, precision.value, v.name, source_hash(p, v)) for v in space]


def _record(item: Item, **fields) -> dict:
    """A database record of ``item``: its key (the problem's spec as ``shape``), the
    worker that ran it (none yet), and ``fields``."""
    record = dict(asdict(item), worker="")
    record["shape"] = record.pop("spec")
    return dict(record, **fields)


def compiled_record(item: Item, arch: str, **fields) -> dict:
    """The record of an item's compile phase: the compiler and architecture too."""
    from .compile import nvrtc_version

    return _record(item, kind="compiled", arch=arch, nvrtc="%d.%d" % nvrtc_version(), **fields)


def compile_item(item: Item, arch: str) -> dict:
    """The compile phase of one item, on whatever worker gets it: planned, rendered,
    compiled for ``arch`` and its resources checked against the plan (and the plan it
    is timed as compiled too, ``bench.timed_plan``).  Its record:
    ``status`` "ok", "refused" (the resources break the plan: spills, shared bytes) or
    "failed" (the planner or the compiler refused it), with the reason."""
    from .compile import compile_source
    from .plan import make_plan
    from .render import render
    from .strategies import parse_variant_name
    from .bench import timed_plan
    from .verify import check_resources

    start = time.perf_counter()
    record = compiled_record(item, arch, worker=_worker())
    try:
        p = item.problem()
        v = parse_variant_name(item.variant, p)
        plan = make_plan(p, v)
        binary = compile_source(render(plan), plan.name, plan.target(arch))
        resources, problems = check_resources(plan, binary)
        timed = timed_plan(p, v)  # the plan the GPU phase times, where it is another
        if timed is not plan and not problems:
            compile_source(render(timed), timed.name, timed.target(arch))
        record.update(resources)
        record.update(status="refused" if problems else "ok", reason="; ".join(problems))
    except (SpecError, RuntimeError) as e:
        record.update(status="failed", reason=str(e))
    record["seconds"] = time.perf_counter() - start
    return record


def _worker() -> str:
    """Who ran an item: the Dask worker's address, else this process."""
    try:
        from distributed import get_worker

        return get_worker().address
    except (ImportError, ValueError):
        return f"pid {os.getpid()}"


def pending(items: list[Item], arch: str) -> list[Item]:
    """The items the database does not hold yet for this compiler and architecture."""
    done = compiled_records(arch)
    return [it for it in items if it.key not in done]


def connect(scheduler: str | None, workers: int, gpus: list[str] = ()):
    """A Dask client: of the cluster at ``scheduler`` (its GPU workers started with
    ``--resources GPU=1``), or of an embedded cluster of ``workers`` single-threaded
    compile processes and one worker per GPU of ``gpus`` (their ``CUDA_VISIBLE_DEVICES``
    values), pinned to it and holding the resource ``GPU=1``."""
    try:
        from distributed import Client, Nanny, Scheduler, SpecCluster
    except ImportError:
        raise SpecError(DIST_EXTRA) from None
    if scheduler:
        try:
            return Client(scheduler, timeout="20s")
        except (OSError, TimeoutError) as e:
            raise SpecError(f"no Dask scheduler answers at {scheduler}: {e}") from None

    def worker(env, preload=(), **options):
        options = dict(nthreads=1, memory_limit=0, silence_logs=logging.WARNING, env=env, **options)
        # the group's signals are the tune's process's (``cluster_worker``)
        options["preload"] = ["specgen.cluster_worker", *preload]
        return {"cls": Nanny, "options": options}

    # Compile processes see no GPU where GPU workers have them: a card is its worker's.
    cpu_env = {"CUDA_VISIBLE_DEVICES": ""} if gpus else {}
    spec = {f"cpu-{i}": worker(cpu_env) for i in range(workers)}
    for g in gpus:  # each begins ``prepare`` as it starts (``gpu_worker``)
        env = {"CUDA_VISIBLE_DEVICES": g}
        spec[f"gpu-{g}"] = worker(env, resources={"GPU": 1}, preload=["specgen.gpu_worker"])
    scheduler_spec = {"cls": Scheduler, "options": {"dashboard_address": ":0"}}
    cluster = SpecCluster(workers=spec, scheduler=scheduler_spec, silence_logs=logging.WARNING)
    client = Client(cluster)
    client.specgen_owns_cluster = True  # ``disconnect`` closes it with the client
    return client


def disconnect(client) -> None:
    """Close the client, and the embedded cluster ``connect`` started for it, its
    workers' logs quieted first: a heartbeat under way as the scheduler stops fails, and
    the worker logs that with a traceback that says nothing of the tune (at the end of
    vgg11's, nvidia-h200, 2026-11-29)."""
    cluster = client.cluster if getattr(client, "specgen_owns_cluster", False) else None
    if cluster is not None:
        try:
            client.run(_quiet_worker)
        except Exception:  # a worker lost already: it has nothing left to say
            pass
    client.close()
    if cluster is not None:
        cluster.close()


def _quiet_worker() -> None:
    """On a worker of an embedded cluster about to close: its own errors unlogged."""
    for name in ("distributed.worker", "distributed.core", "distributed.comm"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


def visible_gpus(count: int | None) -> list[str]:
    """The first ``count`` GPUs this process sees (all where ``count`` is None), as
    ``CUDA_VISIBLE_DEVICES`` values for their workers: the indices, or the entries of
    this process's own ``CUDA_VISIBLE_DEVICES``."""
    from .runtime import gpu_count

    seen = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [s.strip() for s in seen.split(",") if s.strip()] if seen is not None else None
    n = gpu_count()
    ids = (ids or [])[:n] if ids is not None else [str(i) for i in range(n)]
    if count is not None and count > len(ids):
        raise SpecError(f"--gpus {count}: this machine shows {len(ids)} GPU(s)")
    return ids if count is None else ids[:count]


def fan_out(client, todo: list[Item], arch: str, progress=None, task=compile_item) -> dict:
    """The items (``pending`` ones) run on the cluster (``task``, the compile phase by
    default), each result appended to the database by this client as it arrives, once.
    A task that kept killing its workers (Dask's ``KilledWorker``) or raised is recorded
    as failed, with the reason.  ``progress(record)`` after each record.  Returns the
    counts by status, the wall time, the items' summed seconds, the items per worker
    and the records of the items refused or failed."""
    from distributed import as_completed

    stats = dict(counts={}, busy=0.0, per_worker={})
    dropped: list[dict] = []  # the records of items refused or failed
    start = time.perf_counter()
    futures = {client.submit(task, it, arch, pure=False): it for it in todo}
    written = set()
    try:
        for future in as_completed(list(futures)):
            item = futures[future]
            try:
                record = future.result()
            except Exception as e:  # a task's own error, or KilledWorker: said, not lost
                record = _failed("compile", item, arch, f"{type(e).__name__}: {e}")
            if item.key in written:
                continue
            written.add(item.key)
            tunedb.append(record)
            _count(stats, record, dropped)
            if progress:
                progress(record)
    finally:
        for future in futures:
            future.cancel()
    return dict(stats, wall=time.perf_counter() - start, dropped=dropped)


# The GPU phase: what a GPU worker runs, one problem in one math (a group) a task, so
# that its candidates are timed on one card, on the same inputs, beside one cuDNN time.
# A worker keeps the inputs of the last few problems it met (a problem's maths are
# groups of their own).
_MET: dict[tuple, dict] = {}
_MET_KEPT = 4


def _met(shape: ConvProblem, precision: str) -> dict:
    """This worker's inputs for ``shape``, and cuDNN's median in ``precision`` on its
    card (None where cuDNN has no call for the problem, or PyTorch is missing)."""
    import numpy as np

    from .bench import ceilings, cudnn_timings, input_sets
    from .verify import random_inputs

    key = (shape.spec, shape.batch)
    if key not in _MET:
        rng = np.random.default_rng()
        xs = input_sets(shape, shape.batch, rng)
        _, w, bias = random_inputs(shape, 1, rng)
        while len(_MET) >= _MET_KEPT:
            _MET.pop(next(iter(_MET)))
        _MET[key] = dict(xs=xs, w=w, bias=bias, ceil=ceilings(), cudnn={}, rng=rng, trial=None)
    met = _MET[key]
    if precision not in met["cudnn"]:
        found = cudnn_timings(
            shape, met["xs"], met["w"], met["bias"], shape.batch, met["ceil"], only=precision
        )
        met["cudnn"][precision] = found[0].ms if found else None
    return met


_PREPARING = threading.Lock()
_PREPARED: list[float] = []  # prepare's seconds, once it has run in this process


def prepare() -> float:
    """A GPU worker's one-time costs that no problem decides: CuPy's and PyTorch's CUDA
    contexts made (PyTorch imported, where it is installed) and the card's ceilings read
    (``bench.ceilings``, measured on the card's first tune).  Once a process: the GPU
    workers begin it as they start (``gpu_worker``, Dask's preload), beside the rest of
    the cluster's start, and ``prepare_gpus``'s task waits for that.  Returns its
    seconds."""
    with _PREPARING:
        if not _PREPARED:
            import cupy

            from .bench import ceilings

            start = time.perf_counter()
            cupy.zeros(1, dtype=cupy.float32).sum()
            try:
                import torch
            except ImportError:  # cuDNN is then not timed: the items say so
                pass
            else:
                torch.zeros(1, device="cuda").sum()
            ceilings()
            _PREPARED.append(_since(start))
    return _PREPARED[0]


def prepare_gpus(client) -> list:
    """``prepare`` on each GPU worker of the cluster, as a task holding its GPU: futures
    that nobody needs to wait for (the worker's next task queues behind it).  Where the
    worker began it at its start, the task waits for that."""
    return [
        client.submit(prepare, workers=[a], resources={"GPU": 1}, pure=False)
        for a in gpu_workers(client)
    ]


def warm_up_problems(searches: list[tuple]) -> list[tuple[ConvProblem, str]]:
    """For each kind of cuDNN call a tune makes (op, dtype, layout and math), its
    smallest problem: what a GPU worker meets first (``warm_up``)."""
    kinds: dict[tuple, tuple[ConvProblem, str]] = {}
    for p, precision, *_ in sorted(searches, key=lambda s: s[0].batch * s[0].C * s[0].H * s[0].W):
        kinds.setdefault((p.op, p.dtype, p.layout, precision), (p, precision.value))
    return list(kinds.values())


def warm_up(problems: list[tuple[ConvProblem, str]]) -> float:
    """A GPU worker's one-time costs, paid before its first item rather than inside it:
    PyTorch, cuDNN and CuPy's generators loaded, the card's ceilings measured, and
    cuDNN's kernels loaded for each kind of call (``warm_up_problems``).  Without this,
    each worker's first item took 5.4-6.8 s of a 29-s tune on four GPUs (resnet50,
    H200, 2026-11-28).  Returns its seconds."""
    start = time.perf_counter()
    for shape, precision in problems:
        try:
            _met(shape, precision)
        except (SpecError, RuntimeError):  # the item that meets it says why
            continue
    return _since(start)


def warmed(futures: list) -> float:
    """The longest warm-up of ``warm_gpus``'s that ended (a worker lost meanwhile is the
    tune's to handle), once all have."""
    from distributed import wait

    wait(futures)
    return max([f.result() for f in futures if f.status == "finished"], default=0.0)


def warm_gpus(client, workers: list[str], problems: list[tuple[ConvProblem, str]]) -> list:
    """``warm_up`` on each GPU worker, as a task holding its GPU: futures that the caller
    waits for while it plans the items."""
    return [
        client.submit(warm_up, problems, workers=[a], resources={"GPU": 1}, pure=False)
        for a in workers
    ]


def gpu_environment() -> dict:
    """What a GPU worker's timings depend on (``tune.environment``), its architecture,
    and which card of its host it is."""
    from .runtime import device_arch
    from .tune import environment

    return dict(
        environment(), arch=device_arch(), device=os.environ.get("CUDA_VISIBLE_DEVICES", "")
    )


def gpu_record(item: Item, env: dict, **fields) -> dict:
    """A GPU-phase record of ``item``: the GPU worker's environment (``gpu_environment``)
    and the date too."""
    return _record(item, **env, date=datetime.date.today().isoformat(), **fields)


class GpuTask(NamedTuple):
    """What a GPU worker gets (``time_group``'s arguments): a problem in one math, the
    candidates to time (compiled already), the group's records of an earlier run or of
    its candidates run apart, and whether to time the finalists."""

    group: tuple  # (spec, batch, precision)
    items: list
    arch: str
    known: list
    final: bool = True


def time_group(
    group: tuple, items: list[Item], arch: str, known: list[dict], final: bool = True
) -> list[dict]:
    """The GPU phase of one problem in one math (``group``) on this worker's card: each
    item verified against float64 at a small batch, then timed at its batch beside
    cuDNN's time for the problem; then the three best of these and of ``known`` timed
    again together, interleaved, for the winner.  Returns the items' records (kind
    "timing", or "dropped" with the reason: wrong numbers, NaN in the timed output, a
    compile or launch error), then the winner's (none where ``final`` is False: the
    group's items run apart, its finalists later)."""
    env = gpu_environment()
    records = [time_item(item, arch, env) for item in items]
    names = finalists(records + known)
    if final and names:
        records.append(final_item(group, names, env))
    return records


def _group_of(record: dict) -> tuple:
    return (record["shape"], record["batch"], record["precision"])


def time_item(item: Item, arch: str, env: dict) -> dict:
    """One candidate verified and timed on this worker's card (``time_group``)."""
    from .bench import bench_variant
    from .strategies import parse_variant_name
    from .verify import draw_trial, verify_variant

    start = time.perf_counter()
    record = gpu_record(item, env, worker=_worker())
    try:
        shape = item.problem()
        v = parse_variant_name(item.variant, shape)
        met = _met(shape, item.precision)
        met["trial"] = met["trial"] or draw_trial(shape, min(item.batch, 4), met["rng"])
        parts = dict(met_s=_since(start))  # where an item's seconds go, for the summary
        row = verify_variant(
            shape, v, arch=arch, batch=met["trial"].batch, numbers=True, trial=met["trial"]
        )
        parts["verify_s"] = _since(start) - parts["met_s"]
        if not row.ok:
            reason = "; ".join(row.problems) or f"verification {row.status}"
            return dict(
                record, kind="dropped", status="wrong", reason=reason, seconds=_since(start)
            )
        t = bench_variant(
            shape, v, item.batch, met["xs"], met["w"], met["bias"], met["ceil"], pack=True
        )
        parts["bench_s"] = _since(start) - parts["met_s"] - parts["verify_s"]
        if t.verified:
            return dict(
                record, kind="dropped", status="wrong", reason=t.verified, seconds=_since(start)
            )
    except (SpecError, RuntimeError) as e:  # CuPy's CUDA errors are RuntimeErrors
        return dict(record, kind="dropped", status="failed", reason=str(e), seconds=_since(start))
    return dict(
        record,
        kind="timing",
        status="ok",
        ms=t.ms,
        p10=t.p10,
        p90=t.p90,
        cudnn_ms=met["cudnn"][item.precision],
        seconds=_since(start),
        **parts,
    )


def final_item(group: tuple, names: list[str], env: dict) -> dict:
    """A problem's finalists in one math (``group``: spec, batch, precision) timed again
    together on this card, interleaved round by round; the fastest is its winner."""
    from .strategies import parse_variant_name
    from .tune import retime

    start = time.perf_counter()
    spec, batch, precision = group
    shape = replace(parse_shape(spec), batch=batch)
    met = _met(shape, precision)
    top = [parse_variant_name(n, shape) for n in names]
    win, med, spread, order, tie = retime(shape, top, met["xs"], met["w"], met["bias"])
    return dict(
        env,
        kind="winner",
        shape=spec,
        slug=shape.slug,
        batch=batch,
        precision=precision,
        variant=win.name,
        ms=med[win],
        p10=spread[win][0],
        p90=spread[win][-1],
        cudnn_ms=met["cudnn"][precision],
        tie=tie,
        runner_up=order[1].name if len(order) > 1 else None,
        finalists={v.name: med[v] for v in order},
        worker=_worker(),
        date=datetime.date.today().isoformat(),
        seconds=_since(start),
    )


def _since(start: float) -> float:
    return time.perf_counter() - start


def gpu_workers(client) -> list[str]:
    """The addresses of the cluster's workers that hold a GPU (Dask resource ``GPU``)."""
    workers = client.scheduler_info()["workers"]
    return sorted(a for a, w in workers.items() if w.get("resources", {}).get("GPU"))


def gpu_of(client, workers: list[str]) -> dict:
    """The GPU workers' environment (``gpu_environment``): one GPU model, one driver and
    one compiler, since winners are chosen and recorded per GPU model.  Workers that
    differ are refused, named."""
    found = client.run(gpu_environment, workers=workers)
    kinds = {tuple(sorted((k, v) for k, v in e.items() if k != "device")) for e in found.values()}
    if len(kinds) != 1:
        seen = "; ".join(
            f"{a}: {e['gpu']} ({e['arch']}, driver {e['driver']})" for a, e in found.items()
        )
        raise SpecError(
            f"the GPU workers hold different GPUs or drivers ({seen}); tune one kind a run"
        )
    return next(iter(found.values()))


def timed(env: dict) -> dict[tuple, dict]:
    """Item key -> its GPU-phase record (timing or dropped) for this GPU, driver and
    compiler: a resumed run's GPU work already done."""
    return {
        tunedb.candidate_key(r): r
        for r in tunedb.records()
        if r["kind"] in ("timing", "dropped") and tunedb.measured_on(r, env)
    }


def finalists(records: list[dict]) -> list[str]:
    """A problem's three best timed candidates in one math: by their time over cuDNN's
    on the card that timed them (items of a resumed run may come from another card of
    the model), by their time where cuDNN has none."""
    from .tune import RETIME_TOP

    def score(r):
        return r["ms"] / r["cudnn_ms"] if r.get("cudnn_ms") else r["ms"]

    ok = sorted((r for r in records if r["kind"] == "timing"), key=score)
    return [r["variant"] for r in ok[:RETIME_TOP]]


# seconds an item may take on a GPU worker before it is called hung: a candidate takes
# 0.05-1 s, and its group's first up to 9 s with the worker's start and cuDNN's timing
# (resnet18's 7x7 stem, H200), which the group's allowance of two items' more covers
ITEM_LIMIT = 30.0
STALL = 30.0  # seconds without a record before the tune says what it is waiting on
WATCH = 5.0  # seconds between the client's looks at the GPU workers
NO_GPU_WAIT = 120.0  # seconds the queue waits for a GPU worker to come back


def tune_on_gpus(
    client,
    items: list[Item],
    arch: str,
    env: dict,
    progress=None,
    tasks=None,
    item_limit: float = ITEM_LIMIT,
    overhead: float | None = None,
) -> dict:
    """The whole tune: each item's compile on a CPU worker (where the cluster has CPU
    workers), and each problem's GPU phase in each math (``time_group``) on a GPU
    worker once its items' compiles have ended; every record appended to the database
    by this client, once, as it arrives.  Work the database already holds (compiles for
    ``arch``, timings on ``env``'s GPU, winners) is not done again.

    GPU tasks are handed to Dask one a free GPU worker, in the problems' order: Dask
    assigns resource-bound tasks to workers as they are submitted and does not move
    them later, so a queue of its own on each worker would leave cards idle at the end.

    A group that runs past its time (``item_limit`` a candidate, and ``overhead`` for
    cuDNN and the finalists, two items' worth by default), or keeps killing its
    workers, has its worker killed and its candidates run again one a task; a
    candidate that then runs past its limit or kills its worker is recorded as dropped
    with the reason, and the group's finalists are timed from the rest.  A result lost
    with its worker is asked for once more.  ``progress(phase, record)`` after each record, and
    ``progress("running", {task: seconds})`` while waiting, ``progress("stalled", text)``
    after ``STALL`` seconds without a record (what the tasks out are doing, from the
    scheduler and the workers; the client's own threads' stacks go to stderr if its
    loop itself stops for four times that); ``tasks``: stand-ins for
    (``compile_item``, ``time_group``).  Returns, per phase, the counts by status, the
    items' summed seconds and the items per worker; the winners; the records dropped;
    the wall time."""
    import heapq

    from distributed import wait

    compile_task, group_task = tasks or (compile_item, time_group)
    gpus = gpu_workers(client)
    if not gpus:
        raise SpecError("the cluster has no GPU worker (Dask resource GPU=1) to time on")
    cpus = [a for a in client.scheduler_info()["workers"] if a not in gpus] or None
    done_compile = compiled_records(arch)
    done_gpu = timed(env)
    won = {
        _group_of(r)
        for r in tunedb.records()
        if r["kind"] == "winner" and r["gpu"] == env["gpu"] and r.get("items")
    }
    groups: dict[tuple, list[Item]] = {}
    for it in items:
        groups.setdefault(it.group, []).append(it)
    index = longest_first(groups)
    phases = {p: dict(counts={}, busy=0.0, per_worker={}) for p in ("compile", "gpu", "final")}
    dropped, winners = [], []
    futures: dict = {}  # future -> (phase, key, what it was given)
    known: dict[tuple, list[dict]] = {}  # a group's GPU records so far
    todo: dict[tuple, list[Item]] = {}  # a group's candidates to time
    compiling: dict[tuple, int] = {}  # a group's compiles still out
    pieces: dict[tuple, int] = {}  # a split group's candidate tasks still out
    ready: list = []  # (order, n, phase, key, args): GPU tasks waiting for a free card
    count = iter(range(1 << 62))  # ties in ``ready`` keep their order
    start = time.perf_counter()

    def submit(phase, key, fn, *args, task=None, **kw):
        f = client.submit(fn, *args, pure=False, priority=-index[_key_group(key)], **kw)
        futures[f] = (phase, key, task)

    def queue(phase, key, task: GpuTask, first=False):
        order = -1 if first else index[task.group]  # a split group's pieces first
        heapq.heappush(ready, (order, next(count), phase, key, task))

    def dispatch():
        busy = sum(1 for phase, _, _ in futures.values() if phase in ("gpu", "piece"))
        free = len(gpu_workers(client)) - busy
        while ready and free > 0:
            _, _, phase, key, task = heapq.heappop(ready)
            submit(phase, key, group_task, *task, task=task, resources={"GPU": 1})
            free -= 1

    def compiled(group):
        """A group whose compiles have ended goes to the GPU queue."""
        if compiling[group] == 0:
            members = [it for it in todo[group] if compiled_ok(it)]
            if members or finalists(known[group]):
                queue("gpu", group, GpuTask(group, members, arch, known[group]))

    def compiled_ok(it):
        return done_compile.get(it.key, {}).get("status", "ok") == "ok"

    for group, members in groups.items():
        known[group] = [done_gpu[it.key] for it in members if it.key in done_gpu]
        todo[group] = [it for it in members if it.key not in done_gpu and compiled_ok(it)]
        if not todo[group] and (group in won or not finalists(known[group])):
            continue
        compiling[group] = 0
        for it in todo[group]:
            if it.key not in done_compile:
                submit("compile", it, compile_task, it, arch, workers=cpus)
                compiling[group] += 1
        compiled(group)

    def record(phase, r):
        nonlocal last_record
        last_record = time.perf_counter()
        which = "final" if r["kind"] in ("winner", "lost") else phase
        if r["kind"] == "lost":
            dropped.append(r)  # a group that could not run: said, not written
        else:
            group = _group_of(r)
            tunedb.append(dict(r, items=len(groups[group])) if which == "final" else r)
            if which == "gpu":
                known[group].append(r)
        _count(phases[which], r, dropped)
        if r["kind"] == "winner":
            winners.append(r)
        if progress:
            progress(which, r)

    def split(group, members, reason):
        """A group past its time or killing its workers: its candidates one a task."""
        if len(members) <= 1:
            for it in members:
                record("gpu", gpu_record(it, env, kind="dropped", status="failed", reason=reason))
            finish(group)
            return
        pieces[group] = pieces.get(group, 0) + len(members)
        for it in members:
            queue("piece", it, GpuTask(group, [it], arch, [], False), first=True)

    def finish(group):
        """The finalists of a group whose candidates ran apart, once all have."""
        if pieces.get(group, 0) == 0 and finalists(known[group]):
            queue("gpu", group, GpuTask(group, [], arch, known[group]), first=True)

    running: dict = {}  # a GPU task's key -> when it was first seen running
    last_record = last_report = time.perf_counter()  # the last record; the last stall report
    retried: set = set()  # GPU tasks sent again after a failure that was not theirs
    dispatch()
    try:
        idle_since = None  # when the queue last found no GPU worker to go to
        while futures or ready:
            _watch_loop(4 * STALL)  # this loop stuck that long: where, on stderr
            if not futures:  # GPU tasks queued, none out: the GPU workers are restarting
                idle_since = idle_since or time.perf_counter()
                if time.perf_counter() - idle_since > NO_GPU_WAIT:
                    raise SpecError(
                        f"no GPU worker came back in {NO_GPU_WAIT:.0f} s; "
                        f"{len(ready)} task(s) not run (a rerun resumes)"
                    )
                time.sleep(WATCH / 5)
                dispatch()
                continue
            idle_since = None
            try:
                done, _ = wait(list(futures), timeout=WATCH, return_when="FIRST_COMPLETED")
            except (TimeoutError, asyncio.TimeoutError):
                done = ()
            for future in done:
                phase, key, task = futures.pop(future)
                group = _key_group(key)
                failure = None
                try:
                    out = future.result()
                except (Exception, asyncio.CancelledError) as e:  # its own error, or Dask's
                    if phase in ("gpu", "piece") and _transient(e) and key not in retried:
                        # a result lost with a worker as it was fetched, say: once more
                        retried.add(key)
                        future.release()
                        queue(phase, key, task, first=True)
                        continue
                    failure = _one_line(e)
                future.release()  # its result lives here now, not on a worker that may die
                if phase == "piece":
                    pieces[group] -= 1
                if failure and phase != "compile" and task.items:
                    split(group, task.items, failure)  # run apart, or dropped
                    continue
                if failure:
                    out = _failed(phase, key, arch, failure)
                for r in out if isinstance(out, list) else [out]:
                    record("gpu" if phase == "piece" else phase, r)
                if phase == "compile":
                    done_compile[key.key] = out
                    compiling[group] -= 1
                    compiled(group)
                elif phase == "piece":
                    finish(group)
            overdue, now_running = _overdue(client, futures, running, item_limit, overhead)
            for future, worker, seconds in overdue:
                phase, key, task = futures.pop(future)
                future.cancel()
                _stop_worker(client, worker)
                group = _key_group(key)
                what = f"past its time limit ({seconds:.0f} s on {worker}; the worker restarted)"
                if phase == "piece":
                    pieces[group] -= 1
                if task.items:
                    split(group, task.items, what)
                else:  # the finalists alone hung: no winner, said at the end
                    dropped.append(_failed("gpu", group, arch, what))
            dispatch()
            if progress and now_running:
                progress("running", now_running)
            now = time.perf_counter()
            if progress and futures and now - max(last_record, last_report) > STALL:
                last_report = now
                progress("stalled", _stall_report(client, futures, now - last_record))
    finally:
        faulthandler.cancel_dump_traceback_later()
        for future in futures:
            future.cancel()
    wall = time.perf_counter() - start
    return dict(phases=phases, winners=winners, dropped=dropped, wall=wall, gpus=len(gpus))


def _watch_loop(seconds: float) -> None:
    """The threads' stacks on stderr if this is not called again within ``seconds``;
    nothing where stderr is no file (a notebook's, a test runner's)."""
    try:
        faulthandler.dump_traceback_later(seconds)
    except (AttributeError, OSError):  # io.UnsupportedOperation is an OSError
        pass


def _stall_report(client, futures: dict, quiet: float) -> str:
    """What a tune with no record for ``quiet`` seconds is waiting on: each task out,
    its state on the scheduler and its worker, and where a running one is (the last
    frames of its call stack)."""
    keys = [f.key for f in futures]
    try:
        states = client.run_on_scheduler(_task_states, keys)
        stacks = client.call_stack(keys=keys)
    except Exception as e:  # the report must not end the tune
        return f"no record for {quiet:.0f} s; the scheduler did not say why: {_one_line(e)}"
    frames = {k: lines for per_key in stacks.values() for k, lines in per_key.items()}
    lines = [f"no record for {quiet:.0f} s; {len(keys)} task(s) out:"]
    for f, (phase, key, _) in futures.items():
        state, worker = states.get(str(f.key), ("unknown to the scheduler", None))
        where = "".join(frames.get(f.key, [])[-2:]).strip().replace("\n", " | ")
        lines.append(
            f"  {phase} {key if isinstance(key, tuple) else key.variant}: {state}"
            + (f" on {worker}" if worker else "")
            + (f"; at {where}" if where else "")
        )
    return "\n".join(lines)


def _task_states(keys, dask_scheduler=None) -> dict:
    """On the scheduler: each key's task state and the worker it is processing on."""
    out = {}
    for k in keys:
        ts = dask_scheduler.tasks.get(k)
        if ts is not None:
            on = ts.processing_on.address if ts.processing_on else None
            out[str(k)] = (ts.state, on)
    return out


def _stop_worker(client, address: str, wait: float = 30.0) -> None:
    """Kill the worker process at ``address`` (a kernel that never ends cannot be
    interrupted) through its nanny, which starts a new one; a worker without a nanny
    is asked to restart.  Returns once the scheduler has let go of it (``wait``
    seconds at most), so that no task is handed to the dying worker and then waits,
    counted as running, behind another worker's."""
    try:
        client.run(_kill_own_worker, workers=[address], nanny=True)
    except Exception:  # no nanny, or it is gone already
        client.restart_workers([address], raise_for_error=False)
    deadline = time.perf_counter() + wait
    while address in client.scheduler_info()["workers"] and time.perf_counter() < deadline:
        time.sleep(0.05)


def _kill_own_worker(dask_worker) -> None:
    """Run in a nanny: SIGKILL to its worker process."""
    import signal

    os.kill(dask_worker.process.process.pid, signal.SIGKILL)


def _transient(e: BaseException) -> bool:
    """A GPU task's failure that says nothing of its candidates: its result lost with
    a worker, a connection closed, a cancellation.  KilledWorker (it killed workers
    again and again) and the task's own exceptions are not."""
    from distributed import KilledWorker

    if isinstance(e, KilledWorker):
        return False
    return isinstance(e, (OSError, asyncio.CancelledError, concurrent.futures.CancelledError))


# A group's GPU work in seconds, to start the longest groups first (the last groups out
# set the run's tail): 18 ms a candidate and 2.5 s a TFLOP of its problem at its batch,
# fitted to the candidates' seconds in resnet50's budget-40 tune on one H200 (2026-11-28).
# Replayed on four cards, its groups in this order end 1.7 s sooner than in the problems'
# order (49.4 s against 51.0; 49.3 s the work's even share).
CANDIDATE_S = 0.018
TFLOP_S = 2.5


def longest_first(groups: dict[tuple, list[Item]]) -> dict[tuple, int]:
    """Each group's place in the pipeline's order (compile priorities and the GPU
    queue): the most GPU work first, ties in the order given."""

    def work(members: list[Item]) -> float:
        p = members[0].problem()
        return len(members) * (CANDIDATE_S + TFLOP_S * p.flops(p.batch) / 1e12)

    order = sorted(groups, key=lambda g: -work(groups[g]))
    return {g: i for i, g in enumerate(order)}


def _key_group(key) -> tuple:
    return key.group if isinstance(key, Item) else key


def _one_line(e: Exception) -> str:
    return f"{type(e).__name__}: {e}".splitlines()[0]


def _overdue(client, futures, running, item_limit, overhead=None) -> tuple[list, dict]:
    """The GPU tasks running past their limit (``item_limit`` a candidate, and
    ``overhead``, two items' worth by default, for cuDNN and the finalists), as
    (future, worker, seconds), and every GPU task running,
    as its group or candidate -> seconds.  ``running`` keeps when each task was first
    seen on a worker, and is pruned to those still there."""
    now = time.perf_counter()
    by_key = {f.key: f for f in futures}
    seen = {}
    for worker, keys in client.processing().items():  # workers come and go: all of them
        for k in keys:
            if k in by_key:
                seen[k] = (worker, running.get(k, now))
    running.clear()
    running.update({k: since for k, (_, since) in seen.items()})
    out, now_running = [], {}
    for k, (worker, since) in seen.items():
        f = by_key[k]
        phase, key, task = futures[f]
        if phase not in ("gpu", "piece"):
            continue
        now_running[key] = now - since
        limit = item_limit * len(task.items) + (2 * item_limit if overhead is None else overhead)
        if now - since > limit:
            out.append((f, worker, now - since))
    return out, now_running


PARTS = {"met_s": "inputs, references and cuDNN", "verify_s": "verification", "bench_s": "timing"}


def _count(stats: dict, record: dict, dropped: list) -> None:
    status = record.get("status", "ok")
    stats["counts"][status] = stats["counts"].get(status, 0) + 1
    stats["busy"] += record.get("seconds", 0.0)
    for part in PARTS:
        if part in record:
            stats.setdefault("parts", {}).setdefault(part, 0.0)
            stats["parts"][part] += record[part]
    worker = record.get("worker", "")
    stats["per_worker"][worker] = stats["per_worker"].get(worker, 0) + 1
    if status != "ok" and record["kind"] != "lost":
        dropped.append(record)


def compiled_records(arch: str) -> dict[tuple, dict]:
    """Item key -> its compile record for this compiler and architecture: a resumed
    run's compile work already done."""
    from .compile import nvrtc_version

    nvrtc = "%d.%d" % nvrtc_version()
    return {
        tunedb.candidate_key(r): r
        for r in tunedb.records()
        if r["kind"] == "compiled" and r["arch"] == arch and r["nvrtc"] == nvrtc
    }


def _failed(phase: str, key, arch: str, reason: str) -> dict:
    """The record of a task that raised or kept killing its workers: a compile, failed;
    a group, "lost" (said at the end, not written: the group is run again by a rerun)."""
    if phase == "compile":
        return compiled_record(key, arch, status="failed", reason=reason, seconds=0.0)
    spec, batch, precision = key
    return dict(
        kind="lost",
        shape=spec,
        batch=batch,
        precision=precision,
        variant=f"the {precision} candidates",
        status="failed",
        reason=reason,
    )
