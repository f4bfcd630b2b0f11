"""Workspace-wide pytest set-up: GPU marker handling and the Triton interpreter on CPU machines."""

import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()

# Triton kernels run on the CPU through Triton's interpreter. The variable is read when triton is
# first imported, so it must be set here, before any test module imports a kernel.
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAS_CUDA:
        return
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip_gpu)
