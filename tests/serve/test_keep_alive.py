"""`server.keep_alive_timeout_s`: how long the server keeps an idle kept-alive connection
(docs/reliability.md, "Kept-alive connections are closed by the client"). uvicorn's own
default, 5 s, equals httpx's pool expiry, so a pooled client could reuse a connection just as
the server closed it (a request lost before its headers)."""

from __future__ import annotations

import select
import socket
import time

from omniflow.config.compose import compose
from omniflow.serve.run import ServerThread
from tests.serve.fake_pipeline import FakePipeline


def idle_connection(url: str) -> socket.socket:
    """A connection that made one kept-alive request (/health) and read its whole answer."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.create_connection((host, int(port)))
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, body = data.split(b"\r\n\r\n", 1)
    length = int(
        next(
            v
            for k, v in (h.split(b": ", 1) for h in head.split(b"\r\n")[1:])
            if k.lower() == b"content-length"
        )
    )
    while len(body) < length:
        body += sock.recv(65536)
    assert head.startswith(b"HTTP/1.1 200")
    return sock


def closed_within(sock: socket.socket, seconds: float) -> float | None:
    """Seconds until the server closed the connection (EOF), or None if it stayed open."""
    t0 = time.monotonic()
    ready, _, _ = select.select([sock], [], [], seconds)
    if ready and sock.recv(1) == b"":
        return time.monotonic() - t0
    return None


def test_idle_connections_close_after_the_configured_time():
    short = compose(["platform=cpu", "server.keep_alive_timeout_s=0.3"]).server
    with ServerThread(FakePipeline(), short) as server:
        assert server.server.config.timeout_keep_alive == 0.3
        sock = idle_connection(server.url)
        took = closed_within(sock, 5.0)
        sock.close()
    assert took is not None and took < 2.0, took


def test_the_default_is_handed_to_uvicorn_and_keeps_an_idle_connection_open():
    """The default (75 s, past clients' 5 s pool expiry) is what uvicorn is configured with;
    an idle connection is still open and usable a second later (a 0.3 s setting closed it
    within that time, above). `omniflow serve` itself: tests/serve/test_serve_cli.py."""
    spec = compose(["platform=cpu"]).server
    assert spec.keep_alive_timeout_s == 75.0
    with ServerThread(FakePipeline(), spec) as server:
        assert server.server.config.timeout_keep_alive == 75.0
        sock = idle_connection(server.url)
        assert closed_within(sock, 1.0) is None
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")  # and it is still usable
        assert sock.recv(65536).startswith(b"HTTP/1.1 200")
        sock.close()
