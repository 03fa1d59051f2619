"""The float64 reference, and the error bound each precision implies.

One function serves NumPy (CPU, small shapes) and CuPy (GPU, large shapes): K*K
shifted tensor contractions in float64.  Both are tested against a plain loop.
"""

from __future__ import annotations

import numpy as np

from .variants import TENSOR_CORE, Precision, Variant

U_FP32 = 2.0**-24  # unit roundoff of fp32
U_HALF = 2.0**-11  # of fp16 and of tf32 (10 stored mantissa bits each)
ETA_HALF = 2.0**-25  # fp16's largest absolute rounding error among subnormals


def conv2d(x, w, pad: int, xp=np):
    """y[n][m][i][j] = sum_{c,p,q} x[n][c][i+p-pad][j+q-pad] w[m][c][p][q], in float64."""
    x = xp.asarray(x, dtype=xp.float64)
    w = xp.asarray(w, dtype=xp.float64)
    if pad:
        x = xp.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad)))
    B, C, Hp, Wp = x.shape
    M, _, K, _ = w.shape
    Ho, Wo = Hp - K + 1, Wp - K + 1
    y = xp.zeros((B, M, Ho, Wo), dtype=xp.float64)
    for p in range(K):
        for q in range(K):
            y += xp.einsum("mc,bchw->bmhw", w[:, :, p, q], x[:, :, p : p + Ho, q : q + Wo])
    return y


def conv2d_loop(x, w, pad: int):
    """The definition, one multiply-add at a time: for tiny shapes in tests only."""
    B, C, H, W = x.shape
    M, _, K, _ = w.shape
    Ho, Wo = H + 2 * pad - K + 1, W + 2 * pad - K + 1
    y = np.zeros((B, M, Ho, Wo))
    for b in range(B):
        for m in range(M):
            for i in range(Ho):
                for j in range(Wo):
                    s = 0.0
                    for c in range(C):
                        for p in range(K):
                            for q in range(K):
                                ih, iw = i + p - pad, j + q - pad
                                if 0 <= ih < H and 0 <= iw < W:
                                    s += float(x[b, c, ih, iw]) * float(w[m, c, p, q])
                    y[b, m, i, j] = s
    return y


def error_coefficient(variant: Variant, C: int, K: int) -> float:
    """gamma such that |y - ref| <= gamma * sum |x||w| for every output.

    Worst-case first-order bounds, whatever the order of summation:
    fp32: n roundings of the running sum, n = C*K*K (an FMA rounds once).
    tf32, fp16 inputs: each input rounded once (2 u_half per product), then fp32 sums.
    fp16 arithmetic (direct family): inputs and each product rounded to half, K-term
    half sums along a window row, then fp32 sums across rows and channels.
    """
    n = C * K * K
    if variant.precision is Precision.FP32:
        gamma = n * U_FP32
    elif variant.strategy in TENSOR_CORE:
        gamma = 2 * U_HALF + n * U_FP32
    else:
        gamma = (3 + K - 1) * U_HALF + n * U_FP32
    return gamma * 1.01  # second-order terms


def underflow_term(variant: Variant, C: int, K: int, max_x: float, max_w: float) -> float:
    """Absolute part of the bound, for fp16 only: its exponent range is narrow, so an
    operand, product or half sum near zero is rounded to a subnormal with an absolute
    error of up to 2^-25 that no relative bound covers (tf32 keeps fp32's range).
    Per term: x, w, the product and K half sums; n = C*K*K terms."""
    if variant.precision is not Precision.FP16:
        return 0.0
    return C * K * K * ETA_HALF * (max_x + max_w + K + 2) * 1.01


def compare(y, ref, ref_abs, gamma, xp=np, absolute: float = 0.0) -> dict:
    """Relative L2 error, and the worst ratio of error to its bound (<= 1 passes)."""
    y = xp.asarray(y, dtype=xp.float64)
    finite = bool(xp.isfinite(y).all())
    err = xp.abs(y - ref)
    bound = gamma * ref_abs + absolute + 1e-30
    ratio = float(xp.max(err / bound)) if finite else float("inf")
    rel_l2 = float(xp.linalg.norm(err) / xp.linalg.norm(ref)) if finite else float("inf")
    return dict(
        finite=finite,
        rel_l2=rel_l2,
        max_err=float(xp.max(err)) if finite else float("inf"),
        bound_ratio=ratio,
        ok=finite and ratio <= 1.0,
    )
