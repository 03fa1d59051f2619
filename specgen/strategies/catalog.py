"""The strategy table as text: what each strategy computes, what it serves, its options
and its templates.  `specgen strategies [NAME]` prints it, and docs/strategies.md is
``catalog()`` as it is today (a test keeps the two in sync)."""

from __future__ import annotations

import dataclasses
import sys

from ..shapes import Feature, Op
from ..variants import Variant
from . import BY_KEY, TABLE

HEADER = """# Strategies

Generated from specgen's strategy table (`specgen/strategies/`) by
`specgen strategies --markdown`; a test keeps this file in sync. `specgen strategies
NAME` prints one of them. Every strategy also takes `--precision` (the math), where it
computes in more than one.

A strategy that computes the forward pass also computes dgrad at stride 1: dgrad is then
the forward convolution of dy with the weights flipped and transposed (the *dgrad view*).
"""


def _summary(cls: type[Variant]) -> str:
    """The strategy module's docstring, each paragraph on one line."""
    doc = sys.modules[cls.__module__].__doc__ or ""
    return "\n\n".join(" ".join(p.split()) for p in doc.strip().split("\n\n"))


def _ops(cls: type[Variant]) -> str:
    ops = [o.value for o in cls.ops_in_order()]
    if Op.FPROP in cls.ops and Op.DGRAD not in cls.ops:
        ops.append("dgrad (stride 1, through the dgrad view)")
    return ", ".join(ops)


def _serves(cls: type[Variant]) -> str:
    served = [f.value for f in Feature if f in cls.serves]
    return ", ".join(served) if served else "plain problems only"


def _option(field: dataclasses.Field) -> str:
    codec = field.metadata["codec"]
    if codec.flag:
        return "--%s/--%s" % codec.flag
    return "--" + field.name.replace("_", "-")


def _default(cls: type[Variant], field: dataclasses.Field) -> str:
    value = field.default
    if value is dataclasses.MISSING and field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
    return field.metadata["codec"].name(value)


def describe(cls: type[Variant]) -> str:
    """One strategy in markdown."""
    lines = [
        f"## {cls.key}",
        "",
        cls.description[:1].upper() + cls.description[1:] + ".",
        "",
        _summary(cls),
        "",
        f"- **Computes:** {_ops(cls)}",
        f"- **Serves:** {_serves(cls)}",
        f"- **Math:** {', '.join(p.value for p in cls.precisions)}"
        + (" on the tensor cores" if cls.tensor_core else " on the CUDA cores"),
        f"- **Templates:** {', '.join(f'`templates/{t}`' for t in cls.templates)}",
        f"- **Module:** `{cls.__module__.replace('.', '/')}.py`",
    ]
    params = cls.params()
    if params:
        lines += ["", "| option | default (as in the name) | what it sets |", "|---|---|---|"]
        for f in params:
            help_text = f.metadata["help"].split(": ", 1)[-1].replace("|", "\\|")
            lines.append(f"| `{_option(f)}` | `{_default(cls, f)}` | {help_text} |")
    return "\n".join(lines) + "\n"


def catalog() -> str:
    """Every strategy, in the table's order, after an index."""
    index = ["| strategy | computes | math | what it is |", "|---|---|---|---|"]
    for cls in TABLE:
        index.append(
            f"| [`{cls.key}`](#{cls.key}) | {', '.join(o.value for o in cls.ops_in_order())} "
            f"| {', '.join(p.value for p in cls.precisions)} | {cls.description} |"
        )
    parts = [HEADER, "\n".join(index) + "\n"] + [describe(cls) for cls in TABLE]
    return "\n".join(parts)


def lookup(name: str) -> type[Variant]:
    from ..errors import SpecError

    if name not in BY_KEY:
        raise SpecError(f"unknown strategy '{name}'; known: {', '.join(c.key for c in TABLE)}")
    return BY_KEY[name]
