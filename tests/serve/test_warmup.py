"""`server.warmup_frames`: one request through the pipeline before the server accepts
connections (serve/warmup.py), resolved per platform and model, refused on a Base model."""

from __future__ import annotations

import dataclasses

import httpx
import pytest

from omniflow.build.pipeline import build_pipeline
from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from omniflow.config.server import ServerConfig
from omniflow.errors import ConfigError
from omniflow.serve.run import ServerThread
from omniflow.serve.warmup import (
    CUDA_FRAMES,
    WarmupError,
    run_warmup,
    warmup_frames,
    warmup_request,
)
from tests.serve.conftest import LiveServer
from tests.serve.fake_pipeline import FakePipeline


def resolved(*overrides: str) -> int:
    spec = compose(list(overrides))
    return warmup_frames(spec.server, build_graph(spec))


def test_null_is_none_on_the_cpu_and_a_number_is_taken_as_set():
    assert resolved("platform=cpu") == 0
    assert resolved("platform=cpu", "server.warmup_frames=5") == 5
    assert resolved("platform=cpu", "server.warmup_frames=0") == 0


def test_null_warms_up_on_cuda_but_not_a_base_model():
    spec = compose(["platform=cpu"])
    graph = build_graph(spec)
    cuda = graph.platform.model_copy(update={"name": "cuda"})
    on_cuda = dataclasses.replace(graph, platform=cuda)
    assert warmup_frames(spec.server, on_cuda) == CUDA_FRAMES
    base_spec = compose(["platform=cpu", "model=qwen3_tts_tiny_base"])
    base = build_graph(base_spec)
    base_on_cuda = dataclasses.replace(base, platform=cuda)
    assert warmup_frames(base_spec.server, base_on_cuda) == 0


def test_a_base_model_refuses_a_warmup_it_cannot_make():
    with pytest.raises(ConfigError) as err:
        build_graph(
            compose(["platform=cpu", "model=qwen3_tts_tiny_base", "server.warmup_frames=4"])
        )
    assert err.value.key == "server.warmup_frames" and "reference" in str(err.value)


def test_the_request_fits_a_designed_voice_and_a_preset_speaker():
    design = build_graph(compose(["platform=cpu", "model=qwen3_tts_tiny_voicedesign"]))
    preset = build_graph(compose(["platform=cpu"]))
    for graph, voiced in ((design, False), (preset, True)):
        pipeline = build_pipeline(graph)
        pipeline.start()
        try:
            request = warmup_request(pipeline.info(), 3)
            assert (request.voice is not None) is voiced
            done = run_warmup(pipeline, 3)  # served to its end: the model accepts it
            assert done.frames == 3 and done.first_audio_s is not None
        finally:
            pipeline.stop()


def test_the_server_runs_it_before_ready_and_counts_no_request():
    with LiveServer("server.warmup_frames=4") as server:
        (stage,) = server.pipeline.stats().stages
        assert stage.prefills is not None and stage.prefills.steps == 1  # before any client
        metrics = httpx.get(f"{server.url}/metrics", timeout=30).text
        counted = [
            line
            for line in metrics.splitlines()
            if line.startswith("omniflow_requests_total{") and not line.endswith(" 0.0")
        ]
        assert counted == []
    with LiveServer() as cold:  # null on the CPU: nothing ran
        (stage,) = cold.pipeline.stats().stages
        assert stage.prefills is not None and stage.prefills.steps == 0


def test_a_failed_warmup_stops_the_start():
    pipeline = FakePipeline()
    pipeline.fail_next("the device fell over")
    pipeline.start()
    try:
        with pytest.raises(WarmupError, match="the device fell over"):
            run_warmup(pipeline, 2)
    finally:
        pipeline.stop()


def test_a_stuck_warmup_is_aborted_and_stops_the_start():
    pipeline = FakePipeline()
    pipeline.gate.clear()  # requests are admitted and never advance
    pipeline.start()
    try:
        with pytest.raises(WarmupError, match="did not end within 0.2 s"):
            run_warmup(pipeline, 2, timeout_s=0.2)
        assert pipeline.stats().in_flight == 0  # aborted, not left running
    finally:
        pipeline.gate.set()
        pipeline.stop()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")  # exit 3
def test_a_failed_start_stops_the_engines_it_started():
    pipeline = FakePipeline()
    pipeline.fail_next("the device fell over")
    with (
        pytest.raises(RuntimeError, match="did not start"),
        ServerThread(pipeline, ServerConfig(), warmup=2),
    ):
        pass
    assert pipeline.stopped


def test_a_base_model_has_no_warmup_request():
    info = dataclasses.replace(FakePipeline().info(), task_types=("Base",))
    with pytest.raises(WarmupError, match="no warm-up request"):
        warmup_request(info, 4)


def test_the_frames_reported_are_those_made():
    graph = build_graph(
        compose(["platform=cpu", "pipeline.stages.talker.scheduler.max_model_len=64"])
    )
    pipeline = build_pipeline(graph)
    pipeline.start()
    try:
        done = run_warmup(pipeline, 200)  # the model's length ends it first
    finally:
        pipeline.stop()
    assert 0 < done.frames < 64
