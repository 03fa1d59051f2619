"""Batch norm's kernels (``templates/torch/batchnorm.cu.j2``) without a GPU: they compile
for sm_90 without spills, their blocks tile the channels exactly, and the module that
``convert`` puts in place of PyTorch's is PyTorch's batch norm wherever the kernels do
not run (here: CPU tensors), state and all."""

import copy
from collections import Counter

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from specgen.compile import compile_source
from specgen.errors import SpecError
from specgen.runtime import BN_THREADS, batchnorm_shape, batchnorm_source

KERNELS = ("stats", "finalize", "apply", "reduce", "dfinalize", "dapply")


@settings(
    max_examples=8, deadline=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck)
)
@given(
    copies=st.integers(1, 300),
    dtype=st.sampled_from(["bf16", "fp16", "fp32"]),
    affine=st.booleans(),
    running=st.booleans(),
    eps=st.sampled_from([1e-5, 1e-3, 0.0]),
    act=st.sampled_from([None, "relu", "relu6"]),
    residual=st.booleans(),
)
def test_every_kernel_compiles_without_spills(copies, dtype, affine, running, eps, act, residual):
    V = 4 if dtype == "fp32" else 8
    name, text = batchnorm_source(dtype, copies * V, eps, affine, running, None, act, residual)
    binary = compile_source(text, f"{name}_stats", "sm_90", cache=False)
    assert set(binary.resources) == {f"{name}_{k}" for k in KERNELS}
    for kernel, r in binary.resources.items():
        assert r.spills == 0 and r.stack == 0, f"{kernel}: {r}"


@settings(
    max_examples=6, deadline=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck)
)
@given(
    C=st.integers(1, 3000),
    HW=st.sampled_from([1, 7, 49, 196, 3136, 12544]),
    dtype=st.sampled_from(["bf16", "fp16", "fp32"]),
    affine=st.booleans(),
    act=st.sampled_from([None, "relu", "relu6"]),
    residual=st.booleans(),
)
def test_every_nchw_kernel_compiles_without_spills(C, HW, dtype, affine, act, residual):
    name, text = batchnorm_source(dtype, C, 1e-5, affine, True, HW, act, residual)
    assert name.startswith(f"bn_{dtype}_c{C}_hw{HW}_") and f"#define HW {HW}" in text
    assert (f"_{act}" in name) == bool(act) and ("_add_" in name) == residual
    binary = compile_source(text, f"{name}_stats", "sm_90", cache=False)
    assert set(binary.resources) == {f"{name}_{k}" for k in KERNELS}
    for kernel, r in binary.resources.items():
        assert r.spills == 0 and r.stack == 0, f"{kernel}: {r}"


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_a_block_tiles_the_channels_exactly(dtype):
    V = 4 if dtype == "fp32" else 8
    for C in range(V, 64 * V + 1, V):
        v, lanes, rows = batchnorm_shape(dtype, C)
        assert v == V and (C // V) % lanes == 0 and 1 <= lanes <= 32
        assert lanes * rows <= BN_THREADS and lanes * (rows + 1) > BN_THREADS
    with pytest.raises(SpecError, match="multiple of"):
        batchnorm_shape(dtype, V + 2)


def test_the_source_bakes_the_channels_and_eps_and_names_them():
    a = batchnorm_source("bf16", 256, 1e-5, True, True)
    b = batchnorm_source("bf16", 256, 1e-3, True, True)
    assert a[0] != b[0] and a[0].startswith("bn_bf16_c256_")
    assert "#define C 256" in a[1] and "1e-05f" in a[1] and "0.001f" in b[1]
    assert "running_mean[c] =" in a[1]
    assert "running_mean[c] =" not in batchnorm_source("bf16", 256, 1e-5, True, False)[1]
    with pytest.raises(SpecError, match="relu or relu6, not gelu"):
        batchnorm_source("bf16", 256, 1e-5, True, True, act="gelu")


def test_convert_swaps_batch_norm_and_keeps_pytorchs_values_on_the_cpu():
    torch = pytest.importorskip("torch")
    import specgen.torch as sg

    torch.manual_seed(0)
    base = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.BatchNorm2d(8, momentum=None)
    )
    ours = sg.convert(copy.deepcopy(base))
    assert type(ours[1]) is sg.BatchNorm2d and type(ours[2]) is sg.BatchNorm2d
    assert type(sg.convert(copy.deepcopy(base), batchnorm=False)[1]) is torch.nn.BatchNorm2d
    assert ours.state_dict().keys() == base.state_dict().keys()
    for _ in range(2):
        x = torch.randn(2, 3, 9, 9)
        assert torch.equal(ours(x), base(x))
    for a, b in zip(ours.state_dict().values(), base.state_dict().values()):
        assert torch.equal(a, b)
    ours.eval(), base.eval()
    assert torch.equal(ours(x), base(x))


def test_launch_steps_fill_each_steps_slots_and_launch_them_in_order(monkeypatch):
    """The operator's shared launch path (batch norm's three launches a pass, and every
    single ``launch_step``), with the driver's launch replaced by a recorder."""
    pytest.importorskip("torch")
    from specgen.runtime import _Step
    from specgen.torch import _engine as E

    launched = []
    monkeypatch.setattr(E, "raw_stream", lambda index: 1000 + index)
    monkeypatch.setattr(E, "_driver_launch", lambda: lambda *a: launched.append(a))
    monkeypatch.setattr(E, "on_device", lambda index, fn, *args: fn(*args))
    a = _Step(11, (2, 1, 1), (256, 1, 1), 0, [("t", 0), (None, 7), ("t", 0)])
    b = _Step(22, (3, 4, 1), (32, 8, 1), 0, [("t", 0)])
    E.launch_steps(3, (a, (0xA0, 0xA8)), (b, (0xB0,)))
    assert [c[0] for c in launched] == [11, 22]
    assert launched[0][1:7] == (2, 1, 1, 256, 1, 1) and launched[1][8] == 1003
    assert list(a.slots) == [0xA0, 7, 0xA8] and list(b.slots) == [0xB0]
    E.launch_step(b, 0, 0xC0)
    assert launched[-1][0] == 22 and launched[-1][8] == 1000 and list(b.slots) == [0xC0]


@pytest.mark.parametrize("name", ["resnet18", "resnet50", "mobilenet_v2"])
def test_convert_fuses_the_activations_and_keeps_the_models_values(name):
    """Each batch norm that a ReLU follows takes it (ResNet blocks: the shortcut's add
    too), the activation's place passes its input on, and the model computes what it
    did: on the CPU, PyTorch's batch norm and then the same activation, bit for bit,
    in training and eval mode; state_dict, deepcopy and pickling as before."""
    torch = pytest.importorskip("torch")
    torchvision = pytest.importorskip("torchvision")
    import io

    import specgen.torch as sg
    from specgen.torch._fuse import Fused, describe

    torch.manual_seed(0)
    base = getattr(torchvision.models, name)(num_classes=10)
    ours = sg.convert(copy.deepcopy(base))
    fused = [m for m in ours.modules() if isinstance(m, sg.BatchNorm2d) and m.activation]
    kinds = {type(m).__name__ for m in ours.modules()}
    if name == "mobilenet_v2":  # 35 Conv2dNormActivation blocks end in ReLU6
        assert len(fused) == 35 and {m.activation for m in fused} == {"relu6"}
        assert sum(isinstance(m, Fused) for m in ours.modules()) == 35
        shortcut = [m for m in ours.modules() if type(m).__name__ == "FusedInvertedResidual"]
        assert len(shortcut) == 10 and all(m.use_res_connect for m in shortcut)
    else:  # the stem's batch norm and every block's
        blocks = 8 * 2 if name == "resnet18" else 16 * 3
        assert len(fused) == 1 + blocks and type(ours).__name__ == "FusedResNet"
        assert ("FusedBasicBlock" if name == "resnet18" else "FusedBottleneck") in kinds
        assert "BasicBlock" not in kinds and "Bottleneck" not in kinds
    assert "activation=" in repr(fused[0])
    # each convolution and its batch norm as one node where a sequence holds them
    sequences = Counter(type(m).__name__ for m in ours.modules())
    if name == "mobilenet_v2":
        assert sequences["FusedConv2dNormActivation"] == 35
        assert sequences["FusedSequential"] == 17  # each block's own sequence
    else:  # the downsample shortcuts
        assert sequences["FusedSequential"] == (3 if name == "resnet18" else 4)
    nodes = {"resnet18": 20, "resnet50": 53, "mobilenet_v2": 52}[name]  # every conv's
    assert describe(ours).endswith(f", {nodes} one node with the convolution before them")
    assert ours.state_dict().keys() == base.state_dict().keys()
    x = torch.randn(2, 3, 64, 64)
    for mode in ("train", "eval"):
        getattr(ours, mode)(), getattr(base, mode)()
        torch.manual_seed(1)  # the same dropout masks
        got = ours(x)
        torch.manual_seed(1)
        assert torch.equal(got, base(x)), mode
    again = torch.load(io.BytesIO(_saved(ours)), weights_only=False)
    assert torch.equal(again(x), base(x)) and torch.equal(copy.deepcopy(ours)(x), base(x))
    plain = sg.convert(copy.deepcopy(base), fuse=False)
    assert not [m for m in plain.modules() if isinstance(m, sg.BatchNorm2d) and m.activation]


def test_convert_hands_densenets_relus_to_the_batch_norms_before_them():
    """Each of densenet121's 58 layers keeps its class and forward, and its two batch
    norms take the ReLU after them (its place passes its input on); with the stem's and
    the transitions' (sequences) 120 of its 121 batch norms apply their ReLU. The model
    computes what it did on the CPU, in training and eval mode, with the same
    state_dict."""
    torch = pytest.importorskip("torch")
    torchvision = pytest.importorskip("torchvision")
    import specgen.torch as sg
    from specgen.torch._fuse import Fused, describe

    torch.manual_seed(0)
    base = torchvision.models.densenet121(num_classes=10)
    ours = sg.convert(copy.deepcopy(base))
    layers = [m for m in ours.modules() if type(m).__name__ == "_DenseLayer"]
    assert len(layers) == 58
    assert all(m.norm1.activation == m.norm2.activation == "relu" for m in layers)
    assert all(type(m.relu1) is Fused and type(m.relu2) is Fused for m in layers)
    assert describe(ours).startswith("batch norm: 121 on specgen's kernels, 120 with")
    assert ours.state_dict().keys() == base.state_dict().keys()
    x = torch.randn(2, 3, 64, 64)
    for mode in ("train", "eval"):
        getattr(ours, mode)(), getattr(base, mode)()
        assert torch.equal(ours(x), base(x)), mode
    plain = sg.convert(copy.deepcopy(base), fuse=False)
    assert not any(isinstance(m, Fused) for m in plain.modules())


def _saved(model) -> bytes:
    import io

    import torch

    buf = io.BytesIO()
    torch.save(model, buf)
    return buf.getvalue()


def test_fusion_leaves_a_shared_batch_norm_and_refuses_an_unknown_activation():
    """A batch norm met in two places, one with no ReLU after it, keeps no activation of
    its own; PyTorch's shared one becomes a module a place sharing its parameters (the
    ReLU's place fused); each model computes what it did; batch_norm names what it
    takes."""
    torch = pytest.importorskip("torch")
    import specgen.torch as sg

    torch.manual_seed(0)

    def net(bn):
        return torch.nn.Sequential(
            torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3), bn, torch.nn.ReLU()),
            torch.nn.Sequential(torch.nn.Conv2d(8, 8, 3), bn),
            torch.nn.Sequential(
                torch.nn.Conv2d(8, 8, 3), torch.nn.BatchNorm2d(8), torch.nn.ReLU6()
            ),
        )

    x = torch.randn(2, 3, 12, 12)
    base = net(torch.nn.BatchNorm2d(8))
    ours = sg.convert(copy.deepcopy(base))
    assert ours[0][1].weight is ours[1][1].weight and ours[0][1] is not ours[1][1]
    assert ours[0][1].activation == "relu" and ours[1][1].activation is None
    assert ours[2][1].activation == "relu6" and type(ours[2][2]).__name__ == "Fused"
    assert torch.equal(ours(x), base(x))
    mine = net(sg.BatchNorm2d(8))  # specgen's module, shared as it is
    plain = copy.deepcopy(mine)
    sg.convert(mine)
    assert mine[0][1] is mine[1][1] and mine[0][1].activation is None
    assert type(mine[0][2]) is torch.nn.ReLU and mine[2][1].activation == "relu6"
    assert torch.equal(mine(x), plain(x))
    with pytest.raises(ValueError, match="activation must be 'relu', 'relu6' or None"):
        sg.batch_norm(x, None, None, training=True, activation="gelu")


def test_the_operator_knows_each_activation_the_kernels_apply():
    """One table names the activations for the operator: the kernels' own names, in
    their order, each with the module it fuses and PyTorch's function for the calls
    the kernels do not take (which match the modules' outputs)."""
    torch = pytest.importorskip("torch")
    from specgen import runtime
    from specgen.torch._batchnorm import ACTIVATIONS

    assert tuple(ACTIVATIONS) == runtime.ACTIVATIONS
    x = torch.randn(64) * 8
    for module, function in ACTIVATIONS.values():
        assert torch.equal(function(x), module()(x))


def test_a_trace_names_the_batch_norm_kernels_a_first_call_compiles_ahead(tmp_path, monkeypatch):
    """One trace on the meta device finds the batch norm kernels the model's pass will
    load (each source once: resnet18's 20 batch norms in channels_last fp32 are 11
    kernel sets, by width and fused form), and the compile pool puts them in the disk
    cache under the names and texts the operator loads them by."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchvision")
    import specgen.torch as sg
    from specgen.compile import cached
    from specgen.parallel import Source, precompile
    from specgen.torch._trace import traced
    from specgen.torch.model import build

    model = sg.convert(build("resnet18")).to(memory_format=torch.channels_last)
    x = torch.empty(2, 3, 64, 64).contiguous(memory_format=torch.channels_last)
    layers, norms = traced(model, x)
    assert len(layers) == 20 and len(norms) == 11
    # the batch norms are not computed in the trace: every layer as the computed batch
    # norms give it, each gradient where it flows, and the modules left as found
    import specgen.torch._trace as T

    with monkeypatch.context() as m:
        m.setattr(T, "_sized_like", lambda bn, *args: type(bn).forward(bn, *args))
        assert layers == traced(model, x)[0]
    assert sum(lay.needs_dx for lay in layers) == 19 and "forward" not in model.bn1.__dict__
    names = [n for n, _ in norms]
    assert len(set(names)) == 11 and all(n.startswith("bn_fp32_c") for n in names)
    forms = [("_relu_add_" in n, "_relu_" in n and "_add_" not in n) for n in names]
    assert forms.count((True, False)) == 4 and forms.count((False, True)) == 4  # by width
    cast = [n for n, _ in traced(model, x, cast=torch.bfloat16)[1]]  # autocast's dtype
    assert len(cast) == 11 and all(n.startswith("bn_bf16_c") for n in cast)
    assert traced(model.eval(), x)[1] == []  # eval mode: PyTorch's batch norm
    monkeypatch.setenv("SPECGEN_CACHE_DIR", str(tmp_path))
    picked = norms[:2]
    results = precompile([(Source(n, t), None) for n, t in picked], "sm_90", 2)
    assert results == {n: None for n, _ in picked}
    assert all(cached(t, "sm_90") for _, t in picked) and not cached(norms[2][1], "sm_90")
