"""Batch norm fused with what follows it (``convert(model, fuse=True)``): in an
``nn.Sequential``, a ``BatchNorm2d`` followed by ``nn.ReLU`` or ``nn.ReLU6`` applies the
activation itself, and the activation's place holds ``Fused``, which passes its input
on; in torchvision's ResNet (its stem and blocks) each batch norm before a ReLU applies
it, a block's last one adding the shortcut first, and MobileNetV2's inverted residual
blocks' last batch norm adds their shortcut (``_torchvision``).
An activation on its own costs a pass over the tensor each way and an autograd node;
fused, the batch norm's kernels apply it as they write y and gate dy as they read it.
The sequences that hold a convolution followed by a batch norm (``nn.Sequential``,
torchvision's ``Conv2dNormActivation``), and the blocks above, run each such pair as
one autograd node (``_convnorm``).  DenseNet's layers hand their two ReLUs to the batch
norms before them.

The parameters, buffers and state_dict stay as they were; eval mode, and the calls the
kernels do not serve, run PyTorch's batch norm and then the same activation."""

from __future__ import annotations

import sys
from collections import Counter

import torch

from ._batchnorm import ACTIVATIONS, BatchNorm2d, Fused
from ._convnorm import FusedSequential, steps
from ._pool import MaxPool2d

NAMES = {module: name for name, (module, _) in ACTIVATIONS.items()}  # ReLU -> "relu"


def _pairs(seq: torch.nn.Sequential) -> int:
    """The times ``seq`` holds a convolution and then a batch norm, a pair that runs as
    one node (none of them overlapping)."""
    return sum(bn is not None for _, bn in steps(tuple(seq._modules.values())))


def fuse(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with its batch norms fused with the activations after them, where its
    structure shows them, and its convolutions with the batch norms after them (module
    docstring); in place, and returned."""
    blocks, sequences = _torchvision_forms()
    sequences[torch.nn.Sequential] = FusedSequential
    uses = Counter(id(m) for _, m in model.named_modules(remove_duplicate=False))
    shared = {i for i, n in uses.items() if n > 1}  # a module met twice is left as it is
    for m in model.modules():
        if id(m) in shared:
            continue
        if isinstance(m, torch.nn.Sequential):
            _fuse_sequence(m, shared)
            if type(m) in sequences and _pairs(m):
                m.__class__ = sequences[type(m)]
        fused = blocks.get(type(m))
        if fused is not None and fused.fits(m) and not fused.shares(m, shared):
            fused.take(m)
    return model


def _fuse_sequence(seq: torch.nn.Sequential, shared: set) -> None:
    names = list(seq._modules)
    for a, b in zip(names, names[1:]):
        bn, act = seq._modules[a], seq._modules[b]
        if type(bn) is BatchNorm2d and bn.activation is None and type(act) in NAMES:
            if id(bn) not in shared:
                bn.activation = NAMES[type(act)]
                seq._modules[b] = Fused(act)


def fuse_pools(model: torch.nn.Module) -> torch.nn.Module:
    """``model`` with each of specgen's max pools that follows an ``nn.ReLU`` in an
    ``nn.Sequential`` applying the ReLU itself (its place holds ``Fused``): a ReLU
    before a max pool costs a pass over the tensor each way and an autograd node, and
    fused, the pool's forward takes the ReLU's output as it reads x and its backward
    gates dx by the byte it writes anyway (``_pool``); in place, and returned."""
    uses = Counter(id(m) for _, m in model.named_modules(remove_duplicate=False))
    for seq in model.modules():
        if not isinstance(seq, torch.nn.Sequential) or uses[id(seq)] > 1:
            continue
        names = list(seq._modules)
        for a, b in zip(names, names[1:]):
            act, pool = seq._modules[a], seq._modules[b]
            if type(act) is torch.nn.ReLU and type(pool) is MaxPool2d:
                if pool.activation is None and uses[id(act)] == uses[id(pool)] == 1:
                    pool.activation = "relu"
                    seq._modules[a] = Fused(act, "the max pool after it")
    return model


def _torchvision_forms() -> tuple[dict, dict]:
    """torchvision's block classes -> their fused forms, and its sequence classes ->
    theirs, where torchvision's models are imported already (a model of theirs is:
    ``_torchvision`` is imported only then); else two empty tables."""
    if "torchvision.models.resnet" not in sys.modules:
        return {}, {}
    from torchvision.models import densenet, mobilenetv2, resnet
    from torchvision.ops import misc

    from . import _torchvision as T

    blocks = {
        resnet.ResNet: T.FusedResNet,
        resnet.BasicBlock: T.FusedBasicBlock,
        resnet.Bottleneck: T.FusedBottleneck,
        mobilenetv2.InvertedResidual: T.FusedInvertedResidual,
        densenet._DenseLayer: T.DenseLayerNorms,
    }
    return blocks, {misc.Conv2dNormActivation: T.FusedConv2dNormActivation}


def describe(model: torch.nn.Module) -> str:
    """What ``convert`` made of a model's batch norms, in a line: how many run on
    specgen's kernels, how many apply the activation after them, how many add a
    residual block's shortcut, and how many run with the convolution before them as
    one autograd node (``_convnorm``)."""
    norms = [m for m in model.modules() if isinstance(m, BatchNorm2d)]
    if not norms:
        return "batch norm: PyTorch's" if _has_batch_norm(model) else "no batch norm"
    fused = sum(m.activation is not None for m in norms)
    shortcuts = sum(getattr(type(m), "adds_shortcut", False) for m in model.modules())
    nodes = sum(_nodes(m) for m in model.modules())
    line = f"batch norm: {len(norms)} on specgen's kernels, "
    line += f"{fused} with the activation after them" if fused else "none fused"
    line += f", {shortcuts} adding a shortcut" if shortcuts else ""
    return line + (f", {nodes} one node with the convolution before them" if nodes else "")


def describe_pools(model: torch.nn.Module) -> str:
    """What ``convert`` made of a model's max pools, in a line: how many run on
    specgen's kernels (those whose windows tile the input: ``_pool``; the rest stay
    PyTorch's) and how many of those apply the ReLU before them; "" where the model
    has none."""
    ours = [m for m in model.modules() if isinstance(m, MaxPool2d)]
    every = [m for m in model.modules() if isinstance(m, torch.nn.MaxPool2d)]
    if not every:
        return ""
    fused = sum(m.activation is not None for m in ours)
    line = f"max pool: {len(ours)} of {len(every)} on specgen's kernels"
    return line + (f", {fused} with the ReLU before them" if fused else "")


def _nodes(m: torch.nn.Module) -> int:
    """The convolution and batch norm pairs that module ``m``'s own forward runs as one
    node: a fused sequence's, or a fused block's (``pairs``)."""
    if getattr(type(m), "runs_pairs", False):
        return _pairs(m)
    return getattr(type(m), "pairs", 0)


def _has_batch_norm(model) -> bool:
    return any(isinstance(m, torch.nn.BatchNorm2d) for m in model.modules())
