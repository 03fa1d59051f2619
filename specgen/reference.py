"""The float64 reference, and the error bound each precision implies.

One function serves NumPy (CPU, small shapes) and CuPy (GPU, large shapes): K*K
shifted tensor contractions in float64.  Both are tested against a plain loop.
"""

from __future__ import annotations

import numpy as np

from .shapes import Act, DType
from .variants import Precision, Variant

U_FP32 = 2.0**-24  # unit roundoff of fp32
U_HALF = 2.0**-11  # of fp16 and of tf32 (10 stored mantissa bits each)
ETA_HALF = 2.0**-25  # fp16's largest absolute rounding error among subnormals
U_BF16 = 2.0**-8  # unit roundoff of bfloat16 (7 stored mantissa bits)


def conv2d(x, w, problem, xp=np, bias=None, epilogue=True):
    """y[n][m][i][j] = act(bias[m] + sum_{c,p,q} x[n][g*Cg+c][i*sh+p*dh-pt][j*sw+q*dw-pl]
    * w[m][c][p][q]) with g = m // (M/groups), in float64, NCHW in and out.  Without
    ``epilogue`` only the sum: the magnitude reference for the error bound."""
    x = xp.asarray(x, dtype=xp.float64)
    w = xp.asarray(w, dtype=xp.float64)
    pt, pb, pl, pr = problem.pads
    (sh, sw), (dh, dw), G = problem.stride, problem.dil, problem.groups
    x = xp.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    B, C, Hp, Wp = x.shape
    M, Cg, R, S = w.shape
    Ho, Wo = problem.Ho, problem.Wo
    xg = x.reshape(B, G, Cg, Hp, Wp)
    wg = w.reshape(G, M // G, Cg, R, S)
    y = xp.zeros((B, G, M // G, Ho, Wo), dtype=xp.float64)
    for p in range(R):
        for q in range(S):
            i0, j0 = p * dh, q * dw
            patch = xg[:, :, :, i0 : i0 + sh * (Ho - 1) + 1 : sh, j0 : j0 + sw * (Wo - 1) + 1 : sw]
            y += xp.einsum("gmc,bgchw->bgmhw", wg[:, :, :, p, q], patch)
    y = y.reshape(B, M, Ho, Wo)
    if epilogue and bias is not None:
        y += xp.asarray(bias, dtype=xp.float64)[None, :, None, None]
    if epilogue and problem.act is Act.RELU:
        y = xp.maximum(y, 0.0)
    return y


def _padded_patches(problem, Ho, Wo):
    """For each tap (p, q), the slice of the padded input that meets output (i, j) at
    (i*sh + p*dh, j*sw + q*dw)."""
    (sh, sw), (dh, dw) = problem.stride, problem.dil
    for p in range(problem.R):
        for q in range(problem.S):
            rows = slice(p * dh, p * dh + sh * (Ho - 1) + 1, sh)
            cols = slice(q * dw, q * dw + sw * (Wo - 1) + 1, sw)
            yield p, q, rows, cols


def conv2d_dgrad(dy, w, problem, xp=np):
    """dx = the adjoint of the forward convolution: each dy[n][m][i][j] * w[m][c][p][q]
    scattered back to the input pixel that the forward tap read, in float64, NCHW.
    Written from the forward definition directly, not from dgrad's forward view."""
    dy = xp.asarray(dy, dtype=xp.float64)
    w = xp.asarray(w, dtype=xp.float64)
    pt, pb, pl, pr = problem.pads
    G, H, W = problem.groups, problem.H, problem.W
    B, M, Ho, Wo = dy.shape
    _, Cg, R, S = w.shape
    dyg = dy.reshape(B, G, M // G, Ho, Wo)
    wg = w.reshape(G, M // G, Cg, R, S)
    dx = xp.zeros((B, G, Cg, H + pt + pb, W + pl + pr), dtype=xp.float64)
    for p, q, rows, cols in _padded_patches(problem, Ho, Wo):
        dx[:, :, :, rows, cols] += xp.einsum("gmc,bgmhw->bgchw", wg[:, :, :, p, q], dyg)
    return dx[:, :, :, pt : pt + H, pl : pl + W].reshape(B, G * Cg, H, W)


def conv2d_wgrad(x, dy, problem, xp=np):
    """dw[m][c][p][q] = sum over n, i, j of dy[n][m][i][j] * x[n][g*Cg+c][i*sh+p*dh-pt]
    [j*sw+q*dw-pl], in float64 (x and dy NCHW)."""
    x = xp.asarray(x, dtype=xp.float64)
    dy = xp.asarray(dy, dtype=xp.float64)
    pt, pb, pl, pr = problem.pads
    G, R, S = problem.groups, problem.R, problem.S
    x = xp.pad(x, ((0, 0), (0, 0), (pt, pb), (pl, pr)))
    B, C, Hp, Wp = x.shape
    _, M, Ho, Wo = dy.shape
    xg = x.reshape(B, G, C // G, Hp, Wp)
    dyg = dy.reshape(B, G, M // G, Ho, Wo)
    dw = xp.zeros((G, M // G, C // G, R, S), dtype=xp.float64)
    for p, q, rows, cols in _padded_patches(problem, Ho, Wo):
        dw[:, :, :, p, q] = xp.einsum("bgmhw,bgchw->gmc", dyg, xg[:, :, :, rows, cols])
    return dw.reshape(M, C // G, R, S)


def bias_grad(dy, xp=np):
    """db[m] = sum over n, i, j of dy[n][m][i][j] (NCHW), in float64."""
    return xp.asarray(dy, dtype=xp.float64).sum(axis=(0, 2, 3))


def gradients_loop(x, w, dy, problem):
    """dx, dw and db one multiply-add at a time, by walking the forward loop and sending
    each product's partners back: for tiny problems in tests only."""
    B, C, H, W = x.shape
    M, Cg, R, S = w.shape
    pt, _, pl, _ = problem.pads
    (sh, sw), (dh, dw_) = problem.stride, problem.dil
    Mg = M // problem.groups
    dx, dw, db = np.zeros(x.shape), np.zeros(w.shape), np.zeros(M)
    for b in range(B):
        for m in range(M):
            for i in range(problem.Ho):
                for j in range(problem.Wo):
                    g = float(dy[b, m, i, j])
                    db[m] += g
                    for c in range(Cg):
                        for p in range(R):
                            for q in range(S):
                                ih, iw = i * sh + p * dh - pt, j * sw + q * dw_ - pl
                                if 0 <= ih < H and 0 <= iw < W:
                                    xc = (m // Mg) * Cg + c
                                    dx[b, xc, ih, iw] += g * float(w[m, c, p, q])
                                    dw[m, c, p, q] += g * float(x[b, xc, ih, iw])
    return dx, dw, db


def conv2d_loop(x, w, problem, bias=None):
    """The definition, one multiply-add at a time: for tiny problems in tests only."""
    B, C, H, W = x.shape
    M, Cg, R, S = w.shape
    pt, _, pl, _ = problem.pads
    (sh, sw), (dh, dw) = problem.stride, problem.dil
    Mg = M // problem.groups
    y = np.zeros((B, M, problem.Ho, problem.Wo))
    for b in range(B):
        for m in range(M):
            for i in range(problem.Ho):
                for j in range(problem.Wo):
                    s = 0.0 if bias is None else float(bias[m])
                    for c in range(Cg):
                        for p in range(R):
                            for q in range(S):
                                ih, iw = i * sh + p * dh - pt, j * sw + q * dw - pl
                                if 0 <= ih < H and 0 <= iw < W:
                                    xc = (m // Mg) * Cg + c
                                    s += float(x[b, xc, ih, iw]) * float(w[m, c, p, q])
                    y[b, m, i, j] = max(s, 0.0) if problem.act is Act.RELU else s
    return y


def error_coefficient(variant: Variant, problem, terms: int | None = None) -> float:
    """gamma such that |s - ref| <= gamma * (sum |x||w| + |bias|) for every output's
    fp32 sum s, before it is rounded to the output dtype (for the backward ops the sum
    of the magnitudes of their products).  ``terms``: the additions on the longest path
    of the summation, where the plan's order fixes it (a reduction over the batch, by
    its blocks and trees); else the dot product's length.

    Worst-case first-order bounds, whatever the order of summation:
    fp32: n roundings of the running sum, n = C/groups*R*S (+1 for the bias; an FMA
    rounds once).
    fp32 in three tf32 products (``three_tf32``: tc3wgrad): v = hi + lo with hi v
    rounded to tf32 (|v - hi| <= u|v|, u = 2^-11) and lo = v - hi, which the tensor
    cores truncate (by up to 2u|lo| <= 2u^2|v|); lo*hi + hi*lo + hi*hi misses the
    product by lo*lo and the two truncations' terms, at most 5 u^2 of it; then fp32
    sums of ``terms`` additions (the plan counts three a product).
    tf32, fp16, bf16 inputs: each input rounded once (2 u per product, u of the input
    format; twice u for tf32 that the tensor cores truncate), then fp32 sums.
    fp16 arithmetic (direct family): inputs and each product rounded to half, S-term
    half sums along a window row, then fp32 sums across rows and channels.
    """
    n = terms if terms is not None else problem.reduction + (1 if problem.bias else 0)
    if variant.precision is Precision.FP32:
        gamma = n * U_FP32
        if variant.three_tf32:
            gamma += 5 * U_HALF**2
    elif variant.tensor_core:
        u = U_BF16 if variant.precision is Precision.BF16 else U_HALF
        if variant.precision is Precision.TF32 and getattr(variant, "tf32_truncated", False):
            u = 2 * U_HALF  # fp32 words read as tf32 with no cvt.rna: truncated, at worst
        gamma = 2 * u + n * U_FP32
    else:
        gamma = (3 + problem.S - 1) * U_HALF + n * U_FP32
    return gamma * 1.01  # second-order terms


def output_rounding(problem) -> float:
    """Unit roundoff of the output dtype: a 16-bit output is rounded once more, to
    nearest, on its way out (half an ulp: 2^-11 relative for fp16, 2^-8 for bf16)."""
    return {DType.FP32: 0.0, DType.FP16: U_HALF, DType.BF16: U_BF16}[problem.dtype]


def underflow_term(variant: Variant, problem, max_x: float, max_w: float) -> float:
    """Absolute part of the bound, for fp16 only: its exponent range is narrow, so an
    operand, product or half sum near zero is rounded to a subnormal with an absolute
    error of up to 2^-25 that no relative bound covers (tf32 and bf16 keep fp32's
    range).  Per term of fp16 arithmetic: x, w, the product and S half sums; an fp16
    output adds one such rounding of its own."""
    out = ETA_HALF * 1.01 if problem.dtype is DType.FP16 else 0.0
    if variant.precision is not Precision.FP16:
        return out
    S = problem.S
    return problem.reduction * ETA_HALF * (max_x + max_w + S + 2) * 1.01 + out


def compare(y, ref, ref_abs, gamma, xp=np, absolute: float = 0.0) -> dict:
    """Relative L2 error, and the worst ratio of error to its bound (<= 1 passes)."""
    y = xp.asarray(y, dtype=xp.float64)
    finite = bool(xp.isfinite(y).all())
    err = xp.abs(y - ref)
    bound = gamma * ref_abs + absolute + 1e-30
    ratio = float(xp.max(err / bound)) if finite else float("inf")
    scale = float(xp.linalg.norm(ref)) or 1.0  # an all-zero reference (relu of negatives)
    rel_l2 = float(xp.linalg.norm(err)) / scale if finite else float("inf")
    return dict(
        finite=finite,
        rel_l2=rel_l2,
        max_err=float(xp.max(err)) if finite else float("inf"),
        bound_ratio=ratio,
        ok=finite and ratio <= 1.0,
    )
