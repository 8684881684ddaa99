"""A real server on loopback (uvicorn in a thread, the pipeline's engine threads behind it)."""

from __future__ import annotations

import pytest

from omniflow.build.pipeline import build_pipeline
from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from omniflow.core.pipeline import PipelineStats
from omniflow.serve.run import ServerThread
from omniflow.serve.warmup import warmup_frames
from tests.factories import wait_idle


class LiveServer(ServerThread):
    def __init__(self, *overrides: str) -> None:
        spec = compose(["platform=cpu", *overrides])
        self.graph = build_graph(spec)
        self.pipeline = build_pipeline(self.graph)
        super().__init__(self.pipeline, spec.server, warmup=warmup_frames(spec.server, self.graph))

    def wait_idle(self, timeout: float = 20.0) -> None:
        wait_idle(self.pipeline, timeout)


def assert_released(stats: PipelineStats) -> None:
    """Nothing is held: no KV blocks and no decoder slots in any stage (and the pipeline has
    both, so this says something)."""
    assert any(s.kv_blocks_total for s in stats.stages)
    assert any(s.decoder_slots_total for s in stats.stages)
    for s in stats.stages:
        assert s.kv_blocks_used in (None, 0), s
        assert s.decoder_slots_used in (None, 0), s


@pytest.fixture(scope="module")
def live():
    with LiveServer() as server:
        yield server
