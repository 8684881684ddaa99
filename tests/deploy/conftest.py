"""`deploy=ray` and `pipeline.runtime=ray` tests. Those that need a Ray cluster are marked
`ray` and share one local cluster for the session (`ray_cluster`, a few seconds to start);
CI runs them with the rest, or deselects them with -m 'not ray' where Ray is not installed
(they skip themselves then too)."""

from __future__ import annotations

import pytest


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "ray: starts a local Ray cluster (needs omniflow[ray]; skipped without it)"
    )


@pytest.fixture(scope="session")
def ray_cluster():
    """One local cluster of two CPUs for every test that needs one (each module releases
    what it placed on it: Serve's replicas, the stage actors)."""
    ray = pytest.importorskip("ray")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        yield
    finally:
        ray.shutdown()
