"""``listings``: a whole-model tune's problem list and each search's candidates, kept
from run to run under a hash of specgen's code."""

from __future__ import annotations

from dataclasses import replace

import pytest

from specgen import dist, listings
from specgen.cli import _many_problems
from specgen.shapes import parse_shape

SPECS = ("C=2,M=4,H=9,W=9,K=3", "C=3,M=4,H=8,W=8,K=3,pad=1,op=dgrad")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A cache folder of the test's own, and a count of the searches listed."""
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path))
    listed = []
    real = dist.search_items

    def counted(search, budget):
        listed.append(search)
        return real(search, budget)

    monkeypatch.setattr(dist, "search_items", counted)
    return listed


def searches():
    return dist.searched([parse_shape(s) for s in SPECS], "")


def test_a_search_is_listed_once_and_read_back_the_same(cache):
    plain = dist.work_items(searches(), 3)
    assert len(cache) == len(searches()) and plain
    cache.clear()
    first = dist.work_items(searches(), 3, stored=True)
    assert first == plain and len(cache) == len(searches())
    cache.clear()
    assert dist.work_items(searches(), 3, stored=True) == plain and cache == []
    # another budget is another listing
    assert dist.work_items(searches(), 2, stored=True) == dist.work_items(searches(), 2)
    assert len(cache) == 2 * len(searches())


def test_a_change_to_the_code_or_a_line_cut_short_lists_again(cache, monkeypatch, tmp_path):
    want = dist.work_items(searches(), 3, stored=True)
    cache.clear()
    path = next((tmp_path / "listings").glob("items-*.jsonl"))
    lines = path.read_text().splitlines()
    cut = lines[-1][: len(lines[-1]) // 2]  # the last entry's write cut off
    path.write_text("".join(line + "\n" for line in lines[:-1]) + cut)
    assert dist.work_items(searches(), 3, stored=True) == want and len(cache) == 1
    cache.clear()
    assert dist.work_items(searches(), 3, stored=True) == want and cache == []
    monkeypatch.setattr(listings, "code_hash", lambda: "another")
    assert dist.work_items(searches(), 3, stored=True) == want
    assert len(cache) == len(searches())
    # the entries of the code before are gone with the first of the new code's
    assert [p.name for p in (tmp_path / "listings").glob("items-*")] == ["items-another.jsonl"]


def test_a_model_listed_before_is_read_without_tracing_it(cache, monkeypatch):
    problems = [replace(parse_shape(s), batch=4) for s in SPECS]
    listings.store_model_problems("a-model", 4, problems)
    assert listings.model_problems("a-model", 4) == problems
    assert listings.model_problems("a-model", 8) is None
    # read in milliseconds, with no torchvision: the trace is not run
    found, _ = _many_problems(None, "a-model", 4)
    assert found == problems
    monkeypatch.setattr(listings, "_versions", lambda: "torch 0.0, torchvision 0.0")
    assert listings.model_problems("a-model", 4) is None


def test_a_models_problems_are_listed_at_the_image_size_asked(cache):
    """``tune --model NAME --image S`` lists the problems ``specgen model NAME --image S``
    runs, stored apart from those of the model's own image size."""
    pytest.importorskip("torchvision")
    small, _ = _many_problems(None, "resnet18", 4, 32)
    assert small[0].spec.startswith("C=3,M=64,H=32,W=32,K=7")
    assert {p.batch for p in small} == {4}
    own, _ = _many_problems(None, "resnet18", 4)
    assert own[0].spec.startswith("C=3,M=64,H=224,W=224,K=7")
    assert listings.model_problems("resnet18", 4, 32) == small
    assert listings.model_problems("resnet18", 4) == own
