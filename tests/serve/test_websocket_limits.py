"""WS /v1/audio/speech/stream's limits, each on a server of its own: the idle timeout, a
message's size, the in-flight cap sessions count against, the text waiting to be spoken
(docs/websocket.md)."""

from __future__ import annotations

import httpx
import pytest
from websockets.exceptions import ConnectionClosed
from websockets.sync.client import connect

from tests.serve.conftest import LiveServer
from tests.serve.test_websocket import (
    configure,
    done,
    event,
    recv,
    text,
    utterance,
    wait_for,
    ws_url,
)


def test_idle_session_is_closed():
    with LiveServer("server.ws_idle_timeout_s=0.3") as server, connect(ws_url(server)) as ws:
        configure(ws)
        err = event(ws)  # nothing sent: after 0.3 s, an error, then the close
        assert err["type"] == "error"
        assert err["message"].startswith("Idle timeout: no message received")
        with pytest.raises(ConnectionClosed) as closed:
            recv(ws)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1000


def test_a_message_is_bounded_as_a_request_body_is():
    """A session.config may carry a reference, so a message may be as large as a body
    (server.max_body_bytes), and no larger: the socket is closed with 1009 (too big)."""
    with LiveServer("server.max_body_bytes=65536") as server, connect(ws_url(server)) as ws:
        configure(ws, instructions="x" * 60_000)  # under the bound: read and judged
        assert event(ws)["type"] == "error"
        configure(ws, instructions="x" * 70_000)
        with pytest.raises(ConnectionClosed) as closed:
            recv(ws)
        assert closed.value.rcvd is not None and closed.value.rcvd.code == 1009


def test_sessions_count_against_the_in_flight_cap():
    with LiveServer("server.max_concurrent_requests=1") as server:
        with connect(ws_url(server)) as first:
            configure(first)  # open, idle: it holds the one place
            with connect(ws_url(server)) as second:
                err = event(second)
                assert err["type"] == "error" and err["code"] == "429"
                with pytest.raises(ConnectionClosed) as closed:
                    recv(second)
                assert closed.value.rcvd.code == 1013
            # the HTTP route counts the open session too, and so does /health
            body = {"model": "qwen3-tts-tiny", "input": "Hi.", "voice": "vivian"}
            r = httpx.post(f"{server.url}/v1/audio/speech", json=body, timeout=30)
            assert r.status_code == 429, r.text
            assert r.headers["retry-after"] == "1"
            assert httpx.get(f"{server.url}/health").json()["in_flight"] == 1
            refusals = [
                line
                for line in httpx.get(f"{server.url}/metrics").text.splitlines()
                if line.startswith('omniflow_refusals_total{reason="in_flight"}')
            ]
            assert refusals == ['omniflow_refusals_total{reason="in_flight"} 2.0']  # WS + HTTP
        wait_for(lambda: server.app.state.speech_sessions.open == 0)
        assert httpx.get(f"{server.url}/health").json()["in_flight"] == 0
        with connect(ws_url(server)) as third:  # the place is free again
            configure(third)
            text(third, "Admitted.")
            done(third)
            assert utterance(third)[2]["total_sentences"] == 1


def test_text_waiting_to_be_spoken_is_bounded():
    """Utterances ended with input.done queue behind the one being spoken; what waits, all
    of them together, is bounded by server.max_input_chars too."""
    with LiveServer("server.max_input_chars=100") as server, connect(ws_url(server)) as ws:
        configure(ws, response_format="pcm")
        text(ws, "Sentence one is here. " * 4)  # 88 characters, 4 sentences
        done(ws)
        text(ws, "A second utterance, forty characters.. ")
        events, _, end = utterance(ws)  # the first is spoken whole, the piece refused
        (err,) = [e for e in events if e["type"] == "error"]
        assert err["param"] == "text" and "would wait to be spoken" in err["message"]
        assert end["total_sentences"] == 4
        text(ws, "A second utterance, forty characters.. ")
        done(ws)
        events, _, end = utterance(ws)
        assert end["total_sentences"] == 1
        assert events[0]["sentence_text"] == "A second utterance, forty characters.."
