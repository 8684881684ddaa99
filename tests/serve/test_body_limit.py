"""Request bodies over `server.max_body_bytes` (issue 36 item 14): a 413 in the API's JSON
shape as soon as the length is known, the connection closed, the rest never read.

Before, a body of any size was read whole (256 MiB: RSS +0.5 GB, then a 400 for its JSON;
a declared 1 GiB that never came: no answer at all, the server waiting for it)."""

from __future__ import annotations

import json
import socket

import httpx
import pytest

from omniflow.config.compose import compose
from omniflow.serve.run import ServerThread
from tests.serve.fake_pipeline import FakePipeline
from tests.serve.test_idle_connections import closed_within

BODY = {"model": "qwen3-tts-tiny", "voice": "vivian", "input": "Hi.", "max_new_tokens": 2}
LIMIT = 4096


@pytest.fixture(scope="module")
def server():
    spec = compose(["platform=cpu", f"server.max_body_bytes={LIMIT}"]).server
    with ServerThread(FakePipeline(), spec) as running:
        yield running


def error_of(answer: bytes, status: int) -> dict:
    head, body = answer.split(b"\r\n\r\n", 1)
    assert head.startswith(f"HTTP/1.1 {status} ".encode()), head
    assert b"content-type: application/json" in head and b"connection: close" in head
    error = json.loads(body)["error"]
    assert error["code"] == str(status) and "server.max_body_bytes" in error["message"]
    return error


def test_a_declared_length_over_the_limit_is_refused_before_the_body_comes(server):
    """Nothing of the body is sent: the answer cannot have waited for it."""
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.sendall(
        b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Content-Length: 1073741824\r\n\r\n"
    )
    answer = closed_within(sock, 3.0)
    sock.close()
    assert answer is not None, "no answer: the server waits for the body"
    assert "1073741824 bytes" in error_of(answer, 413)["message"]


def test_any_route_refuses_it_before_routing(server):
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.sendall(b"POST /nowhere HTTP/1.1\r\nHost: x\r\nContent-Length: 99999\r\n\r\n")
    answer = closed_within(sock, 3.0)
    sock.close()
    assert answer is not None
    error_of(answer, 413)


def test_a_chunked_body_is_refused_once_it_passes_the_limit(server):
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.sendall(
        b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    chunk = b"x" * 1000
    for _ in range(5):  # 5,000 bytes: past the limit with the fifth chunk
        sock.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
    answer = closed_within(sock, 3.0)
    sock.close()
    assert answer is not None
    assert "passed it" in error_of(answer, 413)["message"]


def test_a_client_uploading_a_large_body_reads_the_413(server):
    r = httpx.post(
        server.url + "/v1/audio/speech",
        content=b"{" + b" " * (8 << 20),
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert r.status_code == 413 and r.json()["error"]["code"] == "413"


def test_a_body_within_the_limit_is_served(server):
    body = json.dumps({**BODY, "instructions": "x" * 3000}).encode()
    assert len(body) <= LIMIT
    r = httpx.post(
        server.url + "/v1/audio/speech",
        content=body,
        headers={"content-type": "application/json"},
        timeout=30,
    )
    assert r.status_code != 413, r.text


def test_the_derived_limit_takes_the_largest_valid_request():
    """null (the default): a reference of max_ref_audio_bytes in a data URI, and three text
    fields of max_input_chars characters, each at its longest JSON escape."""
    server = compose(["platform=cpu", "server.max_ref_audio_bytes=3000"]).server
    assert server.max_body_bytes is None
    astral = "\U0001f600" * server.max_input_chars  # 12 bytes each as json.dumps writes it
    body = {
        "model": "qwen3-tts-tiny-base",
        "input": astral,
        "instructions": astral,
        "ref_text": astral,
        "ref_audio": "data:audio/wav;base64," + "A" * (4 * 1000),
        "task_type": "Base",
        "response_format": "wav",
    }
    assert len(json.dumps(body).encode()) <= server.body_limit < 2 * len(json.dumps(body))
    assert compose(["platform=cpu", "server.max_body_bytes=123"]).server.body_limit == 123
