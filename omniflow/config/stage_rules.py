"""Per-stage build-time rules that are not about decoding (`decode_rules.py`): options named
but not implemented, stream decode's placement, the decoder's reference priming, the KV pool
against one request, and a received chunk against the step's token budget. Each violation is
a `ConfigError` naming the key path; `resolve.py` applies them all."""

from __future__ import annotations

from omniflow.config.schema import OmniflowSpec, SchedulerConfig, StageConfig
from omniflow.core.capabilities import ModelCapabilities
from omniflow.errors import ConfigError
from omniflow.models.shapes import ModelConfig


def check_unsupported(key: str, stage: StageConfig, errors: list[ConfigError]) -> None:
    """Options the schema names but this version does not implement: refused, never ignored."""
    for field in ("tensor_parallel_size", "pipeline_parallel_size"):
        if getattr(stage, field) != 1:
            errors.append(ConfigError(f"{key}.{field}", "only 1 is supported in this version"))
    if stage.enable_prefix_caching:
        errors.append(
            ConfigError(
                f"{key}.enable_prefix_caching",
                "prefix caching is not implemented (it is off for TTS)",
            )
        )
    if stage.speculative_tokens:
        errors.append(
            ConfigError(f"{key}.speculative_tokens", "speculative decoding is not implemented")
        )


def check_stream_decode(
    spec: OmniflowSpec,
    key: str,
    stage: StageConfig,
    cap: ModelCapabilities,
    is_final: bool,
    errors: list[ConfigError],
) -> None:
    if not stage.stream_decode:
        return
    skey = f"{key}.stream_decode"
    if not cap.supports_stream_decode:
        errors.append(ConfigError(skey, f"arch {stage.arch!r} does not declare stream decode"))
    if not is_final:
        errors.append(ConfigError(skey, "requires the stage to be the pipeline's final stage"))
    # parallel sizes and prefix caching: refused on their own (`check_unsupported`), not again


def resolve_ref_context(
    key: str,
    stage: StageConfig,
    decodes_audio: bool,
    cap: ModelCapabilities,
    model: ModelConfig,
    errors: list[ConfigError],
) -> int | None:
    """Frames of reference codes that prime the stage's decoder (voice clone).

    It acts only where a request can carry reference codes: the arch primes its decoder with
    them (`accepts_reference`) and the model is a Base model (it has a speaker encoder; a
    CustomVoice model refuses voice-clone requests). Anywhere else a set value would be
    accepted and ignored, so it is refused. Where it acts, None falls back to the decoder's
    attention window and 0 stays 0 (no priming)."""
    rkey = f"{key}.ref_context_frames"
    if not decodes_audio:
        if stage.ref_context_frames is not None:
            errors.append(
                ConfigError(
                    rkey, "applies only to a stage that decodes audio (stream_decode or code2wav)"
                )
            )
        return None
    if not cap.accepts_reference:
        if stage.ref_context_frames is not None:
            errors.append(
                ConfigError(
                    rkey,
                    f"arch {stage.arch!r} takes no reference audio (voice clone), so no "
                    "request can carry reference codes to prime the decoder; leave it unset",
                )
            )
        return None
    if model.speaker_encoder is None:
        if stage.ref_context_frames is not None:
            errors.append(
                ConfigError(
                    rkey,
                    f"model {model.name!r} is a {model.task_type} model (no speaker "
                    "encoder), which takes no voice clone requests, so none can carry reference "
                    "codes to "
                    "prime the decoder; leave it unset or use a Base model",
                )
            )
        return None
    if stage.ref_context_frames is None:
        return model.codec.sliding_window
    return stage.ref_context_frames


def check_kv_capacity(key: str, stage: StageConfig, errors: list[ConfigError]) -> None:
    s = stage.scheduler
    assert isinstance(s, SchedulerConfig)  # AR stages (the caller checks the kind)
    if s.num_kv_blocks * s.block_size < s.max_model_len:
        errors.append(
            ConfigError(
                f"{key}.scheduler.num_kv_blocks",
                f"{s.num_kv_blocks} blocks x {s.block_size} tokens cannot hold one request of "
                f"max_model_len {s.max_model_len}",
            )
        )


def check_chunk_budget(
    key: str, stage: StageConfig, model: ModelConfig, errors: list[ConfigError]
) -> None:
    """A received chunk is scheduled whole (atomic): one that exceeds the receiver's whole
    per-step token budget could never run, so such sizes are refused here, not at run time."""
    assert stage.upstream is not None
    budget = stage.scheduler.max_num_batched_tokens
    per_frame = model.codec.num_quantizers
    for field in ("chunk_frames", "initial_chunk_frames"):
        frames = getattr(stage.upstream, field)
        if frames * per_frame > budget:
            errors.append(
                ConfigError(
                    f"{key}.upstream.{field}",
                    f"{frames} frames x {per_frame} tokens = {frames * per_frame} tokens exceeds "
                    f"this stage's max_num_batched_tokens ({budget}); a chunk is scheduled whole, "
                    "so it could never run",
                )
            )
