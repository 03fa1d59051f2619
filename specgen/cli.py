"""The command line: a thin layer over shapes -> plan -> render -> compile -> verify.

Every verb selects shapes the same way (``--shape S`` or ``--all-shapes``, every
preset) and variants the same way: the variant options build one variant, ``--variant``
names one, ``--all`` is the shape's default set (``--strategy`` may filter it).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import signal
from dataclasses import replace
import sys
import time
from pathlib import Path

import click

from . import __version__
from .errors import SpecError, one_line
from .shapes import INDEX_LIMIT, PRESETS, Op, parse_shape
from .strategies import (
    BY_KEY,
    default_strategy,
    options,
    parse_variant_name,
    readers,
    strategy_class,
)
from .variants import Count, Precision, Variant, parse_precision

SIZE = click.IntRange(1, INDEX_LIMIT)


def flag(key: str) -> str:
    """How a variant option is spelled on the command line, for messages."""
    if key == "variant_name":
        return "--variant"
    codec = options().get(key, {}).get("codec")
    if codec is not None and codec.flag:
        return "--%s/--%s" % codec.flag
    return "--" + key.replace("_", "-")


def fail(message: str, status: int = 2):
    click.echo(f"error: {one_line(message)}", err=True)
    sys.exit(status)


class _Stop:
    """SIGTERM handled as Ctrl-C is: the work in progress unwinds (a pool of compile
    workers is ended, not left running), then exit status 143."""

    received = False

    def __call__(self, signum, frame):
        self.received = True
        raise KeyboardInterrupt


# click 8.2 and later raise this for a bare group; 8.1 prints the help and exits itself.
NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())


class Group(click.Group):
    """Bad input is one line on stderr and exit status 2, never a traceback: click's
    own usage errors, specgen's refusals, and files that cannot be written."""

    def main(self, *args, **kwargs):
        kwargs["standalone_mode"] = False
        stop = _Stop()
        try:
            previous = signal.signal(signal.SIGTERM, stop)
        except ValueError:  # not the main thread (an embedding program's worker)
            previous = None
        try:
            code = super().main(*args, **kwargs)
        except NO_ARGS_IS_HELP as e:  # bare `specgen`: the help as it reads, lines and all
            click.echo(e.ctx.get_help())
            sys.exit(0)
        except click.exceptions.ClickException as e:
            fail(e.format_message(), e.exit_code)
        except click.exceptions.Abort:
            # Ctrl-C or SIGTERM: workers ended, every file written is whole
            fail(*(("terminated", 143) if stop.received else ("interrupted", 130)))
        except SpecError as e:
            fail(str(e))
        except OSError as e:
            where = f"{e.filename}: " if e.filename else ""
            fail(f"{where}{e.strerror or e}")
        finally:
            if previous is not None:
                signal.signal(signal.SIGTERM, previous)
        sys.exit(code if isinstance(code, int) else 0)


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


@main.command()
@click.argument("name", required=False)
@click.option("--markdown", is_flag=True, help="the whole catalog as docs/strategies.md holds it")
def strategies(name, markdown):
    """List the strategies (ops, math, what each is), or describe the one called NAME:
    what it serves, its options with their defaults, its templates."""
    from .strategies import TABLE
    from .strategies.catalog import catalog, describe, lookup

    if markdown:
        click.echo(catalog(), nl=False)
    elif name:
        click.echo(describe(lookup(name)), nl=False)
    else:
        click.echo(f"{'strategy':<11} {'computes':<19} {'math':<16} what it is")
        for cls in TABLE:
            ops = ",".join(o.value for o in cls.ops_in_order())
            math = ",".join(p.value for p in cls.precisions)
            click.echo(f"{cls.key:<11} {ops:<19} {math:<16} {cls.description}")


OP_HELP = (
    "fprop (default), dgrad, wgrad, bgrad, or all of them: the pass of the shape's layer "
    "(its act is the forward pass's; wgrad with a bias adds db)"
)


def shape_options(f):
    f = click.option("--op", "op_text", default=None, help=OP_HELP)(f)
    f = click.option("--all-shapes", is_flag=True, help="every preset (see specgen shapes)")(f)
    return click.option(
        "--shape",
        "shape_text",
        default=None,
        help="a preset name or an inline spec C=..,M=..,H=..,W=..,K=..[,pad=..]",
    )(f)


def variant_options(f):
    """--variant, --strategy, --precision, and one option per strategy parameter (from
    the parameter fields of ``specgen/strategies``), each saying who reads it."""
    opts = [
        click.option(
            "--variant", "variant_name", help="a canonical variant name (as in generated/)"
        ),
        click.option(
            "--strategy",
            default=None,
            help=f"{', '.join(BY_KEY)}; with --all, keeps that strategy's variants of the "
            "default set",
        ),
        click.option(
            "--precision",
            default=None,
            help="fp32, tf32, fp16 or bf16 (the math; the tensors' dtype is the shape's)",
        ),
    ]
    for key, opt in options().items():
        text = "; ".join(opt["helps"])
        codec = opt["codec"]
        if codec.flag:
            on, off = codec.flag
            opts.append(click.option(f"--{on}/--{off}", key, default=None, help=text))
        else:
            kind = SIZE if isinstance(codec, Count) else str
            opts.append(click.option(f"--{key}", type=kind, default=None, help=text))
    for opt in reversed(opts):
        f = opt(f)
    return f


def _given(opts: dict) -> list[str]:
    return [k for k, v in opts.items() if v is not None]


def _asks_the_pick(opts: dict) -> bool:
    """No variant option but perhaps --precision: the pick, in that math."""
    return _given(opts) in ([], ["precision"])


def build_variant(shape, **opts) -> Variant:
    """One variant from the variant options: what is given, the strategy's defaults
    for the rest.  An option the strategy does not read is an error."""
    given = _given(opts)
    if "variant_name" in given:
        extra = [flag(k) for k in given if k != "variant_name"]
        if extra:
            raise SpecError(f"--variant names a whole variant; drop {', '.join(extra)}")
        return parse_variant_name(opts["variant_name"], shape)
    cls = strategy_class(opts["strategy"]) if "strategy" in given else default_strategy(shape)
    own = {f.name: f.metadata["codec"] for f in cls.params()}
    values = {}
    for key in given:
        if key in ("strategy", "precision"):
            continue
        if key not in own:
            raise SpecError(
                f"{flag(key)} does not apply to {cls.key}; it is read by {', '.join(readers(key))}"
            )
        values[key] = own[key].from_option(opts[key])
    precision = parse_precision(opts["precision"]) if "precision" in given else None
    return cls.build(cls.problem_for(shape), precision, values)


def _shapes(shape_text, all_shapes, op_text=None):
    if (shape_text is not None) == all_shapes:
        raise SpecError("give --shape S or --all-shapes (every preset)")
    shapes = list(PRESETS.values()) if all_shapes else [parse_shape(shape_text)]
    if op_text is not None and op_text.lower() == "all":
        from .shapes import Op

        return [s.with_op(op) for s in shapes for op in Op if s.op in (Op.FPROP, op)]
    return [_with_op(s, op_text) for s in shapes]


def _with_op(shape, op_text, all_allowed=True):
    from .shapes import Op

    if op_text is None:
        return shape
    op = next((o for o in Op if o.value == op_text.lower()), None)
    if op is None:
        names = ", ".join(o.value for o in Op)
        raise SpecError(
            f"unknown op '{op_text}'; choose one of {names}"
            + (" or all" if all_allowed else " (tune searches one op at a time)")
        )
    if shape.op is not Op.FPROP and shape.op is not op:
        raise SpecError(f"--op {op.value} and the spec's op={shape.op.value} disagree; drop one")
    return shape.with_op(op)


def _default_set(shape, strategy_text=None):
    """The shape's default set, only ``strategy_text``'s variants if one is named; when
    the set has none of that strategy, its default variant, or the planner's reason."""
    from .strategies import default_set

    variants = default_set(shape)
    if strategy_text is None:
        return variants
    cls = strategy_class(strategy_text)
    return [v for v in variants if type(v) is cls] or [build_variant(shape, strategy=strategy_text)]


def pick_gpu(gpu: str | None) -> str:
    """Whose pick a verb without variant options takes: ``--gpu``, else the GPU
    present, else none ("": the planner's default, as for a GPU never tuned)."""
    if gpu is not None:
        return gpu
    from .runtime import gpu_available

    if not gpu_available():
        return ""
    from .bench import device_name

    return device_name()


def the_pick(shape, gpu: str, precision: Precision | None = None) -> tuple[Variant, str]:
    """The kernel the PyTorch operator runs for ``shape`` on ``gpu`` (``choose``: the
    tuned winner, else the shipped one, else the planner's default; fp32 tensors in fp32
    math, or with tf32 allowed where ``precision`` is tf32) and one line saying which
    and why."""
    from .choose import choose, computed_problem

    if precision is not None and precision.value != shape.dtype.value:
        if not (precision is Precision.TF32 and shape.dtype.value == "fp32"):
            raise SpecError(
                f"the pick of {shape.dtype.value} tensors computes in {shape.dtype.value}"
                + (" or tf32" if shape.dtype.value == "fp32" else "")
                + f", not {precision.value}; name a --strategy for other math"
            )
    tf32 = precision is Precision.TF32
    c = choose(shape, gpu, allow_tf32=tf32)
    whose = f"on {gpu}" if gpu else "with no GPU present or named (--gpu NAME)"
    line = f"the pick {whose}{', tf32 allowed' if tf32 else ''}: {c.why}"
    try:
        there = computed_problem(shape, gpu, allow_tf32=tf32)
    except SpecError:
        there = shape
    if there != shape:  # another layout, padded channels, or a cropped window
        k = choose(there, gpu, allow_tf32=tf32).variant.kernel_name(there)
        line += f"; the PyTorch operator computes it as {there.spec} instead, {_how(shape, there)}, with {k}"
    return c.variant, line


def _how(shape, there) -> str:
    """How the operator's computed problem ``there`` differs from ``shape``, in words."""
    how = []
    if (there.R, there.S) != (shape.R, shape.S):
        how.append("over the taps of its window that meet x")
    if there.C != shape.C:
        how.append("x's channels padded with zeros")
    if there.layout is not shape.layout:
        how.append("its tensors copied there")
    return " and ".join(how)


def select(shapes, opts, all_, *, default_is_set: bool, gpu: str = "", notes=None):
    """(shape, variant) pairs.  The default set when ``--all`` is given (or when only
    ``--strategy`` is and ``default_is_set``), the one variant the options build where
    they are given, else the pick (``the_pick`` on ``gpu``, in ``--precision``'s math
    where only that is given; its line appended to
    ``notes`` where given).  With several shapes, a shape that the asked strategy cannot
    serve is skipped with a note; with one, that is an error."""
    from .plan import make_plan

    given = _given(opts)
    beyond_strategy = [flag(k) for k in given if k != "strategy"]
    if all_ and beyond_strategy:
        raise SpecError(
            "--all is the shape's default variant set; it takes no variant options but "
            f"--strategy (got {', '.join(beyond_strategy)})"
        )
    use_set = all_ or (default_is_set and given and not beyond_strategy)
    out = []
    for shape in shapes:
        try:
            if use_set:
                variants = _default_set(shape, opts.get("strategy"))
            elif _asks_the_pick(opts):
                math = parse_precision(opts["precision"]) if given else None
                v, note = the_pick(shape, gpu, math)
                variants = [v]
                if notes is not None:
                    notes.append(note)
            else:
                variants = [build_variant(shape, **opts)]
            for v in variants:
                make_plan(shape, v)  # refuse here, before any work or output starts
        except SpecError as e:
            if len(shapes) == 1:
                raise
            click.echo(f"skipped {shape.slug}: {one_line(str(e))}")
            continue
        out += [(shape, v) for v in variants]
    if not out:
        raise SpecError("no preset can be served by the asked variant")
    return out


@main.command()
@shape_options
@variant_options
@click.option(
    "--all", "all_", is_flag=True, help="the shape's default variant set (what generated/ holds)"
)
@click.option(
    "--best", is_flag=True, help="the tuned winners on one GPU (see specgen tune and --gpu)"
)
@click.option(
    "--gpu",
    default=None,
    help="whose pick or (--best) winners, e.g. 'NVIDIA H200' (default: the GPU present)",
)
@click.option(
    "--batch",
    type=SIZE,
    default=None,
    help="images the pick is fitted to, as the operator's first call (default: the preset's)",
)
@click.option(
    "--out",
    type=click.Path(path_type=Path),
    default=None,
    help="output folder (default: generated/ in the current folder)",
)
def emit(shape_text, all_shapes, op_text, all_, best, gpu, batch, out, **opts):
    """Write <out>/<shape>/<variant>.cu: the pick (the kernel the PyTorch operator
    would run) where no variant option is given."""
    from .emit import GENERATED, source_file
    from .files import write_if_different

    shapes = _shapes(shape_text, all_shapes, op_text)
    if batch is not None:
        shapes = [replace(s, batch=batch) for s in shapes]
    if gpu is not None and not best and (not _asks_the_pick(opts) or all_):
        raise SpecError(
            "--gpu names whose pick (no variant options but --precision) or winners "
            "(--best) to emit; "
            "drop it or the variant options"
        )
    if best:
        if _given(opts) or all_:
            got = [flag(k) for k in _given(opts)] + (["--all"] if all_ else [])
            raise SpecError(f"--best emits the tuned winners; drop {', '.join(got)}")
        picks = [(s, v, note) for s in shapes for v, note in _best(s, gpu)]
    else:
        notes = []
        chosen = select(shapes, opts, all_, default_is_set=False, gpu=pick_gpu(gpu), notes=notes)
        notes = notes if len(notes) == len(chosen) else [None] * len(chosen)
        picks = [(s, v, note) for (s, v), note in zip(chosen, notes)]
    # Render everything before writing anything: a refusal leaves no partial set.
    files = [source_file(s, v, out or GENERATED, note) for s, v, note in picks]
    for path, text in files:
        try:
            changed = write_if_different(path, text)
        except OSError as e:
            raise SpecError(f"cannot write {path}: {e.strerror or e}") from None
        click.echo(f"{'wrote' if changed else 'unchanged'} {path}")


def _best(shape, gpu):
    from . import tunedb
    from .runtime import gpu_available
    from .choose import best_picks

    if gpu is None:
        if not gpu_available():
            known = sorted(set(tunedb.recorded_gpus()) | set(tunedb.shipped()))
            raise SpecError(
                "--best picks the winners of one GPU and none is visible here; name it with "
                f"--gpu (winners are known for: {', '.join(known) or 'none'})"
            )
        from .bench import device_name

        gpu = device_name()
    elif not gpu.strip() or one_line(gpu) != gpu or len(gpu) > 200:
        raise SpecError(
            f"--gpu names a GPU as the driver spells it, e.g. 'NVIDIA H200', not {gpu!r}"
        )
    picks = best_picks(shape, gpu)
    if not picks:
        backward = shape.op.value != "fprop"
        what = f"{shape.slug} {shape.op.value}" if backward else shape.slug
        how = f"{shape.name} --op {shape.op.value}" if shape.name and backward else None
        raise SpecError(
            f"no tuned winner for {what} on {gpu}: run specgen tune --shape "
            f"{how or shape.name or shape.spec} on that GPU"
        )
    return picks


def _check_arch(arch):
    from .compile import supported_arch

    if arch is not None:
        supported_arch(arch)


@main.command()
@shape_options
@variant_options
@click.option("--all", "all_", is_flag=True, help="the shape's default variant set")
@click.option(
    "--gpu", default=None, help="without variant options: whose pick (default: the GPU present)"
)
@click.option("--batch", type=SIZE, default=None, help="images per check (default 4)")
@click.option("--arch", default=None, help="target without a GPU, sm_XX (default sm_90)")
@click.option(
    "--jobs",
    type=click.IntRange(1, 1024),
    default=os.cpu_count() or 1,
    help="parallel compilations (default: the CPU count)",
)
def verify(shape_text, all_shapes, op_text, all_, gpu, batch, arch, jobs, **opts):
    """Compile the variants, check their resources and, on a GPU, their numbers: the
    pick where no variant option is given, --all for the default set."""
    import numpy as np

    from .compile import DEFAULT_ARCH
    from .parallel import precompile
    from .runtime import device_arch, gpu_available
    from .verify import format_table, verify_variant

    _check_arch(arch)
    notes = []
    selected = select(
        _shapes(shape_text, all_shapes, op_text),
        opts,
        all_,
        default_is_set=True,
        gpu=pick_gpu(gpu),
        notes=notes,
    )
    for (shape, v), note in zip(selected, notes):
        click.echo(f"{shape.slug}: {v.kernel_name(shape)}, {note}")
    gpu = gpu_available()
    if gpu:
        if arch is not None and arch != device_arch():
            raise SpecError(
                f"--arch {arch} does not apply here: verify runs on the GPU present, "
                f"{device_arch()}; drop --arch"
            )
        arch = device_arch()
    arch = arch or DEFAULT_ARCH
    precompile(selected, arch, jobs, label="compiling")
    rng = np.random.default_rng()
    rows = []
    with click.progressbar(selected, label="verifying", file=sys.stderr) as bar:
        for shape, v in bar:
            rows.append(verify_variant(shape, v, arch=arch, batch=batch or 4, numbers=gpu, rng=rng))
    click.echo(format_table(rows))
    failed = sum(not r.ok for r in rows)
    if gpu:
        click.echo(f"verify: {len(rows) - failed} passed, {failed} failed")
    else:
        click.echo(
            f"verify: {len(rows) - failed} compiled for {arch} with their planned resources, "
            f"{failed} failed; numbers not checked: that needs a GPU"
        )
    sys.exit(1 if failed else 0)


def _need_gpu(verb: str) -> None:
    from .runtime import gpu_available

    if not gpu_available():
        raise SpecError(f"{verb} times kernels and needs a CUDA GPU; none is visible here")


def _writable_file(path: Path | None, option: str) -> None:
    """Refuse a report path that cannot be written before the long run, not after."""
    if path is None:
        return
    if path.is_dir():
        raise SpecError(f"{option} {path} is a folder; name a file")
    parent = path.parent
    for folder in (parent, *parent.parents):
        if folder.exists():
            if not folder.is_dir():
                raise SpecError(f"{option} {path}: {folder} is not a folder")
            if not os.access(folder, os.W_OK | os.X_OK):
                raise SpecError(f"{option} {path}: {folder} is not writable")
            break


@main.command()
@shape_options
@click.option("--batch", type=SIZE, default=None, help="images (default: the preset's batch)")
@click.option("--variant", "names", multiple=True, help="variant names to time (repeatable)")
@click.option("--all", "all_", is_flag=True, help="the default variant set")
@click.option("--best", is_flag=True, help="the tuned winner of each precision on this GPU")
@click.option(
    "--json",
    "json_path",
    type=click.Path(path_type=Path),
    default=None,
    help="also write the report as JSON here",
)
@click.option(
    "--plot",
    "plot_path",
    type=click.Path(path_type=Path),
    default=None,
    help="also draw a roofline chart here (PNG; needs matplotlib)",
)
def bench(shape_text, all_shapes, op_text, batch, names, all_, best, json_path, plot_path):
    """Time variants beside cuDNN and the hardware floor: the pick where none is named,
    --all for the default set, --best for the tuned winners."""
    import json

    from .bench import report_key, run_bench

    shapes = _shapes(shape_text, all_shapes, op_text)
    if sum((bool(names), all_, best)) > 1:
        raise SpecError("choose one of --variant, --all and --best")
    _writable_file(json_path, "--json")
    _writable_file(plot_path, "--plot")
    if plot_path:
        from .plot import require_matplotlib

        require_matplotlib()
    variants = (
        {report_key(s): [parse_variant_name(n, s) for n in names] for s in shapes}
        if names
        else None
    )
    _need_gpu("bench")
    if not (names or all_ or best):  # the pick, fitted to the batch timed
        from .bench import device_name

        variants = {}
        for s in shapes:
            v, note = the_pick(replace(s, batch=batch or s.batch), device_name())
            click.echo(f"{s.slug}: {v.kernel_name(s)}, {note}")
            variants[report_key(s)] = [v]
    report = run_bench(shapes, batch, variants, best, echo=click.echo)
    if json_path:
        from .files import atomic_write

        atomic_write(json_path, (json.dumps(report, indent=1) + "\n").encode())
        click.echo(f"wrote {json_path}")
    if plot_path:
        from .plot import roofline

        roofline(report, plot_path)
        click.echo(f"wrote {plot_path}")


@main.command()
@click.option("--shape", "shape_text", required=True, help="a preset name or an inline spec")
@click.option("--batch", type=SIZE, default=None, help="images (default: the preset's batch)")
@click.option("--streams", type=SIZE, default=4, help="streams that overlap copies and kernels")
@click.option(
    "--segment",
    type=SIZE,
    default=None,
    help="images per copy-kernel-copy step (default: batch/4K)",
)
@click.option("--variant", "name", default=None, help="the kernel (default: the fastest known)")
def run(shape_text, batch, streams, segment, name):
    """Convolve a batch that lives in host memory: copy in, kernel, copy out, overlapped
    on several streams from pinned memory, beside the serial copy-kernel-copy and the
    host link's floor."""
    shape = parse_shape(shape_text)
    if shape.op is not Op.FPROP:
        raise SpecError("run convolves host batches forward: drop op= from the spec")
    variant = parse_variant_name(name, shape) if name else None
    _need_gpu("run")
    from .bench import device_name
    from .choose import choose
    from .runtime import device_arch
    from .streamed import run_streamed

    if variant is None:
        picked = choose(shape, device_name(), arch=device_arch())
        variant = picked.variant
        click.echo(f"{shape.slug}: {variant.name} ({picked.why})")
    batch = batch or shape.batch
    t = run_streamed(shape, variant, batch, streams, segment)
    click.echo(
        f"{shape.slug} B={batch} on {device_name()}: host link {t.h2d_gbs:.1f} GB/s in, "
        f"{t.d2h_gbs:.1f} GB/s out"
    )
    rows = [
        ("kernel alone (data on the GPU)", t.kernel_ms),
        ("serial: copy in, kernel, copy out", t.serial_ms),
        (f"{t.streams} streams, {t.segment}-image segments", t.streamed_ms),
        ("host-link floor", t.floor_ms),
    ]
    for what, ms in rows:
        click.echo(f"  {what:<36} {ms:>9.3f} ms  {ms / t.floor_ms:>5.2f}x the floor")
    click.echo(
        f"  streamed y {'equals' if t.identical else 'DIFFERS FROM'} the serial y, bit for bit"
    )
    if not t.identical:
        raise SystemExit(1)


def _tune_math(shape, strat) -> str:
    """fp32, unless the strategy has no fp32 math for the shape's tensors (tcgemm's and
    tcwgrad's is for fp32 tensors only): then the tensors' own 16-bit math where it has
    that, else its first."""
    if strat is None:
        return "fp32"
    if Precision.FP32 in strat.precisions:
        try:
            strat.default(strat.problem_for(shape), Precision.FP32)
            return "fp32"
        except SpecError:
            pass
    own = shape.dtype.value
    return own if own in {p.value for p in strat.precisions} else strat.precisions[0].value


@main.command()
@click.option("--shape", "shape_text", default=None, help="a preset name or an inline spec")
@click.option(
    "--problems",
    "problems_path",
    type=click.Path(path_type=Path),
    default=None,
    help="a file of problem specs, one a line (with op=), tuned together on Dask",
)
@click.option(
    "--model",
    "model_name",
    default=None,
    help="every conv problem and op of a torchvision model or unet (fp32 NCHW, bf16 channels_last)",
)
@click.option(
    "--compile-only",
    is_flag=True,
    help="with --problems or --model: the fan-out's compile phase alone, no GPU needed",
)
@click.option(
    "--workers",
    type=click.IntRange(1, 4096),
    default=os.cpu_count() or 1,
    help="compile processes of the embedded Dask cluster (default: the CPU count)",
)
@click.option(
    "--gpus",
    type=click.IntRange(1, 4096),
    default=None,
    help="GPU workers of the embedded cluster, one a GPU (default: every GPU visible)",
)
@click.option(
    "--item-limit",
    type=click.FloatRange(1, None),
    default=30.0,
    show_default=True,
    help="seconds a candidate may take on a GPU worker before it is dropped as hung",
)
@click.option("--scheduler", default=None, help="the address of a Dask scheduler to run on instead")
@click.option("--arch", default=None, help="with --compile-only: sm_XX (default sm_90)")
@click.option(
    "--precision",
    default=None,
    help="fp32, tf32, fp16 or bf16 (the math; the tensors' dtype is the shape's; default "
    "fp32, or for a --strategy without fp32 math the tensors' own 16-bit one)",
)
@click.option(
    "--budget",
    type=SIZE,
    default=40,
    help="most candidates to time (sampled evenly)",
)
@click.option("--batch", type=SIZE, default=None, help="images (default: the preset's batch)")
@click.option(
    "--image",
    type=SIZE,
    default=None,
    help="with --model: the image side in pixels (default: the model's, 224 for most)",
)
@click.option(
    "--timings-from",
    "timings_path",
    type=click.Path(path_type=Path),
    default=None,
    help="with --problems or --model: an earlier tune's database (.jsonl or .jsonl.gz) "
    "whose timings this one takes, timing only what they lack and each problem's "
    "finalists again",
)
@click.option("--strategy", default=None, help="search only this strategy's variants")
@click.option(
    "--op",
    "op_text",
    default=None,
    help="fprop (default), dgrad, wgrad or bgrad: the pass to tune, one at a time",
)
def tune(
    shape_text,
    problems_path,
    model_name,
    compile_only,
    workers,
    gpus,
    item_limit,
    scheduler,
    arch,
    precision,
    budget,
    batch,
    image,
    timings_path,
    strategy,
    op_text,
):
    """Search the variant space of every strategy for the fastest verified kernel: of
    one problem (--shape), or of many on Dask (--problems, --model)."""
    sources = [x for x in (shape_text, problems_path, model_name) if x is not None]
    if len(sources) != 1:
        raise SpecError("give one of --shape, --problems and --model")
    if image is not None and model_name is None:
        raise SpecError("--image sizes a --model's images: give --model NAME")
    if shape_text is None:
        one = [f"--{o}" for o, v in (("precision", precision), ("op", op_text)) if v]
        if one:  # a many-problem tune searches each problem's allowed maths
            raise SpecError(
                f"{', '.join(one)} narrow one problem's tune (--shape); --problems and --model "
                "search each allowed math, ops as listed"
            )
        cluster = dict(workers=workers, gpus=gpus, scheduler=scheduler, item_limit=item_limit)
        listing = (problems_path, model_name, batch, image)
        strat = strategy_class(strategy) if strategy else None
        _tune_many(listing, budget, compile_only, arch, timings_path, strat, **cluster)
        return
    if timings_path is not None:
        raise SpecError("--timings-from resumes a many-problem tune: give --problems or --model")
    if compile_only or scheduler or gpus is not None:
        raise SpecError(
            "--compile-only, --gpus and --scheduler tune many problems: give --problems or --model"
        )
    shape = _with_op(parse_shape(shape_text), op_text, all_allowed=False)
    strat = strategy_class(strategy) if strategy else None
    if strat is not None:
        strat.problem_for(shape)  # a strategy that does not compute the op: say so first
    prec = parse_precision(precision or _tune_math(shape, strat))
    _need_gpu("tune")
    from .tune import run_tune

    run_tune(shape, prec, budget, echo=click.echo, batch=batch, strategy=strat)


def _many_problems(problems_path, model_name, batch, image=None) -> tuple[list, float]:
    """A many-problem tune's problems (from ``problems_path``, at ``batch`` where given,
    else ``model_name``'s at it, on images of side ``image`` where given), and the
    seconds listing them took."""
    from . import dist, listings

    start = time.perf_counter()
    if problems_path is None:
        found = listings.model_problems(model_name, batch, image)
        if found is None:
            found = _model_problems(model_name, batch, image)
            listings.store_model_problems(model_name, batch, found, image)
    else:
        found = dist.problems_file(problems_path)
        found = [replace(p, batch=batch) for p in found] if batch else found
    return found, time.perf_counter() - start


def _done(result) -> concurrent.futures.Future:
    future = concurrent.futures.Future()
    future.set_result(result)
    return future


def _model_problems(name: str, batch: int | None, image: int | None = None) -> list:
    """Every conv problem and op of the torchvision model ``name``, in fp32 NCHW and in
    bf16 channels_last, as ``specgen model NAME [--image S] --plan`` lists them."""
    try:
        from .torch import model as m
    except ImportError:
        raise SpecError(
            "--model needs PyTorch and torchvision: pip install 'specgen[model]'"
        ) from None
    default_batch, default_image = m.MODELS.get(name, (32, 224))
    layers = m.layers_of(m.build_sizes(name), name, batch or default_batch, image or default_image)
    out = []
    for mode in (m.MODES["fp32"], m.MODES["bf16"]):
        out += [layer.problem(op, mode) for layer in layers for op in layer.ops()]
    return list(dict.fromkeys(out))


def _tune_many(listing, budget, compile_only, arch, timings_path=None, strategy=None, **cluster):
    """A many-problem tune of the problems ``listing`` names (``_many_problems``'
    arguments): the compile phase alone (``compile_only``, for ``arch``) or the timed
    one, after taking ``timings_path``'s timings where given, of ``strategy``'s space
    alone where one is named (``dist.strategy_searches``); ``cluster``: workers, gpus,
    scheduler and item_limit as given."""
    workers, gpus, scheduler = cluster["workers"], cluster["gpus"], cluster["scheduler"]
    from . import dist
    from .compile import DEFAULT_ARCH

    setup = _Setup()
    if compile_only:
        problems = _many_problems(*listing)[0]
        if gpus is not None:
            raise SpecError("--gpus times on GPU workers; --compile-only runs none")
        _check_arch(arch)
        arch = arch or DEFAULT_ARCH
        _take_timings(timings_path)
        _compile_many(problems, arch, scheduler, workers, budget, strategy)
        return
    if arch is not None:
        raise SpecError("--arch is for --compile-only; a timed tune compiles for its GPUs")
    if scheduler and gpus is not None:
        raise SpecError(
            "--gpus starts GPU workers of its own; with --scheduler they are the cluster's"
        )
    ids = [] if scheduler else dist.visible_gpus(gpus)
    if not scheduler and not ids:
        raise SpecError(
            "a timed tune needs a CUDA GPU and none is visible; --compile-only needs none"
        )
    _take_timings(timings_path)

    # The problems listed (a model traced: PyTorch imported, 3-5 s) while the cluster
    # starts, in a process of their own: in a thread of this one, the import and Dask's
    # start would share one interpreter lock (the two took 12-14 s together on a 2-GPU
    # host, 2026-11-28, where each alone takes a few seconds).
    from . import listings
    from .parallel import apart

    start = time.perf_counter()
    problems_path, model_name, batch, image = listing
    stored = None if problems_path else listings.model_problems(model_name, batch, image)
    if stored is not None:  # listed before under this code: read here, in milliseconds
        listed = contextlib.nullcontext(_done((stored, time.perf_counter() - start)))
    else:
        listed = apart(_many_problems, *listing)
    with listed as job:
        try:
            client = dist.connect(scheduler, workers, ids)
            up = time.perf_counter() - setup.last
        except BaseException:
            job.cancel()
            raise
        try:
            preparing = dist.prepare_gpus(client)  # while the model is traced
            problems, traced = job.result()
        except BaseException:
            dist.disconnect(client)
            raise
    setup.mark(f"problems listed ({traced:.1f} s) and cluster up ({up:.1f} s)")
    try:
        _time_many(client, problems, budget, cluster["item_limit"], setup, strategy)
        del preparing  # done long before: the GPU workers ran it first
    finally:
        dist.disconnect(client)


def _take_timings(path) -> None:
    """``--timings-from``: the earlier tune's timings into this machine's database."""
    if path is None:
        return
    from . import tunedb

    added, held = tunedb.import_timings(path)
    click.echo(
        f"took {added} timings from {path} ({held} here already): their candidates are "
        "not timed again, each problem's finalists are"
    )


def _compile_many(problems, arch, scheduler, workers, budget, strategy=None):
    from . import dist, tunedb

    items = dist.work_items(dist.searched(problems, "", arch, strategy), budget, stored=True)
    todo = dist.pending(items, arch)
    click.echo(
        f"tune: {len(problems)} problems, {len(items)} items (problem x math x candidate); "
        f"{len(items) - len(todo)} recorded already, {len(todo)} to compile for {arch}"
    )
    if not todo:
        return
    client = dist.connect(scheduler, workers)
    try:
        n = len(client.scheduler_info()["workers"])
        with click.progressbar(length=len(todo), label="compile", file=sys.stderr) as bar:
            report = dist.fan_out(client, todo, arch, progress=lambda r: bar.update(1))
    finally:
        dist.disconnect(client)
    counts = ", ".join(f"{k} {v}" for k, v in sorted(report["counts"].items()))
    efficiency = report["busy"] / max(report["wall"] * n, 1e-9)
    click.echo(
        f"compiled: {counts}; wall {report['wall']:.1f} s on {n} workers, the items' own "
        f"{report['busy']:.1f} s ({efficiency:.0%} of the workers' time)"
    )
    for worker, k in sorted(report["per_worker"].items()):
        click.echo(f"  {worker}: {k} items")
    _name_dropped(report["dropped"])
    click.echo(f"recorded in {tunedb.db_path()}")


class _Setup:
    """Where a many-problem tune's seconds before its first item go: each ``mark`` names
    the step that just ended."""

    def __init__(self):
        self.last = time.perf_counter()
        self.steps: list[tuple[str, float]] = []

    def mark(self, step: str) -> None:
        now = time.perf_counter()
        self.steps.append((step, now - self.last))
        self.last = now

    def line(self) -> str:
        total = sum(s for _, s in self.steps)
        return f"setup {total:.1f} s: " + ", ".join(f"{k} {s:.1f} s" for k, s in self.steps)


def _time_many(client, problems, budget, item_limit, setup=None, strategy=None):
    """The timed tune on the client's cluster: items planned for its GPUs' model, the
    pipeline run with a progress line, then the winners table and the phases' times."""
    from . import dist, tunedb

    setup = setup or _Setup()
    gpus = dist.gpu_workers(client)
    if not gpus:
        raise SpecError("the Dask cluster has no worker with the resource GPU=1 to time on")
    env = dist.gpu_of(client, gpus)
    setup.mark("GPUs read")
    searches = dist.searched(problems, env["gpu"], env["arch"], strategy)
    warming = dist.warm_gpus(client, gpus, dist.warm_up_problems(searches))
    items = dist.work_items(searches, budget, client, stored=True)  # while GPUs warm up
    setup.mark("items listed")
    warm = dist.warmed(warming)
    setup.mark(f"the rest of the GPU workers' warm-up ({warm:.1f} s in all)")
    workers = len(client.scheduler_info()["workers"])
    click.echo(
        f"tune: {len(problems)} problems, {len(searches)} problem x math searches, "
        f"{len(items)} items, on {len(gpus)} {env['gpu']} GPU worker(s) and "
        f"{workers - len(gpus)} compile worker(s)"
    )
    click.echo(setup.line())
    shown = _Progress(len(items), len({it.group for it in items}))
    report = dist.tune_on_gpus(
        client, items, env["arch"], env, progress=shown, item_limit=item_limit
    )
    shown.close()
    wall = report["wall"]
    click.echo(_winners_table(report["winners"]))
    click.echo(f"wall {wall:.1f} s")
    for phase, n in (("compile", workers - len(gpus)), ("gpu", len(gpus)), ("final", len(gpus))):
        stats = report["phases"][phase]
        done = sum(stats["counts"].values())
        if not done:
            continue
        counts = ", ".join(f"{k} {v}" for k, v in sorted(stats["counts"].items()))
        share = stats["busy"] / max(wall * max(n, 1), 1e-9)
        click.echo(
            f"{phase}: {counts}; {stats['busy']:.1f} s of work on {n} worker(s) in the "
            f"{wall:.1f} s ({share:.0%} busy)"
        )
        click.echo("  " + ", ".join(f"{w}: {k}" for w, k in sorted(stats["per_worker"].items())))
        if stats.get("parts"):
            click.echo(
                "  of which "
                + ", ".join(f"{dist.PARTS[k]} {v:.1f} s" for k, v in stats["parts"].items())
            )
    _name_dropped(report["dropped"])
    click.echo(f"recorded in {tunedb.db_path()}")


def _winners_table(winners: list[dict]) -> str:
    head = f"{'problem':<44} {'op':<5} {'math':<4} {'winner':<44} {'ms':>8} {'cuDNN':>8} {'x':>6}"
    lines = [head, "-" * len(head)]
    for r in sorted(winners, key=lambda r: (r["shape"], r["precision"])):
        p = parse_shape(r["shape"])
        cudnn = r.get("cudnn_ms")
        x = f"{cudnn / r['ms']:.2f}" if cudnn else "-"
        lines.append(
            f"{p.slug:<44} {p.op.value:<5} {r['precision']:<4} {r['variant']:<44} {r['ms']:>8.4f} "
            f"{(f'{cudnn:.4f}' if cudnn else '-'):>8} {x:>6}"
        )
    return "\n".join(lines)


def _name_dropped(dropped: list[dict]) -> None:
    for r in dropped[:SHOWN]:
        click.echo(f"  {r['status']}: {r['variant']} of {r['shape']}: {one_line(r['reason'])}")
    if len(dropped) > SHOWN:
        click.echo(f"  ... and {len(dropped) - SHOWN} more (status in the database)")


def _task_name(key) -> str:
    """A GPU task as people read it: a problem's op in one math, or one candidate."""
    if isinstance(key, tuple):
        spec, _, precision = key
        p = parse_shape(spec)
        return f"{p.slug} {p.op.value} {precision}"
    p = parse_shape(key.spec)
    return f"{key.variant} for {p.slug} {p.op.value}"


class _Progress:
    """One line on stderr for a pipelined tune: each phase's items done of its total,
    the GPU items per card, the elapsed time and the ETA of the GPU phase; redrawn in
    place on a terminal, else printed every ten seconds."""

    def __init__(self, items: int, groups: int):
        import time

        self.clock = time.monotonic
        self.start = self.last = self.clock()
        self.totals = dict(compile=items, gpu=items, final=groups)
        self.done = dict(compile=0, gpu=0, final=0)
        self.per_card: dict[str, int] = {}
        self.running: dict = {}
        self.tty = sys.stderr.isatty()

    def __call__(self, phase: str, record: dict | None) -> None:
        if phase == "stalled":  # no record for a while: what the tune waits on
            click.echo(("\n" if self.tty else "") + record, err=True)
            return
        if phase == "running":  # GPU tasks in flight -> seconds: the longest is named
            self.running = record
        else:
            self.done[phase] += 1
        if phase == "gpu" and record is not None:
            card = f"gpu{record.get('device', '')}"
            self.per_card[card] = self.per_card.get(card, 0) + 1
        now = self.clock()
        if now - self.last >= (0.5 if self.tty else 10.0):
            self.last = now
            self.draw(now)

    def draw(self, now: float) -> None:
        spent = now - self.start
        gpu = self.done["gpu"]
        eta = spent * (self.totals["gpu"] - gpu) / gpu if gpu else None
        cards = " ".join(f"{c} {k}" for c, k in sorted(self.per_card.items()))
        text = (
            f"compile {self.done['compile']}, gpu {gpu}/{self.totals['gpu']} ({cards}), "
            f"finalists {self.done['final']}/{self.totals['final']}; {spent:.0f} s"
            + (f", ETA {eta:.0f} s" if eta is not None else "")
        )
        if self.running:
            key, seconds = max(self.running.items(), key=lambda kv: kv[1])
            if seconds >= 20:
                text += f"; longest running {seconds:.0f} s: {_task_name(key)}"
        click.echo(("\r" + text + "   ") if self.tty else text, err=True, nl=not self.tty)

    def close(self) -> None:
        self.draw(self.clock())
        if self.tty:
            click.echo("", err=True)


SHOWN = 10  # the refused or failed items a many-problem tune names at its end


@main.command()
@click.argument("name")
@click.option("--batch", type=SIZE, default=None, help="images a step (default: the model's)")
@click.option("--image", type=SIZE, default=None, help="image side in pixels (default 224)")
@click.option("--plan", "plan_only", is_flag=True, help="the problems and the picks; no GPU")
@click.option(
    "--modes", default="fp32,tf32,bf16", show_default=True, help="maths to run, of fp32, tf32, bf16"
)
@click.option("--gpu", default=None, help="whose picks --plan lists (default: NVIDIA H200)")
@click.option(
    "--arch", default="sm_90", show_default=True, help="the GPU's architecture, for --plan"
)
@click.option("--reps", type=SIZE, default=20, show_default=True, help="timed runs a median")
@click.option("--graph/--no-graph", default=True, help="time the step as a CUDA graph too")
@click.option("--layers/--no-layers", default=True, help="time every layer op alone too")
@click.option(
    "--first-step",
    is_flag=True,
    help="the first training step in fresh processes too: cuDNN, specgen cold and warm",
)
@click.option(
    "--batchnorm/--no-batchnorm",
    default=True,
    help="specgen's run converts batch norm and max pool to specgen's kernels too "
    "(convert's default)",
)
@click.option(
    "--fuse/--no-fuse",
    default=True,
    help="and fuses each batch norm with the ReLU after it, each max pool with the ReLU "
    "before it (convert's default)",
)
@click.option(
    "--slow-out",
    type=click.Path(dir_okay=False),
    default=None,
    help="with the layers: write the problems of the layer ops below 0.8x cuDNN here, a "
    "file for specgen tune --problems (rewritten after each mode)",
)
def model(
    name,
    batch,
    image,
    plan_only,
    modes,
    gpu,
    arch,
    reps,
    graph,
    layers,
    first_step,
    batchnorm,
    fuse,
    slow_out,
):
    """Run the torchvision model NAME (resnet50, vgg11, mobilenet_v2, ...) on specgen
    beside cuDNN: accuracy against float64, the training step, and a per-layer table
    (torchvision: the model extra).  --plan lists the problems and picks without a GPU."""
    try:
        from .torch import model as m
    except ImportError:
        fail("specgen model needs PyTorch and torchvision: pip install 'specgen[model]'")
    try:
        chosen = [m.MODES[k.strip()] for k in modes.split(",")]
    except KeyError as e:
        fail(f"--modes: {e.args[0]!r} is not one of {', '.join(m.MODES)}")
    if slow_out and (plan_only or not layers):
        fail("--slow-out lists the slow ops of the timed layer tables: drop --plan and --no-layers")
    if slow_out:  # checked before the run, whose end writes it
        where = Path(slow_out).resolve().parent
        if not where.is_dir():
            fail(f"--slow-out {slow_out}: its directory does not exist")
        if not os.access(where, os.W_OK):
            fail(f"--slow-out {slow_out}: its directory is not writable")
    default_batch, default_image = m.MODELS.get(name, (32, 224))
    batch, image = batch or default_batch, image or default_image
    try:
        _check_arch(arch)
        net = m.build(name)
        found = m.layers_of(net, name, batch, image)
        if plan_only:
            gpu = gpu or "NVIDIA H200"
            click.echo(
                f"{name}, batch {batch}, {image}x{image}: {len(found)} conv calls; "
                f"the picks for {gpu} ({arch})"
            )
            from functools import partial

            from .torch import convert

            convert_as = partial(convert, batchnorm=batchnorm, fuse=fuse, pool=batchnorm)
            click.echo(m.batch_norms(net, convert_as))
            for mode in chosen:
                click.echo(
                    f"\n{mode.name} ({mode.dtype.value}, {mode.layout.value}"
                    f"{', tf32 allowed' if mode.tf32 else ''}):"
                )
                click.echo(m.format_rows(m.plan_rows(found, mode, gpu, arch), timed=False))
            return
        _need_gpu("specgen model without --plan")
        m.run(
            name,
            batch,
            image,
            chosen,
            reps,
            graph,
            layers,
            click.echo,
            lambda t: click.echo(t, err=True),
            first_step,
            batchnorm,
            fuse,
            slow_out,
        )
    except SpecError as e:
        fail(str(e))
