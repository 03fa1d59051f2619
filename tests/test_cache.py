"""CPU tier: the compile cache under corruption, without write access, and shared by
two processes at once.  Whatever is on disk, a compile returns the right binary."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from specgen import compile as comp
from specgen.compile import compile_source

ROOT = Path(__file__).resolve().parents[1]

SRC = 'extern "C" __global__ void k(float* __restrict__ y) { y[threadIdx.x] = 1.0f; }'


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path))
    warnings = []
    monkeypatch.setattr(comp, "warn_once", lambda key, message: warnings.append(message))
    first = compile_source(SRC, "k")
    (entry,) = tmp_path.rglob("*.entry")
    return first, entry, warnings


def _forged(entry, meta_edit=None, cubin=None) -> bytes:
    """The entry rewritten with a valid hash: what a careless tool or a bad merge of
    two entries could leave."""
    digest, body = entry.read_bytes().split(b"\n", 1)
    head, binary = body.split(b"\n", 1)
    meta = json.loads(head)
    if meta_edit:
        meta = meta_edit(meta)
    body = json.dumps(meta).encode() + b"\n" + (binary if cubin is None else cubin)
    return hashlib.sha256(body).hexdigest().encode() + b"\n" + body


CORRUPTIONS = {
    "garbage": lambda e: b"garbage",
    "empty": lambda e: b"",
    "cut short": lambda e: e.read_bytes()[:-100],
    "one byte flipped": lambda e: e.read_bytes()[:-50] + b"X" + e.read_bytes()[-49:],
    "smem edited": lambda e: e.read_bytes().replace(b"smem", b"smex", 1),
    "garbage cubin, hash matching": lambda e: _forged(e, cubin=b"\x7fELF garbage"),
    "cubin not ELF, hash matching": lambda e: _forged(e, cubin=b"not a cubin"),
    "metadata a list": lambda e: _forged(e, meta_edit=lambda m: [m]),
    "defines not strings": lambda e: _forged(e, meta_edit=lambda m: dict(m, defines=[1])),
    "log missing": lambda e: _forged(e, meta_edit=lambda m: {k: m[k] for k in m if k != "log"}),
    "another key": lambda e: _forged(e, meta_edit=lambda m: dict(m, key="0" * 64)),
}


@pytest.mark.parametrize("how", CORRUPTIONS)
def test_a_corrupt_entry_is_compiled_again(cache, how):
    first, entry, warnings = cache
    entry.write_bytes(CORRUPTIONS[how](entry))
    again = compile_source(SRC, "k")
    assert again.cubin == first.cubin and again.resources == first.resources
    assert compile_source(SRC, "k").cubin == first.cubin  # and the entry is good again
    assert comp._load_cached(entry, first.key, "sm_90") is not None
    assert not warnings


def test_an_entry_that_is_a_folder_costs_only_caching(cache):
    first, entry, warnings = cache
    entry.unlink()
    entry.mkdir()
    assert compile_source(SRC, "k").cubin == first.cubin
    assert len(warnings) == 1 and "cannot be written" in warnings[0]


def test_cache_dir_that_is_a_file_degrades_to_no_cache(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(blocker))
    warnings = []
    monkeypatch.setattr(comp, "warn_once", lambda key, message: warnings.append(message))
    b = compile_source(SRC, "k")
    assert "k" in b.resources and warnings and "SPECGEN_CACHE_DIR" in warnings[0]
    assert blocker.read_text() == "x"


def test_unwritable_cache_through_the_cli_is_one_warning(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    env = dict(os.environ, SPECGEN_CACHE_DIR=str(blocker))
    args = ["verify", "--shape", "C=2,M=4,H=9,W=9,K=3", "--strategy", "direct"]
    r = subprocess.run([sys.executable, "-m", "specgen", *args], env=env, capture_output=True)
    assert r.returncode == 0, r.stderr.decode()
    warnings = [l for l in r.stderr.decode().splitlines() if l.startswith("warning:")]
    assert len(warnings) == 1 and "cannot be written" in warnings[0]


def test_two_verify_runs_share_one_empty_cache(tmp_path):
    env = dict(os.environ, SPECGEN_CACHE_DIR=str(tmp_path / "cache"))
    args = ["verify", "--shape", "C=3,M=8,H=11,W=9,K=3,pad=1", "--strategy", "tiled"]
    cmd = [sys.executable, "-m", "specgen", *args, "--jobs", "1"]
    runs = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)]
    runs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE))
    outs = [r.communicate(timeout=300) for r in runs]
    for r, (out, err) in zip(runs, outs):
        assert r.returncode == 0, err.decode()
        assert b"0 failed" in out and b"warning" not in err
    entries = list((tmp_path / "cache").rglob("*.entry"))
    assert entries and not list((tmp_path / "cache").rglob("*.tmp"))
    for e in entries:
        key = e.stem
        assert comp._load_cached(e, key, e.parent.name) is not None


def test_a_background_compile_lets_its_caller_wait_for_one_problem(tmp_path, monkeypatch):
    """parallel.Compiling: the caller goes on while the items compile, ``wait`` returns
    once the items of one problem are in the disk cache (the others may still be
    compiling), a plan that refuses is that item's error and not the rest's, and ``join``
    gives every result as ``precompile`` would."""
    from dataclasses import replace

    from specgen import parallel
    from specgen.compile import cached
    from specgen.render import render
    from specgen.shapes import parse_shape
    from specgen.strategies import default_set

    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path))
    small = parse_shape("C=2,M=4,H=9,W=9,K=3")
    other = parse_shape("C=3,M=5,H=10,W=10,K=3")
    refused = replace(default_set(small)[0], tile=7)  # no tile of 7 plans
    items = [(small, v) for v in default_set(small)[:2]] + [(other, refused)]
    items += [(other, v) for v in default_set(other)[:2]]
    behind = parallel.Compiling(items, "sm_90", jobs=2)
    behind.wait(small.spec)
    for p, v in items[:2]:
        plan = parallel._plan(p, v)
        assert cached(render(plan), plan.target("sm_90")), plan.name
    found = behind.join()
    assert behind.over and len(found) == 5, found
    assert found.pop(refused.name) and not any(found.values()), found
    assert behind.wait(other.spec)  # over: returns at once
    # a pool that never finishes an item (a worker killed mid-task): the wait ends
    stuck = parallel.Compiling([], "sm_90", jobs=1)
    stuck.over, stuck._left[small.spec] = False, 1
    assert stuck.wait(small.spec, timeout=0.05) is False


REFUSED_IN_A_POOL = """
from dataclasses import replace
from specgen import parallel
from specgen.shapes import parse_shape
from specgen.strategies import default_set

shape = parse_shape("C=2,M=4,H=9,W=9,K=3")
good = default_set(shape)[:2]
refused = replace(good[0], tile=7)  # no tile of 7 plans
found = parallel.precompile([(shape, v) for v in [*good, refused]], "sm_90", jobs=2)
assert len(found) == 3 and found.pop(refused.name), found
assert not any(found.values()), found
print("ok")
"""


def _prints_ok_alone(script: str, tmp_path) -> None:
    """``script`` run in a Python process of its own, at a cache of its own, under a
    timeout (a hang fails the test, not the run): it must print "ok" and exit 0."""
    env = dict(os.environ, SPECGEN_CACHE_DIR=str(tmp_path), PYTHONPATH=str(ROOT))
    done = subprocess.run(
        [sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


def test_a_refused_plan_among_pooled_compiles_is_its_own_error(tmp_path):
    """precompile with a pool: a variant the planner refuses comes back as its error,
    beside the others compiled.  Raised in a worker, it once ended the pool and hung its
    caller (the wgcols GPU tests, whose widest tiles plan too many registers), so this
    runs in a process of its own, under a timeout."""
    _prints_ok_alone(REFUSED_IN_A_POOL, tmp_path)


INTERRUPTED_WITH_WORKERS_IDLE = """
import time
from specgen import parallel
from specgen.shapes import parse_shape
from specgen.strategies import default_set


class Interrupting:  # click.progressbar's stand-in: Ctrl-C once every item is in
    def __init__(self, length, **kwargs):
        self.left = length

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def update(self, n):
        self.left -= n
        if not self.left:
            time.sleep(0.5)  # the workers back at the queue, waiting for work
            raise KeyboardInterrupt


parallel.click.progressbar = Interrupting
shape = parse_shape("C=2,M=4,H=9,W=9,K=3")
try:
    parallel.precompile([(shape, v) for v in default_set(shape)[:2]], "sm_90", jobs=2)
except KeyboardInterrupt:
    print("ok")
"""


def test_ctrl_c_with_compile_workers_waiting_for_work_ends_the_pool(tmp_path):
    """precompile interrupted once its workers wait for work: it kills them and ends the
    pool at once.  A worker waiting on the task queue holds the queue's read lock, and
    killed it never let go: the pool's cleanup then waited on that lock forever.  In a
    process of its own, under a timeout."""
    _prints_ok_alone(INTERRUPTED_WITH_WORKERS_IDLE, tmp_path)


def test_a_warm_cache_starts_no_compile_processes(tmp_path, monkeypatch):
    """precompile finds what the disk cache holds before it starts a pool: with every
    kernel there it starts none (a converted model's first call in a new process pays
    no process start-up), and reports each as compiled."""
    from specgen import parallel
    from specgen.shapes import PRESETS
    from specgen.strategies import default_set

    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path))
    shape = PRESETS["layer2"]
    items = [(shape, v) for v in default_set(shape)[:3]]
    first = parallel.precompile(items, "sm_90", jobs=2)
    assert len(first) == 3 and all(err is None for err in first.values()), first

    def no_pool(*args):
        raise AssertionError("a pool started for kernels the cache holds")

    monkeypatch.setattr(parallel.multiprocessing, "get_context", no_pool)
    again = parallel.precompile(items, "sm_90", jobs=2)
    assert again == first


GUARDLESS = """
import os, sys
with open(os.environ["RUNS_LOG"], "a") as f:
    f.write("ran\\n")
from specgen import parallel
from specgen.shapes import parse_shape
from specgen.strategies import default_set

shape = parse_shape("C=2,M=4,H=9,W=9,K=3")  # two small kernels: a second or so each
found = parallel.precompile([(shape, v) for v in default_set(shape)[:2]], "sm_90", jobs=2)
assert len(found) == 2 and all(e is None for e in found.values()), found
assert sys.modules["__main__"].__file__  # given back
"""


@pytest.mark.parametrize("as_module", [False, True], ids=["script", "python -m"])
def test_compile_workers_do_not_run_the_callers_script_again(tmp_path, as_module):
    """A script that compiles at top level, with no ``if __name__ == "__main__"`` guard
    (as people write them), runs once: the spawned compile workers do not import it."""
    (tmp_path / "guardless.py").write_text(GUARDLESS)
    runs = tmp_path / "runs.log"
    env = dict(os.environ, SPECGEN_CACHE_DIR=str(tmp_path / "cache"), RUNS_LOG=str(runs))
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), str(ROOT)])
    target = ["-m", "guardless"] if as_module else [str(tmp_path / "guardless.py")]
    # without the fix the workers' re-run of the script tries to start a pool of its own,
    # dies, and the pool starts it again: the run hangs
    done = subprocess.run(
        [sys.executable, *target], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert runs.read_text() == "ran\n"


RENDER = """
from specgen.plan import make_plan
from specgen.render import _env, render
from specgen.shapes import PRESETS
from specgen.strategies import default_set

shape = PRESETS["layer2"]
print(_env.bytecode_cache is not None)
print(render(make_plan(shape, default_set(shape)[0])))
"""


def test_templates_compiled_once_a_machine_render_the_same_source(tmp_path):
    """The templates' compiled code is kept in the cache folder (Jinja's bytecode
    cache), so that a fresh process renders without compiling them again, into the same
    source; where that folder cannot be made, templates compile in memory as before."""
    runs = []
    blocked = tmp_path / "a file"
    blocked.write_text("")
    for folder in (tmp_path / "cache", tmp_path / "cache", blocked):
        env = dict(os.environ, SPECGEN_CACHE_DIR=str(folder), PYTHONPATH=str(ROOT))
        done = subprocess.run(
            [sys.executable, "-c", RENDER], env=env, capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 0, done.stderr
        runs.append(done.stdout.split("\n", 1))
    assert [cached for cached, _ in runs] == ["True", "True", "False"]
    assert runs[0][1] == runs[1][1] == runs[2][1] and "__global__" in runs[0][1]
    entries = list((tmp_path / "cache" / "templates").iterdir())
    assert entries and all(e.name.endswith(".cache") for e in entries)


def test_a_wgrad_for_fp32_weights_is_compiled_ahead_as_the_operator_runs_it(tmp_path, monkeypatch):
    """precompile's (shape, variant, grads32) items compile the wgrad the operator runs
    for fp32 weights (its sums written in fp32, ``with_fp32_grads``), whose source differs
    from the plan's: that kernel, not the plan's, is then in the cache."""
    from specgen import parallel
    from specgen.compile import cached
    from specgen.plan import make_plan
    from specgen.render import render
    from specgen.shapes import parse_shape
    from specgen.strategies import parse_variant_name
    from specgen.strategies.wsplit import with_fp32_grads

    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path))
    p = parse_shape("C=64,M=64,H=14,W=14,K=3,pad=1,dtype=bf16,layout=nhwc,op=wgrad")
    v = parse_variant_name("tcwgrad_b64x64_w2x2_k32_p4_s4_bf16")
    plan = make_plan(p, v)
    wide = with_fp32_grads(plan, "mrsc")
    assert wide is not None and render(wide) != render(plan)
    found = parallel.precompile([(p, v, "mrsc")], "sm_90", jobs=1)
    assert list(found.values()) == [None]
    assert cached(render(wide), wide.target("sm_90"))
    assert not cached(render(plan), plan.target("sm_90"))
