"""A real server on loopback (uvicorn in a thread, the pipeline's engine threads behind it)."""

from __future__ import annotations

import time

import pytest

from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from omniflow.serve.run import ServerThread


class LiveServer(ServerThread):
    def __init__(self, *overrides: str) -> None:
        spec = compose(["platform=cpu", *overrides])
        self.graph = build_graph(spec)
        super().__init__(self.graph, spec.server)

    @property
    def service(self):
        return self.app.state.service

    def wait_idle(self, timeout: float = 20.0) -> None:
        """Every request ended and every engine applied its drops (KV, slots back)."""
        orch = self.service.orch
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for e in orch.engines:
                e.call(lambda: [])
            if orch.num_live == 0 and not any(e.has_work for e in orch.engines):
                runner = orch.talker.runner
                if not runner.requests:
                    return
            time.sleep(0.02)
        raise AssertionError("server did not go idle")


@pytest.fixture(scope="module")
def live():
    with LiveServer() as server:
        yield server
