"""Shared test hooks.

Tests marked `cuda` need a CUDA GPU. CI deselects them (`-m "not cuda"`); a plain `pytest`
on a machine without CUDA skips them with the reason instead of failing them.
"""

from __future__ import annotations

import pytest

NO_CUDA = "needs a CUDA GPU (torch.cuda.is_available() is false on this machine)"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    cuda_items = [item for item in items if item.get_closest_marker("cuda")]
    if not cuda_items:
        return
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason=NO_CUDA)
    for item in cuda_items:
        item.add_marker(skip)
