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

What runs here is the compile phase, which needs no GPU (``--compile-only``): each
item planned, rendered, compiled for the architecture and its resources checked
against the plan.  The timing phase on GPU workers follows it.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass

from . import tunedb
from .errors import SpecError
from .shapes import ConvProblem, parse_shape
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


def work_items(problems, precisions_of, budget: int | None) -> list[Item]:
    """Each problem's candidates in each of its maths (``precisions_of(problem)``), as
    ``tune.run_tune`` samples them to ``budget``, one ``Item`` each."""
    from .tune import candidates, sample, source_hash

    items = []
    for p in problems:
        for precision in precisions_of(p):
            for v in sample(p, precision, candidates(p, precision), budget):
                items.append(Item(p.spec, p.batch, precision.value, v.name, source_hash(p, v)))
    return list(dict.fromkeys(items))


def compiled_record(item: Item, arch: str, **fields) -> dict:
    """The database record of an item's compile phase: its key (the problem's spec as
    ``shape``), the compiler and architecture, and ``fields``."""
    from .compile import nvrtc_version

    record = dict(asdict(item), kind="compiled", arch=arch, nvrtc="%d.%d" % nvrtc_version())
    record["shape"] = record.pop("spec")
    record.setdefault("worker", "")
    return dict(record, **fields)


def compile_item(item: Item, arch: str) -> dict:
    """The compile phase of one item, on whatever worker gets it: planned, rendered,
    compiled for ``arch`` and its resources checked against the plan.  Its record:
    ``status`` "ok", "refused" (the resources break the plan: spills, shared bytes) or
    "failed" (the planner or the compiler refused it), with the reason."""
    from .compile import compile_source
    from .plan import make_plan
    from .render import render
    from .strategies import parse_variant_name
    from .verify import check_resources

    start = time.perf_counter()
    record = compiled_record(item, arch, worker=_worker())
    try:
        p = parse_shape(item.spec)
        plan = make_plan(p, parse_variant_name(item.variant, p))
        binary = compile_source(render(plan), plan.name, plan.target(arch))
        resources, problems = check_resources(plan, binary)
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
    from .compile import nvrtc_version

    done = recorded(arch, "%d.%d" % nvrtc_version())
    return [it for it in items if it.key not in done]


def recorded(arch: str, nvrtc: str) -> set[tuple]:
    """The keys of the items the database holds for this compiler: a resumed run's
    work already done."""
    return {
        (r["shape"], r["batch"], r["variant"], r["source"])
        for r in tunedb.records()
        if r["kind"] == "compiled" and r["arch"] == arch and r["nvrtc"] == nvrtc
    }


def connect(scheduler: str | None, workers: int):
    """A Dask client: of the cluster at ``scheduler``, or of an embedded LocalCluster
    of ``workers`` single-threaded processes."""
    try:
        from distributed import Client, LocalCluster
    except ImportError:
        raise SpecError(DIST_EXTRA) from None
    if scheduler:
        try:
            return Client(scheduler, timeout="20s")
        except (OSError, TimeoutError) as e:
            raise SpecError(f"no Dask scheduler answers at {scheduler}: {e}") from None
    cluster = LocalCluster(
        n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=":0"
    )
    return Client(cluster)


def fan_out(client, todo: list[Item], arch: str, progress=None, task=compile_item) -> dict:
    """The items (``pending`` ones) run on the cluster (``task``, the compile phase by
    default), each result appended to the database by this client as it arrives, once.
    A task that kept killing its workers (Dask's ``KilledWorker``) or raised is recorded
    as failed, with the reason.  ``progress(record)`` after each record.  Returns the
    counts by status, the wall time, the items' summed seconds, the items per worker
    and the records of the items refused or failed."""
    from distributed import as_completed

    counts: dict[str, int] = {}
    per_worker: dict[str, int] = {}
    dropped: list[dict] = []  # the records of items refused or failed
    busy = 0.0
    start = time.perf_counter()
    futures = {client.submit(task, it, arch, pure=False): it for it in todo}
    written = set()
    try:
        for future in as_completed(list(futures)):
            item = futures[future]
            try:
                record = future.result()
            except Exception as e:  # a task's own error, or KilledWorker: said, not lost
                reason = f"{type(e).__name__}: {e}"
                record = compiled_record(item, arch, status="failed", reason=reason, seconds=0.0)
            if item.key in written:
                continue
            written.add(item.key)
            tunedb.append(record)
            counts[record["status"]] = counts.get(record["status"], 0) + 1
            if record["status"] != "ok":
                dropped.append(record)
            busy += record.get("seconds", 0.0)
            per_worker[record.get("worker", "")] = per_worker.get(record.get("worker", ""), 0) + 1
            if progress:
                progress(record)
    finally:
        for future in futures:
            future.cancel()
    wall = time.perf_counter() - start
    return dict(counts=counts, wall=wall, busy=busy, per_worker=per_worker, dropped=dropped)


def precisions_for(problem: ConvProblem) -> list[Precision]:
    """The maths a whole-model tune searches for a problem: the tensors' own on the
    tensor cores and fp32 (for fp32 tensors tf32 too), as the operator may run them."""
    from .choose import maths

    return list(maths(problem, allow_tf32=True))
