"""The `reference_live` marker: comparisons that run the official qwen-tts in-process at real
widths (slow, and the package is not a CI dependency). They run only when asked for, e.g.
`python3 -m pytest -m reference_live tests/reference`; otherwise they are deselected, as
the `cuda` tests are in CI."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers", "reference_live: runs the official qwen-tts at real widths (manual, slow)"
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "reference_live" in (config.option.markexpr or ""):
        return
    live = [i for i in items if i.get_closest_marker("reference_live")]
    if live:
        config.hook.pytest_deselected(items=live)
        items[:] = [i for i in items if not i.get_closest_marker("reference_live")]
