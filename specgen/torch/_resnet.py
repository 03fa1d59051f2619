"""torchvision's ResNet blocks with their batch norms fused (``_fuse``): the same
modules, parameters and state_dict, a forward that hands each ReLU to the batch norm
before it and the shortcut to the last one.  Imported only where torchvision is."""

from __future__ import annotations

import torch
from torchvision.models import resnet

from ._batchnorm import BatchNorm2d


class _Fusing:
    norms: tuple[str, ...]  # the block's batch norms, the last one adding the shortcut

    @classmethod
    def fits(cls, block) -> bool:
        """Whether ``block`` has the form the fused forward assumes: specgen's batch
        norms with no activation of their own, and a ReLU."""
        norms = [getattr(block, n, None) for n in cls.norms]
        if not all(type(bn) is BatchNorm2d and bn.activation is None for bn in norms):
            return False
        return type(getattr(block, "relu", None)) is torch.nn.ReLU

    @classmethod
    def take(cls, block) -> None:
        """``block`` turned into this class in place, its batch norms given the ReLU."""
        for n in cls.norms:
            getattr(block, n).activation = "relu"
        block.__class__ = cls


class FusedBasicBlock(_Fusing, resnet.BasicBlock):
    norms = ("bn1", "bn2")

    def forward(self, x):
        out = self.conv2(self.bn1(self.conv1(x)))
        identity = x if self.downsample is None else self.downsample(x)
        return self.bn2(out, identity)


class FusedBottleneck(_Fusing, resnet.Bottleneck):
    norms = ("bn1", "bn2", "bn3")

    def forward(self, x):
        out = self.conv3(self.bn2(self.conv2(self.bn1(self.conv1(x)))))
        identity = x if self.downsample is None else self.downsample(x)
        return self.bn3(out, identity)
