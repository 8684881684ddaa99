"""The speech API's edges over real HTTP on loopback: an error before any audio, a refused
first chunk, a client that leaves, the window counters and style instructions (`test_api.py`:
the formats, concurrent streams and bad input)."""

from __future__ import annotations

import httpx
import pytest

from tests.serve.conftest import assert_released
from tests.serve.test_api import MODEL


def speak(url: str, frames: int, text: str = "x", **extra) -> httpx.Response:
    """One PCM request of `frames` frames (EOS ignored) to the server at `url`."""
    body = {"model": MODEL, "voice": "vivian", "input": text, "response_format": "pcm"}
    body |= {"max_new_tokens": frames, "ignore_eos": True, **extra}
    return httpx.post(url + "/v1/audio/speech", timeout=60, json=body)


def test_error_before_any_audio_is_a_json_error_not_an_empty_200():
    from omniflow.config.compose import compose
    from omniflow.serve.run import ServerThread
    from tests.serve.fake_pipeline import FakePipeline

    # A stage ends the request with an error before any audio exists (the real pipeline
    # now refuses the chunk sizes that used to do this at submit, see the next test).
    pipeline = FakePipeline()
    with ServerThread(pipeline, compose(["platform=cpu"]).server) as server:
        for stream in (False, True):
            pipeline.fail_next("chunk of 160 tokens exceeds the stage's whole per-step budget")
            r = speak(server.url, 30, stream=stream)
            assert r.status_code == 500
            assert "budget" in r.json()["error"]["message"]
        ok = speak(server.url, 3)
        assert ok.status_code == 200 and len(ok.content) == 3 * 1920 * 2
        metrics = httpx.get(server.url + "/metrics").text
        assert 'omniflow_requests_total{outcome="error"} 2.0' in metrics


def test_two_stage_pipeline_refuses_an_oversized_first_chunk_and_reports_its_gauges():
    from tests.serve.conftest import LiveServer

    # code2wav's whole budget is 4 frames; a first chunk of 10 can never run: refused
    # before anything is queued, and the server keeps serving.
    with LiveServer(
        "pipeline=qwen3_tts",
        "pipeline.stages.code2wav.scheduler.max_num_batched_tokens=64",
        "pipeline.stages.code2wav.upstream.chunk_frames=4",
    ) as server:
        body = {
            "model": MODEL,
            "voice": "vivian",
            "input": "x",
            "response_format": "pcm",
            "max_new_tokens": 30,
            "ignore_eos": True,
        }
        for stream in (False, True):
            r = httpx.post(
                server.url + "/v1/audio/speech",
                timeout=60,
                json={**body, "stream": stream, "initial_chunk_frames": 10},
            )
            assert r.status_code == 400
            assert "initial_chunk_frames" in r.json()["error"]["message"]
        ok = httpx.post(
            server.url + "/v1/audio/speech",
            timeout=60,
            json={**body, "initial_chunk_frames": 2, "max_new_tokens": 3},
        )
        assert ok.status_code == 200 and len(ok.content) == 3 * 1920 * 2
        server.wait_idle()
        metrics = httpx.get(server.url + "/metrics").text
        assert 'omniflow_requests_total{outcome="rejected"} 2.0' in metrics
        # code2wav has a decoder but no KV cache: only the series it has
        assert 'omniflow_decoder_slots_in_use{stage="code2wav"} 0.0' in metrics
        assert 'omniflow_kv_blocks_in_use{stage="talker"} 0.0' in metrics
        assert 'omniflow_kv_blocks_in_use{stage="code2wav"}' not in metrics
        assert 'omniflow_decoder_slots_in_use{stage="talker"}' not in metrics


def _abort_count(live) -> float:
    for line in httpx.get(live.url + "/metrics").text.splitlines():
        if line.startswith('omniflow_requests_total{outcome="abort"}'):
            return float(line.split()[-1])
    raise AssertionError("abort series missing")


def test_client_gone_during_a_whole_response_aborts_the_request(live):
    before = _abort_count(live)
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(
            live.url + "/v1/audio/speech",
            timeout=0.5,
            json={
                "model": MODEL,
                "voice": "vivian",
                "input": "A long one.",
                "response_format": "wav",
                "max_new_tokens": 3000,
                "ignore_eos": True,
            },
        )
    live.wait_idle()
    assert _abort_count(live) == before + 1
    assert_released(live.pipeline.stats())


def talker_counter(metrics: str, name: str) -> float:
    """The talker stage's sample of counter `name` in a /metrics text (it must be there)."""
    prefix = f'{name}{{stage="talker"}} '
    lines = [ln for ln in metrics.splitlines() if ln.startswith(prefix)]
    assert lines, f"{name} is not on /metrics"
    return float(lines[0].split()[-1])


def test_window_counters_on_metrics_only_with_windows_or_a_playback_clock(live):
    from tests.serve.conftest import LiveServer

    # the CPU default: no windows, but the playback clock (arrivals prefilled alone)
    text = httpx.get(live.url + "/metrics").text
    assert 'omniflow_window_planned_total{stage="talker"} 0.0' in text
    assert 'omniflow_window_arrival_steps_total{stage="talker"}' in text
    with LiveServer("pipeline.stages.talker.playback_margin_ms=null") as server:
        assert "omniflow_window" not in httpx.get(server.url + "/metrics").text
    with LiveServer(
        "pipeline.stages.talker.window_k=8", "pipeline.stages.talker.playback_margin_ms=null"
    ) as server:
        r = speak(server.url, 30, "windows")
        assert r.status_code == 200 and len(r.content) == 30 * 1920 * 2
        text = httpx.get(server.url + "/metrics").text
        assert talker_counter(text, "omniflow_window_planned_total") > 0
        assert "omniflow_window_steps_total" in text
        assert 'omniflow_window_cut_total{stage="talker"} 0.0' in text  # one request: no arrival
        assert 'omniflow_window_arrival_steps_total{stage="talker"} 0.0' in text


def test_held_audio_is_served_whole_and_its_cycles_counted():
    from tests.serve.conftest import LiveServer

    with LiveServer(
        "pipeline.stages.talker.audio_pass_steps=4",
        "pipeline.stages.talker.playback_margin_ms=null",
    ) as server:
        r = speak(server.url, 30, "held")
        assert r.status_code == 200 and len(r.content) == 30 * 1920 * 2
        text = httpx.get(server.url + "/metrics").text
        cycles = talker_counter(text, "omniflow_window_audio_cycles_total")
        assert cycles >= 7  # 29 single steps after the prefill


def test_instructions_change_the_prompt_and_are_refused_where_unsupported(live):
    body = {
        "model": MODEL,
        "voice": "vivian",
        "input": "Styled.",
        "response_format": "pcm",
        "seed": 5,
        "max_new_tokens": 6,
        "ignore_eos": True,
    }
    plain = httpx.post(live.url + "/v1/audio/speech", json=body, timeout=60)
    styled = httpx.post(
        live.url + "/v1/audio/speech",
        timeout=60,
        json={**body, "instructions": "Speak slowly and warmly."},
    )
    again = httpx.post(
        live.url + "/v1/audio/speech",
        timeout=60,
        json={**body, "instructions": "Speak slowly and warmly."},
    )
    assert plain.status_code == styled.status_code == 200
    assert len(styled.content) == len(plain.content) == 6 * 1920 * 2
    assert styled.content != plain.content and styled.content == again.content

    from tests.serve.conftest import LiveServer

    with LiveServer("model.supports_instructions=false") as server:
        r = httpx.post(
            server.url + "/v1/audio/speech", timeout=30, json={**body, "instructions": "Whisper."}
        )
        assert r.status_code == 400 and r.json()["error"]["param"] == "instructions"
