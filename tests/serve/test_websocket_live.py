"""WS /v1/audio/speech/stream in incremental mode (`"incremental": true`, serve/ws_live.py)
over a real WebSocket client against a real server (tiny model, CPU): audio before
input.done, the same audio as the whole text in the streaming layout, barge-in on a
text-starved utterance, and the idle timeout while the server waits for text."""

from __future__ import annotations

import json

import httpx
import pytest
from websockets.sync.client import connect

from tests.serve.conftest import LiveServer, assert_released
from tests.serve.test_websocket import configure, done, event, recv, text, ws_url

WORDS = ["Streaming ", "text ", "as it ", "is written, ", "word by word."]
SETTINGS = {"voice": "vivian", "seed": 7, "max_new_tokens": 48, "ignore_eos": True}


@pytest.fixture(scope="module")
def live():
    with LiveServer("server.ws_idle_timeout_s=3") as server:
        yield server


def test_audio_comes_before_the_text_is_done_and_equals_the_whole_text(live):
    with connect(ws_url(live)) as ws:
        configure(ws, incremental=True, stream_audio=True, response_format="pcm", **SETTINGS)
        text(ws, WORDS[0] + WORDS[1])
        start = event(ws)
        assert start["type"] == "audio.start" and start["sentence_index"] == 0
        assert start["sentence_text"] == "Streaming text "  # what had arrived
        audio = [recv(ws)]  # audio while the rest of the text is still unsent
        assert isinstance(audio[0], bytes) and audio[0]
        for word in WORDS[2:]:
            text(ws, word)
        done(ws)
        while isinstance(message := recv(ws), bytes):
            audio.append(message)
        end = json.loads(message)
        assert end["type"] == "audio.done" and end["error"] is False
        assert end["total_bytes"] == sum(map(len, audio))
        assert event(ws) == {"type": "session.done", "utterance_index": 0, "total_sentences": 1}
    body = {"model": live.pipeline.info().model, "input": "".join(WORDS)}
    body |= {"response_format": "pcm", "non_streaming_mode": False}
    whole = httpx.post(f"{live.url}/v1/audio/speech", json=body | SETTINGS, timeout=60)
    assert whole.status_code == 200, whole.text
    assert b"".join(audio) == whole.content  # the same codes, the same audio
    live.wait_idle()
    assert_released(live.pipeline.stats())


def test_cancel_frees_an_utterance_waiting_for_text_and_the_next_starts_clean(live):
    with connect(ws_url(live)) as ws:
        configure(ws, incremental=True, stream_audio=True, response_format="pcm", **SETTINGS)
        text(ws, "Waiting for more ")
        assert event(ws)["type"] == "audio.start"
        assert isinstance(recv(ws), bytes)  # it runs, then starves: the rest never comes
        ws.send(json.dumps({"type": "input.cancel"}))
        while isinstance(message := recv(ws), bytes):
            pass
        assert json.loads(message)["type"] == "audio.done"
        assert event(ws)["type"] == "session.done"
        live.wait_idle()
        assert_released(live.pipeline.stats())
        text(ws, "A new one.")
        done(ws)
        start = event(ws)
        assert start["utterance_index"] == 1 and start["sentence_text"] == "A new one."


def test_a_session_waiting_for_text_times_out(live):
    with connect(ws_url(live)) as ws:
        configure(ws, incremental=True, response_format="pcm", **SETTINGS)
        text(ws, "Then silence ")
        messages = []
        while True:  # bounded by the 3 s idle timeout (recv's own bound is 30 s)
            message = recv(ws)
            if isinstance(message, str) and json.loads(message)["type"] == "error":
                break
            messages.append(message)
        assert "Idle timeout" in json.loads(message)["message"]
    live.wait_idle()
    assert_released(live.pipeline.stats())


def test_one_word_and_done_is_spoken_whole(live):
    with connect(ws_url(live)) as ws:
        configure(ws, incremental=True, response_format="pcm", **SETTINGS)
        text(ws, "Yes.")  # no whole word yet: nothing starts before input.done
        done(ws)
        start = event(ws)
        assert start["type"] == "audio.start" and start["sentence_text"] == "Yes."
        assert isinstance(recv(ws), bytes)
        end = event(ws)
        assert end["type"] == "audio.done" and end["error"] is False
        assert event(ws)["type"] == "session.done"


def tail_series(live: LiveServer) -> tuple[float, float, float]:
    """(count, seconds sum, frames sum) of the incremental utterances' text tail."""
    values = {}
    for line in httpx.get(live.url + "/metrics").text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.partition(" ")
            values[name] = float(value)
    return (
        values["omniflow_ws_text_tail_seconds_count"],
        values["omniflow_ws_text_tail_seconds_sum"],
        values["omniflow_ws_text_tail_frames_sum"],
    )


def test_the_speech_after_the_text_ended_is_timed_for_incremental_utterances_only(live):
    """/metrics' omniflow_ws_text_tail_*: an utterance that grew word by word adds one
    observation (its frames after the end of its text: fewer than all 48, more than 0); one
    whose text all came before it started is a whole request and adds none."""
    before = tail_series(live)
    with connect(ws_url(live)) as ws:
        configure(ws, incremental=True, stream_audio=True, response_format="pcm", **SETTINGS)
        text(ws, WORDS[0] + WORDS[1])
        assert event(ws)["type"] == "audio.start"
        for word in WORDS[2:]:
            text(ws, word)
        done(ws)
        while isinstance(message := recv(ws), bytes):
            pass
        assert json.loads(message)["type"] == "audio.done"
        assert event(ws)["type"] == "session.done"
        grown = tail_series(live)
        assert grown[0] == before[0] + 1 and grown[1] > before[1]
        assert 0 < grown[2] - before[2] < SETTINGS["max_new_tokens"]
        text(ws, "Yes.")
        done(ws)
        while not (isinstance(m := recv(ws), str) and json.loads(m)["type"] == "session.done"):
            pass
        assert tail_series(live) == grown


def test_an_incremental_utterance_with_nothing_to_say_is_skipped(live):
    """As in sentence mode: text with no visible character (whitespace, zero-width spaces)
    starts no request; input.done answers with an empty session.done, and the session goes on."""
    with connect(ws_url(live)) as ws:
        configure(ws, incremental=True, stream_audio=True, response_format="pcm", **SETTINGS)
        text(ws, "\u200b\u200b ")
        done(ws)
        assert event(ws) == {"type": "session.done", "utterance_index": 0, "total_sentences": 0}
        text(ws, "Now something. ")
        done(ws)
        assert event(ws)["type"] == "audio.start"
        while isinstance(message := recv(ws), bytes):
            pass
        assert json.loads(message)["type"] == "audio.done" and not json.loads(message)["error"]
        assert event(ws)["type"] == "session.done"
