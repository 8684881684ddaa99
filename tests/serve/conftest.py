"""A real server on loopback (uvicorn in a thread, the pipeline's engine threads behind it)."""

from __future__ import annotations

import socket
import threading
import time

import pytest
import uvicorn

from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from omniflow.serve.run import make_app


class LiveServer:
    def __init__(self, *overrides: str) -> None:
        spec = compose(["platform=cpu", *overrides])
        self.graph = build_graph(spec)
        self.app = make_app(self.graph, spec.server)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(self.app, log_level="warning")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    @property
    def service(self):
        return self.app.state.service

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)

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
