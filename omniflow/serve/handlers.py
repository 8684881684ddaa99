"""Every error the app answers, in the API's JSON shape (errors.py): its own `ApiError`s,
the request schema's, and the router's (404 for an unknown path, 405 for a method a path
does not answer, with the Allow header listing the methods it does; 426 for plain HTTP to a
WebSocket endpoint; a WebSocket handshake to a path that is not one, a 404)."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.routing import Match, WebSocketRoute
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket

from omniflow.serve.errors import ApiError, clip, error_response, quoted
from omniflow.serve.ws_events import PATH as WS_PATH

DENIAL = "websocket.http.response"
"""The ASGI extension for answering a WebSocket handshake with an HTTP response."""


def install_error_handlers(app: FastAPI) -> None:
    """Every error the app answers, the router's included, in the API's JSON shape."""

    @app.exception_handler(ApiError)
    async def _api_error(_: Request, err: ApiError) -> JSONResponse:
        return error_response(err)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_: Request, err: RequestValidationError) -> JSONResponse:
        first = err.errors()[0]
        loc = [str(p) for p in first["loc"] if p != "body"]
        param = ".".join(loc) or None
        message = first["msg"] if param is None else f"{clip(param)}: {first['msg']}"
        return error_response(ApiError(400, message, param))

    @app.exception_handler(HTTPException)
    async def _http_error(request: Request, exc: HTTPException) -> JSONResponse:
        return error_response(router_error(app, request, exc))

    app.router.default = websocket_not_found(app.router.default)


def websocket_not_found(default: ASGIApp) -> ASGIApp:
    """The router's answer to a path no route matches. A WebSocket handshake to one (`/health`,
    a typo) is denied with a JSON 404 naming the WebSocket endpoint, where the router's own
    close made the server answer a bodiless 403; a server without the denial-response
    extension keeps that."""

    async def not_found(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "websocket" or DENIAL not in scope.get("extensions", {}):
            await default(scope, receive, send)
            return
        message = f"no WebSocket endpoint {quoted(scope['path'])}; it is {quoted(WS_PATH)}"
        err = ApiError(404, message, None, "not_found_error")
        await WebSocket(scope, receive, send).send_denial_response(error_response(err))

    return not_found


def router_error(app: FastAPI, request: Request, exc: HTTPException) -> ApiError:
    """404 and 405 (and any other HTTPException) as an ApiError. A 405's Allow header lists
    every method the path answers: the router reports only the first route it matched. A
    route answers the path when its pattern matches (`/v1/audio/voices/{voice_id}` answers
    `/v1/audio/voices/abc`): the router's own test, where the method decides only between a
    full and a partial match."""
    path = clip(request.url.path)
    shown = quoted(request.url.path)
    # the router matched no HTTP route: a WebSocket route at the path says it was plain HTTP
    if exc.status_code == 404 and _answers(
        app, {**request.scope, "type": "websocket"}, WebSocketRoute
    ):
        return ApiError(
            426,
            f"{shown} is a WebSocket endpoint: connect to it with a WebSocket client "
            "(ws://HOST:PORT" + path + "; docs/websocket.md), not a plain HTTP request",
            None,
            headers={"Upgrade": "websocket", "Connection": "Upgrade"},
        )
    if exc.status_code == 404:
        bare = request.url.path.rstrip("/")
        methods = _methods(app, {**request.scope, "path": bare}) if bare else []
        if request.method in methods:
            hint = f"; did you mean {quoted(bare)}?"
        elif methods:  # the path without its slash answers other methods: say which
            hint = f"; {quoted(bare)} answers {', '.join(methods)}"
        else:
            hint = ""
        return ApiError(404, f"no route {shown}{hint}", None, "not_found_error")
    if exc.status_code == 405:
        allowed = _methods(app, request.scope)
        message = (
            f"method {clip(request.method)} is not allowed on {shown}; "
            f"it answers {', '.join(allowed)}"
        )
        return ApiError(405, message, None, headers={"Allow": ", ".join(allowed)})
    kind = "server_error" if exc.status_code >= 500 else "invalid_request_error"
    return ApiError(exc.status_code, clip(str(exc.detail), 300), None, kind, exc.headers)


def _methods(app: FastAPI, scope: dict) -> list[str]:
    """The methods of the HTTP routes whose path matches `scope`'s, sorted."""
    return sorted(
        method
        for route in app.routes
        if isinstance(route, APIRoute) and route.matches(scope)[0] != Match.NONE
        for method in route.methods
    )


def _answers(app: FastAPI, scope: dict, kind: type[APIRoute] | type[WebSocketRoute]) -> bool:
    """Whether a route of `kind` fully matches `scope`, by the router's own test (a root_path
    prefix included): the path, and for an HTTP route the method."""
    return any(
        isinstance(route, kind) and route.matches(scope)[0] == Match.FULL for route in app.routes
    )
