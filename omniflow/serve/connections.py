"""Connections the server is waiting on for a request head: bounded in time, per client
address and in total (docs/reliability.md, "Clients that misbehave").

uvicorn (0.55, h11) bounds a request head's size (`h11_max_incomplete_event_size`) and an
idle kept-alive connection's life (`timeout_keep_alive`, armed once a response is complete),
but not how long a connection may take to send a request head: a client that connects and
sends nothing, or sends its headers a byte at a time, keeps its connection for ever. Nor
does it bound how many such connections one client holds (`limit_concurrency` counts every
connection and task, and answers a plain-text 503 to the next request, whoever sends it).

`HeadWatch` keeps, for every connection that owes the server a request head:

- a deadline, `server.header_timeout_s` after the server started waiting for that head (the
  connection opened, or the first bytes of a later request arrived); at it the connection is
  closed, with a 408 JSON if part of a head came;
- once it has owed for `STALE_AFTER_S`, its place among the client address's such
  connections, and among all of them: past `server.max_unheard_per_client` or
  `server.max_unheard_connections` the oldest is closed. Closing the oldest (not refusing
  the newest) means a client that keeps opening connections cannot shut out one that sends
  its request at once, even from the same address; counting only connections silent for a
  while means a client pool that opens a hundred connections at once and writes its
  requests a little later loses none of them.

Connections whose request waits for its turn in `serve.intake` do not owe anything (their
bytes are here) and are not counted.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from typing import Protocol

log = logging.getLogger("omniflow.serve.connections")
STALE_AFTER_S = 1.0
"""How long a connection may owe a request head before it counts against the bounds (at
most `server.header_timeout_s`): clients write a request within milliseconds of connecting,
even a loaded one that opens a pool of connections at once."""


class Owing(Protocol):
    """A connection as the watch sees it (`serve.http_protocol`'s protocol)."""

    @property
    def address(self) -> str:
        """The client's address (the host of its peer name)."""

    def give_up(self, reason: str, timed_out: bool) -> None:
        """Close the connection: it did not send its request head in time (`timed_out`),
        or made room for a newer one."""


class HeadWatch:
    """The connections that owe a request head, each with its next timer (going stale,
    then its deadline); the stale ones, oldest first, overall and by address."""

    def __init__(self, timeout_s: float, per_client: int, total: int) -> None:
        self.timeout_s, self.per_client, self.total = timeout_s, per_client, total
        self.stale_after_s = min(STALE_AFTER_S, timeout_s)
        self._timers: dict[Owing, asyncio.TimerHandle] = {}
        self._stale: collections.OrderedDict[Owing, None] = collections.OrderedDict()
        self._by_address: dict[str, collections.OrderedDict[Owing, None]] = {}
        self.closed = collections.Counter[str]()
        """Connections closed, by reason: timeout, per_client, total."""

    def owes(self, connection: Owing) -> None:
        """The server now waits for `connection`'s request head (no-op if it already did:
        its timers stay the first ones)."""
        if connection in self._timers:
            return
        loop = asyncio.get_running_loop()
        self._timers[connection] = loop.call_later(self.stale_after_s, self._go_stale, connection)

    def paid(self, connection: Owing) -> None:
        """The head came, the intake holds its bytes, or the connection closed."""
        timer = self._timers.pop(connection, None)
        if timer is None:
            return
        timer.cancel()
        if connection in self._stale:
            del self._stale[connection]
            peers = self._by_address[connection.address]
            del peers[connection]
            if not peers:
                del self._by_address[connection.address]

    @property
    def owing(self) -> int:
        return len(self._timers)

    @property
    def stale(self) -> int:
        return len(self._stale)

    def _go_stale(self, connection: Owing) -> None:
        """It has owed a while: it counts against the bounds now, until its deadline."""
        left = self.timeout_s - self.stale_after_s
        loop = asyncio.get_running_loop()
        self._timers[connection] = loop.call_later(left, self._close, connection, "timeout")
        self._stale[connection] = None
        peers = self._by_address.setdefault(connection.address, collections.OrderedDict())
        peers[connection] = None
        while len(peers) > self.per_client:
            self._close(next(iter(peers)), "per_client")
        while len(self._stale) > self.total:
            self._close(next(iter(self._stale)), "total")

    def _close(self, connection: Owing, reason: str) -> None:
        self.paid(connection)
        self.closed[reason] += 1
        log.debug("closing a connection from %s: %s", connection.address, reason)
        connection.give_up(reason, timed_out=reason == "timeout")
