"""Compile each variant, check the compiler's resource report against the plan, and,
where a GPU is present, check the numbers against the float64 reference."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .compile import compile_source, symbol_sizes
from .plan import Plan, make_plan
from .reference import compare, conv2d, error_coefficient, underflow_term
from .render import render
from .shapes import ConvShape
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


def random_inputs(shape: ConvShape, batch: int, rng: np.random.Generator):
    """Fresh normal x, and w scaled so outputs are O(1) (fp16 must not overflow)."""
    x = rng.standard_normal((batch, shape.C, shape.H, shape.W), dtype=np.float32)
    w = rng.standard_normal((shape.M, shape.C, shape.K, shape.K), dtype=np.float32)
    w *= np.float32(1.0 / np.sqrt(shape.reduction))
    return x, w


def check_numbers(shape: ConvShape, plan: Plan, binary, batch: int, rng) -> dict:
    import cupy

    from .runtime import Conv

    # A persistent kernel's blocks stride over the work items; with a third as many
    # blocks as items, each block computes about three, through both band buffers.
    items = max((l.per_image * batch for l in plan.launches if l.persistent), default=0)
    conv = Conv(shape, plan.variant, plan=plan, binary=binary, max_blocks=-(-items // 3) or None)
    x, w = random_inputs(shape, batch, rng)
    conv.set_weights(w)
    xd = cupy.asarray(x)
    y = cupy.full((batch, shape.M, shape.Ho, shape.Wo), np.nan, dtype=np.float32)
    conv(xd, y)
    cupy.cuda.Device().synchronize()
    macs = batch * shape.M * shape.Ho * shape.Wo * shape.reduction
    xp = cupy if macs > CPU_REFERENCE_MACS else np
    xr, wr = (xd, cupy.asarray(w)) if xp is cupy else (x, w)
    ref = conv2d(xr, wr, shape.pad, xp)
    ref_abs = conv2d(xp.abs(xr), xp.abs(wr), shape.pad, xp)
    gamma = error_coefficient(plan.variant, shape.C, shape.K)
    absolute = underflow_term(
        plan.variant, shape.C, shape.K, float(np.abs(x).max()), float(np.abs(w).max())
    )
    return compare(y if xp is cupy else cupy.asnumpy(y), ref, ref_abs, gamma, xp, absolute)


def verify_variant(
    shape: ConvShape, variant: Variant, *, arch: str, batch: int, numbers: bool, rng=None
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
    head = f"{'shape':<10} {'variant':<44} {'prec':<5} {'regs':>4} {'smem B':>7} {'spill':>5} {'rel L2':>9} {'max err':>9} {'err/bound':>9}  result"
    lines = [head, "-" * len(head)]
    for r in rows:
        num = lambda v, f: ("-" if v is None else format(v, f))  # noqa: E731
        lines.append(
            f"{r.shape:<10} {r.name:<44} {r.precision:<5} {r.registers:>4} {r.smem:>7} {r.spills:>5} "
            f"{num(r.rel_l2, '.2e'):>9} {num(r.max_err, '.2e'):>9} {num(r.bound_ratio, '.3f'):>9}  {r.status}"
            + (f"  ({'; '.join(r.problems)})" if r.problems else "")
        )
    return "\n".join(lines)
