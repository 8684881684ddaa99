"""`/docs` (Swagger UI) and `/redoc` with their scripts, styles and icon served by the
server itself, not from a CDN: the pages work on a machine with no internet access.

FastAPI's own pages load Swagger UI and ReDoc from jsDelivr (and ReDoc its fonts from
Google), so offline they are blank. The assets come from the `fastapi-offline` package, a
dependency that ships them (Swagger UI 5, which reads the OpenAPI 3.1 FastAPI writes, and
ReDoc's standalone bundle); omniflow keeps no copy of its own. The endpoints are module-level
functions, like `endpoints.py`'s, so that FastAPI's caches keyed by endpoint keep no app.
"""

from __future__ import annotations

import importlib.resources
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import (
    get_redoc_html,
    get_swagger_ui_html,
    get_swagger_ui_oauth2_redirect_html,
)
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

ASSETS = "/docs/assets"
OAUTH2_REDIRECT = "/docs/oauth2-redirect"


def asset_folder() -> Path:
    """The installed `fastapi_offline/static` folder (swagger-ui-bundle.js,
    swagger-ui.css, redoc.standalone.js, favicon.png)."""
    return Path(str(importlib.resources.files("fastapi_offline") / "static"))


def install_docs(app: FastAPI) -> None:
    """`/docs`, `/docs/oauth2-redirect` and `/redoc`, and their assets under `ASSETS`, on an
    app made with `docs_url=None, redoc_url=None`."""
    app.mount(ASSETS, StaticFiles(directory=asset_folder()), name="docs-assets")
    app.add_api_route("/docs", swagger_page, methods=["GET"], include_in_schema=False)
    app.add_api_route(OAUTH2_REDIRECT, oauth2_redirect, methods=["GET"], include_in_schema=False)
    app.add_api_route("/redoc", redoc_page, methods=["GET"], include_in_schema=False)


def rooted(request: Request, path: str) -> str:
    """`path` as the browser must ask for it: behind a proxy that serves the app under a
    prefix (the ASGI `root_path`), links without it would miss the app."""
    return request.scope.get("root_path", "") + path


async def swagger_page(request: Request) -> HTMLResponse:
    return get_swagger_ui_html(
        openapi_url=rooted(request, request.app.openapi_url),
        title=f"{request.app.title} - Swagger UI",
        oauth2_redirect_url=rooted(request, OAUTH2_REDIRECT),
        swagger_js_url=rooted(request, f"{ASSETS}/swagger-ui-bundle.js"),
        swagger_css_url=rooted(request, f"{ASSETS}/swagger-ui.css"),
        swagger_favicon_url=rooted(request, f"{ASSETS}/favicon.png"),
    )


async def oauth2_redirect() -> HTMLResponse:
    return get_swagger_ui_oauth2_redirect_html()


async def redoc_page(request: Request) -> HTMLResponse:
    return get_redoc_html(
        openapi_url=rooted(request, request.app.openapi_url),
        title=f"{request.app.title} - ReDoc",
        redoc_js_url=rooted(request, f"{ASSETS}/redoc.standalone.js"),
        redoc_favicon_url=rooted(request, f"{ASSETS}/favicon.png"),
        with_google_fonts=False,
    )
