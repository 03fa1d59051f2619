"""Host-side tensors of a problem: their shapes in its layout, their storage dtype, and
the conversions between fp32 values and storage.

CuPy and NumPy have no bfloat16: a bf16 tensor is held as uint16 words (the upper half
of the fp32 bit pattern), fp16 as float16.  Every function takes NumPy or CuPy arrays
alike (``xp`` is the array's module).
"""

from __future__ import annotations

import enum

import numpy as np

from .shapes import ConvProblem, DType, Op, TensorLayout


class Role(enum.Enum):
    """What a kernel argument is.  The planner lists a launch's arguments as roles, the
    runtime binds a buffer to each, and the reference computes the same roles."""

    X = "x"  # the input activations
    W = "w"  # the weights, packed to the plan's weight_format
    BIAS = "bias"
    Y = "y"  # the output activations
    DY = "dy"  # the gradient of the loss with respect to y (the backward ops' input)
    DX = "dx"  # ... with respect to x (dgrad's output)
    DW = "dw"  # ... with respect to w (wgrad's output, [M][C/groups][R][S])
    DB = "db"  # ... with respect to the bias ([M], from wgrad with bias=1 or bgrad)
    WORKSPACE = "workspace"  # scratch the plan sizes (im2col's unrolled matrix, partial sums)
    BATCH = "batch"  # not a tensor: the images in this launch, an int32

    # Members are singletons compared by identity: hash them so too, in C.  Enum's own
    # hash runs Python code, and the launch path looks roles up for every argument.
    __hash__ = object.__hash__


# The tensors each op reads (besides the weights and bias that set_weights uploads) and
# writes; the batched ones are cut into the launches' chunks of images.
INPUTS = {
    Op.FPROP: (Role.X,),
    Op.DGRAD: (Role.DY,),
    Op.WGRAD: (Role.X, Role.DY),
    Op.BGRAD: (Role.DY,),
}
BATCHED = frozenset({Role.X, Role.Y, Role.DY, Role.DX})


def outputs(p: ConvProblem) -> tuple[Role, ...]:
    if p.op is Op.FPROP:
        return (Role.Y,)
    if p.op is Op.DGRAD:
        return (Role.DX,)
    if p.op is Op.WGRAD:
        return (Role.DW, Role.DB) if p.bias else (Role.DW,)
    return (Role.DB,)


def role_shape(role: Role, p: ConvProblem, batch: int) -> tuple[int, ...]:
    """The shape of one of a problem's tensors in its layout."""
    if role in (Role.X, Role.DX):
        return x_shape(p, batch)
    if role in (Role.Y, Role.DY):
        return y_shape(p, batch)
    if role in (Role.W, Role.DW):
        return w_shape(p)
    if role in (Role.BIAS, Role.DB):
        return (p.M,)
    raise ValueError(role)


STORAGE = {DType.FP32: np.float32, DType.FP16: np.float16, DType.BF16: np.uint16}


def x_shape(p: ConvProblem, batch: int) -> tuple[int, ...]:
    if p.layout is TensorLayout.NHWC:
        return (batch, p.H, p.W, p.C)
    return (batch, p.C, p.H, p.W)


def y_shape(p: ConvProblem, batch: int) -> tuple[int, ...]:
    if p.layout is TensorLayout.NHWC:
        return (batch, p.Ho, p.Wo, p.M)
    return (batch, p.M, p.Ho, p.Wo)


def w_shape(p: ConvProblem) -> tuple[int, ...]:
    return (p.M, p.Cg, p.R, p.S)


def to_storage(values, dtype: DType, xp=np):
    """fp32 values -> the dtype's storage, rounding to nearest even."""
    values = xp.asarray(values, dtype=xp.float32)
    if dtype is not DType.BF16:
        return values.astype(STORAGE[dtype])
    bits = values.view(xp.uint32)
    rounded = bits + xp.uint32(0x7FFF) + ((bits >> xp.uint32(16)) & xp.uint32(1))
    return (rounded >> xp.uint32(16)).astype(xp.uint16)


def from_storage(stored, dtype: DType, xp=np):
    """Storage -> fp32 values (exact)."""
    if dtype is not DType.BF16:
        return xp.asarray(stored).astype(xp.float32)
    return (xp.asarray(stored).astype(xp.uint32) << xp.uint32(16)).view(xp.float32)


def to_nchw(t, p: ConvProblem, xp=np):
    """A problem-layout activation tensor as NCHW (a view)."""
    return t.transpose(0, 3, 1, 2) if p.layout is TensorLayout.NHWC else t


def from_nchw(t, p: ConvProblem, xp=np):
    return t.transpose(0, 2, 3, 1) if p.layout is TensorLayout.NHWC else t
