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


def refusal(stride, pads, dilation) -> str | None:
    """What PyTorch's convolution would say of normalized arguments no convolution takes
    (stride or dilation below 1, negative padding), or None where it takes them."""
    for what, pair in (("stride", stride), ("dilation", dilation)):
        if min(pair) < 1:
            return f"non-positive {what} {tuple(pair)} is not supported"
    if min(pads) < 0:
        return f"negative padding {tuple(pads)} is not supported"
    return None


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
        pads = _padding(padding, weight, stride, dilation)
        message = refusal(stride, pads, dilation)
        if message:
            raise SpecError(message)
        found = (tuple(stride), tuple(pads), tuple(dilation))
        if key is not None and len(_normal) < 4096:
            _normal[key] = found
    return found


def transposed(x_size, w_size, stride, pads, output_padding, dilation, groups):
    """The output size of a transposed convolution of ``x_size`` (N, C_in, H, W) by
    weights ``w_size`` (C_in, C_out/groups, R, S), as PyTorch's ``conv_transpose2d``
    gives it, and the pads (top, bottom, left, right) of the convolution whose dgrad
    computes it: that convolution has the same weights, stride, dilation, groups and
    leading pads, its input is the transposed output, and a bottom (right) pad chosen so
    that its output is H x W again (the pad itself where the output padding is below
    the stride, else smaller).  A transposed convolution that no such pad serves is
    refused here, and left to PyTorch."""
    (sh, sw), (dh, dw) = stride, dilation
    ops = _pair(output_padding, "output_padding")
    if min(ops) < 0:
        raise SpecError(f"negative output_padding {tuple(ops)} is not supported")
    for op, s, d in zip(ops, stride, dilation):
        if op >= max(s, d):
            raise SpecError(
                f"output padding must be smaller than either stride or dilation, got "
                f"output_padding={tuple(ops)}, stride={tuple(stride)}, "
                f"dilation={tuple(dilation)}"
            )
    N, _, H, W = x_size
    _, Cg_out, R, S = w_size
    Ho = (H - 1) * sh - pads[0] - pads[1] + dh * (R - 1) + ops[0] + 1
    Wo = (W - 1) * sw - pads[2] - pads[3] + dw * (S - 1) + ops[1] + 1
    if min(Ho, Wo) < 1:
        raise SpecError(f"a transposed convolution's output of {Ho}x{Wo} pixels")
    ends = []
    for lead, end, op, s in ((pads[0], pads[1], ops[0], sh), (pads[2], pads[3], ops[1], sw)):
        # the convolution's output is H when end - op lies in [0, s): end itself where
        # op < s, else the smallest non-negative pad that keeps it there
        if op < s:
            ends.append(end)
        elif end - op + s - 1 >= 0:
            ends.append(max(0, end - op))
        else:
            raise SpecError(
                f"output_padding {tuple(ops)} past the stride {tuple(stride)} and the padding"
            )
    return [N, Cg_out * groups, Ho, Wo], (pads[0], ends[0], pads[2], ends[1])
