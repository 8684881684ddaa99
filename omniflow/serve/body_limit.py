"""The request body limits: a body over `server.max_body_bytes` is refused with a 413 in the
API's JSON shape, and the connection closed, before the rest of it is read; one from which
nothing arrives for `server.body_timeout_s` is answered with a 408 the same way
(docs/reliability.md, "Clients that misbehave").

An ASGI middleware in front of every route: a declared `Content-Length` over the limit is
answered before the app runs, so nothing of the body is read, whatever the route; a chunked
body (no length declared) is counted as the route reads it and refused once it passes the
limit. The 413 says `Connection: close`: otherwise uvicorn would go on reading the rest of
the body to find the next request. (FastAPI's own `max_body_size` acts only once a route
reads the body, and the connection stays open for the rest of it.) The deadline is the
route's read failing too: uvicorn's head timeout ends before the body, and nothing else would
end a body that never completes.
"""

from __future__ import annotations

import asyncio

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


def too_slow(timeout_s: float) -> ApiError:
    return ApiError(
        408,
        f"the request body stopped arriving: nothing for {timeout_s:g} s (server.body_timeout_s)",
        headers={"Connection": "close"},
    )


class BodyLimit:
    """Refuses request bodies over `limit` bytes (413 JSON) or that stop arriving for
    `timeout_s` (408 JSON), the connection closed; a response sent before its request's body
    was read whole closes the connection too (uvicorn would read the rest for keep-alive,
    and a client trickling it would hold the connection unbounded)."""

    def __init__(self, app: ASGIApp, limit: int, timeout_s: float) -> None:
        self.app, self.limit, self.timeout_s = app, limit, timeout_s

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = declared_length(scope)
        if declared is not None and declared > self.limit:
            await error_response(too_large(self.limit, declared))(scope, receive, send)
            return
        received, whole = 0, not has_body(scope, declared)
        loop = asyncio.get_running_loop()

        async def counted() -> Message:
            nonlocal received, whole
            if whole:  # after the body: a disconnect, waited for as long as it takes
                return await receive()
            try:  # the deadline is per read: a slow upload that keeps coming is not cut
                async with asyncio.timeout_at(loop.time() + self.timeout_s):
                    message = await receive()
            except TimeoutError:
                raise too_slow(self.timeout_s) from None  # the route's read fails
            received += len(message.get("body", b""))
            whole = not message.get("more_body", False)
            if received > self.limit:
                raise too_large(self.limit)  # the route's read fails: its handler answers
            return message

        async def closing(message: Message) -> None:
            if message["type"] == "http.response.start" and not whole:
                headers = [h for h in message.get("headers", []) if h[0].lower() != b"connection"]
                message = {**message, "headers": [*headers, (b"connection", b"close")]}
            await send(message)

        await self.app(scope, counted, closing)


def has_body(scope: Scope, declared: int | None) -> bool:
    """Whether the request has body bytes to come (a length over 0, or chunked)."""
    chunked = any(
        name == b"transfer-encoding" and b"chunked" in value.lower()
        for name, value in scope["headers"]
    )
    return chunked or bool(declared)
