"""The strategy table: one module per strategy, each a ``Variant`` subclass holding its
own parameters, planner, defaults and search space.  A new strategy is a module, a
line in ``TABLE``, a template and its tests; everything else (the CLI's options, name
parsing, the default set, tune's space) reads this table."""

from __future__ import annotations

import functools

from ..errors import SpecError
from ..shapes import ConvProblem, Op
from ..variants import Precision, Variant, register_table, split_problem_tags
from .direct import Direct
from .drow import Drow
from .dwlane import Dwlane, Dwrows
from .dwplane import Dwplane
from .flane import Flane
from .im2col import Im2col
from .implicit import Implicit
from .inputtile import Inputtile
from .kn2row import Kn2row
from .mma import Mma
from .mmafew import Mmafew
from .mmahwc import Mmahwc
from .mmapersist import Mmapersist
from .mmarows import Mmarows
from .mmastrip import Mmafold, Mmastrip
from .mmatoep import Mmatoep
from .mmatile import Mmatile
from .persist import Persist
from .phased import Phased
from .split import Split
from .stream import Stream
from .tc3wgrad import Tc3wgrad
from .tcgemm import Tcgemm
from .tcwgrad import Tcwgrad
from .tcwhalo import Tcwhalo
from .tiled import Tiled
from .wband import Wband
from .wdw import Wdw
from .wfew import Wfew
from .wgemm import Wgemm
from .wgmma import Wgdsm, Wgmma
from .wgnchw import Wgnchw
from .wgplanar import Wgcols, Wgplanar
from .wgwgrad import Wgwdsm, Wgwgrad, Wgwhalo, Wgwtma
from .wgwino import Wgwino
from .wlane import Wlane
from .wsplit import Wsplit
from .wstrip import Wstrip
from .wtap import Wtap

# The order of the default set and of the CLI's help.
TABLE: tuple[type[Variant], ...] = (
    Direct,
    Tiled,
    Split,
    Inputtile,
    Im2col,
    Implicit,
    Mma,
    Mmatile,
    Persist,
    Stream,
    Flane,
    Dwlane,
    Dwrows,
    Dwplane,
    Mmapersist,
    Mmastrip,
    Mmafold,
    Mmatoep,
    Mmahwc,
    Mmarows,
    Tcgemm,
    Wgmma,
    Wgdsm,
    Wgplanar,
    Wgcols,
    Kn2row,
    Mmafew,
    Phased,
    Drow,
    Wband,
    Wtap,
    Wgemm,
    Wgwgrad,
    Wgwtma,
    Wgwdsm,
    Wgwhalo,
    Wgnchw,
    Wgwino,
    Tcwgrad,
    Tcwhalo,
    Tc3wgrad,
    Wfew,
    Wstrip,
    Wdw,
    Wlane,
    Wsplit,
)
register_table(TABLE)
BY_KEY = {s.key: s for s in TABLE}


def strategy_class(text: str) -> type[Variant]:
    if text in BY_KEY:
        return BY_KEY[text]
    raise SpecError(f"unknown strategy '{text}'; choose one of {', '.join(BY_KEY)}")


def parse_variant_name(name: str, problem: ConvProblem | None = None) -> Variant:
    """Inverse of ``Variant.name`` (and of ``kernel_name`` when the problem's tags are
    there: they must then be the problem's own)."""
    base, tags = split_problem_tags(name)
    parts = base.split("_")
    cls = BY_KEY.get(parts[0])
    try:
        if cls is None:
            raise ValueError
        variant = cls.from_parts(parts[1:])
    except (ValueError, KeyError):
        raise SpecError(f"malformed variant name '{name}'") from None
    if variant.name != base:
        raise SpecError(f"malformed variant name '{name}' (canonical: {variant.name})")
    if tags and problem is not None:
        want = variant.kernel_name(problem)
        if want != name:
            raise SpecError(f"variant '{name}' is for another problem: this one's is '{want}'")
    return variant


def options() -> dict[str, dict]:
    """The CLI's variant options, from the parameter fields: for each, its codec, its
    help (each distinct text once) and the strategies that read it."""
    out: dict[str, dict] = {}
    for cls in TABLE:
        for f in cls.params():
            opt = out.setdefault(f.name, dict(codec=f.metadata["codec"], helps=[], readers=[]))
            if f.metadata["help"] not in opt["helps"]:
                opt["helps"].append(f.metadata["help"])
            opt["readers"].append(cls.key)
    return out


def readers(option: str) -> list[str]:
    return [cls.key for cls in TABLE if option in {f.name for f in cls.params()}]


def default_set(problem: ConvProblem, tensor_cores: bool = False) -> list[Variant]:
    """One of each strategy and precision that can serve the problem, and for a preset
    the winners shipped for it (``tunedb.shipped_winners``), so that the kernels worth
    reading are in generated/ and covered by ``verify --all``; the tensor-core
    strategies' only where ``tensor_cores`` (a tune searching those alone)."""
    return list(_default_set(problem, tensor_cores))


@functools.lru_cache(maxsize=1024)
def _default_set(problem: ConvProblem, tensor_cores: bool) -> tuple[Variant, ...]:
    """``default_set``, planned once a process: the CLI, the operator and the tests ask
    for the same problems' sets many times, and some planners search a bank model."""
    from .. import tunedb
    from ..plan import make_plan

    out: list[Variant] = []
    for cls in TABLE:
        if tensor_cores and not cls.tensor_core:
            continue
        for seed in cls.seeds():
            try:
                v = cls.fit(cls.problem_for(problem), seed)
                make_plan(problem, v)
            except SpecError:
                continue  # this strategy cannot serve this problem; the planner said why
            if v not in out:
                out.append(v)
    if problem.name:
        for name in tunedb.shipped_names(problem.slug):
            if split_problem_tags(name)[1].get("op", Op.FPROP) is not problem.op:
                continue
            v = parse_variant_name(split_problem_tags(name)[0])
            if v not in out:
                out.append(v)
    return tuple(out)


def default_strategy(problem: ConvProblem) -> type[Variant]:
    """What ``--strategy`` means when not given: tiled for the forward pass (and dgrad
    through it), else the first strategy that computes the op."""
    try:
        Tiled.problem_for(problem)
        return Tiled
    except SpecError:
        able = [s for s in TABLE if problem.op in s.ops]
        serves = [s for s in able if set(problem.features()) <= s.serves]
        return (serves or able or [Tiled])[0]


__all__ = [
    "TABLE",
    "Tcgemm",
    "Tcwgrad",
    "BY_KEY",
    "Precision",
    "default_set",
    "options",
    "parse_variant_name",
]
