"""Markers that depend on the machine: `cuda` tests are skipped where no CUDA device is present."""

import pytest


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:  # planning-only installs
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (none on this machine)")
    for item in items:
        if "cuda" in item.keywords:
            item.add_marker(skip)
