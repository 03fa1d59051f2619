"""NumPy replays of the 16-bit band kernels' shared pieces (``templates/gemm/band16.j2``
and ``mma16.j2``): the band's spread and its 16-byte fetch, and one m16n8k16 from its
fragment words, for the tests of mmapersist, mmastrip, mmatoep, mmahwc and wstrip."""

import numpy as np


def band16(shape, ctx, x, n, oy0, planes, elements):
    """The band of templates/gemm/band16.j2's spread, flat: zeros, then channel c's
    input rows oy0 - pad .. at [c][r][col] (stride ctx["stride"], plane ctx["plane"])."""
    band = np.zeros(elements)
    for cc in range(shape.C):
        for r in range(ctx["ih"]):
            for col in range(ctx["iw"]):
                iy, ix = oy0 + r - shape.pad, col - shape.pad
                if 0 <= iy < shape.H and 0 <= ix < shape.W:
                    band[cc * ctx["plane"] + r * ctx["stride"] + col] = x[n, cc, iy, ix]
    return band


def mma16(a_words, b_words):
    """One m16n8k16 from its words: a_words[reg][g][t][2] (regs: rows g, g+8 at k 0..7,
    then at k 8..15), b_words[g][t][h][2]: D[16][8]."""
    g, t = np.arange(8)[:, None], np.arange(4)[None, :]
    a = np.empty((16, 16))
    b = np.empty((16, 8))
    for k in range(2):
        a[g, 2 * t + k] = a_words[0][..., k]
        a[g + 8, 2 * t + k] = a_words[1][..., k]
        a[g, 8 + 2 * t + k] = a_words[2][..., k]
        a[g + 8, 8 + 2 * t + k] = a_words[3][..., k]
        b[2 * t + k, g] = b_words[:, :, 0, k]
        b[8 + 2 * t + k, g] = b_words[:, :, 1, k]
    return a @ b


def band16_fetch(shape, ctx, x, item):
    """templates/gemm/band16.j2's 16-byte fetch in numpy, element for element: 16-byte
    units (``raw_unit`` elements: 8 of 16 bits, 4 fp32) from the boundary at or before
    each channel's run (zeros past its end, stale finite values elsewhere).  Returns the
    raw band's elements from element 2 (the word before it at 0, 1) and ``row_start(c,
    iy)``, its x offset of a row, as the kernel's."""
    C, H, W, pad = shape.C, shape.H, shape.W, shape.pad
    rows, ih, bpi = ctx["rows"], ctx["ih"], ctx["bands_per_image"]
    CHW, chunk_words = C * H * W, ctx["chunk_words"]
    unit = ctx.get("raw_unit", 8)
    chunk = unit // 4 * chunk_words
    n, iy0 = item // bpi, item % bpi * rows - pad
    lo, hi = max(iy0, 0), min(iy0 + ih, H)
    skew = (n * (CHW % unit)) & (unit - 1)
    flat = x.reshape(-1)

    def row_start(c, iy):
        return skew + c * H * W + iy * W

    raw = np.full(2 + C * chunk + 8, 123.0)  # elements; the word before the bands at 0, 1
    for c in range(C):
        start = row_start(c, lo)
        end = start + (hi - lo) * W
        for k in range(chunk_words // 4):
            at = (start & ~(unit - 1)) + unit * k
            for e in range(unit):
                g = n * CHW - skew + at + e
                inside = e < min(unit, end - at) and 0 <= g < flat.size
                raw[2 + c * chunk + unit * k + e] = flat[g] if inside else 0.0
    return raw, row_start
