"""Convolution problems: the frozen ``ConvProblem`` and the presets that specgen ships.

A problem says what is computed: the operation (the forward pass), the sizes C, M, H,
W, an R x S window, stride, dilation, zero padding on each side, groups, an optional
bias and activation, the tensors' dtype (x, w, bias and y share it; sums are fp32)
and their layout (NCHW or NHWC).  How it is computed (strategy, tiles, math precision)
is the variant's business.  The batch B is a launch-time parameter; every other number
is baked into the generated source.
"""

from __future__ import annotations

import enum
import re
from dataclasses import dataclass, replace

from .errors import SpecError

# specgen's kernels address one image of x or y, the weights and each grid axis with
# 32-bit ints (the batch offset is 64-bit); a shape past this is refused, not wrapped.
INDEX_LIMIT = 2**31 - 1


class Op(enum.Enum):
    """What a kernel computes.  The backward ops are those of the forward problem that
    the rest of the spec describes: its stride, padding and groups, dy shaped as its y."""

    FPROP = "fprop"  # y = conv(x, w) (+ bias, activation)
    DGRAD = "dgrad"  # dx = the adjoint of the convolution applied to dy
    WGRAD = "wgrad"  # dw = sum over images and output pixels of dy x x (+ db with bias=1)
    BGRAD = "bgrad"  # db = dy summed over images and output pixels

    # Members are singletons compared by identity: hash them so too, in C (Enum's own
    # hash runs Python code, and the operator's eager path keys its lookups by op).
    __hash__ = object.__hash__


class Act(enum.Enum):
    NONE = "none"
    RELU = "relu"


class DType(enum.Enum):
    """Storage type of x, w, bias and y; ``bits`` per element."""

    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"

    @property
    def bytes(self) -> int:
        return 4 if self is DType.FP32 else 2


class TensorLayout(enum.Enum):
    NCHW = "nchw"
    NHWC = "nhwc"

    __hash__ = object.__hash__  # as Op's

    @property
    def other(self) -> "TensorLayout":
        """The other memory format: where the operator may compute an op instead."""
        return TensorLayout.NHWC if self is TensorLayout.NCHW else TensorLayout.NCHW


class Feature(enum.Enum):
    """What a problem may have beyond a dense, stride-1, square-window fp32 NCHW
    convolution without an epilogue, equally padded by less than the window.  Each
    strategy says which it serves (``variants.SERVES``)."""

    RECT = "rect"
    STRIDE = "stride"
    DILATION = "dilation"
    UNEQUAL_PAD = "unequal padding"
    WIDE_PAD = "wide padding"
    GROUPS = "groups"
    BIAS = "bias"
    ACT = "activation"
    DTYPE16 = "16-bit tensors"
    NHWC = "nhwc"


@dataclass(frozen=True)
class ConvProblem:
    C: int
    M: int
    H: int
    W: int
    R: int  # window rows
    S: int  # window columns
    stride: tuple[int, int] = (1, 1)  # (rows, columns)
    dil: tuple[int, int] = (1, 1)
    pads: tuple[int, int, int, int] = (0, 0, 0, 0)  # top, bottom, left, right
    groups: int = 1
    bias: bool = False
    act: Act = Act.NONE
    dtype: DType = DType.FP32
    layout: TensorLayout = TensorLayout.NCHW
    op: Op = Op.FPROP
    batch: int = 1  # default batch for verify and bench; not part of the source
    name: str = ""  # preset name, or "" for an inline spec

    def __post_init__(self):
        for field in ("C", "M", "H", "W", "R", "S", "groups"):
            if getattr(self, field) < 1:
                key = {"R": "K", "S": "K"}.get(field, field)
                raise SpecError(f"{key} must be at least 1, got {getattr(self, field)}")
        for what, pair in (("stride", self.stride), ("dil", self.dil)):
            if min(pair) < 1:
                raise SpecError(f"{what} must be at least 1 on both axes, got {_pair(pair)}")
        if self.op is not Op.FPROP and self.act is not Act.NONE:
            raise SpecError(
                f"act={self.act.value} is part of the forward pass; op={self.op.value} takes "
                "dy of the convolution's output (apply the activation's gradient first): drop act"
            )
        if self.op is Op.DGRAD and self.bias:
            raise SpecError(
                "op=dgrad does not read the bias: drop bias=1 (db comes from op=wgrad with "
                "bias=1, or op=bgrad)"
            )
        if min(self.pads) < 0:
            raise SpecError(f"pad must be at least 0 on every side, got {self.pads}")
        if self.C % self.groups or self.M % self.groups:
            raise SpecError(
                f"groups={self.groups} must divide C={self.C} and M={self.M}; choose a "
                "common divisor of both"
            )
        pt, pb, pl, pr = self.pads
        span = (self.dil[0] * (self.R - 1) + 1, self.dil[1] * (self.S - 1) + 1)
        if span[0] > self.H + pt + pb or span[1] > self.W + pl + pr:
            window = (
                f"K={self.K}"
                if self.is_square and self.dil == (1, 1)
                else (f"the {'dilated ' if self.dil != (1, 1) else ''}window {span[0]}x{span[1]}")
            )
            raise SpecError(
                f"{window} is larger than the padded image {self.H + pt + pb}x{self.W + pl + pr}"
            )
        for what, formula, n, fix in (
            ("one image of x", "C*H*W", self.C * self.H * self.W, "C, H or W"),
            ("one image of y", "M*Ho*Wo", self.M * self.Ho * self.Wo, "M, H or W"),
            ("the weights", "M*C/groups*R*S", self.weight_count, "M, C or K"),
        ):
            if n > INDEX_LIMIT:
                raise SpecError(
                    f"{what} holds {formula} = {n} elements, over the {INDEX_LIMIT} that "
                    f"specgen's 32-bit indices address; choose a smaller {fix}"
                )

    # The square-window, equal-padding view that the stride-1 strategies use.
    @property
    def is_square(self) -> bool:
        return self.R == self.S

    @property
    def K(self) -> int:
        """The window edge of a square window (R for a rectangular one)."""
        return self.R

    @property
    def pad(self) -> int:
        """The padding of a problem padded equally on every side (top otherwise)."""
        return self.pads[0]

    def features(self) -> dict[Feature, str]:
        """Each feature the problem has, spelled out for messages."""
        out = {}
        if not self.is_square:
            out[Feature.RECT] = f"a {self.R}x{self.S} window"
        if self.stride != (1, 1):
            out[Feature.STRIDE] = f"stride {_pair(self.stride)}"
        if self.dil != (1, 1):
            out[Feature.DILATION] = f"dilation {_pair(self.dil)}"
        if len(set(self.pads)) > 1:
            out[Feature.UNEQUAL_PAD] = f"unequal padding {_pads_text(self.pads)}"
        elif self.pad >= self.K:
            out[Feature.WIDE_PAD] = f"padding {self.pad} not under the window {self.K}"
        if self.groups > 1:
            out[Feature.GROUPS] = f"{self.groups} groups"
        if self.bias:
            out[Feature.BIAS] = "a bias"
        if self.act is not Act.NONE:
            out[Feature.ACT] = f"{self.act.value} after it"
        if self.dtype is not DType.FP32:
            out[Feature.DTYPE16] = f"{self.dtype.value} tensors"
        if self.layout is not TensorLayout.NCHW:
            out[Feature.NHWC] = f"{self.layout.value} layout"
        return out

    def unusual(self) -> list[str]:
        """The features, spelled out; empty for the presets' kind of problem."""
        return list(self.features().values())

    @property
    def Ho(self) -> int:
        pt, pb, _, _ = self.pads
        return (self.H + pt + pb - self.dil[0] * (self.R - 1) - 1) // self.stride[0] + 1

    @property
    def Wo(self) -> int:
        _, _, pl, pr = self.pads
        return (self.W + pl + pr - self.dil[1] * (self.S - 1) - 1) // self.stride[1] + 1

    @property
    def Cg(self) -> int:
        """Input channels of one group."""
        return self.C // self.groups

    @property
    def Mg(self) -> int:
        """Output maps of one group."""
        return self.M // self.groups

    @property
    def reduction(self) -> int:
        """Length of each output's dot product: C/groups*R*S."""
        return self.Cg * self.R * self.S

    @property
    def weight_count(self) -> int:
        return self.M * self.reduction

    @property
    def slug(self) -> str:
        """Folder name under generated/: the preset name, or the spec spelled out."""
        if self.name:
            return self.name
        window = f"k{self.R}" if self.is_square else f"k{self.R}x{self.S}"
        parts = [f"c{self.C}", f"m{self.M}", f"h{self.H}", f"w{self.W}", window]
        pads = _pads_text(self.pads)
        if pads != "0":
            parts.append("p" + pads)
        if self.stride != (1, 1):
            parts.append("s" + _pair(self.stride))
        if self.dil != (1, 1):
            parts.append("d" + _pair(self.dil))
        if self.groups > 1:
            parts.append(f"g{self.groups}")
        if self.bias:
            parts.append("bias")
        if self.act is not Act.NONE:
            parts.append(self.act.value)
        if self.dtype is not DType.FP32:
            parts.append(self.dtype.value)
        if self.layout is not TensorLayout.NCHW:
            parts.append(self.layout.value)
        return "_".join(parts)

    @property
    def spec(self) -> str:
        """The inline spec that parses back to this problem (without name and batch)."""
        window = str(self.R) if self.is_square else f"{self.R}x{self.S}"
        text = f"C={self.C},M={self.M},H={self.H},W={self.W},K={window},pad={_pads_text(self.pads)}"
        if self.stride != (1, 1):
            text += f",stride={_pair(self.stride)}"
        if self.dil != (1, 1):
            text += f",dil={_pair(self.dil)}"
        if self.groups > 1:
            text += f",groups={self.groups}"
        if self.bias:
            text += ",bias=1"
        if self.act is not Act.NONE:
            text += f",act={self.act.value}"
        if self.dtype is not DType.FP32:
            text += f",dtype={self.dtype.value}"
        if self.layout is not TensorLayout.NCHW:
            text += f",layout={self.layout.value}"
        if self.op is not Op.FPROP:
            text += f",op={self.op.value}"
        return text

    def banner(self) -> tuple[str, str]:
        """Two lines for a generated file's header: the sizes, and the tensors."""
        if not self.unusual() and self.op is Op.FPROP:
            return (
                f"C={self.C} M={self.M} H={self.H} W={self.W} K={self.K} pad={self.pad}",
                f"x[B][{self.C}][{self.H}][{self.W}] * w[{self.M}][{self.C}][{self.K}][{self.K}]"
                f" -> y[B][{self.M}][{self.Ho}][{self.Wo}], stride 1, B at launch",
            )
        x, y = (
            (f"[B][{self.C}][{self.H}][{self.W}]", f"[B][{self.M}][{self.Ho}][{self.Wo}]")
            if self.layout is TensorLayout.NCHW
            else (f"[B][{self.H}][{self.W}][{self.C}]", f"[B][{self.Ho}][{self.Wo}][{self.M}]")
        )
        w = f"w[{self.M}][{self.Cg}][{self.R}][{self.S}]"
        epilogue = (" + bias" if self.bias else "") + (
            f", then {self.act.value}" if self.act is not Act.NONE else ""
        )
        tensors = {
            Op.FPROP: f"x{x} * {w}{epilogue} -> y{y}",
            Op.DGRAD: f"dy{y} * {w} -> dx{x}, the forward problem's adjoint",
            Op.WGRAD: f"x{x} * dy{y} -> d{w}"
            + (f", db[{self.M}]" if self.bias else "")
            + ", summed over the batch",
            Op.BGRAD: f"dy{y} -> db[{self.M}], summed over the batch",
        }[self.op]
        return (
            self.spec.replace(",", " "),
            f"{self.dtype.value} {tensors} ({self.layout.value}), fp32 sums, B at launch",
        )

    def flops(self, batch: int) -> int:
        """Each op but bgrad makes the forward pass's multiply-adds; bgrad one add per
        element of dy."""
        if self.op is Op.BGRAD:
            return batch * self.M * self.Ho * self.Wo
        return 2 * batch * self.M * self.reduction * self.Ho * self.Wo

    def bytes_moved(self, batch: int) -> int:
        """Fewest bytes through device memory: each operand read once, the result
        written once (x, w, y for fprop; dy, w, dx for dgrad; x, dy, dw for wgrad)."""
        x = batch * self.C * self.H * self.W
        y = batch * self.M * self.Ho * self.Wo
        w = self.weight_count
        b = self.M if self.bias or self.op is Op.BGRAD else 0
        count = {Op.FPROP: x + w + y, Op.DGRAD: x + w + y, Op.WGRAD: x + y + w + b}
        return self.dtype.bytes * count.get(self.op, y + b)

    def with_op(self, op: "Op") -> "ConvProblem":
        """The same layer, another op: act goes (it is the forward pass's), and the bias
        goes from dgrad (which does not read it)."""
        act = self.act if op is Op.FPROP else Act.NONE
        bias = self.bias and op is not Op.DGRAD
        return replace(self, op=op, act=act, bias=bias)

    def dgrad_view(self) -> "ConvProblem":
        """At stride 1, dgrad is a forward convolution of dy with the weights flipped in
        R and S and transposed to [C][M/groups] per group, padded by the dilated window
        minus the forward padding: the problem every forward strategy computes for it."""
        if self.stride != (1, 1):
            raise SpecError(
                f"dgrad at stride {_pair(self.stride)} is no forward convolution of dy "
                "(its taps fall in stride phases): use --strategy phased"
            )
        (dh, dw), (pt, pb, pl, pr) = self.dil, self.pads
        th, tw = dh * (self.R - 1), dw * (self.S - 1)
        pads = (th - pt, th - pb, tw - pl, tw - pr)
        if min(pads) < 0:
            raise SpecError(
                f"dgrad with padding {_pads_text(self.pads)} past the window's reach "
                f"{_pair((th, tw))} is no forward convolution of dy: use --strategy phased"
            )
        return replace(
            self,
            C=self.M,
            M=self.C,
            H=self.Ho,
            W=self.Wo,
            pads=pads,
            op=Op.FPROP,
            bias=False,
            act=Act.NONE,
            name="",
        )


def _pair(p: tuple[int, int]) -> str:
    return str(p[0]) if p[0] == p[1] else f"{p[0]}x{p[1]}"


def _pads_text(pads) -> str:
    pt, pb, pl, pr = pads
    if pt == pb == pl == pr:
        return str(pt)
    if pt == pb and pl == pr:
        return f"{pt}x{pl}"
    return f"{pt}x{pb}x{pl}x{pr}"


def square(C, M, H, W, K, pad=0, **kw) -> ConvProblem:
    """A problem with a K x K window and ``pad`` on every side (the presets' kind)."""
    return ConvProblem(C=C, M=M, H=H, W=W, R=K, S=K, pads=(pad,) * 4, **kw)


def _preset(name, C, M, HW, K, pad, batch, dtype=DType.FP32, layout=TensorLayout.NCHW):
    return square(C, M, HW, HW, K, pad, batch=batch, name=name, dtype=dtype, layout=layout)


# ../shared/reference/shapes.md
PRESETS: dict[str, ConvProblem] = {
    s.name: s
    for s in (
        _preset("layer1", 1, 4, 86, 7, 0, 10000),
        _preset("layer2", 4, 16, 40, 7, 0, 10000),
        _preset("mx-layer1", 1, 12, 72, 7, 0, 10000),
        _preset("mx-layer2", 12, 24, 33, 7, 0, 10000),
        _preset("ae-enc1", 3, 256, 32, 3, 1, 128),
        _preset("ae-enc2", 256, 128, 16, 3, 1, 128),
        _preset("ae-dec1", 128, 128, 8, 3, 1, 128),
        _preset("ae-dec2", 128, 256, 16, 3, 1, 128),
        _preset("ae-dec3", 256, 3, 32, 3, 1, 128),
        # The wide autoencoder layers as PyTorch runs them under bf16 autocast on
        # channels_last tensors: what the tensor-core strategies are measured on.
        _preset("ae-enc2-bf16", 256, 128, 16, 3, 1, 128, DType.BF16, TensorLayout.NHWC),
        _preset("ae-dec2-bf16", 128, 256, 16, 3, 1, 128, DType.BF16, TensorLayout.NHWC),
        # ... and the output layer (3 maps), where kn2row's taps-as-columns GEMM runs.
        _preset("ae-dec3-bf16", 256, 3, 32, 3, 1, 128, DType.BF16, TensorLayout.NHWC),
        # The seeds' 7x7 layers in bf16 (NCHW, as the courses store them): where the
        # 16-bit tensor-core kernels for few channels (mmastrip, mmapersist) are
        # generated, verified and benched against the 16-bit targets.
        _preset("layer1-bf16", 1, 4, 86, 7, 0, 10000, DType.BF16),
        _preset("layer2-bf16", 4, 16, 40, 7, 0, 10000, DType.BF16),
        _preset("mx-layer1-bf16", 1, 12, 72, 7, 0, 10000, DType.BF16),
        _preset("mx-layer2-bf16", 12, 24, 33, 7, 0, 10000, DType.BF16),
        # The output layer (3 maps) as the fp32 and tf32 channels_last step runs it:
        # where wlane, its channels-last wgrad, is generated, verified and benched.
        _preset("ae-dec3-nhwc", 256, 3, 32, 3, 1, 128, DType.FP32, TensorLayout.NHWC),
    )
}

_INT = "[0-9]+"
_SPEC_ITEM = re.compile(r"^\s*([A-Za-z]+)\s*=\s*([^=]*?)\s*$")
_KEYS = {
    "C": "an integer",
    "M": "an integer",
    "H": "an integer",
    "W": "an integer",
    "K": "R or RxS, for example 3 or 3x5",
    "pad": "P, PxQ (rows x columns), TxBxLxR, same or valid",
    "stride": "S or SHxSW, for example 2 or 2x1",
    "dil": "D or DHxDW, for example 2 or 2x1",
    "groups": "an integer dividing C and M",
    "bias": "0 or 1",
    "act": "none or relu",
    "dtype": "fp32, fp16 or bf16",
    "layout": "nchw or nhwc",
    "op": "fprop, dgrad, wgrad or bgrad",
}


def _number(key: str, text: str, spec: str) -> int:
    if not re.fullmatch(r"-?[0-9]+", text):
        raise SpecError(f"malformed shape spec '{spec}': {key}={text} is not {_KEYS[key]}")
    if len(text.lstrip("-")) > 10 or int(text) > INDEX_LIMIT:
        raise SpecError(f"malformed shape spec '{spec}': {key}={text} is over {INDEX_LIMIT}")
    return int(text)


def _numbers(key: str, text: str, spec: str, counts: tuple[int, ...]) -> list[int]:
    parts = text.split("x")
    if len(parts) not in counts:
        raise SpecError(f"malformed shape spec '{spec}': {key}={text} is not {_KEYS[key]}")
    return [_number(key, p, spec) for p in parts]


def _choice(key: str, text: str, spec: str, cls):
    for member in cls:
        if text.lower() == member.value:
            return member
    raise SpecError(f"malformed shape spec '{spec}': {key}={text} is not {_KEYS[key]}")


def parse_shape(text: str) -> ConvProblem:
    """A preset name, or an inline spec: ``C=4,M=16,H=40,W=40,K=7[,pad=1]`` and the keys
    K=RxS, stride=, dil=, pad=PxQ|same|valid, groups=, bias=, act=, dtype=, layout=, op=."""
    text = text.strip()
    if text in PRESETS:
        return PRESETS[text]
    if "=" not in text:
        raise SpecError(
            f"unknown shape '{text}'; known presets: {', '.join(PRESETS)} "
            "(or an inline spec such as C=4,M=16,H=40,W=40,K=7,pad=0)"
        )
    raw: dict[str, str] = {}
    for item in text.split(","):
        m = _SPEC_ITEM.match(item)
        key = m.group(1) if m else None
        if key is not None and key not in ("C", "M", "H", "W", "K"):
            key = key.lower()  # the sizes are upper case, the other keys any case
        if m is None or key not in _KEYS:
            raise SpecError(
                f"malformed shape spec '{text}': '{item.strip()}' is not one of "
                f"{', '.join(k + '=' for k in _KEYS)} with a value"
            )
        if key in raw:
            raise SpecError(f"malformed shape spec '{text}': {key} given twice")
        raw[key] = m.group(2)
    missing = [k for k in ("C", "M", "H", "W", "K") if k not in raw]
    if missing:
        raise SpecError(f"malformed shape spec '{text}': missing {', '.join(missing)}")
    C, M, H, W = (_number(k, raw[k], text) for k in ("C", "M", "H", "W"))
    window = _numbers("K", raw["K"], text, (1, 2))
    R, S = window * 2 if len(window) == 1 else window
    fields = dict(C=C, M=M, H=H, W=W, R=R, S=S)
    for key in ("stride", "dil"):
        if key in raw:
            pair = _numbers(key, raw[key], text, (1, 2))
            fields[key] = tuple(pair * 2 if len(pair) == 1 else pair)
    if "groups" in raw:
        fields["groups"] = _number("groups", raw["groups"], text)
    if "bias" in raw:
        if raw["bias"] not in ("0", "1"):
            raise SpecError(
                f"malformed shape spec '{text}': bias={raw['bias']} is not {_KEYS['bias']}"
            )
        fields["bias"] = raw["bias"] == "1"
    for key, cls in (("act", Act), ("dtype", DType), ("layout", TensorLayout), ("op", Op)):
        if key in raw:
            fields[key] = _choice(key, raw[key], text, cls)
    fields["pads"] = _pads(raw.get("pad", "0"), fields, text)
    return ConvProblem(**fields)


def _pads(value: str, fields: dict, spec: str) -> tuple[int, int, int, int]:
    """pad=P, PxQ (rows x columns), TxBxLxR, valid (none) or same (PyTorch's: the
    output as large as the input, the odd pixel of an even window at the end)."""
    if value.lower() == "valid":
        return (0, 0, 0, 0)
    if value.lower() == "same":
        if fields.get("stride", (1, 1)) != (1, 1):
            raise SpecError(
                f"malformed shape spec '{spec}': pad=same needs stride 1 (as in PyTorch)"
            )
        dh, dw = fields.get("dil", (1, 1))
        th, tw = dh * (fields["R"] - 1), dw * (fields["S"] - 1)
        return (th // 2, th - th // 2, tw // 2, tw - tw // 2)
    p = _numbers("pad", value, spec, (1, 2, 4))
    if len(p) == 1:
        return (p[0],) * 4
    if len(p) == 2:
        return (p[0], p[0], p[1], p[1])
    return tuple(p)
