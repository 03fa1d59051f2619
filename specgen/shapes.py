"""Convolution shapes: the frozen ``ConvShape`` and the presets that specgen ships.

Layout is fixed: NCHW input ``x[B][C][H][W]``, weights ``w[M][C][K][K]``, output
``y[B][M][Ho][Wo]``, stride 1, zero padding ``pad`` on every side.  The batch B is a
launch-time parameter; every other number is baked into the generated source.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from .errors import SpecError

# specgen's kernels address one image of x or y, the weights and each grid axis with
# 32-bit ints (the batch offset is 64-bit); a shape past this is refused, not wrapped.
INDEX_LIMIT = 2**31 - 1


@dataclass(frozen=True)
class ConvShape:
    C: int
    M: int
    H: int
    W: int
    K: int
    pad: int = 0
    batch: int = 1  # default batch for verify and bench; not part of the source
    name: str = ""  # preset name, or "" for an inline spec

    def __post_init__(self):
        for field in ("C", "M", "H", "W", "K"):
            if getattr(self, field) < 1:
                raise SpecError(f"{field} must be at least 1, got {getattr(self, field)}")
        if self.pad < 0:
            raise SpecError(f"pad must be at least 0, got {self.pad}")
        if self.pad >= self.K:
            raise SpecError(f"pad={self.pad} must be smaller than K={self.K}")
        if self.K > self.H + 2 * self.pad or self.K > self.W + 2 * self.pad:
            raise SpecError(
                f"K={self.K} is larger than the padded image "
                f"{self.H + 2 * self.pad}x{self.W + 2 * self.pad}"
            )
        for what, formula, n, fix in (
            ("one image of x", "C*H*W", self.C * self.H * self.W, "C, H or W"),
            ("one image of y", "M*Ho*Wo", self.M * self.Ho * self.Wo, "M, H or W"),
            ("the weights", "M*C*K*K", self.weight_count, "M, C or K"),
        ):
            if n > INDEX_LIMIT:
                raise SpecError(
                    f"{what} holds {formula} = {n} elements, over the {INDEX_LIMIT} that "
                    f"specgen's 32-bit indices address; choose a smaller {fix}"
                )

    @property
    def Ho(self) -> int:
        return self.H + 2 * self.pad - self.K + 1

    @property
    def Wo(self) -> int:
        return self.W + 2 * self.pad - self.K + 1

    @property
    def reduction(self) -> int:
        """Length of each output's dot product: C*K*K."""
        return self.C * self.K * self.K

    @property
    def weight_count(self) -> int:
        return self.M * self.reduction

    @property
    def slug(self) -> str:
        """Folder name under generated/: the preset name, or the spec spelled out."""
        if self.name:
            return self.name
        pad = f"_p{self.pad}" if self.pad else ""
        return f"c{self.C}_m{self.M}_h{self.H}_w{self.W}_k{self.K}{pad}"

    @property
    def spec(self) -> str:
        return f"C={self.C},M={self.M},H={self.H},W={self.W},K={self.K},pad={self.pad}"

    def flops(self, batch: int) -> int:
        return 2 * batch * self.M * self.reduction * self.Ho * self.Wo

    def bytes_moved(self, batch: int) -> int:
        """Fewest bytes through device memory: x and w read once, y written once."""
        return 4 * (
            batch * self.C * self.H * self.W
            + self.weight_count
            + batch * self.M * self.Ho * self.Wo
        )


def _preset(name, C, M, HW, K, pad, batch):
    return ConvShape(C=C, M=M, H=HW, W=HW, K=K, pad=pad, batch=batch, name=name)


# ../shared/reference/shapes.md
PRESETS: dict[str, ConvShape] = {
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
    )
}

_SPEC_KEYS = ("C", "M", "H", "W", "K", "pad")
_SPEC_ITEM = re.compile(r"^\s*([A-Za-z]+)\s*=\s*(-?[0-9]+)\s*$")


def parse_shape(text: str) -> ConvShape:
    """A preset name, or an inline spec ``C=4,M=16,H=40,W=40,K=7[,pad=1]``."""
    text = text.strip()
    if text in PRESETS:
        return PRESETS[text]
    if "=" not in text:
        raise SpecError(
            f"unknown shape '{text}'; known presets: {', '.join(PRESETS)} "
            "(or an inline spec such as C=4,M=16,H=40,W=40,K=7,pad=0)"
        )
    values: dict[str, int] = {}
    for item in text.split(","):
        m = _SPEC_ITEM.match(item)
        key = m.group(1) if m else None
        if key is not None and key.lower() == "pad":
            key = "pad"
        if m is None or key not in _SPEC_KEYS:
            raise SpecError(
                f"malformed shape spec '{text}': '{item.strip()}' is not one of "
                "C=,M=,H=,W=,K=,pad= with an integer"
            )
        if key in values:
            raise SpecError(f"malformed shape spec '{text}': {key} given twice")
        digits = m.group(2)
        if len(digits.lstrip("-")) > 10 or int(digits) > INDEX_LIMIT:
            raise SpecError(f"shape spec '{text}': {key}={digits} is over {INDEX_LIMIT}")
        values[key] = int(digits)
    missing = [k for k in _SPEC_KEYS[:5] if k not in values]
    if missing:
        raise SpecError(f"malformed shape spec '{text}': missing {', '.join(missing)}")
    return ConvShape(**values)
