"""Which kernel serves a problem when nobody named one: the choice behind specgen's
PyTorch operator (and anything else that wants "the fastest kernel we know of").

In order: this GPU's tuned winner in the results database (``specgen tune``), else the
winners shipped for this GPU on a preset of the same geometry, dtype and layout (the
bias and activation are epilogues and do not change the ranking), else the planner's
default of the strategy that suits the op best.  Only the maths the caller allows are
considered: fp32 tensors get fp32 math, and tf32 where the caller allows it (as
``torch.backends.cudnn.allow_tf32`` does for PyTorch's own convolution); 16-bit
tensors get fp32 math or tensor cores of their own dtype (fp32 accumulation in both).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from math import prod

from . import measured, tunedb
from .errors import SpecError
from .plan import make_plan
from .plan.common import COPY_RATE, ceil_div
from .shapes import PRESETS, Act, ConvProblem, DType, Op, TensorLayout
from .strategies import BY_KEY, parse_variant_name
from .strategies.wgnchw import dividing_map_tiles
from .strategies.wtap import lane_tiled
from .tensors import Role, role_shape
from .variants import Precision, Variant, split_problem_tags

# The strategies tried for the planner's default, in order, per op.  wgrad: 16-bit
# channels-last layers go on tensor cores, tcwhalo taking those whose channels or maps
# are not multiples of 8 (tcwgrad copies 8 at a time); wlane takes channels-last layers
# whose maps a group are few (it refuses more than its registers hold: the
# autoencoder's 256 -> 3 layer in 0.144 ms against wband's 0.50 in NHWC and 0.34 in
# NCHW, cuDNN's fp32 0.56 and tf32 0.34, H200); wband
# keeps a block's whole weight tile in registers, which pays where the weights are
# few (the 7x7 presets, 3-channel layers); wgemm's register-tiled GEMM suits wide
# layers; wsplit serves what neither does (NHWC wide layers).
SMALL_WEIGHTS = 16384
# wgemm's smallest map tile is 32: fewer maps a group than this waste over half of it.
WGEMM_MIN_MAPS = 16
# Tried only for channels per group that wgmma and tcgemm cannot copy: in the tensors'
# own 16-bit math where they are not a multiple of 8, and in tf32 on NHWC where they are
# not a multiple of 4.  mma's bf16 ran the 3-channel autoencoder layer 3.4x faster than
# stream (0.076 against 0.256 ms, H200), and its tf32 in channels-last 0.078 against
# stream's fp32 0.350 and cuDNN's tf32 0.198 (2026-11-23); on wide layers stream's fp32
# math beat it (ae-dec1 0.058 against 0.087 ms), and its tf32 too.
FEW_CHANNELS = {"mma"}


def few_channels(view: ConvProblem, math: Precision) -> bool:
    """Whether a strategy of FEW_CHANNELS is tried for the view in this math."""
    if math is Precision.TF32:
        return view.layout is TensorLayout.NHWC and view.Cg % 4 != 0
    return math is not Precision.FP32 and view.Cg % 8 != 0


# Not tried in tf32 for fewer than 16 maps a group: tcgemm re-reads x for every tap and
# shares each read among the block's maps, so with 3 maps its tf32 ran the autoencoder's
# last layer (256 -> 3 channels, NHWC, B=128) at 0.31-0.44 ms (H200), where stream's
# fp32 takes 0.20.  wgmma shares that walk (and its 64-map warpgroups would idle).
FEW_MAPS_TF32 = {"tcgemm", "wgmma"}
# tcgemm's, tcwgrad's and wgplanar's fp32 math (three tf32 products a product) is tried
# only where a group's channels and maps are both at least this many: each loaded word
# then feeds enough products to pay for its split.
GEMM_FP32 = {"tcgemm", "tcwgrad", "wgplanar"}
GEMM_FP32_MIN = 32
# Tried only for 32 channels or more: flane gives each lane of a warp a channel, and
# its sums then cross all 32.  On the autoencoder's 256 -> 3 layer in NHWC it ran the
# forward pass in 0.104 ms against stream's 0.201 and cuDNN's fp32 0.737 and tf32 0.211
# (H200, 2026-11-23).
WARP_OF_CHANNELS = {"flane"}
# Tried only for fewer than WGEMM_MIN_MAPS maps a group: with more, each lane's dy
# loads match its FMAs (a 1x1 window), where wgemm's tiles reuse every load.
FEW_MAPS = {"wlane"}
# Not tried for depthwise layers (one channel a group): their tiles span a group's maps
# by its channels, so a 16x8 tile multiplies one useful row of a depthwise layer's. On
# mobilenet_v2's 3x3 depthwise wgrads at B=64 (bf16, NHWC, H200, 2026-11-28) tcwhalo took
# 0.10-3.05 ms against cuDNN's 0.04-0.14, wlane's lane a channel 0.145 against 0.091 on
# the one it was picked for.
GROUP_TILED_WGRAD = {"wgwgrad", "wgwtma", "wgnchw", "tcwgrad", "tcwhalo", "tc3wgrad"}
# wdw (a band of rows a block in shared memory) is tried for depthwise wgrads whose input
# rows are at least this wide.  Tuned on mobilenet_v2's at B=64 (bf16, H200, 2026-11-30,
# tune-wdw-*), it ran those of 112-, 56- and 28-wide inputs (at stride 1 and 2) in
# 0.017-0.056 ms against wlane's 0.030-0.122; on 14- and 7-wide inputs wlane kept them
# (0.021-0.025 against 0.022-0.036, and 0.014 against 0.035 on 960 channels of 7x7,
# whose two bands fill an SM's shared memory).
WDW_MIN_WIDTH = 28


def depthwise(view: ConvProblem) -> bool:
    """One input channel a group (MobileNet's, EfficientNet's depthwise layers, their
    maps a group the channel multiplier)."""
    return view.groups > 1 and view.Cg == 1


# Tried only in 16-bit math, for windows of 5 taps a row or more (a row is padded to 8
# taps) over at most this many channels a group.  On the 16-bit 7x7 layers at B=10000
# (H200, 2026-11-23, bf16 NCHW): 1 channel, mmastrip 0.30 ms against mmapersist's 0.63
# and cuDNN's 10.4; 4 channels, 0.44 against 0.55; 12 channels, mmapersist 1.13
# against mmastrip's 1.34 and cuDNN's 4.3.
FEW_CHANNEL_WINDOWS = {"mmastrip": 4, "mmapersist": 16}


# Tried in the same 16-bit math for windows of 5 taps a row or more, where a layer's maps
# fill at most half of mmastrip's n8 tiles or its channels are more than mmastrip and
# mmapersist take (16): rows folded beside the maps fill them.  bf16 NCHW at B=10000
# (H200, 2026-11-24): the dgrad views of the 7x7 layers (1, 4, 1 and 12 maps) 1.08,
# 1.67, 3.07 and 3.43 ms against mmastrip's 1.74, 2.26 and 4.04 and mmapersist's 3.77;
# layer1's forward pass (4 maps) 0.264 against 0.302; mx-layer1's (12 maps) 1.00
# against mmastrip's 0.59.
def fold_suits(view: ConvProblem) -> bool:
    return view.S >= 5 and (2 * view.Mg <= 8 * ceil_div(view.Mg, 8) or view.Cg > 16)


# Tried in 16-bit math for windows of 5 to 9 taps a row over at most 4 maps and at least
# 4 channels (the 7x7 layers' dgrad views but mx-layer2's): the window's columns as a
# Toeplitz B.  bf16 NCHW at B=10000 (H200, 2026-11-24): the dgrad views of layer1 (4
# channels, 1 map), layer2 (16, 4) and mx-layer1 (12, 1) 0.407, 0.938 and 1.150 ms against
# mmafold's 1.054, 1.523 and 2.968; where the channels are few mmafold keeps it (layer1's
# forward pass, 1 channel and 4 maps, 0.250 against 0.441), and with 12 maps too
# (mx-layer2's dgrad view, 3.41 against 3.83).
def toep_suits(view: ConvProblem) -> bool:
    return 5 <= view.S <= 9 and view.Mg <= 4 and view.Cg >= 4


# Tried for fp32 wgrad of windows of 5 taps a row or more, where a lane's S sums are
# enough FMAs for its two shared loads a step: the 7x7 layers at B=10000 (H200,
# 2026-11-24, NCHW) in 0.87, 2.28, 2.12 and 6.42 ms against wband's 1.44, 3.72, 3.09 and
# 11.36 and cuDNN fp32's 10.6, 7.0, 7.3 and 11.1.
WTAP_MIN_TAPS = 5

# Tried for fp32 wgrad (three tf32 products each on the tensor cores) where a group's
# maps fill its m16 tiles and its channels an n8 fragment: NCHW fp32 at B=128 (H200,
# 2026-11-25) the autoencoder's ae-enc2 and ae-dec2 in 0.29 ms against wtap's 0.43 and
# cuDNN fp32's 0.23, ae-dec1 0.052 against wgemm's 0.082 and cuDNN's 0.068, ae-enc1 (3
# channels) 0.096 against wtap's 0.110 and cuDNN's 0.139; with 3 maps (ae-dec3) wtap
# keeps it, 0.156 against 0.178.
TC3_MIN_MAPS, TC3_MIN_CHANNELS = 16, 3


def three_tf32_suits(view: ConvProblem) -> bool:
    """Whether tc3wgrad is tried for the wgrad problem ``view``: maps and channels
    enough, and a default that plans."""
    if view.Mg < TC3_MIN_MAPS or view.Cg < TC3_MIN_CHANNELS:
        return False
    try:
        return _plans(view, BY_KEY["tc3wgrad"].default(view, Precision.FP32))
    except SpecError:
        return False


# wgnchw's three tf32 products lose to wtap's CUDA cores on windows over maps of fewer
# output pixels than two of its 32-pixel rows: resnet50's 3x3 layers of 7x7 outputs at
# B=32 (H200, 2026-11-28) in 0.266 and 0.283 ms against wtap's 0.227 and 0.258; 14x14
# outputs take wgnchw (0.147 against wtap's 0.194).  Its tf32 keeps them (0.089 and 0.102
# against tcwgrad's 0.131 and 0.157 in NHWC).
WGNCHW_FP32_MIN_PIXELS = 64

# wgnchw's ragged map tiles (a group's maps that no tile of 64 divides) against tc3wgrad
# where that takes the layer: mobilenet_v2's 1x1 wgrads at B=64 (H200, 2026-11-30,
# tuned) in tf32 from 24 maps 0.72-0.78x tc3wgrad's time (96 -> 24 maps 0.0377 ms against
# 0.0509), 16 maps 1.15x (0.0605 against 0.0524); in three tf32 products 1.01-2.1x,
# never faster.  Where tc3wgrad does not take them (rows of 14 or 7 pixels, which its
# 16-byte copies refuse), wgnchw's three products ran 1.95-2.14x cuDNN fp32's (384 -> 96
# maps over 14x14 in 0.031 ms, where the tcwgrad in NHWC took 0.039 with the moves).
WGNCHW_RAGGED_MIN_MAPS = 24


def wgnchw_suits(view: ConvProblem, math: Precision) -> bool:
    """Whether wgnchw in ``math`` is the untuned pick for the wgrad problem ``view``:
    maps that a tile of 64 divides, or ragged tiles where tc3wgrad does not take the
    layer, or in tf32 from ``WGNCHW_RAGGED_MIN_MAPS`` maps a group; in fp32 math a 1x1
    window, or output maps of two of its 32-pixel rows or more."""
    if not dividing_map_tiles(view):  # ragged tiles
        tf32 = math is Precision.TF32 and view.Mg >= WGNCHW_RAGGED_MIN_MAPS
        return tf32 or not three_tf32_suits(view)
    if math is not Precision.FP32:
        return True
    return view.R * view.S == 1 or view.Ho * view.Wo >= WGNCHW_FP32_MIN_PIXELS


# wgwino (F(3, 2)'s 16 GEMMs on wgnchw's kernel) beside the picks of vgg11's and resnet's
# stride-1 3x3 fp32 NCHW wgrads (H200, 2026-11-30, B=32 and 64, tune-wgwino-3x3-fp32-
# wgrads-*): its fit won from 256 x 512 weights a tap in both maths (vgg11's features.13
# 1.17 ms against wgnchw's 2.21 in three tf32 products, 0.50 against 0.68 in tf32;
# 512 x 512 over 7x7 maps at B=64 0.205 against 0.317 and 0.112 against 0.136); below,
# over 14x14 maps the tune's own tiles won where any did (resnet50's 256 x 256: the fit
# 0.155 against wgnchw's 0.147, b128x64 0.121).  With its 16-byte copies (over maps
# whose tiles an image are a multiple of 4) its fp32 fit also takes 128 x 256 weights
# over 16x16 maps and wider: the autoencoder's at B=128 in 0.194 ms against tc3wgrad's
# 0.326 and cuDNN's 0.230 (bench-ae-wgwino-vec4-*), vgg11's features.6 (128 x 256 over
# 56x56) 0.628 against wgnchw's 0.98 (bench-vgg11-wgwino-vec4-*).  Its tf32 wins were
# over 7x7 maps and wider, and so are its fp32 ones from 512 x 512 weights: resnet50's
# layer4 3x3 at B=32 in 0.098 ms against cuDNN fp32's 0.097, wgnchw's 0.183 and wtap's
# 0.225 (bench-wgwino-7x7-fp32-*; at B=64 0.157 against 0.163, 0.314 and 0.416).
WGWINO_LEAST = {  # math: (a group's maps x channels, output pixels a map), either of
    Precision.FP32: ((512 * 512, 7 * 7), (256 * 512, 14 * 14), (128 * 256, 16 * 16)),
    Precision.TF32: ((256 * 512, 7 * 7),),
}


def wgwino_suits(view: ConvProblem, math: Precision, allow_tf32: bool) -> bool:
    """Whether wgwino in ``math`` is the untuned pick for the wgrad problem ``view``: a
    group's maps x channels and the output maps at least one of ``WGWINO_LEAST``'s; its three tf32
    products not where tf32 is allowed (wgnchw's one product ran those layers faster)."""
    if math is Precision.FP32 and allow_tf32 or math not in WGWINO_LEAST:
        return False
    return any(
        view.Mg * view.Cg >= weights and view.Ho * view.Wo >= pixels
        for weights, pixels in WGWINO_LEAST[math]
    )


# Tried first for fp32 dgrad of windows of 5 taps a row or more, where the forward view's
# zero padding of dy is widest: the 7x7 layers at B=10000 (H200, 2026-11-24, NCHW) in
# 0.74, 1.58, 1.41 and 4.80 ms against stream's and persist's 1.37, 2.73, 2.53 and 8.90
# and cuDNN fp32's 3.21, 4.71, 4.19 and 6.66.
DROW_MIN_TAPS = 5


# Tried in 16-bit math for windows of 5 taps a row or more, where its fit takes the layer
# (channels and maps that fill 3/4 of its k steps and n8 tiles): a pixel's channels side
# by side, a window row's taps x channels one run of k.  bf16 NCHW at B=10000 (H200,
# 2026-11-24): layer2's forward pass 0.354 ms against mmastrip's 0.430, mx-layer2's 0.91
# against mmapersist's 1.15, mx-layer2's dgrad view 1.53 against mmafold's 3.38.  With a
# map's output columns on the n side (shifts, 2026-11-24) it also takes layer2's dgrad
# view (0.83 against mmatoep's 1.09), and fp32 tensors in tf32 (layer2 0.58, mx-layer2
# 1.41 against mmapersist's 0.87 and 1.74).
HWC_MIN_TAPS = 5

# Tried first in 16-bit math for at most this many maps (what kn2row's plan takes
# besides: taps x maps of 64 at most, stride 1, one group), where an implicit GEMM's n
# side is mostly padding and its reduction reads x once per tap.  bf16 NHWC at B=128
# (H200, 2026-11-25): the autoencoder's 256 -> 3 layer in 0.024 ms against flane's 0.100,
# tcgemm's 0.110 and cuDNN's 0.108, and ae-enc1's dgrad (the same view) 0.024 against
# cuDNN's 0.506.
KN2ROW_MAX_MAPS = 8

# Tried in 16-bit math for one map a group and windows of at least this many rows (its
# n side is the window's rows, 8 a tile): the dgrad views of the one-channel 7x7 layers.
# bf16 NCHW at B=10000 (H200, 2026-11-27, cuDNN and the earlier winners in the same run):
# mx-layer1's 0.604 ms against mmahwc's 0.941 and cuDNN's 25.5, layer1's 0.385 against
# mmatoep's 0.406 and cuDNN's 36.0.
ROWS_MIN_TAPS = 5

# The forward strategies, in the order tried; dgrad tries them on its forward view.
# wgplanar: fp32 NCHW layers on wgmma, in place, after the kernels of few channels or
# taps: resnet50's 1x1 forward passes at B=32 (H200, 2026-11-28, tuned) in tf32 in
# 0.017-0.053 ms where tcgemm's and wgmma's in NHWC took 0.060-0.149 with the layout
# moves, against cuDNN tf32's 0.021-0.053; vgg11's at B=32 in 3xTF32, forward passes and
# stride-1 dgrads in sum 7.7 and 7.6 ms where tcgemm's in NHWC took 8.1 and 8.0.
FORWARD = (
    # depthwise layers in channels-last (no other strategy reads them a word at a time)
    "dwlane",
    # and in NCHW, the planes' rows one flat walk: mobilenet_v2's fp32 forward passes and
    # stride-1 dgrads at B=64 (H200, 2026-11-30; 0.011-0.110 ms) at dwplane's fit within
    # 9% of the fastest of dwplane, direct and tiled tuned, its 7x7 layer's in 0.011 ms
    # against direct's tuned 0.041 and cuDNN's 0.030
    "dwplane",
    "kn2row",
    # mmafew: 16-bit channels-last layers of at most 8 channels (the stems), each tile's
    # patch copied once: bf16 on the H200 (2026-11-29, tuned), resnet's 7x7 stem at
    # B=32 in 0.049 ms against mma's 0.139 and cuDNN's 0.228, at 32x32 and B=128 0.0093
    # against 0.0188 and 0.0515; vgg11's 3x3 layer at B=32 0.131 against 0.197 and 0.539
    "mmafew",
    "wgmma",
    "tcgemm",
    "mmarows",
    "mmahwc",
    "mmatoep",
    "mmafold",
    "mmastrip",
    "wgplanar",
    "mmapersist",
    "mma",
    "flane",
    "stream",
    "persist",
    "tiled",
)
PREFERENCE = {
    Op.FPROP: (*FORWARD, "direct"),
    # flane's stride-1 dgrad view of a 3-channel, 256-map layer: 0.103 ms against
    # stream's 0.201 and cuDNN's 0.369 (H200, B=128, fp32 NHWC)
    Op.DGRAD: ("drow", *FORWARD, "phased"),
    # wstrip: 16-bit NCHW layers of few channels on tensor cores (the 7x7 layers' bf16
    # wgrad at B=10000 in 0.38, 0.59, 0.58 and 1.35 ms against wband's 1.67, 5.48, 3.57
    # and 15.5 and cuDNN's 22.3, 3.70, 15.7 and 3.90, H200 2026-11-24)
    # wgwgrad: 16-bit channels-last layers whose maps and channels fill 64-wide tiles, on
    # wgmma (the wide autoencoder layers' bf16 wgrad at B=128 in 0.043 and 0.054 ms
    # against tcwgrad's 0.065 and cuDNN's 0.053-0.057, H200 2026-11-24)
    # wgnchw: fp32 NCHW layers whose maps and channels fill 64-wide tiles, on wgmma (sm_90a;
    # elsewhere tc3wgrad): resnet50's wgrads at B=32 (H200, 2026-11-28) in tf32 in 0.049-
    # 0.074 ms against tc3wgrad's 0.090-0.213 and cuDNN tf32's 0.044-0.090, in fp32 math in
    # 0.082-0.146 ms against tc3wgrad's or wtap's 0.113-0.292 and cuDNN fp32's 0.10-0.32;
    # the 3x3 layer of 7x7 maps keeps wtap's 0.227 in fp32 against wgnchw's 0.264 once tuned
    # wgwino: stride-1 3x3 fp32 NCHW layers of many weights, in the Winograd domain on
    # wgnchw's kernel (WGWINO_LEAST)
    # wfew: 16-bit channels-last layers of at most 8 channels (the stems) over their own
    # channels, each tile's patch and dy copied once, a window row's taps x channels one
    # run of dw's columns, where tcwgrad and tcwhalo take them padded to 8: bf16 on the
    # H200 (2026-11-29, tuned), resnet's 7x7 stem at B=32 in 0.068 ms against tcwgrad's
    # 0.137 and cuDNN's 0.162, at 32x32 and B=128 0.021 against 0.027 and 0.036; vgg11's
    # 3x3 layer at B=32 0.113 against wstrip's 0.491 (in NCHW) and cuDNN's 0.328
    # wgwtma: 1x1 windows whose maps or channels no 64-wide tile divides (wgwgrad
    # refuses), on its ragged tiles.  Its fit beat tcwgrad's on all 13 of
    # efficientnet_b0's and mobilenet_v2's 1x1 bf16 wgrads of that kind at B=64,
    # 0.0107-0.0162 ms against 0.0140-0.0194 (H200, 2026-12-01, tune-ragged-wgrads-*),
    # and on 4 of 4 of other torchvision models' at B=32, 0.010-0.022 against
    # 0.013-0.031; of their 3x3 ones on 2 of 4, 0.020-0.044 against 0.019-0.032
    # (wgwtma-fit-ragged-wgrads-*), so tcwgrad keeps the larger windows
    Op.WGRAD: (
        "wfew",
        "wgwgrad",
        "wgwtma",
        "tcwgrad",
        "tcwhalo",
        "wstrip",
        "wdw",
        "wlane",
        "wgwino",
        "wgnchw",
        "tc3wgrad",
        "wtap",
        "wband",
        "wgemm",
        "wsplit",
    ),
    Op.BGRAD: ("wsplit",),
}


def wide_wgrad(problem: ConvProblem) -> bool:
    """Whether wgemm's register-tiled GEMM leads the wgrad strategies: for many weights,
    and for channels-last layers with maps enough to fill its tiles, where wband's
    per-pixel reads of a channels-last x fall apart (the 3-channel autoencoder layer's
    wgrad: 1.0-1.2 ms in NHWC wband against 0.2 in NCHW, H200).  Never for depthwise
    layers, however many their weights: a group's one map leaves wgemm's tiles empty
    but a row (efficientnet_b0's 5x5 layer of 672 channels over 14x14 maps at B=64,
    fp32 NCHW, H200, 2026-11-29: wgemm 2.73 ms against cuDNN's 0.40, where wtap takes
    its 480-channel sibling in 0.071 against 0.288)."""
    if depthwise(problem):
        return False
    if problem.weight_count > SMALL_WEIGHTS:
        return True
    return problem.layout is TensorLayout.NHWC and problem.Mg >= WGEMM_MIN_MAPS


@dataclass(frozen=True)
class Choice:
    variant: Variant
    source: str  # "tuned", "shipped" or "planned"
    why: str  # one line for the log: where the choice came from and what it measured
    ms: float | None = None  # what a tuned winner measured
    batch: int | None = None  # the batch it measured ``ms`` at


def maths(problem: ConvProblem, allow_tf32: bool) -> tuple[Precision, ...]:
    """The precisions a PyTorch user gets for the problem's dtype, most accurate first."""
    if problem.dtype is DType.FP32:
        return (Precision.FP32, Precision.TF32) if allow_tf32 else (Precision.FP32,)
    own = Precision.FP16 if problem.dtype is DType.FP16 else Precision.BF16
    return (Precision.FP32, own)


def allowed(variant: Variant, problem: ConvProblem, allow_tf32: bool) -> bool:
    """fp16 math off the tensor cores (half2 products and half sums) is refused: it
    rounds more than PyTorch's fp16 convolution, which sums in fp32."""
    if variant.precision not in maths(problem, allow_tf32):
        return False
    return variant.precision in (Precision.FP32, Precision.TF32) or variant.tensor_core


def _plans(problem: ConvProblem, variant: Variant, arch: str | None = None) -> bool:
    """Whether the variant plans for the problem and, given the GPU's architecture,
    compiles for it (wgmma needs sm_90a)."""
    try:
        plan = make_plan(problem, variant)
        if arch:
            plan.target(arch)
    except SpecError:
        return False
    return True


def tuned(problem: ConvProblem, gpu: str, allow_tf32: bool, arch=None) -> Choice | None:
    """The fastest allowed winner tuned for the problem, else for the problem without
    its epilogue (a layer with a bias gets the kernel tuned for its bare convolution)."""
    for spec in dict.fromkeys([problem.spec, _bare(problem).spec]):
        found = _tuned(problem, spec, gpu, allow_tf32, arch)
        if found:
            return found
    return None


def _bare(problem: ConvProblem) -> ConvProblem:
    """The problem without bias and activation (its op keeps what it needs)."""
    return replace(problem, bias=False, act=Act.NONE)


def _fastest(records, problem, allow_tf32, arch=None) -> tuple[dict, Variant] | None:
    """(record, variant) of the fastest winner record whose variant the problem allows
    and plans; None where there is none."""
    picks = []
    for r in records:
        try:
            v = parse_variant_name(r["variant"])
        except SpecError:
            continue
        if allowed(v, problem, allow_tf32) and _plans(problem, v, arch):
            picks.append((r, v))
    return min(picks, key=lambda p: p[0]["ms"], default=None)


def _tuned(problem, spec, gpu, allow_tf32, arch=None) -> Choice | None:
    best = _fastest(tunedb.winners(spec, gpu, problem.batch).values(), problem, allow_tf32, arch)
    if best is None:
        return None
    r, v = best
    what = "" if spec == problem.spec else " of the layer without its epilogue"
    why = f"tuned winner{what}, {r['ms']:.4f} ms at B={r['batch']} ({tunedb.db_path()} line {r['line']})"
    return Choice(v, "tuned", why, r["ms"], r["batch"])


def preset_of(problem: ConvProblem) -> ConvProblem | None:
    """The preset with the problem's geometry, dtype and layout, whatever its epilogue."""
    bare = replace(problem, bias=False, act=Act.NONE, op=Op.FPROP, name="", batch=1)
    for preset in PRESETS.values():
        if replace(preset, name="", batch=1) == bare:
            return preset
    return None


def shipped(problem: ConvProblem, gpu: str, allow_tf32: bool, arch=None) -> Choice | None:
    """A winner specgen ships for the problem on ``gpu``: its preset's (``winners.json``),
    else the layer's from a whole-model tune (``layer_winners.json``)."""
    preset = preset_of(problem)
    if preset is None:
        return shipped_layer(problem, gpu, allow_tf32, arch)
    times = tunedb.shipped_ms(preset.slug, gpu)
    picks = []
    for name in tunedb.shipped_names(preset.slug, gpu):
        base, tags = split_problem_tags(name)
        if tags.get("op", Op.FPROP) is not problem.op:
            continue
        v = parse_variant_name(base)
        if allowed(v, problem, allow_tf32) and _plans(problem, v, arch):
            picks.append((times.get(name, float("inf")), v, name))
    if not picks:
        return None
    ms, v, name = min(picks, key=lambda p: p[0])
    timed = f", {ms:.4f} ms at B={preset.batch}" if ms != float("inf") else ""
    return Choice(v, "shipped", f"shipped winner of preset {preset.slug} on {gpu}{timed}")


def shipped_layer(problem: ConvProblem, gpu: str, allow_tf32: bool, arch=None) -> Choice | None:
    """The fastest allowed winner of the maths a whole-model tune on ``gpu`` found for
    the problem, or for the problem without its epilogue; each was as fast as the
    planner's default or faster there, which was among its candidates."""
    for spec in dict.fromkeys([problem.spec, _bare(problem).spec]):
        winners = tunedb.layer_winners(spec, gpu, problem.batch).values()
        best = _fastest(winners, problem, allow_tf32, arch)
        if best:
            r, v = best
            what = "" if spec == problem.spec else " of the layer without its epilogue"
            cudnn = f", cuDNN {r['cudnn_ms']:.4f}" if r.get("cudnn_ms") else ""
            why = (
                f"shipped winner{what} of a whole-model tune on {gpu}, {r['ms']:.4f} ms "
                f"at B={r['batch']}{cudnn}"
            )
            return Choice(v, "shipped", why, r["ms"], r["batch"])
    return None


def planned(problem: ConvProblem, allow_tf32: bool, arch: str | None = None) -> Choice:
    keys = PREFERENCE[problem.op]
    wide = problem.op is Op.WGRAD and wide_wgrad(problem)
    if wide:  # wgemm's register-tiled GEMM before wband (wide_wgrad)
        keys = tuple(k for k in keys if k != "wband") + ("wband",)
    for key in keys:
        cls = BY_KEY[key]
        # 16-bit tensors on tensor cores in their own dtype: the products are exact and
        # the sums fp32, as accurate as fp32 math on them and what PyTorch computes.
        # Tensor cores take the fastest math allowed first: tf32 where the caller allows
        # it, before fp32 in three tf32 products.
        order = maths(problem, allow_tf32)
        for math in order[::-1] if cls.tensor_core else order[:1]:
            try:
                view = cls.problem_for(problem)
                if key in FEW_CHANNELS and not few_channels(view, math):
                    continue
                if key in FEW_MAPS_TF32 and math is Precision.TF32 and view.Mg < 16:
                    continue
                if key in GEMM_FP32 and math is Precision.FP32 and not gemm_fp32_suits(view):
                    continue
                if key in FEW_MAPS and view.Mg >= WGEMM_MIN_MAPS:
                    continue
                if key == "wdw" and view.W < WDW_MIN_WIDTH:
                    continue
                if key in GROUP_TILED_WGRAD and depthwise(view):
                    continue
                if key in WARP_OF_CHANNELS and view.C < 32:
                    continue
                if key in FEW_CHANNEL_WINDOWS and not (
                    math in (Precision.FP16, Precision.BF16)
                    and view.S >= 5
                    and view.Cg <= FEW_CHANNEL_WINDOWS[key]
                ):
                    continue
                if key == "mmafold" and not fold_suits(view):
                    continue
                if key == "mmatoep" and not toep_suits(view):
                    continue
                if key == "kn2row" and view.Mg > KN2ROW_MAX_MAPS:
                    continue
                if key == "mmahwc" and view.S < HWC_MIN_TAPS:
                    continue
                if key == "mmarows" and (view.Mg != 1 or view.R < ROWS_MIN_TAPS):
                    continue
                # Among the wide layers wtap takes those whose lanes its fit tiles (4 maps x
                # every row of a small window): the autoencoder's 3x3 layers in NCHW, 0.45
                # ms against wgemm's 0.58 (H200, 2026-11-24); wgemm keeps channels-last.
                if key == "wtap" and not (lane_tiled(view) if wide else view.S >= WTAP_MIN_TAPS):
                    continue
                if key == "drow" and view.S < DROW_MIN_TAPS:
                    continue
                if key == "wgwtma" and view.R * view.S > 1:
                    continue
                if key == "wgnchw" and not wgnchw_suits(view, math):
                    continue
                if key == "wgwino" and not wgwino_suits(view, math, allow_tf32):
                    continue
                # wgplanar's strided dgrad (a GEMM a stride phase) in place, tf32 and fp32:
                # in three tf32 products its fit ran 16 of 18 strided dgrads of resnet18 (at
                # 32x32 and 224) and resnet50 faster than tcgemm's tuned winners in NHWC
                # with the layout moves (MOVE_LAUNCH_MS), resnet50's layer4.0.conv2 in 0.157
                # ms against 0.147 + 0.024 (H200, 2026-11-30, tune-wgplanar-fp32-strided-*)
                # tc3wgrad's tf32 (one product a product, in place in NCHW) is tune's to
                # find: the planner keeps tcwgrad's tf32 in NHWC for an NCHW layer
                if key == "tc3wgrad" and (math is not Precision.FP32 or not three_tf32_suits(view)):
                    continue
                v = cls.default(view, math)
            except SpecError:
                continue
            if allowed(v, problem, allow_tf32) and _plans(problem, v, arch):
                return Choice(
                    v, "planned", f"planner default ({key}; untuned: SPECGEN_AUTOTUNE=1 tunes it)"
                )
    for cls in BY_KEY.values():  # anything that computes it at all
        for p in maths(problem, allow_tf32):
            try:
                v = cls.default(cls.problem_for(problem), p)
            except SpecError:
                continue
            if allowed(v, problem, allow_tf32) and _plans(problem, v, arch):
                return Choice(
                    v, "planned", f"planner default ({cls.key}; the only strategy that serves it)"
                )
    raise SpecError(f"no strategy of specgen serves {problem.spec}")


def gemm_fp32_suits(view: ConvProblem) -> bool:
    """Whether tcgemm's or tcwgrad's fp32 math (three tf32 products) is tried for the
    problem ``view``: channels and maps a group enough to pay for the splits."""
    return min(view.Cg, view.Mg) >= GEMM_FP32_MIN


# The wgrad strategy that serves what no other does; its channels-last reads of a few
# channels over a wide window are slow (the first layer of resnet18, 3 channels, 7x7 at
# stride 2, bf16 NHWC at B=64: 5.03 ms against cuDNN's 0.32, H200 2026-11-28).
LAST_RESORT = "wsplit"


def computed_layout(problem: ConvProblem, gpu: str, allow_tf32: bool = False, arch=None):
    """The layout the operator computes ``problem`` in, its tensors copied there and
    back where it is not theirs: NHWC for an NCHW op whose pick there runs faster math
    (``speed_class``: tensor cores, and one product a product where tf32 is allowed);
    NCHW for a channels-last wgrad that only ``wsplit`` takes in place where
    another strategy takes it in NCHW; else, and wherever the pick in place is a tuned
    or shipped winner (the presets', measured there), the problem's own, unless both
    layouts hold measured winners (tuned, or shipped from a whole-model tune) and the
    other's is faster with its tensors moved there and back (``moves_ms`` of
    ``moved_roles``), an image of the batch each was timed at."""
    if problem.op is Op.BGRAD:
        return problem.layout
    found = choose(problem, gpu, allow_tf32, arch)
    other = problem.layout.other
    if found.source != "planned":  # a winner measured on these tensors stays with them,
        # unless the other layout has a faster one measured on the same GPU (a tune that
        # searched each math in the layout the operator computes it in: fp32 in place,
        # tf32 in NHWC, say)
        there = replace(problem, layout=other)
        theirs = tuned(there, gpu, allow_tf32, arch) or shipped_layer(there, gpu, allow_tf32, arch)
        if found.ms is None or theirs is None:
            return problem.layout
        roles = moved_roles(problem, gpu, allow_tf32, arch)
        moved = faster_moved(
            found, theirs, problem.batch, lambda b: moves_ms(replace(problem, batch=b), gpu, roles)
        )
        return other if moved else problem.layout
    here = found.variant
    if problem.layout is TensorLayout.NCHW and speed_class(here) == FASTEST:
        return problem.layout
    if problem.layout is TensorLayout.NHWC and here.key != LAST_RESORT:
        return problem.layout
    try:
        there = choose(replace(problem, layout=other), gpu, allow_tf32, arch).variant
    except SpecError:
        return problem.layout
    if other is TensorLayout.NHWC:
        return other if speed_class(there) > speed_class(here) else problem.layout
    return other if there.key != LAST_RESORT else problem.layout


# What the operator moves between layouts for an op computed in the other one: its
# inputs there, and its output back.  A wgrad's dw is the weights' shape in either, and
# its dy is the dgrad's: where an NCHW layer's dgrad runs in NHWC (no tensor-core dgrad
# reads NCHW but wgplanar, on sm_90a), the backward moves dy once for both where wgrad
# runs there too (``_engine.shared_dy``), so x alone is wgrad's to move; where the dgrad
# runs in place, dy is wgrad's to move too (``moved_roles``).
MOVED = {
    Op.FPROP: (Role.X, Role.Y),
    Op.DGRAD: (Role.DY, Role.DX),
    Op.WGRAD: (Role.X,),
    Op.BGRAD: (),
}

# The least a move costs: one launch of the operator's transpose, whose host time
# (allocating the copy, binding and launching it) is what an eager step waits on where
# a layer's kernels are short.  On an H200 a move took 10-14 us of host time, from
# 256 KB to 100 MB, and back to back the GPU ran them no faster than the host gave them
# (docs/measurements/move-launch-2026-11-30-h200.log); the bytes' own time passes it
# from about 18 MB.  resnet18's tf32 layers at 32x32 (B=128), each moved to NHWC for a
# winner there 0.1-14 us a move faster than the one in place, made the eager step
# 0.82-0.84x cuDNN's; costed so, in place, 0.99-1.00x, its CUDA graph 3% slower
# (docs/measurements/moves-launch-ab-2026-11-30-h200-*.log).
MOVE_LAUNCH_MS = 0.012


def moved_roles(problem: ConvProblem, gpu: str, allow_tf32: bool = False, arch=None) -> tuple:
    """The tensors the operator moves to compute ``problem`` in the other layout
    (``MOVED``), with dy for a wgrad whose layer's dgrad is computed in place, where
    no move of dy for the dgrad serves it too."""
    roles = MOVED[problem.op]
    if problem.op is Op.WGRAD:
        dgrad = replace(problem, op=Op.DGRAD, bias=False)
        try:
            if computed_layout(dgrad, gpu, allow_tf32, arch) is problem.layout:
                return (*roles, Role.DY)
        except SpecError:  # no dgrad kernel there: none moves dy for wgrad either
            return (*roles, Role.DY)
    return roles


def moves_ms(problem: ConvProblem, gpu: str, roles: tuple | None = None) -> float:
    """The ms the operator spends moving the op's tensors (``roles``, else ``MOVED``'s)
    out of the problem's layout into the other one and back, at the problem's batch:
    each read once and written once at the GPU's measured copy rate, else
    ``COPY_RATE``, and at least one launch's ``MOVE_LAUNCH_MS``; none for a tensor
    dense in both layouts (``in_both_layouts``), which is taken as it is."""
    size, rate = problem.dtype.bytes, copy_rate(gpu)
    roles = MOVED[problem.op] if roles is None else roles
    shapes = [role_shape(r, problem, problem.batch) for r in roles]
    return sum(
        max(2 * prod(shape) * size / rate * 1e3, MOVE_LAUNCH_MS)
        for shape in shapes
        if not in_both_layouts(shape, problem.layout)
    )


def in_both_layouts(shape: tuple, layout: TensorLayout) -> bool:
    """Whether a 4-D tensor of ``shape`` (in ``layout``'s order) is dense in both
    layouts at once: one channel, or one pixel a map (resnet18's last layers at
    32x32), where NCHW's and NHWC's orders of its elements are the same."""
    _, *rest = shape
    if layout is TensorLayout.NHWC:
        rest = [rest[2], rest[0], rest[1]]
    channels, pixels = rest[0], rest[1] * rest[2]
    return channels == 1 or pixels == 1


def copy_rate(gpu: str) -> float:
    """Bytes a second, read and written together, of the GPU's measured copies, else
    ``COPY_RATE``."""
    return (measured.ceilings(gpu) or {}).get("copy_bytes_per_s") or COPY_RATE


FASTEST = 2

# A wgrad over fewer channels than this is tried over channels padded with zeros
# (``computed_problem``): a network's first layer, whose three channels no tensor-core
# wgrad takes (resnet50's 7x7 stem in bf16 at B=32: wband's 0.78 ms against cuDNN's 0.18,
# H200 2026-11-28).
PAD_CHANNELS_BELOW = 8
PAD_WIDTHS = (4, 8)  # the channel multiples the tensor-core wgrads read: tf32's, 16-bit's


def cropped(problem: ConvProblem) -> ConvProblem:
    """``problem`` over the taps of its window that meet x: a window wider than the maps
    it slides over (resnet18's 3x3 layers over 1x1 and 2x2 maps at 32x32) has taps that
    read padding alone, wherever the window stands, whose products are zeros in every
    op.  The window is cropped to the rows and columns of taps that meet x, the padding
    shrunk by as much, the output's size unchanged: the forward pass and dgrad run the
    cropped weights (``crop_origin``), wgrad's dw is zero past them.  ``problem`` itself
    where every tap meets x, or where the cropped problem's padding would go below
    zero (a dilated window past small maps) or its dgrad would lose its forward view."""
    if problem.op is Op.BGRAD:
        return problem
    (pt, pb, pl, pr), (sh, sw), (dh, dw) = problem.pads, problem.stride, problem.dil
    rows = _taps_meeting(problem.H, problem.R, sh, dh, pt, problem.Ho)
    cols = _taps_meeting(problem.W, problem.S, sw, dw, pl, problem.Wo)
    if rows == (0, problem.R - 1) and cols == (0, problem.S - 1):
        return problem
    (r0, r1), (s0, s1) = rows, cols
    if r0 > r1 or s0 > s1:  # no tap meets x in some row or column: every output is zero
        return problem
    pads = (
        pt - r0 * dh,
        pb - (problem.R - 1 - r1) * dh,
        pl - s0 * dw,
        pr - (problem.S - 1 - s1) * dw,
    )
    if min(pads) < 0:
        return problem
    small = replace(problem, R=r1 - r0 + 1, S=s1 - s0 + 1, pads=pads, name="")
    if (small.Ho, small.Wo) != (problem.Ho, problem.Wo):
        return problem
    if problem.op is Op.DGRAD and problem.stride == (1, 1):
        try:  # the forward view every forward strategy computes a stride-1 dgrad through
            small.dgrad_view()
        except SpecError:
            return problem
    return small


# A crop that keeps at most this share of the window's taps is always taken; one that
# keeps more only where no winner of the whole window is measured, or the cropped one's
# measured winner is the faster (``_crop_pays``).  resnet18 at 32x32 (B=128, H200,
# 2026-11-30): its 3x3 layers over 1x1 maps, cropped to 1x1 and untuned, ran the fp32
# forward pass in 0.0257 ms against the whole window's shipped winner's 0.0377; its
# layer4.0.conv1 cropped to 2x2 (4 of 9 taps) and untuned, bf16 in 0.0177 against the
# whole window's tuned 0.0078 (``model-resnet18-32-crop-*-d496d5e.log``).
CROP_ALWAYS = 1 / 3


def _crop_pays(whole: ConvProblem, small: ConvProblem, gpu: str, tf32: bool, arch) -> bool:
    """Whether the operator computes ``whole`` as its cropped window ``small``: where
    the crop keeps at most ``CROP_ALWAYS`` of the taps, where no winner of the whole
    window is measured (tuned or shipped), or where the cropped window's measured winner
    takes no longer (``measured_ms``: a whole-model tune times both, ``dist.searched``)."""
    if small.R * small.S <= CROP_ALWAYS * whole.R * whole.S:
        return True
    mine = measured_ms(whole, gpu, tf32, arch)
    if mine is None:
        return True
    theirs = measured_ms(small, gpu, tf32, arch)
    return theirs is not None and theirs <= mine


def measured_ms(p: ConvProblem, gpu: str, tf32: bool, arch=None) -> float | None:
    """The ms an image of ``p``'s fastest measured winner takes (tuned or shipped), in
    its own layout or in the other with the moves (``moves_ms``); None where neither
    layout has one measured."""
    best = None
    for q in (p, replace(p, layout=p.layout.other)):
        try:
            c = choose(q, gpu, tf32, arch)
        except SpecError:
            continue
        if c.source == "planned" or c.ms is None:
            continue
        at = c.batch or p.batch
        ms = c.ms / at + (moves_ms(replace(p, batch=at), gpu) / at if q is not p else 0.0)
        best = ms if best is None else min(best, ms)
    return best


def _taps_meeting(size: int, taps: int, stride: int, dil: int, pad: int, out: int) -> tuple:
    """The first and last tap of a window's row (or column) that meets x's ``size``
    pixels for some output: tap r reads pixel p * stride - pad + r * dil for output p
    of ``out``.  Those between may still meet none (a stride past the maps); they stay."""
    lo = max(0, -(-(pad - (out - 1) * stride) // dil))
    hi = min(taps - 1, (pad + size - 1) // dil)
    return lo, hi


def crop_origin(pads, dil, window, computed: ConvProblem) -> tuple[int, int] | None:
    """The first tap row and column that ``computed`` (a ``computed_problem``) keeps of
    a window of ``window`` (R, S) taps padded by ``pads`` and dilated by ``dil``, where
    it crops that window (``cropped``); else None."""
    if (computed.R, computed.S) == tuple(window):
        return None
    return (pads[0] - computed.pads[0]) // dil[0], (pads[2] - computed.pads[2]) // dil[1]


def computed_problem(
    problem: ConvProblem, gpu: str, allow_tf32: bool = False, arch=None, crop: bool = True
):
    """The problem as the operator computes it: over the taps of its window that meet x
    (``cropped``, where ``_crop_pays``; each op decides for itself), in
    ``computed_layout``'s layout, and a wgrad of fewer than ``PAD_CHANNELS_BELOW``
    channels (one group) over its channels padded with zeros to the first of
    ``PAD_WIDTHS`` whose pick runs faster math (``speed_class``): x is copied there
    with zero channels added, and dw's extra channels, the sums of products with zeros,
    are dropped.  ``crop``: False keeps the window whole (a tune's search of each form)."""
    small = cropped(problem) if crop else problem
    if small is not problem and _crop_pays(problem, small, gpu, allow_tf32, arch):
        problem = small
    here = replace(problem, layout=computed_layout(problem, gpu, allow_tf32, arch))
    if problem.op is not Op.WGRAD or problem.groups != 1 or problem.C >= PAD_CHANNELS_BELOW:
        return here
    found = choose(here, gpu, allow_tf32, arch)
    fast = speed_class(found.variant)
    for width in PAD_WIDTHS:
        if problem.C % width == 0:
            continue
        wide = replace(problem, C=ceil_div(problem.C, width) * width)
        try:
            wide = replace(wide, layout=computed_layout(wide, gpu, allow_tf32, arch))
            padded = choose(wide, gpu, allow_tf32, arch)
            if speed_class(padded.variant) > fast:
                return here if _faster_unpadded(here, found, wide, padded, gpu) else wide
        except SpecError:
            continue
    return here


def _faster_unpadded(
    here: ConvProblem, found: Choice, wide: ConvProblem, padded: Choice, gpu: str
) -> bool:
    """Whether the measured winner of wgrad ``here`` runs faster than the measured one
    of its padded form ``wide`` with the copies that padding takes (``pad_moves_ms``),
    each per image of the batch it was timed at; False where either is unmeasured.  A
    network's first layer in tf32 (H200, 2026-11-30, each op as the layer table times
    it): mobilenet_v2's 3x3 stem at B=64 took 0.242 ms over 4 channels in NHWC on
    tcwgrad's tf32 against 0.172 on wtap's fp32 in place (cuDNN tf32 0.188), resnet50's
    7x7 at B=32 0.299 against 0.239 (cuDNN 0.286)."""
    if found.ms is None or padded.ms is None or "planned" in (found.source, padded.source):
        return False

    def moves(b: int) -> float:
        return pad_moves_ms(replace(here, batch=b), replace(wide, batch=b), gpu)

    return not faster_moved(found, padded, here.batch, moves)


def faster_moved(found: Choice, there: Choice, batch: int, moves) -> bool:
    """Whether measured winner ``there`` with the copies it takes (``moves(its batch)``,
    ms) runs faster than measured winner ``found``, each per image of the batch it was
    timed at (else ``batch``): whole-model tunes of two models may have timed the two
    forms at two batches."""
    at = there.batch or batch
    return (there.ms + moves(at)) / at < found.ms / (found.batch or batch)


def pad_moves_ms(here: ConvProblem, wide: ConvProblem, gpu: str) -> float:
    """The ms the operator spends computing wgrad ``here`` as ``wide``, its channels
    padded (and perhaps in the other layout): x read and written padded, and where the
    layout changes dy read and written there too (a layer of so few channels is a
    network's first, whose input wants no gradient: no dgrad moves dy for it)."""
    size = here.dtype.bytes
    x = prod(role_shape(Role.X, here, here.batch)) + prod(role_shape(Role.X, wide, here.batch))
    dy = 2 * prod(role_shape(Role.DY, here, here.batch)) if wide.layout is not here.layout else 0
    return (x + dy) * size / copy_rate(gpu) * 1e3


def speed_class(v: Variant) -> int:
    """How fast a variant's math runs, coarsely: one tensor-core product a product
    (tf32, fp16, bf16) 2, fp32 in three tf32 products 1, CUDA cores 0.  An NCHW problem
    whose tf32 is allowed but whose pick in place is tc3wgrad's fp32 (a GPU without
    wgmma) runs tcwgrad's tf32 in NHWC: resnet50's wgrads at B=32 took 0.07-0.17 ms on
    cuDNN's tf32 against tc3wgrad's 0.20-0.44 (H200, 2026-11-28)."""
    if not v.tensor_core:
        return 0
    return 1 if v.three_tf32 else FASTEST


def search_floor(problem: ConvProblem, pick: Variant) -> int:
    """The slowest math a tune of ``problem`` searches (``tune.prune``), given its
    untuned pick: the pick's speed class, since slower math does not win, except for
    layers of one channel a group (depthwise), whose GEMMs are a window's taps deep and
    a few maps wide, where the tensor cores' tiles idle and the CUDA-core kernels
    (``dwlane``, ``wlane``) may win."""
    if depthwise(problem):
        return 0
    return speed_class(pick)


def searched_math(problem: ConvProblem, precision: Precision, floor: int) -> bool:
    """Whether a tune searches ``problem`` in ``precision`` from ``floor`` (its
    ``search_floor``): every math but fp32 for 16-bit tensors whose pick is on their own
    tensor cores, which is slower and never picked.  The Dask tune (``dist.searched``)
    and the operator's autotune (``_engine.tuned_maths``) both ask."""
    return not (
        precision is Precision.FP32 and problem.dtype is not DType.FP32 and floor == FASTEST
    )


def choose(problem: ConvProblem, gpu: str, allow_tf32: bool = False, arch=None) -> Choice:
    """The kernel for ``problem`` on ``gpu`` (a device name as ``bench.device_name``;
    ``arch``, its architecture, keeps out kernels it cannot run)."""
    return (
        tuned(problem, gpu, allow_tf32, arch)
        or shipped(problem, gpu, allow_tf32, arch)
        or planned(problem, allow_tf32, arch)
    )


def best_picks(shape: ConvProblem, gpu: str) -> list[tuple[Variant, str | None]]:
    """(variant, banner note) for each precision's winner on ``gpu``: this machine's
    database first, else the winners shipped for that GPU, else nothing.  All or
    nothing: a recorded winner that the planner now refuses is an error that names its
    database line."""
    found = tunedb.winners(shape.spec, gpu, shape.batch)
    if not found:
        shipped = tunedb.shipped_names(shape.slug, gpu) if shape.name else []
        ours = [split_problem_tags(n) for n in shipped]  # winners are per op
        return [
            (parse_variant_name(base), None)
            for base, tags in ours
            if tags.get("op", Op.FPROP) is shape.op
        ]
    picks = []
    for r in found.values():
        try:
            v = parse_variant_name(r["variant"])
            make_plan(shape, v)
        except SpecError as e:
            raise SpecError(
                f"{tunedb.db_path()} line {r['line']}: the recorded winner '{r['variant']}' "
                f"cannot be planned any more ({e}); run specgen tune again"
            ) from None
        tie = f", a tie with {r['runner_up']}" if r.get("tie") else ""
        note = f"tuned winner: {r['ms']:.4f} ms at B={r['batch']} on {r['gpu']}, {r['date']}{tie}"
        picks.append((v, note))
    return picks
