"""A batch that lives in host memory (seeds 001 and 004): copy in, convolve, copy out,
overlapped on several streams from pinned memory.

The batch is cut into segments; segment i goes to stream i mod K, which copies its x in,
runs the kernel and copies its y out, each stream through its own device buffers (a
stream's own order keeps a buffer from being overwritten before it is read).  With K >= 2
the host-to-device copy of one segment, the kernel of another and the device-to-host
copy of a third run at once, so the end-to-end time approaches the host link's:
max(bytes in / host-to-device bandwidth, bytes out / device-to-host bandwidth).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import numpy as np

from .errors import SpecError
from .runtime import Conv
from .shapes import ConvProblem, Op
from .tensors import STORAGE, Role, from_storage, to_storage, w_shape, x_shape, y_shape

LINK_PROBE_BYTES = 256 * 2**20


@dataclass
class StreamedTiming:
    batch: int
    streams: int
    segment: int
    streamed_ms: float
    serial_ms: float
    kernel_ms: float
    floor_ms: float
    h2d_gbs: float
    d2h_gbs: float
    identical: bool  # the streamed y equals the serial one, bit for bit, and has no NaN


def pinned(shape, dtype) -> np.ndarray:
    """A NumPy array in page-locked host memory (what asynchronous copies need)."""
    import cupy

    count = int(np.prod(shape))
    mem = cupy.cuda.alloc_pinned_memory(max(1, count * np.dtype(dtype).itemsize))
    return np.frombuffer(mem, dtype, count).reshape(shape)


def link_bandwidth() -> tuple[float, float]:
    """Host-to-device and device-to-host bytes per second, pinned, one large copy each
    (the median of five)."""
    import cupy

    rt = cupy.cuda.runtime
    host = pinned((LINK_PROBE_BYTES,), np.uint8)
    dev = cupy.empty(LINK_PROBE_BYTES, np.uint8)
    out = []
    for kind, dst, src in (
        (rt.memcpyHostToDevice, dev.data.ptr, host.ctypes.data),
        (rt.memcpyDeviceToHost, host.ctypes.data, dev.data.ptr),
    ):
        times = []
        for _ in range(5):
            cupy.cuda.Device().synchronize()
            t0 = time.perf_counter()
            rt.memcpy(dst, src, LINK_PROBE_BYTES, kind)
            times.append(time.perf_counter() - t0)
        out.append(LINK_PROBE_BYTES / statistics.median(times))
    return out[0], out[1]


class Streamed:
    """One forward problem's kernel fed from host memory on ``streams`` streams."""

    def __init__(self, conv: Conv, streams: int, segment: int):
        import cupy

        p = conv.shape
        if p.op is not Op.FPROP:
            raise SpecError("streamed host batches run the forward pass (op=fprop)")
        if streams < 1 or segment < 1:
            raise SpecError(f"--streams and --segment must be at least 1, got {streams}, {segment}")
        self.conv, self.segment = conv, segment
        self.streams = [cupy.cuda.Stream(non_blocking=True) for _ in range(streams)]
        dtype = np.dtype(STORAGE[p.dtype])
        self.x = [cupy.empty(x_shape(p, segment), dtype) for _ in self.streams]
        self.y = [cupy.empty(y_shape(p, segment), dtype) for _ in self.streams]
        need = conv.scratch_bytes(segment)
        self.scratch = [cupy.empty(need, np.uint8) if need else None for _ in self.streams]

    def run(self, x_host: np.ndarray, y_host: np.ndarray) -> None:
        """y_host = conv(x_host), both pinned; returns when y_host is written."""
        import cupy

        rt = cupy.cuda.runtime
        conv, seg = self.conv, self.segment
        xb, yb = conv.image_bytes(Role.X), conv.image_bytes(Role.Y)
        batch = x_host.shape[0]
        for i, b0 in enumerate(range(0, batch, seg)):
            n = min(seg, batch - b0)
            k = i % len(self.streams)
            s, xd, yd, scratch = self.streams[k], self.x[k], self.y[k], self.scratch[k]
            rt.memcpyAsync(
                xd.data.ptr, x_host.ctypes.data + b0 * xb, n * xb, rt.memcpyHostToDevice, s.ptr
            )
            ptrs = {Role.X: xd.data.ptr, Role.Y: yd.data.ptr}
            conv.enqueue(ptrs, n, scratch.data.ptr if scratch is not None else 0, s)
            rt.memcpyAsync(
                y_host.ctypes.data + b0 * yb, yd.data.ptr, n * yb, rt.memcpyDeviceToHost, s.ptr
            )
        for s in self.streams:
            s.synchronize()


def run_streamed(
    problem: ConvProblem, variant, batch: int, streams: int, segment: int | None, reps: int = 5
) -> StreamedTiming:
    """Time the streamed pipeline beside the serial one (all of x in, the kernel over the
    whole batch, all of y out, one stream) and the host-link floor, on random inputs."""
    import cupy

    conv = Conv(problem, variant)
    rng = np.random.default_rng()
    w = rng.standard_normal(w_shape(problem), dtype=np.float32) / np.sqrt(problem.reduction)
    b = rng.standard_normal(problem.M, dtype=np.float32) if problem.bias else None
    conv.set_weights(w, b)
    dtype = np.dtype(STORAGE[problem.dtype])
    x_host = pinned(x_shape(problem, batch), dtype)
    x_host[...] = to_storage(rng.standard_normal(x_host.shape, dtype=np.float32), problem.dtype)
    y_serial, y_streamed = (pinned(y_shape(problem, batch), dtype) for _ in range(2))
    nan = to_storage(np.full(1, np.nan, np.float32), problem.dtype)[0]
    y_serial[...], y_streamed[...] = nan, nan  # an element left unwritten stays NaN
    segment = segment or max(1, -(-batch // (4 * streams)))
    pipeline = Streamed(conv, streams, min(segment, batch))
    whole = Streamed(conv, 1, batch)

    def timed(fn) -> float:
        times = []
        for _ in range(reps + 1):  # the first is a warm-up
            cupy.cuda.Device().synchronize()
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times[1:])

    serial = timed(lambda: whole.run(x_host, y_serial))
    streamed = timed(lambda: pipeline.run(x_host, y_streamed))
    xd, yd = whole.x[0], whole.y[0]
    kernel = timed(
        lambda: (
            conv.enqueue({Role.X: xd.data.ptr, Role.Y: yd.data.ptr}, batch, _ptr(whole.scratch[0])),
            cupy.cuda.Device().synchronize(),
        )
    )
    h2d, d2h = link_bandwidth()
    floor = max(x_host.nbytes / h2d, y_serial.nbytes / d2h) * 1e3
    return StreamedTiming(
        batch,
        streams,
        pipeline.segment,
        streamed,
        serial,
        kernel,
        floor,
        h2d / 1e9,
        d2h / 1e9,
        bool(np.array_equal(y_serial.view(np.uint8), y_streamed.view(np.uint8)))
        and bool(np.isfinite(from_storage(y_streamed, problem.dtype)).all()),
    )


def _ptr(a) -> int:
    return a.data.ptr if a is not None else 0
