"""A generated kernel run on the CPU: its source compiled as C++ with stand-ins for the
CUDA built-ins it uses, then called once for every thread of its grid, in order.

For kernels whose threads do not talk to one another (no shared memory, barriers, warp
shuffles or tensor cores), this runs the emitted code itself, so that the CPU tier
checks its numbers against the float64 reference and not only the planner's walk.  The
device helpers written in inline PTX (the 16-bit conversions) are replaced by C++ ones
that round the same way (to nearest even; fp16's checked against NumPy's on every
half and on 1.8 million drawn floats)."""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np

CXX = shutil.which("g++") or shutil.which("clang++")

STAND_INS = r"""
#include <cmath>
#include <cstddef>
#include <cstring>
struct Index { unsigned x, y, z; };
static Index threadIdx, blockIdx, gridDim, blockDim;
#define __global__
#define __device__
#define __forceinline__ inline
#define __restrict__
#define __launch_bounds__(...)
struct uint2 { unsigned x, y; };
struct uint4 { unsigned x, y, z, w; };
struct float2 { float x, y; };
struct float4 { float x, y, z, w; };
inline uint2 make_uint2(unsigned a, unsigned b) { return {a, b}; }
inline uint4 make_uint4(unsigned a, unsigned b, unsigned c, unsigned d) { return {a, b, c, d}; }
inline float2 make_float2(float a, float b) { return {a, b}; }
inline float4 make_float4(float a, float b, float c, float d) { return {a, b, c, d}; }
template <class T> inline T __ldg(const T* p) { return *p; }
inline float __uint_as_float(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
inline unsigned bits_of(float f) { unsigned u; std::memcpy(&u, &f, 4); return u; }
inline unsigned short float_to_bf16(float f) {
    unsigned u = bits_of(f);
    return (unsigned short)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
inline float bf16_to_float(unsigned short h) { return __uint_as_float((unsigned)h << 16); }
inline float float_of(unsigned u) { float f; std::memcpy(&f, &u, 4); return f; }
// fp16 by hand (round to nearest even, subnormals, inf and nan): not every C++ compiler
// has _Float16
inline unsigned short float_to_fp16(float f) {
    unsigned u = bits_of(f), sign = (u >> 16) & 0x8000u, mag = u & 0x7FFFFFFFu;
    if (mag >= 0x7F800000u)
        return (unsigned short)(sign | 0x7C00u | (mag > 0x7F800000u ? 0x200u : 0u));
    if (mag >= 0x477FF000u)  // rounds past 65504
        return (unsigned short)(sign | 0x7C00u);
    if (mag < 0x38800000u) {  // a subnormal half: in units of 2^-24, rounded
        float scaled = float_of(mag) * 16777216.0f;
        unsigned q = (unsigned)scaled;
        float rest = scaled - (float)q;
        if (rest > 0.5f || (rest == 0.5f && (q & 1u)))
            ++q;
        return (unsigned short)(sign | q);
    }
    unsigned h = (((mag >> 23) - 112u) << 10) | ((mag & 0x7FFFFFu) >> 13), low = mag & 0x1FFFu;
    if (low > 0x1000u || (low == 0x1000u && (h & 1u)))
        ++h;  // a carry into the exponent is right
    return (unsigned short)(sign | h);
}
inline float fp16_to_float(unsigned short s) {
    unsigned sign = (unsigned)(s & 0x8000u) << 16, e = (s >> 10) & 0x1Fu, m = s & 0x3FFu;
    if (e == 0)
        return float_of(bits_of((float)m * (1.0f / 16777216.0f)) | sign);
    if (e == 31)
        return float_of(sign | 0x7F800000u | (m << 13));
    return float_of(sign | ((e + 112u) << 23) | (m << 13));
}
inline unsigned pack2(float lo, float hi) {
    return (unsigned)FLOAT_TO_16(lo) | ((unsigned)FLOAT_TO_16(hi) << 16);
}
"""


def compile_kernel(source: str, name: str, dtype: str, nargs: int, tmp: Path):
    """The kernel as a C function ``run(args..., grid, block)`` of a shared library."""
    body = re.sub(r"__device__ __forceinline__ [^\n]*\n\{.*?\n\}\n", "", source, flags=re.S)
    params = ", ".join(f"long long a{i}" for i in range(nargs))  # addresses and ints
    call = ", ".join(f"(decltype(arg<{i}>(&{name})))a{i}" for i in range(nargs))
    runner = f"""
template <int I, class R, class... A> auto arg(R (*)(A...)) {{
    return (typename std::tuple_element<I, std::tuple<A...>>::type)0;
}}
extern "C" void run({params}, unsigned grid, unsigned block) {{
    gridDim.x = grid; blockDim.x = block;
    for (unsigned b = 0; b < grid; ++b)
        for (unsigned t = 0; t < block; ++t) {{
            blockIdx.x = b; threadIdx.x = t;
            {name}({call});
        }}
}}
"""
    to16 = "float_to_fp16" if dtype == "fp16" else "float_to_bf16"
    text = f"#include <tuple>\n#define FLOAT_TO_16 {to16}\n{STAND_INS}\n{body}\n{runner}"
    (tmp / "k.cpp").write_text(text)
    lib = tmp / "k.so"
    subprocess.run(
        [CXX, "-O1", "-std=c++17", "-shared", "-fPIC", "-w", "-o", lib, tmp / "k.cpp"],
        check=True,
        capture_output=True,
    )
    return ctypes.CDLL(str(lib)).run


def run_on_cpu(plan, arrays: list, batch: int):
    """Run ``plan``'s one launch over ``arrays`` (numpy arrays or ints, in the order of
    its arguments) for ``batch`` images; outputs are written in place."""
    (launch,) = plan.launches
    from specgen.render import render

    with tempfile.TemporaryDirectory() as d:
        run = compile_kernel(
            render(plan), launch.kernel, plan.shape.dtype.value, len(arrays), Path(d)
        )
        args = [
            ctypes.c_longlong(a.ctypes.data if isinstance(a, np.ndarray) else a) for a in arrays
        ]
        grid = launch.grid_for(batch)
        assert grid[1:] == (1, 1) and launch.block[1:] == (1, 1), "a one-axis grid only"
        run(*args, ctypes.c_uint(grid[0]), ctypes.c_uint(launch.block[0]))


def judged_on_cpu(p, plan, batch: int = 2) -> dict:
    """``plan`` (for problem ``p``) run on the CPU for ``batch`` images over fresh random
    inputs, its output poisoned with NaN first, and judged against the float64
    reference (``verify.judge``'s verdict)."""
    from specgen.runtime import dgrad_weights, pack_weights
    from specgen.tensors import Role, outputs, role_shape, to_storage
    from specgen.verify import judge, random_inputs

    inputs, w, b = random_inputs(p, batch, np.random.default_rng())
    weights = dgrad_weights(w, p.groups) if plan.weight_transform else w
    packed = pack_weights(weights, plan.weight_format)
    (out,) = outputs(p)
    y = to_storage(np.full(role_shape(out, p, batch), np.nan, np.float32), p.dtype)
    given = {**inputs, Role.W: packed, Role.BIAS: b, out: y, Role.BATCH: batch}
    run_on_cpu(plan, [given[r] for r in plan.launches[0].args], batch)
    return judge(p, plan, batch, inputs, w, b, {out: y})
