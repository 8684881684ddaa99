"""The messages of a WebSocket speech session: the types a client may send, the events the
server answers with (vLLM-Omni's fields, docs/websocket.md), and how a session ends."""

from __future__ import annotations

import contextlib
from typing import Any

from starlette.websockets import WebSocket, WebSocketDisconnect, WebSocketState

from omniflow.serve.errors import ApiError, clip, encodable

PATH = "/v1/audio/speech/stream"
MESSAGE_TYPES = ("session.config", "input.text", "input.done", "input.cancel", "session.close")
MESSAGE_FIELDS = {
    "input.text": ("type", "text"),
    "input.done": ("type",),
    "input.cancel": ("type",),
    "session.close": ("type",),
}
"""The fields of each message type but session.config (whose fields the request's schema
checks): any other is refused, not ignored (a `voice` sent with a piece of text would seem to
act)."""
CONFIG_ONLY = ("stream_audio", "incremental")
"""session.config's own fields; the others are the speech request's."""
NOT_IN_CONFIG = {
    "input": "the text comes in input.text messages",
    "stream": "a session's audio is streamed per sentence with stream_audio",
    "stream_format": "a session's audio is streamed per sentence with stream_audio",
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


async def close(websocket: WebSocket, code: int, reason: str) -> None:
    """Close the socket unless it is closed already."""
    with contextlib.suppress(WebSocketDisconnect, RuntimeError, OSError):
        if websocket.application_state == WebSocketState.CONNECTED:
            await websocket.close(code, reason)


def error_event(err: ApiError) -> dict[str, Any]:
    """`err` as an `error` event; one standing for several fields lists them in `errors`
    (`[{"field", "message"}]`), as the HTTP route's error body does."""
    param = None if err.param is None else encodable(clip(err.param))
    event = {
        "type": "error",
        "message": encodable(err.message),
        "param": param,
        "code": str(err.status),
    }
    if err.errors is not None:
        event["errors"] = [
            {
                "field": None if e.param is None else encodable(clip(e.param)),
                "message": encodable(e.message),
            }
            for e in err.errors
        ]
    return event


def audio_done(utterance: int, index: int, total_bytes: int, error: str | None) -> dict[str, Any]:
    """A sentence's end, as vLLM-Omni sends it (`error` a bool); a failure's reason rides
    in `message` (an extension its clients ignore)."""
    event: dict[str, Any] = {
        "type": "audio.done",
        "utterance_index": utterance,
        "sentence_index": index,
        "total_bytes": total_bytes,
        "error": error is not None,
    }
    if error is not None:
        event["message"] = error
    return event


def session_done(utterance: int, sentences: int, cancelled: bool = False) -> dict[str, Any]:
    """An utterance's end; `cancelled` (an extension) marks one cut by input.cancel."""
    event: dict[str, Any] = {
        "type": "session.done",
        "utterance_index": utterance,
        "total_sentences": sentences,
    }
    if cancelled:
        event["cancelled"] = True
    return event
