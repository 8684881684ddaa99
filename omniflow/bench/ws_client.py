"""Open-loop WebSocket load generator for `WS /v1/audio/speech/stream` in incremental mode
(`omniflow bench bench.transport=websocket bench.rps=R`).

    python -m omniflow.bench.ws_client --url http://127.0.0.1:8000 --rps 1 \
        --duration-s 100 --warmup-s 5 --word-interval-ms 10

An LLM writing its answer, heard as it is written: sessions arrive at the open loop's seeded
times (bench/open_run.py, as bench/open_client.py's requests do), each its own connection.
A session sends `session.config` (`incremental: true`, `stream_audio: true`, raw PCM, the
voice, model and seed an HTTP request of the open loop would carry), then its prompt's words
one `input.text` each (a word with its trailing space), one every `--word-interval-ms` from
the first, then `input.done`, and reads the audio until `session.done`.

Per session: first audio (the first word sent -> the first audio bytes), e2e (-> session.done),
the stalls of a zero-buffer player from first audio (core/player.py; a stall while the text is
still coming is the text's pace, not the model's), and `after_done` (input.done -> the last
audio bytes: what the model took once the text was all there). An `error` event with code
429 or 503 (the server at its cap, or shutting down), a close with code 1013 (try again
later) or a handshake refused with either status is `rejected`; another `error` event, a
transport error (a connection refused or dropped), an `audio.done` with `error`, bytes that
do not add up to its `total_bytes`, or no audio is `failed`; a session still running
`--drain-s` after the window is aborted (its socket closed, which cancels it on the server)
and `failed`.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Sequence
from typing import Any

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed, InvalidStatus, WebSocketException

from omniflow.bench.mode import Plan
from omniflow.bench.open_client import body, parser, plan_of, report, target_of
from omniflow.bench.open_run import Outcome, Request, Target, Trace, drive, whole_pcm
from omniflow.bench.outcome import REJECTED

PATH = "/v1/audio/speech/stream"
OPEN_TIMEOUT_S = 30.0
CLOSE_TRY_LATER = 1013
"""The close code of a session refused at the server's cap or while it shuts down."""


def words(text: str) -> list[str]:
    """The text's words, each with the whitespace after it (so they join back to the text,
    leading whitespace aside)."""
    return re.findall(r"\S+\s*", text)


def session_config(index: int, model: str, voice: str, max_frames: int) -> dict[str, Any]:
    """What an incremental session is configured with: an HTTP open-loop request's fields
    (bench/open_client.py's `body`), its text aside, streaming raw PCM."""
    config = body("", index, model, voice, max_frames)
    del config["input"], config["stream"]  # the text comes word by word; audio streams
    return {"type": "session.config", "incremental": True, "stream_audio": True} | config


def ws_url(url: str) -> str:
    """The endpoint's address from the server's http(s) base address."""
    return "ws" + url.removeprefix("http") + PATH


async def send_words(
    ws: ClientConnection,
    config: dict[str, Any],
    pieces: Sequence[str],
    interval_s: float,
    trace: Trace,
) -> None:
    """The config, then each piece at its time (the first at once, then one every interval_s,
    on a fixed cadence, not after each send), then input.done."""
    await ws.send(json.dumps(config))
    start = time.perf_counter()
    for k, piece in enumerate(pieces):
        delay = start + k * interval_s - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        if k == 0:
            trace.sent = time.perf_counter()
        await ws.send(json.dumps({"type": "input.text", "text": piece}))
    trace.done = time.perf_counter()
    if not pieces:
        trace.sent = trace.done
    await ws.send(json.dumps({"type": "input.done"}))


async def read_audio(ws: ClientConnection, trace: Trace) -> tuple[Outcome, str | None]:
    """The session's audio into `trace` until session.done; its outcome and error text."""
    failure: str | None = None
    received = 0  # bytes of the sentence being spoken, checked against its audio.done
    async for message in ws:
        if isinstance(message, bytes):
            if message:
                trace.times.append(time.perf_counter())
                trace.sizes.append(len(message))
                received += len(message)
            continue
        event = json.loads(message)
        kind = event["type"]
        if kind == "error":
            code = str(event.get("code"))
            text = f"error event {code}: {event.get('message')}"
            return ("rejected" if code in map(str, REJECTED) else "failed"), text
        if kind == "audio.done":
            if event["error"]:
                failure = failure or f"audio.done with error: {event.get('message')}"
            elif event["total_bytes"] != received:
                failure = failure or (
                    f"audio.done says {event['total_bytes']} bytes, {received} came"
                )
            received = 0
        elif kind == "session.done":
            if failure:
                return "failed", failure
            return whole_pcm(trace, "a session")
    return "failed", "the server closed the session before session.done"


async def speak(
    url: str, config: dict[str, Any], pieces: Sequence[str], interval_s: float, trace: Trace
) -> tuple[Outcome, str | None]:
    """One session: connect, configure, send the words on their cadence while reading the
    audio; its outcome and error text."""
    try:
        async with connect(url, open_timeout=OPEN_TIMEOUT_S, max_size=None) as ws:
            # the reader has every outcome: a refusal's error event comes before its close,
            # which may reach the sender first
            sender = asyncio.create_task(send_words(ws, config, pieces, interval_s, trace))
            try:
                return await read_audio(ws, trace)
            finally:  # the reader has the outcome; a sender cut off by the close has none
                sender.cancel()
                await asyncio.gather(sender, return_exceptions=True)
    except InvalidStatus as exc:  # the handshake answered with a status, not a WebSocket
        status = exc.response.status_code
        return ("rejected" if status in REJECTED else "failed"), f"handshake HTTP {status}"
    except ConnectionClosed as exc:
        if exc.rcvd is not None and exc.rcvd.code == CLOSE_TRY_LATER:  # refused, no event read
            return "rejected", f"closed {exc.rcvd.code}: {exc.rcvd.reason}"
        return "failed", f"{type(exc).__name__}: {exc}"
    except (OSError, WebSocketException) as exc:  # refused, dropped, timed out, bad frames
        return "failed", f"{type(exc).__name__}: {str(exc) or '(no message)'}"


async def run(target: Target, plan: Plan) -> list[Request]:
    """Every session of the plan, opened at its arrival time; their records, in order."""
    assert plan.transport == "websocket" and plan.word_interval_ms is not None
    interval_s = plan.word_interval_ms / 1e3
    endpoint = ws_url(target.url)

    async def attempt(trace: Trace) -> tuple[Outcome, str | None]:
        config = session_config(trace.index, target.model, target.voice, target.max_frames)
        pieces = words(target.text(trace.index))
        return await speak(endpoint, config, pieces, interval_s, trace)

    return await drive(plan, attempt)


def main() -> None:
    ap = parser(__doc__)
    ap.add_argument("--word-interval-ms", type=float, default=10.0)
    args = ap.parse_args()
    if args.word_interval_ms < 0:
        ap.error("--word-interval-ms must be at least 0")
    plan = plan_of(ap, args, transport="websocket", word_interval_ms=args.word_interval_ms)
    report(args, plan, asyncio.run(run(target_of(ap, args), plan)))


if __name__ == "__main__":
    main()
