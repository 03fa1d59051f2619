"""CPU tier: the command line through click's runner, every bad input included."""

import pytest
from click.testing import CliRunner

from specgen.cli import main


def run(*args):
    return CliRunner().invoke(main, list(args))


def test_shapes_lists_every_preset():
    r = run("shapes")
    assert r.exit_code == 0
    for name in ("layer1", "layer2", "mx-layer2", "ae-dec3"):
        assert name in r.output
    assert "12544" in r.output  # layer2 weight bytes


def test_emit_writes_once_then_leaves_it(tmp_path):
    r = run("emit", "--shape", "layer2", "--tile", "16", "--out", str(tmp_path))
    assert r.exit_code == 0, r.output
    files = list(tmp_path.glob("layer2/*.cu"))
    assert len(files) == 1 and r.output.startswith("wrote ")
    mtime = files[0].stat().st_mtime_ns
    r = run("emit", "--shape", "layer2", "--tile", "16", "--out", str(tmp_path))
    assert r.output.startswith("unchanged ") and files[0].stat().st_mtime_ns == mtime
    assert "specgen emit --shape layer2 --variant" in files[0].read_text().splitlines()[1]


def test_emit_inline_spec(tmp_path):
    r = run(
        "emit",
        "--shape",
        "C=3,M=8,H=9,W=11,K=3,pad=1",
        "--strategy",
        "direct",
        "--out",
        str(tmp_path),
    )
    assert r.exit_code == 0, r.output
    assert list(tmp_path.glob("c3_m8_h9_w11_k3_p1/direct_*.cu"))


@pytest.mark.parametrize(
    "args,needle",
    [
        (["emit", "--shape", "layer7"], "unknown shape 'layer7'; known presets: layer1"),
        (["emit", "--shape", "C=4,M=16,H=40"], "malformed shape spec"),
        (["emit", "--shape", "C=1,M=1,H=4,W=4,K=7"], "larger than the padded image"),
        (["emit", "--shape", "layer2", "--tile", "0"], "'--tile': 0 is not in the range 1<="),
        (
            [
                "emit",
                "--shape",
                "layer2",
                "--tile",
                "64",
                "--coarsening",
                "x1y1m1",
                "--loop-channels",
            ],
            "over the limit of 1024 threads",
        ),
        (
            ["emit", "--shape", "C=64,M=64,H=16,W=16,K=7", "--weights", "const"],
            "over the 65536-byte constant bank; use --weights global",
        ),
        (
            ["emit", "--shape", "ae-enc2", "--tile", "16", "--loop-channels"],
            "shared memory, over the sm_90 limit",
        ),
        (["emit", "--shape", "layer2", "--strategy", "gemm"], "unknown strategy 'gemm'"),
        (["emit", "--shape", "layer2", "--coarsening", "4x4"], "malformed coarsening"),
        (["emit", "--shape", "layer2", "--variant", "tiled_t16_bogus"], "malformed variant name"),
        (
            ["emit", "--shape", "layer1", "--strategy", "mma", "--precision", "tf32"],
            "16 output maps",
        ),
        (["emit", "--shape", "layer1", "--strategy", "split"], "C=1"),
        (
            ["emit", "--shape", "layer2", "--strategy", "mma", "--precision", "fp32"],
            "mma computes in tf32, fp16 or bf16, not fp32; for fp32 use --strategy direct",
        ),
        (["verify"], "give --shape S or --all-shapes"),
        (["run", "--shape", "layer1", "--streams", "0"], "'--streams': 0 is not in the range"),
        (
            ["run", "--shape", "C=1,M=4,H=86,W=86,K=7,op=dgrad"],
            "run convolves host batches forward",
        ),
        (["run", "--shape", "layer1", "--variant", "wgemm_b9_fp32"], "malformed variant name"),
        (
            ["emit", "--shape", "ae-enc2", "--strategy", "stream", "--maps", "96"],
            "maps per block 96 must divide M=128",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, needle, tmp_path):
    r = CliRunner().invoke(main, args + (["--out", str(tmp_path)] if args[0] == "emit" else []))
    assert r.exit_code == 2, r.output
    assert needle in r.output
    assert len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output
    assert not list(tmp_path.rglob("*")), "nothing is written on bad input"


@pytest.mark.parametrize(
    "verb",
    [["bench", "--shape", "layer2"], ["tune", "--shape", "layer2"], ["run", "--shape", "layer1"]],
)
def test_timing_verbs_need_a_gpu(verb):
    from specgen.runtime import gpu_available

    if gpu_available():
        pytest.skip("a GPU is present")
    r = run(*verb)
    assert r.exit_code == 2
    assert "needs a CUDA GPU" in r.output and len(r.output.strip().splitlines()) == 1


def test_verify_without_gpu_compiles_and_says_so():
    from specgen.runtime import gpu_available

    if gpu_available():
        pytest.skip("a GPU is present")
    r = run("verify", "--shape", "layer1", "--strategy", "tiled", "--jobs", "1")
    assert r.exit_code == 0, r.output
    assert "COMPILED" in r.output and "PASS" not in r.output
    last = r.output.strip().splitlines()[-1]
    assert "numbers not checked: that needs a GPU" in last and "passed" not in last


def test_an_option_read_by_several_strategies_parses_alike_for_all(tmp_path):
    """The CLI builds one option per parameter name: strategies that share a name must
    share how its value is written (a wgemm block tile named tile once broke --tile)."""
    from specgen.strategies import TABLE

    kinds = {}
    for cls in TABLE:
        for f in cls.params():
            kind = type(f.metadata["codec"])
            assert kinds.setdefault(f.name, kind) is kind, (cls.key, f.name)
    args = ["--shape", "ae-enc2", "--op", "wgrad", "--strategy", "wgemm", "--blocktile", "64x128"]
    r = run("emit", *args, "--out", str(tmp_path))
    assert r.exit_code == 0, r.output
    assert [f.name for f in (tmp_path / "ae-enc2").iterdir()] == [
        "wgemm_b64x128_k8_s29_fp32_wgrad.cu"
    ]


def test_tune_takes_a_tensor_core_strategy_in_the_tensors_own_math():
    """tune --strategy tcwgrad on a bf16 preset searches bf16, not fp32 (which the
    strategy has not, so every candidate would be refused)."""
    from specgen.cli import _tune_math
    from specgen.shapes import PRESETS, parse_shape
    from specgen.strategies import Stream, Tcwgrad

    assert _tune_math(PRESETS["ae-enc2-bf16"], Tcwgrad) == "bf16"
    assert (
        _tune_math(parse_shape(PRESETS["ae-enc2-bf16"].spec.replace("bf16", "fp16")), Tcwgrad)
        == "fp16"
    )
    assert _tune_math(PRESETS["ae-enc2-bf16"], Stream) == "fp32"
    assert _tune_math(PRESETS["ae-enc2-bf16"], None) == "fp32"


def test_a_strategy_without_precision_takes_the_tensors_own_math(tmp_path):
    """--strategy alone on 16-bit tensors builds the strategy's variant in their dtype
    where it computes in it (mmastrip in fp16 or bf16, mma and mmapersist too), else its
    first precision; a strategy that cannot serve the dtype at all says so in one line."""
    out = ["--out", str(tmp_path)]
    r = run("emit", "--shape", "layer1-bf16", "--strategy", "mmastrip", *out)
    assert r.exit_code == 0 and "mmastrip_t80_r8x10_yd_bf16_iobf16.cu" in r.output, r.output
    spec = "C=1,M=4,H=86,W=86,K=7,dtype=fp16"
    r = run("emit", "--shape", spec, "--strategy", "mmastrip", *out)
    assert r.exit_code == 0 and "_fp16_iofp16.cu" in r.output, r.output
    r = run("emit", "--shape", "layer2-bf16", "--strategy", "mmapersist", *out)
    assert r.exit_code == 0 and "mmapersist_t34_r16x64_bf16_iobf16.cu" in r.output, r.output
    r = run("emit", "--shape", "layer2", "--strategy", "mmapersist", *out)
    assert r.exit_code == 0 and "_tf32.cu" in r.output, r.output
    r = run("emit", "--shape", "layer1", "--strategy", "mmastrip", *out)
    assert r.exit_code == 2 and "fp16 or bf16 tensors" in r.output, r.output
    assert len(r.output.strip().splitlines()) == 1


def test_mmahwc_k_slices_and_wsplit_slices_are_distinct_options(tmp_path):
    """mmahwc's ``--kslices`` (a stack's k steps over warps) does not shadow wsplit's
    ``--atomic/--slices`` flag; slices without stacks are a one-line refusal."""
    out = str(tmp_path)
    r = run(
        "emit", "--shape", "mx-layer2-bf16", "--op", "dgrad", "--strategy", "mmahwc",
        "--tile", "33", "--regtile", "16x16", "--stack", "3", "--kslices", "2", "--out", out,
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert (tmp_path / "mx-layer2-bf16/mmahwc_t33_r16x16_s1_v3_k2_bf16_dgrad_iobf16.cu").exists()
    r = run(
        "emit", "--shape", "ae-enc2", "--op", "wgrad", "--strategy", "wsplit", "--slices",
        "--out", out,
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    r = run(
        "emit", "--shape", "mx-layer2-bf16", "--op", "dgrad", "--strategy", "mmahwc",
        "--stack", "1", "--kslices", "2", "--out", out,
    )  # fmt: skip
    assert r.exit_code == 2 and "take --stack 2" in r.output
    assert len(r.output.strip().splitlines()) == 1


def test_strategies_lists_the_table_and_describes_one():
    from specgen.strategies import TABLE

    r = run("strategies")
    assert r.exit_code == 0, r.output
    assert [line.split()[0] for line in r.output.splitlines()[1:]] == [c.key for c in TABLE]
    r = run("strategies", "tcgemm")
    assert r.exit_code == 0 and "`--blocktile`" in r.output and "gemm/tcgemm.cu.j2" in r.output
    r = run("strategies", "gemm")
    assert r.exit_code == 2 and "unknown strategy 'gemm'" in r.output


def test_docs_strategies_is_the_catalog_of_today():
    from pathlib import Path

    from specgen.strategies.catalog import catalog

    docs = Path(__file__).resolve().parent.parent / "docs" / "strategies.md"
    assert docs.read_text() == catalog(), "docs/strategies.md is stale: run make docs"


def test_each_strategys_templates_are_the_ones_its_plans_render():
    """The catalog's template list is checked against the planner: every default-set
    plan of every preset renders one of its strategy's templates, and each listed
    template exists."""
    from specgen.plan import make_plan
    from specgen.render import TEMPLATES
    from specgen.shapes import PRESETS, Op
    from specgen.strategies import TABLE, default_set

    for cls in TABLE:
        assert cls.templates and all((TEMPLATES / t).is_file() for t in cls.templates), cls.key
    for s in PRESETS.values():
        for op in Op:
            for v in default_set(s.with_op(op)):
                assert make_plan(s.with_op(op), v).template in type(v).templates, v.name


def test_no_variant_option_is_the_operators_pick(tmp_path):
    """emit and verify with no variant option take the kernel the operator would run
    (choose) for --gpu, fitted to --batch, and say which and why; the issue's
    channels-last dgrad, whose fixed default tile did not fit, emits (the winner of
    resnet50's tune on the H200; the planner's default on another GPU)."""
    from dataclasses import replace

    from specgen.choose import choose
    from specgen.shapes import parse_shape

    spec = "C=256,M=256,H=14,W=14,K=3,pad=1,dtype=bf16,layout=nhwc"
    gpu = ("--gpu", "NVIDIA H200")
    r = run("emit", "--shape", spec, "--op", "dgrad", "--batch", "64", *gpu, "--out", str(tmp_path))
    assert r.exit_code == 0, r.output
    (f,) = tmp_path.glob("*/*.cu")
    want = choose(replace(parse_shape(spec + ",op=dgrad"), batch=64), "NVIDIA H200")
    assert f.name == want.variant.kernel_name(parse_shape(spec + ",op=dgrad")) + ".cu"
    # resnet50's layer3 3x3 dgrad: the winner of its whole-model tune on the H200
    assert "the pick on NVIDIA H200: shipped winner of a whole-model tune" in f.read_text()
    r = run(
        "emit", "--shape", spec, "--op", "dgrad", "--gpu", "NVIDIA H100", "--out", str(tmp_path)
    )
    assert r.exit_code == 0, r.output
    assert any("planner default (wgmma" in g.read_text() for g in tmp_path.glob("*/*.cu"))
    # a preset's shipped winner on the H200, and the planner's default with no GPU
    r = run("verify", "--shape", "layer2", *gpu, "--jobs", "1")
    assert r.exit_code == 0 and "shipped winner of preset layer2 on NVIDIA H200" in r.output
    assert r.output.count("COMPILED") == 1
    r = run("verify", "--shape", "layer2", "--op", "dgrad", "--jobs", "1")
    assert "the pick with no GPU present or named" in r.output and "planner default" in r.output


def test_the_pick_says_where_the_operator_computes_a_problem_instead(tmp_path):
    """A problem the operator computes elsewhere (a first layer's wgrad of 40 maps over
    channels padded to 8, a wide bf16 NCHW layer's strided dgrad in NHWC, a 3x3 window
    over 1x1 maps cropped to its centre tap): the pick's line names the
    problem it computes and that problem's kernel, so the kernel the operator runs can
    be emitted."""
    stem = "C=3,M=40,H=224,W=224,K=7,pad=3,stride=2,dtype=bf16,layout=nhwc"
    r = run("emit", "--shape", stem, "--op", "wgrad", "--batch", "32", "--out", str(tmp_path))
    assert r.exit_code == 0, r.output
    (f,) = tmp_path.glob("*/*.cu")
    text = f.read_text()
    assert "the PyTorch operator computes it as C=8,M=40" in text and "with tcwgrad_" in text
    wide = "C=64,M=128,H=28,W=28,K=3,pad=1,stride=2,dtype=bf16"
    r = run("verify", "--shape", wide, "--op", "dgrad", "--jobs", "1")
    assert r.exit_code == 0, r.output
    assert f"computes it as {wide},layout=nhwc,op=dgrad instead" in r.output
    assert "its tensors copied there" in r.output
    last = "C=512,M=512,H=1,W=1,K=3,pad=1"  # resnet18's layer4 at 32x32: the centre tap
    r = run("verify", "--shape", last, "--op", "wgrad", "--batch", "128", "--jobs", "1")
    assert r.exit_code == 0, r.output
    assert "computes it as C=512,M=512,H=1,W=1,K=1,pad=0,op=wgrad instead" in r.output
    assert "over the taps of its window that meet x" in r.output


def test_precision_alone_asks_for_the_pick_in_that_math(tmp_path):
    """--precision without other variant options: the operator's pick with tf32 allowed
    (a strided fp32 dgrad's wgplanar phases in tf32, not the planner's first strategy);
    math the tensors cannot take is one line and status 2."""
    from specgen.choose import choose
    from specgen.shapes import parse_shape

    spec = "C=256,M=512,H=56,W=56,K=1,stride=2"
    gpu = ("--gpu", "NVIDIA H200")
    r = run(
        "emit",
        "--shape",
        spec,
        "--op",
        "dgrad",
        "--precision",
        "tf32",
        *gpu,
        "--out",
        str(tmp_path),
    )
    assert r.exit_code == 0, r.output
    (f,) = tmp_path.glob("*/*.cu")
    p = parse_shape(spec + ",op=dgrad")
    assert f.name == choose(p, "NVIDIA H200", allow_tf32=True).variant.kernel_name(p) + ".cu"
    assert (
        f.name.startswith("wgplanar_") and "the pick on NVIDIA H200, tf32 allowed" in f.read_text()
    )
    r = run("emit", "--shape", spec, "--op", "dgrad", "--precision", "bf16", "--out", str(tmp_path))
    assert r.exit_code == 2 and "not bf16" in r.output and "Traceback" not in r.output


def test_a_many_problem_tunes_setup_is_said_step_by_step(monkeypatch):
    """The line a timed tune prints before its first item: the setup's seconds in all,
    then each step's, in order, summing to the whole."""
    from specgen import cli

    clock = iter([10.0, 12.5, 16.0, 16.25])
    monkeypatch.setattr(cli.time, "perf_counter", lambda: next(clock))
    setup = cli._Setup()
    for step in ("problems", "cluster up", "items listed"):
        setup.mark(step)
    assert setup.line() == "setup 6.2 s: problems 2.5 s, cluster up 3.5 s, items listed 0.2 s"


def test_timings_from_resumes_many_problem_tunes_only(tmp_path):
    """``--timings-from`` with one problem, or a file that is not there: one line and
    exit status 2."""
    r = run("tune", "--shape", "layer2", "--timings-from", str(tmp_path / "t.jsonl"))
    assert r.exit_code == 2 and "--problems or --model" in r.output
    problems = tmp_path / "p.txt"
    problems.write_text("layer2\n")
    missing = tmp_path / "missing.jsonl.gz"
    r = run("tune", "--problems", str(problems), "--compile-only", "--timings-from", str(missing))
    assert r.exit_code == 2 and "cannot read timings from" in r.output
    assert "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1


def test_bench_of_every_op_times_each_ops_own_pick(monkeypatch, tmp_path):
    """``bench --shape P --op all``: every op of the preset gets its own pick and its own
    row of the report.  Keyed by the preset's name alone, the last op's pick (bgrad's
    wsplit) was handed to the forward pass, which refused it.  (The GPU and the timing
    stood in for: this checks what the command hands the bench.)"""
    import json

    from specgen import bench, cli

    from specgen.plan import make_plan

    handed = {}

    def fake_bench(shapes, batch, variants, best, echo):
        handed.update({bench.report_key(s): (s, variants[bench.report_key(s)]) for s in shapes})
        return dict(shapes={bench.report_key(s): dict(spec=s.spec) for s in shapes})

    monkeypatch.setattr(cli, "_need_gpu", lambda verb: None)
    monkeypatch.setattr(bench, "device_name", lambda: "NVIDIA H200")
    monkeypatch.setattr(bench, "run_bench", fake_bench)
    out = tmp_path / "report.json"
    r = run("bench", "--shape", "ae-enc2-bf16", "--op", "all", "--json", str(out))
    assert r.exit_code == 0, r.output
    assert sorted(handed) == [
        "ae-enc2-bf16",
        "ae-enc2-bf16 bgrad",
        "ae-enc2-bf16 dgrad",
        "ae-enc2-bf16 wgrad",
    ]
    for key, (shape, (v,)) in handed.items():
        assert shape.op.value == (key.partition(" ")[2] or "fprop")
        make_plan(shape, v)  # the pick serves its own op (the forward pass refused wsplit)
    report = json.loads(out.read_text())
    assert [d["spec"].endswith("op=dgrad") for d in report["shapes"].values()].count(True) == 1


def test_the_roofline_reads_each_problem_back_from_the_report(tmp_path):
    """``--plot`` draws every row of a report, an inline problem's and another op's
    included: it reads each problem from the spec the report keeps (an inline
    problem's slug does not parse, and a preset's name does not say the op)."""
    pytest.importorskip("matplotlib")
    from specgen.bench import report_key
    from specgen.plot import roofline
    from specgen.shapes import PRESETS, Op, parse_shape

    shapes = [
        parse_shape("C=144,M=24,H=56,W=56,K=1,pad=0,dtype=bf16,layout=nhwc,op=dgrad"),
        PRESETS["ae-enc2-bf16"],
        PRESETS["ae-enc2-bf16"].with_op(Op.WGRAD),
    ]
    row = dict(label="cudnn-bf16", precision="bf16", tflops=40.0)
    report = dict(
        device="NVIDIA H200",
        ceilings=dict(copy_bytes_per_s=3e12, fp32_flops_per_s=6e13, tensor_flops_per_s=7e14),
        shapes={report_key(s): dict(batch=64, spec=s.spec, rows=[row]) for s in shapes},
    )
    assert len(report["shapes"]) == 3
    roofline(report, tmp_path / "roof.png")
    assert (tmp_path / "roof.png").read_bytes()[:4] == b"\x89PNG"
