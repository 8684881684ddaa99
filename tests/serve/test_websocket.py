"""WS /v1/audio/speech/stream over a real WebSocket client (the `websockets` library) against
a real server on loopback (uvicorn in a thread, the tiny model on the CPU): vLLM-Omni's
sentence protocol end to end, bad messages, the idle timeout, barge-in, many utterances on
one socket, admission (docs/websocket.md)."""

from __future__ import annotations

import json
import time

import httpx
import pytest
from websockets.sync.client import connect

from omniflow.serve.ws import PATH
from tests.serve.conftest import LiveServer, assert_released

RECV_S = 30.0
"""The longest a test waits for one message (a bound, not a synchronisation)."""
LONG = (
    "This sentence goes on and on, clause after clause, long enough that its request is "
    "still speaking when the client interrupts it, since the tiny model paces its length by "
    "the text, about fourteen letters a second, and this is over twenty seconds of it, "
    "which its CPU takes seconds to make, far longer than a cancel takes to arrive. "
)
"""About 20 s of audio: still being made when the test cuts it off."""


def ws_url(server: LiveServer) -> str:
    return f"ws://127.0.0.1:{server.port}{PATH}"


def recv(ws) -> str | bytes:
    return ws.recv(timeout=RECV_S)


def event(ws) -> dict:
    """The next JSON event (failing on binary audio)."""
    message = recv(ws)
    assert isinstance(message, str), f"expected a JSON event, got {len(message)} audio bytes"
    return json.loads(message)


def utterance(ws) -> tuple[list[dict], dict[int, int], dict]:
    """Events up to `session.done`: the sentence events, the audio bytes per sentence, and
    the session.done event."""
    events: list[dict] = []
    audio: dict[int, int] = {}
    current: int | None = None
    while True:
        message = recv(ws)
        if isinstance(message, bytes):
            assert current is not None, "audio outside audio.start/audio.done"
            audio[current] = audio.get(current, 0) + len(message)
            continue
        ev = json.loads(message)
        if ev["type"] == "session.done":
            return events, audio, ev
        events.append(ev)
        if ev["type"] == "audio.start":
            current = ev["sentence_index"]
        elif ev["type"] == "audio.done":
            current = None


def configure(ws, **fields) -> None:
    ws.send(json.dumps({"type": "session.config", **fields}))


def text(ws, piece: str) -> None:
    ws.send(json.dumps({"type": "input.text", "text": piece}))


def done(ws) -> None:
    ws.send(json.dumps({"type": "input.done"}))


def wait_for(condition, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


@pytest.fixture(scope="module")
def live():
    with LiveServer() as server:
        yield server


def test_two_sentences_split_across_deltas(live):
    with connect(ws_url(live)) as ws:
        configure(ws, voice="vivian", language="english", response_format="pcm", seed=1)
        for piece in ["Hello ", "there. How a", "re you", "? Fine"]:
            text(ws, piece)
        done(ws)
        events, audio, end = utterance(ws)
    assert [(e["type"], e["sentence_index"]) for e in events] == [
        ("audio.start", 0),
        ("audio.done", 0),
        ("audio.start", 1),
        ("audio.done", 1),
        ("audio.start", 2),
        ("audio.done", 2),
    ]
    starts = [e for e in events if e["type"] == "audio.start"]
    assert [s["sentence_text"] for s in starts] == ["Hello there.", "How are you?", "Fine"]
    assert all(s["format"] == "pcm" and s["sample_rate"] == 24000 for s in starts)
    for d in (e for e in events if e["type"] == "audio.done"):
        assert d["error"] is False and d["utterance_index"] == 0 and "message" not in d
        assert d["total_bytes"] == audio[d["sentence_index"]] > 0
        assert d["total_bytes"] % 2 == 0  # PCM16
    assert end == {"type": "session.done", "utterance_index": 0, "total_sentences": 3}
    live.wait_idle()
    assert_released(live.pipeline.stats())


def test_streamed_wav_sends_audio_in_pieces(live):
    """stream_audio: each sentence's audio as it is made (a WAV stream per sentence)."""
    with connect(ws_url(live)) as ws:
        configure(ws, response_format="wav", stream_audio=True, seed=2)
        text(ws, "A longer sentence to hear in several pieces, one after another.")
        done(ws)
        frames: list[bytes] = []
        start = event(ws)
        assert start["type"] == "audio.start"
        while isinstance(message := recv(ws), bytes):
            frames.append(message)
        end = json.loads(message)
        assert end["type"] == "audio.done" and end["error"] is False
        assert end["total_bytes"] == sum(map(len, frames))
        assert len(frames) > 1 and frames[0][:4] == b"RIFF"
        assert event(ws) == {"type": "session.done", "utterance_index": 0, "total_sentences": 1}


def test_bad_messages_are_errors_and_the_session_goes_on(live):
    with connect(ws_url(live)) as ws:
        text(ws, "Too early.")
        assert "before session.config" in event(ws)["message"]
        ws.send("this is not JSON")
        err = event(ws)
        assert err["type"] == "error" and "malformed JSON" in err["message"]
        ws.send(json.dumps({"type": "input.shout", "text": "x"}))
        err = event(ws)
        assert "unknown type 'input.shout'" in err["message"] and err["param"] == "type"
        ws.send(json.dumps([1, 2]))
        assert "JSON object" in event(ws)["message"]
        ws.send(b"\x00\x01")
        assert "binary messages" in event(ws)["message"]
        configure(ws, voice="nobody")
        err = event(ws)
        assert err["param"] == "voice" and "unknown voice 'nobody'" in err["message"]
        configure(ws, response_format="flac", stream_audio=True)
        assert event(ws)["param"] == "response_format"
        configure(ws, incremental="yes")
        assert event(ws)["param"] == "incremental"
        configure(ws, incremental=True, non_streaming_mode=True)
        assert event(ws)["param"] == "non_streaming_mode"
        configure(ws, input="Hi.")
        assert event(ws)["param"] == "input"
        configure(ws, seed="7")
        assert event(ws)["param"] == "seed"
        configure(ws, speed="x", seed="y", voice=5)  # every refused field, at once
        err = event(ws)
        assert err["message"].startswith("3 errors: ")
        assert sorted(e["field"] for e in err["errors"]) == ["seed", "speed", "voice"]
        configure(ws, stream_audio="yes", speed="x", voice="nobody")  # own, schema, rules
        err = event(ws)
        assert sorted(e["field"] for e in err["errors"]) == ["speed", "stream_audio", "voice"]
        configure(ws, stream_audio=True, response_format="flac", speed="x")
        err = event(ws)  # the session's rule beside the schema's refusal
        assert sorted(e["field"] for e in err["errors"]) == ["response_format", "speed"]
        configure(ws, model="zz", stream_audio="yes")
        err = event(ws)  # in the request's field order: the unserved model's 404 first
        assert err["code"] == "404" and err["param"] == "model" and len(err["errors"]) == 2
        configure(ws, model="zz", speed="x", stream_audio="yes")  # with a schema refusal too
        err = event(ws)
        assert err["code"] == "404" and err["param"] == "model" and len(err["errors"]) == 3
        configure(ws, initial_chunk_frames=2, initial_codec_chunk_frames=3)
        err = event(ws)
        assert err["param"] == "initial_codec_chunk_frames" and "one of them" in err["message"]
        configure(ws, response_format="pcm")  # now a good one: nothing answers it
        ws.send(json.dumps({"type": "input.cancel"}))  # nothing under way: ignored
        ws.send(json.dumps({"type": "input.text", "text": 5}))
        assert event(ws)["param"] == "text"
        ws.send(json.dumps({"type": "input.text", "text": "Dropped.", "voice": "ryan"}))
        err = event(ws)  # a field the message lacks: refused, the piece dropped, not ignored
        assert err["param"] == "voice" and "input.text has no field 'voice'" in err["message"]
        ws.send(json.dumps({"type": "input.done", "now": True}))
        assert "input.done has no field 'now' (its fields: type)" in event(ws)["message"]
        text(ws, "Still here.")
        done(ws)
        events, audio, end = utterance(ws)
        assert end["total_sentences"] == 1 and audio[0] > 0
        assert end["utterance_index"] == 0  # the ignored cancel ended no utterance
        assert events[0]["type"] == "audio.start"  # and answered nothing


def test_utterance_text_is_limited(live):
    limit = live.app.state.service.server.max_input_chars
    with connect(ws_url(live)) as ws:
        configure(ws)
        text(ws, "a" * (limit - 3))
        text(ws, "Too much.")
        err = event(ws)
        assert err["param"] == "text" and f"the limit is {limit}" in err["message"]
        ws.send(json.dumps({"type": "input.cancel"}))
        cancelled = {"type": "session.done", "utterance_index": 0, "total_sentences": 0}
        assert event(ws) == {**cancelled, "cancelled": True}
        text(ws, "Short. ")  # a fresh utterance has the whole limit again
        done(ws)
        _, _, end = utterance(ws)
        assert end["total_sentences"] == 1


def test_cancel_aborts_at_once_and_frees_the_request(live):
    with connect(ws_url(live)) as ws:
        configure(ws, response_format="pcm", stream_audio=True)
        text(ws, LONG)
        start = event(ws)
        assert start["type"] == "audio.start"
        assert isinstance(recv(ws), bytes)  # it is speaking
        assert live.pipeline.stats().in_flight == 1
        ws.send(json.dumps({"type": "input.cancel"}))
        while isinstance(message := recv(ws), bytes):
            pass
        cut = json.loads(message)
        assert cut["type"] == "audio.done" and cut["error"] is True
        assert cut["message"] == "cancelled"
        cancelled = {"type": "session.done", "utterance_index": 0, "total_sentences": 1}
        assert event(ws) == {**cancelled, "cancelled": True}
        wait_for(lambda: live.pipeline.stats().in_flight == 0)
        live.wait_idle()
        assert_released(live.pipeline.stats())
        # the next utterance starts clean, its sentences counted from 0
        text(ws, "Again.")
        done(ws)
        events, audio, end = utterance(ws)
        assert events[0]["sentence_index"] == 0 and events[0]["sentence_text"] == "Again."
        assert events[0]["utterance_index"] == 1
        assert end == {"type": "session.done", "utterance_index": 1, "total_sentences": 1}


def test_closing_the_socket_aborts_the_utterance(live):
    with connect(ws_url(live)) as ws:
        configure(ws, response_format="pcm", stream_audio=True)
        text(ws, LONG)
        assert event(ws)["type"] == "audio.start"
        assert isinstance(recv(ws), bytes)
        assert live.pipeline.stats().in_flight == 1
    wait_for(lambda: live.pipeline.stats().in_flight == 0)
    live.wait_idle()
    assert_released(live.pipeline.stats())


def test_many_utterances_on_one_socket(live):
    with connect(ws_url(live)) as ws:
        configure(ws, response_format="pcm", max_new_tokens=4)  # audio for each: a few frames
        for n in range(5):
            text(ws, f"Utterance {n}. Second ")
            text(ws, "sentence!")
            done(ws)
            events, audio, end = utterance(ws)
            assert end == {"type": "session.done", "utterance_index": n, "total_sentences": 2}
            assert [e["sentence_index"] for e in events] == [0, 0, 1, 1]
            assert events[2]["sentence_text"] == "Second sentence!"
            assert all(audio[i] > 0 for i in (0, 1))
        configure(ws, response_format="wav", voice="ryan")  # reconfigured between utterances
        text(ws, "Now as ryan.")
        done(ws)
        events, audio, _ = utterance(ws)
        assert events[0]["format"] == "wav"


def test_metrics_count_sessions(live):

    with connect(ws_url(live)) as ws:
        configure(ws)
        text(ws, "Counted.")
        done(ws)
        utterance(ws)
        metrics = httpx.get(f"{live.url}/metrics").text
        assert "omniflow_ws_sessions_open 1.0" in metrics
    assert 'omniflow_ws_utterances_total{outcome="done"}' in metrics
    assert 'omniflow_ws_sentences_total{outcome="ok"}' in metrics


def test_rapid_barge_in_keeps_the_events_paired(live):
    """Cancels at every moment of an utterance (before its first sentence is submitted,
    while it speaks, between sentences): every audio.start gets its audio.done, every
    cancel one session.done, and nothing is left running."""
    with connect(ws_url(live)) as ws:
        configure(ws, response_format="pcm", stream_audio=True)
        for n in range(12):
            text(ws, "One. Two. Three. " if n % 2 else LONG)
            if n % 3 == 0:
                done(ws)
            ws.send(json.dumps({"type": "input.cancel"}))
            open_index: int | None = None
            while True:
                message = recv(ws)
                if isinstance(message, bytes):
                    assert open_index is not None
                    continue
                ev = json.loads(message)
                if ev["type"] == "audio.start":
                    assert open_index is None
                    open_index = ev["sentence_index"]
                elif ev["type"] == "audio.done":
                    assert ev["sentence_index"] == open_index
                    open_index = None
                else:
                    assert ev["type"] == "session.done", ev
                    assert open_index is None
                    if ev.get("cancelled"):
                        break
        wait_for(lambda: live.pipeline.stats().in_flight == 0)
        text(ws, "Still clean.")
        done(ws)
        events, _, end = utterance(ws)
        assert end["type"] == "session.done" and end["total_sentences"] == 1
        assert end["utterance_index"] > 0 and "cancelled" not in end
        assert events[0]["sentence_index"] == 0
    live.wait_idle()
    assert_released(live.pipeline.stats())


def test_an_error_quoting_a_lone_surrogate_is_sent(live):
    with connect(ws_url(live)) as ws:
        ws.send('{"type": "session.config", "voice": "\\ud800"}')
        err = event(ws)
        assert err["param"] == "voice" and "unknown voice" in err["message"]
        ws.send('{"type": "session.config", "\\ud800": 1}')  # a field name pydantic refuses
        err = event(ws)
        assert err["type"] == "error" and err["message"].startswith("Input should be")
        configure(ws)
        ws.send('{"type": "input.text", "text": "bad \\ud800"}')
        assert "lone surrogate" in event(ws)["message"]


def test_session_close_ends_the_connection(live):
    """vLLM-Omni's `session.close`: the server closes the socket."""
    from websockets.exceptions import ConnectionClosedOK

    with connect(ws_url(live)) as ws:
        configure(ws, response_format="pcm")
        text(ws, "Hello there.")
        done(ws)
        _, _, end = utterance(ws)
        assert end["total_sentences"] == 1
        ws.send(json.dumps({"type": "session.close"}))
        with pytest.raises(ConnectionClosedOK):
            recv(ws)


def test_config_while_input_is_buffered_is_refused_and_the_text_kept(live):
    with connect(ws_url(live)) as ws:
        configure(ws, response_format="pcm")
        text(ws, "Hello there")  # no sentence end yet: buffered
        ws.send(json.dumps({"type": "session.config", "voice": "ryan"}))
        err = event(ws)
        assert err["type"] == "error" and "while input is buffered" in err["message"]
        done(ws)
        events, _, end = utterance(ws)
        assert events[0]["sentence_text"] == "Hello there" and end["total_sentences"] == 1


def test_vllm_omni_field_names_are_taken(live):
    """`initial_codec_chunk_frames` is vLLM-Omni's name for initial_chunk_frames."""
    with connect(ws_url(live)) as ws:
        configure(ws, response_format="pcm", initial_codec_chunk_frames=2)
        text(ws, "Hello there.")
        done(ws)
        events, audio, end = utterance(ws)
        assert end["total_sentences"] == 1 and audio[0] > 0


def test_a_text_frame_that_is_not_utf8_closes_1007_with_one_warning(live, caplog):
    """uvicorn logged the decoder's traceback at ERROR for each such frame (a client could
    fill the log at will); now one WARNING line, and the client is closed 1007 as before."""
    from websockets.exceptions import ConnectionClosed

    caplog.set_level("WARNING")
    with connect(ws_url(live)) as ws:
        ws.send(b"\xff\xfe not utf-8", text=True)
        with pytest.raises(ConnectionClosed) as closed:
            ws.recv(timeout=10)
    assert closed.value.rcvd is not None and closed.value.rcvd.code == 1007
    lines = [r for r in caplog.records if r.name == "uvicorn.error"]
    assert [(r.levelname, r.getMessage()) for r in lines] == [
        ("WARNING", "a WebSocket client sent a text frame that is not UTF-8: closed (1007)")
    ]
    assert all(r.exc_info is None for r in lines)
