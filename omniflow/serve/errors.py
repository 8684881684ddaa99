"""Errors answered as OpenAI-style JSON: `{"error": {"message", "type", "param", "code"}}`.

One exception type carries status, message, offending field and error type from wherever the
problem is found (parsing, validation, admission, generation, routing) to the one handler that
writes the body, so every failure a client sees has the same shape. `code` is the HTTP status
as a string: OpenAI's clients read `code` as a string (or null), and one scheme everywhere is
easier to match on than a mix of numbers and names. A request body's field errors also list
each one in `errors` (`[{"field", "message"}]`), so a client reads every problem of its request
from one 400; `message` and `param` stay as OpenAI's clients read them (all messages, the first
field).
"""

from __future__ import annotations

import json
import math
from http import HTTPStatus

from fastapi.responses import JSONResponse

ECHO_LIMIT = 100
"""Most characters of a client's own input an error message repeats back: enough to recognise
the value, not enough to turn a 1 MB field into a 1 MB error (or a log line)."""


class ApiError(Exception):
    """An error answered as OpenAI-style JSON."""

    def __init__(
        self,
        status: int,
        message: str,
        param: str | None = None,
        kind: str = "invalid_request_error",
        headers: dict[str, str] | None = None,
        errors: list[ApiError] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.param, self.kind = status, message, param, kind
        self.headers = headers
        self.errors = errors
        """Each error of a request's fields, when this one stands for them (`all_of`)."""


def all_of(errors: list[ApiError]) -> ApiError:
    """One error for all of a request's: the first's status, kind and `param`, every
    message (`"N errors: ...; ..."` when more than one), each listed in `errors`."""
    first = errors[0]
    message = first.message
    if len(errors) > 1:
        message = f"{len(errors)} errors: " + "; ".join(e.message for e in errors)
    return ApiError(first.status, message, first.param, first.kind, errors=list(errors))


def clip(text: str, limit: int = ECHO_LIMIT) -> str:
    """`text` as an error may quote it: at most `limit` characters (then an ellipsis), and
    lone surrogates escaped, since they cannot be encoded as the UTF-8 of a JSON body."""
    return encodable(text if len(text) <= limit else text[:limit] + "…")


def quoted(text: str, limit: int = ECHO_LIMIT) -> str:
    """`text` quoted as Python's repr does (lone surrogates as one `\\ud800` escape, not
    escaped twice as `clip`'s escape would be by the quoting), at most `limit` characters."""
    return encodable(repr(text if len(text) <= limit else text[:limit] + "…"))


def encodable(text: str) -> str:
    """`text` with lone surrogates (valid in a Python str and in a JSON `\\ud800` escape,
    not in UTF-8) written as backslash escapes, so that writing the body cannot fail."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def unavailable(message: str) -> ApiError:
    """503: a stage of the pipeline has stopped; nothing new is admitted."""
    return ApiError(503, message, None, "service_unavailable")


MAX_RETRY_AFTER_S = 60
"""The longest Retry-After a refusal names: the wait is an estimate from recent turnover,
not a promise to keep a client away for longer."""


def overloaded(message: str, retry_after_s: float) -> ApiError:
    """503 now, with when to come back: the request could not be seated in time."""
    seconds = min(MAX_RETRY_AFTER_S, max(1, math.ceil(retry_after_s)))
    return ApiError(503, message, None, "overloaded_error", {"Retry-After": str(seconds)})


def refusal_reason(err: ApiError) -> str:
    """The `reason` label a refused request is counted under on /metrics."""
    if err.status == 429:
        return "in_flight"
    if err.kind == "overloaded_error":
        return "first_audio_wait"
    return "unavailable" if err.status == 503 else "invalid"


def error_body(err: ApiError) -> dict:
    """The JSON body of `err`: `{"error": {"message", "type", "param", "code"}}`, and
    `errors` (`[{"field", "message"}]`) where it stands for several of a request's fields."""
    error = {
        "message": encodable(err.message),
        "type": err.kind,
        "param": _field(err.param),
        "code": str(err.status),
    }
    if err.errors is not None:
        error["errors"] = [
            {"field": _field(e.param), "message": encodable(e.message)} for e in err.errors
        ]
    return {"error": error}


def _field(param: str | None) -> str | None:
    return None if param is None else clip(param)


def error_response(err: ApiError) -> JSONResponse:
    return JSONResponse(error_body(err), status_code=err.status, headers=err.headers)


def raw_error_response(err: ApiError) -> bytes:
    """`err` as a whole HTTP/1.1 response that closes the connection, for the connection
    layer (serve/http_protocol.py): it answers where no ASGI app runs (a request head h11
    refused, one that never completed), and where h11 may not send a response at all."""
    body = json.dumps(error_body(err)).encode()
    head = (
        f"HTTP/1.1 {err.status} {HTTPStatus(err.status).phrase}\r\n"
        "content-type: application/json\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body
