"""specgen: CUDA convolution kernels specialized for one shape and one variant."""

__version__ = "0.1.0"
