"""Shared test hooks.

Tests marked `cuda` need a CUDA GPU. CI deselects them (`-m "not cuda"`); a plain `pytest`
on a machine without CUDA skips them with the reason instead of failing them.
"""

from __future__ import annotations

import os

import pytest

# The tests run tiny models on the CPU, where torch's second intra-op thread mostly adds
# synchronisation (tests/stages: 85 -> 60 s on the 2-core CI machine with one thread) and
# competes with the engine, server and client threads and processes that tests run beside
# each other. Child processes (the CLI tests) inherit the variable; this process is set in
# `pytest_configure`, since torch may already be imported.
os.environ.setdefault("OMP_NUM_THREADS", "1")

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


def pytest_configure(config: pytest.Config) -> None:
    import torch

    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
