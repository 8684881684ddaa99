"""uvicorn's h11 protocol with the server's connection rules (docs/reliability.md, "Clients
that misbehave"), made by `guarded_protocol` for `serve.run.Server`:

- a request's first bytes wait for a turn of the event loop (`serve.intake.Intake`);
- a connection that owes a request head is watched (`serve.connections.HeadWatch`): closed
  when it takes longer than `server.header_timeout_s`, or when its client address, or all
  clients, hold too many such connections;
- a request head h11 refuses (no Host, a malformed Content-Length, over
  `server.max_header_bytes`) is answered in the API's JSON error shape with h11's status
  (400, 431, 501), where uvicorn answers a plain-text 400 and drops the reason. h11 bounds
  only a head still arriving by size; `GuardedConnection` also bounds a whole one that came
  in one read.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from omniflow.serve.connections import HeadWatch
from omniflow.serve.errors import ApiError, raw_error_response
from omniflow.serve.intake import Intake

Event = Any
"""What `h11.Connection.next_event` returns: an event, or the NEED_DATA / PAUSED sentinels."""


class GuardedConnection(h11.Connection):
    """h11's server connection, keeping the protocol error it raised (uvicorn's handler
    gets only a fixed message) and refusing a whole request head over `max_head_bytes`."""

    def __init__(self, max_head_bytes: int) -> None:
        super().__init__(h11.SERVER, max_incomplete_event_size=max_head_bytes)
        self.max_head_bytes = max_head_bytes
        self.refused: h11.RemoteProtocolError | None = None

    def next_event(self) -> Event:
        try:
            event = super().next_event()
        except h11.RemoteProtocolError as exc:
            self.refused = exc
            raise
        if isinstance(event, h11.Request) and head_bytes(event) > self.max_head_bytes:
            self.refused = h11.RemoteProtocolError("head too large", error_status_hint=431)
            raise self.refused
        return event


def head_bytes(request: h11.Request) -> int:
    """The size of a request head as sent: request line, headers, blank line."""
    fields = sum(len(name) + len(value) + 4 for name, value in request.headers.raw_items())
    return len(request.method) + len(request.target) + 12 + fields + 2


def refusal(error: h11.RemoteProtocolError | None, max_head_bytes: int) -> ApiError:
    """The API error for a request head h11 refused (None: no reason kept)."""
    if error is None:
        return ApiError(400, "invalid HTTP request")
    if error.error_status_hint == 431:
        return ApiError(
            431, f"the request head is over {max_head_bytes} bytes (server.max_header_bytes)"
        )
    return ApiError(error.error_status_hint, f"invalid HTTP request: {error}")


def guarded_protocol(intake: Intake, watch: HeadWatch, max_head_bytes: int) -> type[H11Protocol]:
    """uvicorn's h11 protocol (the one its "auto" picks without httptools, which omniflow
    does not install) under `intake`, `watch` and `max_head_bytes`."""

    class GuardedH11Protocol(H11Protocol):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.conn = GuardedConnection(max_head_bytes)
            self.address = ""

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self.address = self.client[0] if self.client else ""
            watch.owes(self)

        def data_received(self, data: bytes) -> None:
            if self._between_requests() and not intake.admit(self, data):
                return
            self._handle(data)

        def connection_lost(self, exc: Exception | None) -> None:
            intake.forget(self)
            watch.paid(self)
            super().connection_lost(exc)

        def send_400_response(self, msg: str) -> None:
            self.transport.write(raw_error_response(refusal(self.conn.refused, max_head_bytes)))
            self.transport.close()

        # ---- the intake's side (serve.intake.Waiting)

        def hold(self) -> None:
            self.transport.pause_reading()
            self._unset_keepalive_if_required()  # it has sent a request: not idle
            watch.paid(self)  # its bytes are here: it owes nothing while it waits

        def start(self, data: bytes) -> None:
            if self.transport.is_closing():
                return
            self.transport.resume_reading()
            self._handle(data)

        # ---- the watch's side (serve.connections.Owing)

        def give_up(self, reason: str, timed_out: bool) -> None:
            if self.transport.is_closing():
                return
            if timed_out and self.conn.trailing_data[0]:
                message = (
                    f"the request head did not arrive within {watch.timeout_s:g} s "
                    "(server.header_timeout_s)"
                )
                self.transport.write(raw_error_response(ApiError(408, message)))
            self.transport.close()

        # ----

        def _between_requests(self) -> bool:
            """No part of a request has been read since the last one: these bytes start
            one."""
            return self.conn.their_state is h11.IDLE and not self.conn.trailing_data[0]

        def _handle(self, data: bytes) -> None:
            super().data_received(data)
            if self.conn.their_state is h11.IDLE and self.conn.trailing_data[0]:
                if not self.transport.is_closing():
                    watch.owes(self)  # part of a head: the rest is owed
            else:
                watch.paid(self)

    return GuardedH11Protocol
