"""The OpenAI-compatible speech API (DESIGN §11).

The HTTP event loop never runs a model step: the orchestrator's engines run on their own
threads, and their events cross into the loop through `call_soon_threadsafe` onto a
per-request asyncio queue. A client that disconnects aborts its request, which frees its KV
blocks and decoder slot in every stage.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import logging
import time
import uuid
from collections.abc import AsyncIterator

import numpy as np
import soundfile
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError

from omniflow.config.schema import ServerConfig
from omniflow.core.speech import SpeechRequest
from omniflow.serve.audio import pcm16, wav_header
from omniflow.serve.metrics import Metrics
from omniflow.serve.protocol import ENCODED, MEDIA_TYPES, STREAMABLE, SpeechBody
from omniflow.stages.orchestrator import AudioEvent, Orchestrator

log = logging.getLogger(__name__)


class ApiError(Exception):
    """An error answered as OpenAI-style JSON."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        kind: str = "invalid_request_error",
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind


def error_response(err: ApiError) -> JSONResponse:
    body = {
        "error": {"message": err.message, "type": err.kind, "param": err.param, "code": err.status}
    }
    return JSONResponse(body, status_code=err.status)


class SpeechService:
    """Validation, admission and streaming on top of an orchestrator."""

    def __init__(self, orchestrator: Orchestrator, server: ServerConfig) -> None:
        self.orch = orchestrator
        self.server = server
        self.metrics = Metrics(orchestrator)
        vocab = orchestrator.processor.vocab
        self.voices = sorted(vocab.speakers)
        self.languages = ["auto", *sorted(vocab.languages)]
        self.model_name = orchestrator.graph.model.name
        self.sample_rate = orchestrator.sample_rate
        self.max_new_tokens = orchestrator.graph.stages["talker"].scheduler.max_model_len
        self.supports_instructions = orchestrator.graph.model.supports_instructions

    def validate(self, body: SpeechBody) -> None:
        if body.model != self.model_name:
            raise ApiError(
                404,
                f"model {body.model!r} is not served; this server serves {self.model_name!r}",
                "model",
                "not_found_error",
            )
        if not body.input.strip():
            raise ApiError(400, "input is empty", "input")
        if len(body.input) > self.server.max_input_chars:
            raise ApiError(
                400,
                f"input is {len(body.input)} characters; the limit is "
                f"{self.server.max_input_chars}",
                "input",
            )
        if body.voice.lower() not in self.voices:
            raise ApiError(400, f"unknown voice {body.voice!r}; available: {self.voices}", "voice")
        if body.language.lower() not in self.languages:
            raise ApiError(
                400, f"unknown language {body.language!r}; available: {self.languages}", "language"
            )
        if body.speed != 1.0:
            raise ApiError(
                400,
                "speed other than 1.0 is not supported (no time-stretch is "
                "applied, rather than a silent change)",
                "speed",
            )
        if body.instructions and not self.supports_instructions:
            raise ApiError(
                400, f"instructions are not supported by {self.model_name}", "instructions"
            )
        if body.instructions and len(body.instructions) > self.server.max_input_chars:
            raise ApiError(
                400,
                f"instructions are longer than {self.server.max_input_chars} characters",
                "instructions",
            )
        if body.task_type != "CustomVoice":
            raise ApiError(
                400,
                f"task_type {body.task_type!r} is not served by this CustomVoice model",
                "task_type",
            )
        if body.max_new_tokens is not None and body.max_new_tokens > self.max_new_tokens:
            raise ApiError(
                400, f"max_new_tokens must be <= {self.max_new_tokens}", "max_new_tokens"
            )
        if body.response_format == "aac":
            raise ApiError(
                400,
                "response_format 'aac' is not supported; use wav, pcm, flac, mp3 or opus",
                "response_format",
            )
        if (
            body.streaming
            and body.stream_format != "sse"
            and (body.response_format not in STREAMABLE)
        ):
            raise ApiError(
                400,
                f"streaming supports pcm and wav (or stream_format=sse), "
                f"not {body.response_format!r}",
                "response_format",
            )
        if self.orch.num_live >= self.server.max_concurrent_requests:
            raise ApiError(
                429, "too many requests in flight; retry later", None, "rate_limit_error"
            )

    def start(self, body: SpeechBody) -> tuple[str, asyncio.Queue[AudioEvent]]:
        loop = asyncio.get_running_loop()
        events: asyncio.Queue[AudioEvent] = asyncio.Queue()
        rid = f"speech-{uuid.uuid4().hex}"

        def sink(ev: AudioEvent) -> None:
            loop.call_soon_threadsafe(events.put_nowait, ev)

        request = SpeechRequest(
            request_id=rid,
            text=body.input,
            voice=body.voice,
            language=body.language,
            seed=body.seed,
            max_new_tokens=body.max_new_tokens,
            ignore_eos=body.ignore_eos,
            instructions=body.instructions,
            initial_chunk_frames=body.initial_chunk_frames,
        )
        try:
            self.orch.submit(request, sink)
        except ValueError as exc:
            raise ApiError(400, str(exc), "input") from None
        return rid, events


def build_app(orchestrator: Orchestrator, server: ServerConfig) -> FastAPI:
    service = SpeechService(orchestrator, server)
    app = FastAPI(title="omniflow", version="0.1.0")
    app.state.service = service
    m = service.metrics

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, err: ApiError) -> JSONResponse:
        return error_response(err)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, err: RequestValidationError) -> JSONResponse:
        first = err.errors()[0]
        loc = [str(p) for p in first["loc"] if p != "body"]
        param = ".".join(loc) or None
        message = first["msg"] if param is None else f"{param}: {first['msg']}"
        return error_response(ApiError(400, message, param))

    @app.get("/health")
    async def health() -> dict:
        return {"status": "ok", "model": service.model_name, "in_flight": orchestrator.num_live}

    @app.get("/v1/models")
    async def models() -> dict:
        return {
            "object": "list",
            "data": [
                {"id": service.model_name, "object": "model", "owned_by": "omniflow", "created": 0}
            ],
        }

    @app.get("/v1/audio/voices")
    async def voices() -> dict:
        return {"voices": service.voices, "languages": service.languages}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(m.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/audio/speech")
    async def speech(request: Request) -> Response:
        try:
            payload = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            m.requests.labels("rejected").inc()
            raise ApiError(400, f"malformed JSON body: {exc}") from None
        try:
            body = SpeechBody.model_validate(payload)
        except ValidationError as exc:
            m.requests.labels("rejected").inc()
            first = exc.errors()[0]
            param = ".".join(str(p) for p in first["loc"]) or None
            raise ApiError(
                400, f"{param}: {first['msg']}" if param else first["msg"], param
            ) from None
        try:
            service.validate(body)
            rid, events = service.start(body)
        except ApiError:
            m.requests.labels("rejected").inc()
            raise
        return await respond(service, body, rid, events, time.perf_counter(), request)

    return app


DISCONNECT_POLL_S = 0.25


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


async def respond(
    service: SpeechService,
    body: SpeechBody,
    rid: str,
    events: asyncio.Queue[AudioEvent],
    t0: float,
    request: Request,
) -> Response:
    """Wait for the first audio (so errors before any audio are proper 4xx/5xx JSON), then
    answer whole or streamed."""
    m = service.metrics
    m.in_flight.inc()
    finished = False

    def account(ev: AudioEvent) -> None:
        nonlocal finished
        if ev.finished and not finished:
            finished = True
            outcome = {"abort": "abort", "error": "error"}.get(ev.finish_reason or "", "ok")
            m.requests.labels(outcome).inc()
            m.in_flight.dec()
            if outcome == "ok":
                m.e2e.observe(time.perf_counter() - t0)

    aborted = AudioEvent(rid, finished=True, finish_reason="abort")
    watch = DisconnectWatch(request)
    try:
        first = await watch.next(events)
    except ClientGone:
        service.orch.abort(rid)
        account(aborted)
        return Response(status_code=499)
    except asyncio.CancelledError:
        service.orch.abort(rid)
        account(aborted)
        raise
    if first.pcm is None:  # ended before any audio: an error, never an empty 200
        account(AudioEvent(rid, finished=True, finish_reason="error"))
        message = f"generation failed: {first.error}" if first.error else "no audio produced"
        raise ApiError(500, message, None, "server_error")
    account(first)
    m.first_audio.observe(time.perf_counter() - t0)

    async def audio_events(poll: bool) -> AsyncIterator[AudioEvent]:
        ev = first
        try:
            while True:
                if ev.pcm is not None:
                    m.audio_seconds.inc(ev.pcm.size / service.sample_rate)
                yield ev
                if ev.finished:
                    return
                ev = await (watch.next(events) if poll else events.get())
                account(ev)
        finally:
            if not finished:  # client went away (or the server is stopping)
                service.orch.abort(rid)
                account(aborted)

    fmt = body.response_format
    if body.stream_format == "sse":
        return StreamingResponse(
            sse(audio_events(False), fmt, service.sample_rate), media_type="text/event-stream"
        )
    if body.streaming:
        return StreamingResponse(
            raw_stream(audio_events(False), fmt, service.sample_rate), media_type=MEDIA_TYPES[fmt]
        )
    parts: list[np.ndarray] = []
    last = first
    try:
        async for ev in audio_events(True):
            last = ev
            if ev.pcm is not None:
                parts.append(ev.pcm)
    except ClientGone:
        return Response(status_code=499)
    if last.error:
        raise ApiError(500, f"generation failed: {last.error}", None, "server_error")
    audio = np.concatenate(parts)
    return Response(encode_whole(audio, fmt, service.sample_rate), media_type=MEDIA_TYPES[fmt])


def encode_whole(audio: np.ndarray, fmt: str, sample_rate: int) -> bytes:
    data = pcm16(audio)
    if fmt == "pcm":
        return data
    if fmt == "wav":
        return wav_header(sample_rate, len(data)) + data
    container, subtype = ENCODED[fmt]
    buf = io.BytesIO()
    soundfile.write(buf, audio, sample_rate, format=container, subtype=subtype)
    return buf.getvalue()


async def raw_stream(events: AsyncIterator[AudioEvent], fmt: str, sr: int) -> AsyncIterator[bytes]:
    if fmt == "wav":
        yield wav_header(sr)
    async for ev in events:
        if ev.pcm is not None:
            yield pcm16(ev.pcm)
        if ev.error:
            raise RuntimeError(f"generation failed mid-stream: {ev.error}")


async def sse(events: AsyncIterator[AudioEvent], fmt: str, sr: int) -> AsyncIterator[bytes]:
    """`speech.audio.delta` (base64 PCM16, or WAV bytes after a header for wav),
    `speech.audio.done` with usage, or `speech.audio.error`."""
    samples = 0
    frames = 0
    header_sent = fmt != "wav"
    async for ev in events:
        frames = ev.frames or frames
        if ev.pcm is not None:
            chunk = pcm16(ev.pcm)
            if not header_sent:
                chunk = wav_header(sr) + chunk
                header_sent = True
            samples += ev.pcm.size
            data = {"type": "speech.audio.delta", "audio": base64.b64encode(chunk).decode()}
            yield f"data: {json.dumps(data)}\n\n".encode()
        if ev.finished:
            if ev.error:
                data = {"type": "speech.audio.error", "error": {"message": ev.error}}
            else:
                data = {
                    "type": "speech.audio.done",
                    "usage": {
                        "audio_seconds": samples / sr,
                        "output_frames": frames,
                        "finish_reason": ev.finish_reason,
                    },
                }
            yield f"data: {json.dumps(data)}\n\n".encode()
