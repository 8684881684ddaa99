"""`omniflow serve` logs `READY` only once its socket listens: a client that connects on that
line is accepted (uvicorn's "Application startup complete" comes before the listen, and a
test that waited on it was refused once on the 2-core CI machine)."""

from __future__ import annotations

import logging
import re
import socket
import threading

from omniflow.serve.ready import READY, url_of
from tests.serve.conftest import LiveServer


class ConnectOnReady(logging.Handler):
    """Connects to the logged URL while the READY record is being emitted, i.e. before the
    server's startup can go on to anything else."""

    def __init__(self) -> None:
        super().__init__()
        self.outcomes: list[str] = []
        self.urls: list[str] = []
        self.done = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if READY not in message:
            return
        url = re.search(r"http://[\d.]+:\d+", message).group(0)
        self.urls.append(url)
        host, port = url.removeprefix("http://").split(":")
        try:
            socket.create_connection((host, int(port)), timeout=5).close()
            self.outcomes.append("accepted")
        except ConnectionRefusedError:
            self.outcomes.append("refused")
        self.done.set()


def test_the_ready_line_comes_once_the_socket_accepts_connections():
    handler = ConnectOnReady()
    logger = logging.getLogger("omniflow.serve")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        with LiveServer() as server:
            # uvicorn marks itself started before our startup hook logs: wait for the line.
            assert handler.done.wait(30)
            assert handler.outcomes == ["accepted"]
            assert handler.urls == [server.url]
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_urls_put_an_ipv6_host_in_brackets():
    assert url_of("::1", 8000) == "http://[::1]:8000"
    assert url_of("0.0.0.0", 80) == "http://0.0.0.0:80"
