"""plan -> CUDA source.  Templates get literals only and render with StrictUndefined,
so a value the planner forgot is an error, not an empty string."""

from __future__ import annotations

from pathlib import Path

import jinja2

from . import __version__
from .plan import Plan
from .variants import Strategy


def _templates() -> Path:
    """templates/ ships inside the package when installed (specgen/templates) and
    sits beside it in the source tree."""
    here = Path(__file__).resolve().parent
    installed = here / "templates"
    return installed if installed.is_dir() else here.parent / "templates"


TEMPLATES = _templates()

DESCRIPTIONS = {
    Strategy.DIRECT: "direct convolution, input pixels read from global memory",
    Strategy.TILED: "direct convolution on a shared-memory halo tile of all input channels",
    Strategy.SPLIT: "tiled direct convolution, input channels split over blocks, atomicAdd of partial sums",
    Strategy.IM2COL: "explicit im2col: an unroll kernel writes the (C*K*K) x (Ho*Wo) matrix, a tiled GEMM multiplies",
    Strategy.IMPLICIT: "fused implicit GEMM: input tiles gathered straight from x, no unrolled matrix",
    Strategy.MMA: "fused implicit GEMM on tensor cores (mma.sync), fp32 accumulation",
    Strategy.MMATILE: "tensor cores (mma.sync) reading B fragments straight from a shared-memory band of the input",
    Strategy.MMAPERSIST: "persistent blocks on tensor cores: tf32 B fragments resident in shared memory, input bands double-buffered with cp.async, each warp pixel tiles x map tiles of mma.sync",
    Strategy.STREAM: "weights and input bands streamed through shared memory a chunk of channels at a time (cp.async, double-buffered), each thread an outer product of maps x a row segment",
    Strategy.PERSIST: "persistent blocks: weights resident in shared memory, input bands double-buffered with cp.async, each thread an outer product of maps x a row segment",
}

_env = jinja2.Environment(
    loader=jinja2.FileSystemLoader(str(TEMPLATES)),
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
    keep_trailing_newline=True,
    autoescape=False,
)


def emit_command(plan: Plan) -> str:
    shape = plan.shape.name or plan.shape.spec
    return f"specgen emit --shape {shape} --variant {plan.name}"


def _grid_text(launch) -> str:
    axes = []
    for axis, n in enumerate(launch.grid):
        if axis != launch.axis:
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
    lines = [DESCRIPTIONS[v.strategy]]
    lines.append(
        f"precision {v.precision.value}: "
        + plan.context.get(
            "precision_note",
            {
                "fp32": "fp32 inputs, products and sums",
                "fp16": "fp32 in and out, half2 products summed along each window row, fp32 sums",
                "tf32": "tf32 inputs, fp32 accumulation",
            }[v.precision.value],
        )
    )
    return lines


def render(plan: Plan, note: str | None = None) -> str:
    template = _env.get_template(plan.template)
    kernels = [dict(vars(launch), grid_text=_grid_text(launch)) for launch in plan.launches]
    source = template.render(
        plan.context,
        name=plan.name,
        shape=plan.shape,
        problem=plan.shape.banner(),
        shape_name=plan.shape.name or "inline spec",
        version=__version__,
        command=emit_command(plan),
        description=_description(plan) + ([note] if note else []),
        sizes=plan.sizes,
        kernels=kernels,
    )
    return source
