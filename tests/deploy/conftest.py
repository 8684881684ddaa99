"""`deploy=ray` tests. Those that start a Ray cluster are marked `ray` (one local cluster
per module, a few seconds to start); CI runs them with the rest, or deselects them with
-m 'not ray' where Ray is not installed (they skip themselves then too)."""

from __future__ import annotations


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "ray: starts a local Ray cluster (needs omniflow[ray]; skipped without it)"
    )
