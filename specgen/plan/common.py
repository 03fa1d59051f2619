"""What every plan holds, and the hardware limits it is checked against.

A plan is computed in Python before anything is rendered: every derived number (halo
width, buffer bytes, grid and block, unrolled offsets) is a field here, and every limit
is checked here.  Templates receive these numbers as literals and only lay them out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ..errors import SpecError
from ..shapes import Act, ConvProblem, DType, TensorLayout
from ..tensors import Role
from ..variants import Variant

# Limits of compute capability 9.0 (H100, H200); see the CUDA programming guide's
# table of technical specifications per compute capability.
CONST_BYTES = 64 * 1024  # one __constant__ bank
STATIC_SMEM_BYTES = 48 * 1024  # static __shared__ per block
OPTIN_SMEM_BYTES = 227 * 1024  # dynamic __shared__ per block after the opt-in
SM_SHARED = 228 * 1024  # shared memory per SM, of which each block's driver part takes 1 KiB


def quad_stride(width: int, vec: int) -> int:
    """The smallest row stride of at least ``width`` floats, a multiple of ``vec``, whose
    rows start in different bank quads (16-byte groups of banks) for 8 rows in a row: an
    odd number of 16-byte units where the rows are read 16 bytes at a time."""
    s = ceil_div(width, vec) * vec
    if vec == 4:
        return s + 4 * ((s // 4 + 1) % 2)
    return s


def smem_blocks(nbytes: int) -> int:
    """The blocks of ``nbytes`` of shared memory each that one SM holds at once."""
    return SM_SHARED // (nbytes + 1024)


MAX_THREADS = 1024
MAX_THREADS_SM = 2048  # threads resident on one sm_90 SM
MAX_BLOCKS_SM = 32  # blocks resident on one sm_90 SM
GRID_LIMITS = (2**31 - 1, 65535, 65535)
MAX_REGISTERS = 255
REGISTER_FILE = 65536  # 32-bit registers of an sm_90 SM
SMS = 132  # the H100's and H200's SMs
# Bytes a second a kernel's scattered or once-over traffic moves, read and write
# together, where the GPU's copy rate is not measured (``bench.ceilings``: 4.23e12 on
# an H200, 2026-11-21): the operator's layout moves (``choose``), wgplanar's sliced sums
COPY_RATE = 3.0e12


@dataclass(frozen=True)
class Size:
    """One derived size, for the banner: what it is, its value, where it comes from."""

    label: str
    value: str
    why: str


@dataclass(frozen=True)
class Launch:
    """One kernel launch.  The grid is fixed on every axis but ``axis``, which grows
    with the batch: ``ceil(batch * per_image / per_block)`` blocks.  A persistent
    launch caps that axis at the blocks the device holds at once; its blocks stride
    over the work items."""

    kernel: str
    args: tuple[Role, ...]  # what the runtime passes, in order
    block: tuple[int, int, int]
    grid: tuple[int, int, int]  # the entry on ``axis`` is replaced per launch
    axis: int
    per_image: int
    per_block: int
    dynamic_smem: int = 0
    persistent: bool = False
    # TMA tensor maps (``tma.TensorMap``), passed after ``args`` as 128-byte parameters
    maps: tuple = ()

    def __post_init__(self):
        odd = [a for a in self.args if not isinstance(a, Role)]
        if odd:  # a planner's bug: the runtime binds buffers by role
            raise TypeError(f"{self.kernel}: kernel arguments must be Roles, got {odd}")

    def grid_for(self, batch: int, resident: int | None = None) -> tuple[int, int, int]:
        """``resident``: blocks the device holds at once, which caps a persistent grid.
        ``per_image`` 0: the grid is fixed and the kernel walks the batch itself."""
        grid = list(self.grid)
        if not self.per_image:
            return tuple(grid)
        grid[self.axis] = -(-batch * self.per_image // self.per_block)
        if self.persistent and resident:
            grid[self.axis] = min(grid[self.axis], resident)
        return tuple(grid)

    @property
    def max_batch(self) -> int:
        """The largest batch one launch covers; the runtime splits larger ones."""
        if not self.per_image:
            return 2**31 - 1
        if self.persistent:
            return (2**31 - 1) // self.per_image  # int32 work-item indices
        by_grid = GRID_LIMITS[self.axis] * self.per_block // self.per_image
        return min(by_grid, (2**31 - 1) // self.per_image)  # int32 column indices

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]


@dataclass(frozen=True)
class Plan:
    shape: ConvProblem
    variant: Variant
    template: str  # path under templates/
    launches: tuple[Launch, ...]
    static_smem: int  # bytes of __shared__ the compiler should report
    dynamic_smem: int  # bytes requested at launch (0 unless over the static limit)
    const_bytes: int  # bytes of __constant__ weights
    weight_format: str  # how the host lays out w before upload: "f32" or "h2dup"
    sizes: tuple[Size, ...]
    context: dict = field(compare=False, hash=False, repr=False)
    workspace_per_image: int = 0  # bytes of scratch per image (im2col)
    workspace_bytes: int = 0  # bytes of scratch whatever the batch (partial sums)
    # bytes of scratch per image of the whole batch, after workspace_bytes, never cut
    # into segments (a batch reduction's transformed inputs: wgwino)
    batch_workspace: int = 0
    # "dgrad": the host flips w in R and S and transposes it per group before packing
    weight_transform: str = ""
    view: ConvProblem | None = None  # the forward problem the kernels compute, if not shape
    # A reduction over the batch, for the error bound: (additions per image, slices
    # the batch is cut into, additions besides) on the longest path of its summation
    # tree: per_image * ceil(batch / slices) + besides.
    sum_depth: tuple[int, int, int] | None = None
    # A wgrad whose taps' sums take other taps' products (the Winograd domain's, which
    # cancel in exact arithmetic): spread[r][d], the largest weight with which a product
    # of dy with x at the window's offset d enters tap r's sum, along each axis.  The
    # error bound's magnitudes are those sums (verify.spread_magnitudes).
    spread: tuple[tuple[float, ...], ...] | None = None
    # An architecture the kernels need exactly ("sm_90a" for wgmma), or "" for any.
    arch: str = ""

    def target(self, arch: str) -> str:
        """The architecture to compile for, given the one present (or asked for)."""
        if not self.arch or arch == self.arch:
            return arch
        if arch.rstrip("a") != self.arch.rstrip("a"):
            raise SpecError(
                f"{self.variant.key} needs {self.arch} and cannot run on {arch}; "
                "use --strategy tcgemm"
            )
        return self.arch

    @property
    def name(self) -> str:
        """The file name, the kernel symbol and part of the cache key."""
        return self.variant.kernel_name(self.shape)

    @property
    def kernels(self) -> tuple[str, ...]:
        return tuple(launch.kernel for launch in self.launches)


def shape_context(shape: ConvProblem) -> dict:
    """The shape's numbers every template uses, as literals: sizes (a group's channels
    and maps among them), the window, stride and dilation, derived sizes, strides of x
    (NCHW) and y."""
    H, W, K = shape.H, shape.W, shape.K
    (pt, _, pl, _), (sh, sw), (dh, dw) = shape.pads, shape.stride, shape.dil
    nhwc = shape.layout is TensorLayout.NHWC
    return dict(
        C=shape.C,
        M=shape.M,
        H=H,
        W=W,
        K=K,
        R=shape.R,
        S=shape.S,
        KK=shape.R * shape.S,
        Cg=shape.Cg,
        Mg=shape.Mg,
        dh=dh,
        dw=dw,
        pad=shape.pad,
        pt=pt,
        pl=pl,
        sh=sh,
        sw=sw,
        groups=shape.groups,
        Ho=shape.Ho,
        Wo=shape.Wo,
        HoWo=shape.Ho * shape.Wo,
        HW=H * W,
        CHW=shape.C * H * W,
        CKK=shape.reduction,
        out_image=shape.M * shape.Ho * shape.Wo,
        bias=shape.bias,
        relu=shape.act is Act.RELU,
        # the tensors: storage type, and x's steps between pixels and between channels
        dtype=shape.dtype.value,
        xtype="float" if shape.dtype is DType.FP32 else "unsigned short",
        nhwc=nhwc,
        x_pixel=shape.C if nhwc else 1,
        x_chan=1 if nhwc else H * W,
    )


def band_walk_plan(
    shape: ConvProblem,
    v,
    template: str,
    threads: int,
    bands: int,
    smem: int,
    sizes,
    context,
    weight_format: str = "f32",
) -> Plan:
    """The plan of a persistent kernel whose blocks walk (image, band) items, ``bands``
    of them an image: one launch of ``threads``, as many blocks as the device holds, x,
    w (packed as ``weight_format``), the epilogue's arguments and the batch, ``smem``
    dynamic shared bytes."""
    launch = Launch(
        v.kernel_name(shape),
        (Role.X, Role.W, *y_args(shape), Role.BATCH),
        (threads, 1, 1),
        (0, 1, 1),
        0,
        bands,
        1,
        smem,
        persistent=True,
    )
    return Plan(
        shape=shape,
        variant=v,
        template=template,
        launches=(launch,),
        static_smem=0,
        dynamic_smem=smem,
        const_bytes=0,
        weight_format=weight_format,
        sizes=tuple(sizes),
        context=context,
    )


def y_args(shape: ConvProblem) -> tuple[Role, ...]:
    """The kernel arguments that the output's epilogue reads and writes, in order."""
    return (Role.BIAS, Role.Y) if shape.bias else (Role.Y,)


def launch_bounds(threads: int, one_per_sm_first: bool = True) -> dict:
    """The two __launch_bounds__ of templates/common/bounds.j2: one block per SM (so
    ptxas may use up to 255 registers) and the plain bound, in the order tried.  ptxas
    derives its register cap from the bound, and which one spills cannot be told from
    the block alone; the compile step keeps whichever does not (specgen/compile.py)."""
    one, plain = f"{threads}, 1", f"{threads}"
    first, second = (one, plain) if one_per_sm_first else (plain, one)
    return dict(launch_bounds=first, launch_bounds_alt=second)


def thread_registers(threads: int, per_sm: int) -> int:
    """The registers a thread gets from ptxas under ``__launch_bounds__(threads, per_sm)``.
    An SM's file is four quarters of 16384, each holding every fourth warp, so a thread
    gets a quarter over its share of the warps, rounded up, in steps of 8, at most 255:
    288 threads two an SM get 96, 416 one an SM 128 (as ptxas reports on sm_90a)."""
    warps = ceil_div(per_sm * ceil_div(threads, 32), 4)
    return min(255, REGISTER_FILE // 4 // (warps * 32) // 8 * 8)


def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def divisors(n: int) -> list[int]:
    """The divisors of n in increasing order, by trial division up to sqrt(n), so that
    a huge size costs milliseconds, not a scan to n."""
    small, large = [], []
    d = 1
    while d * d <= n:
        if n % d == 0:
            small.append(d)
            if d * d != n:
                large.append(n // d)
        d += 1
    return small + large[::-1]


def choices(values, most: int = 12) -> str:
    """Values for a message, the first and last few when there are many."""
    values = [str(v) for v in values]
    if len(values) > most:
        values = values[: most - 3] + ["..."] + values[-2:]
    return ", ".join(values)


def check_threads(block: tuple[int, int, int], hint: str) -> None:
    threads = block[0] * block[1] * block[2]
    if threads > MAX_THREADS:
        raise SpecError(
            f"a block of {block[0]}x{block[1]}x{block[2]} = {threads} threads is over "
            f"the limit of {MAX_THREADS} threads per block; {hint}"
        )


REGISTER_UNIT = 256  # an SM allocates a warp's registers in units of this many


def registers_of(threads: int, per_thread: int) -> int:
    """The registers a block of ``threads`` takes at ``per_thread`` registers each (the
    compiler's report), as the SM allocates them: a warp's in whole units."""
    per_warp = ceil_div(per_thread * 32, REGISTER_UNIT) * REGISTER_UNIT
    return ceil_div(threads, 32) * per_warp


def check_grid(launch: Launch, hint: str) -> None:
    """Every fixed axis must fit the device's grid, and the batch axis must hold at
    least one image: the runtime splits a larger batch into launches of ``max_batch``."""
    for axis, (n, limit) in enumerate(zip(launch.grid, GRID_LIMITS)):
        if axis == launch.axis:
            n = ceil_div(launch.per_image, launch.per_block)  # one image's blocks
        if n > limit:
            raise SpecError(
                f"grid {'xyz'[axis]} = {n} blocks for {launch.kernel} is over the "
                f"limit of {limit}; {hint}"
            )


def smem_placement(nbytes: int, what: str, hint: str) -> tuple[int, int]:
    """(static, dynamic) bytes: static up to 48 KiB, dynamic with the opt-in beyond."""
    if nbytes <= STATIC_SMEM_BYTES:
        return nbytes, 0
    if nbytes <= OPTIN_SMEM_BYTES:
        return 0, nbytes
    raise SpecError(
        f"{what} needs {nbytes} bytes of shared memory, over the sm_90 limit of "
        f"{OPTIN_SMEM_BYTES} bytes per block (with the opt-in); {hint}"
    )


def bank_conflict_degree(addresses: list[int]) -> int:
    """Worst number of distinct 4-byte words one bank serves for one warp access."""
    banks: dict[int, set[int]] = {}
    for a in addresses:
        banks.setdefault(a % 32, set()).add(a)
    return max(len(words) for words in banks.values())


def most_distinct(words, group_of, groups: int):
    """For each row of ``words`` (a numpy array whose last axis is the lanes of one shared
    access), the most distinct words that any of ``groups`` groups (banks, bank quads)
    serves: the access's wavefronts.  Lanes that read the same word share it;
    ``group_of`` maps words to their group.  The vectorized bank_conflict_degree."""
    import numpy as np

    words = np.sort(words, axis=-1)
    first = np.ones(words.shape, dtype=bool)
    first[..., 1:] = words[..., 1:] != words[..., :-1]
    hits = (group_of(words)[..., None] == np.arange(groups)) & first[..., None]
    return hits.sum(axis=-2).max(axis=-1)


def check_launch_bounds(context: dict, hint: str) -> None:
    """``__launch_bounds__(threads, blocks)`` asks ptxas for registers that let ``blocks``
    blocks share an SM: a request the SM cannot hold (more than 32 blocks, or more than
    2048 threads) is refused, not written into the source."""
    for key in ("launch_bounds", "launch_bounds_alt"):
        text = context.get(key)
        if not text:
            continue
        numbers = [int(t) for t in str(text).split(",")]
        threads, blocks = numbers[0], numbers[1] if len(numbers) > 1 else 1
        most = max(1, min(MAX_BLOCKS_SM, MAX_THREADS_SM // threads))
        if not 1 <= blocks <= most:
            raise SpecError(
                f"__launch_bounds__({threads}, {blocks}): an sm_90 SM holds at most "
                f"{most} blocks of {threads} threads ({MAX_BLOCKS_SM} blocks, "
                f"{MAX_THREADS_SM} threads); {hint}"
            )
