"""``wdw``: wgrad of depthwise layers in channels-last (MobileNet's and EfficientNet's),
a band of x and dy rows staged in shared memory a block.

A depthwise wgrad is no GEMM worth the name: channel c's window sums dy[c] times x[c]
under each tap over every pixel of the batch, a window's taps deep and one map wide.
It is a stream of both tensors with nine FMAs a dy value (3x3), bound by how fast
they arrive.  ``wlane`` gives a thread one channel (or a word of them) and walks
every row of its slice; a warp's load is then one pixel's channels, 64 bytes for
mobilenet_v2's 32-channel bf16 layer, and a block covers few bytes at once.

Here a block takes ``cols`` adjacent output columns by every channel (a thread a column
and a word of ``vec`` channels) and walks the row bands of its slice of the batch, a
band ``rows`` output rows.  A band's reach of x (the window's rows under its outputs,
its columns under the block's) and its dy rows come into shared memory by 16-byte
``cp.async``, whole pixels at consecutive addresses, zeros at the padding; the next
band's copies fly while this one is multiplied.  Each staged x row is read once a
window column and feeds every (output row, window row) pair that reaches it, so a 3x3
window at stride 1 reads a band's ``rows`` + 2 x rows for ``rows`` output rows.  A
thread keeps its channels' R x S sums (fp32) over its slice; the block adds its columns'
sums in order through shared memory and writes one workspace row, and
``backward/tc_sums.j2`` adds the rows in order: dw is deterministic, and the PyTorch
operator may take it in fp32 in the weights' own memory format (``with_fp32_grads``).
db rides along where the layer has a bias."""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import SpecError
from ..plan.common import (
    MAX_BLOCKS_SM,
    MAX_THREADS_SM,
    REGISTER_FILE,
    SM_SHARED,
    Launch,
    Plan,
    Size,
    ceil_div,
    smem_blocks,
    thread_registers,
)
from ..shapes import Op, TensorLayout
from ..tensors import Role
from ..variants import EVERY_FEATURE, Count, Variant, param
from .dwlane import channel_words, depthwise, vector_widths
from .tcwgrad import slice_sums

# fp32 values a thread keeps: its R x S x vec sums and the dy rows a window's rows hold
# at once (7x7 at 2 channels: 112); a 4x3 window at 8 fp16 channels (128) spilled
MAX_KEPT = 120
MAX_THREADS = 1024
TARGET_THREADS = 256  # a block's threads the fit aims at: columns x channel words
TARGET_BLOCKS = 264  # two blocks on each of the H200's 132 SMs
COPY = 16  # bytes a cp.async copies
# copies a thread issues unrolled: unrolled whole, the next band's addresses were held
# across the multiplies (50 registers more and spills, 5x5 at 144 channels)
COPY_UNROLL = 2
# registers besides the kept values: addresses, indices, a word of x; a 5x5 window at 4
# channels and 4 rows (116 values) spilled at a block of 288 threads' 168 registers
REGISTER_OVERHEAD = 56
MIN_REGISTERS = 128  # a thread's sums, a band's dy values and a word of x, with room


@dataclass(frozen=True, kw_only=True)
class Wdw(Variant):
    key = "wdw"
    templates = ("backward/wdw.cu.j2",)
    family = "backward"
    description = (
        "wgrad of depthwise channels-last layers: a band of x and dy rows a block in shared "
        "memory by 16-byte cp.async, a thread a column and a word of channels, fp32 sums"
    )
    serves = EVERY_FEATURE
    ops = frozenset({Op.WGRAD})

    vec: int = param(8, Count("v"), "wdw: adjacent channels a thread takes")
    cols: int = param(32, Count("c"), "wdw: output columns a block takes")
    rows: int = param(4, Count("r"), "wdw: output rows a band (staged at once)")
    splits: int = param(64, Count("s"), "wdw: slices of the (image, band) walk, one block row each")

    def plan(self, problem):
        return plan_wdw(problem, self)

    @classmethod
    def fit(cls, problem, seed):
        """Tuned on mobilenet_v2's depthwise bf16 wgrads at B=64 (H200, 2026-11-30), every
        winner took words of 8 bytes (not 16: half the sums, two blocks an SM), about
        256 threads (128 on 32 channels), bands of 8 rows at stride 1 and 4 past it, and
        slices for two blocks an SM: so the fit, with fewer rows or a narrower word where
        a thread's values would not fit its registers (``holds``)."""
        p = problem
        top = min(8 if p.stride[0] == 1 else 4, p.Ho)
        words = [w for w in widths(p) if w * p.dtype.bytes <= 8] or widths(p) or [1]
        for vec, rows in [(w, r) for w in words for r in dict.fromkeys((top, -(-top // 2), 1))]:
            cols = even_columns(p.Wo, max(1, TARGET_THREADS * vec // p.C))
            if holds(p, vec, rows, cols):
                break
        splits = max(1, min(TARGET_BLOCKS // ceil_div(p.Wo, cols), 65535))
        return replace(seed, vec=vec, cols=cols, rows=rows, splits=splits)

    @classmethod
    def space(cls, problem, precision):
        p, base = problem, cls.default(problem, precision)
        out = []
        for vec in [w for w in widths(p) if kept(p, w, base.rows) <= MAX_KEPT][:2] or [base.vec]:
            lanes = p.C // vec
            for threads in (128, 256):
                cols = even_columns(p.Wo, max(1, threads // lanes))
                for rows in sorted({2, 4, 8, base.rows}):
                    tiles = ceil_div(p.Wo, cols)
                    for blocks in (TARGET_BLOCKS // 2, TARGET_BLOCKS, 2 * TARGET_BLOCKS):
                        splits = max(1, min(blocks // tiles, 65535))
                        out.append(
                            replace(base, vec=vec, cols=cols, rows=min(rows, p.Ho), splits=splits)
                        )
        return list(dict.fromkeys(out))


def widths(p) -> list[int]:
    """The channels a thread may take, widest first: a word that divides C."""
    return [w for w in vector_widths(p.dtype) if p.C % w == 0]


def kept(p, vec: int, rows: int) -> int:
    """fp32 values a thread keeps (``MAX_KEPT``): the sums, and a window's rows of dy."""
    return vec * (p.R * p.S + min(rows, p.R))


def holds(p, vec: int, rows: int, cols: int) -> bool:
    """Whether a thread's values (``kept``) fit ``MAX_KEPT`` and, with
    ``REGISTER_OVERHEAD``, the registers a block of its threads gets."""
    values = kept(p, vec, rows)
    threads = p.C // vec * cols
    return values <= MAX_KEPT and values + REGISTER_OVERHEAD <= thread_registers(threads, 1)


def even_columns(width: int, most: int) -> int:
    """At most ``most`` columns a block, as even a cut of a row of ``width`` as that
    allows (112 outputs at most 64: 56, not 64 and 48)."""
    most = max(1, min(most, width))
    return ceil_div(width, ceil_div(width, most))


def band_rows(p, rows: int) -> list[dict]:
    """The x rows a band stages (``at``: its row from the band's first, the window's top
    row under its first output) and, for each, the (output row, window row) pairs of the
    band that read it, every pair once, and the output rows whose dy is first read there
    (``loads``: a dy row is held from its first x row to its last)."""
    sh, dh = p.stride[0], p.dil[0]
    span = (rows - 1) * sh + (p.R - 1) * dh + 1
    out, loaded = [], set()
    for at in range(span):
        pairs = [(j, r) for j in range(rows) for r in range(p.R) if j * sh + r * dh == at]
        loads = sorted({j for j, _ in pairs} - loaded)
        loaded.update(loads)
        out.append(dict(at=at, pairs=pairs, loads=loads))
    return out


def plan_wdw(p, v: Wdw) -> Plan:
    # 1. limits
    if p.layout is not TensorLayout.NHWC:
        raise SpecError(
            "wdw reads channels-last tensors (whole pixels a copy): use layout=nhwc in the "
            "shape spec, or --strategy wband for NCHW"
        )
    if not depthwise(p):
        raise SpecError(
            f"wdw computes depthwise layers (groups = C = M), not groups={p.groups} of "
            f"{p.Cg} channel(s) and {p.Mg} map(s); use --strategy wlane"
        )
    pixel = p.C * p.dtype.bytes
    if pixel % COPY:
        raise SpecError(
            f"wdw copies whole pixels 16 bytes at a time: C={p.C} {p.dtype.value} channels "
            f"are {pixel} bytes; use --strategy wlane"
        )
    if v.vec not in widths(p):
        raise SpecError(
            f"wdw v{v.vec}: a word of {p.dtype.value} channels that divides C={p.C} is one "
            f"of {widths(p)}"
        )
    taps = p.R * p.S
    if kept(p, v.vec, v.rows) > MAX_KEPT:
        raise SpecError(
            f"wdw keeps {kept(p, v.vec, v.rows)} values per thread ({v.vec} channels x "
            f"{taps} taps of sums and {min(v.rows, p.R)} rows of dy), over {MAX_KEPT}; "
            "choose a smaller --vec"
        )
    lanes = p.C // v.vec
    threads = lanes * v.cols
    if threads > MAX_THREADS:
        raise SpecError(
            f"wdw c{v.cols} takes {threads} threads ({v.cols} columns x {lanes} words of "
            f"{v.vec} channels), over {MAX_THREADS}; choose --cols "
            f"{max(1, MAX_THREADS // lanes)} or fewer"
        )
    registers = thread_registers(threads, 1)
    if kept(p, v.vec, v.rows) + REGISTER_OVERHEAD > registers:
        raise SpecError(
            f"wdw v{v.vec} c{v.cols} r{v.rows} keeps {kept(p, v.vec, v.rows)} values a "
            f"thread, and with its addresses more than the {registers} registers a block of "
            f"{threads} threads gets; choose a smaller --vec or fewer --rows"
        )
    if v.cols > p.Wo:
        raise SpecError(f"wdw c{v.cols}: a row has only Wo={p.Wo} outputs")
    if v.rows > p.Ho:
        raise SpecError(f"wdw r{v.rows}: the maps have only Ho={p.Ho} rows")
    xcols = (v.cols - 1) * p.stride[1] + (p.S - 1) * p.dil[1] + 1
    x_rows = band_rows(p, v.rows)
    x_bytes = len(x_rows) * xcols * pixel
    stage = x_bytes + v.rows * v.cols * pixel
    smem = 2 * stage
    if smem > SM_SHARED - 1024:
        raise SpecError(
            f"wdw c{v.cols} r{v.rows} stages {smem} B of shared memory (two bands of "
            f"{stage} B), over the SM's {SM_SHARED - 1024}; choose fewer --rows or --cols"
        )
    if v.splits > 65535:
        raise SpecError(f"wdw s{v.splits}: at most 65535 slices (grid y)")

    # 2. work
    # blocks an SM: as many as two bands of shared memory each allow, while a thread keeps
    # ``MIN_REGISTERS`` (ptxas, left free, took 190-255 and held one block an SM)
    resident = max(
        1,
        min(
            smem_blocks(smem),
            REGISTER_FILE // (threads * MIN_REGISTERS),
            MAX_BLOCKS_SM,
            MAX_THREADS_SM // threads,
        ),
    )
    col_tiles = ceil_div(p.Wo, v.cols)
    slices = v.splits * col_tiles  # workspace rows: a (slice, column tile) block each
    bands = ceil_div(p.Ho, v.rows)
    name = v.kernel_name(p)
    ctx, workspace, reduce, _, _ = slice_sums(p, name, slices)
    row = ctx["row"]
    upp = pixel // COPY
    x_units = len(x_rows) * xcols * upp
    dy_units = v.rows * v.cols * upp
    launches = (
        Launch(
            name,
            (Role.X, Role.DY, Role.WORKSPACE, Role.BATCH),
            (threads, 1, 1),
            (col_tiles, v.splits, 1),
            1,
            0,
            1,
            smem,
        ),
        reduce,
    )
    ctx.update(
        threads=threads,
        launch_bounds=f"{threads}, {resident}",
        launch_bounds_alt=f"{threads}, 1",  # the plain bound capped small blocks at 168
        lanes=lanes,
        vec=v.vec,
        cols=v.cols,
        rows=v.rows,
        walkers=v.splits,
        bands=bands,
        col_tiles=col_tiles,
        xcols=xcols,
        # each staged row as the template reads it: a dy row's byte offset where it is
        # first read, and the row's word under each window column
        x_rows=[
            dict(
                row,
                loads=[(j, j * v.cols * pixel) for j in row["loads"]],
                words=[(q, (row["at"] * xcols + q * p.dil[1]) * pixel) for q in range(p.S)],
            )
            for row in x_rows
        ],
        # the sums the block adds over its columns, in order: each tap's, then db's
        # (C expressions of the thread's value and of its column c's place in the row)
        sums=[
            (f"acc[{r}][{q}][e]", f"c * {taps} + {r * p.S + q}")
            for r in range(p.R)
            for q in range(p.S)
        ]
        + ([("dbacc[e]", f"{ctx['weights']} + c")] if p.bias else []),
        column_bytes=p.stride[1] * pixel,
        x_row_units=xcols * upp,
        dy_row_units=v.cols * upp,
        x_ragged=x_units % threads != 0,
        dy_ragged=dy_units % threads != 0,
        span=len(x_rows),
        pixel_bytes=pixel,
        word_bytes=v.vec * p.dtype.bytes,
        unit=COPY // p.dtype.bytes,
        upp=upp,
        x_units=x_units,
        dy_units=dy_units,
        x_trips=ceil_div(x_units, threads),
        copy_unroll=COPY_UNROLL,
        dy_trips=ceil_div(dy_units, threads),
        x_bytes=x_bytes,
        stage_bytes=stage,
        CgRS=taps,  # tc_sums.j2's columns a map: one channel's taps
        **channel_words(p.dtype, v.vec),
    )
    sizes = (
        Size(
            "block",
            f"{threads} threads",
            f"{v.cols} output columns x {lanes} words of {v.vec} channels "
            f"({v.vec * p.dtype.bytes} bytes); {col_tiles} block(s) across Wo={p.Wo}, x "
            f"{v.splits} slices",
        ),
        Size(
            "band",
            f"{v.rows} output rows",
            f"{len(x_rows)} x rows of {xcols} pixels and {v.rows} dy rows of {v.cols}, "
            f"{x_units + dy_units} 16-byte copies",
        ),
        Size(
            "__shared__",
            f"{smem} B (dynamic)",
            f"two bands of {stage} B, one multiplied while the next lands",
        ),
        Size(
            "thread",
            f"{taps * v.vec + (v.vec if p.bias else 0)} fp32 sums",
            f"{v.vec} channels x {taps} taps"
            + (" + db" if p.bias else "")
            + ", kept over its slice",
        ),
        Size(
            "workspace",
            f"{workspace} B",
            f"{slices} slice rows ({v.splits} slices x {col_tiles} column tiles) x {row} sums; "
            "the second kernel adds them in order",
        ),
    )
    return Plan(
        shape=p,
        variant=v,
        template="backward/wdw.cu.j2",
        launches=launches,
        static_smem=0,
        dynamic_smem=smem,
        const_bytes=0,
        weight_format="f32",
        sizes=sizes,
        context=ctx,
        workspace_bytes=workspace,
        # a thread's slice holds at most ceil(batch / splits) images' bands, each band's
        # rows a term a tap; then the block's columns, then the slice rows in order
        sum_depth=(bands * v.rows, v.splits, v.cols + slices + 1),
    )
