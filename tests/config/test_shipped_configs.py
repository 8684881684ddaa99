"""Every shipped config composes and validates (one test covers them all)."""

from __future__ import annotations

import itertools

import pytest

from omniflow.config.compose import CONF_DIR, compose
from omniflow.config.resolve import build_graph
from omniflow.errors import ConfigError
from omniflow.platforms.base import module_available


def options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF_DIR / group).glob("*.yaml"))


PIPELINES = options("pipeline")
PLATFORMS = options("platform")
EXPERIMENTS = [None, *options("experiment")]
MODELS = options("model")


def test_the_shipped_groups_are_the_expected_ones():
    assert PIPELINES == ["qwen3_tts", "qwen3_tts_fused"]
    assert PLATFORMS == ["auto", "cpu", "cuda", "npu"]
    assert set(EXPERIMENTS) == {None, "high_concurrency", "window_k12"}
    assert MODELS == [
        "qwen3_tts_0_6b",
        "qwen3_tts_0_6b_base",
        "qwen3_tts_1_7b",
        "qwen3_tts_1_7b_base",
        "qwen3_tts_1_7b_voicedesign",
        "qwen3_tts_tiny",
        "qwen3_tts_tiny_base",
        "qwen3_tts_tiny_voicedesign",
    ]


@pytest.mark.parametrize(
    ("pipeline", "platform", "experiment"),
    list(itertools.product(PIPELINES, PLATFORMS, EXPERIMENTS)),
)
def test_every_pipeline_platform_experiment_builds(pipeline, platform, experiment):
    overrides = [f"pipeline={pipeline}", f"platform={platform}"]
    if experiment:
        overrides.append(f"experiment={experiment}")
    spec = compose(overrides)
    if platform == "npu" and not module_available("torch_npu"):
        with pytest.raises(ConfigError) as exc:
            build_graph(spec)
        assert exc.value.key == "platform.name"
        assert "torch_npu" in str(exc.value)
        return
    graph = build_graph(spec)
    final = graph.stages[graph.final_stage]
    assert final.output == "audio"
    if experiment == "window_k12":
        assert graph.stages["talker"].window_k == 12
    if experiment == "high_concurrency":
        sched = graph.stages["talker"].scheduler
        assert sched.max_num_seqs == 128
        held = (pipeline, platform) == ("qwen3_tts_fused", "cuda")  # where windows run
        assert (sched.arrival_hold_ms, sched.arrival_hold_min_running) == (
            (120, 96) if held else (0, 1)
        )
        assert spec.server.max_first_audio_wait_s == 0.3  # the base default is 0.5
    elif experiment is None:
        assert graph.stages["talker"].scheduler.arrival_hold_ms == 0
    # the shipped null: the engine in a process of its own on CUDA, in this one elsewhere
    assert graph.runtime == ("process" if graph.platform.name == "cuda" else "in_process")


@pytest.mark.parametrize("model", MODELS)
def test_every_model_preset_builds(model):
    graph = build_graph(compose([f"model={model}", "platform=cpu"]))
    assert graph.model.load == "dummy"
    assert graph.model.codec.sliding_window == 72


def test_real_presets_have_the_published_shapes():
    big = compose(["model=qwen3_tts_1_7b"]).model
    small = compose(["model=qwen3_tts_0_6b"]).model
    assert (big.talker.num_layers, big.talker.hidden_size) == (28, 2048)
    assert (small.talker.num_layers, small.talker.hidden_size) == (28, 1024)
    for m in (big, small):
        assert (m.talker.num_heads, m.talker.num_kv_heads, m.talker.head_dim) == (16, 8, 128)
        assert (m.code_predictor.num_layers, m.code_predictor.hidden_size) == (5, 1024)
        assert m.codec.num_layers == 8 and m.codec.hidden_size == 512


def test_defaults_are_the_embedded_default():
    graph = build_graph(compose(["platform=cpu"]))
    assert graph.pipeline == "qwen3_tts_fused"
    assert graph.model.name == "qwen3-tts-tiny"
    assert list(graph.stages) == ["talker"]


def test_high_concurrency_raises_every_stage_of_the_two_stage_pipeline():
    graph = build_graph(
        compose(["pipeline=qwen3_tts", "platform=cpu", "experiment=high_concurrency"])
    )
    seqs = {name: stage.scheduler.max_num_seqs for name, stage in graph.stages.items()}
    assert seqs == {"talker": 128, "code2wav": 128}
    receiver = graph.stages["code2wav"].scheduler
    assert receiver.max_num_batched_tokens == 8192  # 4x the shipped 2048, as the talker's
    assert receiver.async_scheduling


def test_high_concurrency_still_composes_with_the_fused_pipeline():
    graph = build_graph(
        compose(["pipeline=qwen3_tts_fused", "platform=cpu", "experiment=high_concurrency"])
    )
    assert list(graph.stages) == ["talker"]
    talker = graph.stages["talker"]
    assert talker.stream_decode and talker.scheduler.max_num_seqs == 128
    assert talker.scheduler.max_num_batched_tokens == 8192


def test_the_fused_pipeline_schedules_asynchronously_by_default():
    """Planning step n+1 while step n runs, with the step's audio waited for after it
    (measured on the H200: docs/performance.md); the two-stage talker stays sync."""
    fused = build_graph(compose(["pipeline=qwen3_tts_fused", "platform=cpu"]))
    assert fused.stages["talker"].scheduler.async_scheduling
    two = build_graph(compose(["pipeline=qwen3_tts", "platform=cpu"]))
    assert not two.stages["talker"].scheduler.async_scheduling


def test_the_high_concurrency_hold_says_where_it_comes_from_and_how_to_turn_it_off():
    """A user who never set a hold meets it under experiment=high_concurrency on
    platform=cuda (conf/hold/): an override it cannot act with is refused naming the group
    and the keys that turn it off, and those keys build."""
    base = ["pipeline=qwen3_tts_fused", "platform=cuda", "experiment=high_concurrency"]
    sched = "pipeline.stages.talker.scheduler"
    for extra in (["pipeline.stages.talker.window_k=0"], [f"{sched}.max_num_seqs=64"]):
        with pytest.raises(ConfigError) as exc:
            build_graph(compose(base + extra))
        assert "conf/hold/high_concurrency_cuda.yaml" in str(exc.value)
        off = [f"{sched}.arrival_hold_ms=0", f"{sched}.arrival_hold_min_running=1"]
        assert " ".join(off) in str(exc.value)
        graph = build_graph(compose(base + extra + off))
        assert graph.stages["talker"].scheduler.arrival_hold_ms == 0
