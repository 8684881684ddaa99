"""One WebSocket speech session (`serve/ws.py` has the endpoint): the reader (this
coroutine: configuration, text, input.done, input.cancel, session.close) and the speaker task
that speaks the queued sentences in order. The events follow vLLM-Omni's protocol
(docs/websocket.md)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING, Any

from starlette.websockets import WebSocket, WebSocketDisconnect

from omniflow.serve.errors import ApiError, clip, quoted
from omniflow.serve.protocol import SpeechBody
from omniflow.serve.reference_gate import REFERENCE_BODY_BYTES, Place
from omniflow.serve.request_body import parse_json
from omniflow.serve.sentences import SentenceBuffer
from omniflow.serve.text import check_printable
from omniflow.serve.voices import Clone
from omniflow.serve.ws_config import session_config
from omniflow.serve.ws_events import (
    CLOSE_NORMAL,
    DONE,
    MESSAGE_FIELDS,
    MESSAGE_TYPES,
    SessionEnded,
    _Done,
    audio_done,
    close,
    error_event,
    session_done,
)
from omniflow.serve.ws_live import LiveUtterance
from omniflow.serve.ws_speaker import Speaker

if TYPE_CHECKING:
    from omniflow.serve.ws import SpeechSessions

log = logging.getLogger("omniflow.serve")


class Session(Speaker):
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
        """The session's voice clone: a registered voice's, or its own reference's."""
        self.registered = False
        """`voice` names a registered voice (the sentences' rules read it)."""
        self.stream_audio = False
        self.incremental = False
        """Text goes into one running request per utterance (`ws_live.py`)."""
        self.live: LiveUtterance | None = None
        """The utterance whose text is arriving (incremental mode)."""
        self.speaking_live: LiveUtterance | None = None
        """The live utterance being spoken (its text may still be arriving)."""
        self.buffer = SentenceBuffer()
        self.received = 0
        """Characters of the current utterance received so far."""
        self.queue: asyncio.Queue[str | LiveUtterance | _Done] = asyncio.Queue()
        self.queued_chars = 0
        """Characters of the sentences queued and not yet taken by the speaker."""
        self.index = 0
        self.utterance = 0
        """The utterance being received and spoken, counted from 0 (vLLM-Omni's index)."""
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
                    ApiError(
                        408,
                        f"Idle timeout: no message received for {idle_s:g} s; the session "
                        "is closed",
                        None,
                    )
                )
                await self.close(CLOSE_NORMAL, "idle timeout")
                return "idle"
            if message["type"] == "websocket.disconnect":
                return "closed"
            self.last_active = time.monotonic()
            await self.handle(message)

    def speaking(self) -> bool:
        """Whether the server has something to do: a sentence or an input.done queued or
        being spoken; a live utterance whose text has not ended is not: the idle timeout
        runs from the last message or the last audio sent, whichever came later."""
        waiting = self.speaking_live is not None and not self.speaking_live.done
        return (self.current is not None or not self.queue.empty()) and not waiting

    async def handle(self, message: dict[str, Any]) -> None:
        text = message.get("text")
        if text is None:
            await self.refuse(
                ApiError(400, "binary messages are not accepted; send JSON text messages")
            )
            return
        try:
            with Place(self.service.references) as place:
                await self.dispatch(text.encode("utf-8", "surrogatepass"), place)
        except ApiError as err:
            await self.refuse(err)

    async def dispatch(self, raw: bytes, place: Place) -> None:
        """One message. One large enough to carry a reference takes a place of the reference
        gate and is parsed on its threads, as an HTTP body is (`serve/reference_gate.py`):
        megabytes of JSON on the event loop would stall every other client."""
        if len(raw) > REFERENCE_BODY_BYTES:
            payload = await self.service.references.run(place, parse_json, raw)
        else:
            payload = parse_json(raw)
        if not isinstance(payload, dict):
            raise ApiError(400, f"a message is a JSON object, not {type(payload).__name__}")
        kind = payload.get("type")
        if kind not in MESSAGE_TYPES:
            known = ", ".join(MESSAGE_TYPES)
            what = "no type" if kind is None else f"unknown type {quoted(str(kind))}"
            raise ApiError(400, f"message of {what}; known: {known}", "type")
        extra = sorted(set(payload) - set(MESSAGE_FIELDS.get(kind, payload)))
        if extra:
            names = ", ".join(quoted(str(k)) for k in extra[:5])
            fields = ", ".join(MESSAGE_FIELDS[kind])
            raise ApiError(
                400, f"{kind} has no field {names} (its fields: {fields})", clip(extra[0])
            )
        if kind == "session.close":
            await self.close(CLOSE_NORMAL, "closed by the client")
            raise SessionEnded("session.close")
        if kind == "session.config":
            await self.configure(payload, place)
        elif self.template is None:
            raise ApiError(400, f"{kind} before session.config: configure the session first")
        elif kind == "input.text":
            self.take_text(payload)
        elif kind == "input.done":
            self.end_utterance()
        else:
            await self.cancel()

    async def configure(self, payload: dict[str, Any], place: Place) -> None:
        if self.speaking() or self.received:
            raise ApiError(
                400,
                "session.config while input is buffered (an utterance is under way): send it "
                "between utterances",
            )
        config = session_config(payload, self.info, self.server, self.service.voices)
        body, saved = config.body, config.saved
        stream_audio, incremental = config.stream_audio, config.incremental
        # a registered voice, or a reference of its own, encoded once (as the HTTP route does)
        clone = saved or await self.service.clone_from_reference(body, place)
        self.template, self.clone, self.stream_audio = body, clone, stream_audio
        self.registered = saved is not None
        self.incremental = incremental

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
        if self.incremental:
            self.live = self.live or LiveUtterance()
            if self.live.take(text, self.service.pipeline):
                self.live.queued = True
                self.queue.put_nowait(self.live)
            return
        for sentence in self.buffer.feed(text):
            self.enqueue(sentence)

    def enqueue(self, sentence: str) -> None:
        self.queue.put_nowait(sentence)
        self.queued_chars += len(sentence)

    def end_utterance(self) -> None:
        if self.incremental:
            live, self.live = self.live or LiveUtterance(), None
            if live.end(self.service.pipeline):
                live.queued = True
                self.queue.put_nowait(live)
        rest = self.buffer.flush()
        if rest is not None:
            self.enqueue(rest)
        self.queue.put_nowait(DONE)
        self.received = 0

    async def cancel(self) -> None:
        """Barge-in: abort what is being spoken, drop what is queued, and answer with the
        interrupted sentence's `audio.done` and one `session.done` (`cancelled`). With no
        utterance under way (the last one ended, no text since) it is ignored: a barge-in
        that crossed the utterance's `session.done` on the wire, nothing to end."""
        if self.current is None and self.queue.empty() and not self.received and not self.index:
            return
        await self.stop_speaker()
        if self.current is not None:
            index, sent = self.current
            await self.send_json(audio_done(self.utterance, index, sent, "cancelled"))
        spoken = self.index + (self.current is not None)
        self.current = None
        await self.send_json(session_done(self.utterance, spoken, cancelled=True))
        self.utterance += 1
        self.metrics.utterances.labels("cancelled").inc()
        self.buffer.clear()
        self.live = self.speaking_live = None
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
