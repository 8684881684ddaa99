"""`python -m omniflow serve`: build the pipeline, serve it with uvicorn, shut down cleanly.

uvicorn handles SIGINT/SIGTERM. Before its own shutdown (stop accepting, wait for
connections up to a grace period, then the lifespan hook stops the engines) `Server` ends
every running request with an error (docs/reliability.md): a streamed SSE response ends
with `speech.audio.error`, a whole one is a JSON 503, a raw stream is cut short; so
connections close at once, no task is cancelled mid-response (an ASGI traceback), and the
process exits 0.

`Server` also paces how fast the event loop takes in connections and requests
(`serve.intake`), so that a burst cannot hold the loop for long in one go: `/health` stays
responsive during a burst; and it watches connections that owe a request head
(`serve.connections`), so that idle or slow clients cannot hold the server
(docs/reliability.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import socket
import sys
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from fastapi import FastAPI

from omniflow.build.pipeline import build_pipeline
from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from omniflow.config.server import ServerConfig
from omniflow.core.heap import IDLE_TRIM_S, IdleRelease, malloc_trim
from omniflow.core.pipeline import Pipeline
from omniflow.logs import UVICORN_LOG_CONFIG
from omniflow.serve import uvicorn_logs
from omniflow.serve.connections import HeadWatch
from omniflow.serve.http_protocol import guarded_protocol
from omniflow.serve.intake import ACCEPT_BATCH, LISTEN_QUEUE, TURN_REQUESTS, Intake
from omniflow.serve.ready import READY, url_of
from omniflow.serve.routes import SpeechService, build_app
from omniflow.serve.streaming import SHUTDOWN_SEND_GRACE_S
from omniflow.serve.warmup import run_warmup, warmup_frames

log = logging.getLogger("omniflow.serve")
GRACE_S = 10


def make_app(
    pipeline: Pipeline, server: ServerConfig, owns_pipeline: bool = True, warmup: int = 0
) -> FastAPI:
    """The app serving `pipeline`, which starts with the server and stops with it (unless
    the caller keeps it running across servers: `owns_pipeline=False`, the bench's reused
    pipeline), runs a `warmup`-frame request through it first (`serve.warmup`; 0: none),
    and returns the allocator's free memory whenever it goes idle (`core/heap.py` `IdleRelease`)."""
    app = build_app(pipeline, server)
    app.state.idle_trim = IdleRelease(malloc_trim(), IDLE_TRIM_S)
    app.state.service.metrics.watchers.append(app.state.idle_trim)

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        if owns_pipeline:
            pipeline.start()
        try:
            if warmup:  # a failure stops the start, and the engines with it (below)
                await asyncio.to_thread(run_warmup, pipeline, warmup)
            freeze_heap()
            yield
        finally:
            gc.unfreeze()
            app.state.service.references.close()
            if owns_pipeline:
                log.info("stopping engines")
                pipeline.stop()

    app.router.lifespan_context = lifespan
    return app


def freeze_heap() -> None:
    """Move everything alive now (modules, weights, the app: ~200,000 objects) out of the
    garbage collector's reach (`gc.freeze`), after one collection so that no garbage is
    kept. Otherwise every full collection walks all of them with the event loop stopped, a
    pause every client sees, and a burst's allocations trigger one. The
    lifespan undoes it at shutdown (`gc.unfreeze`)."""
    gc.collect()
    gc.freeze()


def listening_socket(family: socket.AddressFamily) -> socket.socket:
    """A TCP socket for uvicorn's `sockets=`. Created with the TCP protocol number, not 0:
    asyncio turns Nagle's algorithm off (TCP_NODELAY) only on sockets whose `proto` says
    TCP, and accepted sockets inherit it. Without it, a response written as headers then body
    (every /health answer, every streamed chunk) waits out the client's delayed ACK on each
    reused connection."""
    return socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)


def uvicorn_config(app: FastAPI, server: ServerConfig, **options: Any) -> uvicorn.Config:
    """uvicorn's settings from `server` (and `options`, uvicorn's own keywords). The event
    loop is asyncio's, not uvicorn's "auto" (uvloop wherever some other package installed
    it): the intake's turns are passes of asyncio's loop (`serve.intake`), and the server's
    timing under a burst was measured on it."""
    config = uvicorn.Config(
        app,
        loop="asyncio",
        log_config=UVICORN_LOG_CONFIG,  # one format for omniflow's and uvicorn's lines
        timeout_keep_alive=server.keep_alive_timeout_s,
        h11_max_incomplete_event_size=server.max_header_bytes,
        ws_max_size=server.body_limit,  # a session.config may carry a reference, as a body may
        **options,
    )
    uvicorn_logs.install()  # after the config's logging set-up
    return config


class Server(uvicorn.Server):
    """uvicorn's server, taking in connections and requests in small turns (`Intake`),
    watching connections that owe a request head (`HeadWatch`), and ending the app's
    running requests first when it shuts down."""

    def __init__(self, config: uvicorn.Config, service: SpeechService) -> None:
        limits = service.server
        self.intake = Intake(TURN_REQUESTS)
        self.watch = HeadWatch(
            limits.header_timeout_s, limits.max_unheard_per_client, limits.max_unheard_connections
        )
        config.http = guarded_protocol(self.intake, self.watch, limits.max_header_bytes)
        config.backlog = ACCEPT_BATCH  # asyncio's accept batch; the kernel queue: startup
        super().__init__(config)
        self.service = service

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        """uvicorn's startup, then the kernel's accept queue set back to `LISTEN_QUEUE`
        (asyncio listens with the accept batch; listening again only resizes the queue)."""
        await super().startup(sockets)
        for sock in sockets or []:
            sock.listen(LISTEN_QUEUE)
            host, port = sock.getsockname()[:2]
            log.info("%s on %s", READY, url_of(host, port))

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        running = self.service.pipeline.stats().in_flight
        log.info("shutting down: ending %d running request(s)", running)
        self.service.close()
        reaper = asyncio.create_task(self.drop_unflushed(SHUTDOWN_SEND_GRACE_S + 0.5))
        try:
            await super().shutdown(sockets)
        finally:
            reaper.cancel()

    async def drop_unflushed(self, after_s: float) -> None:
        """Abort the connections still closing `after_s` into the shutdown. A response that
        gave up on a client that does not read leaves its connection closing with unsent
        bytes, and asyncio reports it lost only once those are flushed, which that client
        never allows; uvicorn would wait for it until its grace period ran out."""
        await asyncio.sleep(after_s)
        for connection in list(self.server_state.connections):
            if connection.transport.is_closing():
                connection.transport.abort()


class ServerThread:
    """The server on a free loopback port in a background thread (benchmarks, tests).

    It takes a built, not yet started pipeline (`build_pipeline(graph)`), so that a test can
    serve a pipeline it controls; with `owns_pipeline=False` a started one, left running."""

    def __init__(
        self,
        pipeline: Pipeline,
        server: ServerConfig,
        owns_pipeline: bool = True,
        warmup: int = 0,
    ) -> None:
        self.app = make_app(pipeline, server, owns_pipeline, warmup)
        self.sock = listening_socket(socket.AF_INET)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn_config(self.app, server, log_level="warning")
        self.server = Server(config, self.app.state.service)
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
    # The dummy-weights warning comes once, from the model factory that loads them.
    app = make_app(build_pipeline(graph), server, warmup=warmup_frames(server, graph))
    sock = listening_socket(socket.AF_INET6 if ":" in server.host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((server.host, server.port))
    host, port = sock.getsockname()[:2]
    log.info(
        "omniflow serving %s (%s pipeline, %s) on %s",
        graph.model.name,
        graph.pipeline,
        graph.platform.name,
        url_of(host, port),
    )
    config = uvicorn_config(
        app, server, log_level=server.log_level, timeout_graceful_shutdown=GRACE_S
    )
    # uvicorn shuts down gracefully on SIGINT/SIGTERM, then re-raises the signal: make that
    # a clean exit instead of a traceback or a signal death (SIGTERM's SystemExit(0) passes
    # through the `finally`, so the last line is logged on every way out).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        with contextlib.suppress(KeyboardInterrupt):
            Server(config, app.state.service).run(sockets=[sock])
    finally:
        log.info("omniflow stopped")
    return 0
