"""Connections that send nothing cannot stall the server's intake (`serve.intake.Intake`).

The server reads at most `INTAKE_LIMIT` new connections at a time until they send their
first bytes, so that a burst is taken in small turns (docs/reliability.md). A client that
connects and sends nothing holds such a turn only for `INTAKE_TIMEOUT_S`; without that
bound, `INTAKE_LIMIT` idle connections would leave every later connection unread forever.
"""

from __future__ import annotations

import socket
import time

import httpx

from omniflow.serve.intake import INTAKE_LIMIT, INTAKE_TIMEOUT_S
from tests.serve.conftest import LiveServer


def test_idle_connections_do_not_stall_the_intake():
    with LiveServer() as server:
        idle = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(INTAKE_LIMIT)]
        try:
            t0 = time.monotonic()
            # A new connection, after every turn has gone to a client that sends nothing.
            answer = httpx.get(server.url + "/health", timeout=10 * INTAKE_TIMEOUT_S)
            waited = time.monotonic() - t0
        finally:
            for sock in idle:
                sock.close()
    assert answer.status_code == 200
    # It was read when the idle connections' turns ran out, not before: they did hold it.
    assert waited >= 0.9 * INTAKE_TIMEOUT_S, waited
