"""Search the variant space for the fastest verified kernel of a shape.

Invalid variants are dropped by the planner, spilling ones by the compiler's report,
wrong ones by verification, all before any timing.  Results go to an append-only
JSON-lines database keyed by GPU, driver, NVRTC, shape, variant and source hash, so a
repeated or interrupted run resumes and a result from another GPU is never reused.
"""

from __future__ import annotations

from dataclasses import replace

import datetime
import hashlib
import statistics
import sys

import click

from . import tunedb
from .compile import nvrtc_version
from .errors import SpecError
from .plan import make_plan
from .render import render
from .shapes import ConvProblem
from .strategies import TABLE, default_set
from .variants import Precision, Variant

RETIME_TOP = 3
RETIME_ROUNDS = 5


def environment() -> dict:
    """What a timing depends on besides the kernel: a result is reused only where all
    of these match."""
    import cupy

    from .bench import device_name

    return dict(
        gpu=device_name(),
        driver=cupy.cuda.runtime.driverGetVersion(),
        nvrtc="%d.%d" % nvrtc_version(),
    )


def searched_strategies(strategy: type[Variant] | None = None, floor: int = 0) -> list:
    """The strategies a search enumerates: ``strategy`` alone where one is named, and of
    those, where ``floor`` asks for the tensor cores' math (``choose.speed_class``), the
    tensor-core ones only: the CUDA-core planners' searches of bank layouts were most of
    a whole-model tune's setup."""
    return [c for c in ([strategy] if strategy else TABLE) if c.tensor_core or not floor]


def defaults(
    shape: ConvProblem,
    precision: Precision,
    strategy: type[Variant] | None = None,
    floor: int = 0,
) -> list[Variant]:
    """Each strategy's default variant in ``precision`` for ``shape``, where it has one
    (of ``searched_strategies``)."""
    out = []
    for cls in searched_strategies(strategy, floor):
        if precision in cls.precisions:
            try:
                out.append(cls.default(cls.problem_for(shape), precision))
            except SpecError:
                continue
    return out


def candidates(
    shape: ConvProblem,
    precision: Precision,
    strategy: type[Variant] | None = None,
    floor: int = 0,
) -> list[Variant]:
    """Every variant of the strategies' spaces that the planner accepts, in a stable
    order, each strategy's default first (fitted to ``shape``'s batch: a space need not
    hold it, and a tuned winner slower than the default would be a loss); only
    ``strategy``'s when one is named, and only those whose math is at least ``floor``
    fast (``choose.speed_class``), left out before they are planned."""
    from .choose import speed_class

    out = defaults(shape, precision, strategy, floor)
    for cls in searched_strategies(strategy, floor):
        if precision in cls.precisions:
            try:
                out += cls.space(cls.problem_for(shape), precision)
            except SpecError:
                continue  # it does not compute this op
    valid, seen = [], set()
    for v in out:
        if v in seen or speed_class(v) < floor:
            continue
        seen.add(v)
        try:
            make_plan(shape, v)
        except SpecError:
            continue
        valid.append(v)
    return valid


def prune(space: list[Variant], floor: int, keep=()) -> list[Variant]:
    """The candidates whose math is at least ``floor`` fast (``choose.speed_class``:
    where the untuned pick runs on the tensor cores, the CUDA-core strategies' spaces
    hold nothing faster and are not compiled, verified or timed), and ``keep`` (the
    untuned pick, so that a tune never ends slower than it) first."""
    from .choose import speed_class

    kept = [v for v in keep if v in space] + [v for v in keep if v not in space]
    return kept + [v for v in space if speed_class(v) >= floor and v not in kept]


def source_hash(shape, v) -> str:
    """The hash of a candidate's rendered source as it is timed (``bench.timed_plan``):
    part of its results' key."""
    from .bench import timed_plan

    return hashlib.sha256(render(timed_plan(shape, v)).encode()).hexdigest()[:16]


def sample(
    shape: ConvProblem,
    precision: Precision,
    space: list[Variant],
    budget: int | None,
    keep=(),
    strategy: type[Variant] | None = None,
    floor: int = 0,
) -> list[Variant]:
    """At most ``budget`` of ``space``: ``keep``, each strategy's default and the
    shape's default set first (a tuned winner slower than a default would be a loss),
    then the rest sampled evenly; ``floor`` as ``space`` was pruned to (``prune``)."""
    if not budget or len(space) <= budget:
        return space
    seeds = defaults(shape, precision, strategy, floor)
    seeds += [v for v in default_set(shape, floor > 0) if v.precision is precision]
    seeds = [v for v in dict.fromkeys([*keep, *seeds]) if v in space]
    rest = [v for v in space if v not in seeds]
    space = seeds + rest[:: max(1, len(rest) // max(1, budget - len(seeds)))]
    return space[:budget]


def tune_space(
    shape: ConvProblem,
    precision: Precision,
    budget: int | None,
    batch: int | None = None,
    strategy: type[Variant] | None = None,
    floor: int = 0,
    keep: tuple[Variant, ...] = (),
) -> list[Variant]:
    """The candidates ``run_tune`` verifies and times, in its order: the space at the
    batch (the defaults' tiles follow it), ``prune``d to ``floor`` with ``keep`` first,
    sampled to ``budget``; SpecError where the planner refuses them all."""
    sized = replace(shape, batch=batch or shape.batch)
    space = candidates(sized, precision, strategy, floor)
    if floor or keep:
        space = prune(space, floor, [v for v in keep if v.precision is precision])
    if not space:
        what = f"{strategy.key} in {precision.value}" if strategy else precision.value
        raise SpecError(f"no variant of {what} can serve {shape.slug}: the planner refused all")
    return sample(sized, precision, space, budget, keep, strategy, floor)


def run_tune(
    shape: ConvProblem,
    precision: Precision,
    budget: int | None,
    echo,
    batch=None,
    strategy: type[Variant] | None = None,
    floor: int = 0,
    keep: tuple[Variant, ...] = (),
) -> dict:
    """Tune ``shape`` in ``precision``: its candidates (``strategy``'s only where one is
    named; ``prune``d to ``floor`` with ``keep`` first) compiled at once, verified and
    timed as the operator runs them (the weights' pack a call included, where it packs
    them), the top three timed again interleaved, the winner recorded."""
    import os

    import numpy as np

    from .bench import bench_variant, ceilings, input_sets, timed_grads
    from .parallel import precompile
    from .runtime import device_arch
    from .verify import draw_trial, random_inputs, verify_variant

    env = environment()
    arch = device_arch()
    batch = batch or shape.batch
    space = tune_space(shape, precision, budget, batch, strategy, floor, keep)
    echo(f"tune {shape.slug} {precision.value} on {env['gpu']}: {len(space)} candidates, B={batch}")
    items = [(shape, v) for v in space]
    grads = timed_grads(shape)
    items += [(shape, v, grads) for v in space] if grads else []  # as timed too
    errors = precompile(items, arch, os.cpu_count() or 1, label="compiled")
    known = tunedb.timings(env, shape.spec, batch)
    ceil = ceilings()
    rng = np.random.default_rng()
    xs = input_sets(shape, batch, rng)
    _, w, bias = random_inputs(shape, 1, rng)
    results, counts = [], dict(verified=0, timed=0, resumed=0, dropped=0)
    trial = None  # the candidates' shared inputs and references, drawn at the first
    with click.progressbar(
        space, label="verified/timed", file=sys.stderr, item_show_func=lambda v: v.name if v else ""
    ) as bar:
        for v in bar:
            if errors.get(v.name):
                counts["dropped"] += 1
                continue
            src = source_hash(shape, v)
            if (v.name, src) in known:
                results.append((known[(v.name, src)]["ms"], v))
                counts["resumed"] += 1
                continue
            trial = trial or draw_trial(shape, min(batch, 4), rng)
            row = verify_variant(shape, v, arch=arch, batch=trial.batch, numbers=True, trial=trial)
            if not row.ok:
                counts["dropped"] += 1  # spills, wrong numbers: never timed
                continue
            counts["verified"] += 1
            t = bench_variant(shape, v, batch, xs, w, bias, ceil, pack=True)
            counts["timed"] += 1
            tunedb.append(
                dict(
                    env,
                    kind="timing",
                    shape=shape.spec,
                    batch=batch,
                    variant=v.name,
                    source=src,
                    ms=t.ms,
                    p10=t.p10,
                    p90=t.p90,
                    date=datetime.date.today().isoformat(),
                )
            )
            results.append((t.ms, v))
    echo(", ".join(f"{k} {n}" for k, n in counts.items()))
    if not results:
        raise SpecError(f"no candidate of {shape.slug} in {precision.value} survived verification")
    results.sort(key=lambda r: r[0])
    win, med, spread, order, tie = retime(shape, [v for _, v in results[:RETIME_TOP]], xs, w, bias)
    for v in order:
        echo(f"  {v.name:<48} {med[v]:.4f} ms  (p10-p90 {spread[v][0]:.4f}-{spread[v][-1]:.4f})")
    verdict = f"tie with {order[1].name}" if tie else "winner"
    echo(f"{verdict}: {win.name} {med[win]:.4f} ms")
    tunedb.append(
        dict(
            env,
            kind="winner",
            shape=shape.spec,
            slug=shape.slug,
            batch=batch,
            precision=precision.value,
            variant=win.name,
            ms=med[win],
            tie=tie,
            runner_up=order[1].name if len(order) > 1 else None,
            date=datetime.date.today().isoformat(),
        )
    )
    return dict(winner=win.name, ms=med[win], tie=tie)


def retime(shape: ConvProblem, top: list[Variant], xs, w, bias, extra=None):
    """The finalists timed again, interleaved round by round so that drift in clocks or
    temperature hits all alike, each with the operator's weight pack where it packs them
    a call (``bench.with_operator_pack``; ``extra``: name -> a launch timed in the same
    rounds, cuDNN's).  Returns the winner, each one's median and deciles (by variant, and by
    name for ``extra``), the finalists fastest first, and whether the runner-up's p10
    reaches the winner's p90 (a tie)."""
    from .bench import time_launches, timed_plan, with_operator_pack
    from .runtime import Conv

    convs = {v: Conv(shape, v, plan=timed_plan(shape, v)) for v in top}
    for c in convs.values():
        c.set_weights(w, bias)
    launches = {
        v: with_operator_pack(c, shape, w, lambda i, c=c: c.run(xs[i % len(xs)]))
        for v, c in convs.items()
    }
    launches.update(extra or {})
    samples = {k: [] for k in launches}
    for _ in range(RETIME_ROUNDS):
        for k, launch in launches.items():
            samples[k] += time_launches(launch, reps=10, rotate=len(xs))
    med = {k: statistics.median(s) for k, s in samples.items()}
    spread = {k: statistics.quantiles(s, n=10) for k, s in samples.items()}
    order = sorted(top, key=med.get)
    win = order[0]
    tie = len(order) > 1 and spread[order[1]][0] <= spread[win][-1]
    return win, med, spread, order, tie
