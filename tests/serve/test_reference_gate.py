"""Voice-clone references decoded and encoded at once (issue 36 item 15):
`server.max_concurrent_references` places, a 429 with Retry-After past them (before a large
body is read), the work on the gate's own threads, and the free heap returned when the
last place is given back.

Before, every registration decoded at once on a thread of its own: 32 registrations of
15 MB references took the server to 3.3 GB, and 8 of 30 s left +450-600 MB at idle."""

from __future__ import annotations

import asyncio
import socket
import threading
from concurrent.futures import ThreadPoolExecutor

import httpx

from omniflow.config.compose import compose
from omniflow.serve.reference_gate import REFERENCE_BODY_BYTES, ReferenceGate
from omniflow.serve.run import ServerThread
from tests.serve.fake_pipeline import INFO
from tests.serve.helpers import CloningFake, audio_file, b64
from tests.serve.test_idle_connections import closed_within

REF = b64(audio_file())


def serve(fake: CloningFake, places: int) -> ServerThread:
    spec = compose(["platform=cpu", f"server.max_concurrent_references={places}"]).server
    return ServerThread(fake, spec)


def register(url: str) -> httpx.Response:
    body = {"name": "me", "ref_audio": REF, "ref_text": "A tone."}
    return httpx.post(url + "/v1/audio/voices", json=body, timeout=10)


def test_past_the_places_a_reference_is_a_429_and_the_places_come_back():
    fake = CloningFake()
    fake.encoder.release.clear()  # the first encoding holds its place until released
    with serve(fake, 1) as server, ThreadPoolExecutor(1) as pool:
        first = pool.submit(register, server.url)
        assert fake.encoder.started.wait(10)
        refused = register(server.url)
        clone = {"model": INFO.model, "input": "Hi.", "ref_audio": REF, "ref_text": "A tone."}
        refused_clone = httpx.post(server.url + "/v1/audio/speech", json=clone, timeout=10)
        assert fake.encoder.calls == 1  # neither was decoded
        fake.encoder.release.set()
        assert first.result(timeout=10).status_code == 201
        assert register(server.url).status_code == 201  # the place came back
    for r in (refused, refused_clone):
        assert r.status_code == 429, r.text
        assert r.headers["retry-after"] == "1"
        error = r.json()["error"]
        assert error["param"] == "ref_audio" and "max_concurrent_references" in error["message"]


def test_a_large_body_is_refused_before_it_is_read_when_no_place_is_free():
    fake = CloningFake()
    fake.encoder.release.clear()
    with serve(fake, 1) as server, ThreadPoolExecutor(1) as pool:
        first = pool.submit(register, server.url)
        assert fake.encoder.started.wait(10)
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.sendall(
            b"POST /v1/audio/voices HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n" % (REFERENCE_BODY_BYTES + 1)
        )
        answer = closed_within(sock, 3.0)  # none of the body was sent
        sock.close()
        fake.encoder.release.set()
        assert first.result(timeout=10).status_code == 201
    assert answer is not None and answer.startswith(b"HTTP/1.1 429 "), answer
    assert b"connection: close" in answer.lower()


def test_the_gate_runs_on_its_own_threads_and_returns_the_heap_when_idle():
    trims: list[str] = []
    gate = ReferenceGate(2, lambda: trims.append(threading.current_thread().name))

    class Request:
        headers: dict[str, str] = {}

    async def scenario() -> list[str]:
        names = []
        with gate.place(Request()) as a, gate.place(Request()) as b:  # type: ignore[arg-type]
            for place in (a, b):
                names.append(await gate.run(place, lambda: threading.current_thread().name))
            assert gate.busy == 2
        return names

    names = asyncio.run(scenario())
    gate.executor.shutdown(wait=True)
    assert gate.busy == 0
    assert all(name.startswith("omniflow-reference") for name in names + trims)
    assert len(trims) == 1  # once, when the last place was given back
