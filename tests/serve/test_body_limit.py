"""Request bodies over `server.max_body_bytes` (issue 36 item 14): a 413 in the API's JSON
shape as soon as the length is known, the connection closed, the rest never read.

Before, a body of any size was read whole (256 MiB: RSS +0.5 GB, then a 400 for its JSON;
a declared 1 GiB that never came: no answer at all, the server waiting for it)."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import httpx
import pytest

from omniflow.config.compose import compose
from omniflow.serve.run import ServerThread
from tests.serve.fake_pipeline import FakePipeline
from tests.serve.test_idle_connections import closed_within, until

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
    """null (the default): a reference of max_ref_audio_bytes in a data URI, wrapped in lines,
    and three text fields of max_input_chars characters, each at its longest JSON escape."""
    server = compose(["platform=cpu", "server.max_ref_audio_bytes=3000000"]).server
    assert server.max_body_bytes is None
    astral = "\U0001f600" * server.max_input_chars  # 12 bytes each as json.dumps writes it
    body = {
        "model": "qwen3-tts-tiny-base",
        "input": astral,
        "instructions": astral,
        "ref_text": astral,
        # wrapped as the base64 command does, in CRLF lines: \r\n is 4 bytes of JSON
        "ref_audio": "data:audio/wav;base64," + "\r\n".join(["A" * 76] * 52631 + ["A" * 44]),
        "task_type": "Base",
        "response_format": "wav",
    }
    assert len(json.dumps(body).encode()) <= server.body_limit < 2 * len(json.dumps(body))
    assert compose(["platform=cpu", "server.max_body_bytes=123"]).server.body_limit == 123


@pytest.mark.parametrize(
    "framing",
    [b"Content-Length: 1000\r\n\r\n", b"Transfer-Encoding: chunked\r\n\r\n5\r\n"],
    ids=["short_of_its_length", "chunked_without_its_last_chunk"],
)
def test_a_body_that_never_ends_is_answered_408_at_the_body_timeout(framing):
    """The head came, the body began and stopped: a 408 JSON at `server.body_timeout_s` and
    the connection closed (before, it stayed open for as long as the client liked)."""
    spec = compose(["platform=cpu", "server.body_timeout_s=0.5"]).server
    with ServerThread(FakePipeline(), spec) as s:
        sock = socket.create_connection(("127.0.0.1", s.port))
        sock.sendall(
            b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + framing
            + b'{"mod'
        )
        answer = closed_within(sock, 5.0)
        sock.close()
        assert answer is not None, "still open: the body is waited for without end"
        head, body = answer.split(b"\r\n\r\n", 1)
        assert head.startswith(b"HTTP/1.1 408 ") and b"connection: close" in head, head
        error = json.loads(body)["error"]
        assert "nothing for 0.5 s (server.body_timeout_s)" in error["message"]
        assert httpx.post(s.url + "/v1/audio/speech", json=BODY).status_code == 200


def test_a_response_that_outlasts_the_body_timeout_is_not_cut():
    """The deadline bounds the body alone: a request whose audio starts after it (the route
    still reads the connection then, for a disconnect) is answered whole."""
    spec = compose(["platform=cpu", "server.body_timeout_s=0.2"]).server
    fake = FakePipeline()
    fake.gate.clear()  # admitted, no audio yet
    with ServerThread(fake, spec) as s:
        body = {**BODY, "stream": True, "response_format": "pcm"}
        got: list[httpx.Response] = []
        sender = threading.Thread(
            target=lambda: got.append(httpx.post(s.url + "/v1/audio/speech", json=body, timeout=30))
        )
        sender.start()
        until(lambda: fake.submits == 1)  # its body read whole
        time.sleep(0.4)  # the condition under test: twice the body timeout passes
        fake.gate.set()
        sender.join(timeout=30)
    assert got and got[0].status_code == 200 and len(got[0].content) > 0


def test_after_the_whole_body_the_deadline_no_longer_applies():
    """A route reads the connection after its body too (a disconnect, while it waits for
    audio): those reads wait as long as they must, past the body's deadline."""
    from omniflow.serve.body_limit import BodyLimit

    async def scenario() -> list[dict]:
        messages: asyncio.Queue[dict] = asyncio.Queue()
        messages.put_nowait({"type": "http.request", "body": b"{}", "more_body": False})
        seen: list[dict] = []

        async def app(scope, receive, send) -> None:
            seen.append(await receive())
            await asyncio.sleep(0.15)  # the condition under test: past the 0.1 s deadline
            loop = asyncio.get_running_loop()  # the client leaves while the read waits
            loop.call_soon(messages.put_nowait, {"type": "http.disconnect"})
            seen.append(await receive())

        limited = BodyLimit(app, limit=100, timeout_s=0.1)
        await limited({"type": "http", "headers": [(b"content-length", b"2")]}, messages.get, None)
        return seen

    assert [m["type"] for m in asyncio.run(scenario())] == ["http.request", "http.disconnect"]


def test_a_slow_upload_that_keeps_coming_is_not_cut():
    """The deadline is per read: a body sent in pieces over twice the timeout, each within
    it, is read whole and answered (a large reference over a slow link)."""
    spec = compose(["platform=cpu", "server.body_timeout_s=0.4"]).server
    body = json.dumps(BODY).encode()
    with ServerThread(FakePipeline(), spec) as s:
        sock = socket.create_connection(("127.0.0.1", s.port))
        head = (
            b"POST /v1/audio/speech HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % len(body)
        )
        sock.sendall(head)
        for i in range(0, len(body), len(body) // 4 + 1):
            time.sleep(0.25)  # the condition under test: the upload outlasts the timeout
            sock.sendall(body[i : i + len(body) // 4 + 1])
        answer = sock.recv(65536)
        sock.close()
    assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]


def test_an_answer_before_the_body_is_read_closes_the_connection(server):
    """A 404 (or any refusal ahead of the read) with the body still coming: the connection
    closes, so a client trickling the rest cannot hold it (uvicorn would read on for
    keep-alive, each byte resetting its timer)."""
    sock = socket.create_connection(("127.0.0.1", server.port))
    sock.sendall(b"POST /nowhere HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{")
    answer = closed_within(sock, 5.0)
    sock.close()
    assert answer is not None, "still open after the answer: the rest of the body is awaited"
    head = answer.split(b"\r\n\r\n", 1)[0].lower()
    assert head.startswith(b"http/1.1 404 ") and b"connection: close" in head, head
    kept = httpx.get(server.url + "/health")  # a request without a body keeps its connection
    assert kept.status_code == 200 and kept.headers.get("connection") != "close"
