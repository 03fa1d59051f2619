"""``tcgemm``: the pipelined implicit GEMM on tensor cores, for channels-last 16-bit
tensors.

Per group the forward convolution is one matrix product: y[p][m] = sum over k of
X[p][k] * W[m][k], the rows p every output pixel of the batch (NHWC y is that matrix
as it lies), the columns m the group's maps, and the reduction k = (r, s, c) walked
tap by tap, BK channels at a time.  With NHWC x a row's BK channels of one tap are
contiguous, so every operand element reaches shared memory in 16-byte ``cp.async``
copies (a zero-fill where the window leaves the image), ``stages`` chunks in flight.
Where a group's channels do not fill whole chunks (ResNeXt's 8 and 16 against 32),
k runs over (r, s, c) as one sequence instead, a chunk spanning taps: a thread's
16-byte unit at element k reads tap k / (C/g), and only the walk's last chunk is
zero-filled past its end (a 3x3 window of 8 channels takes 3 chunks, not 9).
The shared tiles are XOR-swizzled in 16-byte units so that ``ldmatrix`` reads eight
rows of one k column without a bank conflict; the warps multiply on ``mma.sync``
m16n8k16 in fp16 or bf16 with fp32 sums, and the epilogue (bias, activation, rounding
to the output dtype) runs on the registers before a store of adjacent map pairs.

fp32 tensors are multiplied in tf32, or at fp32 accuracy in three tf32 products
(``--precision fp32``, as ``tc3wgrad``): each word split into a tf32 hi and the lo
left over, and lo x hi + hi x lo + hi x hi summed per k step from zero before it
joins the fp32 sums.

dgrad at stride 1 comes through the forward view (``ConvProblem.dgrad_view``): the
same kernel over dy with the weights flipped and transposed by the packing step.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import SpecError
from ..plan.common import Launch, Plan, Size, ceil_div, shape_context, y_args
from ..shapes import ConvProblem, DType, Feature, Op, TensorLayout
from ..tensors import Role
from ..variants import EPILOGUE, GEOMETRY, Count, Pair, Precision, Variant, param
from .mma import ROUNDING
from .phased import _phase_taps

VECTOR = 8  # 16-bit elements per 16-byte copy
# The math each tensor dtype is multiplied in on the tensor cores: its own, tf32 for fp32.
MATH = {DType.BF16: Precision.BF16, DType.FP16: Precision.FP16, DType.FP32: Precision.TF32}
KSTEP = 16  # mma.m16n8k16
STAGE_LIMIT = 227 * 1024  # dynamic shared memory per block, with the opt-in
MAX_ACCUMULATORS = 128  # fp32 sums per thread (a 64x64 warp tile)
TARGET_BLOCKS = 132  # a block for each of the H200's SMs


@dataclass(frozen=True, kw_only=True)
class Tcgemm(Variant):
    key = "tcgemm"
    templates = ("gemm/tcgemm.cu.j2",)
    family = "gemm"
    description = (
        "pipelined implicit GEMM on tensor cores: NHWC tensors, 16-byte cp.async into a "
        "multistage swizzled ring, ldmatrix, mma.sync m16n8k16 (fp16, bf16) or m16n8k8 "
        "(fp32 tensors in tf32, or in three tf32 products at fp32 accuracy), fp32 sums; "
        "strided dgrad a GEMM per stride phase"
    )
    serves = GEOMETRY | EPILOGUE | {Feature.DTYPE16, Feature.NHWC}
    precisions = (Precision.BF16, Precision.FP16, Precision.TF32, Precision.FP32)
    tensor_core = True

    blocktile: tuple[int, int] = param(
        (128, 128), Pair("b"), "tcgemm: the block's tile of y, output pixels x maps (MxN)"
    )
    warpgrid: tuple[int, int] = param(
        (2, 2), Pair("w"), "tcgemm: warps along the block tile's pixels x maps"
    )
    chunk: int = param(32, Count("k"), "tcgemm: channels of one tap per pipeline stage")
    stages: int = param(4, Count("p"), "tcgemm: chunks in the shared-memory ring")

    ops = frozenset({Op.FPROP, Op.DGRAD})
    phased_dgrad = True  # a strided dgrad a GEMM per stride phase (``phases_of``)

    def plan(self, problem):
        return plan_tcgemm(problem, self)

    @classmethod
    def seeds(cls):
        return [cls(precision=p) for p in cls.precisions]

    @classmethod
    def fit(cls, problem, seed):
        """The math of the tensors' own dtype (tf32 for fp32 tensors); a map tile no
        wider than the group's maps need (16 to 128), a pixel tile small enough to give
        every SM a block, warps of 64 pixels x 64 maps, and chunks of 64-byte rows (on the
        H200, 128x128 blocks of 2x2 such warps and chunks of 32 bf16 channels four deep were
        the fastest on ae-enc2 and ae-dec2; in tf32, 16 channels: 0.119 ms against a
        32-channel chunk that spilled)."""
        precision = seed.precision
        if precision not in maths_of(problem.dtype):
            raise SpecError(
                f"tcgemm multiplies {problem.dtype.value} tensors in "
                f"{' or '.join(m.value for m in maths_of(problem.dtype))}: take --precision "
                f"{MATH[problem.dtype].value}"
            )
        if precision is Precision.FP32:
            # three products a step and the split words beside the fragments: warps of
            # 64 pixels x 32 maps, eight of them
            seed = replace(seed, blocktile=(128, 128))
        out = problem.H * problem.W if problem.op is Op.DGRAD else problem.Ho * problem.Wo
        problem = gemm_view(problem)
        bn = min(seed.blocktile[1], max(16, 1 << (problem.Mg - 1).bit_length()))
        bm = seed.blocktile[0]
        pixels = problem.batch * out
        while bm > 64 and ceil_div(pixels, bm) * ceil_div(problem.Mg, bn) * problem.groups < (
            TARGET_BLOCKS
        ):
            bm //= 2
        warp_n = 32 if precision is Precision.FP32 else 64
        warps = (max(1, bm // 64), max(1, bn // warp_n))
        if warps[0] * warps[1] < 4 and bn >= 32:
            warps = (max(1, bm // 32), warps[1])  # few warps' copy addresses spill
        chunk = 64 // problem.dtype.bytes  # rows of 64 bytes: two mma k steps a chunk
        return replace(seed, blocktile=(bm, bn), warpgrid=warps, chunk=chunk, precision=precision)

    @classmethod
    def space(cls, problem, precision):
        """Block tiles from 64x64 to 256x128 with warps of 32 to 64 pixels and maps, and
        where 64x64 tiles leave most SMs idle (``few_blocks``) tiles of 32 pixels or maps
        with warps down to 16x16, each in chunks of both row lengths, 3 to 5 deep."""
        tiles = [
            (128, 128, 2, 4),
            (128, 128, 4, 2),
            (128, 64, 2, 2),
            (64, 128, 2, 2),
            (64, 64, 2, 2),
            (256, 128, 4, 4),
            (128, 256, 2, 8),
        ]
        if few_blocks(problem):
            tiles += [(32, 64, 2, 2), (64, 32, 2, 2), (32, 32, 2, 2), (32, 128, 1, 4)]
        out = []
        for bm, bn, wm, wn in tiles:
            for chunk in (32, 64) if precision.value not in ("tf32", "fp32") else (16, 32):
                for stages in (3, 4, 5):
                    out.append(
                        cls(
                            blocktile=(bm, bn),
                            warpgrid=(wm, wn),
                            chunk=chunk,
                            stages=stages,
                            precision=precision,
                        )
                    )
        return out


def few_blocks(problem: ConvProblem) -> bool:
    """Whether 64x64 tiles of the GEMM's output (a strided dgrad's over all of dx, its
    phases together) give fewer blocks than half of ``TARGET_BLOCKS``: resnet18's
    layer4 at 32x32 images, whose 1x1 stride-2 dgrad in 64x128 tiles ran 8 blocks of
    GEMM (0.12 waves, H200)."""
    out = problem.H * problem.W if problem.op is Op.DGRAD else problem.Ho * problem.Wo
    g = gemm_view(problem)
    blocks = ceil_div(problem.batch * out, 64) * ceil_div(g.Mg, 64) * g.groups
    return blocks < TARGET_BLOCKS // 2


def maths_of(dtype: DType) -> tuple[Precision, ...]:
    """The maths tcgemm multiplies tensors of ``dtype`` in: their own on the tensor
    cores, and for fp32 tensors tf32 or fp32 in three tf32 products."""
    return (MATH[dtype], Precision.FP32) if dtype is DType.FP32 else (MATH[dtype],)


def affine(const: int, **terms: int) -> str:
    """The C expression const + sum of name * k, with the ones and zeros left out
    (``affine(-1, oh=2)`` is "oh * 2 - 1")."""
    text = ""
    for name, k in terms.items():
        if k == 0:
            continue
        sign = " - " if k < 0 else " + "
        term = name if abs(k) == 1 else f"{name} * {abs(k)}"
        text = (f"-{term}" if k < 0 else term) if not text else text + sign + term
    if not text:
        return str(const)
    return text + (f" + {const}" if const > 0 else f" - {-const}" if const < 0 else "")


def flat_pixels(p) -> bool:
    """Whether a 1x1 window at stride 1 without padding reads x at the output's own
    pixel: x and y (dy and x, for wgrad) are then rows of the batch's pixels in one
    order, [pixels][C], and a tile or unit may be any run of consecutive pixels rather
    than whole output rows (``wgwtma``'s 64-pixel units, ``wgmma``'s TMA boxes)."""
    return p.R == p.S == 1 and p.stride == (1, 1) and p.pads == (0, 0, 0, 0)


def gemm_view(problem: ConvProblem) -> ConvProblem:
    """The forward problem whose sizes the GEMM takes: the problem itself, or for a
    strided dgrad (computed in phases) the convolution of dy (channels M, an Ho x Wo
    image) into dx's C maps, its geometry left to the phases (the full padding keeps
    any image valid)."""
    if problem.op is not Op.DGRAD:
        return problem
    p = problem
    return replace(
        p,
        C=p.M,
        M=p.C,
        H=p.Ho,
        W=p.Wo,
        stride=(1, 1),
        dil=(1, 1),
        pads=(p.R - 1, p.R - 1, p.S - 1, p.S - 1),
        op=Op.FPROP,
        name="",
    )


def _phase_walk(taps: list[tuple[int, int]], window: int) -> tuple[int, int, int, int, int]:
    """(count, first flipped tap, its step, first dy offset, its step) of one axis of a
    phase, its taps walked in the order of the flipped window (the tap t is t' =
    window - 1 - t there), which is also the order of rising dy offsets."""
    if not taps:
        return 0, 0, 0, 0, 0
    ordered = sorted(taps, key=lambda t: -t[0])
    t0, o0 = window - 1 - ordered[0][0], ordered[0][1]
    if len(ordered) == 1:
        return 1, t0, 0, o0, 0
    t1, o1 = window - 1 - ordered[1][0], ordered[1][1]
    return len(ordered), t0, t1 - t0, o0, o1 - o0


def phases_of(p: ConvProblem, chunks_per_tap: int) -> list[dict]:
    """The GEMMs of the kernel, each a dict of the C expressions and sizes its tile
    takes: the forward convolution as one; a strided dgrad as one per stride phase of
    dx (rows h = a mod sh, columns w = b mod sw, as ``phased``), each over the taps that
    reach it, in the flipped window of the dgrad weights.  The phases come with the most
    rows of taps first, and of those the most columns: blocks start in blockIdx order
    with z (the phase) last, so the longest blocks start first and the short ones fill
    the tail, and the phases of one row (their dx words interleaved in NCHW rows, a
    32-byte sector holding both) still run side by side.  Ordered by taps alone, the
    row's two halves of resnet's 3x3 stride-2 dgrad over 56x56 dx ran far apart in
    wgplanar's grid: 0.141 ms in tf32 against 0.114 in the (a, b) order, where over
    14x14 dx (in L2) it took 0.064 against 0.090 (H200, B=32, 2026-11-28)."""
    (sh, sw), (dh, dw) = p.stride, p.dil
    pt, _, pl, _ = p.pads
    if p.op is not Op.DGRAD:
        return [
            dict(
                what="",
                OW=p.Wo,
                HW=p.Ho * p.Wo,
                ih0=affine(-pt, oh=sh),
                iw0=affine(-pl, ow=sw),
                ih=affine(0, **{"ih0[i]": 1, "lr": dh}),
                iw=affine(0, **{"iw0[i]": 1, "ls": dw}),
                tap=affine(0, lr=p.S, ls=1),
                RT=p.R,
                ST=p.S,
                kt=p.R * p.S * chunks_per_tap,
                out=None,
            )
        ]
    out = []
    for a in range(sh):
        rows = _phase_taps(a, pt, dh, sh, p.R)
        for b in range(sw):
            Hq, Wq = ceil_div(p.H - a, sh), ceil_div(p.W - b, sw)
            if Hq < 1 or Wq < 1:
                continue  # the image is smaller than the stride
            cols = _phase_taps(b, pl, dw, sw, p.S)
            RT, r0, dr, oy0, doy = _phase_walk(rows, p.R)
            ST, s0, ds, ox0, dox = _phase_walk(cols, p.S)
            taps = (
                f"taps r {[t for t, _ in rows]} x s {[t for t, _ in cols]}" if RT * ST else "no tap"
            )
            out.append(
                dict(
                    what=f"dx rows h = {a} (mod {sh}), columns w = {b} (mod {sw}): {taps}",
                    OW=Wq,
                    HW=Hq * Wq,
                    ih0=affine(oy0, oh=1),
                    iw0=affine(ox0, ow=1),
                    ih=affine(0, **{"ih0[i]": 1, "lr": doy}),
                    iw=affine(0, **{"iw0[i]": 1, "ls": dox}),
                    tap=affine(r0 * p.S + s0, lr=dr * p.S, ls=ds),
                    RT=RT,
                    ST=ST,
                    kt=RT * ST * chunks_per_tap,
                    out=f"(n * {p.H} + {affine(a, oh=sh)}) * {p.W} + {affine(b, ow=sw)}",
                    # the same walk in numbers, for kernels that take the phase at run
                    # time (wgplanar): dx's first row and column, dy's offsets of the
                    # first tap and their steps, the first flipped tap and its steps
                    a=a,
                    b=b,
                    Hq=Hq,
                    Wq=Wq,
                    oy0=oy0,
                    doy=doy,
                    ox0=ox0,
                    dox=dox,
                    tap0=r0 * p.S + s0,
                    dtr=dr * p.S,
                    dts=ds,
                )
            )
    # a row's phases together (RT is the row's), its columns with the most taps first
    return sorted(out, key=lambda ph: (-ph["RT"], ph["a"], -ph["ST"]))


def k_walk(p: ConvProblem, kt: int, chunk: int, phased: bool, flat: bool = False) -> Size:
    """The plan's line for the k walk of a GEMM over (r, s, c) in chunks of ``chunk``
    channels of one tap (``kt`` of them, the longest phase's where ``phased``), or
    (``flat``) of ``chunk`` consecutive elements of the walk, a chunk spanning taps."""
    if flat:
        rsc = p.R * p.S * p.Cg
        return Size(
            "k walk",
            f"{kt} chunks of {chunk} of the {rsc} (r, s, c)",
            f"the group's {p.Cg} channels of {p.R}x{p.S} taps in one run, {chunk // p.Cg or 1}"
            f" tap(s) a chunk where {p.Cg} channels are fewer than a chunk"
            + (f"; the last zero-filled past {rsc}" if rsc % chunk else ""),
        )
    taps = "a phase's taps" if phased else f"{p.R}x{p.S} taps"
    return Size(
        "k walk",
        f"{kt} chunks of {chunk} channels" + (" at most" if phased else ""),
        f"{taps} x {ceil_div(p.Cg, chunk)} chunk(s) of the group's {p.Cg} channels"
        + ("; the last zero-filled past them" if p.Cg % chunk else ""),
    )


def plan_tcgemm(problem: ConvProblem, v: Tcgemm) -> Plan:
    p = gemm_view(problem)  # the GEMM's sizes; ``problem`` keeps the op and geometry
    # 1. limits
    if p.layout is not TensorLayout.NHWC:
        raise SpecError(
            "tcgemm reads channels-last tensors (16-byte copies along the channels): use "
            "layout=nhwc in the shape spec, or --strategy mma"
        )
    if v.precision not in maths_of(p.dtype):
        raise SpecError(
            f"tcgemm multiplies {p.dtype.value} tensors in "
            f"{' or '.join(m.value for m in maths_of(p.dtype))}: take --precision "
            f"{MATH[p.dtype].value}"
        )
    split = v.precision is Precision.FP32
    vec = 16 // p.dtype.bytes  # elements per 16-byte copy
    if p.Cg % vec:
        raise SpecError(
            f"tcgemm copies {vec} channels at a time: the {p.Cg} channels per group are "
            f"not a multiple of {vec}; use --strategy mma"
        )
    bm, bn = v.blocktile
    wm_count, wn_count = v.warpgrid
    if bm % (16 * wm_count) or bn % (16 * wn_count):
        raise SpecError(
            f"tcgemm b{bm}x{bn} w{wm_count}x{wn_count}: each warp's tile must be a multiple "
            "of 16 pixels and 16 maps; choose fewer warps or a larger block tile"
        )
    warp_m, warp_n = bm // wm_count, bn // wn_count
    fm, fn = warp_m // 16, warp_n // 8
    if fm * fn * 4 > MAX_ACCUMULATORS:
        raise SpecError(
            f"tcgemm's warp tile {warp_m}x{warp_n} needs {fm * fn * 4} fp32 sums per thread, "
            f"over {MAX_ACCUMULATORS}; choose more warps (--warpgrid) or a smaller --blocktile"
        )
    warps = wm_count * wn_count
    threads = 32 * warps
    if threads > 512:
        raise SpecError(f"tcgemm w{wm_count}x{wn_count}: {threads} threads, over 512")
    size = p.dtype.bytes
    chunks = (64 // size, 128 // size)  # rows of 64 or 128 bytes
    if v.chunk not in chunks:
        raise SpecError(
            f"tcgemm k{v.chunk}: a chunk is {chunks[0]} or {chunks[1]} channels of "
            f"{p.dtype.value} (the swizzle keeps 16 rows of a k column in distinct banks only "
            "for rows of 64 or 128 bytes)"
        )
    per_row = v.chunk // vec  # 16-byte units per tile row
    for what, rows in (("pixel", bm), ("map", bn)):
        if rows * per_row % threads:
            raise SpecError(
                f"tcgemm b{bm}x{bn} k{v.chunk}: the {what} tile's {rows * per_row} 16-byte "
                f"copies do not divide among {threads} threads; choose a larger tile"
            )
    if not 2 <= v.stages <= 8:
        raise SpecError(f"tcgemm p{v.stages}: the ring holds 2 to 8 chunks")
    a_stage, b_stage = bm * v.chunk * size, bn * v.chunk * size
    smem = v.stages * (a_stage + b_stage)
    if smem > STAGE_LIMIT:
        fit = STAGE_LIMIT // (a_stage + b_stage)
        raise SpecError(
            f"tcgemm's ring of {v.stages} chunks needs {smem} B of shared memory, over the "
            f"{STAGE_LIMIT} B a block may opt in to; choose --stages {fit} or a smaller tile"
        )

    # Registers: the sums, two sets of fragments, about 30 for addresses and the walk,
    # and 20 for each mma k step of a chunk past two (its ldmatrix addresses and the
    # unrolled step's temporaries).  ptxas on sm_90: b128x128 w2x2 k32 bf16 234, k64
    # spilled, and so did tf32 k32 (four k8 steps); a 64x32 warp tile at 512 threads
    # spilled.
    ksteps = v.chunk * size // 32
    budget = min(255, 65536 // threads // 8 * 8)
    need = fm * fn * 4 + 2 * (fm * 4 + fn * 2) + 30 + 20 * max(0, ksteps - 2)
    if split:  # b's hi and lo for every n8 fragment, a's for one m16, a step's sums,
        # and 25 more for each k step past two (ptxas on sm_90: 64x32 warp tiles took
        # 252 registers with k16 chunks and spilled 200-330 bytes with k32)
        need += fn * 4 + 8 + 4 + 25 * max(0, ksteps - 2)
    if need > budget:
        raise SpecError(
            f"tcgemm b{bm}x{bn} w{wm_count}x{wn_count}: a {warp_m}x{warp_n} warp tile needs "
            f"about {need} registers a thread, over the {budget} that {threads} threads get; "
            "choose fewer warps, a smaller block tile or a shorter chunk"
        )

    # 2. work
    chunks_per_tap = ceil_div(p.Cg, v.chunk)
    phases = phases_of(problem, chunks_per_tap)
    phased = problem.op is Op.DGRAD
    # A group's channels that do not fill whole chunks (ResNeXt's 8 and 16 of 32) are
    # walked as one run over (r, s, c), a chunk spanning taps, rather than a tap a chunk
    # zero-filled past them: a 3x3 window of 8 channels is 3 chunks of 32, not 9.
    flat = not phased and p.Cg % v.chunk != 0
    if flat:
        phases = [dict(phases[0], kt=ceil_div(p.R * p.S * p.Cg, v.chunk))]
    kt = max(ph["kt"] for ph in phases)  # the longest walk of a pixel's sums
    map_tiles = ceil_div(p.Mg, bn)
    ctx = shape_context(p)
    (sh, sw), (dh, dw) = problem.stride, problem.dil
    tf32 = p.dtype is DType.FP32
    ctx.update(
        fp16=p.dtype is DType.FP16,
        tf32=tf32,
        split=split,
        elem={DType.FP16: "f16", DType.BF16: "bf16", DType.FP32: "tf32"}[p.dtype],
        mma_shape="m16n8k8" if tf32 else "m16n8k16",
        io="float" if tf32 else "unsigned short",
        vec=vec,
        ksteps=per_row // 2,  # an mma k step reads two 16-byte units of a row
        sh=sh,  # the problem's own, where p is a stride phase's
        sw=sw,
        dh=dh,
        dw=dw,
        BM=bm,
        BN=bn,
        BK=v.chunk,
        WM=warp_m,
        WN=warp_n,
        warps_m=wm_count,
        FM=fm,
        FN=fn,
        stages=v.stages,
        threads=threads,
        per_row=per_row,
        a_vecs=bm * per_row // threads,
        b_vecs=bn * per_row // threads,
        rows_per_pass=threads // per_row,
        a_stage=a_stage,
        b_stage=b_stage,
        smem=smem,
        chunks_per_tap=chunks_per_tap,
        kt=kt,
        phases=phases,
        phased=phased,
        map_tiles=map_tiles,
        rsc=p.R * p.S * p.Cg,
        guard_maps=p.Mg % bn != 0,
        guard_chans=p.Cg % v.chunk != 0 and not flat,
        flat_k=flat,
        pair_store=p.M % 2 == 0 and p.Mg % 2 == 0,
        min_blocks=max(1, 256 // threads),
        precision_note=(
            "x and w split into tf32 hi + lo, lo x hi + hi x lo + hi x hi per k step, sums in fp32"
            if split
            else ROUNDING[v.precision]
        ),
    )
    ctx.update(
        x_image=p.H * p.W * p.C,
        y_group=p.Mg,
    )
    most = max(ph["HW"] for ph in phases)
    gemm = (
        Size(
            "GEMM",
            f"(B*{p.Ho * p.Wo}) x {p.Mg} x {p.R * p.S * p.Cg}"
            + (f", {p.groups} groups" if p.groups > 1 else ""),
            "output pixels x maps x (r, s, c) taps; NHWC y is the product as it lies",
        ),
    )
    if phased:
        gemm = (
            Size(
                "phases",
                f"{len(phases)} of {sh} x {sw}, blockIdx.z",
                "dx rows h = a (mod sh) x columns w = b (mod sw), each a GEMM of "
                "(B*its pixels) x C/groups x (its taps x M/groups) over dy: "
                + ", ".join(f"{ph['HW']} x {ph['RT'] * ph['ST']}" for ph in phases),
            ),
        )
    sizes = (
        *gemm,
        Size(
            "block tile",
            f"{bm} pixels x {bn} maps",
            f"{warps} warps as {wm_count}x{wn_count}, each {warp_m}x{warp_n}: "
            f"{fm} m16 x {fn} n8 fragments, {fm * fn * 4} fp32 sums per thread",
        ),
        k_walk(p, kt, v.chunk, phased, flat),
        Size(
            "__shared__",
            f"{smem} B (dynamic)",
            f"{v.stages} stages x ({bm} + {bn}) rows x {v.chunk * size} B, XOR-swizzled in 16-byte units",
        ),
        Size(
            "copies",
            f"{bm * per_row // threads} + {bn * per_row // threads} per thread per chunk",
            "16-byte cp.async.cg, zero-filled outside the image and past the maps",
        ),
    )
    args = (Role.DY, Role.W, Role.DX) if phased else (Role.X, Role.W, *y_args(p))
    launch = Launch(
        v.kernel_name(problem),
        (*args, Role.BATCH),
        (threads, 1, 1),
        (0, map_tiles * p.groups, len(phases)),
        0,
        most,
        bm,
        smem,
    )
    return Plan(
        shape=problem,
        variant=v,
        template="gemm/tcgemm.cu.j2",
        launches=(launch,),
        static_smem=0,
        dynamic_smem=smem,
        const_bytes=0,
        weight_format="mrsc." + p.dtype.value,
        weight_transform="dgrad" if phased else "",
        sizes=sizes,
        context=ctx,
        # three products a step, each step's sum added to the running one
        sum_depth=(0, 1, 3 * kt * v.chunk + (1 if p.bias else 0)) if split else None,
    )
