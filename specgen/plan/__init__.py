"""problem + variant -> plan: every derived number, every limit checked, before rendering.

Each strategy plans itself (``Variant.plan`` in ``specgen/strategies/<key>.py``); the
checks every strategy shares are here: the problem features it serves, the math
precisions it computes in, and the block and grid of every launch.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable

from ..errors import SpecError
from ..shapes import ConvProblem
from ..tensors import Role
from .. import variants
from ..variants import Variant, strategy_table
from .common import Launch, Plan, Size, check_grid, check_launch_bounds, check_threads


def make_plan(shape: ConvProblem, variant: Variant) -> Plan:
    problem = type(variant).problem_for(shape)
    if problem is not shape:
        return _through_view(make_plan(problem, variant), shape)

    missing = {f: text for f, text in shape.features().items() if f not in variant.serves}
    if missing:
        able = [s.key for s in strategy_table() if set(missing) <= s.serves]
        raise SpecError(
            f"{variant.key} cannot serve {', '.join(missing.values())}; "
            f"use --strategy {' or '.join(able)}"
        )
    if variant.precision not in variant.precisions:
        able = [s.key for s in strategy_table() if variant.precision in s.precisions]
        names = [p.value for p in variant.precisions]
        spelled = ", ".join(names[:-1]) + " or " + names[-1] if len(names) > 1 else names[0]
        raise SpecError(
            f"{variant.key} computes in {spelled}, "
            f"not {variant.precision.value}; for {variant.precision.value} use --strategy "
            f"{', '.join(able)}"
        )
    plan = variant.plan(shape)
    hint = (
        "choose more output maps per thread (--coarsening) or a larger --tile"
        if variant.family == "direct"
        else "choose a larger --tile"
    )
    for launch in plan.launches:
        check_threads(launch.block, hint)
        check_grid(launch, hint)
    check_launch_bounds(plan.context, "choose fewer --blocks")
    return plan


def _through_view(plan: Plan, problem: ConvProblem) -> Plan:
    """A forward plan of ``problem.dgrad_view()`` as the dgrad plan of ``problem``: the
    kernels read dy where they read x and write dx where they wrote y, the host flips
    and transposes w, and every symbol carries the op."""
    view, old, new = plan.shape, plan.name, plan.variant.kernel_name(problem)
    swap = {Role.X: Role.DY, Role.Y: Role.DX}
    launches = tuple(
        replace(
            l,
            kernel=new + l.kernel[len(old) :],
            args=tuple(swap.get(a, a) for a in l.args),
            maps=tuple(m.with_role(swap.get(m.role, m.role)) for m in l.maps),
        )
        for l in plan.launches
    )
    how = Size(
        "dgrad",
        f"forward C={view.C} M={view.M} H={view.H} W={view.W} pad={_pads(view.pads)}",
        "dx = conv(dy, w flipped in R,S and transposed per group), stride 1; x is dy, y is dx",
    )
    return replace(
        plan,
        shape=problem,
        view=view,
        launches=launches,
        weight_transform="dgrad",
        sizes=(how, *plan.sizes),
    )


def _pads(pads) -> str:
    return str(pads[0]) if len(set(pads)) == 1 else "x".join(map(str, pads))


def first_planned(shape: ConvProblem, candidates: Iterable[Variant]) -> Variant:
    """The first candidate the planner accepts; the last one's refusal if none is."""
    return variants.first_planned(
        candidates, lambda v: make_plan(shape, v), "no candidate to plan", last=True
    )


# Band heights a search tries one by one from the top: every preset's whole image (the
# tallest, layer1's, has 80 output rows), so the presets' bands are the exhaustive
# search's; below them the searches bisect or climb a ladder (large images).
EXACT_HEIGHTS = 96


def tallest(most: int, accepted, exact: int = EXACT_HEIGHTS) -> int | None:
    """The tallest height r <= ``most`` with ``accepted(r)``, or None.  The top ``exact``
    heights are tried in turn; below them what a band needs (shared memory, registers)
    grows with its height, so the accepted heights are a prefix and the tallest is found
    by bisection: about log2(most) tries where an image of 100000 rows took 100000."""
    for r in range(most, max(most - exact, 0), -1):
        if accepted(r):
            return r
    hi = most - exact + 1  # refused, or past the top
    if hi <= 1 or not accepted(1):
        return None
    lo = 1  # accepted
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if accepted(mid):
            lo = mid
        else:
            hi = mid
    return lo


def ladder(most: int, exact: int = EXACT_HEIGHTS) -> list[int]:
    """Heights to compare, tallest first: every one of the top ``exact``, then each about
    a tenth below the last, down to 1 (some 120 heights for 100000 rows)."""
    out = list(range(most, max(most - exact, 0), -1))
    h = most - exact
    while h > 0:
        out.append(h)
        h = min(h - 1, int(h / 1.1))
    return out


def tallest_planned(shape: ConvProblem, make, most: int) -> Variant:
    """``make(r)`` for the tallest band height r <= ``most`` that the planner accepts;
    the error of the shortest band where none is."""

    def plans(r):
        try:
            make_plan(shape, make(r))
            return True
        except SpecError:
            return False

    r = tallest(most, plans)
    if r is None:
        make_plan(shape, make(1))  # raises the refusal of the smallest band
        raise SpecError(f"no band of at most {most} rows plans")
    return make(r)


__all__ = [
    "Launch",
    "Plan",
    "Size",
    "make_plan",
    "first_planned",
    "ladder",
    "tallest",
    "tallest_planned",
]
