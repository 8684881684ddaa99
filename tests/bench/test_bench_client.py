"""The load generator really runs `concurrency` requests at once (httpx's default pool of 100
connections made concurrency 128 two waves)."""

from __future__ import annotations

import asyncio
import socket
import threading

import uvicorn

from omniflow.bench.client import Prompt, run

CONCURRENCY = 120


class Gate:
    """An ASGI app whose speech route answers only once CONCURRENCY requests are in flight
    together (or, after 20 s, with a 503: a failed request)."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.peak = 0
        self.all_in: asyncio.Event | None = None

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})
            return
        if self.all_in is None:
            self.all_in = asyncio.Event()
        while (await receive()).get("more_body"):
            pass
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        if self.in_flight >= CONCURRENCY:
            self.all_in.set()
        try:
            await asyncio.wait_for(self.all_in.wait(), 20)
            status, body = 200, b"\x00\x00" * 1920
        except TimeoutError:
            status, body = 503, b"not all requests arrived together"
        self.in_flight -= 1
        await send({"type": "http.response.start", "status": status, "headers": []})
        await send({"type": "http.response.body", "body": body})


def test_the_client_runs_every_request_of_its_concurrency_at_once():
    app = Gate()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(CONCURRENCY + 8)  # connections queue before the server thread accepts
    config = uvicorn.Config(app, log_level="warning", lifespan="off")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    try:
        url = f"http://127.0.0.1:{sock.getsockname()[1]}"
        prompts = [Prompt("hi", 1)] * CONCURRENCY
        outcome = asyncio.run(run(url, prompts, CONCURRENCY, 0, "m", "v"))
        assert outcome.failures == [] and len(outcome.samples) == CONCURRENCY
        assert app.peak == CONCURRENCY
    finally:
        server.should_exit = True
        thread.join(10)
