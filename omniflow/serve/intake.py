"""How the server takes in new connections: in small turns, so that a burst of them cannot
hold the event loop for long in one go (docs/reliability.md, "/health under a burst").

Two bounds, both applied by `serve.run.Server`:

- asyncio accepts at most `ACCEPT_BATCH` connections per turn of the event loop (the rest
  wait in the kernel's accept queue, `LISTEN_QUEUE` long);
- `Intake` reads at most `INTAKE_LIMIT` accepted connections at a time until they have sent
  their first bytes; the others wait, paused, in arrival order.
"""

from __future__ import annotations

import asyncio
import collections

from uvicorn.protocols.http.h11_impl import H11Protocol

ACCEPT_BATCH = 8
"""Connections accepted per turn of the event loop. asyncio accepts up to the listening
server's `backlog` each time the listening socket is readable; uvicorn's default (2048)
takes a whole burst in one turn."""
LISTEN_QUEUE = 2048
"""The kernel's queue of connections not yet accepted (uvicorn's default backlog); a burst
waits there, not in the loop."""
INTAKE_LIMIT = 8
"""Accepted connections read at once before they have sent anything (`Intake`)."""
INTAKE_TIMEOUT_S = 1.0
"""A connection that has sent nothing this long after its turn stops holding the intake
(an idle client cannot stall the intake of others)."""


class Intake:
    """New connections take turns to be read: at most `limit` accepted connections that
    have not sent anything yet are read at a time; the others wait, paused (their bytes
    stay in the kernel), in arrival order.

    Why: the event loop runs every ready callback of a turn before it looks for I/O again.
    A burst's connections become readable together (their clients write at once), so
    without a bound one turn parses all of them (h11) and the next runs all of their
    requests through the app (each competing with the engine threads for the GIL): a
    /health probe on an open connection waits behind the whole burst. With turns,
    the loop takes in at most ~`limit` requests per turn, and a probe waits for at most two
    such turns. Bytes already read are never held back: the pause is before the first
    read, so the cost is a connection's place in the queue, not its data."""

    def __init__(self, limit: int, timeout_s: float) -> None:
        self.limit, self.timeout_s = limit, timeout_s
        self._reading: dict[asyncio.BaseProtocol, asyncio.TimerHandle] = {}
        self._waiting: collections.OrderedDict[asyncio.BaseProtocol, asyncio.Transport] = (
            collections.OrderedDict()
        )

    def arrive(self, connection: asyncio.BaseProtocol, transport: asyncio.Transport) -> None:
        """A connection was accepted: read it now if a turn is free, else pause it."""
        if len(self._reading) < self.limit and not self._waiting:
            self._read(connection)
        else:
            transport.pause_reading()
            self._waiting[connection] = transport

    def heard(self, connection: asyncio.BaseProtocol) -> None:
        """The connection sent data, closed, or took too long: its turn ends and the next
        waiting connection's begins. Repeated calls are no-ops."""
        timer = self._reading.pop(connection, None)
        if timer is not None:
            timer.cancel()
        self._waiting.pop(connection, None)
        while self._waiting and len(self._reading) < self.limit:
            waiting, transport = self._waiting.popitem(last=False)
            transport.resume_reading()
            self._read(waiting)

    def _read(self, connection: asyncio.BaseProtocol) -> None:
        loop = asyncio.get_running_loop()
        self._reading[connection] = loop.call_later(self.timeout_s, self.heard, connection)


def paced_protocol(intake: Intake) -> type[H11Protocol]:
    """uvicorn's h11 protocol (the one its "auto" picks without httptools, which omniflow
    does not install), taking its turn in `intake` until its first bytes arrive."""

    class PacedH11Protocol(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            intake.arrive(self, transport)

        def data_received(self, data: bytes) -> None:
            intake.heard(self)
            super().data_received(data)

        def connection_lost(self, exc: Exception | None) -> None:
            intake.heard(self)
            super().connection_lost(exc)

    return PacedH11Protocol
