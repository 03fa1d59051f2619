import os

import pytest


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU; skipped where there is none")
    # Keep test compilations out of the user's cache, but share them across a session.
    os.environ.setdefault("SPECGEN_CACHE_DIR", str(config.rootpath / ".cache" / "specgen"))


def pytest_collection_modifyitems(config, items):
    from specgen.runtime import gpu_available

    if gpu_available():
        return
    skip = pytest.mark.skip(reason="no CUDA GPU here")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
