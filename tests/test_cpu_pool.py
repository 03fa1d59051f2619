"""Max pool's kernels (``templates/torch/maxpool.cu.j2``) without a GPU: they compile for
sm_90 without spills, ``convert`` puts specgen's max pool in place of PyTorch's and hands
it the ReLU before it where an ``nn.Sequential`` shows the pair, and on what the kernels
do not serve (here: CPU tensors, windows that do not tile the input) it is PyTorch's
max pool, after the ReLU where one is fused."""

import copy

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from specgen.compile import compile_source
from specgen.errors import SpecError
from specgen.runtime import maxpool_source


@settings(
    max_examples=8, deadline=None, phases=[Phase.generate], suppress_health_check=list(HealthCheck)
)
@given(
    C=st.integers(1, 1024),
    H=st.integers(4, 300),
    W=st.integers(4, 300),
    KH=st.integers(1, 4),
    KW=st.integers(1, 4),
    dtype=st.sampled_from(["bf16", "fp16", "fp32"]),
    layout=st.sampled_from(["nchw", "nhwc"]),
    act=st.sampled_from([None, "relu"]),
)
def test_every_kernel_compiles_without_spills(C, H, W, KH, KW, dtype, layout, act):
    name, text = maxpool_source(dtype, layout, C, H, W, KH, KW, act)
    assert name.startswith(f"maxpool_{dtype}_{layout}_c{C}_{H}x{W}_k{KH}x{KW}")
    assert f"#define HO {H // KH}" in text and f"#define WO {W // KW}" in text
    binary = compile_source(text, f"{name}_forward", "sm_90", cache=False)
    assert set(binary.resources) == {f"{name}_forward", f"{name}_backward"}
    for kernel, r in binary.resources.items():
        assert r.spills == 0 and r.stack == 0, f"{kernel}: {r}"


@pytest.mark.parametrize(
    "args, says",
    [
        (("fp32", "nchw", 8, 8, 8, 2, 2, "gelu"), "not gelu"),
        (("fp32", "nhwc", 8, 8, 8, 9, 2, None), "9x2 over 8x8"),
        (("fp32", "ncwh", 8, 8, 8, 2, 2, None), "ncwh: not served"),
        (("bf16", "nchw", 8, 300, 300, 16, 16, None), "in a byte below 255"),
    ],
)
def test_what_the_kernels_do_not_serve_is_refused_in_one_line(args, says):
    with pytest.raises(SpecError, match=says) as e:
        maxpool_source(*args)
    assert "\n" not in str(e.value)


try:
    import torch
except ImportError:  # the kernels' tests above run without PyTorch; those below need it
    torch = None
else:
    import specgen.torch as sg
    from specgen.torch import _pool as P
    from specgen.torch._batchnorm import Fused
    from specgen.torch._fuse import describe_pools

needs_torch = pytest.mark.skipif(torch is None, reason="PyTorch is not installed")


@needs_torch
@pytest.mark.parametrize(
    "args, window",
    [
        ((2, None, 0, 1, False, False), (2, 2)),
        (((2, 3), (2, 3), 0, 1, False, False), (2, 3)),
        ((3, 2, 1, 1, False, False), None),  # overlapping, padded: resnet's stem
        ((2, 2, 1, 1, False, False), None),  # padded
        ((2, 2, 0, 2, False, False), None),  # dilated
        ((2, 2, 0, 1, True, False), None),  # ceil mode
        ((2, 2, 0, 1, False, True), None),  # indices returned
        ((2, 1, 0, 1, False, False), None),  # a stride below the window
    ],
)
def test_the_windows_served_are_those_that_tile_the_input(args, window):
    assert P.window_of(*args) == window


def vgg_like():
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.ReLU(inplace=True),
        torch.nn.MaxPool2d(2),
        torch.nn.Conv2d(8, 8, 3, padding=1),
        torch.nn.ReLU(inplace=True),
        torch.nn.Conv2d(8, 8, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.MaxPool2d(3, 2, 1),  # resnet's: PyTorch's
        torch.nn.MaxPool2d(2),  # no ReLU before it
    )


@needs_torch
def test_convert_hands_each_max_pool_the_relu_before_it():
    ours = sg.convert(vgg_like())
    kinds = [type(m) for m in ours]
    assert kinds.count(sg.MaxPool2d) == 2 and kinds.count(Fused) == 1
    assert isinstance(ours[1], Fused) and ours[2].activation == "relu"
    assert "applied by the max pool after it" in repr(ours[1])
    assert type(ours[4]) is torch.nn.ReLU  # a convolution after it: not fused
    assert type(ours[6]) is torch.nn.ReLU  # PyTorch's pool after it
    assert type(ours[7]) is torch.nn.MaxPool2d  # a window the kernels do not serve
    assert ours[8].activation is None  # no ReLU before it
    line = "max pool: 2 of 3 on specgen's kernels, 1 with the ReLU before them"
    assert describe_pools(ours) == line
    plain = sg.convert(vgg_like(), fuse=False)
    assert all(getattr(m, "activation", None) is None for m in plain)
    assert (
        describe_pools(sg.convert(vgg_like(), pool=False))
        == "max pool: 0 of 3 on specgen's kernels"
    )
    assert type(sg.convert(vgg_like(), pool=False)[2]) is torch.nn.MaxPool2d


@needs_torch
def test_a_relu_used_twice_is_left_where_it_is():
    relu = torch.nn.ReLU()
    seq = torch.nn.Sequential(relu, torch.nn.MaxPool2d(2), relu, torch.nn.MaxPool2d(2))
    ours = sg.convert(seq)
    assert all(m.activation is None for m in ours if isinstance(m, sg.MaxPool2d))


@needs_torch
def test_where_the_kernels_do_not_serve_it_is_pytorchs_max_pool_after_the_relu():
    torch.manual_seed(0)
    base = vgg_like()
    ours = sg.convert(copy.deepcopy(base))
    x = torch.randn(2, 3, 20, 20, requires_grad=True)
    x2 = x.detach().clone().requires_grad_()
    want, got = base(x), ours(x2)
    assert torch.equal(want, got)
    dy = torch.randn_like(want)
    want.backward(dy)
    got.backward(dy)
    assert torch.equal(x.grad, x2.grad)
    for a, b in zip(base.parameters(), ours.parameters()):
        assert torch.equal(a.grad, b.grad)


@needs_torch
def test_a_bad_activation_is_refused_as_pytorch_would():
    with pytest.raises(ValueError, match="activation must be 'relu' or None, got 'tanh'"):
        sg.max_pool2d(torch.randn(1, 1, 4, 4), 2, activation="tanh")
