"""`server.gil_switch_interval_ms` sets the process's GIL switch interval while the server
runs and gives the previous one back when it stops (serve.run.SwitchInterval)."""

from __future__ import annotations

import sys

import pytest

from omniflow.config.compose import compose
from omniflow.errors import ConfigError
from tests.serve.conftest import LiveServer


def test_the_switch_interval_is_set_while_serving_and_restored_after():
    before = sys.getswitchinterval()
    with LiveServer("server.gil_switch_interval_ms=0.25"):
        assert sys.getswitchinterval() == pytest.approx(0.00025)
    assert sys.getswitchinterval() == before


def test_null_leaves_the_interval_alone():
    before = sys.getswitchinterval()
    with LiveServer():
        assert sys.getswitchinterval() == before


@pytest.mark.parametrize("value", ["0", "-1", "101"])
def test_an_interval_out_of_range_is_refused_naming_the_key(value):
    with pytest.raises(ConfigError, match="gil_switch_interval_ms"):
        compose(["platform=cpu", f"server.gil_switch_interval_ms={value}"])
