"""Each build-time rule (docs/architecture.md) has an accepted and a refused case."""

from __future__ import annotations

from dataclasses import replace

import pytest

from omniflow.config.compose import compose
from omniflow.config.graph import StageGraph
from omniflow.config.resolve import build_graph
from omniflow.config.stage_rules import resolve_ref_context
from omniflow.core.capabilities import ARCH_CAPABILITIES
from omniflow.errors import ConfigError, ConfigErrors

FUSED = ["pipeline=qwen3_tts_fused", "platform=cpu"]
TWO = ["pipeline=qwen3_tts", "platform=cpu"]


def graph(*overrides: str) -> StageGraph:
    return build_graph(compose(list(overrides)))


def refused(*overrides: str) -> ConfigError:
    with pytest.raises(ConfigError) as exc:
        graph(*overrides)
    return exc.value


def keys_of(err: ConfigError) -> list[str]:
    return [e.key for e in err.errors] if isinstance(err, ConfigErrors) else [err.key]


# ----------------------------------------------------------------------------- window_k


@pytest.mark.parametrize("k", [0, 2, 8, 16])
def test_window_k_accepted_values(k):
    assert graph(*FUSED, f"pipeline.stages.talker.window_k={k}").stages["talker"].window_k == k


@pytest.mark.parametrize("k", [1, 17, -1])
def test_window_k_refused_values(k):
    err = refused(*TWO, f"pipeline.stages.talker.window_k={k}")
    assert err.key == "pipeline.stages.talker.window_k"
    assert "2..16" in err.reason


def test_window_k_refused_on_a_generation_stage():
    err = refused(*TWO, "+pipeline.stages.code2wav.window_k=4")
    assert "pipeline.stages.code2wav.window_k" in keys_of(err)
    assert "kind 'ar'" in str(err)


@pytest.mark.parametrize(
    ("key", "value", "reason"),
    [
        ("enable_prefix_caching", "true", "prefix caching is not implemented"),
        ("tensor_parallel_size", "2", "only 1 is supported"),
        ("pipeline_parallel_size", "2", "only 1 is supported"),
        ("speculative_tokens", "2", "speculative decoding is not implemented"),
    ],
)
def test_an_unimplemented_option_is_one_error_not_one_per_rule_it_would_break(key, value, reason):
    """Refused on its own: windows and stream decode (on by default) do not refuse it again."""
    err = refused(
        *FUSED, "pipeline.stages.talker.window_k=4", f"+pipeline.stages.talker.{key}={value}"
    )
    assert keys_of(err) == [f"pipeline.stages.talker.{key}"] and reason in str(err)


@pytest.mark.parametrize(
    ("overrides", "k"),
    [
        (("pipeline=qwen3_tts_fused", "platform=cuda"), 8),  # the shipped null, on the GPU
        (("pipeline=qwen3_tts_fused", "platform=cuda", "platform.cuda_graphs=false"), 0),
        (tuple(FUSED), 0),  # the CPU
        (("pipeline=qwen3_tts_fused", "platform=cuda", "pipeline.stages.talker.window_k=0"), 0),
        (("pipeline=qwen3_tts", "platform=cuda", "pipeline.stages.talker.window_k=null"), 8),
    ],
)
def test_window_k_null_is_8_where_cuda_graphs_are_captured(overrides, k):
    assert graph(*overrides).stages["talker"].window_k == k


def test_window_k_null_stays_off_where_a_stage_cannot_take_windows():
    g = graph("pipeline=qwen3_tts", "platform=cuda", "+pipeline.stages.code2wav.window_k=null")
    assert g.stages["code2wav"].window_k == 0  # a generation stage


def test_window_k_is_per_stage_never_inherited():
    g = graph(*TWO, "pipeline.stages.talker.window_k=8")
    assert g.stages["talker"].window_k == 8
    assert g.stages["code2wav"].window_k == 0


# ------------------------------------------------------------------------- audio_chunk_frames

CHUNK = "pipeline.stages.talker.audio_chunk_frames"


@pytest.mark.parametrize(("k", "c"), [(8, 4), (8, 2), (16, 8), (4, 2), (8, 8), (5, 5)])
def test_audio_chunk_frames_accepted_values(k, c):
    g = graph(*FUSED, f"pipeline.stages.talker.window_k={k}", f"{CHUNK}={c}")
    assert g.stages["talker"].audio_chunk_frames == c


def test_audio_chunk_frames_takes_the_resolved_window():
    """The fused pipeline's `window_k: null` is 8 on CUDA with graphs: chunks of 4 fit it;
    without graphs it is 0, and the refusal says why."""
    cuda = ("pipeline=qwen3_tts_fused", "platform=cuda", f"{CHUNK}=4")
    assert graph(*cuda).stages["talker"].audio_chunk_frames == 4
    err = refused(*cuda, "platform.cuda_graphs=false")
    assert err.key == CHUNK and "null is 8 only where CUDA graphs are captured" in err.reason


def test_audio_chunk_frames_unset_resolves_to_zero_where_no_stage_decodes_on_cuda():
    g = graph(*TWO, "pipeline.stages.talker.window_k=8")
    assert g.stages["talker"].audio_chunk_frames == 0
    assert g.stages["code2wav"].audio_chunk_frames == 0
    # the two-stage talker decodes no audio of its own, even on CUDA
    g = graph("pipeline=qwen3_tts", "platform=cuda", "pipeline.stages.talker.window_k=8")
    assert g.stages["talker"].audio_chunk_frames == 0
    # windows on the CPU: no second stream to decode on
    assert (
        graph(*FUSED, "pipeline.stages.talker.window_k=8").stages["talker"].audio_chunk_frames == 0
    )


@pytest.mark.parametrize(("k", "c"), [(None, 8), (4, 4), (16, 16), (0, 0)])
def test_audio_chunk_frames_unset_is_the_window_on_cuda(k, c):
    """On CUDA with graphs a fused talker's window audio is one pass on the decoder's own
    stream (C = K); no windows, no chunks; `platform.cuda_graphs=false` and an explicit 0
    keep the main stream."""
    cuda = ["pipeline=qwen3_tts_fused", "platform=cuda"]
    if k is not None:
        cuda.append(f"pipeline.stages.talker.window_k={k}")
    assert graph(*cuda).stages["talker"].audio_chunk_frames == c
    assert graph(*cuda, f"{CHUNK}=0").stages["talker"].audio_chunk_frames == 0
    eager = graph(*cuda, "platform.cuda_graphs=false", "pipeline.stages.talker.window_k=4")
    assert eager.stages["talker"].audio_chunk_frames == 0


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ((*FUSED, f"{CHUNK}=4"), "requires window_k >= 2 (window_k is 0)"),
        ((*FUSED, "pipeline.stages.talker.window_k=8", f"{CHUNK}=3"), "a divisor of window_k (8)"),
        ((*FUSED, "pipeline.stages.talker.window_k=8", f"{CHUNK}=16"), "one of [2, 4, 8], got 16"),
        ((*FUSED, "pipeline.stages.talker.window_k=8", f"{CHUNK}=1"), "one of [2, 4, 8], got 1"),
        ((*FUSED, "pipeline.stages.talker.window_k=5", f"{CHUNK}=2"), "one of [5], got 2"),
        ((*TWO, "pipeline.stages.talker.window_k=8", f"{CHUNK}=4"), "requires stream_decode"),
    ],
)
def test_audio_chunk_frames_refused_values(overrides, reason):
    err = refused(*overrides)
    assert err.key == CHUNK and reason in err.reason


def test_audio_chunk_frames_refused_on_a_generation_stage():
    err = refused(*TWO, "+pipeline.stages.code2wav.audio_chunk_frames=4")
    assert "pipeline.stages.code2wav.audio_chunk_frames" in keys_of(err)


# ----------------------------------------------------------------------------- stream_decode


def test_stream_decode_accepted_on_the_final_talker():
    stage = graph(*FUSED).stages["talker"]
    assert stage.stream_decode and stage.output == "audio" and stage.is_final


def test_stream_decode_refused_on_a_talker_that_is_not_final():
    err = refused(*TWO, "pipeline.stages.talker.stream_decode=true")
    assert "pipeline.stages.talker.stream_decode" in keys_of(err)
    assert "final stage" in str(err)


def test_final_talker_without_stream_decode_is_refused():
    err = refused(*FUSED, "pipeline.stages.talker.stream_decode=false")
    assert err.key == "pipeline.stages.talker.stream_decode"
    assert "empty audio" in err.reason


def test_stream_decode_refused_with_another_runtime():
    err = refused(*FUSED, "pipeline.runtime=ray")  # one stage: the one rule that says so
    assert keys_of(err) == ["pipeline.runtime"] and "one stage (fused)" in str(err)


# ----------------------------------------------------------------------------- ref_context_frames


def test_ref_context_frames_unset_stays_unset_without_reference_audio():
    """A CustomVoice model takes no reference audio: nothing to prime."""
    assert graph(*FUSED).stages["talker"].ref_context_frames is None
    assert graph(*TWO).stages["code2wav"].ref_context_frames is None


@pytest.mark.parametrize(
    ("base", "override", "key"),
    [
        (FUSED, "pipeline.stages.talker.ref_context_frames=0", "talker"),
        (FUSED, "pipeline.stages.talker.ref_context_frames=72", "talker"),
        (TWO, "+pipeline.stages.code2wav.ref_context_frames=0", "code2wav"),
    ],
)
def test_ref_context_frames_set_is_refused_on_a_customvoice_model(base, override, key):
    err = refused(*base, override)
    assert err.key == f"pipeline.stages.{key}.ref_context_frames"
    assert "reference" in err.reason and "voice clone" in err.reason


def test_ref_context_frames_where_reference_is_accepted_zero_is_a_real_value():
    """A Base model's decoding stage (fused talker or code2wav): None -> the decoder's
    window, 0 stays 0 (no priming), never collapsed into the fallback."""
    base = "model=qwen3_tts_tiny_base"
    assert graph(*FUSED, base).stages["talker"].ref_context_frames == 72
    assert graph(*TWO, base).stages["code2wav"].ref_context_frames == 72
    zero = graph(*FUSED, base, "pipeline.stages.talker.ref_context_frames=0")
    assert zero.stages["talker"].ref_context_frames == 0
    some = graph(*TWO, base, "+pipeline.stages.code2wav.ref_context_frames=24")
    assert some.stages["code2wav"].ref_context_frames == 24
    assert some.stages["talker"].ref_context_frames is None  # decodes no audio


def test_ref_context_frames_refused_on_an_arch_without_reference_even_on_base():
    spec = compose([*FUSED, "model=qwen3_tts_tiny_base"])
    stage = spec.pipeline.stages["talker"].model_copy(update={"ref_context_frames": 4})
    cap = replace(ARCH_CAPABILITIES["qwen3_tts_talker"], accepts_reference=False)
    errors: list[ConfigError] = []
    assert resolve_ref_context("k", stage, True, cap, spec.model, errors) is None
    assert [e.key for e in errors] == ["k.ref_context_frames"]


def test_ref_context_frames_negative_is_refused():
    err = refused(*FUSED, "pipeline.stages.talker.ref_context_frames=-1")
    assert err.key == "pipeline.stages.talker.ref_context_frames"


def test_ref_context_frames_refused_on_a_stage_without_decoder():
    err = refused(*TWO, "+pipeline.stages.talker.ref_context_frames=10")
    assert err.key == "pipeline.stages.talker.ref_context_frames"
    assert "decodes audio" in err.reason


# ----------------------------------------------------------------------------- atomic_chunks


def test_atomic_chunks_follow_receives_chunks():
    g = graph(*TWO)
    assert g.stages["code2wav"].receives_chunks and g.stages["code2wav"].atomic_chunks
    assert not g.stages["talker"].receives_chunks and not g.stages["talker"].atomic_chunks
    assert g.edges() == [("talker", "code2wav")]


def test_atomic_chunks_cannot_be_set_by_users():
    err = refused(*TWO, "+pipeline.stages.code2wav.atomic_chunks=false")
    assert err.key == "pipeline.stages.code2wav.atomic_chunks"


def test_a_chunk_receiver_needs_an_upstream():
    err = refused(*TWO, "pipeline.stages.code2wav.upstream=null")
    assert "pipeline.stages.code2wav.upstream" in keys_of(err)


def test_upstream_must_name_another_stage():
    err = refused(*TWO, "pipeline.stages.code2wav.upstream.stage=thinker")
    assert err.key == "pipeline.stages.code2wav.upstream.stage"


# ----------------------------------------------------------------------------- chunking


def test_chunking_defaults_and_overrides():
    up = graph(*TWO).stages["code2wav"].upstream
    assert (up.chunk_frames, up.initial_chunk_frames) == (25, 1)
    up = (
        graph(*TWO, "pipeline.stages.code2wav.upstream.chunk_frames=10").stages["code2wav"].upstream
    )
    assert (up.chunk_frames, up.initial_chunk_frames) == (10, 1)


@pytest.mark.parametrize("field", ["chunk_frames", "initial_chunk_frames"])
def test_a_chunk_larger_than_the_receivers_budget_is_refused_at_build_time(field):
    """16 tokens per frame: 128 frames = 2048 tokens fits the default budget, 129 does not."""
    ok = graph(*TWO, f"pipeline.stages.code2wav.upstream.{field}=128")
    assert getattr(ok.stages["code2wav"].upstream, field) == 128
    err = refused(*TWO, f"pipeline.stages.code2wav.upstream.{field}=129")
    assert err.key == f"pipeline.stages.code2wav.upstream.{field}"
    assert "2064 tokens" in err.reason


def test_the_chunk_budget_rule_follows_the_receivers_budget():
    err = refused(*TWO, "pipeline.stages.code2wav.scheduler.max_num_batched_tokens=100")
    assert keys_of(err) == ["pipeline.stages.code2wav.upstream.chunk_frames"]  # 25 x 16 > 100


@pytest.mark.parametrize("field", ["chunk_frames", "initial_chunk_frames"])
def test_chunking_values_below_one_are_refused(field):
    err = refused(*TWO, f"pipeline.stages.code2wav.upstream.{field}=0")
    assert err.key == f"pipeline.stages.code2wav.upstream.{field}"


# ----------------------------------------------------------------------------- platform, model


def test_platform_auto_resolves_to_a_concrete_platform():
    assert graph("platform=auto").platform.name in ("cpu", "cuda")
    assert graph("platform=cpu").platform.dtype == "float32"
    assert graph("platform=cpu", "model.dtype=bfloat16").platform.dtype == "bfloat16"


def test_cuda_graphs_refused_on_cpu():
    err = refused("platform=cpu", "+platform.cuda_graphs=true")
    assert err.key == "platform.cuda_graphs"


def test_cuda_graphs_on_by_default_on_cuda_and_can_be_turned_off():
    assert graph("platform=cuda").platform.cuda_graphs is True
    assert graph("platform=cuda", "platform.cuda_graphs=false").platform.cuda_graphs is False


def test_checkpoint_load_needs_a_path(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    err = refused("platform=cpu", "model.load=checkpoint")
    assert err.key == "model.load"
    assert graph("platform=cpu", f"model.path={tmp_path}").model.load == "checkpoint"


@pytest.mark.parametrize("missing", ["no_such_dir", "empty_dir"])
def test_a_checkpoint_path_without_the_layout_is_refused(tmp_path, missing):
    """A mistyped model.path fails while building the graph (`omniflow config` too), not
    deep in the loader with a traceback."""
    path = tmp_path / missing
    if missing == "empty_dir":
        path.mkdir()
    err = refused("platform=cpu", f"model.path={path}")
    assert err.key == "model.path" and "config.json" in str(err)


def test_kv_pool_must_hold_one_full_request():
    err = refused(*FUSED, "pipeline.stages.talker.scheduler.num_kv_blocks=4")
    assert err.key == "pipeline.stages.talker.scheduler.num_kv_blocks"


def test_unknown_arch_and_wrong_kind_are_refused():
    err = refused(*FUSED, "pipeline.stages.talker.arch=nope")
    assert err.key == "pipeline.stages.talker.arch"
    err = refused(*TWO, "pipeline.stages.code2wav.arch=qwen3_tts_talker")
    assert "pipeline.stages.code2wav.arch" in keys_of(err)


def test_dummy_load_with_a_path_is_refused():
    err = refused("platform=cpu", "model.load=dummy", "model.path=/somewhere")
    assert err.key == "model.path"


# ------------------------------------------------------------------- window_admits, removed


def test_the_removed_window_admits_key_is_refused_by_name():
    """Windows that admit new prompts cost closed-loop throughput and delayed arrivals'
    first audio (docs/performance.md); the key went, and setting it is an error naming it."""
    with pytest.raises(ConfigError) as exc:
        compose([*FUSED, "pipeline.stages.talker.window_admits=true"])
    assert "pipeline.stages.talker.window_admits" in str(exc.value)
    assert "no such key" in str(exc.value)


def test_a_stage_kind_other_than_its_archs_is_one_error():
    """Set on the command line, a kind the arch does not run in is one line naming the key
    (the other kind's schema answered with one error per key it lacks: ten for the talker)."""
    with pytest.raises(ConfigError) as err:
        compose([*FUSED, "pipeline.stages.talker.kind=generation"])
    assert not isinstance(err.value, ConfigErrors)
    assert err.value.key == "pipeline.stages.talker.kind"
    assert "runs in stages of kind 'ar'" in str(err.value)


@pytest.mark.parametrize(
    ("override", "hz"),
    [
        ("model.codec.sample_rate=16000", "24000 Hz"),
        ("model.codec.upsample_rates=[8,5,4,4]", "32000 Hz"),
    ],
)
def test_a_codec_rate_its_upsampling_does_not_make_is_refused(override, hz):
    """The dummy decoder's PCM relabelled at another rate would play at the wrong speed."""
    with pytest.raises(ConfigError, match=f"model.codec.sample_rate: .*: {hz}"):
        build_graph(compose([*FUSED, override]))


def test_a_foreign_kind_comes_with_the_commands_other_errors():
    """The stage is validated as its arch's kind beside the error, so a second mistake in
    the same command is reported with it, not on the next run."""
    with pytest.raises(ConfigErrors) as err:
        compose([*FUSED, "pipeline.stages.talker.kind=generation", "server.port=abc"])
    keys = [e.key for e in err.value.errors]
    assert keys == ["pipeline.stages.talker.kind", "server.port"]
