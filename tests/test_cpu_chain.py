"""CPU tier: the steps of a ResNet's chain (``specgen.torch._chain``): which pairs its
node runs, the values each reads and adds, which gradients each pair's part wants,
and when a network's stages cannot be one.  Skipped without PyTorch or torchvision."""

import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")

import specgen.torch as sg  # noqa: E402  (after the skip: it imports torch)
from specgen.torch import _chain  # noqa: E402


def converted(name: str):
    return sg.convert(getattr(torchvision.models, name)(num_classes=10))


def stages(model) -> tuple:
    return (model.layer1, model.layer2, model.layer3, model.layer4)


@pytest.mark.parametrize(
    "name, blocks, downsampled",
    [("resnet18", 8, 3), ("resnet34", 16, 3), ("resnet50", 16, 4)],
)
def test_a_resnets_stages_are_its_blocks_pairs_in_their_order(name, blocks, downsampled):
    """Every pair of every block, in the order the blocks' forwards run them: each
    block's pairs read the one before (the first its input), its downsampling pair its
    input, and its last pair adds the shortcut: the input or the downsampled one."""
    model = converted(name)
    steps = _chain.program(stages(model))
    per_block = 2 if name != "resnet50" else 3
    assert len(steps) == blocks * per_block + downsampled
    v = 0  # the value a block reads
    at = 0
    for stage in stages(model):
        for block in stage:
            convs = [block.conv1, block.conv2] + ([block.conv3] if per_block == 3 else [])
            body = steps[at : at + per_block - 1]
            assert [st.conv for st in body] == convs[:-1]
            assert [st.src for st in body] == list(range(v, v + per_block - 1))
            assert all(st.res is None for st in body)
            at += per_block - 1
            body_out = at  # the value step at - 1 writes
            shortcut = v
            if block.downsample is not None:
                st = steps[at]
                assert (st.conv, st.bn, st.src, st.res) == (*block.downsample, v, None)
                at += 1
                shortcut = at
            last = steps[at]
            assert (last.conv, last.src, last.res) == (convs[-1], body_out, shortcut)
            at += 1
            v = at
    assert at == len(steps)


def test_each_pair_wants_the_gradients_its_own_node_would():
    """A pair's x wants its gradient where anything it is computed from does: the
    chain's x or a parameter of a pair before it; its residual likewise."""
    steps = _chain.program(stages(converted("resnet18")))
    chain = _chain.Chain(steps, [None] * len(steps))
    frozen = (False,) * 6
    trained = (True, False, True, True, False, False)  # w, no bias, gamma, beta
    needs = chain.needs((False, *frozen * 3, *trained * (len(steps) - 3)))
    assert [n[0] for n in needs[:5]] == [False, False, False, False, True]
    assert needs[3][7] is False and needs[3][1:5] == trained[:4]  # layer1's second block
    assert needs[0] == (False,) * 9
    everything = chain.needs((True, *trained * len(steps)))
    assert all(n[0] for n in everything)
    assert [n[7] for n in everything] == [st.res is not None for st in steps]


def test_a_stage_or_block_that_cannot_join_leaves_the_chain():
    """Hooks on a stage, a block or a module of a pair; a block of another class; a
    stage that is not an ``nn.Sequential``: no chain (the blocks' forwards run)."""
    model = converted("resnet18")
    assert _chain.program(stages(model)) is not None
    for m in (model.layer2, model.layer2[0], model.layer2[0].bn1, model.layer2[0].downsample):
        handle = m.register_forward_pre_hook(lambda *args: None)
        assert _chain.program(stages(model)) is None
        handle.remove()
    assert _chain.program(stages(model)) is not None
    model.layer3[1].__class__ = type("Mine", (type(model.layer3[1]),), {})
    assert _chain.program(stages(model)) is None
    plain = converted("resnet18")
    plain.layer4 = torch.nn.ModuleList(plain.layer4)
    assert _chain.program(stages(plain)) is None
    unfused = sg.convert(torchvision.models.resnet18(), fuse=False)
    assert _chain.program(stages(unfused)) is None


def test_a_cpu_tensor_runs_the_blocks_forwards():
    """Off the GPU there is no chain: the network computes as PyTorch's would."""
    model = converted("resnet18")
    x = torch.randn(2, 3, 32, 32)
    out = model(x)
    assert out.shape == (2, 10) and model not in _chain._memos


def test_the_plan_names_the_chains_a_model_runs():
    """``specgen model``'s line on a converted model names its chain's pairs, and
    a model with none (an unfused ResNet, a VGG) says nothing of chains."""
    assert _chain.describe(converted("resnet50")).startswith("residual stages: 52 pairs as one")
    assert _chain.describe(sg.convert(torchvision.models.resnet18(), fuse=False)) == ""
    assert _chain.describe(sg.convert(torchvision.models.vgg11())) == ""


def test_the_chains_form_changes_with_everything_its_node_depends_on():
    """A chain's node is taken only where the call reads as the last did (``_form``):
    the same again reads the same; x's strides, dtype or 16-byte start, autocast, tf32,
    a module's argument or momentum, a parameter replaced or given new data, and a
    batch norm put in eval mode each read otherwise."""
    model = converted("resnet18")
    steps = _chain.program(stages(model))
    x = torch.randn(2, 64, 8, 8)
    form = _chain._form(steps, x)
    assert _chain._form(steps, x.clone()) == form
    block = model.layer2[0]
    changes = [
        lambda: _chain._form(steps, x.contiguous(memory_format=torch.channels_last)),
        lambda: _chain._form(steps, x.half()),
        lambda: _chain._form(steps, torch.randn(2 * 64 * 8 * 8 + 1)[1:].view(2, 64, 8, 8)),
        lambda: _chain._form(steps, torch.randn(3, 64, 8, 8)),
    ]
    for change in changes:
        assert change() != form
    torch.set_autocast_enabled("cuda", True)  # as torch.autocast sets it (off the GPU too)
    try:
        assert _chain._form(steps, x) != form
    finally:
        torch.set_autocast_enabled("cuda", False)
    tf32 = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = not tf32
    try:
        assert _chain._form(steps, x) != form
    finally:
        torch.backends.cudnn.allow_tf32 = tf32

    def reads_otherwise(edit, undo):
        edit()
        try:
            return _chain._form(steps, x) != form
        finally:
            undo()

    conv, bn, w = block.conv1, block.bn1, block.conv1.weight
    assert reads_otherwise(
        lambda: setattr(conv, "stride", (1, 1)), lambda: setattr(conv, "stride", (2, 2))
    )
    assert reads_otherwise(
        lambda: setattr(bn, "momentum", 0.2), lambda: setattr(bn, "momentum", 0.1)
    )
    assert reads_otherwise(
        lambda: setattr(conv, "weight", torch.nn.Parameter(w.detach().clone())),
        lambda: setattr(conv, "weight", w),
    )
    data = w.data
    assert reads_otherwise(
        lambda: setattr(w, "data", data.clone()), lambda: setattr(w, "data", data)
    )
    assert reads_otherwise(bn.eval, bn.train)
    assert _chain._form(steps, x) == form
