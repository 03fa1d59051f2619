"""CPU tier: tuning many problems at once on Dask (``specgen.dist``).  The compile
phase: the fan-out over a LocalCluster of processes, every item recorded once by the
client, resume after an interrupted run, a killed worker's items run again elsewhere,
and the command line's refusals.  The GPU phase's pipeline, with stand-ins for the
GPU tasks on workers that hold the resource GPU=1: each item compiled and timed once,
a winner per problem and math, a killed GPU worker's items timed elsewhere, and a
rerun with nothing left to do.  Skipped where dask and distributed are not installed (the
``dist`` extra; ``dev`` includes it)."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace

import pytest
from click.testing import CliRunner

pytest.importorskip("distributed")

from distributed import Client, LocalCluster  # noqa: E402

from procs import running_in_group, specgen_job  # noqa: E402
from specgen import dist, tunedb  # noqa: E402
from specgen.cli import main  # noqa: E402
from specgen.errors import SpecError  # noqa: E402
from specgen.shapes import parse_shape  # noqa: E402

SPECS = ("C=2,M=4,H=9,W=9,K=3", "C=3,M=4,H=8,W=8,K=3,pad=1,op=dgrad")


@pytest.fixture
def db(tmp_path, monkeypatch):
    """A results database of the test's own (the compile cache stays the run's)."""
    path = tmp_path / "tune.jsonl"
    monkeypatch.setattr(tunedb, "db_path", lambda: path)
    return path


@pytest.fixture(scope="module")
def cluster():
    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as c,
        Client(c) as client,
    ):
        yield client


def items(budget=1):
    return dist.work_items(dist.searched([parse_shape(s) for s in SPECS], ""), budget)


def keys_recorded():
    return [
        (r["shape"], r["batch"], r["variant"], r["source"])
        for r in tunedb.records()
        if r["kind"] == "compiled"
    ]


def test_problems_file(tmp_path):
    f = tmp_path / "p.txt"
    f.write_text("layer2\n\n# a note\nC=8,M=8,H=6,W=6,K=3,op=wgrad  # wgrad\n")
    assert [p.spec for p in dist.problems_file(f)] == [
        parse_shape("layer2").spec,
        parse_shape("C=8,M=8,H=6,W=6,K=3,op=wgrad").spec,
    ]
    f.write_text("layer2\nC=8,M=8\n")
    with pytest.raises(SpecError, match="line 2"):
        dist.problems_file(f)
    f.write_text("# nothing\n")
    with pytest.raises(SpecError, match="names no problem"):
        dist.problems_file(f)


def test_a_timed_tune_lists_its_problems_in_a_process_of_their_own(tmp_path):
    """What the timed tune runs apart while its cluster starts (``parallel.apart``): the
    same problems at the asked batch as listing them here, and a bad file's one-line
    SpecError carried back as it is."""
    from specgen.cli import _many_problems
    from specgen.parallel import apart

    f = tmp_path / "p.txt"
    f.write_text("layer2\nC=8,M=8,H=6,W=6,K=3,op=wgrad\n")
    with apart(_many_problems, str(f), None, 3) as listing:
        found, seconds = listing.result(timeout=60)
    assert found == _many_problems(str(f), None, 3)[0] and seconds >= 0
    assert {p.batch for p in found} == {3}
    f.write_text("layer2\nC=8,M=8\n")
    with apart(_many_problems, str(f), None, None) as listing:
        with pytest.raises(SpecError, match="line 2"):
            listing.result(timeout=60)
    # interrupted while the work runs: its process is killed, not waited for
    start = time.perf_counter()
    with pytest.raises(KeyboardInterrupt):
        with apart(time.sleep, 30) as sleeping:
            raise KeyboardInterrupt
    assert time.perf_counter() - start < 10 and sleeping.exception(timeout=20) is not None


def test_the_fan_out_records_every_item_once_and_a_rerun_has_nothing_to_do(db, cluster):
    """Each problem x math x candidate compiled on a worker process and recorded by the
    client, once; the items spread over both workers' ids; run again, nothing is pending."""
    work = items()
    assert len(work) == len({it.key for it in work}) >= 3
    report = dist.fan_out(cluster, dist.pending(work, "sm_90"), "sm_90")
    assert sorted(keys_recorded()) == sorted(it.key for it in work)
    assert sum(report["counts"].values()) == len(work)
    assert report["counts"].get("ok", 0) >= len(work) - report["counts"].get("failed", 0)
    assert all(w.startswith("tcp://") for w in report["per_worker"])
    assert dist.pending(work, "sm_90") == []
    assert dist.pending(work, "sm_80") == work  # keyed by the architecture too


def test_an_interrupted_run_resumes_where_it_stopped(db, cluster):
    work = items()
    seen = []

    def stop_after_two(record):
        seen.append(record)
        if len(seen) == 2:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        dist.fan_out(cluster, dist.pending(work, "sm_90"), "sm_90", progress=stop_after_two)
    assert len(keys_recorded()) == 2
    rest = dist.pending(work, "sm_90")
    assert len(rest) == len(work) - 2
    dist.fan_out(cluster, rest, "sm_90")
    assert sorted(keys_recorded()) == sorted(it.key for it in work)


def test_a_killed_worker_has_its_items_run_elsewhere(db):
    """kill -9 of a worker process in the middle of the run: the scheduler gives its
    items to the other worker (a nanny starts a new one), and every item is recorded
    exactly once."""
    work = items()

    def slow(item, arch):  # defined here: cloudpickle ships it by value
        time.sleep(0.4)
        return dist.compiled_record(item, arch, status="ok", seconds=0.4, worker=str(os.getpid()))

    with (
        LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=":0"
        ) as c,
        Client(c) as client,
    ):
        pids = list(client.run(os.getpid).values())
        killed = []

        def kill_once(record):
            if not killed:
                os.kill(pids[0], signal.SIGKILL)
                killed.append(pids[0])

        report = dist.fan_out(client, work, "sm_90", progress=kill_once, task=slow)
    assert killed and report["dropped"] == []
    recorded = keys_recorded()
    assert sorted(recorded) == sorted(it.key for it in work), "an item lost or recorded twice"
    assert report["counts"] == {"ok": len(work)}


def run(*args):
    return CliRunner().invoke(main, list(args))


def test_the_command_line(tmp_path, db, cluster):
    """--problems --compile-only on the cluster a --scheduler address names (its workers
    separate processes), then again with nothing left to do; the refusals."""
    f = tmp_path / "p.txt"
    f.write_text(SPECS[0] + "\n")
    at = ("--scheduler", cluster.scheduler.address)
    r = run("tune", "--problems", str(f), "--compile-only", *at, "--budget", "1")
    assert r.exit_code == 0, r.output
    assert "1 problems" in r.output and "on 2 workers" in r.output
    assert "compiled: ok" in r.output and len(keys_recorded()) == 2  # fp32 and tf32
    r = run("tune", "--problems", str(f), "--compile-only", *at, "--budget", "1")
    assert r.exit_code == 0 and "0 to compile" in r.output
    for args, words in (
        (("tune",), "give one of --shape, --problems and --model"),
        (("tune", "--shape", "layer2", "--problems", str(f)), "give one of"),
        (("tune", "--problems", str(f), "--gpus", "1", "--compile-only"), "runs none"),
        (("tune", "--shape", "layer2", "--compile-only"), "give --problems or --model"),
        (("tune", "--problems", str(tmp_path / "none.txt"), "--compile-only"), "cannot read"),
        (("tune", "--problems", str(f), "--image", "32", "--compile-only"), "give --model"),
        # options that narrow one problem's search are refused, not silently dropped
        (
            ("tune", "--model", "resnet18", "--precision", "tf32", "--op", "wgrad"),
            "--precision, --op",
        ),
        (
            ("tune", "--problems", str(f), "--strategy", "nosuch", "--compile-only"),
            "unknown strategy",
        ),
    ):
        r = run(*args)
        assert r.exit_code == 2 and words in r.output, (args, r.output)
        assert r.output.count("\n") == 1


def test_a_strategy_named_narrows_a_many_problem_tune_to_its_space(tmp_path, db, cluster):
    """--strategy with --problems: each problem whose op the strategy computes, in the
    maths it has, its whole space (no floor); nothing else is compiled."""
    from specgen.strategies import Tiled
    from specgen.tune import tune_space
    from specgen.variants import Precision

    searches = dist.searched([parse_shape(s) for s in SPECS], "", None, Tiled)
    assert searches and all(s[4] == "tiled" and s[1] is Precision.FP32 for s in searches)
    work = dist.work_items(searches, 3)
    assert work and all(it.variant.startswith("tiled_") for it in work)
    p = parse_shape(SPECS[0])
    assert {it.variant for it in work if it.spec == p.spec} >= {
        v.name for v in tune_space(p, Precision.FP32, 3, strategy=Tiled)
    }
    f = tmp_path / "p.txt"
    f.write_text("\n".join(SPECS) + "\n")
    at = ("--scheduler", cluster.scheduler.address)
    r = run(
        "tune", "--problems", str(f), "--compile-only", *at, "--budget", "3", "--strategy", "tiled"
    )
    assert r.exit_code == 0, r.output
    assert keys_recorded() and all(v.startswith("tiled_") for _, _, v, _ in keys_recorded())


@contextlib.contextmanager
def cluster_apart(tmp_path, *workers):
    """`dask scheduler` and one `dask worker ADDRESS <options>` a tuple of ``workers``,
    each a process of its own, as hosts would start them; yields the address."""
    where = tmp_path / "scheduler.json"
    dask = [sys.executable, "-m", "distributed.cli.dask_scheduler"]
    quiet = dict(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    started = [
        subprocess.Popen(
            [*dask, "--scheduler-file", str(where), "--port", "0", "--no-dashboard"], **quiet
        )
    ]
    try:
        for _ in range(200):
            if where.exists() and where.read_text().strip():
                break
            time.sleep(0.05)
        address = json.loads(where.read_text())["address"]
        worker = [sys.executable, "-m", "distributed.cli.dask_worker", address, "--no-dashboard"]
        for options in workers:
            started.append(subprocess.Popen([*worker, "--nthreads", "1", *options], **quiet))
        with Client(address, timeout="20s") as client:
            client.wait_for_workers(len(workers), timeout=30)
        yield address
    finally:
        for p in reversed(started):
            p.terminate()
            p.wait(timeout=30)


def test_a_cluster_started_apart_as_hosts_would_start_it(tmp_path, db):
    """The path a cluster of hosts takes: `dask scheduler` and `dask worker` started as
    processes of their own, one of them a GPU worker (``--resources GPU=1``), the tune
    joining them through --scheduler: the compile phase on both, then the GPU phase's
    pipeline (stand-in GPU tasks) with the compiles on the CPU worker and the timings on
    the GPU worker."""
    with cluster_apart(tmp_path, (), ("--resources", "GPU=1")) as address:
        f = tmp_path / "p.txt"
        f.write_text(SPECS[1] + "\n")
        at = ("--scheduler", address, "--budget", "2")
        r = run("tune", "--problems", str(f), "--compile-only", *at)
        assert r.exit_code == 0, r.output
        assert "on 2 workers" in r.output and "compiled: ok" in r.output
        want = dist.work_items(dist.searched([parse_shape(SPECS[1])], ""), 2)
        assert sorted(keys_recorded()) == sorted(it.key for it in want)

        env = dict(gpu="Test GPU", driver=1, nvrtc="12.0", arch="sm_90", device="")

        def compiled(item, arch):
            return dist.compiled_record(item, arch, status="ok", seconds=0.0, worker=dist._worker())

        def group(which, todo, arch, known, final=True):
            out = [
                dist.gpu_record(it, env, kind="timing", status="ok", ms=1.0, worker=dist._worker())
                for it in todo
            ]
            return out

        work = dist.work_items(dist.searched([parse_shape(SPECS[0])], ""), 2)
        with Client(address, timeout="20s") as client:
            (gpu,) = dist.gpu_workers(client)
            dist.tune_on_gpus(client, work, "sm_90", env, tasks=(compiled, group))
        mine = [r for r in tunedb.records() if r["shape"] == parse_shape(SPECS[0]).spec]
        assert {r["worker"] for r in mine if r["kind"] == "timing"} == {gpu}
        compiles = [r["worker"] for r in mine if r["kind"] == "compiled"]
        assert len(compiles) == len(work) and gpu not in compiles


@pytest.mark.skipif(
    __import__("importlib").util.find_spec("torchvision") is not None,
    reason="checks the refusal without torchvision",
)
def test_model_without_torchvision_says_what_to_install():
    r = run("tune", "--model", "resnet18", "--compile-only")
    assert r.exit_code == 2 and "specgen[model]" in r.output and r.output.count("\n") == 1


def test_a_task_that_raises_is_recorded_failed_with_the_reason(db, cluster):
    """An item whose task raises is one failed record naming the exception, not a lost
    item, and the run goes on with the rest."""
    work = items()

    def flaky(item, arch):
        if item == work[0]:
            raise RuntimeError("out of memory, say")
        return dist.compiled_record(item, arch, status="ok", seconds=0.0)

    report = dist.fan_out(cluster, work, "sm_90", task=flaky)
    assert report["counts"] == {"ok": len(work) - 1, "failed": 1}
    (failed,) = report["dropped"]
    assert failed["variant"] == work[0].variant and "out of memory, say" in failed["reason"]
    assert sorted(keys_recorded()) == sorted(it.key for it in work)


def test_the_pipeline_times_each_item_once_and_picks_a_winner_per_problem(
    db, tmp_path, monkeypatch
):
    """Compile on the CPU worker, then the GPU phase on two workers pinned to GPUs 0
    and 1, a problem in one math a task (stand-ins: no GPU is touched).  One GPU
    worker is killed (kill -9) after the first timing: its items are timed on the
    other, and every item has one compile and one timing record.  A rerun finds all of
    it in the database."""
    work = items(budget=3)
    env = dict(gpu="Test GPU", driver=1, nvrtc="12.0", arch="sm_90", device="")

    def compiled(item, arch):
        return dist.compiled_record(item, arch, status="ok", seconds=0.01)

    def group(which, todo, arch, known, final=True):
        time.sleep(0.3)
        device = os.environ["CUDA_VISIBLE_DEVICES"]
        out = [
            dist.gpu_record(
                it,
                dict(env, device=device),
                kind="timing",
                status="ok",
                ms=1.0 + work.index(it) / 100,  # a stand-in time: the first of a group wins
                cudnn_ms=2.0,
                seconds=0.3,
                worker=str(os.getpid()),
            )
            for it in todo
        ]
        spec, batch, precision = which
        winner = dict(env, kind="winner", shape=spec, batch=batch, precision=precision)
        winner.update(variant=dist.finalists(out + known)[0], ms=1.0, cudnn_ms=2.0, tie=False)
        # a group's candidates run apart (final False) leave the winner to a later task
        return out + [dict(winner, date="2026-11-28", seconds=0.01)] if final else out

    client = dist.connect(None, 1, ["0", "1"])
    try:
        gpus = dist.gpu_workers(client)
        assert len(gpus) == 2
        pinned = client.run(lambda: os.environ["CUDA_VISIBLE_DEVICES"], workers=gpus)
        assert sorted(pinned.values()) == ["0", "1"]
        # the GPU workers, and they alone, began ``prepare`` as they started
        preloaded = client.run(lambda: "specgen.gpu_worker" in sys.modules)
        assert preloaded == {a: a in gpus for a in preloaded}
        searches = dist.searched([parse_shape(s) for s in SPECS], "")
        assert dist.work_items(searches, 3, client) == work  # listed on the CPU worker
        victim = client.run(os.getpid, workers=[gpus[0]])[gpus[0]]
        killed = []

        def kill_once(phase, record):
            if phase == "gpu" and not killed:
                os.kill(victim, signal.SIGKILL)
                killed.append(victim)

        tasks = (compiled, group)
        report = dist.tune_on_gpus(client, work, "sm_90", env, progress=kill_once, tasks=tasks)
        assert killed and report["dropped"] == []
        kinds = [
            (r["kind"], r["shape"], r["batch"], r["variant"], r["source"])
            for r in tunedb.records()
            if r["kind"] in ("compiled", "timing")
        ]
        want = [(k, *it.key) for it in work for k in ("compiled", "timing")]
        assert sorted(kinds) == sorted(want), "an item lost or recorded twice"
        groups = {it.group for it in work}
        won = [
            (r["shape"], r["batch"], r["precision"])
            for r in tunedb.records()
            if r["kind"] == "winner"
        ]
        assert sorted(won) == sorted(groups)
        for r in report["winners"]:  # the fastest stand-in of its group
            mine = (r["shape"], r["batch"], r["precision"])
            assert r["variant"] == next(it.variant for it in work if it.group == mine)
        lines = len(tunedb.records())
        again = dist.tune_on_gpus(client, work, "sm_90", env, tasks=tasks)
        assert again["winners"] == [] and len(tunedb.records()) == lines

        # A candidate whose kernel never ends: its group runs past its time, the worker
        # is restarted, the group's candidates run one a task, the hung one is dropped
        # with the reason, and the group still gets its winner from the rest.
        hung = next(
            it
            for it in work
            if sum(o.group == it.group for o in work) > 1
            and it != next(o for o in work if o.group == it.group)
        )

        def hangs(which, todo, arch, known, final=True):
            if hung in todo:
                time.sleep(3600)
            return group(which, todo, arch, known, final)

        monkeypatch.setattr(tunedb, "db_path", lambda: tmp_path / "hung.jsonl")
        monkeypatch.setattr(dist, "WATCH", 0.3)
        monkeypatch.setattr(dist, "STALL", 1.0)
        said = []  # the stall reports: the hung task, where it is, and on which worker
        # 0.5 s a candidate to call it hung, and 6 s more a task, so that a worker
        # starting again on a busy CI machine is not taken for a hung one (at 3 s, one
        # of several runs on 2 loaded cores dropped a second candidate so)
        report = dist.tune_on_gpus(
            client,
            work,
            "sm_90",
            env,
            progress=lambda phase, r: said.append(r) if phase == "stalled" else None,
            tasks=(compiled, hangs),
            item_limit=0.5,
            overhead=6.0,
        )
        assert any("processing on tcp://" in text and "in hangs" in text for text in said), said
        assert len(report["dropped"]) == 1, [r["reason"] for r in report["dropped"]]
        (gone,) = report["dropped"]
        assert gone["variant"] == hung.variant and "past its time limit" in gone["reason"]
        timings = [r["variant"] for r in tunedb.records() if r["kind"] == "timing"]
        assert sorted(timings) == sorted(it.variant for it in work if it != hung)
        assert len(report["winners"]) == len({it.group for it in work})
    finally:
        dist.disconnect(client)


def test_a_whole_model_tune_searches_each_math_where_the_operator_runs_it():
    """``searched``: an fp32 NCHW layer's fp32 math in the layout the operator computes
    fp32 in, its tf32 math where it computes tf32 (NHWC, on the tensor cores), each from
    its pick's speed class up, the pick kept, and each in the other layout too; a bf16
    layer's own math alone (fp32 math is never picked for it once its own runs on the
    tensor cores)."""
    from dataclasses import replace

    from specgen.choose import computed_layout, speed_class
    from specgen.shapes import ConvProblem, DType, Op, TensorLayout
    from specgen.variants import Precision

    wgrad = ConvProblem(C=64, M=128, H=28, W=28, R=3, S=3, pads=(1,) * 4, batch=32, op=Op.WGRAD)
    nchw, nhwc = TensorLayout.NCHW, TensorLayout.NHWC
    found = {
        (precision, p.layout): (floor, keep)
        for p, precision, floor, keep in dist.searched([wgrad], "")
    }
    assert set(found) == {
        (m, lay) for m in (Precision.FP32, Precision.TF32) for lay in (nchw, nhwc)
    }
    assert computed_layout(wgrad, "", False) is nchw
    floor32, keep32 = found[(Precision.FP32, nchw)]
    assert floor32 == speed_class(keep32[0]) == 1 and keep32[0].precision is Precision.FP32
    floortf, keeptf = found[(Precision.TF32, nhwc)]
    assert floortf == 2 and keeptf[0].precision is Precision.TF32
    # each math in the other layout too: an fp32 wgrad has tensor-core kernels in both
    # (tcwgrad's three products in NHWC; in place in NCHW, tc3wgrad's one tf32 product
    # on mma.sync, wgnchw's on wgmma and wgwino's in the Winograd domain, which the
    # planner leaves to the tune)
    assert found[(Precision.FP32, nhwc)][1][0].key == "tcwgrad"
    tf32_nchw = [(replace(wgrad, layout=nchw), Precision.TF32, *found[(Precision.TF32, nchw)])]
    found_keys = {it.variant.split("_")[0] for it in dist.work_items(tf32_nchw, None)}
    assert found_keys == {"tc3wgrad", "wgnchw", "wgwino"}
    bf16 = replace(wgrad, dtype=DType.BF16, layout=TensorLayout.NHWC)
    assert [s[1] for s in dist.searched([bf16], "")] == [Precision.BF16]
    for p, precision, floor, keep in dist.searched([wgrad, bf16], ""):
        items = dist.work_items([(p, precision, floor, keep)], 6)
        # the pick first, so a tune never ends slower (none in a math it does not run)
        assert items[0].variant == keep[0].name if keep else floor == 0
        assert all(it.precision == precision.value for it in items)


@pytest.mark.parametrize("op", ["fprop", "dgrad"])
def test_a_whole_model_tune_searches_an_fp32_layer_in_both_layouts_on_tensor_cores(op):
    """An fp32 NCHW 3x3 layer on sm_90 has tensor-core kernels in both layouts
    (``wgplanar`` in place, ``tcgemm`` and ``wgmma`` in NHWC): each math is searched in
    both, whichever the operator computes it in, so a winner in one layout never keeps the
    other from being timed again, and the compile phase (no GPU, no winners) lists what
    the timed one will.  On sm_80, where NCHW has none, NHWC alone."""
    from specgen.shapes import TensorLayout, parse_shape
    from specgen.variants import Precision

    p = parse_shape(f"C=256,M=256,H=14,W=14,K=3,pad=1,op={op}")
    found = {(s[0].layout, s[1]) for s in dist.searched([p], "", "sm_90")}
    maths = (Precision.FP32, Precision.TF32)
    assert found == {(lay, m) for lay in TensorLayout for m in maths}
    found = {(s[0].layout, s[1]) for s in dist.searched([p], "", "sm_80")}
    assert found == {(TensorLayout.NHWC, m) for m in maths}


def test_a_whole_model_tune_times_wgwino_on_the_widest_7x7_fp32_wgrad_in_nchw():
    """resnet's layer4 3x3 wgrad (512 x 512 weights over 7x7 maps): its fp32 pick in NCHW
    is wgwino's three tf32 products, so the tune searches NCHW in fp32 math too.  While
    the pick there was wtap's CUDA cores, only NHWC was searched, and the layer ran on
    tcwgrad at 0.43-0.47x cuDNN (H200, B=32) where wgwino ran 0.98x."""
    from specgen.shapes import TensorLayout, parse_shape
    from specgen.variants import Precision

    p = parse_shape("C=512,M=512,H=7,W=7,K=3,pad=1,op=wgrad")
    found = {(s[0].layout, s[1]) for s in dist.searched([p], "", "sm_90")}
    assert (TensorLayout.NCHW, Precision.FP32) in found
    nchw = [s for s in dist.searched([p], "", "sm_90") if s[0].layout is TensorLayout.NCHW]
    keys = {it.variant.split("_")[0] for it in dist.work_items(nchw, None)}
    assert "wgwino" in keys


def test_a_whole_model_tune_searches_the_same_with_winners_shipped_or_none():
    """The compile phase lists its searches without a GPU (no winners), the timed phase
    with this GPU's shipped winners, which move ops between layouts: both search the
    same problems in the same maths, so that nothing the timed phase needs is left
    uncompiled and no layout that once lost goes untimed (resnet18's 14x14 fp32 layers
    at B=64 were searched in NHWC alone while their NCHW kernels had become faster)."""
    from dataclasses import replace

    from specgen.shapes import parse_shape

    specs = [
        "C=256,M=256,H=14,W=14,K=3,pad=1",
        "C=256,M=256,H=14,W=14,K=3,pad=1,op=dgrad",
        "C=256,M=256,H=14,W=14,K=3,pad=1,op=wgrad",
        "C=128,M=256,H=28,W=28,K=3,pad=1,stride=2,op=dgrad",
        "C=64,M=64,H=56,W=56,K=3,pad=1",
    ]
    problems = [replace(parse_shape(s), batch=64) for s in specs]

    def searches(gpu):
        return {(p.spec, precision) for p, precision, _, _ in dist.searched(problems, gpu, "sm_90")}

    assert searches("NVIDIA H200") == searches("")


def test_a_depthwise_layers_tune_searches_the_cuda_cores_too():
    """MobileNetV2's depthwise wgrad in bf16 NHWC: its untuned pick runs on the tensor
    cores, whose tiles idle on one channel a group, so its fp32 math (wlane's) and the
    CUDA-core kernels are searched beside the pick (``choose.search_floor``)."""
    from specgen.shapes import parse_shape
    from specgen.variants import Precision

    spec = "C=144,M=144,H=56,W=56,K=3,pad=1,groups=144,dtype=bf16,layout=nhwc,op=wgrad"
    found = {precision: floor for _, precision, floor, _ in dist.searched([parse_shape(spec)], "")}
    assert found == {Precision.BF16: 0, Precision.FP32: 0}
    items = dist.work_items(dist.searched([parse_shape(spec)], ""), None)
    assert {"wlane", "tcwhalo"} <= {it.variant.split("_")[0] for it in items}


def test_a_floored_search_leaves_the_slower_strategies_unplanned_and_samples_the_same():
    """``tune.candidates`` with a floor: the CUDA-core strategies are not enumerated (their
    planners were most of a whole-model tune's setup), and what is left is what pruning
    the whole space would have kept, in the same order, so the sampled items are too."""
    from specgen.choose import speed_class
    from specgen.tune import candidates, prune, sample
    from specgen.variants import Precision

    p = replace(parse_shape("C=128,M=128,H=28,W=28,K=3,pad=1,layout=nhwc"), batch=32)
    whole = candidates(p, Precision.FP32)
    assert {speed_class(v) for v in whole} == {0, 1}
    floored = candidates(p, Precision.FP32, floor=1)
    assert floored == [v for v in whole if speed_class(v) >= 1]
    keep = (floored[-1],)
    assert sample(p, Precision.FP32, prune(floored, 1, keep), 5, keep, floor=1) == sample(
        p, Precision.FP32, prune(whole, 1, keep), 5, keep
    )


def test_each_gpu_worker_warms_up_on_the_smallest_problem_of_each_kind():
    """``warm_up_problems``: one problem for each op, dtype, layout and math the tune's
    cuDNN calls meet, the smallest of its kind."""
    from specgen.variants import Precision

    small = replace(parse_shape("C=64,M=64,H=14,W=14,K=3,pad=1"), batch=8)
    large = replace(parse_shape("C=64,M=64,H=56,W=56,K=3,pad=1"), batch=8)
    wgrad = replace(parse_shape("C=64,M=64,H=56,W=56,K=3,pad=1,op=wgrad"), batch=8)
    searches = [
        (large, Precision.FP32, 0, ()),
        (small, Precision.FP32, 0, ()),
        (large, Precision.TF32, 0, ()),
        (wgrad, Precision.FP32, 0, ()),
    ]
    assert dist.warm_up_problems(searches) == [
        (small, "fp32"),
        (large, "tf32"),
        (wgrad, "fp32"),
    ]


def test_a_gpu_workers_preparation_runs_once_however_often_it_is_asked(monkeypatch):
    """``prepare``, begun by the preload's thread and asked for again by the client's
    task at once, does its work once; both get its seconds."""
    import threading
    import types

    from specgen import bench, gpu_worker

    calls = []
    fake = types.SimpleNamespace(float32="float32")
    fake.zeros = lambda n, dtype: (
        calls.append(n),
        time.sleep(0.2),
        types.SimpleNamespace(sum=int),
    )[2]
    monkeypatch.setitem(sys.modules, "cupy", fake)
    monkeypatch.setitem(sys.modules, "torch", None)  # not installed: cuDNN is not timed
    monkeypatch.setattr(bench, "ceilings", dict)
    monkeypatch.setattr(dist, "_PREPARED", [])
    gpu_worker.dask_setup(worker=None)
    time.sleep(0.05)  # the preload's thread holds the work
    got = []
    asker = threading.Thread(target=lambda: got.append(dist.prepare()))
    asker.start()
    got.append(dist.prepare())
    asker.join()
    assert calls == [1] and len(got) == 2 and got[0] == got[1] >= 0.2


def test_the_longest_groups_go_first():
    """``longest_first``: a group's place by its candidates times its problem's work, so
    the wide layers' long searches start before the small ones'; equal ones keep their
    order."""

    def group(spec, n):
        p = replace(parse_shape(spec), batch=32)
        return [dist.Item(p.spec, p.batch, "fp32", f"v{i}", "h") for i in range(n)]

    small, wide = "C=8,M=8,H=8,W=8,K=3,pad=1", "C=256,M=256,H=56,W=56,K=3,pad=1"
    groups = {
        ("a",): group(small, 40),
        ("b",): group(wide, 10),
        ("c",): group(wide, 40),
        ("d",): group(small, 40),
    }
    assert dist.longest_first(groups) == {("c",): 0, ("b",): 1, ("a",): 2, ("d",): 3}


def test_an_embedded_clusters_workers_are_quieted_before_it_stops():
    """``disconnect``: a worker's heartbeat under way as the scheduler stops fails, and
    the worker would log that with a traceback after a tune that went well; its logs are
    quieted before the client and the cluster close."""
    import logging

    client = dist.connect(None, 1)
    levels = []
    close = client.close

    def closing():
        if not levels:  # (the client closes again as it is collected)
            levels.append(client.run(lambda: logging.getLogger("distributed.worker").level))
        close()

    client.close = closing
    dist.disconnect(client)
    assert levels and list(levels[0].values()) == [logging.CRITICAL]


def test_an_embedded_clusters_workers_leave_the_groups_signals_to_the_tune():
    """Every worker of the embedded cluster ignores SIGINT and SIGTERM: a terminal's
    Ctrl-C and ``timeout``'s SIGTERM reach the whole process group, and the tune's own
    process ends the run and closes the cluster (``cluster_worker``)."""
    import signal

    client = dist.connect(None, 2)
    try:
        found = client.run(lambda: [signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)])
    finally:
        dist.disconnect(client)
    assert len(found) == 2
    assert all(got == [signal.SIG_IGN, signal.SIG_IGN] for got in found.values()), found


@pytest.mark.skipif(not hasattr(os, "killpg"), reason="needs process groups")
def test_ctrl_c_mid_compile_ends_a_tune_in_one_line(tmp_path):
    """SIGINT to the process group of a tune whose compile phase is under way (two
    embedded workers): one line and status 130 at once, no log of lost workers or
    restarts, every record written whole, and no process of the group left."""
    f = tmp_path / "p.txt"
    f.write_text("\n".join(SPECS) + "\n")
    db = tmp_path / "cache" / "tune.jsonl"
    env = dict(os.environ, SPECGEN_CACHE_DIR=str(tmp_path / "cache"))
    args = ["tune", "--problems", str(f), "--budget", "12", "--compile-only", "--workers", "2"]
    with specgen_job(args, env) as proc:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (db.exists() and db.stat().st_size):
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        assert db.exists(), "no compile recorded"
        start = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)
        out, err = proc.communicate(timeout=60)
        took = time.monotonic() - start
    err = err.decode()
    assert proc.returncode == 130, err
    assert err.strip().splitlines()[-1] == "error: interrupted", err
    for word in ("ERROR", "WARNING", "Traceback", "Restarting"):
        assert word not in err, err
    assert took < 10.0, took  # 0.8 s on an idle 2-core machine
    records = [json.loads(line) for line in db.read_text().splitlines()]
    assert records and all(r["kind"] == "compiled" for r in records)
    deadline = time.monotonic() + 10
    while running_in_group(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not running_in_group(proc.pid), "a worker outlived the tune"


def test_a_16_bit_channels_last_wgrad_is_timed_as_the_operator_writes_its_grads(monkeypatch):
    """A tune times a 16-bit channels-last wgrad as the PyTorch operator runs it under
    autocast: dw and db in fp32, dw as [M][R][S][C/g] (``bench.timed_plan``), where the
    plan's sums can be written so; its items' key hashes that source, and the compile
    phase compiles it beside the plan verified.  Other problems are timed as planned."""
    import hashlib

    from specgen import compile as compile_module
    from specgen.plan import make_plan
    from specgen.render import render
    from specgen.strategies import parse_variant_name
    from specgen.bench import timed_grads, timed_plan
    from specgen.tune import source_hash

    spec = "C=128,M=128,H=7,W=7,K=3,pad=1,bias=1,dtype=bf16,layout=nhwc,op=wgrad"
    p = parse_shape(spec)
    real = compile_module.compile_source
    for name in ("wgwtma_b64x128_p4_s2_bf16", "wgwdsm_b64x128_p4_s2_bf16"):
        v = parse_variant_name(name)
        plan, timed = make_plan(p, v), timed_plan(p, v)
        assert timed.context["grads32"] == "mrsc" and "float* __restrict__ dw" in render(timed)
        assert source_hash(p, v) == hashlib.sha256(render(timed).encode()).hexdigest()[:16]
        assert source_hash(p, v) != hashlib.sha256(render(plan).encode()).hexdigest()[:16]
        compiled = []
        monkeypatch.setattr(
            compile_module, "compile_source", lambda src, *a: compiled.append(src) or real(src, *a)
        )
        record = dist.compile_item(dist.Item(spec, 4, "bf16", name, source_hash(p, v)), "sm_90")
        monkeypatch.setattr(compile_module, "compile_source", real)
        assert record["status"] == "ok", record
        assert compiled == [render(plan), render(timed)]
    fprop = parse_shape(spec.replace("op=wgrad", "op=fprop"))
    fp32 = parse_shape(spec.replace("dtype=bf16,", ""))
    assert timed_grads(p) == "mrsc" and timed_grads(fprop) == timed_grads(fp32) == ""
    v = parse_variant_name("wgmma_b64x128_p4_q1_gr_sy_bf16")
    assert render(timed_plan(fprop, v)) == render(make_plan(fprop, v))


def test_a_strategy_search_keeps_the_kernel_the_operator_runs_now_beside_its_space():
    """--strategy with the GPU named: each search keeps this GPU's shipped winner of
    another strategy beside the strategy's space (its winner must beat that kernel in
    the same run), and the work items time it; without the GPU (the compile phase), the
    space alone."""
    from specgen.choose import choose
    from specgen.strategies import Wgwgrad

    spec = "C=128,M=256,H=4,W=4,K=3,pad=1,stride=2,dtype=bf16,layout=nhwc,op=wgrad"
    p = replace(parse_shape(spec), batch=128)
    shipped = choose(p, "NVIDIA H200", False, "sm_90").variant
    assert shipped.key != "wgwgrad"  # resnet18-32's layer3.0.conv1: wgwdsm ships
    (search,) = dist.searched([p], "NVIDIA H200", "sm_90", Wgwgrad)
    ((*_, bare, _),) = dist.searched([p], "", "sm_90", Wgwgrad)
    _, _, floor, keep, key = search
    assert keep == (shipped,) and bare == () and floor == 0 and key == "wgwgrad"
    names = {it.variant for it in dist.work_items([search], 4)}
    assert shipped.name in names and len(names - {shipped.name}) == 3
    assert all(n.startswith("wgwgrad_") for n in names - {shipped.name})


def test_a_strategy_search_keeps_the_kernel_the_operator_runs_now_where_it_is_the_pick():
    """--strategy with the GPU named, where this GPU's shipped winner is the planner's pick
    too (mobilenet_v2's 7x7 depthwise wgrad of 960 channels: wlane both): that kernel is
    kept beside the space, so a slower winner of the strategy cannot replace it."""
    from specgen.choose import choose, planned
    from specgen.strategies import Wdw
    from specgen.variants import Precision

    spec = "C=960,M=960,H=7,W=7,K=3,pad=1,groups=960,dtype=bf16,layout=nhwc,op=wgrad"
    p = replace(parse_shape(spec), batch=64)
    shipped = choose(p, "NVIDIA H200", False, "sm_90").variant
    assert shipped == planned(p, False, "sm_90").variant and shipped.key == "wlane"
    ((*_, keep, key),) = dist.searched([p], "NVIDIA H200", "sm_90", Wdw)
    ((*_, bare, _),) = dist.searched([p], "", "sm_90", Wdw)
    assert keep == (shipped,) and bare == () and key == "wdw"
    names = {it.variant for it in dist.work_items([(p, Precision.FP32, 0, keep, key)], 4)}
    assert shipped.name in names


def test_a_search_keeps_the_kernel_the_operator_runs_now_beside_the_pick():
    """With the GPU named, each search keeps this GPU's shipped winner beside the
    planner's pick (sampled spaces then time the kernel a winner replaces); without it
    (the compile phase) the pick alone."""
    from specgen.choose import choose

    spec = "C=512,M=512,H=7,W=7,K=3,pad=1,dtype=bf16,layout=nhwc,op=wgrad"
    p = replace(parse_shape(spec), batch=32)
    shipped = choose(p, "NVIDIA H200", False, "sm_90").variant
    ((_, _, _, keep),) = [s for s in dist.searched([p], "NVIDIA H200", "sm_90")]
    ((_, _, _, bare),) = [s for s in dist.searched([p], "", "sm_90")]
    assert shipped in keep and keep[0] == bare[0] and len(bare) == 1
    assert shipped != bare[0]  # the layer's shipped winner is not the planner's pick
