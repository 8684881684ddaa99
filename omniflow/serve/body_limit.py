"""The request body limit (`server.max_body_bytes`): a body over it is refused with a 413 in
the API's JSON shape, and the connection closed, before the rest of it is read
(docs/reliability.md, "Clients that misbehave").

An ASGI middleware in front of every route: a declared `Content-Length` over the limit is
answered before the app runs, so nothing of the body is read, whatever the route; a chunked
body (no length declared) is counted as the route reads it and refused once it passes the
limit. The 413 says `Connection: close`: otherwise uvicorn would go on reading the rest of
the body to find the next request. (FastAPI's own `max_body_size` acts only once a route
reads the body, and the connection stays open for the rest of it.)
"""

from __future__ import annotations

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from omniflow.serve.errors import ApiError, error_response


def too_large(limit: int, declared: int | None = None) -> ApiError:
    size = f"is {declared} bytes" if declared is not None else "passed it"
    return ApiError(
        413,
        f"the request body {size}; the limit is {limit} bytes (server.max_body_bytes)",
        headers={"Connection": "close"},
    )


def declared_length(scope: Scope) -> int | None:
    """The request's Content-Length (h11 has checked it is a number), if it has one."""
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value)
    return None


class BodyLimit:
    """Refuses request bodies over `limit` bytes (413 JSON, connection closed)."""

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app, self.limit = app, limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = declared_length(scope)
        if declared is not None and declared > self.limit:
            await error_response(too_large(self.limit, declared))(scope, receive, send)
            return
        received = 0

        async def counted() -> Message:
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.limit:
                raise too_large(self.limit)  # the route's read fails: its handler answers
            return message

        await self.app(scope, counted, send)
