"""What `/docs` and `/openapi.json` say about the speech route.

The route parses its body itself (`request_body.parse_body`: every parse error in the API's JSON
shape, and other frameworks' fields judged before the schema), so FastAPI cannot infer the
request schema from the route's signature; it is declared here from the same pydantic model
that validates the body, so the docs cannot drift from what is accepted.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from omniflow.serve.protocol import MEDIA_TYPES, SpeechBody


def json_body(model: type[BaseModel]) -> dict[str, Any]:
    """An OpenAPI request body for a route that parses its own (`request_body.parse_body`)."""
    return {
        "required": True,
        "content": {"application/json": {"schema": model.model_json_schema()}},
    }


def speech_openapi() -> dict[str, Any]:
    """The speech route's request body (SpeechBody's JSON schema) and its responses."""
    audio = {media: {} for media in dict.fromkeys(MEDIA_TYPES.values())}
    return {
        "requestBody": json_body(SpeechBody),
        "responses": {
            "200": {
                "description": "Audio in `response_format`, whole or streamed; with "
                "`stream_format: sse`, server-sent events.",
                "content": {**audio, "text/event-stream": {}},
            },
            "400": {
                "description": "Invalid request (the OpenAI error shape, naming `param`; "
                "`errors` lists every field error as {field, message})."
            },
        },
    }
