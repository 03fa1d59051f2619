"""CPU tier: the tuning space and the results database's rules."""

import json

from specgen import tunedb
from specgen.plan import make_plan
from specgen.shapes import PRESETS
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
    assert {v.key for v in candidates(shape, Precision.TF32)} == {"mma", "mmatile", "mmapersist"}


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
