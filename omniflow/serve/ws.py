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
from dataclasses import replace
from typing import Any

from fastapi import FastAPI, WebSocket
from prometheus_client import Counter, Gauge, Histogram
from starlette.websockets import WebSocketDisconnect

from omniflow.core.pipeline import PipelineStats
from omniflow.serve.errors import ApiError, clip, refusal_reason
from omniflow.serve.validation import admit
from omniflow.serve.ws_events import (
    CLOSE_ERROR,
    CLOSE_POLICY,
    CLOSE_TRY_LATER,
    CLOSE_WAIT_S,
    PATH,
    close,
    error_event,
)
from omniflow.serve.ws_session import Session

log = logging.getLogger("omniflow.serve")

TAIL_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 1.5, 2.5, 5.0, 10.0)
TAIL_FRAME_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256)


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
        # Incremental utterances: the speech after the end of the text was taken (issue 37's
        # "last audio after the final text token"), in time and in frames.
        self.text_tail = Histogram(
            "omniflow_ws_text_tail_seconds",
            "Incremental utterances: the output of the step that took the end of the text"
            " (a window's, at its end) reaching the server's router, to the utterance's last"
            " audio sent",
            buckets=TAIL_BUCKETS,
            registry=registry,
        )
        self.text_tail_frames = Histogram(
            "omniflow_ws_text_tail_frames",
            "Incremental utterances: frames made after the step that took the end of the text",
            buckets=TAIL_FRAME_BUCKETS,
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
        sessions.service.metrics.refusals.labels(refusal_reason(err)).inc()
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
