"""shape + variant -> plan: every derived number, every limit checked, before rendering."""

from ..shapes import ConvProblem
from ..errors import SpecError
from ..variants import SERVES, Strategy, Variant
from .common import Launch, Plan, Size, check_grid
from .direct import plan_direct


def make_plan(shape: ConvProblem, variant: Variant) -> Plan:
    plan = _plan(shape, variant.canonical())
    hint = (
        "choose more output maps per thread (--coarsening) or a larger --tile"
        if plan.variant.strategy.family == "direct"
        else "choose a larger --tile"
    )
    for launch in plan.launches:
        check_grid(launch, hint)
    return plan


def _plan(shape: ConvProblem, variant: Variant) -> Plan:
    served = SERVES[variant.strategy]
    missing = {f: text for f, text in shape.features().items() if f not in served}
    if missing:
        able = [s.value for s in Strategy if set(missing) <= SERVES[s]]
        raise SpecError(
            f"{variant.strategy.value} cannot serve {', '.join(missing.values())}; "
            f"use --strategy {' or '.join(able)}"
        )
    if variant.strategy.family == "direct":
        return plan_direct(shape, variant)
    if variant.strategy is Strategy.PERSIST:
        from .persist import plan_persist

        return plan_persist(shape, variant)
    if variant.strategy is Strategy.STREAM:
        from .stream import plan_stream

        return plan_stream(shape, variant)
    if variant.strategy is Strategy.MMAPERSIST:
        from .mmapersist import plan_mmapersist

        return plan_mmapersist(shape, variant)
    if variant.strategy is Strategy.MMATILE:
        from .mmatile import plan_mmatile

        return plan_mmatile(shape, variant)
    from .gemm import plan_gemm

    return plan_gemm(shape, variant)


__all__ = ["Launch", "Plan", "Size", "make_plan", "Strategy"]
