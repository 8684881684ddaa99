"""Build-time rules on the model preset: how it loads (dummy or checkpoint), its tokenizer,
the shapes that must agree with each other, and the opt-in for large dummy weights."""

from __future__ import annotations

import math
from pathlib import Path

from omniflow.config.graph import ResolvedPlatform
from omniflow.errors import ConfigError
from omniflow.models.shapes import CODE_FRAME_RATE, ModelConfig


def resolve_model(
    model: ModelConfig, platform: ResolvedPlatform | None, errors: list[ConfigError]
) -> ModelConfig:
    load = model.load
    if load == "auto":
        load = "checkpoint" if model.path else "dummy"
    if load == "dummy" and model.path:
        errors.append(ConfigError("model.path", "a path is set but model.load is 'dummy'"))
    if load == "checkpoint" and not model.path:
        errors.append(ConfigError("model.load", "'checkpoint' needs model.path=DIR"))
    if load == "checkpoint" and model.path:
        _check_checkpoint_dir(model.path, errors)
    if model.allow_large_dummy:
        _check_large_dummy(load, platform, errors)
    tokenizer = model.tokenizer
    if tokenizer == "auto":
        tokenizer = "bpe" if load == "checkpoint" else "byte"
    if tokenizer == "bpe" and not model.path:
        errors.append(ConfigError("model.tokenizer", "'bpe' reads the checkpoint: set model.path"))
    for part in ("talker", "code_predictor"):
        shape = getattr(model, part)
        if shape.num_heads % shape.num_kv_heads:
            errors.append(
                ConfigError(
                    f"model.{part}.num_kv_heads",
                    f"num_heads ({shape.num_heads}) must be a multiple of it",
                )
            )
    if model.code_predictor.num_code_groups != model.codec.num_quantizers:
        errors.append(
            ConfigError(
                "model.code_predictor.num_code_groups",
                f"must equal model.codec.num_quantizers ({model.codec.num_quantizers})",
            )
        )
    if model.code_predictor.codebook_size != model.codec.codebook_size:
        errors.append(
            ConfigError(
                "model.code_predictor.codebook_size",
                f"must equal model.codec.codebook_size ({model.codec.codebook_size})",
            )
        )
    codec = model.codec
    per_frame = math.prod(codec.upsampling_ratios) * math.prod(codec.upsample_rates)
    if codec.sample_rate != per_frame * CODE_FRAME_RATE:
        errors.append(
            ConfigError(
                "model.codec.sample_rate",
                f"{codec.sample_rate} Hz, but the decoder makes {per_frame} samples a frame "
                f"(upsampling_ratios x upsample_rates) at {CODE_FRAME_RATE:g} frames a second: "
                f"{per_frame * CODE_FRAME_RATE:g} Hz; the PCM would play at the wrong speed",
            )
        )
    if model.voice_design:
        _check_voice_design(model, errors)
    else:
        _check_clone_encoders(model, errors)
    dtype = platform.dtype if platform else model.dtype
    return model.model_copy(update={"load": load, "tokenizer": tokenizer, "dtype": dtype})


def _check_voice_design(model: ModelConfig, errors: list[ConfigError]) -> None:
    """A VoiceDesign model takes its voice from the request's description (an instruction
    turn), and has no encoders to clone a voice with."""
    if not model.supports_instructions:
        errors.append(
            ConfigError(
                "model.supports_instructions",
                "is false, but a VoiceDesign model (model.voice_design) reads each request's "
                "voice description as an instruction; set it true",
            )
        )
    if model.speaker_encoder is not None or model.codec_encoder is not None:
        errors.append(
            ConfigError(
                "model.voice_design",
                "a VoiceDesign model has no voice-clone encoders; leave out "
                "model.speaker_encoder and model.codec_encoder (or model.voice_design)",
            )
        )


def _check_clone_encoders(model: ModelConfig, errors: list[ConfigError]) -> None:
    """A Base (voice-clone) model states both encoders, sized to its talker and codec; a
    CustomVoice model neither (checked here, not when the encoders are built)."""
    enc, spk = model.codec_encoder, model.speaker_encoder
    if (enc is None) != (spk is None):
        given, missing = (
            ("model.codec_encoder", "model.speaker_encoder")
            if spk is None
            else ("model.speaker_encoder", "model.codec_encoder")
        )
        errors.append(
            ConfigError(
                given,
                f"a voice-clone (Base) model needs {missing} as well, and a CustomVoice model "
                "neither: choose a Base preset (e.g. model=qwen3_tts_tiny_base) rather than "
                "adding an encoder to this one",
            )
        )
        return
    if enc is None or spk is None:
        return
    groups = model.code_predictor.num_code_groups
    for key, value, want in (
        ("model.speaker_encoder.enc_dim", spk.enc_dim, model.talker.hidden_size),
        ("model.codec_encoder.codebook_size", enc.codebook_size, model.codec.codebook_size),
        ("model.codec_encoder.valid_quantizers", enc.valid_quantizers, groups),
    ):
        if value != want:
            errors.append(ConfigError(key, f"is {value} but the talker needs {want}"))


def _check_large_dummy(
    load: str, platform: ResolvedPlatform | None, errors: list[ConfigError]
) -> None:
    """`model.allow_large_dummy` acts only where the CPU would build dummy weights
    (preflight.py's memory check); anywhere else it would be accepted and ignored."""
    where = None
    if load != "dummy":
        where = "a checkpoint (model.path)"
    elif platform is not None and platform.name != "cpu":
        where = f"platform {platform.name!r}"
    if where is not None:
        errors.append(
            ConfigError(
                "model.allow_large_dummy",
                f"lets the CPU build large dummy weights; with {where} it would not act, so "
                "leave it out",
            )
        )


def _check_checkpoint_dir(path: str, errors: list[ConfigError]) -> None:
    """The checkpoint directory exists and holds the published layout's config.json, so a
    mistyped path fails here (and in `omniflow config`), before any weights are built."""
    directory = Path(path).expanduser()
    layout = "the published Qwen3-TTS layout: config.json, model.safetensors, speech_tokenizer/"
    if not directory.is_dir():
        what = "does not exist" if not directory.exists() else "is not a directory"
        errors.append(
            ConfigError("model.path", f"{path} {what}; it must be a directory in {layout}")
        )
    elif not (directory / "config.json").is_file():
        errors.append(ConfigError("model.path", f"{path} has no config.json; expected {layout}"))
