"""conv2d's stride, padding and dilation as PyTorch takes them (ints, pairs, 'same',
'valid'), normalized to the tuples specgen's problems hold."""

from __future__ import annotations

from ..errors import SpecError


def _pair(v, what: str) -> list[int]:
    if isinstance(v, int):
        return [v, v]
    v = list(v)
    if len(v) == 1:
        return v * 2
    if len(v) != 2 or not all(isinstance(i, int) for i in v):
        raise SpecError(f"{what} must be an int or a pair of ints, got {v}")
    return v


def _padding(padding, weight, stride, dilation) -> list[int]:
    """(top, bottom, left, right), as PyTorch pads: 'same' puts the odd pixel last."""
    if isinstance(padding, str):
        if padding == "valid":
            return [0, 0, 0, 0]
        if padding != "same":
            raise SpecError(f"padding='{padding}' is not one of 'same', 'valid'")
        if stride != [1, 1]:
            raise SpecError("padding='same' is not supported for strided convolutions")
        out = []
        for d, k in zip(dilation, weight.shape[2:]):
            total = d * (k - 1)
            out += [total // 2, total - total // 2]
        return out
    ph, pw = _pair(padding, "padding")
    return [ph, ph, pw, pw]


_normal: dict = {}  # (stride, padding, dilation, window) as given -> as the ops take them


def arguments(stride, padding, dilation, weight) -> tuple:
    """(stride, pads, dilation) as tuples, pads (top, bottom, left, right), memoized by
    the arguments as given where they are hashable (a module's always are)."""
    try:
        key = (stride, padding, dilation, weight.shape[2:])
        found = _normal.get(key)
    except TypeError:  # lists
        key = found = None
    if found is None:
        stride, dilation = _pair(stride, "stride"), _pair(dilation, "dilation")
        for what, pair in (("stride", stride), ("dilation", dilation)):
            if min(pair) < 1:
                raise SpecError(f"non-positive {what} {tuple(pair)} is not supported")
        pads = _padding(padding, weight, stride, dilation)
        if min(pads) < 0:
            raise SpecError(f"negative padding {tuple(pads)} is not supported")
        found = (tuple(stride), tuple(pads), tuple(dilation))
        if key is not None and len(_normal) < 4096:
            _normal[key] = found
    return found
