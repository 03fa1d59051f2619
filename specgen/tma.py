"""Tensor maps for Hopper's tensor memory accelerator (TMA): what a plan asks for (the
tensor's dims and strides, the box one ``cp.async.bulk.tensor`` copies, the swizzle it
lays the box out in; or, in im2col mode, the window a filter's corner walks and the
pixels and channels one copy takes), their encoding through the driver
(``cuTensorMapEncodeTiled``, ``cuTensorMapEncodeIm2col``, called through ctypes so that
no CuPy build has to expose them), and NumPy models of both loads that the CPU tier
checks the plans' coordinates with.

A tensor map holds the tensor's address, so a launch needs one per address its tensor
lies at: ``BoundMap`` encodes one the first time it meets an address and keeps it."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, replace

import numpy as np

from .errors import SpecError
from .tensors import Role

# CUtensorMapDataType: the copies move bits, so 16-bit floats go as UINT16 and fp32 as
# UINT32; out-of-bounds elements are filled with zero bits either way (+0.0).
DATA_TYPES = {2: 1, 4: 2}  # bytes an element -> CU_TENSOR_MAP_DATA_TYPE_UINT16 / UINT32
SWIZZLES = {0: 0, 32: 1, 64: 2, 128: 3}  # bytes -> CUtensorMapSwizzle
L2_PROMOTION_256B = 3
MAP_BYTES = 128  # sizeof(CUtensorMap), aligned to 64 bytes
RANK_LIMIT = 5
BOX_LIMIT = 256  # elements of a box along any dimension
STEP_LIMIT = 8  # a traversal stride
CORNER_LIMIT = (-128, 127)  # an im2col map's corners, rank 4 (8 bits each)
MAPS_KEPT = 64  # encoded addresses a bound map keeps (past these, it starts over)


@dataclass(frozen=True)
class TensorMap:
    """A tiled tensor map over ``role``'s tensor: ``dims`` in elements, innermost first,
    the outermost ``None`` where it is the launch's image count (times ``image_elems``,
    where it runs over every pixel of the batch); ``strides`` in bytes for every
    dimension but the innermost; ``box`` the elements one copy spans along each;
    ``steps`` the traversal stride along each (none: all ones), of which a copy takes
    every steps[i]-th element from the box's corner, box[i] / steps[i] of them."""

    role: Role
    element_bytes: int
    dims: tuple
    strides: tuple[int, ...]
    box: tuple[int, ...]
    swizzle: int = 128
    steps: tuple[int, ...] = ()
    image_elems: int = 1

    def __post_init__(self):
        rank = len(self.dims)
        if not 1 <= rank <= RANK_LIMIT or len(self.box) != rank or len(self.strides) != rank - 1:
            raise ValueError(f"tensor map of rank {rank}: {self}")
        if any(s % 16 for s in self.strides):  # a planner's bug: TMA needs 16-byte strides
            raise ValueError(f"tensor map strides {self.strides} are not multiples of 16")
        if any(not 1 <= b <= BOX_LIMIT for b in self.box):
            raise ValueError(f"tensor map box {self.box}: 1 to {BOX_LIMIT} elements a dimension")
        if self.swizzle and self.box[0] * self.element_bytes > self.swizzle:
            raise ValueError(f"a box row of {self.box[0]} elements exceeds the swizzle span")
        if self.steps and (
            len(self.steps) != rank
            or self.steps[0] != 1
            or any(not 1 <= t <= STEP_LIMIT or b % t for b, t in zip(self.box, self.steps))
        ):
            raise ValueError(
                f"tensor map steps {self.steps}: 1 to {STEP_LIMIT}, dividing {self.box}"
            )

    @property
    def traversal(self) -> tuple[int, ...]:
        """The traversal stride along each dimension."""
        return self.steps or (1,) * len(self.dims)

    @property
    def taken(self) -> tuple[int, ...]:
        """The elements a copy takes along each dimension."""
        return tuple(b // t for b, t in zip(self.box, self.traversal))

    def sized(self, images: int) -> tuple[int, ...]:
        return tuple(images * self.image_elems if d is None else d for d in self.dims)

    @property
    def box_bytes(self) -> int:
        return int(np.prod(self.taken)) * self.element_bytes

    def with_role(self, role: Role) -> "TensorMap":
        return replace(self, role=role)


def box_load(tensor: np.ndarray, m: TensorMap, coords, images: int = 1) -> np.ndarray:
    """What one tiled copy puts in shared memory, before the swizzle: ``tensor``'s
    elements (a flat array viewed through the map's dims and strides) in the box at
    ``coords`` (innermost first, any of them negative or past the end), zeros where the
    box leaves the tensor; rows of box[0] elements, the innermost dimension fastest."""
    dims = m.sized(images)
    steps = (1,) + tuple(s // m.element_bytes for s in m.strides)
    # One index grid a dimension (innermost last, as the box's rows are laid out): the
    # flat offset of each element, and whether every coordinate lies inside the tensor.
    grids = np.meshgrid(
        *(
            c + t * np.arange(n)
            for c, n, t in zip(reversed(coords), reversed(m.taken), reversed(m.traversal))
        ),
        indexing="ij",
    )
    inside = np.ones(grids[0].shape, dtype=bool)
    flat = np.zeros(grids[0].shape, dtype=np.int64)
    for g, d, s in zip(grids, reversed(dims), reversed(steps)):
        inside &= (g >= 0) & (g < d)
        flat += g.astype(np.int64) * s
    out = np.zeros(tuple(reversed(m.taken)), dtype=tensor.dtype)
    out[inside] = tensor[flat[inside]]
    return out.reshape(-1, m.box[0])


@dataclass(frozen=True)
class Im2colMap:
    """An im2col tensor map over ``role``'s NHWC tensor: ``dims`` (C, W, H, images) in
    elements, innermost first, the images ``None`` (the launch's count); ``strides`` in
    bytes for W, H and the images.  One copy takes ``pixels`` consecutive positions of
    a filter's corner, walking W, then H, then the images, each position ``channels``
    elements from channel c on, at a tap's offset within the filter.  The corner's
    positions in an image run from ``lower`` to the dimension's last index plus
    ``upper`` (W, H), ``steps`` apart: the convolution's output pixels.  Where a
    position's tap lies outside the tensor, its elements are zeros."""

    role: Role
    element_bytes: int
    dims: tuple
    strides: tuple[int, ...]
    lower: tuple[int, int]
    upper: tuple[int, int]
    channels: int
    pixels: int
    steps: tuple[int, int] = (1, 1)
    swizzle: int = 128

    def __post_init__(self):
        if len(self.dims) != 4 or len(self.strides) != 3:
            raise ValueError(f"an im2col map here is (C, W, H, images): {self}")
        if any(s % 16 for s in self.strides):
            raise ValueError(f"tensor map strides {self.strides} are not multiples of 16")
        if not 1 <= self.pixels <= BOX_LIMIT or not 1 <= self.channels <= BOX_LIMIT:
            raise ValueError(f"im2col copy of {self.pixels} pixels x {self.channels} channels")
        if self.swizzle and self.channels * self.element_bytes > self.swizzle:
            raise ValueError(f"a pixel's {self.channels} channels exceed the swizzle span")
        if any(not CORNER_LIMIT[0] <= c <= CORNER_LIMIT[1] for c in self.lower + self.upper):
            raise ValueError(f"im2col corners {self.lower}, {self.upper} out of {CORNER_LIMIT}")
        if any(not 1 <= t <= STEP_LIMIT for t in self.steps):
            raise ValueError(f"im2col steps {self.steps}: 1 to {STEP_LIMIT}")

    def sized(self, images: int) -> tuple[int, ...]:
        return tuple(images if d is None else d for d in self.dims)

    @property
    def positions(self) -> tuple[int, int]:
        """The filter corner's positions along W and H in one image."""
        return tuple(
            (d - 1 + hi - lo) // t + 1
            for d, lo, hi, t in zip(self.dims[1:3], self.lower, self.upper, self.steps)
        )

    @property
    def box_bytes(self) -> int:
        return self.pixels * self.channels * self.element_bytes

    def with_role(self, role: Role) -> "Im2colMap":
        return replace(self, role=role)


def im2col_load(tensor: np.ndarray, m: Im2colMap, coords, offsets, images: int = 1):
    """What one im2col copy puts in shared memory, before the swizzle: from the corner
    at ``coords`` (c, w, h, image; w and h a position of the filter's corner, which may
    lie in the padding), ``m.pixels`` positions in order, each a row of ``m.channels``
    elements of ``tensor`` (flat, NHWC) at the tap ``offsets`` (w, h) within the filter;
    zeros where the tap leaves the tensor or the positions pass the last image."""
    C, W, H, N = m.sized(images)
    (pw, ph), (tw, th) = m.positions, m.steps
    c, w, h, n = coords
    first = (n * ph + (h - m.lower[1]) // th) * pw + (w - m.lower[0]) // tw
    q = first + np.arange(m.pixels)
    img, i, j = q // (ph * pw), q // pw % ph, q % pw
    hh = m.lower[1] + th * i + offsets[1]
    ww = m.lower[0] + tw * j + offsets[0]
    cc = c + np.arange(m.channels)
    inside = ((img < N) & (hh >= 0) & (hh < H) & (ww >= 0) & (ww < W))[:, None] & (cc < C)
    e = m.element_bytes
    flat = (img * (m.strides[2] // e) + hh * (m.strides[1] // e) + ww * (m.strides[0] // e))[
        :, None
    ] + cc[None, :]
    out = np.zeros((m.pixels, m.channels), dtype=tensor.dtype)
    out[inside] = tensor[flat[inside]]
    return out


class BoundMap:
    """One launch's tensor map: encoded for each address it is given, the encodings
    kept (with the aligned host address of each), so that a repeated launch over the
    same tensors encodes nothing and computes nothing."""

    def __init__(self, m: TensorMap, images: int):
        self.map, self.images = m, images
        self.encoded: dict[int, tuple[ctypes.Array, int]] = {}

    def address(self, ptr: int) -> int:
        """The host address of the 128-byte map for a tensor at device address ``ptr``."""
        return self.encoding(ptr)[1]

    def encoding(self, ptr: int) -> tuple[ctypes.Array, int]:
        """The buffer holding the map for a tensor at ``ptr``, and the map's host address
        in it.  A caller that reads the map later than at once holds the buffer: past
        ``MAPS_KEPT`` addresses this map lets go of the ones it kept."""
        found = self.encoded.get(ptr)
        if found is None:
            if len(self.encoded) >= MAPS_KEPT:
                self.encoded.clear()
            buf = encode(self.map, ptr, self.images)
            found = self.encoded[ptr] = (buf, _aligned_address(buf))
        return found


def _aligned_address(buf) -> int:
    return (ctypes.addressof(buf) + 63) & ~63


_driver: list = []


def _encode_function(name: str = "cuTensorMapEncodeTiled"):
    if not _driver:
        try:
            _driver.append(ctypes.CDLL("libcuda.so.1"))
        except OSError as e:
            raise SpecError(f"tensor maps need the CUDA driver (libcuda.so.1): {e}") from None
    f = getattr(_driver[0], name)
    f.restype = ctypes.c_int
    return f


def encode(m: TensorMap | Im2colMap, ptr: int, images: int):
    """The driver's encoding of ``m`` for a tensor at ``ptr``: a buffer holding the 128
    bytes at a 64-byte boundary (``_aligned_address``)."""
    if ptr % 16:
        raise SpecError(f"a tensor map needs its tensor on a 16-byte boundary, got {ptr:#x}")
    rank = len(m.dims)
    if isinstance(m, Im2colMap):
        name = "cuTensorMapEncodeIm2col"
        geometry = (
            (ctypes.c_int * 2)(*m.lower),
            (ctypes.c_int * 2)(*m.upper),
            ctypes.c_uint32(m.channels),
            ctypes.c_uint32(m.pixels),
            (ctypes.c_uint32 * rank)(1, *m.steps, 1),
        )
        said = (
            f"corners {m.lower} {m.upper}, {m.pixels} pixels x {m.channels} channels, "
            f"steps {m.steps}"
        )
    else:
        name = "cuTensorMapEncodeTiled"
        geometry = ((ctypes.c_uint32 * rank)(*m.box), (ctypes.c_uint32 * rank)(*m.traversal))
        said = f"box {m.box}, steps {m.traversal}"
    buf = (ctypes.c_ubyte * (MAP_BYTES + 64))()
    status = _encode_function(name)(
        ctypes.c_void_p(_aligned_address(buf)),
        ctypes.c_int(DATA_TYPES[m.element_bytes]),
        ctypes.c_uint32(rank),
        ctypes.c_void_p(ptr),
        (ctypes.c_uint64 * rank)(*m.sized(images)),
        (ctypes.c_uint64 * max(rank - 1, 1))(*m.strides),
        *geometry,
        ctypes.c_int(0),  # no interleave
        ctypes.c_int(SWIZZLES[m.swizzle]),
        ctypes.c_int(L2_PROMOTION_256B),
        ctypes.c_int(0),  # out-of-bounds elements read as zeros
    )
    if status:
        raise SpecError(
            f"{name} refused the map of {m.role.value} (CUresult {status}): "
            f"dims {m.sized(images)}, strides {m.strides}, {said}"
        )
    return buf
