"""`deploy=ray` and `pipeline.runtime=ray` tests. Those that need a Ray cluster are marked
`ray` and share one local cluster (`ray_cluster`, a few seconds to start); CI runs them with
the rest, or deselects them with -m 'not ray' where Ray is not installed (they skip
themselves then too).

One cluster for all of them, also under pytest-xdist: the modules that use it have 'ray' in
their names, and tests/conftest.py hands their tests to one worker, which runs them one
after the other, instead of each worker starting a cluster of its own. The cluster is shut
down once the worker leaves this directory: an idle cluster (its GCS, raylet and workers)
would otherwise keep taking CPU from the rest of the suite until the session ends."""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest

CLUSTER = "ray_cluster"


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "ray: starts a local Ray cluster (needs omniflow[ray]; skipped without it)"
    )


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[None]:
    """A local cluster of two CPUs, started by the first test that needs one and shared by
    those that follow it (each module releases what it placed on it: Serve's replicas, the
    stage actors). Shut down by `pytest_runtest_teardown` below."""
    ray = pytest.importorskip("ray")
    if not ray.is_initialized():
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    yield


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """After a test's own teardown (a module's Serve deployment or actors go first, while
    the cluster still runs): the cluster goes too once the next test is not in this
    directory (the tests that use it run one after the other: tests/conftest.py)."""
    try:
        return (yield)
    finally:
        used = CLUSTER in getattr(item, "fixturenames", ())
        needed = nextitem is not None and nextitem.path.parent == item.path.parent
        ray = sys.modules.get("ray")
        if used and not needed and ray is not None and ray.is_initialized():
            ray.shutdown()
