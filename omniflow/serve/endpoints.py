"""The API's endpoint functions, at module level, each finding its service on the app.

Why not closures in `build_app`: FastAPI keeps process-wide caches keyed by endpoint
function (whether it is a coroutine, a generator). A closure over the service would be kept
there, and through it the pipeline with its weights, KV pools and CUDA graphs, for the life
of the process: a benchmark sweep that builds a pipeline whenever its configuration changes
ran the GPU out of memory on its fourth build. These functions hold nothing;
`tests/serve/test_app_release.py` checks that a dropped app lets its pipeline go.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fastapi import Request
from fastapi.responses import JSONResponse, Response

if TYPE_CHECKING:
    from omniflow.serve.routes import SpeechService


def service_of(request: Request) -> SpeechService:
    """The app's service (`build_app` puts it on `app.state`)."""
    return request.app.state.service


async def health(request: Request) -> JSONResponse:
    return service_of(request).health(request.app.state.speech_sessions.load)


async def models(request: Request) -> dict:
    return {"object": "list", "data": [service_of(request).model_card]}


async def model(model_id: str, request: Request) -> dict:
    return service_of(request).model(model_id)


async def voices(request: Request) -> dict:
    return service_of(request).voices.listing()


async def create_voice(request: Request) -> JSONResponse:
    return await service_of(request).create_voice(request)


async def voice(voice_id: str, request: Request) -> dict:
    return service_of(request).voices.card(voice_id)


async def delete_voice(voice_id: str, request: Request) -> dict:
    return service_of(request).voices.delete(voice_id)


async def metrics(request: Request) -> Response:
    return service_of(request).metrics_response()


async def speech(request: Request) -> Response:
    return await service_of(request).speech(request)
