"""CPU tier: which kernel the PyTorch operator gets for a problem, and the lock that
makes several processes tune a new problem once."""

import json
import multiprocessing
import time
from dataclasses import replace

import pytest

from specgen import tunedb
from specgen.choose import allowed, choose, maths, planned, preset_of
from specgen.errors import SpecError
from specgen.plan import make_plan
from specgen.shapes import PRESETS, Act, ConvProblem, DType, Op, TensorLayout, parse_shape
from specgen.strategies import parse_variant_name
from specgen.variants import Precision
from tuned import H200, winner


@pytest.fixture(autouse=True)
def empty_db(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path))


def test_fp32_tensors_get_tf32_only_where_allowed():
    p = PRESETS["layer2"]
    assert maths(p, False) == (Precision.FP32,)
    assert maths(p, True) == (Precision.FP32, Precision.TF32)
    assert choose(p, H200, False).variant.precision is Precision.FP32
    # The shipped tf32 winner of layer2 is three times as fast as its fp32 one.
    assert choose(p, H200, True).variant.name == "mmahwc_t34_r32x64_s2_v1_k1_tf32"


def test_half2_arithmetic_is_never_chosen_for_a_pytorch_user():
    """The direct family's fp16 math sums in half; PyTorch's fp16 convolution does not."""
    p = replace(PRESETS["layer1"], dtype=DType.FP16)
    half2 = parse_variant_name("tiled_t16_x4y1m4_planar_wconst_uc_fp16")
    assert not allowed(half2, p, True)
    assert allowed(parse_variant_name("mma_t64_fp16"), p, True)
    assert not allowed(parse_variant_name("mma_t64_bf16"), p, True)  # not its dtype


def test_a_preset_with_an_epilogue_gets_the_preset_winner():
    p = replace(PRESETS["ae-enc2"], bias=True, act=Act.RELU, name="", batch=7)
    assert preset_of(p).name == "ae-enc2"
    c = choose(p, H200)
    assert (c.source, c.variant.name) == ("shipped", "stream_t16_m128_c16_r8x8_fp32")
    make_plan(p, c.variant)
    # The same geometry in another layout is another problem: no shipped winner.
    assert preset_of(replace(p, layout=TensorLayout.NHWC)) is None


def test_shipped_winners_are_per_op_and_per_gpu():
    p = PRESETS["layer1"]
    assert choose(p.with_op(Op.WGRAD), H200).variant.key == "wtap"
    assert choose(p.with_op(Op.DGRAD), H200).variant.key == "drow"
    assert choose(p, "NVIDIA H100 80GB HBM3").source == "planned"


def test_this_gpus_tuned_winner_comes_first_and_the_fastest_allowed_math_wins():
    p = PRESETS["ae-enc2"]
    winner(p, "tiled_t8_x4y1m16_inter_wglobal_lc_fp32", 0.9, "fp32")
    winner(p, "mma_t64_tf32", 0.5, "tf32")
    winner(p, "direct_t16_x4y1m16_wglobal_lc_fp32", 0.1, "fp32", gpu="another GPU")
    assert choose(p, H200, False).variant.name == "tiled_t8_x4y1m16_inter_wglobal_lc_fp32"
    assert choose(p, H200, False).source == "tuned"
    assert choose(p, H200, True).variant.name == "mma_t64_tf32"


def test_an_unplannable_tuned_winner_is_passed_over():
    p = PRESETS["ae-enc2"]
    winner(p, "mmapersist_t40_r16x48_tf32", 0.1, "tf32")  # does not fit this problem
    assert choose(p, H200, True).source == "shipped"


@pytest.mark.parametrize(
    "spec",
    [
        "C=6,M=10,H=13,W=11,K=3x2,pad=1,stride=2,dil=1x2,groups=2,bias=1",
        "C=4,M=4,H=9,W=9,K=3,pad=1,groups=4,dtype=bf16,layout=nhwc",
        "C=64,M=64,H=8,W=8,K=1,pad=0,dtype=fp16",
    ],
)
def test_every_op_of_an_odd_problem_gets_a_plannable_default(spec):
    base = parse_shape(spec)
    for op in Op:
        p = base.with_op(op)
        p = replace(p, bias=True) if op is Op.BGRAD else p
        c = choose(p, H200, True)
        assert c.source == "planned"
        assert allowed(c.variant, p, True)
        make_plan(p, c.variant)


def test_wgrad_default_follows_the_weight_count():
    narrow = ConvProblem(C=3, M=64, H=32, W=32, R=3, S=3, pads=(1, 1, 1, 1), op=Op.WGRAD)
    wide = replace(narrow, C=256, M=256)
    # NCHW fp32 3x3 windows over maps enough for m16 tiles: three tf32 products each
    assert choose(narrow, "some GPU").variant.key == "tc3wgrad"
    # maps and channels that fill wgmma's 64-wide tiles: wgnchw on sm_90a, whose copies
    # are a pixel a lane, so any width; tc3wgrad on the GPUs without wgmma; wgwino's
    # Winograd domain on wgnchw's kernel from 256 x 512 weights over 14x14 maps, or from
    # 128 x 256 over 16x16
    fourteen = replace(wide, H=14, W=14)
    assert choose(fourteen, "some GPU").variant.key == "wgnchw"
    assert choose(fourteen, "some GPU").variant.precision is Precision.FP32
    assert choose(replace(fourteen, M=512), "some GPU").variant.key == "wgwino"
    assert choose(wide, "some GPU").variant.key == "wgwino"
    assert choose(replace(wide, W=30), "some GPU").variant.key == "wgwino"
    assert choose(replace(wide, C=128, M=128), "some GPU").variant.key == "wgnchw"
    assert choose(replace(wide, C=128), "some GPU").variant.key == "wgwino"
    assert choose(wide, "some GPU", arch="sm_80").variant.key == "tc3wgrad"
    # a window over outputs of fewer pixels than two of its rows: wtap's CUDA cores in
    # fp32 math, but wgwino's three products from 512 x 512 weights, and its tf32 where
    # allowed; a 1x1 window keeps wgnchw
    small = replace(wide, H=7, W=7, C=512, M=512)
    assert choose(replace(small, C=256), "some GPU").variant.key == "wtap"
    assert choose(small, "some GPU").variant.key == "wgwino"
    assert choose(small, "some GPU").variant.precision is Precision.FP32
    assert choose(small, "some GPU", True).variant.key == "wgwino"
    assert choose(replace(small, R=1, S=1, pads=(0,) * 4), "some GPU").variant.key == "wgnchw"
    # without them (a row of pixels tc3wgrad cannot copy 16 bytes at a time): wband for
    # few weights, wtap's lanes of 4 maps x 3 rows for many
    assert choose(replace(narrow, W=30), "some GPU").variant.key == "wband"
    assert choose(replace(wide, W=30), "some GPU", arch="sm_80").variant.key == "wtap"
    assert choose(replace(wide, W=30), "some GPU", arch="sm_80").variant.regtile == (4, 3)
    five = replace(wide, R=5, S=5, pads=(2,) * 4)
    assert choose(five, "some GPU", arch="sm_80").variant.key == "wgemm"
    # channels-last wide layers: tcwgrad's three tf32 products, wgemm past what it takes
    nhwc = replace(wide, layout=TensorLayout.NHWC)
    assert choose(nhwc, "some GPU").variant.name.startswith("tcwgrad_")
    assert choose(nhwc, "some GPU").variant.precision is Precision.FP32
    assert choose(replace(nhwc, C=254), "some GPU").variant.key == "wgemm"  # 4 at a copy
    # channels-last: wgemm as soon as its map tiles fill, wband below that
    assert choose(replace(narrow, layout=TensorLayout.NHWC), "some GPU").variant.key == "wgemm"
    few_maps = replace(narrow, C=256, M=3, layout=TensorLayout.NHWC)
    assert choose(few_maps, "some GPU").variant.key == "wlane"
    assert choose(few_maps, "some GPU", True).variant.key == "wlane"  # tcwgrad: 3 maps
    assert choose(replace(few_maps, layout=TensorLayout.NCHW), "some GPU").variant.key == "wband"
    # fp32 NCHW windows of 5 taps a row or more: a lane per (map, window row)
    seven = replace(narrow, M=16, R=7, S=7, pads=(0, 0, 0, 0))
    assert choose(seven, "some GPU").variant.key == "wtap"
    assert choose(replace(seven, dtype=DType.BF16), "some GPU").variant.key != "wtap"
    # wlane's sums are a channel's maps x taps: past its registers, and for maps enough
    # to fill wgemm's tiles even where they would fit (a 1x1 window), it is passed over
    wide_window = replace(few_maps, M=12, R=5, S=5, pads=(2, 2, 2, 2))
    assert choose(wide_window, "some GPU").variant.key != "wlane"
    pointwise = replace(few_maps, M=32, R=1, S=1, pads=(0, 0, 0, 0))
    assert choose(pointwise, "some GPU").variant.key == "tcwgrad"  # 32 maps: three tf32s
    assert choose(replace(pointwise, M=24), "some GPU").variant.key == "wgemm"


def _hold(key, seconds, path):
    with tunedb.locked(key):
        with open(path, "a") as f:
            f.write(f"in {time.time()}\n")
        time.sleep(seconds)
        with open(path, "a") as f:
            f.write(f"out {time.time()}\n")


def test_the_tuning_lock_lets_one_process_in_at_a_time(tmp_path):
    log = tmp_path / "log"
    ctx = multiprocessing.get_context("fork")
    procs = [ctx.Process(target=_hold, args=("C=1,M=1", 0.3, log)) for _ in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(10)
    events = [line.split()[0] for line in log.read_text().splitlines()]
    assert events == ["in", "out"] * 3  # never two inside at once


def test_the_lock_of_another_problem_does_not_wait(tmp_path):
    with tunedb.locked("C=1,M=1"):
        start = time.time()
        with tunedb.locked("C=2,M=2"):
            pass
        assert time.time() - start < 1


def test_a_problem_nothing_serves_is_one_error():
    with pytest.raises(SpecError):
        parse_shape("C=3,M=4,H=4,W=4,K=7,pad=0")  # refused before any choice
    assert json.loads(tunedb.SHIPPED.read_text())["ms"][H200]["layer2"]


def test_a_layer_with_a_bias_gets_the_winner_tuned_for_its_bare_convolution():
    bare = PRESETS["ae-enc2"].with_op(Op.WGRAD)
    winner(bare, "wgemm_b128x128_k8_s58_fp32", 0.5, "fp32")
    with_bias = replace(bare, bias=True, name="")
    c = choose(with_bias, H200)
    assert (c.source, c.variant.name) == ("tuned", "wgemm_b128x128_k8_s58_fp32")
    assert "without its epilogue" in c.why
    make_plan(with_bias, c.variant)


def test_fp32_channels_last_goes_to_tf32_tensor_cores_only_where_allowed_and_wide():
    wide = parse_shape("C=256,M=128,H=16,W=16,K=3,pad=1,bias=1,layout=nhwc")
    assert planned(wide, allow_tf32=True, arch="sm_90").variant.name.startswith("wgmma_")
    assert planned(wide, allow_tf32=True, arch="sm_80").variant.name.startswith("tcgemm_")
    assert planned(wide, allow_tf32=True).variant.precision is Precision.TF32
    assert planned(wide, allow_tf32=False).variant.precision is Precision.FP32
    three_maps = parse_shape("C=256,M=3,H=32,W=32,K=3,pad=1,bias=1,layout=nhwc")
    assert planned(three_maps, allow_tf32=True).variant.key == "flane"
    assert planned(three_maps, allow_tf32=False).variant.key == "flane"
    # a lane a channel: with fewer than 32 channels, or in NCHW, stream keeps the layer
    assert planned(replace(three_maps, C=16), allow_tf32=False).variant.key == "stream"
    nchw = replace(three_maps, layout=TensorLayout.NCHW)
    assert planned(nchw, allow_tf32=False).variant.key == "stream"


def test_few_channels_in_channels_last_fp32():
    """The autoencoder's 3-channel layer in channels-last fp32: mma's tf32 where tf32 is
    allowed (tcgemm cannot copy 3 channels), else stream shaped for few channels; its
    dgrad view (dy of 3 channels) the same."""
    enc1 = parse_shape("C=3,M=256,H=32,W=32,K=3,pad=1,bias=1,layout=nhwc")
    c = choose(enc1, "some GPU", True)
    assert (c.variant.key, c.variant.precision) == ("mma", Precision.TF32)
    c = choose(enc1, "some GPU", False)
    assert c.variant.key == "stream" and (c.variant.maps, c.variant.chunk) == (16, 1)
    dec3 = parse_shape("C=256,M=3,H=32,W=32,K=3,pad=1,layout=nhwc,op=dgrad")
    assert choose(dec3, "some GPU", True).variant.key == "mma"
    nchw = replace(enc1, layout=TensorLayout.NCHW)
    assert choose(nchw, "some GPU", True).variant.key != "mma"  # measured in NHWC only
    # enc1's own dgrad view is the 256-channel, 3-map convolution flane spreads over lanes
    enc1_dgrad = enc1.with_op(Op.DGRAD)
    assert choose(enc1_dgrad, "some GPU", False).variant.key == "flane"
    assert choose(enc1_dgrad, "some GPU", True).variant.key == "flane"


def test_16bit_few_channel_windows_go_to_the_strip_and_flat_tensor_core_kernels():
    """The 16-bit 7x7 layers (NCHW): mmahwc where channels and maps fill 3/4 of its k
    steps and n8 tiles, or half its multiplies with a map's output columns on the n side
    (layer2's dgrad view, 4 maps over 16 channels), mmatoep for at most 4 maps over
    fewer channels, mmafold
    where the maps fill at most half of an n8 tile, mmastrip for few channels, the rest
    as before; 3x3 windows are not offered them, fp32 tensors only mmahwc in tf32."""
    key = lambda spec: planned(parse_shape(spec), allow_tf32=True).variant.key  # noqa: E731
    assert key("C=1,M=4,H=86,W=86,K=7,dtype=bf16") == "mmafold"  # 4 maps
    assert key("C=4,M=16,H=40,W=40,K=7,dtype=fp16") == "mmahwc"
    assert key("C=1,M=12,H=72,W=72,K=7,dtype=bf16") == "mmastrip"  # 12 maps fill 3/4
    assert key("C=12,M=24,H=33,W=33,K=7,dtype=bf16") == "mmahwc"
    assert key("C=2,M=16,H=40,W=40,K=7,dtype=bf16") == "mmastrip"  # 2 of 4 channels real
    # the dgrad views: 4 maps over 16 channels, 12 maps over 24, one map over 4 and 12
    assert key("C=4,M=16,H=40,W=40,K=7,dtype=bf16,op=dgrad") == "mmahwc"
    assert key("C=12,M=24,H=33,W=33,K=7,dtype=bf16,op=dgrad") == "mmahwc"
    assert key("C=12,M=24,H=20,W=20,K=3,pad=1,dtype=bf16") != "mmahwc"  # 3x3: unmeasured
    # one map: its window rows on mmarows' n side (mx-layer1's view 0.604 ms against
    # mmahwc's 0.941, layer1's 0.385 against mmatoep's 0.406, B=10000, H200)
    assert key("C=1,M=4,H=86,W=86,K=7,dtype=fp16,op=dgrad") == "mmarows"
    assert key("C=1,M=12,H=72,W=72,K=7,dtype=bf16,op=dgrad") == "mmarows"
    # two maps, or 3-row windows: not mmarows
    assert key("C=2,M=12,H=72,W=72,K=7,dtype=bf16,op=dgrad") != "mmarows"
    assert key("C=1,M=12,H=72,W=72,K=3,pad=1,dtype=bf16,op=dgrad") != "mmarows"
    # windows past 8 rows do not fit its n8 tile, nor past 9 taps a row mmatoep's k16 step
    assert key("C=1,M=4,H=86,W=86,K=11,dtype=bf16,op=dgrad") not in ("mmarows", "mmatoep")
    assert key("C=4,M=16,H=40,W=40,K=7") not in ("mmastrip", "mmapersist", "mmafold")
    # fp32 tensors where tf32 is allowed: mmahwc in tf32 (layer2 0.576 ms against
    # mmapersist's 0.872, B=10000, H200)
    v = planned(parse_shape("C=4,M=16,H=40,W=40,K=7"), allow_tf32=True).variant
    assert v.key == "mmahwc" and v.precision is Precision.TF32
    assert key("C=3,M=64,H=32,W=32,K=3,pad=1,dtype=bf16") not in ("mmastrip", "mmafold")
    v = planned(parse_shape("C=1,M=4,H=86,W=86,K=7,dtype=bf16"), allow_tf32=False).variant
    assert v.precision is Precision.BF16


def test_16bit_channels_last_layers_of_few_maps_go_to_kn2row():
    """The autoencoder's 256 -> 3 layer in bf16 and fp16 NHWC, and the dgrad view of its
    3 -> 256 first layer (the same GEMM): every tap a column of kn2row's product; with
    more than 8 maps, or in fp32 or NCHW, not."""
    for dtype in ("bf16", "fp16"):
        dec3 = parse_shape(f"C=256,M=3,H=32,W=32,K=3,pad=1,bias=1,dtype={dtype},layout=nhwc")
        assert planned(dec3, allow_tf32=True, arch="sm_90").variant.key == "kn2row"
        enc1_dgrad = parse_shape(f"C=3,M=256,H=32,W=32,K=3,pad=1,dtype={dtype},layout=nhwc")
        c = planned(enc1_dgrad.with_op(Op.DGRAD), allow_tf32=True, arch="sm_90")
        assert c.variant.key == "kn2row"
        assert planned(replace(dec3, M=16), allow_tf32=True).variant.key != "kn2row"
    fp32 = parse_shape("C=256,M=3,H=32,W=32,K=3,pad=1,layout=nhwc")
    assert planned(fp32, allow_tf32=True).variant.key != "kn2row"
    nchw = parse_shape("C=256,M=3,H=32,W=32,K=3,pad=1,dtype=bf16")
    assert planned(nchw, allow_tf32=True).variant.key != "kn2row"
    c = choose(replace(PRESETS["ae-dec3-bf16"], bias=True), "NVIDIA H200", True)
    assert (c.source, c.variant.key) == ("shipped", "kn2row")


def test_the_layout_an_op_is_computed_in():
    """computed_layout: an NCHW op whose pick there runs slower math than its NHWC
    twin's goes to NHWC (CUDA cores below three tf32 products, those below one where
    tf32 is allowed); a channels-last wgrad that only wsplit takes goes to NCHW; the
    rest stays where its tensors are: a wide forward pass and dgrad on wgmma
    (wgplanar, strided too), in NHWC where wgmma is not."""
    from specgen.choose import computed_layout

    wide = ConvProblem(C=64, M=128, H=28, W=28, R=3, S=3, pads=(1,) * 4, batch=32)
    gpu, nchw, nhwc = "some GPU", TensorLayout.NCHW, TensorLayout.NHWC
    for op in (Op.FPROP, Op.DGRAD):
        for tf32 in (False, True):
            assert computed_layout(replace(wide, op=op), gpu, tf32) is nchw
            assert computed_layout(replace(wide, op=op), gpu, tf32, arch="sm_80") is nhwc
        strided = replace(wide, op=op, stride=(2, 2))
        # wgplanar takes a strided forward pass, and a strided dgrad (a GEMM a stride
        # phase) in tf32 and in three tf32 products
        assert computed_layout(strided, gpu, allow_tf32=True) is nchw
        assert computed_layout(strided, gpu) is nchw
        assert computed_layout(strided, gpu, allow_tf32=True, arch="sm_80") is nhwc
        assert computed_layout(replace(strided, dtype=DType.BF16), gpu) is nhwc
        assert computed_layout(replace(strided, layout=nhwc), gpu) is nhwc
    wgrad = replace(wide, op=Op.WGRAD)
    assert computed_layout(wgrad, gpu) is nchw  # wgnchw's three tf32 products in place
    assert computed_layout(wgrad, gpu, allow_tf32=True) is nchw  # and its tf32
    assert computed_layout(replace(wgrad, W=30), gpu) is nchw  # a pixel a lane
    # without wgmma: tc3wgrad in place, tcwgrad's tf32 in NHWC, NHWC where tc3wgrad's
    # copies of 4 pixels do not fit the rows
    assert computed_layout(wgrad, gpu, arch="sm_80") is nchw
    assert computed_layout(wgrad, gpu, allow_tf32=True, arch="sm_80") is nhwc
    assert computed_layout(replace(wgrad, W=30), gpu, arch="sm_80") is nhwc
    few = ConvProblem(C=3, M=64, H=64, W=64, R=7, S=7, stride=(2, 2), pads=(3,) * 4)
    first = replace(few, op=Op.WGRAD, dtype=DType.BF16, layout=nhwc, batch=32)
    assert choose(first, gpu).variant.key == "wfew"  # 64 maps: on the tensor cores in place
    assert computed_layout(first, gpu) is nhwc
    odd = replace(first, M=40)  # maps wfew's 16-map loads do not take
    assert choose(odd, gpu).variant.key == "wsplit"
    assert computed_layout(odd, gpu) is nchw
    assert computed_layout(replace(few, batch=32), gpu) is nchw  # no tensor core in NHWC
    assert computed_layout(replace(wide, op=Op.BGRAD, bias=True), gpu) is nchw


def test_a_few_channel_wgrad_is_computed_over_padded_channels_on_the_tensor_cores():
    """computed_problem: a first layer's wgrad (3 channels) that no tensor-core wgrad takes
    as it is is computed over channels padded to 8 in 16 bits (maps that are not a
    multiple of 16, which wfew's loads do not take) and to 4 in tf32, where the pick runs
    on the tensor cores; a 16-bit stem of 64 maps keeps its channels on wfew, as do its
    forward and dgrad, a wgrad that padding would not speed (fp32 math, CUDA cores either
    way), grouped layers and layers of 8 channels; 3x3 stems (mobilenet_v2's) as 7x7 ones."""
    from specgen.choose import computed_problem, speed_class

    gpu, nhwc = "some GPU", TensorLayout.NHWC
    stem = ConvProblem(C=3, M=64, H=224, W=224, R=7, S=7, stride=(2, 2), pads=(3,) * 4, batch=32)
    bf16 = replace(stem, dtype=DType.BF16, layout=nhwc)
    for first, tf32, width in ((replace(bf16, M=40), False, 8), (stem, True, 4)):
        q = computed_problem(replace(first, op=Op.WGRAD), gpu, tf32)
        assert (q.C, q.layout, q.op) == (width, nhwc, Op.WGRAD)
        assert speed_class(choose(q, gpu, tf32).variant) == 2
        assert speed_class(choose(replace(first, op=Op.WGRAD), gpu, tf32).variant) == 0
    for op in (Op.FPROP, Op.DGRAD):
        assert computed_problem(replace(bf16, op=op), gpu).C == 3
    wgrad = replace(bf16, op=Op.WGRAD)
    assert computed_problem(wgrad, gpu) == wgrad and choose(wgrad, gpu).variant.key == "wfew"
    assert computed_problem(replace(stem, op=Op.WGRAD), gpu).C == 3  # fp32 math
    eight = replace(bf16, C=8, op=Op.WGRAD)
    assert computed_problem(eight, gpu) == eight
    grouped = replace(bf16, C=6, M=6, groups=3, op=Op.WGRAD)
    assert computed_problem(grouped, gpu).C == 6
    three = replace(bf16, M=40, R=3, S=3, pads=(1,) * 4, op=Op.WGRAD)
    assert computed_problem(three, gpu).C == 8


def test_a_measured_winner_keeps_the_tensors_layout():
    """The presets' shipped winners were measured on their tensors' layout: the
    operator computes them there, whatever the other layout's planner default (the
    autoencoder's wide NCHW layers would otherwise move to tcgemm in NHWC where wgmma
    is not)."""
    from specgen.choose import computed_layout

    for name in ("ae-enc2", "ae-dec2", "ae-dec1"):
        p = PRESETS[name]
        assert choose(p, "NVIDIA H200").source == "shipped", name
        assert computed_layout(p, "NVIDIA H200") is TensorLayout.NCHW, name
        assert computed_layout(p, "another GPU", arch="sm_80") is TensorLayout.NHWC, name


def test_winners_in_both_layouts_the_faster_one_decides():
    """A whole-model tune records an fp32 layer's fp32 winner where fp32 runs (NCHW,
    in place) and its tf32 winner where tf32 runs (NHWC): with tf32 allowed the operator
    goes where the faster one is, and without it stays with the fp32 winner."""
    from specgen.choose import computed_layout, planned

    gpu, nchw, nhwc = "Test GPU", TensorLayout.NCHW, TensorLayout.NHWC
    wgrad = ConvProblem(C=64, M=128, H=28, W=28, R=3, S=3, pads=(1,) * 4, batch=32, op=Op.WGRAD)
    there = replace(wgrad, layout=nhwc)
    fp32, tf32 = planned(wgrad, False).variant, planned(there, True).variant
    assert (fp32.precision.value, tf32.precision.value) == ("fp32", "tf32")
    winner(wgrad, fp32.name, 0.30, "fp32", gpu)
    winner(there, tf32.name, 0.10, "tf32", gpu)
    assert computed_layout(wgrad, gpu) is nchw
    assert computed_layout(wgrad, gpu, allow_tf32=True) is nhwc
    winner(there, tf32.name, 0.50, "tf32", gpu)  # the latest counts: now slower than in place
    assert computed_layout(wgrad, gpu, allow_tf32=True) is nchw


def test_depthwise_channels_last_layers_go_to_dwlane():
    """MobileNetV2's depthwise layers in bf16 NHWC, forward and dgrad (its forward view
    at stride 1, the gather at 2); NCHW stays with the planar kernels."""
    spec = "C=144,M=144,H=56,W=56,K=3,pad=1,groups=144,dtype=bf16,layout=nhwc"
    for s in (spec, spec + ",op=dgrad", spec.replace("pad=1", "pad=1,stride=2") + ",op=dgrad"):
        assert planned(parse_shape(s), allow_tf32=False).variant.key == "dwlane", s
    nchw = parse_shape(spec.replace(",layout=nhwc", ""))
    assert planned(nchw, allow_tf32=False).variant.key != "dwlane"


def test_a_depthwise_wgrad_is_not_tiled_over_its_groups_maps_on_the_tensor_cores():
    """mobilenet_v2's depthwise wgrads (one channel and one map a group) go to wdw or
    wlane (a band of rows a block, a lane a channel), not to a tensor-core wgrad whose
    tiles span a group's maps and channels (one useful row of 16); a grouped layer of 8
    channels a group still may."""
    from specgen.choose import GROUP_TILED_WGRAD

    nhwc = TensorLayout.NHWC
    for C, H, stride in ((32, 112, 1), (144, 56, 1), (144, 56, 2), (960, 7, 1)):
        dw = ConvProblem(
            C=C,
            M=C,
            H=H,
            W=H,
            R=3,
            S=3,
            pads=(1,) * 4,
            stride=(stride,) * 2,
            groups=C,
            dtype=DType.BF16,
            layout=nhwc,
            op=Op.WGRAD,
            batch=64,
        )
        assert choose(dw, "some GPU").variant.key in ("wdw", "wlane"), C
    grouped = ConvProblem(
        C=64,
        M=64,
        H=28,
        W=28,
        R=3,
        S=3,
        pads=(1,) * 4,
        groups=8,
        dtype=DType.BF16,
        layout=nhwc,
        op=Op.WGRAD,
        batch=64,
    )
    assert choose(grouped, "some GPU").variant.key in GROUP_TILED_WGRAD


def test_a_depthwise_wgrad_of_many_weights_is_not_a_gemm():
    """efficientnet_b0's and convnext's NCHW depthwise layers of more than SMALL_WEIGHTS
    weights (5x5 over 672 and 1152 channels, 7x7 over 768) go where their narrower
    siblings go, wtap, not to wgemm's tiles, which a group's one map leaves empty but a
    row; a dense layer of as many weights still counts as wide."""
    from specgen.choose import SMALL_WEIGHTS, wide_wgrad
    from specgen.shapes import parse_shape

    for spec in (
        "C=672,M=672,H=14,W=14,K=5,pad=2,groups=672,op=wgrad",
        "C=672,M=672,H=14,W=14,K=5,pad=2,stride=2,groups=672,op=wgrad",
        "C=1152,M=1152,H=7,W=7,K=5,pad=2,groups=1152,op=wgrad",
        "C=768,M=768,H=7,W=7,K=7,pad=3,groups=768,bias=1,op=wgrad",
    ):
        p = parse_shape(spec)
        assert p.weight_count > SMALL_WEIGHTS and not wide_wgrad(p)
        for tf32 in (False, True):
            assert choose(p, "some GPU", tf32).variant.key == "wtap", (spec, tf32)
    dense = parse_shape("C=64,M=64,H=14,W=14,K=5,pad=2,op=wgrad")
    assert dense.weight_count > SMALL_WEIGHTS and wide_wgrad(dense)


def test_every_shipped_layer_winner_plans_for_its_problem():
    """layer_winners.json stays in step with the planner: each winner a whole-model tune
    shipped is a variant that plans for the problem it was tuned on (as generated/ is
    kept in step with the templates)."""
    from specgen.plan import make_plan
    from specgen.shapes import parse_shape
    from specgen.strategies import parse_variant_name

    shipped = json.loads(tunedb.LAYER_WINNERS.read_text())
    assert shipped["tunes"] and shipped["winners"]
    for gpu, table in shipped["winners"].items():
        for spec, by_math in table.items():
            p = parse_shape(spec)
            for math, at_batches in by_math.items():
                batches = [r["batch"] for r in at_batches]
                assert batches == sorted(set(batches)), (spec, math, batches)
                for r in at_batches:
                    v = parse_variant_name(r["variant"])
                    assert v.precision.value == math, (spec, r["variant"])
                    make_plan(replace(p, batch=r["batch"]), v)


def test_a_models_layer_takes_the_winner_its_tune_shipped_for_that_gpu():
    """resnet50's stem in fp32: the winner of its whole-model tune on the H200 (tiled with
    its weights in global memory, 0.31 ms against the planner's 0.96 in that tune's
    finals), the planner's default elsewhere; with tf32 allowed, a wgrad tuned in place
    in both maths stays there, on its shipped tf32 winner."""
    from specgen.choose import computed_layout, computed_problem

    stem = ConvProblem(C=3, M=64, H=224, W=224, R=7, S=7, stride=(2, 2), pads=(3,) * 4)
    c = choose(stem, H200)
    assert c.source == "shipped" and "whole-model tune" in c.why
    assert c.variant.name == "tiled_t16_x4y1m8_planar_wglobal_lc_fp32"
    assert choose(stem, "NVIDIA H100").source == "planned"
    wgrad = ConvProblem(C=256, M=256, H=14, W=14, R=3, S=3, pads=(1,) * 4, op=Op.WGRAD)
    assert choose(wgrad, H200).source == "shipped"
    assert computed_layout(wgrad, H200) is TensorLayout.NCHW
    assert computed_layout(wgrad, H200, allow_tf32=True) is TensorLayout.NCHW
    q = computed_problem(wgrad, H200, True)
    tf32 = tunedb.layer_winners(q.spec, H200)["tf32"]["variant"]
    assert tf32.startswith("wgnchw") and choose(q, H200, True).variant.name == tf32


def test_a_tune_skips_fp32_math_only_for_16_bit_tensors_on_their_tensor_cores():
    """``searched_math``, which the Dask tune and the operator's autotune both ask: fp32
    math of a bf16 layer whose pick is on the tensor cores is not searched; from a
    CUDA-core floor it is, and so is every math of an fp32 layer."""
    from specgen.choose import FASTEST, searched_math

    bf16 = parse_shape("C=256,M=256,H=14,W=14,K=3,pad=1,dtype=bf16,layout=nhwc")
    fp32 = parse_shape("C=256,M=256,H=14,W=14,K=3,pad=1")
    assert not searched_math(bf16, Precision.FP32, FASTEST)
    assert searched_math(bf16, Precision.FP32, 0)
    assert searched_math(bf16, Precision.BF16, FASTEST)
    assert searched_math(fp32, Precision.FP32, FASTEST)
    assert searched_math(fp32, Precision.TF32, FASTEST)


def test_a_layer_moves_to_the_other_layout_only_where_its_winner_there_pays_for_the_move(
    tmp_path, monkeypatch
):
    """computed_layout with tuned winners in both layouts: an NCHW fp32 wgrad with tf32
    allowed goes to NHWC only where the winner there beats the one in place by more than
    moving x and dy there takes (``moves_ms``: read and written at the GPU's measured
    copy rate, ``COPY_RATE`` where this machine has not measured it; dy too, since the
    layer's dgrad runs in place, ``moved_roles``)."""
    import json

    from specgen.choose import COPY_RATE, computed_layout, moved_roles, moves_ms
    from specgen.tensors import Role

    gpu = "GPU X"
    wgrad = ConvProblem(C=64, M=64, H=112, W=112, R=3, S=3, pads=(1,) * 4, op=Op.WGRAD, batch=32)
    there = replace(wgrad, layout=TensorLayout.NHWC)
    x_bytes = dy_bytes = 32 * 64 * 112 * 112 * 4
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path / "none"))
    roles = moved_roles(wgrad, gpu, allow_tf32=True)
    assert roles == (Role.X, Role.DY)
    moves = moves_ms(wgrad, gpu, roles)
    assert moves == pytest.approx(2 * (x_bytes + dy_bytes) / COPY_RATE * 1e3)
    here_v, there_v = planned(wgrad, True).variant, planned(there, True).variant
    assert (here_v.key, there_v.key) == ("wgnchw", "tcwgrad")

    def with_winners(folder, ms_here, ms_there, rate=None):
        monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path / folder))
        for p, v, ms in ((wgrad, here_v, ms_here), (there, there_v, ms_there)):
            winner(p, v.name, ms, v.precision.value, gpu, batch=32)
        if rate:
            (tmp_path / folder / "ceilings.json").write_text(
                json.dumps({gpu: dict(copy_bytes_per_s=rate, fp32_flops_per_s=5e13)})
            )
        return computed_layout(wgrad, gpu, allow_tf32=True)

    assert with_winners("short", 0.6, 0.6 - moves / 2) is TensorLayout.NCHW
    assert with_winners("long", 0.6, 0.6 - 2 * moves) is TensorLayout.NHWC
    # on a GPU whose copies measured twice as fast, half the move: the first case moves
    assert with_winners("fast", 0.6, 0.6 - moves / 1.5, rate=2 * COPY_RATE) is TensorLayout.NHWC


def test_a_short_layer_stays_in_place_unless_its_winner_there_pays_for_the_launches(
    tmp_path, monkeypatch
):
    """A move costs at least one launch (``MOVE_LAUNCH_MS``): a strided 1x1 forward
    pass over 2x2 maps (resnet18's at 32x32, x of 512 KB) goes to NHWC only where the
    winner there beats the one in place by more than x's launch, however few bytes it
    moves; y, one pixel a map, is dense in both layouts and moves for free."""
    from specgen.choose import MOVE_LAUNCH_MS, computed_layout, moves_ms

    gpu = "GPU X"
    fprop = ConvProblem(C=256, M=512, H=2, W=2, R=1, S=1, stride=(2, 2), batch=128)
    there = replace(fprop, layout=TensorLayout.NHWC)
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path / "none"))
    assert moves_ms(fprop, gpu) == pytest.approx(MOVE_LAUNCH_MS)
    here_v, there_v = planned(fprop, True).variant, planned(there, True).variant

    def with_winners(folder, ms_here, ms_there):
        monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path / folder))
        for p, v, ms in ((fprop, here_v, ms_here), (there, there_v, ms_there)):
            winner(p, v.name, ms, v.precision.value, gpu, batch=128)
        return computed_layout(fprop, gpu, allow_tf32=True)

    assert with_winners("short", 0.0142, 0.0068) is TensorLayout.NCHW  # measured, H200
    assert with_winners("long", 0.0142 + 3 * MOVE_LAUNCH_MS, 0.0142) is TensorLayout.NHWC
    # a map of one pixel, or one channel: the same bytes in both layouts, nothing moved
    last = ConvProblem(C=512, M=512, H=1, W=1, R=3, S=3, pads=(1,) * 4, batch=128)
    assert moves_ms(last, gpu) == 0
    assert moves_ms(replace(last, op=Op.DGRAD, H=2, W=2, stride=(2, 2)), gpu) == MOVE_LAUNCH_MS
    assert moves_ms(replace(last, C=1, M=1, H=56, W=56), gpu) == 0


def test_a_stem_wgrad_is_padded_only_where_the_padded_winner_pays_for_its_copies(
    tmp_path, monkeypatch
):
    """computed_problem with measured winners for a 3-channel wgrad in place (fp32 math)
    and over 4 channels in NHWC (tf32): padded only where the padded winner beats the
    one in place by more than its copies take (``pad_moves_ms``: x read and written
    padded, dy moved to NHWC, at ``COPY_RATE`` here); with no winner in place, padded."""
    from specgen.choose import COPY_RATE, computed_problem, pad_moves_ms

    gpu = "GPU X"
    stem = ConvProblem(
        C=3, M=32, H=224, W=224, R=3, S=3, stride=(2, 2), pads=(1,) * 4, op=Op.WGRAD, batch=64
    )
    wide = replace(stem, C=4, layout=TensorLayout.NHWC)
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path / "none"))
    assert computed_problem(stem, gpu, True) == wide  # untuned: the tensor cores' math
    moves = pad_moves_ms(stem, wide, gpu)
    x, x4 = 64 * 3 * 224 * 224 * 4, 64 * 4 * 224 * 224 * 4  # x, and x padded
    dy = 64 * 32 * 112 * 112 * 4
    assert moves == pytest.approx((x + x4 + 2 * dy) / COPY_RATE * 1e3)
    here_v = parse_variant_name("wtap_t3_m8_c3_p4_r2x1_w1_q3_s132_fp32")
    wide_v = parse_variant_name("tcwgrad_b64x64_w2x1_k32_p3_s528_tf32")

    def with_winners(folder, ms_here, ms_wide):
        monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path / folder))
        winner(stem, here_v.name, ms_here, "fp32", gpu, batch=64)
        winner(wide, wide_v.name, ms_wide, "tf32", gpu, batch=64)
        return computed_problem(stem, gpu, True)

    assert with_winners("short", 0.17, 0.17 - moves / 2) == stem
    assert with_winners("long", 0.17, 0.17 - 2 * moves) == wide


def test_a_layer_tuned_at_two_batches_takes_the_winner_at_the_nearest():
    """resnet50's and resnet18's whole-model tunes both shipped a winner for the bf16 3x3
    wgrad over 7x7 maps of 512 channels, at batch 32 and at 64: a call takes the one
    tuned at the batch nearest its own (a wgrad's slices follow the batch)."""
    spec = "C=512,M=512,H=7,W=7,K=3,pad=1,dtype=bf16,layout=nhwc,op=wgrad"
    p = parse_shape(spec)
    picks = {b: choose(replace(p, batch=b), H200) for b in (1, 32, 40, 48, 64, 512)}
    assert all(c.source == "shipped" for c in picks.values())
    tuned_at = {b: c.batch for b, c in picks.items()}
    assert tuned_at == {1: 32, 32: 32, 40: 32, 48: 64, 64: 64, 512: 64}
    for b, c in picks.items():
        winner = tunedb.layer_winners(spec, H200, b)["bf16"]
        assert winner["batch"] == c.batch and winner["variant"] == c.variant.name, b
    assert f"at B={picks[64].batch}" in picks[64].why


def test_choosing_a_kernel_leaves_nothing_for_the_garbage_collector():
    """A fit that passes over refused candidates keeps no exception: one kept past its
    handler holds its frames and its callers' in a cycle, and the operator chooses in
    an autograd backward, whose graph then outlives the step until a collection.  A
    CUDA graph captured meanwhile accumulates into nodes of the eager stream and
    fails (shufflenet_v2's capture, one run in two, on the H200)."""
    import gc

    specs = [
        "C=3,M=64,H=224,W=224,K=7,pad=3,stride=2,dtype=bf16,layout=nhwc",  # mmafew
        "C=3,M=64,H=224,W=224,K=7,pad=3,stride=2,dtype=bf16,layout=nhwc,op=wgrad",  # wfew
        "C=256,M=3,H=32,W=32,K=3,pad=1,bias=1,dtype=bf16,layout=nhwc",  # kn2row
        "C=24,M=58,H=56,W=56,K=1,dtype=bf16,layout=nhwc,op=wgrad",
        "C=116,M=116,H=28,W=28,K=3,pad=1,groups=116,dtype=bf16,layout=nhwc,op=dgrad",
        "C=64,M=64,H=56,W=56,K=3,pad=1",
    ]
    gc.collect()
    gc.set_debug(gc.DEBUG_SAVEALL)
    try:
        for spec in specs:
            make_plan(p := parse_shape(spec), choose(p, H200, True).variant)
        gc.collect()
        kept = [type(o).__name__ for o in gc.garbage if isinstance(o, BaseException)]
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
    assert kept == []
