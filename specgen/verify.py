"""Compile each variant, check the compiler's resource report against the plan, and,
where a GPU is present, check the numbers against the float64 reference."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .compile import compile_source, symbol_sizes
from .plan import Plan, make_plan
from .reference import compare, conv2d, error_coefficient, output_rounding, underflow_term
from .render import render
from .shapes import ConvProblem
from .tensors import from_storage, to_nchw, to_storage, w_shape, x_shape, y_shape
from .variants import Variant

# Above this many multiply-adds the reference runs on the GPU in float64.
CPU_REFERENCE_MACS = 2 * 10**7


@dataclass
class Row:
    shape: str
    name: str
    precision: str
    registers: int = 0
    smem: int = 0
    spills: int = 0
    rel_l2: float | None = None
    max_err: float | None = None
    bound_ratio: float | None = None
    status: str = "FAIL"
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.status in ("PASS", "COMPILED")


def check_resources(plan: Plan, binary) -> tuple[dict, list[str]]:
    """The compiler's report against the plan: no spills, shared and constant bytes
    exactly as planned."""
    problems = []
    main = binary.resources.get(plan.name)
    if main is None:
        return {}, [f"no resource report for {plan.name}"]
    for kernel, r in binary.resources.items():
        if r.spills or r.stack:
            problems.append(f"{kernel}: {r.stack} B stack, {r.spills} B spilled")
    if main.smem != plan.static_smem:
        problems.append(f"shared {main.smem} B, planned {plan.static_smem} B")
    sizes = symbol_sizes(binary.cubin)
    if sizes.get("wc", 0) != plan.const_bytes:
        problems.append(f"__constant__ wc {sizes.get('wc', 0)} B, planned {plan.const_bytes} B")
    return dict(registers=main.registers, smem=main.smem, spills=main.spills), problems


def random_inputs(shape: ConvProblem, batch: int, rng: np.random.Generator):
    """Fresh normal x in the problem's storage dtype and layout, w scaled so outputs
    are O(1) (fp16 must not overflow), and a bias when the problem has one; w and the
    bias as fp32 values that the dtype holds exactly."""
    x = rng.standard_normal(x_shape(shape, batch), dtype=np.float32)
    w = rng.standard_normal(w_shape(shape), dtype=np.float32)
    w *= np.float32(1.0 / np.sqrt(shape.reduction))

    def exact(v):
        return from_storage(to_storage(v, shape.dtype), shape.dtype)

    b = exact(rng.standard_normal(shape.M, dtype=np.float32) * 0.5) if shape.bias else None
    return to_storage(x, shape.dtype), exact(w), b


def check_numbers(shape: ConvProblem, plan: Plan, binary, batch: int, rng) -> dict:
    import cupy

    from .runtime import Conv

    # A persistent kernel's blocks stride over the work items; with a third as many
    # blocks as items, each block computes about three, through both band buffers.
    items = max((l.per_image * batch for l in plan.launches if l.persistent), default=0)
    conv = Conv(shape, plan.variant, plan=plan, binary=binary, max_blocks=-(-items // 3) or None)
    x, w, b = random_inputs(shape, batch, rng)
    conv.set_weights(w, b)
    xd = cupy.asarray(x)
    y = cupy.asarray(to_storage(np.full(y_shape(shape, batch), np.nan, np.float32), shape.dtype))
    conv(xd, y)
    cupy.cuda.Device().synchronize()
    macs = batch * shape.M * shape.Ho * shape.Wo * shape.reduction
    xp = cupy if macs > CPU_REFERENCE_MACS else np
    xv = to_nchw(from_storage(xd if xp is cupy else x, shape.dtype, xp), shape)
    wr = xp.asarray(w)
    br = None if b is None else xp.asarray(b)
    ref = conv2d(xv, wr, shape, xp, bias=br)
    magnitude = conv2d(xp.abs(xv), xp.abs(wr), shape, xp, epilogue=False)
    if br is not None:
        magnitude += xp.abs(br)[None, :, None, None]
    gamma = error_coefficient(plan.variant, shape)
    u_out = output_rounding(shape)
    absolute = underflow_term(
        plan.variant,
        shape,
        float(np.abs(from_storage(x, shape.dtype)).max()),
        float(np.abs(w).max()),
    )
    got = to_nchw(from_storage(y if xp is cupy else cupy.asnumpy(y), shape.dtype, xp), shape)
    return compare(got, ref, magnitude, gamma + u_out * (1 + gamma), xp, absolute)


def verify_variant(
    shape: ConvProblem, variant: Variant, *, arch: str, batch: int, numbers: bool, rng=None
) -> Row:
    plan = make_plan(shape, variant)
    row = Row(shape.slug, plan.name, plan.variant.precision.value)
    try:
        binary = compile_source(render(plan), plan.name, arch)
    except RuntimeError as e:
        row.problems.append(str(e).splitlines()[0])
        return row
    stats, problems = check_resources(plan, binary)
    for k, v in stats.items():
        setattr(row, k, v)
    row.problems += problems
    if problems:
        return row
    if not numbers:
        row.status = "COMPILED"
        return row
    result = check_numbers(shape, plan, binary, batch, rng or np.random.default_rng())
    row.rel_l2, row.max_err, row.bound_ratio = (
        result["rel_l2"],
        result["max_err"],
        result["bound_ratio"],
    )
    if not result["finite"]:
        row.problems.append("NaN or Inf in the output (an element left unwritten?)")
    elif not result["ok"]:
        row.problems.append(f"error {row.bound_ratio:.2f}x its bound")
    row.status = "PASS" if result["ok"] else "FAIL"
    return row


def format_table(rows: list[Row]) -> str:
    sw = max([10] + [len(r.shape) for r in rows])
    head = f"{'shape':<{sw}} {'variant':<44} {'prec':<5} {'regs':>4} {'smem B':>7} {'spill':>5} {'rel L2':>9} {'max err':>9} {'err/bound':>9}  result"
    lines = [head, "-" * len(head)]
    for r in rows:
        num = lambda v, f: ("-" if v is None else format(v, f))  # noqa: E731
        lines.append(
            f"{r.shape:<{sw}} {r.name:<44} {r.precision:<5} {r.registers:>4} {r.smem:>7} {r.spills:>5} "
            f"{num(r.rel_l2, '.2e'):>9} {num(r.max_err, '.2e'):>9} {num(r.bound_ratio, '.3f'):>9}  {r.status}"
            + (f"  ({'; '.join(r.problems)})" if r.problems else "")
        )
    return "\n".join(lines)
