"""Sending a streamed body when the client stalls, the stream breaks or the server stops.

`PacedStream` is Starlette's `StreamingResponse` with three changes (docs/reliability.md):

- Every send is bounded by the stalled-client timeout. A send waits only while the client
  takes nothing (uvicorn holds it until the socket drains), so a send still waiting after
  the timeout means the client has stopped reading: the request is aborted at once, which
  releases its KV blocks and decoder slot.
- A body iterator that raises `StreamBroken` (generation failed after the 200 went out)
  ends the response without the terminating chunk, the one error signal a started raw HTTP
  body has, instead of an ASGI traceback.
- `hurry` (shutdown) caps how long any send may still wait, so a stalled client cannot hold
  the server past its grace period.

In the two ending cases `on_end` is called at once, so the request is aborted now rather
than when the body generator is collected, and one WARNING says why. uvicorn then closes the
connection; its ERROR line saying the response was not completed is left out for these ends
(`serve/uvicorn_logs.py`), and kept for any other.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable

from fastapi.responses import StreamingResponse
from starlette.types import Message, Receive, Scope, Send

from omniflow.serve.uvicorn_logs import mark_ended_on_purpose

log = logging.getLogger(__name__)


class StreamBroken(Exception):
    """The stream cannot continue (generation failed mid-stream, the server is stopping)."""


class ClientStalled(Exception):
    """A send waited longer than the stalled-client timeout."""


class PacedStream(StreamingResponse):
    def __init__(
        self,
        content: AsyncIterator[bytes],
        media_type: str,
        stall_timeout_s: float,
        on_end: Callable[[], None],
        on_first_body: Callable[[], None] | None = None,
        on_last_body: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(content, media_type=media_type)
        self.stall_timeout_s = stall_timeout_s
        self.on_end = on_end
        self.on_first_body = on_first_body
        """Called once, when the first body bytes have been handed to the connection."""
        self.on_last_body = on_last_body
        """Called once, when the body's end has been (the stream completed)."""
        self._timeout: asyncio.Timeout | None = None
        self._cap: float | None = None
        """Loop time past which no send may wait (set by `hurry`)."""
        self.ended_early = False
        """The body ended before its end on purpose (a stalled client, a broken stream)."""

    def hurry(self, grace_s: float) -> None:
        """No send waits more than `grace_s` from now (the server is stopping). Called on
        the event loop, which owns the running send's timeout."""
        self._cap = asyncio.get_running_loop().time() + grace_s
        if self._timeout is not None:
            when = self._timeout.when()
            self._timeout.reschedule(self._cap if when is None else min(when, self._cap))

    def _sent_body(self, more: bool) -> None:
        """A body message went out: the first one, and the last (`more` false), once each."""
        first, self.on_first_body = self.on_first_body, None
        if first is not None:
            first()
        if not more:
            last, self.on_last_body = self.on_last_body, None
            if last is not None:
                last()

    async def stream_response(self, send: Send) -> None:
        async def bounded(message: Message) -> None:
            when = asyncio.get_running_loop().time() + self.stall_timeout_s
            if self._cap is not None:
                when = min(when, self._cap)
            try:
                async with asyncio.timeout_at(when) as self._timeout:
                    await send(message)
                if message["type"] == "http.response.body":
                    self._sent_body(more=message.get("more_body", False))
            except TimeoutError:
                raise ClientStalled from None
            finally:
                self._timeout = None

        try:
            await super().stream_response(bounded)
        except ClientStalled:
            if self._cap is None:
                log.warning("client read nothing for %g s: request aborted", self.stall_timeout_s)
            else:
                log.warning("server stopping: a client that is not reading was dropped")
            self.ended_early = True
            self.on_end()
        except StreamBroken as exc:
            log.warning("stream ended early: %s", exc)
            self.ended_early = True
            self.on_end()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await super().__call__(scope, receive, send)
        if self.ended_early:  # in the request's task (the body may stream in a child task)
            mark_ended_on_purpose()
