"""`python -m omniflow serve`: build the pipeline, serve it with uvicorn, shut down cleanly.

uvicorn handles SIGINT/SIGTERM: it stops accepting connections, lets running responses
finish (up to a grace period), then the lifespan hook stops the engines.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator

import uvicorn
from fastapi import FastAPI

from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from omniflow.config.schema import ServerConfig
from omniflow.serve.pipeline import Pipeline
from omniflow.serve.routes import build_app
from omniflow.stages.build import build_pipeline

log = logging.getLogger("omniflow.serve")
GRACE_S = 10


def make_app(pipeline: Pipeline, server: ServerConfig) -> FastAPI:
    """The app serving `pipeline`, which starts with the server and stops with it."""
    app = build_app(pipeline, server)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        pipeline.start()
        try:
            yield
        finally:
            log.info("stopping engines")
            pipeline.stop()

    app.router.lifespan_context = lifespan
    return app


class ServerThread:
    """The server on a free loopback port in a background thread (benchmarks, tests).

    It takes a built, not yet started pipeline (`build_pipeline(graph)`), so that a test can
    serve a pipeline it controls."""

    def __init__(self, pipeline: Pipeline, server: ServerConfig) -> None:
        self.app = make_app(pipeline, server)
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning"))
        self.thread = threading.Thread(
            target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True
        )

    def __enter__(self) -> ServerThread:
        self.thread.start()
        deadline = time.monotonic() + 60
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("server did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=60)


def run_serve(overrides: list[str], config_dir: str | None) -> int:
    spec = compose(overrides, config_dir)
    graph = build_graph(spec)
    server = spec.server
    if graph.model.load == "dummy":
        log.warning(
            "serving %s with DUMMY weights: the audio is noise, not speech. For speech, load "
            "a checkpoint: python -m omniflow serve model=qwen3_tts_1_7b model.path=DIR "
            "(DIR in the published Qwen3-TTS layout)",
            graph.model.name,
        )
    app = make_app(build_pipeline(graph), server)
    sock = socket.socket(socket.AF_INET6 if ":" in server.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((server.host, server.port))
    host, port = sock.getsockname()[:2]
    log.info(
        "omniflow serving %s (%s pipeline, %s) on http://%s:%d",
        graph.model.name,
        graph.pipeline,
        graph.platform.name,
        host,
        port,
    )
    config = uvicorn.Config(app, log_level=server.log_level, timeout_graceful_shutdown=GRACE_S)
    # uvicorn shuts down gracefully on SIGINT/SIGTERM, then re-raises the signal: make that
    # a clean exit instead of a traceback or a signal death.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    with contextlib.suppress(KeyboardInterrupt):
        uvicorn.Server(config).run(sockets=[sock])
    log.info("omniflow stopped")
    return 0
