"""Bench tests run jobs in-process: none inherits the pipeline an earlier one kept."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from omniflow.bench.reuse import CACHE


@pytest.fixture(autouse=True)
def no_kept_pipeline() -> Iterator[None]:
    yield
    CACHE.close()
