"""Every key `omniflow config` prints acts: runtime code reads it, or a value that would not
act is refused, or it is derived (not settable) from keys that do act.

The table below is the inventory. A new printed key without an entry fails this test, and
so does an entry whose reader no longer mentions the field.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from omniflow.config.commands import BenchConfig
from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from omniflow.config.server import ServerConfig
from omniflow.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2] / "omniflow"
S = "stages.<stage>"
M = "omniflow/models/qwen3_tts/"

# key -> (file or folder under omniflow/ that reads it at run time, the field name it reads)
READ: dict[str, tuple[str, str]] = {
    "runtime": ("build/pipeline.py", "runtime"),  # ray: deploy/stage_pipeline.py
    "pipeline": ("engine/orchestrator.py", "pipeline"),
    "final_stage": ("engine/orchestrator.py", "is_final"),
    f"{S}.is_final": ("engine/orchestrator.py", "is_final"),
    f"{S}.arch": ("build/pipeline.py", "arch"),
    f"{S}.window_k": ("build/qwen3_tts.py", "window_k"),
    f"{S}.prompt_graph_tokens": ("build/qwen3_tts.py", "prompt_graph_tokens"),
    f"{S}.audio_chunk_frames": ("build/qwen3_tts.py", "audio_chunk_frames"),
    f"{S}.playback_margin_ms": ("build/qwen3_tts.py", "playback_margin_ms"),
    f"{S}.audio_pass_steps": ("build/qwen3_tts.py", "audio_pass_steps"),
    f"{S}.stream_decode": ("build/qwen3_tts.py", "stream_decode"),
    f"{S}.receives_chunks": ("build/qwen3_tts.py", "receives_chunks"),
    f"{S}.atomic_chunks": ("build/qwen3_tts.py", "atomic_chunks"),
    f"{S}.upstream": ("build/qwen3_tts.py", "upstream"),
    f"{S}.upstream.chunk_frames": ("build/qwen3_tts.py", "chunk_frames"),
    f"{S}.upstream.initial_chunk_frames": ("build/qwen3_tts.py", "initial_chunk_frames"),
    f"{S}.upstream.receive_timeout_s": ("build/qwen3_tts.py", "receive_timeout_s"),
    f"{S}.downstream": ("engine/orchestrator.py", "downstream"),
    f"{S}.scheduler.max_num_seqs": ("sched", "max_num_seqs"),
    f"{S}.scheduler.max_num_batched_tokens": ("sched", "max_num_batched_tokens"),
    f"{S}.scheduler.async_scheduling": ("build/pipeline.py", "async_scheduling"),
    f"{S}.scheduler.max_model_len": ("sched/ar.py", "max_model_len"),
    f"{S}.scheduler.block_size": ("sched/ar.py", "block_size"),
    f"{S}.scheduler.num_kv_blocks": ("sched/ar.py", "num_kv_blocks"),
    f"{S}.scheduler.max_resident_seqs": ("sched/seating.py", "max_resident_seqs"),
    f"{S}.scheduler.arrival_hold_ms": ("sched/ar_admission.py", "arrival_hold_ms"),
    f"{S}.scheduler.arrival_hold_min_running": (
        "sched/ar_admission.py",
        "arrival_hold_min_running",
    ),
    "platform.name": ("build/qwen3_tts.py", "name"),
    "platform.cuda_graphs": ("build/qwen3_tts.py", "cuda_graphs"),
    "platform.gpu_memory_utilization": ("build/qwen3_tts.py", "gpu_memory_utilization"),
    "platform.cudnn_benchmark": ("build/pipeline.py", "cudnn_benchmark"),
    "platform.device": ("build/pipeline.py", "device"),
    "platform.dtype": ("build/pipeline.py", "dtype"),
    "platform.codec_dtype": ("build/qwen3_tts.py", "codec_dtype"),
    "model.name": ("engine/orchestrator.py", "name"),
    "model.load": ("models/qwen3_tts/factory.py", "load"),
    "model.path": ("models/qwen3_tts/factory.py", "path"),
    "model.seed": ("models/qwen3_tts/factory.py", "seed"),
    # the memory check before a CPU build (dummy weights over 1 GiB need it; refused where
    # it cannot act: tests/test_newcomer_mistakes.py)
    "model.allow_large_dummy": ("preflight.py", "allow_large_dummy"),
    "model.dtype": ("models/qwen3_tts/factory.py", "dtype"),
    "model.codec_dtype": ("config/resolve_platform.py", "codec_dtype"),
    "model.tokenizer": ("models/qwen3_tts/factory.py", "tokenizer"),
    "model.supports_instructions": ("build/qwen3_tts.py", "supports_instructions"),
    # the front end's VoiceDesign rules; the task it serves (ModelConfig.task_type)
    "model.voice_design": ("build/qwen3_tts.py", "voice_design"),
    "model.codec.sample_rate": ("engine/orchestrator.py", "sample_rate"),
    # Base presets: the decoding stage primes each voice-clone request's decoder slot with it
    # (CustomVoice presets refuse it: see REFUSED)
    f"{S}.ref_context_frames": ("build/qwen3_tts.py", "ref_context_frames"),
    # Base presets only (unset in the printed default; their fields are the encoders' shapes,
    # built in reference.py and checked against the checkpoint by the encoders' loaders)
    "model.codec_encoder": ("models/qwen3_tts/reference.py", "codec_encoder"),
    "model.speaker_encoder": ("models/qwen3_tts/reference.py", "speaker_encoder"),
}
# Shapes: every field is read where the modules are built.
for part, fields, where in (
    (
        "talker",
        "num_layers hidden_size num_heads num_kv_heads head_dim intermediate_size rms_norm_eps "
        "rope_theta vocab_size text_vocab_size text_hidden_size",
        "models",
    ),
    (
        "code_predictor",
        "num_layers hidden_size num_heads num_kv_heads head_dim intermediate_size rms_norm_eps "
        "rope_theta num_code_groups codebook_size",
        "models",
    ),
    (
        "codec",
        "num_quantizers codebook_size codebook_dim latent_dim hidden_size num_layers num_heads "
        "head_dim num_kv_heads intermediate_size rms_norm_eps layer_scale sliding_window "
        "rope_theta upsampling_ratios upsample_rates decoder_dim",
        "models/qwen3_tts",
    ),
):
    for f in fields.split():
        READ[f"model.{part}.{f}"] = (where, f)

# key -> an override that would not act, which must be refused
REFUSED: dict[str, str] = {
    "runtime": "pipeline.runtime=ray",  # one stage (fused): nothing to place apart
    # on a CustomVoice preset (the default): no request can carry reference codes
    f"{S}.ref_context_frames": "pipeline.stages.talker.ref_context_frames=0",
    f"{S}.kind": "pipeline.stages.code2wav.kind=ar",  # the arch runs in a generation stage
    "model.family": "model.family=other",
}
BASE = {  # the pipeline each refusal is tried on (a generation stage has no KV keys)
    f"{S}.kind": ["pipeline=qwen3_tts", "platform=cpu"],
}

# key -> the acting key it is derived from or mirrored by (not settable itself)
DERIVED: dict[str, str] = {
    f"{S}.name": f"{S}.arch",
    f"{S}.output": f"{S}.stream_decode",
    f"{S}.upstream.stage": f"{S}.downstream",
}


# `server.*` keys (`omniflow serve`; not part of the printed graph) -> (file, field it reads)
SERVER_READ: dict[str, tuple[str, str]] = {
    "server.host": ("serve/run.py", "host"),
    "server.port": ("serve/run.py", "port"),
    "server.log_level": ("serve/run.py", "log_level"),
    "server.max_input_chars": ("serve/validation.py", "max_input_chars"),
    "server.max_concurrent_requests": ("serve/validation.py", "max_concurrent_requests"),
    "server.max_buffered_audio_s": ("serve/routes.py", "max_buffered_audio_s"),
    "server.max_first_audio_wait_s": ("serve/routes.py", "max_first_audio_wait_s"),
    "server.stalled_client_timeout_s": ("serve/routes.py", "stalled_client_timeout_s"),
    "server.keep_alive_timeout_s": ("serve/run.py", "keep_alive_timeout_s"),
    "server.max_ref_audio_s": ("serve/routes.py", "max_ref_audio_s"),
    "server.max_ref_audio_bytes": ("serve/routes.py", "max_ref_audio_bytes"),
    "server.max_voices": ("serve/voices.py", "max_voices"),
    "server.header_timeout_s": ("serve/run.py", "header_timeout_s"),
    "server.max_header_bytes": ("serve/run.py", "max_header_bytes"),
    "server.max_unheard_per_client": ("serve/run.py", "max_unheard_per_client"),
    "server.max_unheard_connections": ("serve/run.py", "max_unheard_connections"),
    "server.max_body_bytes": ("serve/routes.py", "body_limit"),  # config/server.py derives it
    "server.body_timeout_s": ("serve/routes.py", "body_timeout_s"),
    "server.max_concurrent_references": ("serve/routes.py", "max_concurrent_references"),
    "server.ws_idle_timeout_s": ("serve/ws.py", "ws_idle_timeout_s"),
    "server.warmup_frames": ("serve/warmup.py", "warmup_frames"),
}

# `bench.*` keys (`omniflow bench`) -> (file, field it reads); a key outside its loop or
# transport is refused by name (bench/mode.py's check_mode, tests/bench)
BENCH_READ: dict[str, tuple[str, str]] = {
    f"bench.{k}": ("bench/job.py", k)
    for k in [
        "prompts",
        "concurrency",
        "warmup",
        "rounds",
        "max_frames",
        "phase_timing",
    ]
} | {
    "bench.num_prompts": ("bench/prompt_file.py", "num_prompts"),  # the round's check
    "bench.reuse_pipeline": ("bench/target.py", "reuse_pipeline"),  # in-process and Ray
    "bench.prompts_per_lane": ("config/commands.py", "prompts_per_lane"),  # round_prompts
    "bench.out_dir": ("bench/app.py", "out_dir"),
    **{
        f"bench.{k}": ("bench/mode.py", k)
        for k in ["rps", "arrivals", "duration_s", "warmup_s", "seed", "drain_s"]
    },
    "bench.transport": ("bench/open_loop.py", "transport"),
    "bench.word_interval_ms": ("bench/mode.py", "word_interval_ms"),  # into the Plan
}


def printed_keys() -> set[str]:
    """Leaf key paths of `omniflow config` for both shipped pipelines (stage names folded
    into `<stage>`, so every stage's keys are checked)."""
    keys: set[str] = set()

    def walk(node: object, prefix: str) -> None:
        if isinstance(node, dict) and node:
            for k, v in node.items():
                walk(v, f"{prefix}.{k}")
        else:
            keys.add(prefix.lstrip("."))

    for pipeline in ("qwen3_tts", "qwen3_tts_fused"):
        data = build_graph(compose([f"pipeline={pipeline}", "platform=cpu"])).to_dict()
        for stage in data.pop("stages").values():
            walk(stage, S)
        walk(data, "")
    return keys


def test_the_inventory_covers_exactly_the_printed_keys():
    listed = set(READ) | set(REFUSED) | set(DERIVED)
    assert printed_keys() == listed


def test_the_server_inventory_covers_every_server_key():
    assert set(SERVER_READ) == {f"server.{k}" for k in ServerConfig.model_fields}


def test_the_bench_inventory_covers_every_bench_key():
    assert set(BENCH_READ) == {f"bench.{k}" for k in BenchConfig.model_fields}


@pytest.mark.parametrize("key", sorted(READ) + sorted(SERVER_READ) + sorted(BENCH_READ))
def test_read_keys_are_read_by_runtime_code(key):
    where, field = {**READ, **SERVER_READ, **BENCH_READ}[key]
    path = ROOT / where
    files = sorted(path.rglob("*.py")) if path.is_dir() else [path]
    pattern = re.compile(rf"\.{field}\b|\b{field}=")
    assert any(pattern.search(f.read_text()) for f in files), f"{key}: not read in {where}"


@pytest.mark.parametrize("key", sorted(REFUSED))
def test_refused_keys_refuse_values_that_would_not_act(key):
    override = REFUSED[key]
    with pytest.raises(ConfigError) as exc:
        build_graph(
            compose([*BASE.get(key, ["pipeline=qwen3_tts_fused", "platform=cpu"]), override])
        )
    named = override.lstrip("+").split("=")[0]
    assert named.rsplit(".", 1)[-1] in str(exc.value)


@pytest.mark.parametrize("key", sorted(DERIVED))
def test_derived_keys_cannot_be_set_and_come_from_acting_keys(key):
    assert DERIVED[key] in READ
    field = key.split(".")[-1]
    if field == "stage":
        return  # upstream.stage is the edge itself; its inverse (downstream) is what routes
    with pytest.raises(ConfigError):
        compose(["pipeline=qwen3_tts_fused", "platform=cpu", f"+pipeline.stages.talker.{field}=x"])
