"""torchvision's blocks with their batch norms fused (``_fuse``): the same modules,
parameters and state_dict, a forward that hands each ReLU to the batch norm before it
and a residual block's shortcut to its last batch norm, and runs each convolution
with the batch norm after it as one autograd node (``_convnorm``); DenseNet's layers
(a batch norm, a ReLU and a convolution, twice) keep their forward and hand each ReLU
to the batch norm before it (``DenseLayerNorms``).  Imported only where torchvision
is."""

from __future__ import annotations

import torch
from torchvision.models import mobilenetv2, resnet
from torchvision.ops import misc

from ._batchnorm import BatchNorm2d, Fused
from ._chain import run_chain
from ._convnorm import FusedSequential, _bare, conv_norm, pair, run_fused, shortcut


class _Fusing:
    relu_norms: tuple[str, ...] = ()  # the batch norms a ReLU follows
    adds_shortcut = True  # the last batch norm adds the block's shortcut
    pairs = 0  # the convolution and batch norm pairs its forward runs as one node each

    @classmethod
    def fits(cls, block) -> bool:
        """Whether ``block`` has the form the fused forward assumes: specgen's batch
        norms with no activation of their own, and a ReLU."""
        norms = [getattr(block, n, None) for n in cls.relu_norms]
        if not all(_plain(bn) for bn in norms):
            return False
        return type(getattr(block, "relu", None)) is torch.nn.ReLU

    @classmethod
    def shares(cls, block, shared: set) -> bool:
        """Whether a batch norm the fused forward changes is met elsewhere too."""
        return any(id(getattr(block, n)) in shared for n in cls.relu_norms)

    @classmethod
    def take(cls, block) -> None:
        """``block`` turned into this class in place, its batch norms given the ReLU."""
        for n in cls.relu_norms:
            getattr(block, n).activation = "relu"
        block.__class__ = cls


def _plain(bn) -> bool:
    return type(bn) is BatchNorm2d and bn.activation is None


class FusedResNet(_Fusing, resnet.ResNet):
    """The stem's ReLU in its batch norm."""

    relu_norms = ("bn1",)
    adds_shortcut = False
    pairs = 1

    def _forward_impl(self, x):
        x = self.maxpool(conv_norm(self.conv1, self.bn1, x))
        x = run_chain(self, self.chain_stages(), x)
        return self.fc(torch.flatten(self.avgpool(x), 1))

    def chain_stages(self) -> tuple:
        """The stages its forward runs as one chain (``_chain``) where they can be."""
        return (self.layer1, self.layer2, self.layer3, self.layer4)


class FusedBasicBlock(_Fusing, resnet.BasicBlock):
    relu_norms = ("bn1", "bn2")
    pairs = 2

    def forward(self, x):
        out = conv_norm(self.conv1, self.bn1, x)
        return conv_norm(self.conv2, self.bn2, out, shortcut(self.downsample, x))

    def chain_steps(self) -> list | None:
        """The block's pairs as a chain runs them (``_chain``): (conv, bn, the value the
        convolution reads, the value the batch norm adds), 0 the block's input and
        k + 1 the k-th pair's output, in ``forward``'s order; None where it cannot."""
        return _steps(self, FusedBasicBlock, ("conv1", "bn1"), ("conv2", "bn2"))


class FusedBottleneck(_Fusing, resnet.Bottleneck):
    relu_norms = ("bn1", "bn2", "bn3")
    pairs = 3

    def forward(self, x):
        out = conv_norm(self.conv2, self.bn2, conv_norm(self.conv1, self.bn1, x))
        return conv_norm(self.conv3, self.bn3, out, shortcut(self.downsample, x))

    def chain_steps(self) -> list | None:
        """As ``FusedBasicBlock.chain_steps``."""
        body = ("conv1", "bn1", "conv2", "bn2")
        return _steps(self, FusedBottleneck, body, ("conv3", "bn3"))


def _steps(block, cls, body: tuple, last: tuple) -> list | None:
    """A residual block's chain steps (``chain_steps``): the ``body`` pairs (their
    modules' names, a convolution's and then its batch norm's), each reading the one
    before, then the downsampling pair where there is one, reading the block's input,
    then the ``last`` pair, which adds the shortcut; None where the block is not of
    class ``cls`` itself, a pair would not run as one node or the downsampling is not a
    bare fused sequence of one pair.  (Read from ``_modules``: a chain reads them every
    call.)"""
    if type(block) is not cls:
        return None
    m = block._modules
    found = [(m[body[i]], m[body[i + 1]], i // 2, None) for i in range(0, len(body), 2)]
    shortcut = 0
    ds = m.get("downsample")
    if ds is not None:
        modules = tuple(ds._modules.values())
        if type(ds) is not FusedSequential or len(modules) != 2 or not _bare(ds):
            return None
        found.append((*modules, 0, None))
        shortcut = len(found)
    found.append((m[last[0]], m[last[1]], len(body) // 2, shortcut))
    return found if all(pair(conv, bn) for conv, bn, *_ in found) else None


class FusedInvertedResidual(mobilenetv2.InvertedResidual):
    """The shortcut added by the last batch norm (which no activation follows)."""

    adds_shortcut = True

    @classmethod
    def fits(cls, block) -> bool:
        return block.use_res_connect and _plain(block.conv[-1])

    @classmethod
    def shares(cls, block, shared: set) -> bool:
        return id(block.conv[-1]) in shared

    @classmethod
    def take(cls, block) -> None:
        block.__class__ = cls

    def forward(self, x):
        *body, conv, bn = self.conv
        out = x
        for m in body:
            out = m(out)
        return conv_norm(conv, bn, out, x)


class FusedConv2dNormActivation(misc.Conv2dNormActivation):
    """Its convolution and batch norm as one node (``_convnorm.run_fused``)."""

    runs_pairs = True

    def forward(self, input):
        return run_fused(self, input)


class DenseLayerNorms:
    """DenseNet's layer (``_DenseLayer``), its own class and forward kept: each of its
    two batch norms applies the ReLU after it, whose place passes its input on
    (``Fused``), as in a fused sequence."""

    NAMES = (("norm1", "relu1"), ("norm2", "relu2"))

    @classmethod
    def fits(cls, layer) -> bool:
        return all(
            _plain(getattr(layer, n, None)) and type(getattr(layer, r, None)) is torch.nn.ReLU
            for n, r in cls.NAMES
        )

    @classmethod
    def shares(cls, layer, shared: set) -> bool:
        return any(id(getattr(layer, n)) in shared for n, _ in cls.NAMES)

    @classmethod
    def take(cls, layer) -> None:
        for n, r in cls.NAMES:
            getattr(layer, n).activation = "relu"
            layer._modules[r] = Fused(layer._modules[r])
