"""The speaker half of a WebSocket speech session (`serve/ws_session.py` is the reader):
the task that takes queued sentences in order, submits each as one speech request, and
sends `audio.start`, its audio and `audio.done`, whole, even when a cancel interrupts."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import numpy as np
from starlette.websockets import WebSocketDisconnect

from omniflow.core.events import AudioEvent
from omniflow.serve.bodies import raw_stream
from omniflow.serve.encoders import encode_whole, mp3_stream
from omniflow.serve.errors import ApiError, unavailable
from omniflow.serve.event_queue import merge_waiting
from omniflow.serve.sending import StreamBroken
from omniflow.serve.speed import TimeStretch, stretch_event
from omniflow.serve.streaming import SHUTDOWN_MESSAGE
from omniflow.serve.text import check_speakable
from omniflow.serve.validation import validate
from omniflow.serve.ws_events import (
    ClientStalled,
    SessionEnded,
    _Done,
    audio_done,
    session_done,
)
from omniflow.serve.ws_live import LiveUtterance

if TYPE_CHECKING:
    pass

log = logging.getLogger("omniflow.serve")


class Speaker:
    """Mixed into `Session`: the speaker task and the sending of every message (one at a
    time, under the session's send lock)."""

    def start_speaker(self) -> None:
        self.speaker = asyncio.create_task(self.speak_all())
        self.speaker.add_done_callback(self.speaker_ended)

    async def stop_speaker(self) -> None:
        task, self.speaker = self.speaker, None
        if task is not None and not task.done():
            task.cancel()
            # Its request was aborted in `stream`'s finally as the cancel unwound it; a client
            # gone meanwhile ends it the same way. Anything else is a bug and ends the session.
            # `wait`, not `await task` under a suppress: a cancel of this caller goes on up.
            await asyncio.wait([task])
            error = None if task.cancelled() else task.exception()
            if error is not None and not isinstance(error, SessionEnded):
                raise error

    def speaker_ended(self, task: asyncio.Task[None]) -> None:
        """A speaker that failed ends the session (the reader is cancelled)."""
        if task.cancelled() or task is not self.speaker:
            return
        exc = task.exception()
        if exc is None:
            return
        if isinstance(exc, SessionEnded):
            self.broken = "stalled" if isinstance(exc, ClientStalled) else "closed"
        else:
            self.broken = "error"
            log.error("websocket session failed", exc_info=exc)
        if self.reader is not None:
            self.reader.cancel()

    async def speak_all(self) -> None:
        while True:
            if self.queue.empty():
                self.last_active = time.monotonic()  # spoke all it had: idle from now
            item = await self.queue.get()
            if isinstance(item, str):
                self.queued_chars -= len(item)
            if isinstance(item, _Done):  # the utterance ends now, before the await: a
                done = session_done(self.utterance, self.index)  # cancel meanwhile finds none
                self.utterance += 1
                self.metrics.utterances.labels("done").inc()
                self.index = 0
                await self.send_event(done)  # whole, as the sentences' events
                continue
            if isinstance(item, LiveUtterance):
                await self.speak(self.index, item.pending, item)
                continue
            try:
                check_speakable(item, "text")
            except ApiError:
                continue  # punctuation left alone ("...", a closing quote): nothing to say
            await self.speak(self.index, item)

    async def speak(self, index: int, text: str, live: LiveUtterance | None = None) -> None:
        """One sentence, or a live utterance: audio.start, its audio, audio.done (with the
        error, if it failed). A live utterance's request takes the text received by the
        time it is submitted, and the rest as it comes (`ws_live.py`)."""
        assert self.template is not None
        fmt = self.template.response_format
        self.current = [index, 0]
        self.speaking_live = live
        await self.send_event(
            {
                "type": "audio.start",
                "utterance_index": self.utterance,
                "sentence_index": index,
                "sentence_text": text,
                "format": fmt,
                "sample_rate": self.info.sample_rate,
            }
        )
        body = self.template.model_copy(update={"input": text})
        # A live utterance whose text all came before it started (one word and input.done)
        # is one whole request, in the streaming layout its incremental text would have had.
        growing = live is not None and not live.done
        if live is not None:
            body = body.model_copy(update={"input": live.pending, "non_streaming_mode": False})
        try:
            validate(body, self.info, self.server, registered=self.registered)
            if self.service.responses.closing:
                raise unavailable(SHUTDOWN_MESSAGE)
            rid, events, _ = self.service.submit(body, self.clone, incremental=growing)
        except ApiError as err:
            self.metrics.sentences.labels("refused").inc()
            error: str | None = err.message
        else:
            if live is not None and growing:
                live.started(rid, self.service.pipeline)
            error = await self.stream(rid, events, fmt, body.speed)
        sent, self.current = self.current[1], None
        self.speaking_live = None
        self.index = index + 1
        await self.send_event(audio_done(self.utterance, index, sent, error))

    async def stream(
        self, rid: str, events: asyncio.Queue[AudioEvent], fmt: str, speed: float
    ) -> str | None:
        """Send one request's audio, at `speed`; its error (None: all of it was sent)."""
        sessions, metrics = self.sessions, self.service.metrics
        sessions.speaking += 1
        metrics.request_started()
        ending: list[AudioEvent] = []
        sr = self.info.sample_rate
        try:
            audio = self.audio(rid, events, ending, TimeStretch.of(speed, sr))
            if self.stream_audio:
                chunks = raw_stream(audio, "pcm" if fmt == "mp3" else fmt, sr)
                if fmt == "mp3":
                    chunks = mp3_stream(chunks, sr)
                try:
                    async for chunk in chunks:
                        await self.send_bytes(chunk)
                except StreamBroken:
                    pass  # the error is the ending's
            else:
                parts = [ev.pcm async for ev in audio if ev.pcm is not None]
                if parts and not ending[-1].error:
                    await self.send_bytes(encode_whole(np.concatenate(parts), fmt, sr))
        finally:
            sessions.speaking -= 1
            if not ending:  # cancelled, or the client went away: free it now
                self.service.pipeline.abort(rid)
                outcome = "abort"
            else:
                last = ending[-1]
                outcome = {"abort": "abort", "error": "error"}.get(last.finish_reason or "", "ok")
            metrics.requests.labels(outcome).inc()
            metrics.request_ended()
            self.metrics.sentences.labels(outcome).inc()
        last = ending[-1]
        if last.text_done_at is not None and not last.error:
            self.metrics.text_tail.observe(time.perf_counter() - last.text_done_at)
            self.metrics.text_tail_frames.observe(last.frames - last.text_done_frames)
        if last.error:
            return f"generation failed: {last.error}"
        if last.finish_reason == "abort":
            return "aborted"
        return None

    async def audio(
        self,
        rid: str,
        events: asyncio.Queue[AudioEvent],
        ending: list[AudioEvent],
        stretcher: TimeStretch | None,
    ) -> AsyncIterator[AudioEvent]:
        """The request's events to its end (kept in `ending`), stretched to the session's
        `speed` (speed.py), its audio credited to the pipeline once sent on (backpressure)."""
        while True:
            ev = merge_waiting(await events.get(), events)
            if ev.finished:
                ending.append(ev)
            out = stretch_event(stretcher, ev)
            if out.pcm is not None:
                self.service.metrics.audio_seconds.inc(out.pcm.size / self.info.sample_rate)
            yield out
            if ev.pcm is not None:
                self.service.pipeline.consumed(rid, ev.pcm.size)
            if ev.finished:
                return

    async def send_event(self, data: dict[str, Any]) -> None:
        """A sentence's `audio.start` or `audio.done` from the speaker, sent whole even if
        an `input.cancel` cancels the speaker meanwhile: the cancel's own events then follow
        it (the send lock is first come, first served), so every `audio.start` the client
        sees has one `audio.done`."""
        sending = asyncio.ensure_future(self.send_json(data))
        sending.add_done_callback(lambda done: done.cancelled() or done.exception())
        await asyncio.shield(sending)

    async def send_json(self, data: dict[str, Any]) -> None:
        await self._send(self.ws.send_json(data))

    async def send_bytes(self, data: bytes) -> None:
        await self._send(self.ws.send_bytes(data))
        self.last_active = time.monotonic()  # audio flowing: the session is not idle
        if self.current is not None:
            self.current[1] += len(data)

    async def _send(self, sending: Any) -> None:
        """One message, whole, within `server.stalled_client_timeout_s`: a client that takes
        nothing for that long ends the session."""
        async with self.send_lock:
            try:
                # asyncio.timeout, not wait_for: a cancel (barge-in, the session's end) that
                # lands as the send completes is not swallowed, so `stop_speaker` returns
                async with asyncio.timeout(self.server.stalled_client_timeout_s):
                    await sending
            except TimeoutError:
                raise ClientStalled("the client stopped reading") from None
            except (WebSocketDisconnect, RuntimeError, OSError) as exc:
                raise SessionEnded(f"the client left: {exc}") from None
