"""`WS /v1/audio/speech/stream`: text in as it is written, audio out a sentence at a time
(vLLM-Omni's protocol; docs/websocket.md has the messages and their semantics).

A session is configured once (`session.config`: the speech request's fields, less `input`),
then receives text pieces (`input.text`); a `SentenceBuffer` cuts them into sentences, and
each complete sentence becomes one speech request through the HTTP route's own path
(`validate`, `SpeechService.submit` with the server's `RequestLimits`), spoken in order by
the session's speaker task: `audio.start`, binary audio, `audio.done`. `input.done` speaks
what is left and ends the utterance with `session.done`; the session stays open for the
next. `input.cancel`, or the socket closing, aborts the utterance at once (`Pipeline.abort`
frees its KV blocks and decoder slot); the next one starts clean.

Limits: an utterance's text (`server.max_input_chars`), a session that neither sends nor has
anything to speak for `server.ws_idle_timeout_s` is closed, a message that is not JSON or of
an unknown type is answered with an `error` event and the session goes on, and an open
session counts against `server.max_concurrent_requests` (`admit`) whether or not it is
speaking.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import numpy as np
from fastapi import FastAPI, WebSocket
from prometheus_client import Counter, Gauge
from pydantic import ValidationError
from starlette.websockets import WebSocketDisconnect, WebSocketState

from omniflow.core.events import AudioEvent
from omniflow.core.pipeline import PipelineStats
from omniflow.serve.bodies import raw_stream
from omniflow.serve.encoders import encode_whole, mp3_stream
from omniflow.serve.errors import ApiError, clip, encodable, unavailable
from omniflow.serve.protocol import STREAMABLE, SpeechBody
from omniflow.serve.request_body import parse_json
from omniflow.serve.sending import StreamBroken
from omniflow.serve.sentences import SentenceBuffer
from omniflow.serve.streaming import SHUTDOWN_MESSAGE, merge_waiting
from omniflow.serve.text import check_printable, check_speakable
from omniflow.serve.validation import admit, validate
from omniflow.serve.voices import Clone

log = logging.getLogger("omniflow.serve")

PATH = "/v1/audio/speech/stream"
MESSAGE_TYPES = ("session.config", "input.text", "input.done", "input.cancel")
CONFIG_ONLY = ("stream_audio", "incremental")
"""session.config's own fields; the others are the speech request's."""
NOT_IN_CONFIG = {
    "input": "the text comes in input.text messages",
    "stream": "a session's audio is streamed per sentence with stream_audio",
    "stream_format": "a session's audio is streamed per sentence with stream_audio",
    "ref_audio": "register the reference once (POST /v1/audio/voices) and name its id as voice",
    "ref_text": "register the reference once (POST /v1/audio/voices) and name its id as voice",
    "x_vector_only_mode": "register the reference once (POST /v1/audio/voices) and name its id",
}
PROBE_INPUT = "probe"
"""The text a session's configuration is validated with (each sentence is checked again)."""
CLOSE_WAIT_S = 1.0
"""How long closing a session the server ends may wait on a client that does not read."""
CLOSE_NORMAL, CLOSE_POLICY, CLOSE_ERROR, CLOSE_TRY_LATER = 1000, 1008, 1011, 1013


class _Done:
    """The end of an utterance in the speaker's queue (the client's input.done)."""


DONE = _Done()


class SessionEnded(Exception):
    """The session cannot go on: the client left."""


class ClientStalled(SessionEnded):
    """The client took nothing for `server.stalled_client_timeout_s`."""


class WsMetrics:
    """The endpoint's own series (its sentences are also counted as speech requests)."""

    def __init__(self, registry: Any) -> None:
        self.open = Gauge(
            "omniflow_ws_sessions_open", "WebSocket speech sessions open", registry=registry
        )
        self.ended = Counter(
            "omniflow_ws_sessions",
            "WebSocket speech sessions by how they ended (closed: by the client; idle: "
            "server.ws_idle_timeout_s; refused: not admitted; stalled: the client stopped "
            "reading; error: the server failed)",
            ["outcome"],
            registry=registry,
        )
        self.utterances = Counter(
            "omniflow_ws_utterances",
            "Utterances ended on WebSocket sessions (done: input.done; cancelled: input.cancel)",
            ["outcome"],
            registry=registry,
        )
        self.sentences = Counter(
            "omniflow_ws_sentences",
            "Sentences spoken on WebSocket sessions by outcome",
            ["outcome"],
            registry=registry,
        )
        self.refused_messages = Counter(
            "omniflow_ws_messages_refused",
            "Client messages answered with an error event",
            registry=registry,
        )


class SpeechSessions:
    """The sessions of one app: admission (an open session holds a place of the in-flight
    cap) and metrics."""

    def __init__(self, service: Any) -> None:
        self.service = service
        self.metrics = WsMetrics(service.metrics.registry)
        self.open = 0
        self.speaking = 0
        """Open sessions with a request in the pipeline now (counted in its in_flight)."""

    def load(self, stats: PipelineStats) -> PipelineStats:
        """`stats` with the open sessions that are not speaking counted as in flight."""
        return replace(stats, in_flight=stats.in_flight + self.open - self.speaking)

    def admit(self) -> None:
        self.service.responses.admit()
        admit(self.load(self.service.pipeline.stats()), self.service.server)


def install_websocket(app: FastAPI) -> None:
    """Add the endpoint to `app` (after `app.state.service` is set)."""
    app.state.speech_sessions = SpeechSessions(app.state.service)
    app.add_api_websocket_route(PATH, speech_stream)


async def speech_stream(websocket: WebSocket) -> None:
    """The endpoint function (module level: see endpoints.py for why)."""
    sessions: SpeechSessions = websocket.app.state.speech_sessions
    await websocket.accept()
    try:
        sessions.admit()
    except ApiError as err:
        sessions.metrics.ended.labels("refused").inc()
        with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
            await websocket.send_json(error_event(err))
            code = CLOSE_TRY_LATER if err.status in (429, 503) else CLOSE_POLICY
            await websocket.close(code, clip(err.message, 100))
        return
    sessions.open += 1
    sessions.metrics.open.inc()
    outcome = "error"
    try:
        outcome = await Session(sessions, websocket).run()
        if outcome in ("stalled", "error"):
            code = CLOSE_POLICY if outcome == "stalled" else CLOSE_ERROR
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(close(websocket, code, outcome), CLOSE_WAIT_S)
    finally:
        sessions.open -= 1
        sessions.metrics.open.dec()
        sessions.metrics.ended.labels(outcome).inc()


async def close(websocket: WebSocket, code: int, reason: str) -> None:
    """Close the socket unless it is closed already."""
    with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
        if websocket.application_state == WebSocketState.CONNECTED:
            await websocket.close(code, reason)


def error_event(err: ApiError) -> dict[str, Any]:
    param = None if err.param is None else encodable(clip(err.param))
    return {
        "type": "error",
        "message": encodable(err.message),
        "param": param,
        "code": str(err.status),
    }


class Session:
    """One WebSocket session: the reader (this coroutine) and the speaker task."""

    def __init__(self, sessions: SpeechSessions, websocket: WebSocket) -> None:
        self.sessions = sessions
        self.service = sessions.service
        self.server = self.service.server
        self.info = self.service.info
        self.metrics = sessions.metrics
        self.ws = websocket
        self.template: SpeechBody | None = None
        """The session's request, `input` aside (None: not configured yet)."""
        self.clone: Clone | None = None
        self.stream_audio = False
        self.buffer = SentenceBuffer()
        self.received = 0
        """Characters of the current utterance received so far."""
        self.queue: asyncio.Queue[str | _Done] = asyncio.Queue()
        self.queued_chars = 0
        """Characters of the sentences queued and not yet taken by the speaker."""
        self.index = 0
        """The next sentence's index in the utterance being spoken."""
        self.current: list[int] | None = None
        """[sentence_index, bytes sent] of the sentence being spoken."""
        self.send_lock = asyncio.Lock()
        self.speaker: asyncio.Task[None] | None = None
        self.reader: asyncio.Task[Any] | None = None
        self.last_active = time.monotonic()
        """The last message, or the end of the last thing spoken (the idle timeout's start)."""
        self.broken: str | None = None
        """Why the speaker ended the session (the outcome label)."""

    # ------------------------------------------------------------------ the reader

    async def run(self) -> str:
        """Serve the session until it ends; how it ended (a `WsMetrics.ended` label)."""
        self.reader = asyncio.current_task()
        self.start_speaker()
        try:
            return await self.read()
        except asyncio.CancelledError:
            if self.broken is None:
                raise
            return self.broken
        except (WebSocketDisconnect, SessionEnded):
            return "closed"
        finally:
            await self.stop_speaker()

    async def read(self) -> str:
        idle_s = self.server.ws_idle_timeout_s
        while True:
            wait = idle_s if self.speaking() else self.last_active + idle_s - time.monotonic()
            try:
                message = await asyncio.wait_for(self.ws.receive(), max(wait, 0.0))
            except TimeoutError:
                if self.speaking() or time.monotonic() - self.last_active < idle_s:
                    continue
                await self.refuse(
                    ApiError(408, f"no message for {idle_s:g} s: the session is closed", None)
                )
                await self.close(CLOSE_NORMAL, "idle timeout")
                return "idle"
            if message["type"] == "websocket.disconnect":
                return "closed"
            self.last_active = time.monotonic()
            await self.handle(message)

    def speaking(self) -> bool:
        """Whether the server has something to do: a sentence or an input.done queued or
        being spoken."""
        return self.current is not None or not self.queue.empty()

    async def handle(self, message: dict[str, Any]) -> None:
        text = message.get("text")
        if text is None:
            await self.refuse(
                ApiError(400, "binary messages are not accepted; send JSON text messages")
            )
            return
        try:
            payload = parse_json(text.encode("utf-8", "surrogatepass"))
            if not isinstance(payload, dict):
                raise ApiError(400, f"a message is a JSON object, not {type(payload).__name__}")
            kind = payload.get("type")
            if kind not in MESSAGE_TYPES:
                known = ", ".join(MESSAGE_TYPES)
                what = "no type" if kind is None else f"unknown type {clip(str(kind))!r}"
                raise ApiError(400, f"message of {what}; known: {known}", "type")
            if kind == "session.config":
                self.configure(payload)
            elif self.template is None:
                raise ApiError(400, f"{kind} before session.config: configure the session first")
            elif kind == "input.text":
                self.take_text(payload)
            elif kind == "input.done":
                self.end_utterance()
            else:
                await self.cancel()
        except ApiError as err:
            await self.refuse(err)

    def configure(self, payload: dict[str, Any]) -> None:
        if self.speaking() or self.received:
            raise ApiError(400, "session.config during an utterance: send it between utterances")
        fields = {k: v for k, v in payload.items() if k != "type"}
        for key, why in NOT_IN_CONFIG.items():
            if key in fields:
                raise ApiError(400, f"{key} is not a session.config field: {why}", key)
        stream_audio = fields.pop("stream_audio", False)
        if not isinstance(stream_audio, bool):
            raise ApiError(400, "stream_audio must be true or false", "stream_audio")
        if fields.pop("incremental", False) is not False:
            raise ApiError(
                400,
                "incremental mode is not implemented yet: leave it out, and text is spoken a "
                "sentence at a time",
                "incremental",
            )
        fields.setdefault("model", self.info.model)
        try:
            body = SpeechBody.model_validate({**fields, "input": PROBE_INPUT})
        except ValidationError as exc:
            first = exc.errors()[0]
            param = ".".join(str(p) for p in first["loc"]) or None
            message = f"{clip(param)}: {first['msg']}" if param else first["msg"]
            raise ApiError(400, message, param) from None
        from omniflow.serve.routes import default_task  # the route's own rule

        body = default_task(body, self.info)
        saved = self.service.voices.saved(body)
        validate(body, self.info, self.server, registered=saved is not None)
        if body.task_type == "Base" and saved is None:
            raise ApiError(400, NOT_IN_CONFIG["ref_audio"], "voice")
        if stream_audio and body.response_format not in STREAMABLE:
            raise ApiError(
                400,
                f"stream_audio sends {', '.join(STREAMABLE)}, not {body.response_format!r} "
                "(flac and opus are sent a whole sentence at a time: stream_audio false)",
                "response_format",
            )
        self.template, self.clone, self.stream_audio = body, saved, stream_audio

    def take_text(self, payload: dict[str, Any]) -> None:
        text = payload.get("text")
        if not isinstance(text, str):
            raise ApiError(400, "input.text needs a text string", "text")
        check_printable(text, "text")
        limit = self.server.max_input_chars
        if self.received + len(text) > limit:
            raise ApiError(
                400,
                f"the utterance would be {self.received + len(text)} characters; the limit is "
                f"{limit} (server.max_input_chars): this piece was dropped; end the utterance "
                "with input.done or input.cancel",
                "text",
            )
        unspoken = self.queued_chars + len(self.buffer) + len(text)
        if unspoken > limit:
            raise ApiError(
                400,
                f"{unspoken} characters would wait to be spoken (this utterance's and those "
                f"ended before it); the limit is {limit} (server.max_input_chars): this piece "
                "was dropped; send it again once more has been spoken",
                "text",
            )
        self.received += len(text)
        for sentence in self.buffer.feed(text):
            self.enqueue(sentence)

    def enqueue(self, sentence: str) -> None:
        self.queue.put_nowait(sentence)
        self.queued_chars += len(sentence)

    def end_utterance(self) -> None:
        rest = self.buffer.flush()
        if rest is not None:
            self.enqueue(rest)
        self.queue.put_nowait(DONE)
        self.received = 0

    async def cancel(self) -> None:
        """Barge-in: abort what is being spoken, drop what is queued, and answer with the
        interrupted sentence's `audio.done` and one `session.done` (`cancelled`)."""
        await self.stop_speaker()
        if self.current is not None:
            index, sent = self.current
            await self.send_json(audio_done(index, sent, "cancelled"))
        spoken = self.index + (self.current is not None)
        self.current = None
        await self.send_json({"type": "session.done", "total_sentences": spoken, "cancelled": True})
        self.metrics.utterances.labels("cancelled").inc()
        self.buffer.clear()
        self.received = 0
        self.queue = asyncio.Queue()
        self.queued_chars = 0
        self.index = 0
        self.start_speaker()

    async def refuse(self, err: ApiError) -> None:
        self.metrics.refused_messages.inc()
        await self.send_json(error_event(err))

    async def close(self, code: int, reason: str) -> None:
        await close(self.ws, code, reason)

    # ------------------------------------------------------------------ the speaker

    def start_speaker(self) -> None:
        self.speaker = asyncio.create_task(self.speak_all())
        self.speaker.add_done_callback(self.speaker_ended)

    async def stop_speaker(self) -> None:
        task, self.speaker = self.speaker, None
        if task is not None and not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task

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
            if isinstance(item, _Done):
                await self.send_json({"type": "session.done", "total_sentences": self.index})
                self.metrics.utterances.labels("done").inc()
                self.index = 0
                continue
            try:
                check_speakable(item, "text")
            except ApiError:
                continue  # punctuation left alone ("...", a closing quote): nothing to say
            await self.speak(self.index, item)

    async def speak(self, index: int, text: str) -> None:
        """One sentence: audio.start, its audio, audio.done (with the error, if it failed)."""
        assert self.template is not None
        body = self.template.model_copy(update={"input": text})
        fmt = body.response_format
        self.current = [index, 0]
        await self.send_event(
            {
                "type": "audio.start",
                "sentence_index": index,
                "sentence_text": text,
                "format": fmt,
                "sample_rate": self.info.sample_rate,
            }
        )
        try:
            validate(body, self.info, self.server, registered=self.clone is not None)
            if self.service.responses.closing:
                raise unavailable(SHUTDOWN_MESSAGE)
            rid, events, _ = self.service.submit(body, self.clone)
        except ApiError as err:
            self.metrics.sentences.labels("refused").inc()
            error: str | None = err.message
        else:
            error = await self.stream(rid, events, fmt)
        sent, self.current = self.current[1], None
        self.index = index + 1
        await self.send_event(audio_done(index, sent, error))

    async def stream(self, rid: str, events: asyncio.Queue[AudioEvent], fmt: str) -> str | None:
        """Send one request's audio; its error (None: all of it was sent)."""
        sessions, metrics = self.sessions, self.service.metrics
        sessions.speaking += 1
        metrics.request_started()
        ending: list[AudioEvent] = []
        sr = self.info.sample_rate
        try:
            audio = self.audio(rid, events, ending)
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
        if last.error:
            return f"generation failed: {last.error}"
        if last.finish_reason == "abort":
            return "aborted"
        return None

    async def audio(
        self, rid: str, events: asyncio.Queue[AudioEvent], ending: list[AudioEvent]
    ) -> AsyncIterator[AudioEvent]:
        """The request's events to its end (kept in `ending`), its audio credited to the
        pipeline once sent on (backpressure)."""
        while True:
            ev = merge_waiting(await events.get(), events)
            if ev.finished:
                ending.append(ev)
            if ev.pcm is not None:
                self.service.metrics.audio_seconds.inc(ev.pcm.size / self.info.sample_rate)
            yield ev
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
        if self.current is not None:
            self.current[1] += len(data)

    async def _send(self, sending: Any) -> None:
        """One message, whole, within `server.stalled_client_timeout_s`: a client that takes
        nothing for that long ends the session."""
        async with self.send_lock:
            try:
                await asyncio.wait_for(sending, self.server.stalled_client_timeout_s)
            except TimeoutError:
                raise ClientStalled("the client stopped reading") from None
            except (WebSocketDisconnect, RuntimeError, OSError) as exc:
                raise SessionEnded(f"the client left: {exc}") from None


def audio_done(index: int, total_bytes: int, error: str | None) -> dict[str, Any]:
    return {
        "type": "audio.done",
        "sentence_index": index,
        "total_bytes": total_bytes,
        "error": error,
    }
