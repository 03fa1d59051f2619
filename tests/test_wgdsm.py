"""wgdsm, wgmma with its reduction cut into slices across a thread block cluster: the
slices' walks and shares (CPU), what ptxas makes of it for sm_90a, its limits, and its
numbers on drawn problems (GPU tier)."""

import dataclasses

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from problems import (
    GPU_DRAWS,
    assert_one_line_refusal,
    that_plan,
    tma_problems,
    verify_on_the_gpu,
    wgmma_problems,
)
from specgen.compile import compile_source
from specgen.errors import SpecError
from specgen.plan import make_plan
from specgen.render import render
from specgen.shapes import parse_shape
from specgen.strategies import Wgdsm, Wgmma
from specgen.strategies.tcgemm import MATH
from specgen.strategies.wgmma import SMS, Feed
from specgen.variants import Precision
from ptx import SERIALIZED, ptx_of

# resnet50's 3x3 layer over 7x7 maps (B=32: a GEMM of 1568 pixels, 72 chunks deep)
R50_7X7 = "C=512,M=512,H=7,W=7,K=3,pad=1,dtype=bf16,layout=nhwc"
AE_ENC2_BF16 = "C=256,M=128,H=16,W=16,K=3,pad=1,dtype=bf16,layout=nhwc"  # TMA's whole rows


def _walk(plan, k0: int) -> tuple[int, int, int]:
    """(lr, ls, lc) after k0 steps of the template's walk from the first chunk."""
    c = plan.context
    lr = ls = lc = 0
    for _ in range(k0):
        lc += c["CHUNK"]
        if lc >= c["Cg"]:
            lc = 0
            ls += 1
            if ls == c["S"]:
                ls, lr = 0, lr + 1
    return lr, ls, lc


@pytest.mark.parametrize(
    "spec,name",
    [
        (R50_7X7, "wgdsm_b128x128_p4_q1_gr_sy_k2_bf16"),
        (R50_7X7, "wgdsm_b64x128_p8_q1_gr_sy_k8_bf16"),
        (R50_7X7.replace("C=512", "C=200"), "wgdsm_b192x128_p4_q2_gr_sy_k4_bf16"),
        (AE_ENC2_BF16, "wgdsm_b256x128_p3_q1_gr_tma_k4_bf16"),
    ],
)
def test_the_slices_walk_every_chunk_once_and_share_every_column_once(spec, name):
    """The cluster's slices (k0 = rank * per, kn chunks) cover the reduction's chunks once,
    each starting where the walk from the first chunk would be (the template's decode
    of k0); the ranks' shares of the tile (float4 columns rank * share ..) cover its
    pixel columns once, and the rows each rank stores are those columns' pixels."""
    p = parse_shape(spec)
    v = Wgdsm.from_parts(name.split("_")[1:])
    plan = make_plan(p, v)
    c = plan.context
    K, kt, cpt, chunk = v.kslices, c["kt"], c["chunks_per_tap"], c["CHUNK"]
    per = -(-kt // K)
    covered = []
    for rank in range(K):
        k0 = rank * per
        kn = max(0, min(kt, k0 + per) - k0)
        covered += range(k0, k0 + kn)
        decoded = (k0 // cpt // c["S"], k0 // cpt % c["S"], k0 % cpt * chunk)
        if kn:
            assert decoded == _walk(plan, k0), (rank, k0)
    assert covered == list(range(kt))
    bn = v.blocktile[0]
    share = bn // 8 // K
    columns = sorted(
        8 * (rank * share + i) + t for rank in range(K) for i in range(share) for t in range(8)
    )
    assert columns == list(range(bn))
    rows = sorted(rank * (bn // K) + r for rank in range(K) for r in range(bn // K))
    assert rows == list(range(bn))


@pytest.mark.parametrize("spec", [R50_7X7, AE_ENC2_BF16, R50_7X7.replace("dtype=bf16,", "")])
def test_every_tune_candidate_compiles_as_a_cluster_without_spills(spec):
    """Every candidate of the space plans or refuses in one line; those that bring a value
    no compiled one had compile with no spills and no serialized wgmma, and their PTX
    asks for a cluster of kslices blocks along y and reads the peers' shared memory."""
    p = parse_shape(spec)
    precision = MATH[p.dtype]
    covered, compiled = set(), 0
    for v in Wgdsm.space(p, precision):
        try:
            plan = make_plan(p, v)
        except SpecError as e:
            assert "\n" not in str(e)
            continue
        values = {(f.name, getattr(v, f.name)) for f in dataclasses.fields(v)}
        if values <= covered:
            continue
        covered |= values
        binary = compile_source(render(plan), plan.name, plan.target("sm_90"))
        assert binary.spills == 0 and SERIALIZED not in binary.log, (plan.name, binary.resources)
        ptx = ptx_of(plan)
        assert f".reqnctapercluster 1, {v.kslices}, 1" in ptx, plan.name
        assert "mapa.shared::cluster.u32" in ptx and "ld.shared::cluster.v4.f32" in ptx
        assert ptx.count("barrier.cluster.arrive.release.aligned") == 2
        compiled += 1
    assert compiled >= 4


def test_a_dgrad_no_tap_reaches_still_plans_on_wgmma_and_is_refused_by_wgdsm():
    """A strided dgrad whose every dx pixel lies where no tap reaches (a 1x3 window at
    stride 3 over one padded row): wgmma writes its zeros with no chunk to walk, as before
    wgdsm's limit on slices; wgdsm has no chunks to slice and says so in one line."""
    spec = "C=112,M=108,H=1,W=9,K=1x3,pad=1x1x1x0,stride=3,layout=nhwc,op=dgrad"
    p = parse_shape(spec)
    v = Wgmma.default(Wgmma.problem_for(p), Precision.TF32)
    assert make_plan(p, v).context["kt"] == 0
    assert_one_line_refusal(spec, "wgdsm_b128x128_p4_q1_gr_sy_k2_tf32", "0 chunk(s)")


def test_the_fit_fills_the_sms_with_clusters_on_small_maps():
    """resnet50's 3x3 layer over 7x7 maps at B=32: wgmma's one-tile-a-block grid holds
    fewer blocks than the SMs; the fit slices the reduction until the clusters fill them,
    every slice at least four chunks long."""
    p = dataclasses.replace(parse_shape(R50_7X7), batch=32)
    v = Wgdsm.default(p, Precision.BF16)
    plan = make_plan(p, v)
    bn, bm = v.blocktile
    tiles = -(-32 * 49 // bn) * (512 // bm)
    assert v.kslices > 1 and not v.persistent and v.feed is not Feed.WS
    assert tiles * v.kslices >= SMS or v.kslices == 8
    assert plan.context["kt"] // v.kslices >= 4
    assert plan.launches[0].grid[1] == 512 // bm * v.kslices


@pytest.mark.parametrize(
    "spec,name,words",
    [
        (R50_7X7, "wgdsm_b128x128_p4_q1_pe_sy_k2_bf16", "gr"),
        (AE_ENC2_BF16, "wgdsm_b128x128_p4_q2_gr_ws_k2_bf16", "--feed tma or sy"),
        (R50_7X7, "wgdsm_b64x128_p4_q1_gr_sy_k3_bf16", "divisor of 8"),
        (R50_7X7, "wgdsm_b128x128_p4_q1_gr_sy_k16_bf16", "2 to 8 slices"),
        (
            R50_7X7.replace("C=512,", "C=8,").replace("K=3", "K=1"),
            "wgdsm_b128x128_p4_q1_gr_sy_k2_bf16",
            "at most 1 slice(s)",
        ),
    ],
)
def test_limits_are_one_line_refusals(spec, name, words):
    assert_one_line_refusal(spec, name, words)


# ---- GPU tier ----


@pytest.mark.gpu
@settings(max_examples=16, **GPU_DRAWS)
@given(p=wgmma_problems(), batch=st.integers(1, 5), pick=st.integers(0, 10**6))
def test_drawn_problems_on_the_gpu(p, batch, pick):
    """The default and one candidate of the space, against the float64 reference: slices
    of unequal length (the last one's shorter or empty), every rank's share of the
    columns stored with bias and relu, pixels past the batch, maps past the tile,
    strided dgrads' phases."""
    view = Wgdsm.problem_for(p)
    precision = MATH[p.dtype]
    space = that_plan(p, Wgdsm.space(view, precision))
    variants = that_plan(p, [Wgdsm.default(view, precision)])
    if space:
        variants.append(space[pick % len(space)])
    assume(variants)
    verify_on_the_gpu(p, variants, batch)


@pytest.mark.gpu
@settings(max_examples=10, **GPU_DRAWS)
@given(p=tma_problems(), batch=st.integers(1, 5), pick=st.integers(0, 10**6))
def test_tma_slices_on_drawn_problems_on_the_gpu(p, batch, pick):
    """The TMA feed's producer walking a slice from its first chunk, and staying for the
    cluster's barriers, against the float64 reference."""
    view = Wgdsm.problem_for(p)
    tma = [v for v in Wgdsm.space(view, MATH[p.dtype]) if v.feed is Feed.TMA]
    tma = that_plan(p, tma)
    assume(tma)
    verify_on_the_gpu(p, [tma[pick % len(tma)]], batch)
