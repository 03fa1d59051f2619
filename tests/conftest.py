import os

import pytest
from hypothesis import settings

# Drawn problems are the same on every run (a fixed derandomized draw), so that CI's
# verdict is the code's and not the draw's; HYPOTHESIS_PROFILE=hunt draws fresh ones.
settings.register_profile("fixed", derandomize=True, database=None)
settings.register_profile("hunt", derandomize=False)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "fixed"))


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU; skipped where there is none")
    # Keep test compilations out of the user's cache, but share them across a run.
    os.environ.setdefault("SPECGEN_CACHE_DIR", str(config.rootpath / ".cache" / "specgen"))


def pytest_collection_modifyitems(config, items):
    from specgen.runtime import gpu_available

    if gpu_available():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU here")
    for item in items:
        if item.get_closest_marker("gpu"):  # the mark, not a parameter that happens to say gpu
            item.add_marker(skip)


@pytest.fixture
def fp32_math():
    """fp32 tensors get fp32 math (FMA, or three tf32 products) unless a test allows
    tf32, as cuDNN's do with allow_tf32 off; the setting restored after."""
    import torch

    before = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32 = before
