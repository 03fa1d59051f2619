"""The command line: a thin layer over shapes -> plan -> render -> compile -> verify."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path

import click

from . import __version__
from .errors import SpecError
from .shapes import PRESETS, parse_shape
from .variants import (
    Strategy,
    Variant,
    parse_coarsening,
    parse_layout,
    parse_precision,
    parse_regtile,
    parse_strategy,
    parse_variant_name,
    parse_weights,
)


class Group(click.Group):
    """Bad input is one line on stderr and exit status 2, never a traceback."""

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except SpecError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(2)


@click.group(cls=Group)
@click.version_option(__version__)
def main():
    """specgen: CUDA convolution kernels specialized for one shape and one variant."""


@main.command()
def shapes():
    """List the presets with their derived sizes."""
    head = f"{'preset':<10} {'C':>4} {'M':>4} {'HxW':>7} {'K':>2} {'pad':>3} {'out':>13} {'weights B':>10} {'B':>6} {'GFLOP':>8}"
    click.echo(head)
    click.echo("-" * len(head))
    for s in PRESETS.values():
        click.echo(
            f"{s.name:<10} {s.C:>4} {s.M:>4} {f'{s.H}x{s.W}':>7} {s.K:>2} {s.pad:>3} "
            f"{f'{s.M}x{s.Ho}x{s.Wo}':>13} {4 * s.weight_count:>10} {s.batch:>6} {s.flops(s.batch) / 1e9:>8.2f}"
        )


def variant_options(f):
    opts = [
        click.option(
            "--variant", "variant_name", help="a canonical variant name (as in generated/)"
        ),
        click.option(
            "--strategy",
            default=None,
            help="direct, tiled, split, im2col, implicit, mma, mmatile, persist, mmapersist, stream",
        ),
        click.option(
            "--tile",
            type=int,
            default=None,
            help="output tile edge (direct family), pixels per block (GEMM), "
            "output rows per band (mmatile, persist, mmapersist, stream)",
        ),
        click.option("--coarsening", default=None, help="outputs per thread: xAyBmC"),
        click.option("--layout", default=None, help="shared tile layout: planar or inter"),
        click.option("--weights", default=None, help="const or global"),
        click.option("--precision", default=None, help="fp32, tf32 or fp16"),
        click.option("--unroll-channels/--loop-channels", "unroll", default=None),
        click.option(
            "--regtile",
            default=None,
            help="register tile RxC: maps x pixels per thread (per warp for mmapersist)",
        ),
        click.option("--splits", type=int, default=None, help="split: channel groups"),
        click.option("--maps", type=int, default=None, help="stream: output maps per block"),
        click.option("--chunk", type=int, default=None, help="stream: channels per stage"),
    ]
    for opt in reversed(opts):
        f = opt(f)
    return f


def build_variant(
    shape,
    variant_name=None,
    strategy=None,
    tile=None,
    coarsening=None,
    layout=None,
    weights=None,
    precision=None,
    unroll=None,
    regtile=None,
    splits=None,
    maps=None,
    chunk=None,
) -> Variant:
    from .space import SHAPE_DEFAULTS, complete, default_coarsening

    if variant_name:
        return parse_variant_name(variant_name)
    v = Variant(strategy=parse_strategy(strategy) if strategy else Strategy.TILED)
    if v.strategy in SHAPE_DEFAULTS:
        base = SHAPE_DEFAULTS[v.strategy](shape)
        return replace(
            base,
            tile=tile if tile is not None else base.tile,
            regtile=parse_regtile(regtile) if regtile else base.regtile,
            precision=parse_precision(precision) if precision else base.precision,
            maps=maps if maps is not None else base.maps,
            chunk=chunk if chunk is not None else base.chunk,
        ).canonical()
    if precision:
        v = replace(v, precision=parse_precision(precision))
    v = replace(v, tile=tile if tile is not None else (16 if v.strategy.family == "direct" else 64))
    if layout:
        v = replace(v, layout=parse_layout(layout))
    if regtile:
        v = replace(v, regtile=parse_regtile(regtile))
    elif v.strategy in (Strategy.IM2COL, Strategy.IMPLICIT):
        v = replace(v, regtile=(4, 4))
    if splits is not None:
        v = replace(v, splits=splits)
    elif v.strategy is Strategy.SPLIT:
        v = replace(v, splits=2)
    asked = parse_weights(weights) if weights else None
    if v.strategy.family == "direct":
        if v.tile < 1:
            raise SpecError(f"tile must be at least 1, got {v.tile}")
        cz = (
            parse_coarsening(coarsening)
            if coarsening
            else default_coarsening(shape, v.tile, v.precision, asked, v.strategy)
        )
        v = replace(v, coarsening=cz)
    return complete(shape, v, unroll=unroll, weights=asked)


@main.command()
@click.option(
    "--shape",
    "shape_text",
    required=True,
    help="a preset name or C=..,M=..,H=..,W=..,K=..[,pad=..]",
)
@variant_options
@click.option("--all", "all_", is_flag=True, help="emit the default variant set of the shape")
@click.option(
    "--out",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="output folder (default generated/)",
)
@click.option("--best", is_flag=True, help="emit the tuned winners (see specgen tune)")
def emit(shape_text, all_, out, best, **opts):
    """Write generated/<shape>/<variant>.cu."""
    from .emit import GENERATED, emit as emit_one
    from .space import default_set

    shape = parse_shape(shape_text)
    notes = {}
    if best:
        from .tune import winners

        found = winners(shape)
        if not found:
            raise SpecError(
                f"no tuned winner for {shape.slug}: run specgen tune --shape {shape.slug} on a GPU"
            )
        for r in found.values():
            tie = f", a tie with {r['runner_up']}" if r.get("tie") else ""
            notes[parse_variant_name(r["variant"])] = (
                f"tuned winner: {r['ms']:.4f} ms at B={r['batch']} on {r['gpu']}, {r['date']}{tie}"
            )
        variants = list(notes)
    else:
        variants = default_set(shape) if all_ else [build_variant(shape, **opts)]
    for v in variants:
        path, changed = emit_one(shape, v, out or GENERATED, note=notes.get(v))
        click.echo(f"{'wrote' if changed else 'unchanged'} {path}")


def _selected(shape_text, all_, opts):
    """(shape, variant) pairs: one built variant if any variant option is given beyond
    --strategy, else each shape's default set (filtered by --strategy)."""
    from .space import default_set

    if all_ == bool(shape_text):
        raise SpecError("give --shape S or --all")
    shapes = list(PRESETS.values()) if all_ else [parse_shape(shape_text)]
    strategy = opts.get("strategy")
    out = []
    for shape in shapes:
        if any(v is not None for k, v in opts.items() if k != "strategy"):
            variants = [build_variant(shape, **opts)]
        else:
            variants = default_set(shape)
            if strategy:
                variants = [v for v in variants if v.strategy is parse_strategy(strategy)]
        out += [(shape, v) for v in variants]
    return out


@main.command()
@click.option("--shape", "shape_text", default=None)
@click.option("--all", "all_", is_flag=True, help="every preset")
@click.option("--batch", type=int, default=None, help="images per check (default 4)")
@click.option("--arch", default=None, help="target without a GPU (default sm_90)")
@click.option("--jobs", type=int, default=os.cpu_count(), help="parallel compilations")
@variant_options
def verify(shape_text, all_, batch, arch, jobs, **opts):
    """Compile every variant, check its resources and, on a GPU, its numbers."""
    import numpy as np

    from .compile import DEFAULT_ARCH
    from .runtime import device_arch, gpu_available
    from .verify import format_table, verify_variant
    from .parallel import precompile

    selected = _selected(shape_text, all_, opts)
    gpu = gpu_available()
    arch = device_arch() if gpu else (arch or DEFAULT_ARCH)
    if batch is not None and batch < 1:
        raise SpecError(f"batch must be at least 1, got {batch}")
    precompile(selected, arch, jobs, label="compiling")
    rng = np.random.default_rng()
    rows = []
    with click.progressbar(selected, label="verifying", file=sys.stderr) as bar:
        for shape, v in bar:
            rows.append(verify_variant(shape, v, arch=arch, batch=batch or 4, numbers=gpu, rng=rng))
    click.echo(format_table(rows))
    failed = sum(not r.ok for r in rows)
    if not gpu:
        click.echo(
            f"no GPU: compiled for {arch} and checked resources only; the numerical check needs a GPU"
        )
    click.echo(f"verify: {len(rows) - failed} passed, {failed} failed")
    sys.exit(1 if failed else 0)


def _need_gpu(verb: str) -> None:
    from .runtime import gpu_available

    if not gpu_available():
        raise SpecError(f"{verb} times kernels and needs a CUDA GPU; none is visible here")


@main.command()
@click.option("--shape", "shape_text", default=None)
@click.option("--all-shapes", is_flag=True, help="every preset")
@click.option("--batch", type=int, default=None, help="images (default: the preset's batch)")
@click.option("--variant", "names", multiple=True, help="variant names to time (repeatable)")
@click.option("--best", is_flag=True, help="the tuned winner of each precision")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path), default=None)
@click.option("--plot", "plot_path", type=click.Path(dir_okay=False, path_type=Path), default=None)
def bench(shape_text, all_shapes, batch, names, best, json_path, plot_path):
    """Time variants beside cuDNN and the hardware floor."""
    import json

    from .bench import run_bench

    _need_gpu("bench")
    if all_shapes == bool(shape_text):
        raise SpecError("give --shape S or --all-shapes")
    shapes = list(PRESETS.values()) if all_shapes else [parse_shape(shape_text)]
    if batch is not None and batch < 1:
        raise SpecError(f"batch must be at least 1, got {batch}")
    variants = {s.slug: [parse_variant_name(n) for n in names] for s in shapes} if names else None
    report = run_bench(shapes, batch, variants, best, echo=click.echo)
    if json_path:
        from .files import write_if_different

        write_if_different(json_path, json.dumps(report, indent=1) + "\n")
        click.echo(f"wrote {json_path}")
    if plot_path:
        from .plot import roofline

        roofline(report, plot_path)
        click.echo(f"wrote {plot_path}")


@main.command()
@click.option("--shape", "shape_text", required=True)
@click.option("--precision", default="fp32", help="fp32, tf32 or fp16")
@click.option("--budget", type=int, default=40, help="most candidates to time (sampled evenly)")
@click.option("--batch", type=int, default=None, help="images (default: the preset's batch)")
@click.option("--strategy", default=None, help="search only this strategy's variants")
def tune(shape_text, precision, budget, batch, strategy):
    """Search the variant space of every strategy for the fastest verified kernel."""
    shape = parse_shape(shape_text)
    prec = parse_precision(precision)
    strat = parse_strategy(strategy) if strategy else None
    _need_gpu("tune")
    from .tune import run_tune

    run_tune(shape, prec, budget, echo=click.echo, batch=batch, strategy=strat)
