"""plan -> CUDA source.  Templates get literals only and render with StrictUndefined,
so a value the planner forgot is an error, not an empty string."""

from __future__ import annotations

import tempfile
from pathlib import Path

import jinja2

from . import __version__
from .compile import cache_dir
from .errors import one_line
from .plan import Plan


def _templates() -> Path:
    """templates/ ships inside the package when installed (specgen/templates) and
    sits beside it in the source tree."""
    here = Path(__file__).resolve().parent
    installed = here / "templates"
    return installed if installed.is_dir() else here.parent / "templates"


TEMPLATES = _templates()


def _bytecode_cache() -> jinja2.BytecodeCache | None:
    """The templates compiled to Python once per machine, not once per process: Jinja's
    own file cache in ``cache_dir()/templates``, an entry per template keyed by its
    name and its source's checksum, tagged with the Python version, written under a
    temporary name and renamed.  Compiling the 29 templates a whole-model listing
    renders took 1.7 s in every fresh process (each compile worker, each CLI call);
    loading them takes milliseconds.  None (compiled in memory, as before) where that
    folder cannot be written."""
    folder = cache_dir() / "templates"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError:
        return None
    return jinja2.FileSystemBytecodeCache(str(folder))


_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(TEMPLATES)),
    bytecode_cache=_bytecode_cache(),
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
    autoescape=False,
)
# ``{{ base }}{{ n | signed }}``: "ho + 2", "ho - 1", "ho": an offset as C reads it
_env.filters["signed"] = lambda n: f" + {n}" if n > 0 else (f" - {-n}" if n < 0 else "")


def render_template(path: str, **context) -> str:
    """A template that is not a plan's (the operator's helpers), with its literals."""
    return _env.get_template(path).render(context)


def emit_command(plan: Plan) -> str:
    shape = plan.shape.name or plan.shape.spec
    return f"specgen emit --shape {shape} --variant {plan.name}"


def _grid_text(launch) -> str:
    axes = []
    for axis, n in enumerate(launch.grid):
        if axis != launch.axis or not launch.per_image:  # a fixed grid: it walks the batch
            axes.append(str(n))
            continue
        if launch.per_image == launch.per_block:
            text = "B"
        elif launch.per_block == 1:
            text = f"B*{launch.per_image}"
        else:
            text = f"ceil(B*{launch.per_image}/{launch.per_block})"
        axes.append(f"min({text}, blocks resident on the device)" if launch.persistent else text)
    return "(" + ", ".join(axes) + ")"


def _description(plan: Plan) -> list[str]:
    v = plan.variant
    lines = [v.description]
    lines.append(
        f"precision {v.precision.value}: "
        + plan.context.get(
            "precision_note",
            {
                "fp32": "fp32 inputs, products and sums",
                "fp16": "fp32 in and out, half2 products summed along each window row, fp32 sums",
                "tf32": "tf32 inputs, fp32 accumulation",
                "bf16": "bf16 inputs, fp32 accumulation",
            }[v.precision.value],
        )
    )
    return lines


def comment_text(text: str) -> str:
    """Text from outside specgen (a results database's fields, a GPU's name, a spec) as
    it may stand in a // comment: every control, line or paragraph separator escaped, so
    that nothing it holds can end the comment and become code, and no trailing backslash
    to splice the next line into it."""
    out = one_line(text)
    return out + " " if out.endswith("\\") else out


def render(plan: Plan, note: str | None = None) -> str:
    template = _env.get_template(plan.template)
    kernels = [dict(vars(launch), grid_text=_grid_text(launch)) for launch in plan.launches]
    source = template.render(
        plan.context,
        name=plan.name,
        shape=plan.shape,
        problem=plan.shape.banner(),
        shape_name=comment_text(plan.shape.name or "inline spec"),
        version=__version__,
        command=comment_text(emit_command(plan)),
        description=[comment_text(d) for d in _description(plan) + ([note] if note else [])],
        sizes=plan.sizes,
        kernels=kernels,
    )
    return source
