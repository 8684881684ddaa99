"""How the server takes in requests: in small turns of the event loop, so that a burst cannot
hold the loop for long in one go (docs/reliability.md, "/health under a burst").

Two bounds, both applied by `serve.run.Server`:

- asyncio accepts at most `ACCEPT_BATCH` connections per turn of the event loop (the rest
  wait in the kernel's accept queue, `LISTEN_QUEUE` long);
- `Intake` starts at most `TURN_REQUESTS` requests with a body (POST) per turn, on new and
  kept-alive connections alike; the others wait, paused, in arrival order. Requests
  without a body (GET, HEAD: `/health`, `/metrics`) start at once.

A connection takes a turn only when a request's first bytes have arrived: one that has sent
nothing holds nothing (serve/connections.py bounds how long it may stay).
"""

from __future__ import annotations

import asyncio
import collections
from typing import Protocol

ACCEPT_BATCH = 8
"""Connections accepted per turn of the event loop. asyncio accepts up to the listening
server's `backlog` each time the listening socket is readable; uvicorn's default (2048)
takes a whole burst in one turn."""
LISTEN_QUEUE = 2048
"""The kernel's queue of connections not yet accepted (uvicorn's default backlog); a burst
waits there, not in the loop."""
TURN_REQUESTS = 8
"""Requests with a body started per turn of the event loop (`Intake`)."""
AT_ONCE = (b"GET ", b"HEAD ")
"""Requests that start without a turn: no body to read or parse, and the GET routes answer
from what the server holds (a static docs asset is read on a worker thread), so they cannot
make a turn long; a health check then never queues behind a burst of speech requests."""


class Waiting(Protocol):
    """A connection as the intake sees it (`serve.http_protocol`'s protocol)."""

    def hold(self) -> None:
        """Stop reading: its request waits for a turn."""

    def start(self, data: bytes) -> None:
        """Its turn: read again and handle `data`, the request's first bytes."""


class Intake:
    """At most `per_turn` requests with a body start in one turn of the event loop; the
    others wait, their first bytes kept, in arrival order, and start in later turns.

    Why: the event loop runs every ready callback of a turn before it looks for I/O again.
    A burst's requests arrive together (new connections, or the next request on each of a
    client pool's kept-alive connections as its last answer goes out), so without a bound
    one turn parses all of them and the next runs all of them through the app (each a
    millisecond or so, competing with the engine threads for the GIL): a `/health` probe
    waits behind the whole burst. With turns, a probe waits for about two short turns.

    A turn is one pass of the event loop: `_next_turn`, scheduled with `call_soon` by the
    first start of a turn, runs at the head of the next pass, before its I/O callbacks."""

    def __init__(self, per_turn: int) -> None:
        self.per_turn = per_turn
        self._started = 0
        self._turn_pending = False
        self._waiting: collections.OrderedDict[Waiting, bytes] = collections.OrderedDict()

    def admit(self, connection: Waiting, data: bytes) -> bool:
        """A request's first bytes arrived on `connection`: True to handle them now; False
        when they wait (the connection is held, the intake keeps `data` and starts it on
        a later turn)."""
        if connection in self._waiting:  # bytes already read when it was held
            self._waiting[connection] += data
            return False
        if data.startswith(AT_ONCE):
            return True
        if not self._waiting and self._started < self.per_turn:
            self._started += 1
            self._schedule()
            return True
        connection.hold()
        self._waiting[connection] = data
        self._schedule()
        return False

    def forget(self, connection: Waiting) -> None:
        """The connection closed: its waiting request, if any, is dropped."""
        self._waiting.pop(connection, None)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def _schedule(self) -> None:
        if not self._turn_pending:
            self._turn_pending = True
            asyncio.get_running_loop().call_soon(self._next_turn)

    def _next_turn(self) -> None:
        self._turn_pending = False
        self._started = 0
        while self._waiting and self._started < self.per_turn:
            connection, data = self._waiting.popitem(last=False)
            self._started += 1
            connection.start(data)
        if self._started:
            self._schedule()
