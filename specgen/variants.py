"""The variant model: how a problem is computed.

Each strategy is one frozen dataclass, a subclass of ``Variant`` that holds only its
own parameters (``specgen/strategies/<key>.py``).  A parameter is declared with its
codec: the short tag that spells it in the canonical name (``t16``, ``x4y1m8``,
``r4x4``) and how the CLI option of the same name reads it.  The canonical name,
``<key>_<param tags>_<precision>``, is derived from the fields and is at once the file
name, the kernel symbol and part of the cache key; a problem whose op, dtype or layout
differs from the default adds them at the end (``kernel_name``).
"""

from __future__ import annotations

import dataclasses
import enum
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from .errors import SpecError
from .shapes import ConvProblem, DType, Feature, Op, TensorLayout

if TYPE_CHECKING:  # the planner's types; plan/ imports this module
    from .plan.common import Plan


class Precision(enum.Enum):
    """The math, apart from the storage dtype: what the products are computed in."""

    FP32 = "fp32"  # fp32 inputs, products and sums: exact fp32 arithmetic
    TF32 = "tf32"  # tensor cores: tf32 inputs, fp32 accumulation
    FP16 = "fp16"  # fp16 inputs (tensor cores) or half2 products (direct family)
    BF16 = "bf16"  # tensor cores: bf16 inputs, fp32 accumulation


class Layout(enum.Enum):
    """How a shared-memory halo tile is laid out (tiled and split)."""

    PLANAR = "planar"  # xs[c][row][col]: one plane per channel
    INTERLEAVED = "inter"  # xs[row][col][c]: a pixel's channels side by side


class Weights(enum.Enum):
    CONST = "wconst"  # __constant__ array sized M*C*K*K, warp-uniform broadcast
    GLOBAL = "wglobal"  # global memory through the read-only cache


# The problem features a strategy may serve (its ``serves``); make_plan refuses the
# rest in one line, so default_set and tune skip a strategy that cannot serve a problem.
GEOMETRY = frozenset(
    {
        Feature.RECT,
        Feature.STRIDE,
        Feature.DILATION,
        Feature.UNEQUAL_PAD,
        Feature.WIDE_PAD,
        Feature.GROUPS,
    }
)
EPILOGUE = frozenset({Feature.BIAS, Feature.ACT})
EVERY_FEATURE = frozenset(Feature)


def _enum(cls, text: str, what: str, aliases: dict | None = None):
    text = (aliases or {}).get(text, text)
    for member in cls:
        if text in (member.value, member.name.lower()):
            return member
    choices = ", ".join([*(aliases or {})] or [m.value for m in cls])
    raise SpecError(f"unknown {what} '{text}'; choose one of {choices}")


def parse_precision(text: str) -> Precision:
    return _enum(Precision, text, "precision")


# ---- codecs: how one parameter is spelled in a name and read from an option ----


class Codec:
    """Spells a parameter's value in the canonical name and reads it back; reads the
    CLI option's text.  ``name``/``from_name`` must round-trip."""

    flag: tuple[str, str] | None = None  # an on/off option pair instead of a value

    def name(self, value) -> str:
        raise NotImplementedError

    def from_name(self, text: str):
        """The value, or ValueError."""
        raise NotImplementedError

    def from_option(self, text: str):
        """The value, or SpecError saying what the option accepts."""
        raise NotImplementedError


@dataclass(frozen=True)
class Count(Codec):
    """A positive count after a one-letter tag: ``t16``, ``s2``, ``m128``."""

    tag: str

    def name(self, value: int) -> str:
        return f"{self.tag}{value}"

    def from_name(self, text: str) -> int:
        if not re.fullmatch(rf"{self.tag}[1-9][0-9]{{0,8}}", text):
            raise ValueError(text)
        return int(text[len(self.tag) :])

    def from_option(self, value: int) -> int:
        return value  # click's IntRange has checked it


@dataclass(frozen=True)
class Pair(Codec):
    """``r4x4``: each thread (or warp) holds 4 output maps x 4 pixels."""

    tag: str

    def name(self, value: tuple[int, int]) -> str:
        return f"{self.tag}{value[0]}x{value[1]}"

    def from_name(self, text: str) -> tuple[int, int]:
        m = re.fullmatch(rf"{self.tag}([1-9][0-9]{{0,8}})x([1-9][0-9]{{0,8}})", text)
        if not m:
            raise ValueError(text)
        return int(m.group(1)), int(m.group(2))

    def from_option(self, text: str) -> tuple[int, int]:
        m = re.fullmatch(r"([0-9]{1,9})x([0-9]{1,9})", text.strip())
        if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
            raise SpecError(
                f"malformed register tile '{text}'; write RxC with both at least 1, "
                "for example 4x4"
            )
        return int(m.group(1)), int(m.group(2))


@dataclass(frozen=True)
class Coarsening(Codec):
    """``x4y2m4``: 4 outputs along the row, 2 rows, 4 output maps per thread."""

    def name(self, value: tuple[int, int, int]) -> str:
        return "x%dy%dm%d" % value

    def from_name(self, text: str) -> tuple[int, int, int]:
        m = re.fullmatch(r"x([1-9][0-9]{0,8})y([1-9][0-9]{0,8})m([1-9][0-9]{0,8})", text)
        if not m:
            raise ValueError(text)
        return tuple(int(g) for g in m.groups())

    def from_option(self, text: str) -> tuple[int, int, int]:
        m = re.fullmatch(r"x([0-9]{1,9})y([0-9]{1,9})m([0-9]{1,9})", text.strip())
        if not m or any(int(g) < 1 for g in m.groups()):
            raise SpecError(
                f"malformed coarsening '{text}'; write xAyBmC with counts of at least 1, for "
                "example x4y1m4 (4 outputs along the row, 1 row, 4 output maps per thread)"
            )
        return tuple(int(g) for g in m.groups())


@dataclass(frozen=True)
class Choice(Codec):
    """An enum whose values are their own tags (``planar``, ``wconst``); the option
    takes the words in ``words`` (word -> value)."""

    enum: type
    what: str
    words: tuple[tuple[str, str], ...] = ()

    def name(self, value) -> str:
        return value.value

    def from_name(self, text: str):
        return self.enum(text)

    def from_option(self, text: str):
        return _enum(self.enum, text, self.what, dict(self.words) or None)


@dataclass(frozen=True)
class Switch(Codec):
    """A yes/no parameter: one tag for each (``uc``/``lc``); the option is a flag pair."""

    on: str
    off: str
    flag: tuple[str, str] = ("", "")

    def name(self, value: bool) -> str:
        return self.on if value else self.off

    def from_name(self, text: str) -> bool:
        return {self.on: True, self.off: False}[text]

    def from_option(self, value: bool) -> bool:
        return value


def param(default, codec: Codec, help: str):
    """A strategy parameter: its default, its codec and the option's help text."""
    return dataclasses.field(default=default, metadata=dict(codec=codec, help=help))


def first_planned(candidates, plan, refused: str, last: bool = False) -> "Variant":
    """The first of ``candidates`` (variants, the preferred first) that ``plan`` accepts
    (a ``fit``'s search): else the first one's refusal, which says why (the last one's,
    ``last``: a ladder of tiles, whose smallest meets the shape's own limits), or
    ``refused`` where there was no candidate.  The refusal is kept as its message: an
    exception kept past its handler holds its traceback's frames, and through them the
    caller's (an autograd backward's, with its graph), in a cycle that only the garbage
    collector frees."""
    why = None
    for v in candidates:
        try:
            plan(v)
            return v
        except SpecError as e:
            why = str(e) if last or why is None else why
    raise SpecError(why or refused)


# ---- the variant ----


@dataclass(frozen=True, kw_only=True)
class Variant:
    """Base of every strategy's parameter dataclass.  Subclasses set the class
    attributes below and implement ``plan``, ``default`` and ``space``."""

    key: ClassVar[str] = ""  # the strategy's name: CLI, file names, templates/<family>/
    family: ClassVar[str] = ""  # direct | gemm | outer (persist's register-tiled outer product)
    templates: ClassVar[tuple[str, ...]] = ()  # under templates/, the ones its plans render
    description: ClassVar[str] = ""  # the banner's first line
    serves: ClassVar[frozenset] = frozenset()  # problem features it computes
    precisions: ClassVar[tuple[Precision, ...]] = (Precision.FP32,)
    tensor_core: ClassVar[bool] = False
    # The ops it computes; one that computes fprop serves dgrad at stride 1 too, as the
    # forward convolution of ``ConvProblem.dgrad_view``.
    ops: ClassVar[frozenset] = frozenset({Op.FPROP})
    # A strided dgrad computed itself, a GEMM per stride phase of dx; at stride 1 still
    # through the forward view (tcgemm, wgmma, wgplanar).
    phased_dgrad: ClassVar[bool] = False

    precision: Precision = Precision.FP32

    @classmethod
    def ops_in_order(cls) -> list[Op]:
        return [o for o in Op if o in cls.ops]

    @classmethod
    def params(cls) -> list[dataclasses.Field]:
        """The strategy's own parameters in name order (precision is last, apart)."""
        return [f for f in dataclasses.fields(cls) if f.name != "precision"]

    @property
    def strategy(self) -> str:
        return self.key

    @property
    def three_tf32(self) -> bool:
        """fp32 math on the tensor cores, each product as three tf32 ones (tcgemm, tcwgrad,
        tc3wgrad): reference.error_coefficient's bound, choose.speed_class's middle
        class."""
        return self.tensor_core and self.precision is Precision.FP32

    @property
    def name(self) -> str:
        parts = [self.key]
        parts += [f.metadata["codec"].name(getattr(self, f.name)) for f in self.params()]
        return "_".join(parts + [self.precision.value])

    def kernel_name(self, problem: ConvProblem) -> str:
        """The name with the problem's op, dtype and layout where they are not the
        default: the file name, the kernel symbol and part of the cache key."""
        return "_".join([self.name, *problem_tags(problem)])

    @classmethod
    def from_parts(cls, parts: list[str]) -> "Variant":
        """The variant whose name is ``key_<parts>``; ValueError if they do not parse."""
        params = cls.params()
        if len(parts) != len(params) + 1:
            raise ValueError(parts)
        values = {f.name: f.metadata["codec"].from_name(t) for f, t in zip(params, parts)}
        return cls(**values, precision=Precision(parts[-1]))

    # -- what each strategy module implements --

    def plan(self, problem: ConvProblem) -> "Plan":
        """Check the limits, lay out memory, build the template's context."""
        raise NotImplementedError

    @classmethod
    def seeds(cls) -> list["Variant"]:
        """What this strategy puts in every problem's default set, before ``fit``."""
        return [cls(precision=p) for p in cls.precisions]

    @classmethod
    def problem_for(cls, problem: ConvProblem) -> ConvProblem:
        """The problem this strategy's planner, defaults and space work on: the problem
        itself, or for dgrad through a forward strategy its forward view; SpecError
        when the strategy does not compute the op.  A ``phased_dgrad`` strategy takes
        dgrad's forward view where it has one (stride 1), else the dgrad itself."""
        if problem.op is Op.DGRAD and cls.phased_dgrad:
            try:
                return problem.dgrad_view()
            except SpecError:
                return problem
        if problem.op in cls.ops:
            return problem
        if problem.op is Op.DGRAD and Op.FPROP in cls.ops:
            return problem.dgrad_view()
        able = [s.key for s in strategy_table() if problem.op in s.ops]
        raise SpecError(
            f"{cls.key} computes {' and '.join(o.value for o in Op if o in cls.ops)}, not "
            f"op={problem.op.value}; use --strategy {' or '.join(able)}"
        )

    @classmethod
    def fit(cls, problem: ConvProblem, seed: "Variant") -> "Variant":
        """``seed`` with the fields that depend on the problem filled in (a band or
        tile that fits, a register tile for its width), or SpecError."""
        return seed

    @classmethod
    def default(cls, problem: ConvProblem, precision: Precision) -> "Variant":
        """A variant without tuning, or SpecError when the strategy cannot serve."""
        return cls.fit(problem, cls(precision=precision))

    @classmethod
    def build(cls, problem: ConvProblem, precision: Precision | None, given: dict) -> "Variant":
        """What the CLI asked for (``given``: field -> value), defaults for the rest.
        Without a precision: the tensors' own dtype where the strategy computes in it,
        else the strategy's precisions in order, the first whose default it can make."""
        if precision is not None:
            return dataclasses.replace(cls.default(problem, precision), **given)
        own = [p for p in cls.precisions if p.value == problem.dtype.value]
        error = None
        for p in own + [p for p in cls.precisions if p not in own]:
            try:
                return dataclasses.replace(cls.default(problem, p), **given)
            except SpecError as e:
                error = error or e
        raise error

    @classmethod
    def space(cls, problem: ConvProblem, precision: Precision) -> list["Variant"]:
        """``tune``'s candidates in ``precision`` (the planner filters them after)."""
        return []


# ---- the problem's part of a kernel name ----

IO_TAG = "io"  # io<dtype>: the tensors' storage dtype, where it is not fp32


# The strategy table, in the order of the default set and of the CLI's help.  Every
# strategy module lives in specgen.strategies, whose __init__ registers the table before
# any of them can be used, so the planner can name the strategies that would serve a
# problem without importing them (which would close a circle through every strategy).
_TABLE: list[type[Variant]] = []


def register_table(table) -> None:
    _TABLE[:] = table


def strategy_table() -> tuple[type[Variant], ...]:
    return tuple(_TABLE)


def problem_tags(problem: ConvProblem) -> list[str]:
    tags = []
    if problem.op is not Op.FPROP:
        tags.append(problem.op.value)
    if problem.dtype is not DType.FP32:
        tags.append(IO_TAG + problem.dtype.value)
    if problem.layout is not TensorLayout.NCHW:
        tags.append(problem.layout.value)
    return tags


def split_problem_tags(name: str) -> tuple[str, dict]:
    """(variant name, {op, dtype, layout} the trailing tags name)."""
    parts = name.split("_")
    found: dict = {}
    while len(parts) > 1:
        tail = parts[-1]
        if tail.startswith(IO_TAG) and tail[len(IO_TAG) :] in {d.value for d in DType}:
            key, value = "dtype", DType(tail[len(IO_TAG) :])
        elif tail in {l.value for l in TensorLayout}:
            key, value = "layout", TensorLayout(tail)
        elif tail in {o.value for o in Op}:
            key, value = "op", Op(tail)
        else:
            break
        if key in found:
            break
        found[key] = value
        parts.pop()
    return "_".join(parts), found
