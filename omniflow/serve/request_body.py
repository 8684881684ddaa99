"""A JSON request body, from the wire to the pydantic model: its media type checked, read
whole (within `serve.body_limit`), a client that leaves during its upload logged in one line
instead of a traceback, and every parse error a 400 in the API's JSON shape naming the field
(every field the schema refuses, in one 400: `FieldErrors`).
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from omniflow.serve.errors import ApiError, all_of, clip, quoted

log = logging.getLogger("omniflow.serve")
Body = TypeVar("Body", bound=BaseModel)


class FieldErrors(ApiError):
    """Every field of a body the schema refused, as one 400 (`all_of`), with the JSON object
    they came in: the speech route checks the fields that passed against the served model
    too, so that one answer names every error of the request (validation.py)."""

    def __init__(self, errors: list[ApiError], payload: dict[str, Any]) -> None:
        one = all_of(errors)
        super().__init__(one.status, one.message, one.param, one.kind, errors=one.errors)
        self.payload = payload
        self.refused = frozenset(e.param.split(".")[0] for e in errors if e.param)
        """The top-level fields refused (extra ones included)."""


def check_media_type(request: Request) -> None:
    """A body declared as anything but JSON (`application/json`, or a `+json` type) in
    UTF-8, or compressed (`Content-Encoding`), is a 415. No Content-Type at all is taken as
    JSON (curl without `-H`, scripts)."""
    encoding = request.headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("", "identity"):  # a compressed body would read as bad JSON or UTF-8
        raise ApiError(
            415,
            f"request bodies are not decoded: Content-Encoding {quoted(encoding)} is not "
            "accepted; send the JSON as it is",
        )
    header = request.headers.get("content-type")
    if header is None:
        return
    media, *params = (part.strip() for part in header.split(";"))
    media = media.lower()
    if media != "application/json" and not (
        media.startswith("application/") and media.endswith("+json")
    ):
        raise ApiError(
            415,
            f"the body must be JSON (Content-Type: application/json), not {quoted(media)}",
        )
    for param in params:
        name, _, value = param.partition("=")
        charset = value.strip().strip('"').lower()
        if name.strip().lower() == "charset" and charset not in ("utf-8", "utf8"):
            raise ApiError(415, f"a JSON body is UTF-8, not {quoted(charset)}")


async def read_body(request: Request) -> bytes:
    """The whole body of a JSON request. A client that closes its connection before the
    body is complete gets one log line (no traceback) and a 400 nobody receives."""
    check_media_type(request)
    chunks: list[bytes] = []
    received = 0
    try:
        async for chunk in request.stream():
            chunks.append(chunk)
            received += len(chunk)
    except ClientDisconnect:
        declared = request.headers.get("content-length", "unknown")
        log.info(
            "client %s left during its upload to %s: %d of %s bytes",
            request.client.host if request.client else "?",
            request.url.path,
            received,
            declared,
        )
        raise ApiError(
            400, "the client closed its connection before its body was complete"
        ) from None
    return b"".join(chunks)


def parse_body(raw: bytes, model: type[Body]) -> Body:
    """A request body, parsed here (not by FastAPI) so that every parse error, malformed
    JSON included, gets the API's JSON error naming the field."""
    payload = parse_json(raw)
    if not isinstance(payload, dict):
        raise ApiError(400, f"the body must be a JSON object, not {type(payload).__name__}")
    try:
        return model.model_validate(payload)
    except ValidationError as exc:
        raise FieldErrors(
            [field_error(e["loc"], e["msg"]) for e in exc.errors()], payload
        ) from None


def field_error(loc: tuple[int | str, ...], msg: str) -> ApiError:
    """One schema refusal as an error naming its field."""
    param = ".".join(str(p) for p in loc) or None
    return ApiError(400, f"{clip(param)}: {msg}" if param else msg, param)


def parse_json(raw: bytes) -> Any:
    """JSON as RFC 8259 has it (UTF-8, no NaN or Infinity), every refusal a 400. The
    parser's own failures beyond syntax (RecursionError for deep nesting, ValueError for an
    integer too long to convert) would otherwise escape as a 500."""
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ApiError(400, f"the body is not valid UTF-8 (byte {exc.start})") from None
    try:
        return json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        raise ApiError(400, f"malformed JSON body: {exc}") from None
    except RecursionError:
        raise ApiError(400, "malformed JSON body: nested too deeply") from None
    except ValueError:  # the only other one: int() past the int-string limit
        limit = sys.get_int_max_str_digits()
        raise ApiError(400, f"malformed JSON body: a number has over {limit} digits") from None


def _refuse_constant(name: str) -> None:
    """NaN, Infinity, -Infinity: Python's json reads them; JSON has no such numbers."""
    raise ApiError(400, f"malformed JSON body: {name} is not a JSON value")
