"""The OpenAI-compatible speech API (README, Serve): the FastAPI app and its routes.

Everything the routes know about the pipeline comes from `info()` (read once: the served
model, voices, limits) and `stats()` (live: health, requests in flight). A stage that has
stopped makes `/health` answer 503 and new speech requests a 503 JSON error, instead of
requests that hang or fail one by one.
"""

from __future__ import annotations

import asyncio
import json
import time

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from pydantic import ValidationError

from omniflow.config.schema import ServerConfig
from omniflow.core.pipeline import PipelineUnavailable
from omniflow.core.speech import SpeechRequest
from omniflow.serve.errors import ApiError, error_response, unavailable
from omniflow.serve.metrics import Metrics
from omniflow.serve.pipeline import Pipeline
from omniflow.serve.protocol import SpeechBody
from omniflow.serve.streaming import SpeechResponse, event_channel
from omniflow.serve.validation import admit, down_message, down_stages, validate
from omniflow.stages.orchestrator import AudioEvent


class SpeechService:
    """Validation, admission and submission on top of a pipeline."""

    def __init__(self, pipeline: Pipeline, server: ServerConfig) -> None:
        self.pipeline = pipeline
        self.server = server
        self.info = pipeline.info()
        self.metrics = Metrics(pipeline)

    async def speech(self, request: Request) -> Response:
        try:
            body = parse_body(await request.body())
            validate(body, self.info, self.server)
            admit(self.pipeline.stats(), self.server)
            rid, events = self.submit(body)
        except ApiError:
            self.metrics.requests.labels("rejected").inc()
            raise
        t0 = time.perf_counter()
        response = SpeechResponse(
            self.pipeline, self.metrics, self.info.sample_rate, rid, events, request, t0
        )
        return await response.respond(body)

    def submit(self, body: SpeechBody) -> tuple[str, asyncio.Queue[AudioEvent]]:
        """Hand the request to the pipeline; its events arrive on the returned queue."""
        events, sink = event_channel()
        speech = SpeechRequest.create(
            body.input,
            voice=body.voice,
            language=body.language,
            seed=body.seed,
            max_new_tokens=body.max_new_tokens,
            ignore_eos=body.ignore_eos,
            instructions=body.instructions,
            initial_chunk_frames=body.initial_chunk_frames,
        )
        try:
            self.pipeline.submit(speech, sink)
        except PipelineUnavailable as exc:
            raise unavailable(str(exc)) from None
        except ValueError as exc:
            raise ApiError(400, str(exc), "input") from None
        return speech.request_id, events

    def health(self) -> JSONResponse:
        stats = self.pipeline.stats()
        body: dict = {"model": self.info.model, "in_flight": stats.in_flight}
        if stats.healthy:
            return JSONResponse({"status": "ok", **body})
        down = {"status": "unavailable", "down": down_stages(stats), "message": down_message(stats)}
        return JSONResponse({**down, **body}, status_code=503)


def parse_body(raw: bytes) -> SpeechBody:
    """The request body, parsed here (not by FastAPI) so that every parse error, malformed
    JSON included, gets the API's JSON error naming the field."""
    try:
        payload = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, f"malformed JSON body: {exc}") from None
    try:
        return SpeechBody.model_validate(payload)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(p) for p in first["loc"]) or None
        raise ApiError(400, f"{param}: {first['msg']}" if param else first["msg"], param) from None


def build_app(pipeline: Pipeline, server: ServerConfig) -> FastAPI:
    service = SpeechService(pipeline, server)
    app = FastAPI(title="omniflow", version="0.1.0")
    app.state.service = service
    info = service.info

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
    async def health() -> JSONResponse:
        return service.health()

    @app.get("/v1/models")
    async def models() -> dict:
        return {
            "object": "list",
            "data": [{"id": info.model, "object": "model", "owned_by": "omniflow", "created": 0}],
        }

    @app.get("/v1/audio/voices")
    async def voices() -> dict:
        return {"voices": list(info.voices), "languages": list(info.languages)}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(generate_latest(service.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.post("/v1/audio/speech")
    async def speech(request: Request) -> Response:
        return await service.speech(request)

    return app
