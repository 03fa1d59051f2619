"""CPU tier: the tuning space and the results database's rules."""

import json

from specgen import tunedb
from specgen.plan import make_plan
from specgen.shapes import PRESETS, parse_shape
from specgen.tune import candidates
from specgen.variants import Precision


def test_space_holds_only_plannable_variants_of_the_asked_precision():
    shape = PRESETS["layer2"]
    for precision in Precision:
        space = candidates(shape, precision)
        assert space, precision
        for v in space:
            make_plan(shape, v)  # raises if the planner would refuse it
            assert v.precision is precision  # fp32 never becomes tf32 or fp16
    assert {v.key for v in candidates(shape, Precision.TF32)} == {
        "mma",
        "mmatile",
        "mmapersist",
        "mmahwc",
    }


def test_winners_from_another_gpu_are_not_used(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path))
    shape = PRESETS["layer2"]
    rec = dict(
        kind="winner",
        shape=shape.spec,
        batch=10,
        precision="fp32",
        variant="x",
        ms=1.0,
        gpu="A",
        date="2026-11-22",
    )
    tunedb.db_path().parent.mkdir(parents=True, exist_ok=True)
    tunedb.db_path().write_text(json.dumps(rec) + "\n{cut short\n")  # an interrupted append
    assert tunedb.winners(shape.spec, "A")["fp32"]["variant"] == "x"
    assert tunedb.winners(shape.spec, "B") == {}


def test_a_shape_tuned_at_several_batches_gives_the_winner_nearest_the_call(tmp_path, monkeypatch):
    """This machine's database keeps a winner a batch: a call takes the latest at the
    batch nearest its own (a tie to the larger), and with no batch the latest of all."""
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path))
    spec = PRESETS["layer2"].spec

    def rec(batch, variant):
        return dict(
            kind="winner",
            shape=spec,
            batch=batch,
            precision="fp32",
            variant=variant,
            ms=1.0,
            gpu="A",
            date="2026-11-29",
        )

    rows = [rec(128, "old128"), rec(8, "at8"), rec(128, "at128"), rec(32, "at32")]
    tunedb.db_path().parent.mkdir(parents=True, exist_ok=True)
    tunedb.db_path().write_text("".join(json.dumps(r) + "\n" for r in rows))
    picked = {b: tunedb.winners(spec, "A", b)["fp32"]["variant"] for b in (1, 16, 40, 64, 1000)}
    assert picked == {1: "at8", 16: "at32", 40: "at32", 64: "at128", 1000: "at128"}
    assert tunedb.winners(spec, "A")["fp32"]["variant"] == "at32"


def test_the_default_leads_the_candidates_even_where_the_space_lacks_it():
    """tcgemm's tf32 space has no 128x128 tile of 2x2 warps, its default at B=128: tune
    must time it anyway, or a sampled winner slower than the default would be stored
    (it was: 0.135 against 0.119 ms on the H200)."""
    from dataclasses import replace

    from specgen.strategies import Tcgemm
    from specgen.tune import candidates

    p = replace(parse_shape("C=256,M=128,H=16,W=16,K=3,pad=1,layout=nhwc"), batch=128)
    default = Tcgemm.default(p, Precision.TF32)
    assert default not in Tcgemm.space(p, Precision.TF32)
    assert candidates(p, Precision.TF32, Tcgemm)[0] == default


def test_autotune_prunes_to_the_picks_math_and_keeps_the_pick():
    """tune.prune: for a wide layer whose untuned pick runs on the tensor cores, the
    CUDA-core strategies' candidates are left out, the pick is first, and the search is
    a fraction of the whole space; with floor 0 nothing but the order changes."""
    from dataclasses import replace as copy

    from specgen.choose import choose, speed_class
    from specgen.shapes import parse_shape
    from specgen.tune import candidates, prune
    from specgen.variants import Precision

    p = copy(parse_shape("C=256,M=256,H=14,W=14,K=3,pad=1,layout=nhwc"), batch=32)
    pick = choose(p, "some GPU").variant
    assert pick.tensor_core and speed_class(pick) == 1  # tcgemm's three tf32 products
    space = candidates(p, Precision.FP32)
    kept = prune(space, speed_class(pick), (pick,))
    assert kept[0] == pick and all(v.tensor_core for v in kept)
    assert len(kept) < len(space) / 3
    assert sorted(map(str, prune(space, 0))) == sorted(map(str, space))


def test_a_tunes_winners_are_shipped_per_gpu_math_and_batch(tmp_path, monkeypatch):
    """ship_layer_winners takes a database's winners of one GPU into the shipped table:
    a math already there at the same batch is replaced, the other maths and batches
    kept, the tune noted; the operator reads the winner at the batch nearest its own; a
    database without winners of that GPU is refused and the file left as it was."""
    import pytest

    from specgen.errors import SpecError

    spec = "C=64,M=64,H=56,W=56,K=3,pad=1,dtype=bf16,layout=nhwc"

    def winner(gpu, precision, variant, ms, batch=32):
        return dict(
            kind="winner",
            gpu=gpu,
            shape=spec,
            batch=batch,
            precision=precision,
            variant=variant,
            ms=ms,
            cudnn_ms=0.05,
            date="2026-11-28",
        )

    db = tmp_path / "tune.jsonl"
    db.write_text(
        "".join(
            json.dumps(r) + "\n"
            for r in (
                winner("GPU A", "bf16", "wgmma_b192x64_p3_q1_gr_sy_bf16", 0.025),
                winner("GPU A", "bf16", "wgmma_b128x64_p3_q1_gr_sy_bf16", 0.04, batch=64),
                winner("GPU B", "bf16", "tcgemm_b128x64_w2x2_k32_p4_bf16", 0.03),
            )
        )
    )
    path = tmp_path / "layer_winners.json"
    old = {"variant": "old", "ms": 1.0, "batch": 32}
    small = {"variant": "small", "ms": 0.3, "batch": 8}
    keep = {"variant": "mma_t64_fp32", "ms": 0.5, "batch": 8}
    path.write_text(
        json.dumps(
            dict(
                about="",
                tunes=[],
                winners={"GPU A": {spec: {"bf16": [small, old], "fp32": [keep]}}},
            )
        )
    )
    assert tunedb.ship_layer_winners(db, "GPU A", dict(model="m"), path) == 2
    shipped = json.loads(path.read_text())
    table = shipped["winners"]["GPU A"][spec]
    assert table["fp32"] == [keep]
    assert [(r["variant"], r["batch"]) for r in table["bf16"]] == [
        ("small", 8),
        ("wgmma_b192x64_p3_q1_gr_sy_bf16", 32),
        ("wgmma_b128x64_p3_q1_gr_sy_bf16", 64),
    ]
    assert table["bf16"][1]["ms"] == 0.025 and "GPU B" not in shipped["winners"]
    assert shipped["tunes"] == [dict(model="m", gpu="GPU A", winners=2)]
    monkeypatch.setattr(tunedb, "LAYER_WINNERS", path)
    tunedb._layer_winners.cache_clear()
    try:
        nearest = {
            b: tunedb.layer_winners(spec, "GPU A", b)["bf16"]["batch"] for b in (1, 16, 40, 48, 500)
        }
        assert nearest == {1: 8, 16: 32, 40: 32, 48: 64, 500: 64}  # 16: a tie, to the larger
        assert tunedb.layer_winners(spec, "GPU A")["bf16"]["batch"] == 64
    finally:
        tunedb._layer_winners.cache_clear()
    before = path.read_text()
    with pytest.raises(SpecError, match="no winner measured on GPU C"):
        tunedb.ship_layer_winners(db, "GPU C", dict(model="m"), path)
    assert path.read_text() == before


def test_shipping_that_keeps_the_faster_winner_compares_times_over_cudnns(tmp_path):
    """With ``keep_faster`` a shipped winner stays where its time over cuDNN's (in its
    own run) is lower than the new winner's, and is replaced where it is higher; the
    count and the tune's note say how many were taken."""
    spec = "C=64,M=64,H=56,W=56,K=3,pad=1"

    def shipped(variant, ms, cudnn_ms):
        return dict(variant=variant, ms=ms, cudnn_ms=cudnn_ms, batch=32, date="2026-11-29")

    def record(precision, variant, ms, cudnn_ms):
        return dict(
            shipped(variant, ms, cudnn_ms),
            kind="winner",
            gpu="GPU A",
            shape=spec,
            precision=precision,
        )

    db = tmp_path / "tune.jsonl"
    # fp32: 0.30 against cuDNN's 0.40 (0.75) loses to the shipped 0.33 against 0.50
    # (0.66), though faster in ms; tf32: 0.20 against 0.40 (0.5) beats 0.18 against 0.30
    new = (record("fp32", "new32", 0.30, 0.40), record("tf32", "newtf", 0.20, 0.40))
    db.write_text("".join(json.dumps(r) + "\n" for r in new))
    path = tmp_path / "layer_winners.json"
    table = {"fp32": [shipped("old32", 0.33, 0.50)], "tf32": [shipped("oldtf", 0.18, 0.30)]}
    path.write_text(json.dumps(dict(about="", tunes=[], winners={"GPU A": {spec: table}})))
    assert tunedb.ship_layer_winners(db, "GPU A", dict(model="m"), path, keep_faster=True) == 1
    got = json.loads(path.read_text())
    kept = got["winners"]["GPU A"][spec]
    assert [kept["fp32"][0]["variant"], kept["tf32"][0]["variant"]] == ["old32", "newtf"]
    assert got["tunes"] == [dict(model="m", gpu="GPU A", winners=1)]
    assert tunedb.ship_layer_winners(db, "GPU A", dict(model="m"), path) == 2  # replaces all


def test_shipping_that_keeps_the_faster_winner_takes_the_tunes_own_time_of_the_old(tmp_path):
    """Where the tune timed the shipped winner too (a finalist, else the first pass),
    ``keep_faster`` compares the two times of that run, whatever cuDNN's times say."""
    spec = "C=144,M=24,H=56,W=56,K=1,pad=0,dtype=bf16,layout=nhwc,op=dgrad"
    common = dict(gpu="GPU A", shape=spec, batch=64, date="2026-11-30", precision="bf16")
    path = tmp_path / "layer_winners.json"

    def ship(*records, old_ms=0.0357, old_cudnn=0.0363):
        db = tmp_path / f"tune{len(list(tmp_path.glob('tune*')))}.jsonl"  # each a new file
        db.write_text("".join(json.dumps(dict(common, **r)) + "\n" for r in records))
        old = dict(variant="old", ms=old_ms, cudnn_ms=old_cudnn, batch=64, date="2026-11-29")
        table = {spec: {"bf16": [old]}}
        path.write_text(json.dumps(dict(about="", tunes=[], winners={"GPU A": table})))
        tunedb.ship_layer_winners(db, "GPU A", dict(model="m"), path, keep_faster=True)
        return json.loads(path.read_text())["winners"]["GPU A"][spec]["bf16"][0]["variant"]

    # 0.0317 against cuDNN's 0.0308 is a worse ratio than the old 0.0357 against 0.0363
    won = dict(kind="winner", variant="new", ms=0.0317, cudnn_ms=0.0308)
    assert ship(won) == "old"
    # but the same tune timed the old one at 0.0357: the new one is faster
    assert ship(dict(won, finalists={"old": 0.0357, "new": 0.0317})) == "new"
    first = dict(kind="timing", variant="old", ms=0.0357, nvrtc="13.0", source="h", driver=13000)
    assert ship(won, first) == "new"
    # and where that run timed the old one faster, it stays, whatever the ratios
    assert ship(dict(won, finalists={"old": 0.0300}), old_ms=0.05) == "old"


def test_records_read_again_see_what_was_appended_or_rewritten(tmp_path, monkeypatch):
    """``records`` parses only what was appended since its last read, and gives what a
    fresh read of the whole file gives: after appends, a record cut short and then
    completed, and the file rewritten in place."""
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path))
    path = tunedb.db_path()
    path.parent.mkdir(parents=True, exist_ok=True)

    def rec(i, gpu="A"):
        spec = PRESETS["layer2"].spec
        return dict(
            kind="winner",
            shape=spec,
            batch=i,
            precision="fp32",
            variant=f"v{i}",
            ms=1.0 + i,
            gpu=gpu,
            date="2026-11-28",
        )

    def fresh():
        tunedb._READ.clear()
        return tunedb.records()

    tunedb.append(rec(1))
    assert [r["variant"] for r in tunedb.records()] == ["v1"]
    tunedb.append(rec(2))
    with open(path, "ab") as f:
        f.write(b"\n")  # a blank line counts in the numbering
    tunedb.append(rec(3))
    seen = tunedb.records()
    assert [(r["variant"], r["line"]) for r in seen] == [("v1", 1), ("v2", 2), ("v3", 4)]
    whole = json.dumps(rec(4))
    with open(path, "ab") as f:
        f.write(whole[:20].encode())  # an append under way
    assert len(tunedb.records()) == 3
    with open(path, "ab") as f:
        f.write(whole[20:].encode())  # complete, no newline yet
    assert [r["variant"] for r in tunedb.records()][-1] == "v4" == fresh()[-1]["variant"]
    with open(path, "r+b") as f:  # rewritten in place, same inode, longer
        f.write(b"\n".join(json.dumps(rec(i, "B")).encode() for i in range(5, 10)) + b"\n")
    again = tunedb.records()
    assert [r["gpu"] for r in again][:5] == ["B"] * 5
    assert again == fresh()


def test_an_earlier_tunes_timings_are_taken_once_without_its_compiles_and_winners(
    tmp_path, monkeypatch
):
    """``--timings-from``: the timings of another database (gzipped or not) join this
    machine's, each once; its compile, dropped and winner records and unreadable lines
    stay behind, so that a tune resumed from them compiles here, times what they lack,
    and picks each winner anew."""
    import gzip

    import pytest

    from specgen.errors import SpecError

    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path / "cache"))
    key = dict(nvrtc="13.0", shape="C=8,M=8,H=6,W=6,K=3", batch=4, variant="v", source="a1")
    gpu = dict(gpu="NVIDIA H200", driver=13000)
    rows = [
        dict(key, kind="compiled", arch="sm_90", status="ok"),
        dict(key, **gpu, kind="timing", status="ok", ms=0.5),
        dict(key, **gpu, variant="w", kind="timing", status="ok", ms=0.7),
        dict(key, gpu="NVIDIA H200", variant="x", kind="dropped", status="wrong"),
        dict(kind="winner", gpu="NVIDIA H200", shape=key["shape"], batch=4, precision="fp32")
        | dict(variant="v", ms=0.5, date="2026-11-29"),
    ]
    old = tmp_path / "old.jsonl.gz"
    with gzip.open(old, "wt") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows) + "not json\n")
    assert tunedb.import_timings(old) == (2, 0)
    assert sorted((r["kind"], r["variant"], r["ms"]) for r in tunedb.records()) == [
        ("timing", "v", 0.5),
        ("timing", "w", 0.7),
    ]
    assert tunedb.import_timings(old) == (0, 2)  # a second take adds nothing
    plain = tmp_path / "old.jsonl"
    plain.write_text(json.dumps(dict(rows[1], source="b2")) + "\n")
    assert tunedb.import_timings(plain) == (1, 0)  # another source: another candidate
    assert len(tunedb.records()) == 3
    plain.write_text(json.dumps(rows[0]) + "\n")
    with pytest.raises(SpecError, match="no timing records") as e:
        tunedb.import_timings(plain)
    with pytest.raises(SpecError, match="cannot read timings") as e:
        tunedb.import_timings(tmp_path / "missing.jsonl.gz")
    assert "\n" not in str(e.value)
    broken = tmp_path / "broken.jsonl.gz"
    broken.write_bytes(gzip.compress(b'{"kind": "timing"}\n' * 50)[:40] + b"\x00" * 40)
    with pytest.raises(SpecError, match="cannot read timings") as e:
        tunedb.import_timings(broken)
    assert "\n" not in str(e.value)
