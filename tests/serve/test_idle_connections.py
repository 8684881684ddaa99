"""Connections that send nothing, or send a request head slowly, cannot hold the server
(issue 36 item 13; docs/reliability.md, "Clients that misbehave").

Before: a connection took a turn of the intake when accepted and held it until its first
bytes or 1 s, eight at a time, so 400 silent connections delayed a new client's /health by
50 s, and silent connections arriving faster than eight a second delayed every later client
more and more; none of them was ever closed. Now a connection takes a turn only with a
request's first bytes (`serve.intake`), and one that owes a request head is closed after
`server.header_timeout_s` or when its address, or all clients, hold too many such
(`serve.connections.HeadWatch`)."""

from __future__ import annotations

import json
import select
import socket
import time

import httpx
import pytest

from omniflow.config.compose import compose
from omniflow.serve.run import ServerThread
from tests.serve.fake_pipeline import FakePipeline
from tests.serve.test_keep_alive import idle_connection


def serve(*overrides: str) -> ServerThread:
    return ServerThread(FakePipeline(), compose(["platform=cpu", *overrides]).server)


def connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.socket()
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    return sock


def closed_within(sock: socket.socket, seconds: float) -> bytes | None:
    """What the server sent before it closed the connection within `seconds`; None if the
    connection is still open then."""
    deadline = time.monotonic() + seconds
    data = b""
    while (left := deadline - time.monotonic()) > 0:
        if not select.select([sock], [], [], left)[0]:
            return None
        try:
            chunk = sock.recv(65536)
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk
    return None


def until(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


def health_s(url: str) -> float:
    t0 = time.monotonic()
    assert httpx.get(url + "/health", timeout=5).status_code == 200
    return time.monotonic() - t0


def test_four_hundred_silent_connections_do_not_delay_a_new_client():
    """No connection is closed here (the bounds are raised past 400): silent connections
    simply hold nothing. Before, this /health waited ~50 s (here: a 5 s timeout)."""
    with serve("server.max_unheard_per_client=1000", "server.max_unheard_connections=1000") as s:
        silent = [connect(s.port) for _ in range(400)]
        try:
            waited = health_s(s.url)
            assert all(closed_within(sock, 0) is None for sock in silent[:5])  # still open
        finally:
            for sock in silent:
                sock.close()
    assert waited < 1.0, waited


def test_silent_connections_arriving_steadily_do_not_delay_later_clients():
    """50 silent connections a second for a second, a new client every 0.1 s between them:
    before, each waited behind the silent ones accepted before it (seconds by the end)."""
    with serve("server.max_unheard_per_client=1000", "server.max_unheard_connections=1000") as s:
        silent: list[socket.socket] = []
        waits = []
        try:
            for _ in range(10):
                silent += [connect(s.port) for _ in range(5)]
                waits.append(health_s(s.url))
                time.sleep(0.1)
        finally:
            for sock in silent:
                sock.close()
    assert max(waits) < 0.5, waits


def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout():
    with serve("server.header_timeout_s=0.3") as s:
        sock = connect(s.port)
        sent = closed_within(sock, 3.0)
        sock.close()
    assert sent == b""  # closed, with nothing to answer


@pytest.mark.parametrize("kept_alive", [False, True])
def test_a_head_sent_slowly_gets_a_408_json_at_the_timeout(kept_alive):
    """A byte every 0.1 s does not extend the deadline; on a kept-alive connection the
    deadline starts with the next request's first bytes."""
    with serve("server.header_timeout_s=0.5") as s:
        if kept_alive:
            sock = idle_connection(s.url)  # a request answered, the connection kept
            time.sleep(0.6)  # idle between requests: the keep-alive timeout's, not this one
        else:
            sock = connect(s.port)
        t0 = time.monotonic()
        for byte in b"GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: yes\r\n":
            try:
                sock.sendall(bytes([byte]))
            except (BrokenPipeError, ConnectionResetError):
                break
            if select.select([sock], [], [], 0.1)[0]:
                break
        sent = closed_within(sock, 3.0)
        took = time.monotonic() - t0
        sock.close()
    assert sent is not None and sent.startswith(b"HTTP/1.1 408 "), sent
    head, body = sent.split(b"\r\n\r\n", 1)
    assert b"content-type: application/json" in head
    assert json.loads(body)["error"]["code"] == "408"
    assert took < 2.0, took


def test_an_address_holding_too_many_silent_connections_loses_its_oldest():
    """Its newest connections, and a client that sends its request at once from the same
    address, are served."""
    with serve("server.max_unheard_per_client=4") as s:
        silent = [connect(s.port) for _ in range(6)]
        try:
            waited = health_s(s.url)  # a seventh from the same address, answered
            gone = [closed_within(sock, 3.0) for sock in silent[:2]]
            kept = [closed_within(sock, 0.05) for sock in silent[3:]]
        finally:
            for sock in silent:
                sock.close()
    assert gone == [b"", b""] and kept == [None, None, None], (gone, kept)
    assert waited < 1.0


def test_past_the_total_the_oldest_silent_connection_of_any_address_is_closed():
    with serve("server.max_unheard_per_client=4", "server.max_unheard_connections=6") as s:
        first = [connect(s.port, "127.0.0.2") for _ in range(3)]
        until(lambda: s.server.watch.stale == 3)  # owing a while, before the others
        later = [connect(s.port, "127.0.0.3") for _ in range(4)]
        try:
            gone = closed_within(first[0], 3.0)
            kept = [closed_within(sock, 0.05) for sock in first[1:] + later]
        finally:
            for sock in first + later:
                sock.close()
    assert gone == b"" and kept == [None] * 6, (gone, kept)
