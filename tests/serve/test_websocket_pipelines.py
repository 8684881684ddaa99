"""WS /v1/audio/speech/stream on both pipelines and a Base model: a sentence is spoken as the
HTTP route speaks the same request (seeded, the same PCM), a registered voice works as
`voice`, and shutdown ends open sessions and what they were speaking."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from omniflow.serve.reference_gate import REFERENCE_BODY_BYTES, Place
from tests.serve.conftest import LiveServer, assert_released
from tests.serve.helpers import audio_file, b64
from tests.serve.test_websocket import (
    LONG,
    configure,
    done,
    event,
    recv,
    text,
    utterance,
    wait_for,
    ws_url,
)

FIXED = {"seed": 5, "max_new_tokens": 6, "ignore_eos": True}


def ws_pcm(server: LiveServer, sentence: str, **fields) -> bytes:
    with connect(ws_url(server)) as ws:
        configure(ws, response_format="pcm", **fields)
        audio = bytearray()
        text(ws, sentence)
        done(ws)
        while True:
            message = recv(ws)
            if isinstance(message, bytes):
                audio += message
            elif json.loads(message)["type"] == "session.done":
                return bytes(audio)


def http_pcm(server: LiveServer, sentence: str, **fields) -> bytes:
    model = server.app.state.service.info.model
    body = {"model": model, "input": sentence, "response_format": "pcm", **fields}
    r = httpx.post(server.url + "/v1/audio/speech", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.content


@pytest.mark.parametrize("pipeline", ["qwen3_tts_fused", "qwen3_tts"])
def test_a_sentence_is_the_http_request_s_audio(pipeline):
    with LiveServer(f"pipeline={pipeline}") as server:
        for stream_audio in (False, True):
            got = ws_pcm(server, "Same audio.", stream_audio=stream_audio, **FIXED)
            assert got == http_pcm(server, "Same audio.", **FIXED)
            assert len(got) == 2 * 6 * 1920  # 6 frames of 1,920 samples, PCM16


def test_a_registered_voice_speaks_on_a_base_model():
    with LiveServer("model=qwen3_tts_tiny_base") as server:
        ref = b64(audio_file(freq=220.0))
        r = httpx.post(
            server.url + "/v1/audio/voices",
            json={"name": "me", "ref_audio": ref, "ref_text": "A low tone."},
            timeout=60,
        )
        vid = r.json()["id"]
        got = ws_pcm(server, "Cloned.", voice=vid, **FIXED)
        assert got == http_pcm(server, "Cloned.", voice=vid, **FIXED)
        with connect(ws_url(server)) as ws:
            configure(ws)  # no voice or reference on a Base model: nothing to clone from
            assert event(ws)["type"] == "error"


def test_a_reference_in_session_config_clones_as_the_http_route_does():
    """vLLM-Omni's session.config carries ref_audio/ref_text/x_vector_only_mode: the
    reference is encoded once for the session and every sentence is cloned from it. A
    config large enough to carry a reference is parsed within a place of the reference gate
    (a 6 s reference is over its size), as an HTTP body is."""
    with LiveServer("model=qwen3_tts_tiny_base") as server:
        service = server.app.state.service
        encodings: list[str] = []
        encode = service.encode_reference

        async def counted(ref_audio, place):
            encodings.append(ref_audio)
            return await encode(ref_audio, place)

        service.encode_reference = counted
        ref = b64(audio_file(freq=220.0))
        long_ref = b64(audio_file(freq=220.0, seconds=6.0))
        assert len(long_ref) > REFERENCE_BODY_BYTES
        for clone in (
            {"ref_audio": ref, "ref_text": "A low tone."},
            {"ref_audio": long_ref, "x_vector_only_mode": True},
        ):
            fields = {**clone, **FIXED}
            got = ws_pcm(server, "Cloned. Twice over.", **fields)
            assert len(encodings) == 1  # once for the session, not once a sentence
            each = [http_pcm(server, sentence, **fields) for sentence in ("Cloned.", "Twice over.")]
            assert got == b"".join(each)
            encodings.clear()
        with connect(ws_url(server)) as ws:
            configure(ws, ref_audio="data:audio/wav;base64,AAAA", ref_text="x")
            err = event(ws)
            assert err["type"] == "error" and err["param"] == "ref_audio", err
            encodings.clear()
            configure(ws, ref_audio=ref, ref_text="A low tone.", incremental=True)
            err = event(ws)  # an in-context clone's prompt holds text as long as its reference
            assert (
                err["param"] == "x_vector_only_mode" and "set x_vector_only_mode" in err["message"]
            ), err
            assert not encodings  # refused before the reference was encoded
            with contextlib.ExitStack() as held:  # every place taken: a large one is a 429
                for _ in range(service.references.places):
                    held.enter_context(Place(service.references)).take()
                configure(ws, ref_audio=long_ref, x_vector_only_mode=True)
                err = event(ws)
                assert err["code"] == "429" and err["param"] == "ref_audio", err
                configure(ws, ref_audio=long_ref, response_format="bogus")
                err = event(ws)  # not parsed, so not judged: its place comes first
                assert err["code"] == "429", err
            configure(ws, ref_audio=ref, x_vector_only_mode=True, incremental=True)
            text(ws, "Live.")
            done(ws)
            events, audio, end = utterance(ws)
            assert end["type"] == "session.done" and sum(audio.values()) > 0, events
        assert service.references.busy == 0  # the places are given back


def test_shutdown_closes_sessions_and_aborts_their_speech():
    server = LiveServer().__enter__()
    try:
        with connect(ws_url(server)) as ws:
            configure(ws, response_format="pcm", stream_audio=True)
            text(ws, LONG)
            assert event(ws)["type"] == "audio.start"
            assert isinstance(recv(ws), bytes)
            stopping = threading.Thread(target=server.__exit__, args=(None, None, None))
            began = time.monotonic()
            stopping.start()
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    recv(ws)
            stopping.join(30)
            assert not stopping.is_alive()
            assert time.monotonic() - began < 10
            assert closed.value.rcvd is not None and closed.value.rcvd.code == 1012
    finally:
        server.server.should_exit = True
        server.thread.join(30)


def test_a_long_utterance_is_not_idle():
    """The idle timeout counts from the last message or the end of the speech, whichever is
    later: a session whose speech outlasts the timeout is not closed under it."""
    with LiveServer("server.ws_idle_timeout_s=0.3") as server, connect(ws_url(server)) as ws:
        # 4 x 20 frames: ~2 s on a 2-core CI machine, several times the 0.3 s timeout
        configure(ws, response_format="pcm", seed=1, max_new_tokens=20, ignore_eos=True)
        began = time.monotonic()
        text(ws, "One. Two. Three. Four.")
        done(ws)
        events, audio, end = utterance(ws)
        assert time.monotonic() - began > 0.3, "spoken faster than the timeout: no test"
        assert end["total_sentences"] == 4 and all(e["type"] != "error" for e in events)
        err = event(ws)
        assert err["type"] == "error" and err["code"] == "408"


def test_a_client_that_stops_reading_is_dropped():
    """server.stalled_client_timeout_s: a session whose client takes nothing while its audio
    is sent is ended, and what it was speaking aborted. The client reads nothing: a small
    receive buffer and a one-message queue on its side, a small send buffer on the server's
    (accepted sockets inherit it from the listening one), make the server's sends wait."""
    with LiveServer("server.stalled_client_timeout_s=0.5") as server:
        server.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        sock.connect(("127.0.0.1", server.port))
        with connect(ws_url(server), sock=sock, max_queue=1) as ws:
            configure(ws, response_format="pcm", stream_audio=True)
            text(ws, LONG * 2)
            done(ws)
            sessions = server.app.state.speech_sessions
            ended = sessions.metrics.ended.labels("stalled")
            wait_for(lambda: ended._value.get() == 1, 30)
            wait_for(lambda: server.pipeline.stats().in_flight == 0)
            with pytest.raises(ConnectionClosed) as closed:
                while True:
                    recv(ws)
            assert closed.value.rcvd is None or closed.value.rcvd.code == 1008
        server.wait_idle()
        assert_released(server.pipeline.stats())
