"""Compile each variant, check the compiler's resource report against the plan, and,
where a GPU is present, check the numbers against the float64 reference."""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod

import numpy as np

from .compile import compile_source, symbol_sizes
from .errors import SpecError
from .plan import Plan, make_plan
from .plan.common import REGISTER_FILE, registers_of
from .reference import (
    bias_grad,
    compare,
    conv2d,
    conv2d_dgrad,
    conv2d_wgrad,
    error_coefficient,
    output_rounding,
    underflow_term,
)
from .render import render
from .shapes import ConvProblem, Op
from .tensors import (
    BATCHED,
    INPUTS,
    Role,
    from_storage,
    outputs,
    role_shape,
    to_nchw,
    to_storage,
    w_shape,
)
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
    exactly as planned, and every launch's block within one SM's registers (else it
    could never be resident, and would fail only at its first launch)."""
    problems = []
    main = binary.resources.get(plan.name)
    if main is None:
        return {}, [f"no resource report for {plan.name}"]
    for kernel, r in binary.resources.items():
        if r.spills or r.stack:
            problems.append(f"{kernel}: {r.stack} B stack, {r.spills} B spilled")
    for launch in plan.launches:
        r = binary.resources.get(launch.kernel)
        threads = prod(launch.block)
        if r is not None and registers_of(threads, r.registers) > REGISTER_FILE:
            problems.append(
                f"{launch.kernel}: {threads} threads at {r.registers} registers take "
                f"{registers_of(threads, r.registers)}, over an SM's {REGISTER_FILE}"
            )
    if main.smem != plan.static_smem:
        problems.append(f"shared {main.smem} B, planned {plan.static_smem} B")
    sizes = symbol_sizes(binary.cubin)
    if sizes.get("wc", 0) != plan.const_bytes:
        problems.append(f"__constant__ wc {sizes.get('wc', 0)} B, planned {plan.const_bytes} B")
    return dict(registers=main.registers, smem=main.smem, spills=main.spills), problems


def random_inputs(shape: ConvProblem, batch: int, rng: np.random.Generator):
    """Fresh random inputs of the problem's op in its storage dtype and layout (x for
    fprop, dy for dgrad and bgrad, both for wgrad: ``{Role: array}``), w scaled so
    outputs are O(1) (fp16 must not overflow), and a bias when the forward problem has
    one; w and the bias as fp32 values that the dtype holds exactly.

    The reductions over the batch (wgrad, bgrad) get inputs whose products mostly agree
    in sign: x as a ReLU's output would be (|normal|) and dy normal around 1, both scaled
    by 1/sqrt(images x pixels) so that dw and db stay far inside fp16's range.  With
    zero-mean terms a weight is a random walk, far smaller than the sum of its terms'
    magnitudes that the error bound scales, and a wrong sum could hide under the bound;
    here the two are of a size, so the bound is tight."""
    w = rng.standard_normal(w_shape(shape), dtype=np.float32)
    w *= np.float32(1.0 / np.sqrt(shape.reduction))

    def exact(v):
        return from_storage(to_storage(v, shape.dtype), shape.dtype)

    b = exact(rng.standard_normal(shape.M, dtype=np.float32) * 0.5) if shape.bias else None
    inputs = random_activations(shape, batch, rng)
    if shape.op in (Op.WGRAD, Op.BGRAD):
        return inputs, None, None
    return inputs, exact(w), (b if shape.op is Op.FPROP else None)


def random_activations(shape: ConvProblem, batch: int, rng, xp=np) -> dict:
    """``random_inputs``'s activations alone (``{Role: array}``), drawn by ``rng``: a
    NumPy Generator, or with ``xp=cupy`` a CuPy generator, so that large inputs are
    made where they are used rather than on the host and copied."""
    reduction = shape.op in (Op.WGRAD, Op.BGRAD)
    scale = np.float32(1.0 / np.sqrt(batch * shape.Ho * shape.Wo))
    inputs = {}
    for role in INPUTS[shape.op]:
        t = rng.standard_normal(role_shape(role, shape, batch), dtype=np.float32)
        if reduction and role is Role.X:
            t = xp.abs(t) * scale
        elif reduction and role is Role.DY:
            t = (t + np.float32(1.0)) * scale
        inputs[role] = to_storage(t, shape.dtype, xp)
    return inputs


def references(shape: ConvProblem, values: dict, w, b, xp) -> dict:
    """Role -> (float64 reference, the sum of its terms' magnitudes), NCHW, for each
    output of the problem's op; ``values``: the inputs as float values, NCHW."""
    op = shape.op
    if op is Op.FPROP:
        x = values[Role.X]
        ref = conv2d(x, w, shape, xp, bias=b)
        mag = conv2d(xp.abs(x), xp.abs(w), shape, xp, epilogue=False)
        if b is not None:
            mag += xp.abs(b)[None, :, None, None]
        return {Role.Y: (ref, mag)}
    dy = values[Role.DY]
    if op is Op.DGRAD:
        return {
            Role.DX: (
                conv2d_dgrad(dy, w, shape, xp),
                conv2d_dgrad(xp.abs(dy), xp.abs(w), shape, xp),
            )
        }
    out = {Role.DB: (bias_grad(dy, xp), bias_grad(xp.abs(dy), xp))}
    if op is Op.WGRAD:
        x = values[Role.X]
        out[Role.DW] = (
            conv2d_wgrad(x, dy, shape, xp),
            conv2d_wgrad(xp.abs(x), xp.abs(dy), shape, xp),
        )
    return {r: out[r] for r in outputs(shape)}


def summation_terms(plan: Plan, batch: int) -> int:
    """The additions on the longest path of each output's sum."""
    s = plan.shape
    if plan.sum_depth is not None:
        per_image, slices, fixed = plan.sum_depth
        return per_image * -(-batch // slices) + fixed
    if s.op is Op.DGRAD:
        return s.Mg * s.R * s.S
    return s.reduction + (1 if s.bias else 0)


def tolerance(plan: Plan, batch: int, max_input: float, max_w: float) -> tuple[float, float]:
    """(gamma, absolute): an output o passes when |o - ref| <= gamma * mag + absolute,
    mag being the sum of its terms' magnitudes.  The terms follow the sum the plan makes
    (dgrad's is that of its forward view; a batch reduction's, its slices and trees),
    and a 16-bit output is rounded once more on its way out."""
    bound_problem = plan.view or plan.shape
    gamma = error_coefficient(plan.variant, bound_problem, summation_terms(plan, batch))
    gamma += output_rounding(plan.shape) * (1 + gamma)
    return gamma, underflow_term(plan.variant, bound_problem, max_input, max_w)


@dataclass
class Trial:
    """Fresh random inputs of one problem at one batch (``random_inputs``), on the GPU,
    with their float64 references: what each candidate of a search is checked against
    (``verify_variant``'s ``trial``).  The references of resnet50's layers at batch 4
    run on the GPU, and drawing and reducing them again for each candidate was most of
    a tune's GPU time; a search draws them once, and each of its candidates reads a
    copy of the inputs, so that one that writes where it should not cannot change what
    the next is judged on."""

    shape: ConvProblem
    batch: int
    inputs: dict  # Role -> storage array on the host
    w: np.ndarray | None
    b: np.ndarray | None
    dev: dict  # Role -> the inputs on the GPU
    refs: dict  # Role -> (float64 reference, its terms' magnitudes), NCHW
    largest: float  # the largest input value, for the underflow term
    xp: object  # where the references live and the outputs are judged: NumPy or CuPy


def draw_trial(shape: ConvProblem, batch: int, rng) -> Trial:
    """A ``Trial`` of ``shape`` at ``batch`` drawn by ``rng``; its references in float64
    on the GPU above ``CPU_REFERENCE_MACS`` (times two), else on the host."""
    import cupy

    inputs, w, b = random_inputs(shape, batch, rng)
    xp = cupy if shape.flops(batch) > 2 * CPU_REFERENCE_MACS else np
    dev = {r: cupy.asarray(t) for r, t in inputs.items()}
    return _trial(shape, batch, inputs, w, b, dev, xp)


def _trial(shape: ConvProblem, batch: int, inputs, w, b, dev: dict, xp) -> Trial:
    """The ``Trial`` of these inputs: their references in float64, computed in ``xp``."""
    refs = references(
        shape,
        {r: _values(shape, r, t, xp) for r, t in inputs.items()},
        None if w is None else xp.asarray(w),
        None if b is None else xp.asarray(b),
        xp,
    )
    largest = max(float(np.abs(from_storage(t, shape.dtype)).max()) for t in inputs.values())
    return Trial(shape, batch, inputs, w, b, dev, refs, largest, xp)


def _values(shape: ConvProblem, role: Role, t, xp):
    """A storage array as float values in ``xp``, NCHW where it is batched."""
    if xp is np and not isinstance(t, np.ndarray):
        t = t.get()  # a CuPy array, judged on the host
    v = from_storage(t, shape.dtype, xp)
    return to_nchw(v, shape) if role in BATCHED else v


def check_numbers(shape: ConvProblem, plan: Plan, binary, batch: int, rng, trial=None) -> dict:
    """``plan``'s kernels run once on random inputs (``trial``'s, else fresh ones at
    ``batch``) into outputs poisoned with NaN, and judged against float64."""
    import cupy

    from .runtime import Conv

    trial = trial or draw_trial(shape, batch, rng)
    # A persistent kernel's blocks stride over the work items; with a third as many
    # blocks as items, each block computes about three, through both band buffers.
    items = max((l.per_image * trial.batch for l in plan.launches if l.persistent), default=0)
    conv = Conv(shape, plan.variant, plan=plan, binary=binary, max_blocks=-(-items // 3) or None)
    conv.set_weights(trial.w, trial.b)
    dev = {r: t.copy() for r, t in trial.dev.items()}
    outs = {
        r: cupy.asarray(
            to_storage(np.full(role_shape(r, shape, trial.batch), np.nan, np.float32), shape.dtype)
        )
        for r in outputs(shape)
    }
    conv.run(dev, outs)
    cupy.cuda.Device().synchronize()
    return judge_trial(trial, plan, outs)


def judge_trial(trial: Trial, plan: Plan, outs) -> dict:
    """``plan``'s outputs ``outs`` (Role -> storage array, NumPy's or CuPy's) from
    ``trial``'s inputs against its float64 references, within the plan's error bound:
    the worst output's comparison (``reference.compare``)."""
    shape, xp, w = trial.shape, trial.xp, trial.w
    gamma, absolute = tolerance(
        plan, trial.batch, trial.largest, 0.0 if w is None else float(np.abs(w).max())
    )
    results = [
        compare(
            _values(shape, role, outs[role], xp),
            ref,
            spread_magnitudes(mag, plan.spread, xp) if plan.spread and role is Role.DW else mag,
            gamma,
            xp,
            absolute,
        )
        for role, (ref, mag) in trial.refs.items()
    ]
    return max(results, key=lambda r: (not r["ok"], r["bound_ratio"]))  # the worst output


def spread_magnitudes(mag, spread, xp) -> object:
    """dw's magnitudes where each tap's sum takes every tap's products, weighted by
    ``spread`` (``Plan.spread``) along each axis: from the reference's own, |x| with |dy|
    at each tap."""
    k = xp.asarray(spread, dtype=xp.float64)
    return xp.einsum("rd,mcde,se->mcrs", k, mag, k)


def judge(shape: ConvProblem, plan: Plan, batch: int, inputs, w, b, outs, xp=np) -> dict:
    """``plan``'s outputs ``outs`` from ``inputs``, ``w`` and ``b`` (as ``random_inputs``
    made them) against the float64 reference computed in ``xp`` (``judge_trial``)."""
    return judge_trial(_trial(shape, batch, inputs, w, b, {}, xp), plan, outs)


def verify_variant(
    shape: ConvProblem,
    variant: Variant,
    *,
    arch: str,
    batch: int,
    numbers: bool,
    rng=None,
    trial: Trial | None = None,
) -> Row:
    """``variant`` of ``shape`` compiled for ``arch``, its resources checked against the
    plan, and with ``numbers`` its outputs at ``batch`` against float64: on ``trial``'s
    inputs where given (a search's candidates share one), else on fresh ones."""
    plan = make_plan(shape, variant)
    row = Row(shape.slug, plan.name, plan.variant.precision.value)
    try:
        binary = compile_source(render(plan), plan.name, plan.target(arch))
    except (RuntimeError, SpecError) as e:  # a compile error, or an architecture it needs
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
    result = check_numbers(shape, plan, binary, batch, rng or np.random.default_rng(), trial)
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
