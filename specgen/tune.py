"""Search the variant space for the fastest verified kernel of a shape.

Invalid variants are dropped by the planner, spilling ones by the compiler's report,
wrong ones by verification, all before any timing.  Results go to an append-only
JSON-lines database keyed by GPU, driver, NVRTC, shape, variant and source hash, so a
repeated or interrupted run resumes and a result from another GPU is never reused.
"""

from __future__ import annotations

import datetime
import hashlib
import itertools
import statistics
import sys

import click

from . import tunedb
from .compile import nvrtc_version
from .errors import SpecError
from .plan import make_plan
from .plan.common import divisors
from .render import render
from .shapes import ConvProblem
from .variants import Layout, Precision, Strategy, Variant, Weights, parse_variant_name

RETIME_TOP = 3
TUNE_MAX_FMAS = 3200  # keeps each candidate's compile under ~20 s
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


def even_segments(width: int, most: int) -> set[int]:
    """Segment lengths of at most ``most`` pixels that split a row of ``width`` into
    ceil(width / segments) pieces: tx is one when ceil(width / ceil(width / tx)) == tx."""
    return {tx for tx in range(1, min(most, width) + 1) if -(-width // -(-width // tx)) == tx}


def persist_candidates(shape: ConvProblem) -> list[Variant]:
    """persist's space: register tiles of up to 16 maps by row segments that waste at
    most a sixth of a row, and bands of Ho/k rows."""
    from .plan.persist import MAX_ACCUMULATORS

    maps = [d for d in divisors(shape.M) if d <= 16]
    even = even_segments(shape.Wo, 34)
    even |= {-(-tx // 4) * 4 for tx in even}  # whole float4 loads of a row
    pixels = sorted(
        (
            tx
            for tx in even
            if 3 <= tx <= min(34, shape.Wo) and -(-shape.Wo // tx) * tx - shape.Wo <= shape.Wo / 6
        ),
        reverse=True,
    )
    rows = sorted({-(-shape.Ho // k) for k in (1, 2, 3, 4, 6, 8, 12)}, reverse=True)
    out = []
    for tm, tx, r in itertools.product(maps, pixels, rows):
        threads = shape.M // tm * r * -(-shape.Wo // tx)
        if tm * tx <= MAX_ACCUMULATORS and 64 <= threads <= 1024 and tm * tx >= 16:
            out.append(Variant(strategy=Strategy.PERSIST, tile=r, regtile=(tm, tx)).canonical())
    return out


def mmapersist_candidates(shape: ConvProblem) -> list[Variant]:
    """mmapersist's space: 1-4 map tiles by 1-4 pixel tiles per warp (at most 64
    accumulators per thread), and bands of Ho/k rows."""
    from .plan.mmapersist import MAX_ACCUMULATORS

    map_tiles = min(4, -(-shape.M // 8))
    rows = sorted({-(-shape.Ho // k) for k in (1, 2, 3, 4, 6, 8)}, reverse=True)
    out = []
    for nt, p, r in itertools.product(range(1, map_tiles + 1), range(1, 5), rows):
        if 4 * nt * p <= MAX_ACCUMULATORS:
            v = Variant(
                strategy=Strategy.MMAPERSIST,
                tile=r,
                regtile=(8 * nt, 16 * p),
                precision=Precision.TF32,
            )
            out.append(v.canonical())
    return out


def stream_candidates(shape: ConvProblem) -> list[Variant]:
    """stream's space: register tiles of 32 to 128 accumulators (or all M maps by at
    least 8 pixels), up to 16 maps by row segments of up to 16 pixels that waste at most
    a sixth of a row; 4 to 32 map groups per block (or all of M); bands of Ho/k rows;
    64 to 512 threads; chunks of 1152 to 9216 FMAs per thread."""
    from .plan.persist import MAX_ACCUMULATORS

    M, Wo, Ho, KK = shape.M, shape.Wo, shape.Ho, shape.K * shape.K
    even = even_segments(Wo, 16)
    even |= {-(-tx // 4) * 4 for tx in even}
    pixels = [
        tx for tx in sorted(even) if 4 <= tx <= min(16, Wo) and -(-Wo // tx) * tx - Wo <= Wo / 6
    ]
    rows = sorted({-(-Ho // k) for k in (1, 2, 3, 4, 6, 8)}, reverse=True)
    channel_divisors = divisors(shape.C)
    out = []
    for tm in (d for d in divisors(M) if d <= 16):
        blocks = {
            bm
            for bm in range(tm, M + 1, tm)
            if M % bm == 0 and (bm // tm in (4, 8, 16, 32) or bm == M)
        }
        for bm, tx, r in itertools.product(sorted(blocks), pixels, rows):
            threads = bm // tm * r * -(-Wo // tx)
            big = 32 <= tm * tx <= MAX_ACCUMULATORS or (tm == M and tx >= 8)
            if not (big and 64 <= threads <= 512):
                continue
            per_channel = KK * tm * tx
            chunks = [
                d for d in channel_divisors if 1152 <= d * per_channel <= 9216
            ] or channel_divisors[:1]
            for cb in chunks:
                v = Variant(strategy=Strategy.STREAM, tile=r, maps=bm, chunk=cb, regtile=(tm, tx))
                out.append(v)
    return out


def candidates(
    shape: ConvProblem, precision: Precision, strategy: Strategy | None = None
) -> list[Variant]:
    """Every variant of the space that the planner accepts, in a stable order; only
    ``strategy``'s when one is named."""
    from .space import complete

    out = []
    map_divisors = [d for d in divisors(shape.M) if d <= 24]
    if precision in (Precision.FP32, Precision.FP16):
        for strat, layout in (
            (Strategy.DIRECT, Layout.NONE),
            (Strategy.TILED, Layout.PLANAR),
            (Strategy.TILED, Layout.INTERLEAVED),
        ):
            for tile, cx, cy, cm, weights in itertools.product(
                (8, 16, 32), (2, 4, 8), (1, 2, 4), map_divisors, (Weights.CONST, Weights.GLOBAL)
            ):
                v = Variant(
                    strategy=strat,
                    tile=tile,
                    coarsening=(cx, cy, cm),
                    layout=layout,
                    weights=weights,
                    precision=precision,
                )
                out.append(complete(shape, v, weights=weights))
    if precision is Precision.FP32:
        for strat, tile, rt in itertools.product(
            (Strategy.IMPLICIT, Strategy.IM2COL), (32, 64, 128), ((2, 2), (4, 4), (8, 4))
        ):
            out.append(Variant(strategy=strat, tile=tile, regtile=rt).canonical())
    if precision in (Precision.TF32, Precision.FP16):
        for tile in (32, 64, 128):
            out.append(Variant(strategy=Strategy.MMA, tile=tile, precision=precision).canonical())
    if precision is Precision.TF32:
        for rows in sorted(
            {shape.Ho, -(-shape.Ho // 2), -(-shape.Ho // 3), -(-shape.Ho // 4), 8, 4}
        ):
            out.append(Variant(strategy=Strategy.MMATILE, tile=rows, precision=precision))
        out += mmapersist_candidates(shape)
    if precision is Precision.FP32:
        out += persist_candidates(shape)
        out += stream_candidates(shape)
    from .plan.direct import unrolled_fmas

    valid, seen = [], set()
    for v in out:
        if strategy is not None and v.strategy is not strategy:
            continue
        if v in seen or (v.strategy.family == "direct" and unrolled_fmas(shape, v) > TUNE_MAX_FMAS):
            continue
        if _runtime_indexed_constant(shape, v):
            continue
        seen.add(v)
        try:
            make_plan(shape, v)
        except SpecError:
            continue
        valid.append(v)
    return valid


def _runtime_indexed_constant(shape, v) -> bool:
    """Constant weights read at a run-time index (several map groups, or a channel
    loop) were 2-4x slower than global weights on the H200 (2026-11-21, layer2:
    18.6 ms against 4.4 ms); only literal constant offsets are worth timing."""
    if v.strategy.family != "direct" or v.weights is not Weights.CONST:
        return False
    return v.coarsening[2] != shape.M or not v.unroll_channels


def _source_hash(shape, v) -> str:
    return hashlib.sha256(render(make_plan(shape, v)).encode()).hexdigest()[:16]


def run_tune(
    shape: ConvProblem,
    precision: Precision,
    budget: int | None,
    echo,
    batch=None,
    strategy: Strategy | None = None,
) -> dict:
    import os

    import numpy as np

    from .bench import bench_variant, ceilings, input_sets, time_launches
    from .parallel import precompile
    from .runtime import Conv, device_arch
    from .verify import random_inputs, verify_variant

    env = environment()
    arch = device_arch()
    batch = batch or shape.batch
    from .space import default_set

    space = candidates(shape, precision, strategy)
    if not space:
        what = f"{strategy.value} in {precision.value}" if strategy else precision.value
        raise SpecError(f"no variant of {what} can serve {shape.slug}: the planner refused all")
    seeds = [v for v in default_set(shape) if v.precision is precision and v in space]
    if budget and len(space) > budget:
        rest = [v for v in space if v not in seeds]
        space = seeds + rest[:: max(1, len(rest) // max(1, budget - len(seeds)))]
        space = space[:budget]
    echo(f"tune {shape.slug} {precision.value} on {env['gpu']}: {len(space)} candidates, B={batch}")
    errors = precompile([(shape, v) for v in space], arch, os.cpu_count() or 1, label="compiled")
    known = tunedb.timings(env, shape.spec, batch)
    ceil = ceilings()
    rng = np.random.default_rng()
    xs = input_sets(shape, batch, rng)
    _, w, bias = random_inputs(shape, 1, rng)
    results, counts = [], dict(verified=0, timed=0, resumed=0, dropped=0)
    with click.progressbar(
        space, label="verified/timed", file=sys.stderr, item_show_func=lambda v: v.name if v else ""
    ) as bar:
        for v in bar:
            if errors.get(v.name):
                counts["dropped"] += 1
                continue
            src = _source_hash(shape, v)
            if (v.name, src) in known:
                results.append((known[(v.name, src)]["ms"], v))
                counts["resumed"] += 1
                continue
            row = verify_variant(shape, v, arch=arch, batch=min(batch, 4), numbers=True, rng=rng)
            if not row.ok:
                counts["dropped"] += 1  # spills, wrong numbers: never timed
                continue
            counts["verified"] += 1
            t = bench_variant(shape, v, batch, xs, w, bias, ceil)
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
    top = [v for _, v in results[:RETIME_TOP]]
    # Interleave the finalists so drift in clocks or temperature hits all alike.
    convs = {v: Conv(shape, v) for v in top}
    for c in convs.values():
        c.set_weights(w, bias)
    samples = {v: [] for v in top}
    for _ in range(RETIME_ROUNDS):
        for v, c in convs.items():
            samples[v] += time_launches(lambda i, c=c: c(xs[i % len(xs)]), reps=10, rotate=len(xs))
    med = {v: statistics.median(s) for v, s in samples.items()}
    order = sorted(top, key=med.get)
    win = order[0]
    spread = {v: statistics.quantiles(samples[v], n=10) for v in top}
    tie = len(order) > 1 and spread[order[1]][0] <= spread[win][-1]
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


# The fastest verified variants that specgen bench and tune measured on one H200
# (2026-11-21, `specgen bench --shape S --variant ...` and `specgen tune`; figures in
# BENCHMARKS.md).  Used by --best only on that GPU and only where this machine's
# database has no winner of its own; anywhere else --best times the default set.
SHIPPED_WINNERS = {
    "NVIDIA H200": {
        "layer1": ["direct_t16_x2y4m4_wconst_uc_fp32", "tiled_t16_x4y1m4_planar_wconst_uc_fp16"],
        "layer2": ["persist_t12_r4x17_fp32", "persist_t34_r8x4_fp32", "mmapersist_t34_r16x48_tf32"],
        "mx-layer1": ["persist_t11_r12x6_fp32", "tiled_t16_x4y1m6_planar_wconst_uc_fp16"],
        "mx-layer2": ["persist_t27_r6x4_fp32", "mmapersist_t27_r24x64_tf32"],
        "ae-enc1": ["stream_t4_m32_c1_r8x4_fp32", "mmatile_t32_tf32", "mma_t64_fp16"],
        "ae-enc2": ["stream_t16_m128_c16_r8x8_fp32", "mma_t64_tf32", "mma_t64_fp16"],
        "ae-dec1": ["stream_t8_m128_c8_r4x8_fp32", "mma_t64_tf32", "mma_t64_fp16"],
        "ae-dec2": ["stream_t16_m128_c16_r4x16_fp32", "mma_t64_tf32", "mma_t64_fp16"],
        "ae-dec3": ["stream_t32_m3_c16_r3x8_fp32", "tiled_t8_x4y1m3_planar_wconst_lc_fp16"],
    }
}


def best_picks(shape: ConvProblem, gpu: str) -> list[tuple[Variant, str | None]]:
    """(variant, banner note) for each precision's winner on ``gpu``: this machine's
    database first, else the winners shipped for that GPU, else nothing.  All or
    nothing: a recorded winner that the planner now refuses is an error that names its
    database line."""
    found = tunedb.winners(shape.spec, gpu)
    if not found:
        shipped = SHIPPED_WINNERS.get(gpu, {}).get(shape.slug, []) if shape.name else []
        return [(parse_variant_name(name), None) for name in shipped]
    picks = []
    for r in found.values():
        try:
            v = parse_variant_name(r["variant"])
            make_plan(shape, v)
        except SpecError as e:
            raise SpecError(
                f"{tunedb.db_path()} line {r['line']}: the recorded winner '{r['variant']}' "
                f"cannot be planned any more ({e}); run specgen tune again"
            ) from None
        tie = f", a tie with {r['runner_up']}" if r.get("tie") else ""
        note = f"tuned winner: {r['ms']:.4f} ms at B={r['batch']} on {r['gpu']}, {r['date']}{tie}"
        picks.append((v, note))
    return picks
