"""A real server on loopback (uvicorn in a thread, the pipeline's engine threads behind it)."""

from __future__ import annotations

import pytest

from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from omniflow.serve.run import ServerThread
from tests.factories import wait_idle


class LiveServer(ServerThread):
    def __init__(self, *overrides: str) -> None:
        spec = compose(["platform=cpu", *overrides])
        self.graph = build_graph(spec)
        super().__init__(self.graph, spec.server)

    @property
    def service(self):
        return self.app.state.service

    def wait_idle(self, timeout: float = 20.0) -> None:
        wait_idle(self.service.orch, timeout)


@pytest.fixture(scope="module")
def live():
    with LiveServer() as server:
        yield server
