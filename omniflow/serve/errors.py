"""Errors answered as OpenAI-style JSON: `{"error": {"message", "type", "param", "code"}}`.

One exception type carries status, message, offending field and error type from wherever the
problem is found (parsing, validation, admission, generation) to the one handler that writes
the body, so every failure a client sees has the same shape.
"""

from __future__ import annotations

from fastapi.responses import JSONResponse


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


def unavailable(message: str) -> ApiError:
    """503: a stage of the pipeline has stopped; nothing new is admitted."""
    return ApiError(503, message, None, "service_unavailable")


def error_response(err: ApiError) -> JSONResponse:
    body = {
        "error": {"message": err.message, "type": err.kind, "param": err.param, "code": err.status}
    }
    return JSONResponse(body, status_code=err.status)
