"""Hostile and foreign request bodies: every refusal is a 400 (or 404/405) in the OpenAI error
shape, names the field, quotes at most ~100 characters of what the client sent, and counts as
rejected; nothing becomes a 500 or a text/plain body, and the server keeps serving.

The pipeline is `FakePipeline` (everything here is refused before a stage would see it)."""

from __future__ import annotations

import json

import httpx
import pytest

from omniflow.config.compose import compose
from omniflow.serve.errors import ApiError, error_response
from omniflow.serve.run import ServerThread
from tests.serve.fake_pipeline import FakePipeline

BODY = {
    "model": "qwen3-tts-tiny",
    "voice": "vivian",
    "input": "Hello.",
    "response_format": "pcm",
    "max_new_tokens": 2,
}
OK_BYTES = 2 * 1920 * 2


@pytest.fixture(scope="module")
def url():
    with ServerThread(FakePipeline(), compose(["platform=cpu"]).server) as server:
        yield server.url


def post(url: str, **change) -> httpx.Response:
    return httpx.post(url + "/v1/audio/speech", json={**BODY, **change}, timeout=30)


def post_raw(url: str, content: bytes) -> httpx.Response:
    headers = {"content-type": "application/json"}
    return httpx.post(url + "/v1/audio/speech", content=content, headers=headers, timeout=30)


def api_error(r: httpx.Response, status: int) -> dict:
    """The OpenAI error body, checked for shape; returns its `error` object."""
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json", r.text
    err = r.json()["error"]
    assert set(err) - {"errors"} == {"message", "type", "param", "code"}
    assert err["code"] == str(status) and err["message"]
    for each in err.get("errors", []):  # a body's field errors, each listed too
        assert set(each) == {"field", "message"} and each["message"], err
    return err


def rejected(url: str) -> float:
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith('omniflow_requests_total{outcome="rejected"}'):
            return float(line.split()[-1])
    raise AssertionError("rejected series missing")


# ------------------------------------------------------------------ text


@pytest.mark.parametrize(
    "text",
    [
        "a\x00b",
        "\x07bell",
        "escape \x1b[31m",
        "del\x7f",
        "c1 \x85 control",
        "",
        " \t\n\r ",
        "\u200b",
        "\u200b\u200c\u200d\u2060\ufeff \u00a0",
        "\u3164",  # Hangul filler: a letter that draws nothing
        "\u2800\u2800",  # blank braille pattern
        "\u115f\u1160 \uffa0",
        "\u0301\u20dd",  # combining marks with nothing to sit on
    ],
)
def test_control_characters_and_invisible_text_are_refused(url, text):
    err = api_error(post(url, input=text), 400)
    assert err["param"] == "input"


def test_lone_surrogate_in_input_is_refused_and_the_reply_is_utf8(url):
    body = json.dumps({**BODY, "input": "a\ud800b"}).encode()  # ascii: "\\ud800" escape
    err = api_error(post_raw(url, body), 400)
    assert err["param"] == "input" and "surrogate" in err["message"]
    # echoed in a message (the unknown model), a lone surrogate is escaped, not a 500
    err = api_error(post_raw(url, json.dumps({**BODY, "model": "m\udfff"}).encode()), 404)
    assert err["param"] == "model" and "udfff" in err["message"]
    assert "'m\\udfff'" in err["message"], err["message"]  # one escape, not two


def test_text_with_tabs_newlines_and_a_zero_width_space_inside_is_spoken(url):
    r = post(url, input="Line one,\r\n\tline\u200b two.")
    assert r.status_code == 200 and len(r.content) == OK_BYTES


def test_instructions_with_a_control_character_are_refused(url):
    err = api_error(post(url, instructions="Warmly.\x00"), 400)
    assert err["param"] == "instructions"


# ------------------------------------------------------------------ parser failures

PARSER_FAILURES = [  # (body, what the message says)
    (b"[" * 100_000, "nested too deeply"),  # past the parser's recursion limit
    (b'{"seed": ' + b"7" * 5000 + b"}", "digits"),  # past Python's int-string limit
    (b'{"model": "qwen3-tts-tiny", "input": "\xff\xfe"}', "not valid UTF-8"),
    (b'{"model": "qwen3-tts-tiny", "input": "\xed\xa0\x80"}', "not valid UTF-8"),  # surrogate
    (b'{"speed": NaN}', "NaN is not a JSON value"),
    (b'{"speed": -Infinity}', "-Infinity is not a JSON value"),
    (b"", "malformed JSON"),
    (b"{not json", "malformed JSON"),
    (b"[1, 2]", "must be a JSON object"),
    (b'"a string"', "must be a JSON object"),
    (b'{"\\ud800": 1}', "string"),  # a key Python can hold and pydantic cannot read
]


def test_parser_failures_are_400_json_and_counted_as_rejected(url):
    before = rejected(url)
    for content, says in PARSER_FAILURES:
        err = api_error(post_raw(url, content), 400)
        assert err["type"] == "invalid_request_error" and says in err["message"], content[:40]
    assert rejected(url) == before + len(PARSER_FAILURES)
    assert post(url).status_code == 200


# ------------------------------------------------------------------ strict types


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("seed", True),
        ("seed", "7"),
        ("seed", 7.0),
        ("max_new_tokens", True),
        ("max_new_tokens", "2"),
        ("ignore_eos", "yes"),
        ("ignore_eos", 1),
        ("stream", "true"),
        ("initial_chunk_frames", "2"),
        ("speed", "1.0"),
        ("non_streaming_mode", "false"),
    ],
)
def test_numbers_and_flags_are_strict(url, field, value):
    err = api_error(post(url, **{field: value}), 400)
    assert err["param"] == field and err["message"].startswith(field + ":")


def test_a_json_integer_speed_is_still_a_number(url):
    assert post(url, speed=1).status_code == 200


# ------------------------------------------------------------------ formats


@pytest.mark.parametrize(
    ("fmt", "streamed"),
    [
        *((fmt, {"stream_format": "sse"}) for fmt in ("flac", "mp3", "opus", "aac")),
        *((fmt, {"stream": True}) for fmt in ("flac", "opus", "aac")),  # mp3 streams (LAME)
    ],
)
def test_streaming_a_compressed_format_is_refused(url, fmt, streamed):
    err = api_error(post(url, response_format=fmt, **streamed), 400)
    assert err["param"] == "response_format"


# ------------------------------------------------------------------ other frameworks' fields


def test_fields_other_frameworks_send_are_accepted_where_they_mean_something(url):
    for extra in (
        {"non_streaming_mode": True},
        {"non_streaming_mode": False},
        {"non_streaming_mode": None},
        {"task_type": "CustomVoice"},
        {"ref_audio": None, "ref_text": None, "x_vector_only_mode": False},
        {"x_vector_only_mode": None},
    ):
        r = post(url, **extra)
        assert r.status_code == 200 and len(r.content) == OK_BYTES, (extra, r.text)


@pytest.mark.parametrize(
    ("extra", "param", "says"),
    [
        ({"ref_audio": "https://example.com/me.wav"}, "ref_audio", "needs task_type 'Base'"),
        ({"ref_text": "What the reference says."}, "ref_text", "needs task_type 'Base'"),
        ({"x_vector_only_mode": True}, "x_vector_only_mode", "needs task_type 'Base'"),
        (
            {"ref_audio": "data:audio/wav;base64,UklGRg==", "voice": None, "task_type": "Base"},
            "task_type",
            "model qwen3-tts-tiny does not support voice cloning (task_type Base needs a "
            "Base model)",
        ),
    ],
)
def test_voice_clone_fields_on_a_custom_voice_model_get_a_precise_400(url, extra, param, says):
    body = {**BODY, **extra}
    body = {k: v for k, v in body.items() if v is not None}
    r = httpx.post(url + "/v1/audio/speech", json=body, timeout=30)
    err = api_error(r, 400)
    assert says in err["message"] and err["param"] == param


def test_unknown_fields_stay_refused(url):
    err = api_error(post(url, speaker_embedding=[0.1]), 400)
    assert err["param"] == "speaker_embedding" and "Extra inputs" in err["message"]


# ------------------------------------------------------------------ echoes


@pytest.mark.parametrize(
    ("change", "status", "param"),
    [
        ({"voice": "v" * 10_000}, 400, "voice"),
        ({"language": "v" * 10_000}, 400, "language"),
        ({"model": "v" * 10_000}, 404, "model"),
        ({"v" * 10_000: 1}, 400, "v" * 100 + "…"),
    ],
)
def test_errors_quote_at_most_about_100_characters_of_input(url, change, status, param):
    err = api_error(post(url, **change), status)
    assert err["param"] == param
    assert "v" * 100 + "…" in err["message"] and "v" * 101 not in err["message"]


# ------------------------------------------------------------------ routing


def test_404_and_405_are_api_errors(url):
    err = api_error(httpx.get(url + "/v1/nothing/" + "p" * 5000), 404)
    assert err["type"] == "not_found_error" and "p" * 101 not in err["message"]
    assert "did you mean" not in err["message"]
    # a trailing slash: a JSON 404 naming the route, not a bodiless redirect
    err = api_error(httpx.post(url + "/v1/audio/speech/", json=BODY), 404)
    assert err["message"] == "no route '/v1/audio/speech/'; did you mean '/v1/audio/speech'?"
    # to a route that answers another method: which it answers (GET there would be a 405)
    err = api_error(httpx.get(url + "/v1/audio/speech/"), 404)
    assert err["message"] == "no route '/v1/audio/speech/'; '/v1/audio/speech' answers POST"
    # quoted at most ~100 characters
    err = api_error(httpx.get(url + "/v1/audio/voices/" + "p" * 5000 + "/"), 404)
    assert "did you mean '/v1/audio/voices/ppp" in err["message"]
    assert "p" * 101 not in err["message"] and len(err["message"]) < 300
    r = httpx.get(url + "/v1/audio/speech")
    err = api_error(r, 405)
    assert r.headers["allow"] == "POST" and "GET" in err["message"]
    r = httpx.post(url + "/health")
    api_error(r, 405)
    assert r.headers["allow"] == "GET, HEAD"
    r = httpx.put(url + "/v1/audio/voices/some-id")  # a path parameter: matched by pattern
    err = api_error(r, 405)
    assert r.headers["allow"] == "DELETE, GET, HEAD" and err["message"].endswith("GET, HEAD")


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_plain_http_to_the_websocket_endpoint_says_it_is_one(url, method):
    r = httpx.request(method, url + "/v1/audio/speech/stream")
    err = api_error(r, 426)
    assert "is a WebSocket endpoint" in err["message"] and r.headers["upgrade"] == "websocket"


def test_the_websocket_hint_behind_a_proxy_prefix_and_not_beside_the_route():
    from fastapi.testclient import TestClient

    from omniflow.config.compose import compose
    from omniflow.serve.routes import build_app
    from tests.serve.fake_pipeline import FakePipeline

    app = build_app(FakePipeline(), compose(["platform=cpu"]).server)
    proxied = TestClient(app, root_path="/tts")
    assert proxied.get("/tts/v1/audio/speech/stream").status_code == 426
    assert TestClient(app).get("/v1/audio/speech/streamx").status_code == 404


@pytest.mark.parametrize("path", ["/health", "/v1/models", "/v1/audio/voices", "/metrics"])
def test_head_answers_on_get_routes(url, path):
    head = httpx.head(url + path)
    assert head.status_code == 200 and head.content == b""
    get = httpx.get(url + path)
    assert head.headers["content-type"] == get.headers["content-type"]
    assert int(head.headers["content-length"]) > 0


def test_head_on_the_speech_route_is_a_405(url):
    r = httpx.head(url + "/v1/audio/speech")
    assert r.status_code == 405 and r.headers["allow"] == "POST"


def test_an_error_body_is_always_encodable():
    """The last line of defence: a message or param holding a lone surrogate (from a layer
    that quoted input without `clip`) is escaped, not a UnicodeEncodeError and a 500."""
    r = error_response(ApiError(400, "bad \ud800 text", "f\udfff"))
    err = json.loads(r.body)["error"]
    assert err["message"] == "bad \\ud800 text" and err["param"] == "f\\udfff"


@pytest.mark.parametrize("path", ["/health", "/v1/audio/speech", "/nowhere"])
def test_a_websocket_handshake_to_another_path_is_a_json_404_naming_the_endpoint(url, path):
    """It was a bodiless 403 (the router closing a socket it could not route)."""
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    with pytest.raises(InvalidStatus) as denied:
        connect(url.replace("http://", "ws://") + path, open_timeout=10)
    response = denied.value.response
    assert response.status_code == 404
    error = json.loads(response.body)["error"]
    assert error["message"] == f"no WebSocket endpoint '{path}'; it is '/v1/audio/speech/stream'"
