"""The OpenAI-compatible speech API (README, Serve): the FastAPI app and its routes.

Everything the routes know about the pipeline comes from `info()` (read once: the served
model, voices, limits) and `stats()` (live: health, requests in flight). A stage that has
stopped makes `/health` answer 503 and new speech requests a 503 JSON error, instead of
requests that hang or fail one by one. A Base model's voice registry (`/v1/audio/voices`)
is voices.py's.

Every answer that is not audio is the API's JSON error, whatever produced it: a body the JSON
parser refuses (bad UTF-8, nesting past the parser's recursion limit, an integer past Python's
int-string limit), the schema, validation, admission, or the router (404, 405; handlers.py).
GET routes also answer HEAD, which load balancers and uptime checks use.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from omniflow.config.server import ServerConfig
from omniflow.core.events import AudioEvent
from omniflow.core.heap import malloc_trim
from omniflow.core.pipeline import (
    Overloaded,
    Pipeline,
    PipelineInfo,
    PipelineStats,
    PipelineUnavailable,
    RequestLimits,
)
from omniflow.core.voice import EncodedVoice, ReferenceEncoder
from omniflow.provenance import build
from omniflow.serve import endpoints
from omniflow.serve.body_limit import BodyLimit
from omniflow.serve.docs_pages import install_docs
from omniflow.serve.encoders import mp3_stream
from omniflow.serve.errors import ApiError, clip, overloaded, quoted, refusal_reason, unavailable
from omniflow.serve.event_queue import LoopHandoff, event_channel
from omniflow.serve.handlers import install_error_handlers
from omniflow.serve.metrics import Metrics
from omniflow.serve.openapi import json_body, speech_openapi
from omniflow.serve.protocol import MEDIA_TYPES, SpeechBody, VoiceBody
from omniflow.serve.reference_audio import ReferenceAudioError, decode_reference, payload_bytes
from omniflow.serve.reference_gate import Place, ReferenceGate
from omniflow.serve.request_body import FieldErrors, read_body
from omniflow.serve.streaming import Arrival, LiveResponses, SpeechResponse
from omniflow.serve.validation import (
    admit,
    down_message,
    down_stages,
    passing_fields,
    validate,
    with_rule_errors,
)
from omniflow.serve.voices import Clone, VoiceService, speech_request
from omniflow.serve.ws import install_websocket


class SpeechService:
    """Validation, admission and submission on top of a pipeline."""

    def __init__(self, pipeline: Pipeline, server: ServerConfig) -> None:
        self.pipeline = pipeline
        self.server = server
        self.limits = RequestLimits(server.max_buffered_audio_s, server.max_first_audio_wait_s)
        """What every speech request is submitted with (flow control, admission by deadline)."""
        self.info = pipeline.info()
        self.build = build()
        """The running build (`provenance.py`): which code answers, for A/B runs and ops."""
        self.reference = pipeline.reference_encoder()
        """Voice clone (a Base model's encoders); None: task_type Base is refused."""
        self.references = ReferenceGate(server.max_concurrent_references, malloc_trim())
        """Voice-clone references decoded and encoded at once (and the threads they use)."""
        encode = self.encode_reference if self.reference is not None else None
        self.voices = VoiceService(self.info, server, encode)
        self.metrics = Metrics(pipeline)
        self.responses = LiveResponses()
        """What shutdown ends (`close`)."""
        self.handoff: LoopHandoff | None = None
        """Engine threads -> the serving loop (made on a request, for the loop serving it)."""
        self.model_card = {
            "id": self.info.model,
            "object": "model",
            "owned_by": "omniflow",
            "created": int(time.time()),
        }

    def close(self) -> None:
        """Shutdown begins: new speech requests get a 503, running ones end with an error."""
        self.responses.close()

    async def speech(self, request: Request) -> Response:
        arrived = time.perf_counter()
        try:
            self.responses.admit()
            with self.references.place(request) as place:
                body, saved = await self.checked(place, await read_body(request))
                sessions = request.app.state.speech_sessions  # open WebSocket sessions count
                admit(sessions.load(self.pipeline.stats()), self.server)
                clone = saved or await self.clone_from_reference(body, place)
            rid, events, submitted = self.submit(body, clone)
        except ApiError as err:
            self.metrics.requests.labels("rejected").inc()
            self.metrics.refusals.labels(refusal_reason(err)).inc()
            raise
        response = SpeechResponse(
            self.pipeline,
            self.metrics,
            self.info.sample_rate,
            rid,
            events,
            request,
            Arrival(arrived, submitted),
            self.server.stalled_client_timeout_s,
        )
        self.responses.add(response)
        if body.streaming and body.stream_format != "sse" and body.response_format == "mp3":
            pcm = await response.respond(body.model_copy(update={"response_format": "pcm"}))
            return as_mp3_stream(pcm, self.info.sample_rate)
        return await response.respond(body)

    async def checked(self, place: Place, raw: bytes) -> tuple[SpeechBody, Clone | None]:
        """The body, parsed and checked against the served model, and the registered voice
        it names: every error of the request in one 400, the schema's and the model's."""
        try:
            body = default_task(await self.references.parse(place, raw, SpeechBody), self.info)
        except FieldErrors as refused:
            rest = default_task(passing_fields(refused, self.info), self.info)
            registered = self.voices.saved(rest) is not None
            raise with_rule_errors(refused, rest, self.info, self.server, registered) from None
        saved = self.voices.saved(body)
        validate(body, self.info, self.server, registered=saved is not None)
        return body, saved

    async def clone_from_reference(self, body: SpeechBody, place: Place) -> Clone | None:
        """A voice clone's encoded `ref_audio`; None for a request that clones nothing."""
        if body.task_type != "Base":
            return None
        assert body.ref_audio  # validate() checked it (a registered voice is `saved`)
        voice = await self.encode_reference(body.ref_audio, place)
        return Clone.of(voice, body.ref_text, bool(body.x_vector_only_mode))

    async def encode_reference(self, ref_audio: str, place: Place) -> EncodedVoice:
        """Decode, resample and encode `ref_audio` on one of the reference gate's threads,
        within the request's `place` (a 429 when every place is taken): the codec and
        speaker encoders take tens of milliseconds to seconds of CPU, which on the event
        loop would stall every other response. The voice registry encodes through here."""
        assert self.reference is not None  # validate() checked the model clones voices
        try:
            return await self.references.run(place, self._encode, self.reference, ref_audio)
        except ReferenceAudioError as exc:
            raise ApiError(400, f"ref_audio {exc}", "ref_audio") from None

    def _encode(self, encoder: ReferenceEncoder, ref_audio: str) -> EncodedVoice:
        limit = self.server.max_ref_audio_bytes
        raw = payload_bytes(ref_audio, limit)
        audio = decode_reference(raw, self.info.sample_rate, limit, self.server.max_ref_audio_s)
        return encoder.encode(audio)

    def submit(
        self, body: SpeechBody, clone: Clone | None = None, incremental: bool = False
    ) -> tuple[str, asyncio.Queue[AudioEvent], float]:
        """Hand the request to the pipeline; its events arrive on the returned queue. Also
        returns when it was handed over (`time.perf_counter`, taken just before, since a
        pipeline may make events before its `submit` returns): the first audio's intake
        part ends there. `clone`: a voice clone's reference (then `voice`, if any, named the
        registered voice it came from, and is no preset speaker). `incremental`: its text
        is what has arrived so far; the rest follows through `Pipeline.extend`."""
        loop = asyncio.get_running_loop()
        if self.handoff is None or self.handoff.loop is not loop:
            self.handoff = LoopHandoff(loop)
        events, sink = event_channel(self.handoff)
        speech = speech_request(body, clone, incremental=incremental)
        submitted = time.perf_counter()
        try:
            self.pipeline.submit(speech, sink, self.limits)
        except Overloaded as exc:
            raise overloaded(str(exc), exc.retry_after_s) from None
        except PipelineUnavailable as exc:
            raise unavailable(str(exc)) from None
        except ValueError as exc:
            raise ApiError(400, clip(str(exc), 300), "input") from None
        return speech.request_id, events, submitted

    def model(self, model_id: str) -> dict:
        """The served model's card; any other id is a 404."""
        if model_id != self.info.model:
            raise ApiError(
                404,
                f"model {quoted(model_id)} is not served; this server serves {self.info.model!r}",
                "model",
                "not_found_error",
            )
        return self.model_card

    async def create_voice(self, request: Request) -> JSONResponse:
        with self.references.place(request) as place:
            body = await self.references.parse(place, await read_body(request), VoiceBody)
            voice = await self.voices.create(body, place)
        return JSONResponse(voice.card(), status_code=201)

    def metrics_response(self) -> Response:
        return Response(generate_latest(self.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    def health(self, load: Callable[[PipelineStats], PipelineStats]) -> JSONResponse:
        """`in_flight` is what the cap (`max_concurrent_requests`) counts: `load` adds the
        open WebSocket sessions not speaking, each holding a place."""
        stats = self.pipeline.stats()
        body: dict = {
            "model": self.info.model,
            "in_flight": load(stats).in_flight,
            "build": self.build,
        }
        if self.responses.closing:
            return JSONResponse({"status": "shutting_down", **body}, status_code=503)
        if stats.healthy:
            return JSONResponse({"status": "ok", **body})
        down = {"status": "unavailable", "down": down_stages(stats), "message": down_message(stats)}
        return JSONResponse({**down, **body}, status_code=503)


def default_task(body: SpeechBody, info: PipelineInfo) -> SpeechBody:
    """An unset `task_type` means the served model's task: CustomVoice where it is served,
    else the model's own (Base), so a plain OpenAI request naming a registered voice, or
    sending ref_audio, clones on a Base model."""
    if "task_type" in body.model_fields_set or "CustomVoice" in info.task_types:
        return body
    return body.model_copy(update={"task_type": info.task_types[0]})


def build_app(pipeline: Pipeline, server: ServerConfig) -> FastAPI:
    """The app over `pipeline`. Its endpoints are module-level functions that find the
    service on the app (`endpoints.py`): FastAPI caches facts about endpoint functions in
    process-wide caches keyed by the function, so an endpoint closing over the service
    would keep this pipeline (weights, KV pools, CUDA graphs) alive after the app is gone."""
    # A path with a trailing slash is a 404 naming the route (handlers.py), not a bodiless
    # 307 redirect that most clients do not follow.
    app = FastAPI(
        title="omniflow", version="0.1.0", docs_url=None, redoc_url=None, redirect_slashes=False
    )
    app.state.service = SpeechService(pipeline, server)
    app.add_middleware(BodyLimit, limit=server.body_limit, timeout_s=server.body_timeout_s)
    install_error_handlers(app)
    install_docs(app)
    add_get(app, "/health", endpoints.health)
    add_get(app, "/v1/models", endpoints.models)
    add_get(app, "/v1/models/{model_id}", endpoints.model)
    add_get(app, "/v1/audio/voices", endpoints.voices)
    add_post(
        app,
        "/v1/audio/voices",
        endpoints.create_voice,
        "Register a voice (Base models)",
        {"requestBody": json_body(VoiceBody)},
    )
    add_get(app, "/v1/audio/voices/{voice_id}", endpoints.voice)
    app.add_api_route("/v1/audio/voices/{voice_id}", endpoints.delete_voice, methods=["DELETE"])
    add_get(app, "/metrics", endpoints.metrics)
    add_post(app, "/v1/audio/speech", endpoints.speech, "Generate speech", speech_openapi())
    install_websocket(app)  # WS /v1/audio/speech/stream (ws.py)
    return app


def as_mp3_stream(response: Response, sample_rate: int) -> Response:
    """A streamed PCM16 response re-encoded to mp3 as it streams (LAME, encoders.py). An
    answer that is not a stream (the client left before the first audio) passes as is."""
    if not isinstance(response, StreamingResponse):
        return response
    response.body_iterator = mp3_stream(response.body_iterator, sample_rate)
    response.media_type = MEDIA_TYPES["mp3"]
    response.headers["content-type"] = MEDIA_TYPES["mp3"]
    return response


def add_get(app: FastAPI, path: str, endpoint: Callable[..., Any]) -> None:
    """A GET route that also answers HEAD (FastAPI's GET routes do not; uvicorn sends the
    headers of the GET response without its body). HEAD stays out of the OpenAPI schema,
    where a second operation with the same id would only add a duplicate-id warning."""
    app.add_api_route(path, endpoint, methods=["GET"])
    app.add_api_route(path, endpoint, methods=["HEAD"], include_in_schema=False)


def add_post(
    app: FastAPI, path: str, endpoint: Callable[..., Any], summary: str, openapi: dict[str, Any]
) -> None:
    """A POST route whose endpoint parses its own body (`parse_body`): `openapi` states the
    request body (and any responses) for the schema, which FastAPI cannot infer."""
    app.add_api_route(path, endpoint, methods=["POST"], summary=summary, openapi_extra=openapi)
