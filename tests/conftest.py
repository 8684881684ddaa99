"""Shared test hooks.

Tests marked `cuda` need a CUDA GPU. CI deselects them (`-m "not cuda"`); a plain `pytest`
on a machine without CUDA skips them with the reason instead of failing them.
"""

from __future__ import annotations

import os
import re

import pytest

# The tests run tiny models on the CPU, where torch's second intra-op thread mostly adds
# synchronisation (tests/stages: 85 -> 60 s on the 2-core CI machine with one thread) and
# competes with the engine, server and client threads and processes that tests run beside
# each other. Child processes (the CLI tests) inherit the variable; this process is set in
# `pytest_configure`, since torch may already be imported.
os.environ.setdefault("OMP_NUM_THREADS", "1")

NO_CUDA = "needs a CUDA GPU (torch.cuda.is_available() is false on this machine)"

RAY_WORKER = re.compile(r"tests/deploy/[^/:]*ray[^/:]*\.py::")
"""Tests of these modules (tests/deploy/*ray*.py) run on one pytest-xdist worker, one after
the other: those that start the local Ray cluster (the `ray_cluster` fixture) share it."""

ONE_WORKER = {
    "ray": RAY_WORKER,
    # the Triton interpreter's child runs every kernel module's checks for the first test
    # that asks (tests/kernels/interpret.py): ~15 s, paid by each worker that gets one
    "kernels": re.compile(r"tests/kernels/"),
}
"""Groups of tests that share something expensive made once per process: pytest-xdist
hands each group to one worker (`pytest_xdist_make_scheduler`)."""


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "ray_cluster" in getattr(item, "fixturenames", ()) and not RAY_WORKER.match(item.nodeid):
            raise pytest.UsageError(
                f"{item.nodeid} starts the Ray cluster: its module belongs in tests/deploy with "
                "'ray' in its name, so that it runs on the one worker that has the cluster"
            )
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


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook: no error where it is not installed
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """`-n N` (`--dist load`): as `load`, every test handed out on its own, except each
    `ONE_WORKER` group's tests, handed to one worker together (the largest groups first).
    Under `load` two workers would each start a Ray cluster, two clusters' processes on the
    CI machine's two cores, and each run the kernels' interpreter child. (pytest-xdist's
    `xdist_group` mark cannot do it here: under pytest 9 its `loadgroup` mode no longer
    renames the grouped tests, so it groups nothing.)"""
    if config.getvalue("dist") != "load":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class OneWorkerGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return next((g for g, ids in ONE_WORKER.items() if ids.match(nodeid)), nodeid)

    return OneWorkerGroups(config, log)
