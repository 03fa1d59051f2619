"""``specgen model``: the conv layers of a torchvision model, the picks listed without a
GPU (``--plan``), and its refusals.  The tracing tests need PyTorch and torchvision (the
``model`` extra) and are skipped without them; the refusal without them runs anywhere."""

import importlib.util

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
    from specgen.torch.model import build, conv_layers

    layers = conv_layers(build("resnet18"), 2, 64)
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
    layers computed in NHWC on the tensor cores, the stem's wgrad in place."""
    from specgen.torch.model import MODES, build, conv_layers, plan_rows

    layers = conv_layers(build("resnet18"), 8, 64)
    rows = plan_rows(layers, MODES["fp32"], "NVIDIA H200", "sm_90")
    assert {r.op for r in rows} == {"fprop", "dgrad", "wgrad"}
    assert all(r.kernel != "-" and r.pick for r in rows)
    assert not [r for r in rows if r.layer == "conv1" and r.op == "dgrad"]
    wide = [r for r in rows if r.op == "fprop" and r.layer.startswith("layer")]
    assert wide and all(r.computed == "nhwc" and r.kernel.startswith("tcgemm_") for r in wide)
    r = run("model", "resnet18", "--plan", "--batch", "8", "--image", "64", "--modes", "bf16")
    assert r.exit_code == 0, r.output
    assert "wgmma_" in r.output and "bf16 (bf16, nhwc)" in r.output


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
