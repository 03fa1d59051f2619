"""``specgen model``: the conv layers of a torchvision model, the picks listed without a
GPU (``--plan``), and its refusals.  The tracing tests need PyTorch and torchvision (the
``model`` extra) and are skipped without them; the refusal without them runs anywhere."""

import importlib.util

import itertools

import pytest
from click.testing import CliRunner

from specgen.cli import main

HAVE_TORCHVISION = importlib.util.find_spec("torchvision") is not None


def run(*args):
    return CliRunner().invoke(main, list(args))


@pytest.mark.skipif(HAVE_TORCHVISION, reason="checks the refusal without torchvision")
def test_without_torchvision_it_says_what_to_install():
    r = run("model", "resnet18", "--plan")
    assert r.exit_code == 2
    assert r.output.count("\n") == 1 and "specgen[model]" in r.output


needs_torchvision = pytest.mark.skipif(not HAVE_TORCHVISION, reason="needs torchvision")


@needs_torchvision
def test_resnet18_layers_as_one_forward_pass_meets_them():
    """20 conv calls at 64x64: the stem's 7x7 at stride 2 over 3 channels, whose input
    needs no gradient (no dgrad), then 3x3 and 1x1 layers whose inputs do."""
    import torch

    from specgen.torch._trace import conv_layers
    from specgen.torch.model import build

    layers = conv_layers(build("resnet18"), torch.empty(2, 3, 64, 64))
    assert len(layers) == 20
    stem = layers[0]
    assert stem.name == "conv1" and stem.x_size == (2, 3, 64, 64) and not stem.needs_dx
    assert stem.w_size == (64, 3, 7, 7) and stem.stride == (2, 2) and stem.pads == (3,) * 4
    assert all(l.needs_dx for l in layers[1:])
    down = [l for l in layers if "downsample" in l.name]
    assert len(down) == 3 and all(l.w_size[2:] == (1, 1) and l.stride == (2, 2) for l in down)


@needs_torchvision
def test_plan_lists_a_pick_for_every_problem_and_op():
    """--plan: one row per distinct problem and op, each with a kernel; the wide NCHW
    layers' forward passes in place on the tensor cores (wgplanar's three tf32 products),
    the stem's wgrad in place in fp32 and over channels padded to 8 in bf16."""
    import torch

    from specgen.torch._trace import conv_layers, plan_rows
    from specgen.torch.model import MODES, build

    layers = conv_layers(build("resnet18"), torch.empty(8, 3, 64, 64))
    rows = plan_rows(layers, MODES["fp32"], "NVIDIA H200", "sm_90")
    assert {r.op for r in rows} == {"fprop", "dgrad", "wgrad"}
    assert all(r.kernel != "-" and r.pick for r in rows)
    assert not [r for r in rows if r.layer == "conv1" and r.op == "dgrad"]
    wide = [r for r in rows if r.op == "fprop" and r.layer.startswith("layer")]
    shipped = [r for r in wide if r.source == "shipped"]  # an autoencoder preset's geometry
    assert len(shipped) == 1 and shipped[0].computed == "nchw"
    planned = [r for r in wide if r.source == "planned"]
    assert planned and all(
        r.computed == "nchw" and r.kernel.startswith("wgplanar_") for r in planned
    )
    r = run("model", "resnet18", "--plan", "--batch", "8", "--image", "64", "--modes", "bf16")
    assert r.exit_code == 0, r.output
    fused = "batch norm: 20 on specgen's kernels, 17 with the activation after them, 8 adding"
    assert fused in r.output  # the stem's and every block's; a shortcut a block
    assert "8 adding a shortcut, 20 one node with the convolution before them" in r.output
    assert "residual stages: 19 pairs as one chain" in r.output
    r2 = run("model", "resnet18", "--plan", "--batch", "8", "--modes", "bf16", "--no-fuse")
    assert "batch norm: 20 on specgen's kernels, none fused; max pool: 0 of 1 on" in r2.output
    assert "wgmma_" in r.output and "bf16 (bf16, nhwc)" in r.output
    stem = [l for l in r.output.splitlines() if l.startswith("conv1 ") and "wgrad" in l]
    # the stem's wgrad on tensor cores over its own three channels, none padded in
    assert len(stem) == 1 and "C=3," in stem[0] and "wfew_" in stem[0] and "nhwc" in stem[0]


@needs_torchvision
@pytest.mark.parametrize(
    "flags, line",
    [
        ((), "no batch norm; max pool: 5 of 5 on specgen's kernels, 5 with the ReLU before them\n"),
        (("--no-fuse",), "no batch norm; max pool: 5 of 5 on specgen's kernels\n"),
        (("--no-batchnorm",), "no batch norm; max pool: 0 of 5 on specgen's kernels\n"),
    ],
)
def test_the_plan_says_what_the_conversion_makes_of_vgg11s_max_pools(flags, line):
    r = run("model", "vgg11", "--plan", "--batch", "8", "--modes", "fp32", *flags)
    assert r.exit_code == 0, r.output
    assert line in r.output


@needs_torchvision
@pytest.mark.parametrize(
    "args,words",
    [
        (("no_such_net", "--plan"), "torchvision has no model"),
        (("resnet18", "--plan", "--modes", "fp64"), "--modes"),
        (("resnet18", "--plan", "--arch", "sm_70"), "sm_70"),
        (("resnet18", "--plan", "--batch", "0"), "batch"),
    ],
)
def test_bad_arguments_are_one_line_and_status_2(args, words):
    r = run("model", *args)
    assert r.exit_code == 2, r.output
    assert words in r.output and "Traceback" not in r.output


@needs_torchvision
def test_a_converted_model_traces_as_called_and_warmup_compiles_its_picks(monkeypatch):
    """The trace takes specgen's own Conv2d, the example's dtype and memory format, a
    padding mode (padded first, convolved unpadded) and frozen weights (no wgrad);
    precompile_model hands every pick to the parallel compile at once, and does nothing
    for an example off the GPU."""
    import torch

    import specgen.torch as sg
    from specgen.shapes import DType, Op, TensorLayout
    from specgen.torch import _engine as E
    from specgen.torch import _trace as M
    from specgen.tune import tune_space

    net = torch.nn.Sequential(
        torch.nn.Conv2d(16, 32, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.Conv2d(32, 64, 3, stride=2, padding=1, bias=False),
    )
    net[0].weight.requires_grad_(False)
    net = sg.convert(net).to(torch.bfloat16)
    x = torch.randn(4, 16, 20, 20, dtype=torch.bfloat16).contiguous(
        memory_format=torch.channels_last
    )
    first, second = M.conv_layers(net, x)
    assert first.x_size == (4, 16, 20, 20) and first.pads == (1, 1, 1, 1)
    circular = sg.convert(torch.nn.Conv2d(16, 8, 3, padding=(1, 2), padding_mode="circular"))
    (alone,) = M.conv_layers(circular, torch.empty(2, 16, 10, 10))
    assert alone.x_size == (2, 16, 12, 14) and alone.pads == (0, 0, 0, 0)
    assert first.ops() == [Op.FPROP] and second.ops() == [Op.FPROP, Op.DGRAD, Op.WGRAD]
    assert second.dtype is DType.BF16 and second.layout is TensorLayout.NHWC
    assert second.x_size == (4, 32, 20, 20) and second.stride == (2, 2)
    assert M.precompile_model(net, (x,)) == 0  # on the CPU: nothing to compile for

    compiled = []
    monkeypatch.setattr(M, "precompile", lambda items, arch, jobs, label: compiled.extend(items))
    monkeypatch.setattr(E, "gpu_name", lambda index: "NVIDIA H200")
    monkeypatch.setattr(E, "arch_of", lambda index: "sm_90")
    monkeypatch.setattr(E, "allow_tf32", lambda: False)
    assert M.precompile_model(net, (x,), index=0) == 4
    assert {it[0].op for it in compiled} == {Op.FPROP, Op.DGRAD, Op.WGRAD}
    assert all(it[1].tensor_core for it in compiled if it[0].op is not Op.FPROP or it[0].C == 32)
    # the wgrad as the operator runs it: bf16 weights, so dw in bf16, not fp32 (dw_orders)
    assert [it[2:] for it in compiled if it[0].op is Op.WGRAD] == [("",)]
    # under autotuning: every candidate of each problem's tune too, the picks among them,
    # in the background, in the order the run meets the problems: the forward pass's,
    # then the backward's from the last layer
    picks = list(compiled)
    compiled.clear()
    monkeypatch.setattr(E, "compile_behind", lambda items, arch: compiled.extend(items))
    n = M.precompile_model(net, (x,), index=0, autotune=True)
    assert n == len(compiled) > len(picks) and set(picks) <= set(compiled)
    order = list(dict.fromkeys(p for p, *_ in compiled))  # problems, as first handed
    assert [(p.op, p.C) for p in order] == [
        (Op.FPROP, 16),
        (Op.FPROP, 32),
        (Op.DGRAD, 32),
        (Op.WGRAD, 32),
    ], order
    assert [p for p, _ in itertools.groupby(p for p, *_ in compiled)] == order  # together
    # each problem's candidates as its tune lists them (run_tune's tune_space, per math)
    for p, v, *_ in picks:
        pick = E.choose(p, "NVIDIA H200", False, "sm_90")
        for precision, floor in E.tuned_maths(p, pick, False):
            space = tune_space(p, precision, E.AUTOTUNE_BUDGET, floor=floor, keep=(v,))
            assert v in space and {(p, c) for c in space} <= set(compiled)


def test_the_built_in_unet_plans_its_transposed_layers_as_dgrad_first():
    """``specgen model unet --plan`` (no torchvision needed): each ConvTranspose2d runs
    as its adjoint convolution, the forward pass on dgrad, its gradients on fprop and
    wgrad."""
    pytest.importorskip("torch")
    r = run("model", "unet", "--plan", "--modes", "fp32")
    assert r.exit_code == 0, r.output
    ops = [line.split()[2] for line in r.output.splitlines() if line.startswith("up2 ")]
    assert ops == ["dgrad", "fprop", "wgrad"]


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs PyTorch")
def test_the_first_steps_run_in_fresh_processes_cold_then_warm():
    """cuDNN's, then specgen's twice on one disk cache that starts empty; each child's
    JSON line read back and put in a table with the targets."""
    import json
    import os

    from specgen.torch import model as m

    seen = []

    def child(args, env):
        cache = env["SPECGEN_CACHE_DIR"]
        seen.append((args[-1], cache, sorted(os.listdir(cache))))
        open(os.path.join(cache, f"run{len(seen)}"), "w").close()  # what a run leaves
        return json.dumps(dict(import_s=1.0, setup_s=0.5, first_s=2.0 * len(seen), second_s=0.01))

    found = m.first_steps("unet", 4, 32, m.MODES["bf16"], child=child)
    assert [engine for engine, _, _ in seen] == ["cudnn", "specgen", "specgen"]
    assert len({cache for _, cache, _ in seen}) == 1 and not os.path.exists(seen[0][1])
    assert seen[1][2] == ["run1"] and seen[2][2] == ["run1", "run2"]  # cold, then warm
    assert [r["first_s"] for r in found.values()] == [2.0, 4.0, 6.0]
    table = m.format_first_steps({("bf16", who): r for who, r in found.items()})
    assert "cold <= cuDNN's + 20 s" in table and "specgen, warm cache" in table
    assert table.splitlines()[-1].split()[-4:] == ["1.00", "0.50", "6.00", "0.010"]


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs PyTorch")
def test_the_first_step_child_reports_one_json_line(monkeypatch, capsys):
    """The child's own code, on the CPU: the built-in U-Net built, converted and trained
    two steps (the operator's fallback computes there), its times as one JSON line."""
    import json

    import torch

    from specgen.torch import first_step
    from specgen.torch import model as m

    def on_cpu(batch, image, mode, classes, seed=0):
        return torch.randn(batch, 3, image, image), torch.randn(batch, 3, image, image)

    monkeypatch.setattr(m, "_prepare", lambda model, mode: model)
    monkeypatch.setattr(m, "_inputs", on_cpu)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    for engine in ("cudnn", "specgen"):
        first_step.main(["unet", "2", "16", "fp32", engine])
        report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert report["engine"] == engine and report["mode"] == "fp32"
        assert report["first_s"] > 0 and report["second_s"] > 0 and report["import_s"] >= 0
        assert report["setup_s"] > 0


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs PyTorch")
def test_a_run_stopped_while_timing_layers_has_printed_its_steps(monkeypatch):
    """The steps of a mode are printed before its layers are timed, the long part: a
    run stopped there (a time limit's SIGTERM, Ctrl-C) keeps them; a whole run of two
    modes prints each mode's, then both together.  The GPU's parts stubbed: the
    built-in U-Net planned on the CPU."""
    import torch

    from specgen.torch import _engine
    from specgen.torch import model as m

    err = {"cuDNN": (1e-5, 2e-2), "specgen": (1.4e-5, 1.9e-2)}
    times = {("cuDNN", "eager"): 3.0, ("specgen", "eager"): 2.0}
    monkeypatch.setattr(_engine, "gpu_name", lambda index: "NVIDIA H200")
    monkeypatch.setattr(_engine, "arch_of", lambda index: "sm_90")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(m, "precompile", lambda *args: {})
    monkeypatch.setattr(m, "accuracy", lambda *args: err)
    monkeypatch.setattr(m, "step_ms", lambda *args: times)
    timed = []

    def layer_times(layers, rows, mode, sg):
        if mode.name == "tf32":
            raise KeyboardInterrupt  # stopped while timing the second mode's layers
        for r in rows:
            r.specgen_ms, r.cudnn_ms = 1.0, 1.5
        timed.append(mode.name)

    monkeypatch.setattr(m, "layer_times", layer_times)
    out = []
    modes = [m.MODES["fp32"], m.MODES["tf32"]]
    with pytest.raises(KeyboardInterrupt):
        m.run("unet", 2, 32, modes, 5, False, True, out.append, lambda text: None)
    steps = [i for i, text in enumerate(out) if "training step" in text]
    assert timed == ["fp32"] and len(steps) == 2  # fp32's and tf32's, before the stop
    assert "tf32" in out[-1] and "1.50x" in out[-1]
    out.clear()
    monkeypatch.setattr(m, "layer_times", lambda layers, rows, mode, sg: None)
    m.run("unet", 2, 32, modes, 5, False, True, out.append, lambda text: None)
    steps = [text for text in out if "training step" in text]
    assert len(steps) == 3 and "fp32" in steps[-1] and "tf32" in steps[-1]
    out.clear()
    m.run("unet", 2, 32, modes[:1], 5, False, True, out.append, lambda text: None)
    assert len([text for text in out if "training step" in text]) == 1


@needs_torchvision
def test_the_slow_layer_ops_are_written_as_a_problems_file_after_each_mode(monkeypatch, tmp_path):
    """--slow-out: after each mode's layer table, the problems of its ops below 0.8x
    cuDNN go to the file, each once with the modes it was slow in, as specgen tune
    --problems reads them; a run stopped in a later mode keeps the modes timed before.
    The GPU's parts stubbed: the built-in U-Net planned on the CPU."""
    import torch

    from specgen.dist import problems_file
    from specgen.torch import _engine
    from specgen.torch import model as m

    monkeypatch.setattr(_engine, "gpu_name", lambda index: "NVIDIA H200")
    monkeypatch.setattr(_engine, "arch_of", lambda index: "sm_90")
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(m, "precompile", lambda *args: {})
    monkeypatch.setattr(m, "accuracy", lambda *args: {"cuDNN": (0, 0), "specgen": (0, 0)})
    monkeypatch.setattr(
        m, "step_ms", lambda *args: {("cuDNN", "eager"): 1, ("specgen", "eager"): 1}
    )
    slow = {}

    def layer_times(layers, rows, mode, sg):
        if mode.name == "bf16":
            raise KeyboardInterrupt
        for i, r in enumerate(rows):  # every third row at 0.5x (fp32) or 0.7x (tf32)
            r.specgen_ms, r.cudnn_ms = 1.0, (0.5 if mode.name == "fp32" else 0.7, 0.8, 2.0)[i % 3]
        slow[mode.name] = {r.spec for r in rows[::3]}

    monkeypatch.setattr(m, "layer_times", layer_times)
    path = tmp_path / "slow.txt"
    modes = [m.MODES[k] for k in ("fp32", "tf32", "bf16")]
    with pytest.raises(KeyboardInterrupt):
        m.run(
            "unet", 2, 32, modes, 5, False, True, lambda t: None, lambda t: None, slow_out=str(path)
        )
    text = path.read_text()
    assert (
        text.startswith("# specgen model unet --batch 2 --image 32: ") and "in fp32, tf32\n" in text
    )
    assert f"# specgen tune --problems {path} --batch 2\n" in text
    found = {p.spec for p in problems_file(path)}
    assert found == slow["fp32"] | slow["tf32"] and len(found) == len(text.splitlines()) - 2
    assert all(line.endswith("# fp32, tf32") for line in text.splitlines()[2:])  # fp32 specs


@needs_torchvision
@pytest.mark.parametrize("flag", ["--plan", "--no-layers"])
def test_slow_out_without_timed_layers_is_one_line_and_status_2(flag, tmp_path):
    r = run("model", "resnet18", flag, "--slow-out", str(tmp_path / "slow.txt"))
    assert r.exit_code == 2 and "--slow-out" in r.output and "Traceback" not in r.output
    r = run("model", "resnet18", "--slow-out", str(tmp_path / "no" / "slow.txt"))
    assert r.exit_code == 2 and "does not exist" in r.output


@needs_torchvision
def test_slow_out_into_a_directory_it_cannot_write_is_refused_before_the_run(monkeypatch, tmp_path):
    import specgen.cli as cli

    monkeypatch.setattr(cli.os, "access", lambda path, mode: False)  # (root writes anywhere)
    r = run("model", "resnet18", "--slow-out", str(tmp_path / "slow.txt"))
    assert r.exit_code == 2 and "not writable" in r.output and r.output.count("\n") == 1


@needs_torchvision
def test_the_layer_table_is_summed_by_op():
    """Below the per-layer table: each op's problems, the two sums, their ratio and how
    many fall below 0.8x cuDNN; untimed rows left out."""
    from specgen.torch._trace import Row
    from specgen.torch.model import format_op_sums

    def row(op, ours, theirs):
        return Row("l", "C=8,M=8,H=8,W=8,K=3", op, "nchw", "k", "planned", ours, theirs)

    rows = [row("fprop", 1.0, 1.0), row("wgrad", 1.0, 0.5), row("wgrad", 1.0, 0.9)]
    rows.append(row("dgrad", None, 1.0))
    lines = [line.split() for line in format_op_sums(rows).splitlines()]
    assert lines[0][:2] == ["op", "problems"]
    assert lines[1] == ["fprop", "1", "1.000", "1.000", "1.00x", "0"]
    assert lines[2] == ["wgrad", "2", "2.000", "1.400", "0.70x", "1"]
    assert lines[3] == ["all", "3", "3.000", "2.400", "0.80x", "1"]


@needs_torchvision
def test_the_step_table_shows_a_failed_capture_and_why():
    """A CUDA graph whose capture failed is shown as failed in its row, with the one-line
    reason below the table, and the other rows and columns keep their figures."""
    from specgen.torch import model as m

    err = {"cuDNN": (1e-5, 2e-2), "specgen": (1.4e-5, 1.9e-2)}
    ok = {("cuDNN", "eager"): 38.0, ("specgen", "eager"): 31.0}
    fine = {**ok, ("cuDNN", "graph"): 36.0, ("specgen", "graph"): 27.7}
    why = "CUDA error: operation failed due to a previous error during capture"
    broke = {**ok, ("cuDNN", "graph"): 16.8, ("specgen", "graph"): why}
    table = m.format_steps([(m.MODES["fp32"], err, fine), (m.MODES["tf32"], err, broke)], True)
    rows = table.splitlines()
    fp32 = next(r for r in rows if r.startswith("fp32"))
    tf32 = next(r for r in rows if r.startswith("tf32"))
    assert "1.23x" in fp32 and "1.30x" in fp32 and "failed" not in fp32
    assert "16.800" in tf32 and "failed" in tf32 and "1.23x" in tf32
    assert rows[-1] == f"tf32 on specgen: the CUDA graph's capture failed: {why}"
    eager_only = m.format_steps([(m.MODES["tf32"], err, ok)], False)
    assert "graph" not in eager_only.splitlines()[1] and "failed" not in eager_only


@needs_torchvision
def test_a_model_whose_constructor_reads_tensor_values_is_sized_on_the_cpu(monkeypatch):
    """``build_sizes`` (what ``specgen tune --model`` traces): the meta device, else the
    CPU where the constructor reads a tensor's value (regnet's widths, computed with
    torch.round(...).tolist(), have none on the meta device)."""
    import torch

    from specgen.torch import model as m

    met = []

    def build(name):
        width = torch.tensor([8.0]) * 2
        met.append(width.device.type)
        return torch.nn.Conv2d(3, int(width.item()), 3)

    monkeypatch.setattr(m, "build", build)
    net = m.build_sizes("some model")
    assert met == ["meta", "cpu"] and net.out_channels == 16


@needs_torchvision
def test_a_model_that_refuses_the_image_size_is_one_line_and_status_2():
    """inception_v3's auxiliary head needs 299-pixel images: at 224 the model's own
    forward pass refuses, said in one line; its default size is 299."""
    r = run("model", "inception_v3", "--plan", "--image", "224", "--modes", "bf16")
    assert r.exit_code == 2, r.output
    line = r.output.strip().splitlines()[-1]
    assert line.startswith("error: inception_v3 does not run on 224x224 images: ")
    assert "Traceback" not in r.output
    r = run("model", "inception_v3", "--plan", "--modes", "bf16")
    assert r.exit_code == 0 and "299x299" in r.output
    # a model whose forward pass takes no batch of images (a video model's 5-D clips)
    r = run("model", "r3d_18", "--plan", "--batch", "2", "--modes", "bf16")
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert r.output.strip().splitlines()[-1].startswith("error: r3d_18 does not run on 224x224")


@needs_torchvision
def test_a_segmentation_model_builds_without_a_pretrained_backbone():
    """torchvision's segmentation models load an ImageNet backbone by default (a
    download); specgen's random-weight models ask for none, so --plan runs offline."""
    r = run("model", "fcn_resnet50", "--plan", "--batch", "2", "--modes", "bf16")
    assert r.exit_code == 0, r.output
    assert "fcn_resnet50, batch 2, 224x224" in r.output and "Downloading" not in r.output


@needs_torchvision
def test_the_loss_takes_a_classifiers_a_segmenters_and_an_image_models_output():
    """What the training step's loss compares: a classifier's classes, a segmentation
    model's class a pixel (its ``out`` entry), inception_v3's logits without the
    auxiliary head training adds; the built-in U-Net's image (mean squared error)."""
    import torch

    from specgen.torch import model as m

    assert m._target(m.build("resnet18"), 2, 64) == (1000,)
    assert m._target(m.build("fcn_resnet50"), 2, 64) == (21, 64, 64)
    inception = m.build("inception_v3")
    assert inception.training and m._target(inception, 2, 299) == (1000,)
    assert m._target(m.build("unet"), 2, 64) is None
    logits, aux = torch.zeros(2, 5), torch.ones(2, 5)
    assert m._main_output({"out": logits, "aux": aux}) is logits
    assert m._main_output((logits, aux)) is logits and m._main_output(logits) is logits


@needs_torchvision
def test_the_accuracy_check_turns_off_every_random_layer_but_keeps_batch_norm_training():
    """efficientnet_b0's stochastic depth draws its masks per dtype as dropout does: the
    float64 reference and the fp32 runs would drop different residual branches (both
    runs' outputs 0.9 from float64 where they were on). Batch norm keeps the batch's
    statistics."""
    import torch
    import torchvision
    from torchvision.ops import StochasticDepth

    from specgen.torch.model import _no_dropout

    net = _no_dropout(torchvision.models.efficientnet_b0().train())
    kinds = {type(m) for m in net.modules()}
    assert StochasticDepth in kinds and torch.nn.Dropout in kinds
    for m in net.modules():
        if isinstance(m, (StochasticDepth, torch.nn.Dropout)):
            assert not m.training
        if isinstance(m, torch.nn.BatchNorm2d):
            assert m.training
    x = torch.randn(2, 3, 32, 32)
    assert torch.equal(net(x), net(x))  # no mask drawn (batch norm in train mode: same batch)
