"""`/docs` and `/redoc` work offline (issue 36 item 12): every script, style and icon they
load is served by the server itself (from the `fastapi-offline` package); no page names
another host. Before, FastAPI's pages loaded Swagger UI and ReDoc from a CDN (and ReDoc's
fonts from Google), so without internet access they were blank."""

from __future__ import annotations

import re

import pytest
from fastapi.testclient import TestClient

from omniflow.config.compose import compose
from omniflow.serve.routes import build_app
from tests.serve.fake_pipeline import FakePipeline

TYPES = {".js": "text/javascript", ".css": "text/css", ".png": "image/png"}


@pytest.fixture(scope="module")
def client():
    return TestClient(build_app(FakePipeline(), compose(["platform=cpu"]).server))


@pytest.mark.parametrize(("page", "needs"), [("/docs", 3), ("/redoc", 2)])
def test_a_docs_page_loads_everything_from_this_server(client, page, needs):
    html = client.get(page)
    assert html.status_code == 200 and html.headers["content-type"].startswith("text/html")
    assert "://" not in html.text, re.findall(r"\w+://[^\s'\"]+", html.text)
    assets = re.findall(r'(?:src|href)="([^"]+)"', html.text)
    assert len(assets) == needs and "/openapi.json" in html.text
    for url in assets:
        r = client.get(url)
        assert r.status_code == 200, url
        assert r.headers["content-type"].startswith(TYPES[url[url.rindex(".") :]]), url
        assert len(r.content) > 1000, url


def test_the_swagger_ui_served_reads_openapi_3_1(client):
    """FastAPI writes OpenAPI 3.1, which Swagger UI reads from version 5 on."""
    assert client.get("/openapi.json").json()["openapi"].startswith("3.1")
    bundle = client.get("/docs/assets/swagger-ui-bundle.js").text
    assert re.search(r"OpenAPI 3\.1|openapi_3_1|isOAS31", bundle)


def test_an_unknown_asset_is_a_json_404(client):
    r = client.get("/docs/assets/nothing.js")
    assert r.status_code == 404 and r.json()["error"]["code"] == "404"


@pytest.mark.parametrize("page", ["/docs", "/redoc"])
def test_behind_a_proxy_prefix_every_link_carries_it(page):
    """A proxy serving the app under /tts (root_path): the page's links must include it, or
    the browser asks the proxy for paths outside the app."""
    app = build_app(FakePipeline(), compose(["platform=cpu"]).server)
    html = TestClient(app, root_path="/tts").get(page).text
    links = re.findall(r'(?:src|href)="([^"]+)"', html) + re.findall(r"url: '([^']+)'", html)
    assert links and all(link.startswith("/tts/") for link in links), links
    assert "/tts/openapi.json" in html
