"""One speech request's response, from the pipeline's events to HTTP bytes.

The engines run on their own threads; their events cross into the HTTP event loop onto a
per-request asyncio queue (`event_queue.LoopHandoff`: one loop wake-up per burst of events),
so the loop never runs a model step.
The response waits for the first audio before choosing a status, so a request that fails
before any audio is a proper JSON error, never an empty 200; after that it is sent whole,
streamed as raw bytes, or streamed as server-sent events. A client that goes away aborts its
request, which frees its KV blocks and decoder slot in every stage.

Backpressure (docs/reliability.md): the response tells the pipeline how much audio it has
taken (`consumed`, once an event has been sent on), so a request whose client stops reading
pauses once `server.max_buffered_audio_s` of its audio waits here; a streamed client that
takes nothing for `server.stalled_client_timeout_s` is dropped (`sending.PacedStream`). At
shutdown `LiveResponses.close` ends every request with an error: a streamed SSE response
ends with `speech.audio.error`, a whole one is a 503.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import AsyncIterator
from dataclasses import dataclass

import numpy as np
from fastapi import Request
from fastapi.responses import Response, StreamingResponse

from omniflow.core.events import AudioEvent
from omniflow.core.pipeline import Pipeline
from omniflow.core.player import ZeroBufferPlayer
from omniflow.serve.bodies import raw_stream, sse
from omniflow.serve.encoders import encode_whole
from omniflow.serve.errors import ApiError, unavailable
from omniflow.serve.event_queue import merge_waiting
from omniflow.serve.metrics import Metrics
from omniflow.serve.protocol import MEDIA_TYPES, SpeechBody
from omniflow.serve.sending import PacedStream
from omniflow.serve.speed import TimeStretch, stretch_event

DISCONNECT_POLL_S = 0.25
SHUTDOWN_MESSAGE = "the server is shutting down"
SHUTDOWN_SEND_GRACE_S = 2.0
"""At shutdown, how long a send to a client that is not reading may still wait."""


class ClientGone(Exception):
    """The client disconnected before the response started."""


class DisconnectWatch:
    """Yields a request's events while checking, at most every DISCONNECT_POLL_S, whether
    the client is still there (events may arrive faster than that; a timeout alone would
    never notice a client that left)."""

    def __init__(self, request: Request) -> None:
        self.request = request
        self.next_check = 0.0

    async def next(self, events: asyncio.Queue[AudioEvent]) -> AudioEvent:
        while True:
            now = time.monotonic()
            if now >= self.next_check:
                self.next_check = now + DISCONNECT_POLL_S
                if await self.request.is_disconnected():
                    raise ClientGone
            try:
                return await asyncio.wait_for(events.get(), self.next_check - now)
            except TimeoutError:
                continue


@dataclass(frozen=True)
class Arrival:
    """When a speech request arrived (its handler started) and when it was submitted to the
    pipeline (`time.perf_counter`)."""

    arrived: float
    submitted: float


class SpeechResponse:
    """The response state of one admitted request: counts its outcome exactly once, and
    aborts it in the pipeline whenever the response ends before the request did."""

    def __init__(
        self,
        pipeline: Pipeline,
        metrics: Metrics,
        sample_rate: int,
        rid: str,
        events: asyncio.Queue[AudioEvent],
        request: Request,
        times: Arrival,
        stall_timeout_s: float,
    ) -> None:
        self.pipeline, self.metrics, self.sample_rate = pipeline, metrics, sample_rate
        self.rid, self.events, self.times = rid, events, times
        self.first_made: float | None = None
        """When the pipeline made the first audio (`AudioEvent.made_at`)."""
        self.seated: float | None = None
        """When the pipeline's source stage seated it (`AudioEvent.seated_at`), if it says."""
        self.first_taken: float | None = None
        """When this handler took that event off its queue, on the event loop."""
        self.stall_timeout_s = stall_timeout_s
        self.watch = DisconnectWatch(request)
        self.finished = False
        self.ok = False
        """It ended with all its audio (no error, not aborted)."""
        self.stopping = False
        """The server is shutting down: an error now is a 503, not a 500."""
        self.stream: PacedStream | None = None
        self.stretcher: TimeStretch | None = None
        """The request's `speed` (None at 1.0), set when the response starts."""
        metrics.request_started()

    def account(self, ev: AudioEvent) -> None:
        if ev.finished and not self.finished:
            self.finished = True
            outcome = {"abort": "abort", "error": "error"}.get(ev.finish_reason or "", "ok")
            self.ok = outcome == "ok"
            m = self.metrics
            m.requests.labels(outcome).inc()
            m.request_ended()

    def abort(self) -> None:
        self.pipeline.abort(self.rid)
        self.account(AudioEvent(self.rid, finished=True, finish_reason="abort"))

    def stop(self) -> None:
        """Shutdown: end the request with an error event (which the response turns into
        `speech.audio.error` or a 503), and stop waiting on a client that does not read."""
        self.stopping = True
        self.pipeline.abort(self.rid, error=SHUTDOWN_MESSAGE)
        if self.stream is not None:
            self.stream.hurry(SHUTDOWN_SEND_GRACE_S)

    def failed(self, error: str | None) -> ApiError:
        """The JSON error of a request that ended before its response started."""
        if self.stopping:
            return unavailable(SHUTDOWN_MESSAGE)
        message = f"generation failed: {error}" if error else "no audio produced"
        return ApiError(500, message, None, "server_error")

    async def respond(self, body: SpeechBody) -> Response:
        """Wait for the first audio (so errors before any audio are proper 4xx/5xx JSON),
        then answer whole or streamed."""
        try:
            first = await self.watch.next(self.events)
            self.first_taken = time.perf_counter()
        except ClientGone:
            self.abort()
            return Response(status_code=499)
        except asyncio.CancelledError:
            self.abort()
            raise
        if first.pcm is None:  # ended before any audio: an error, never an empty 200
            self.account(AudioEvent(self.rid, finished=True, finish_reason="error"))
            raise self.failed(first.error)
        self.account(first)
        self.first_made, self.seated = first.made_at, first.seated_at
        self.stretcher = TimeStretch.of(body.speed, self.sample_rate)
        fmt, sr = body.response_format, self.sample_rate
        if body.streaming and body.stream_format == "sse":
            return self.streamed(sse(self.audio_events(first, False), fmt, sr), "text/event-stream")
        if body.streaming:
            return self.streamed(
                raw_stream(self.audio_events(first, False), fmt, sr), MEDIA_TYPES[fmt]
            )
        return await self.whole(first, fmt)

    def streamed(self, content: AsyncIterator[bytes], media_type: str) -> StreamingResponse:
        self.stream = PacedStream(
            content,
            media_type,
            self.stall_timeout_s,
            self.abort,
            on_first_body=self.first_audio_sent,
            on_last_body=self.last_audio_sent,
        )
        return self.stream

    def first_audio_sent(self) -> None:
        """The first audio bytes went out (a WAV stream's header goes with them): the
        first-audio latency and its three parts."""
        assert self.first_made is not None and self.first_taken is not None  # set by now
        self.metrics.first_audio_sent(
            self.times.arrived,
            self.times.submitted,
            self.first_made,
            time.perf_counter(),
            seated=self.seated,
            taken=self.first_taken,
        )

    def last_audio_sent(self) -> None:
        """The body's last bytes went out (a raw stream that broke or lost its client never
        gets here; an SSE stream does, after its error event): the end-to-end latency of a
        request that ended with all its audio."""
        if self.ok:
            self.metrics.e2e.observe(time.perf_counter() - self.times.arrived)

    async def audio_events(self, first: AudioEvent, poll: bool) -> AsyncIterator[AudioEvent]:
        """The request's events from `first` to its end; `poll` watches for a client that
        left (a streamed response notices that itself, when a write fails). A streamed
        response (`poll` false) plays its audio on a zero-buffer player as it goes out: audio
        sent later than that player needs it is a stall the server saw (/metrics). The audio
        is at the request's `speed` (speed.py); the pipeline is credited what it made."""
        ev = first
        player = None if poll else ZeroBufferPlayer()
        try:
            while True:
                out = stretch_event(self.stretcher, ev)
                if out.pcm is not None:
                    seconds = out.pcm.size / self.sample_rate
                    self.metrics.audio_seconds.inc(seconds)
                    if player is not None:
                        self.metrics.stalled(player.feed(time.perf_counter(), seconds))
                yield out
                if ev.pcm is not None:  # sent on: room for more (backpressure credit)
                    self.pipeline.consumed(self.rid, ev.pcm.size)
                if ev.finished:
                    return
                ev = await (self.watch.next(self.events) if poll else self.events.get())
                ev = merge_waiting(ev, self.events)
                self.account(ev)
        finally:
            if not self.finished:  # client went away (or the server is stopping)
                self.abort()

    async def whole(self, first: AudioEvent, fmt: str) -> Response:
        parts: list[np.ndarray] = []
        last = first
        try:
            async for ev in self.audio_events(first, True):
                last = ev
                self.first_taken = time.perf_counter()  # a whole response's: its last event's
                if ev.pcm is not None:
                    parts.append(ev.pcm)
        except ClientGone:
            return Response(status_code=499)
        if last.error:
            raise self.failed(last.error)
        audio = np.concatenate(parts)
        encoded = encode_whole(audio, fmt, self.sample_rate)
        # a whole response's first audio is its body, ready now: made when its last event
        # was, and its first and last bytes are one
        self.first_made = last.made_at
        self.first_audio_sent()
        self.last_audio_sent()
        return Response(encoded, media_type=MEDIA_TYPES[fmt])


class LiveResponses:
    """The speech responses being served, so that shutdown can end them all. Held weakly: a
    response leaves when it is done and collected, and ending one that already ended is a
    no-op (the pipeline ignores an unknown request)."""

    def __init__(self) -> None:
        self._responses: weakref.WeakSet[SpeechResponse] = weakref.WeakSet()
        self.closing = False

    def add(self, response: SpeechResponse) -> None:
        self._responses.add(response)

    def admit(self) -> None:
        """Refuse new requests once shutdown has begun (a 503)."""
        if self.closing:
            raise unavailable(SHUTDOWN_MESSAGE)

    def close(self) -> None:
        """Shutdown: admit nothing more and end every running request with an error."""
        self.closing = True
        for response in list(self._responses):
            response.stop()
