"""Cross-check of a checkpoint's config.json against the preset it is loaded under.

The loaders check tensor names and shapes, but a tensor's shape does not show a RoPE base,
a norm epsilon or an activation: a checkpoint whose config.json states another one would
load under a preset and compute something else than the official implementation does with
it. So every hyperparameter the official code reads is compared here, and a mismatch is a
`CheckpointError` naming both keys:

- a **preset value** (`model.talker.rope_theta`, ...) must equal the config's value;
- a Base preset (encoders stated) needs `tts_model_type: base`, a VoiceDesign preset
  `voice_design` (and only it); the encoders' own shapes
  are compared by their loaders (`speaker_encoder.check_speaker_encoder_config`,
  `CodecEncoderShape.from_config`);
- a **fact omniflow implements** (SiLU, no attention biases, no sliding window in the talker,
  default RoPE with MRoPE sections that cover the head) must hold: omniflow runs plain 1-D
  RoPE, which equals the talker's MRoPE exactly because its three position streams are equal
  for text and codec tokens, whatever the sections, once they cover half the head width.

A key the config leaves out means what the official config classes default it to (their
defaults are not the published models: a config without `rope_theta` runs at 10,000 there),
so it is compared as that default; a key without a default there is required. Keys the
official code never reads (initializer range, dropout, cache flags, ...) are inert in both.
"""

from __future__ import annotations

import math
from typing import Any

from omniflow.models.qwen3_tts.loader import CheckpointError
from omniflow.models.shapes import CodecShape, ModelConfig

REQUIRED = object()
"""Marks a key the official config classes give no default (the official code fails without)."""


def _head_dim(section: dict) -> int:
    """The official default head width where a section states none."""
    return section.get("hidden_size", 1024) // section.get("num_attention_heads", 16)


def _stack(intermediate: int, layers: int, kv_heads: int, head_dim: Any) -> dict:
    """A Qwen3 decoder stack's keys, in the official config classes' order, with their
    defaults (the talker's and the code predictor's differ only in these four)."""
    return {
        "hidden_size": ("hidden_size", 1024),
        "intermediate_size": ("intermediate_size", intermediate),
        "num_hidden_layers": ("num_layers", layers),
        "num_attention_heads": ("num_heads", 16),
        "num_key_value_heads": ("num_kv_heads", kv_heads),
        "head_dim": ("head_dim", head_dim),
        "rms_norm_eps": ("rms_norm_eps", 1e-6),
        "rope_theta": ("rope_theta", 10000),
    }


# config key -> (preset field, official default); the default may be a callable of the section
_TALKER = {
    "vocab_size": ("vocab_size", 3072),
    **_stack(intermediate=2048, layers=20, kv_heads=2, head_dim=_head_dim),
    "text_hidden_size": ("text_hidden_size", 2048),
    "text_vocab_size": ("text_vocab_size", REQUIRED),
}
_PREDICTOR = {
    "vocab_size": ("codebook_size", 2048),
    **_stack(intermediate=3072, layers=5, kv_heads=8, head_dim=128),
    "num_code_groups": ("num_code_groups", 32),
}
_CODEC = {
    "codebook_size": ("codebook_size", 2048),
    "latent_dim": ("latent_dim", 1024),
    "hidden_size": ("hidden_size", 1024),
    "num_hidden_layers": ("num_layers", 8),
    "num_attention_heads": ("num_heads", 16),
    "intermediate_size": ("intermediate_size", 3072),
    "sliding_window": ("sliding_window", 72),
    "num_quantizers": ("num_quantizers", 16),
    "decoder_dim": ("decoder_dim", 1536),
    "rope_theta": ("rope_theta", 10000),
    "rms_norm_eps": ("rms_norm_eps", 1e-5),
    "head_dim": ("head_dim", _head_dim),
}
# facts omniflow's modules implement: config key -> (the one accepted value, official default)
_FIXED = {
    "hidden_act": ("silu", "silu"),
    "attention_bias": (False, False),
}
_NO_SLIDING = {"use_sliding_window": (False, False)}


class ConfigMismatch(CheckpointError):
    """config.json states something the preset (or omniflow) does not compute."""


def _value(section: dict, key: str, default: Any, where: str) -> Any:
    if key in section:
        return section[key]
    if default is REQUIRED:
        raise ConfigMismatch(f"the checkpoint's config.json lacks {where}.{key}")
    return default(section) if callable(default) else default


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return math.isclose(a, b, rel_tol=1e-12, abs_tol=0.0)
    if isinstance(a, list | tuple) and isinstance(b, list | tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


def _against_preset(section: dict, where: str, table: dict, preset: Any, preset_path: str) -> None:
    for key, (field, default) in table.items():
        theirs = _value(section, key, default, where)
        ours = getattr(preset, field)
        if ours is None:  # e.g. codec num_kv_heads unset: means num_heads
            continue
        if not _same(theirs, ours):
            how = "states" if key in section else "leaves out, so the official code reads"
            raise ConfigMismatch(
                f"{preset_path}.{field} is {ours!r} but the checkpoint's config.json {how} "
                f"{where}.{key} = {theirs!r}"
            )


def _fixed(section: dict, where: str, table: dict) -> None:
    for key, (accepted, default) in table.items():
        theirs = section.get(key, default)
        if not _same(theirs, accepted):
            raise ConfigMismatch(
                f"the checkpoint's config.json has {where}.{key} = {theirs!r}; omniflow "
                f"computes only {accepted!r}"
            )


def _rope_scaling(section: dict, where: str, head_dim: int, mrope: bool) -> None:
    """Default RoPE only; for the talker (MRoPE) the sections must cover half the head."""
    scaling = section.get("rope_scaling")
    if scaling is None:
        if mrope:  # the official talker indexes rope_scaling["mrope_section"]
            raise ConfigMismatch(f"the checkpoint's config.json lacks {where}.rope_scaling")
        return
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind != "default":
        raise ConfigMismatch(
            f"the checkpoint's config.json has {where}.rope_scaling.rope_type = {kind!r}; "
            "omniflow computes only 'default' RoPE"
        )
    if mrope:
        sections = scaling.get("mrope_section")
        if sections is None or sum(sections) != head_dim // 2:
            raise ConfigMismatch(
                f"the checkpoint's config.json has {where}.rope_scaling.mrope_section = "
                f"{sections!r}; it must cover half the head width ({head_dim // 2})"
            )
    factor = section.get("partial_rotary_factor", 1.0)
    if not _same(factor, 1.0):
        raise ConfigMismatch(
            f"the checkpoint's config.json has {where}.partial_rotary_factor = {factor!r}; "
            "omniflow rotates the whole head"
        )


def _model_type(cfg: dict, model: ModelConfig) -> None:
    """A Base preset (it states `model.speaker_encoder`) needs a Base checkpoint: the official
    code builds the speaker encoder, and clones voices, only for `tts_model_type: base`
    (unset there means None). The other way round is accepted: a CustomVoice preset reads a
    Base checkpoint's talker and codec, which are laid out alike (it then has no speakers).
    A VoiceDesign checkpoint and a VoiceDesign preset (`model.voice_design`) go together only:
    the official code designs voices for `voice_design` alone, and that checkpoint has no
    speakers for a CustomVoice preset to serve."""
    kind = cfg.get("tts_model_type")
    if model.speaker_encoder is not None and kind != "base":
        raise ConfigMismatch(
            f"model.speaker_encoder is set (a Base preset) but the checkpoint's config.json "
            f"has tts_model_type = {kind!r}; a voice-clone model needs a Base checkpoint "
            "(tts_model_type 'base'), or serve this one with a CustomVoice preset"
        )
    if model.voice_design and kind != "voice_design":
        raise ConfigMismatch(
            f"model.voice_design is true (a VoiceDesign preset) but the checkpoint's "
            f"config.json has tts_model_type = {kind!r}; a VoiceDesign preset needs a "
            "VoiceDesign checkpoint (tts_model_type 'voice_design'), or serve this one with "
            "model.voice_design=false"
        )
    if kind == "voice_design" and not model.voice_design:
        raise ConfigMismatch(
            "the checkpoint's config.json has tts_model_type = 'voice_design' (a VoiceDesign "
            "model: no preset speakers, each request describes its voice), but "
            "model.voice_design is false; serve it with model=qwen3_tts_1_7b_voicedesign"
        )


def check_talker_config(cfg: dict, model: ModelConfig) -> None:
    """Refuse a config.json whose talker or code predictor differ from `model`'s preset."""
    tokenizer = cfg.get("tokenizer_type", "qwen3_tts_tokenizer_12hz")
    if tokenizer != "qwen3_tts_tokenizer_12hz":
        raise ConfigMismatch(
            f"the checkpoint's config.json has tokenizer_type = {tokenizer!r}; omniflow serves "
            "the 12 Hz codec (qwen3_tts_tokenizer_12hz) only"
        )
    _model_type(cfg, model)
    talker = cfg.get("talker_config", {})
    _against_preset(talker, "talker_config", _TALKER, model.talker, "model.talker")
    groups = _value(talker, "num_code_groups", 32, "talker_config")
    if groups != model.code_predictor.num_code_groups:
        raise ConfigMismatch(
            f"model.code_predictor.num_code_groups is {model.code_predictor.num_code_groups} "
            f"but the checkpoint's config.json has talker_config.num_code_groups = {groups}"
        )
    _fixed(talker, "talker_config", {**_FIXED, **_NO_SLIDING})
    _rope_scaling(talker, "talker_config", model.talker.head_dim, mrope=True)
    where = "talker_config.code_predictor_config"
    predictor = talker.get("code_predictor_config", {})
    _against_preset(predictor, where, _PREDICTOR, model.code_predictor, "model.code_predictor")
    _fixed(predictor, where, {**_FIXED, **_NO_SLIDING})
    layers = predictor.get("layer_types")
    if layers is not None and any(t != "full_attention" for t in layers):
        raise ConfigMismatch(
            f"the checkpoint's config.json has {where}.layer_types = {layers!r}; the code "
            "predictor computes full attention only"
        )
    _rope_scaling(predictor, where, model.code_predictor.head_dim, mrope=False)


def check_codec_config(cfg: dict, shape: CodecShape) -> None:
    """Refuse a speech_tokenizer/config.json whose decoder differs from `shape`."""
    dec = cfg.get("decoder_config", {})
    where = "decoder_config"
    _against_preset(dec, where, _CODEC, shape, "model.codec")
    kv = _value(dec, "num_key_value_heads", 16, where)
    if kv != (shape.num_kv_heads or shape.num_heads):
        raise ConfigMismatch(
            f"model.codec.num_kv_heads resolves to {shape.num_kv_heads or shape.num_heads} but "
            f"the checkpoint's config.json has {where}.num_key_value_heads = {kv}"
        )
    codebook_dim = _value(dec, "codebook_dim", REQUIRED, where)
    if codebook_dim != 2 * shape.codebook_dim:
        raise ConfigMismatch(
            f"model.codec.codebook_dim must be half the checkpoint's {where}.codebook_dim "
            f"({codebook_dim}), it is {shape.codebook_dim}"
        )
    for key, ours, default in (
        ("upsample_rates", shape.upsample_rates, (8, 5, 4, 3)),
        ("upsampling_ratios", shape.upsampling_ratios, (2, 2)),
    ):
        theirs = dec.get(key, default)
        if not _same(list(theirs), list(ours)):
            raise ConfigMismatch(
                f"model.codec.{key} is {list(ours)}, the checkpoint's {where}.{key} is "
                f"{list(theirs)}"
            )
    _fixed(dec, where, _FIXED)
    _rope_scaling(dec, where, shape.head_dim, mrope=False)
    rate = cfg.get("output_sample_rate", 24000)
    if rate != shape.sample_rate:
        raise ConfigMismatch(
            f"model.codec.sample_rate is {shape.sample_rate} but the checkpoint's "
            f"config.json has output_sample_rate = {rate}"
        )
    per_frame = math.prod(shape.upsample_rates) * math.prod(shape.upsampling_ratios)
    upsample = cfg.get("decode_upsample_rate", 1920)
    if upsample != per_frame:
        raise ConfigMismatch(
            f"the checkpoint's config.json has decode_upsample_rate = {upsample}; the preset's "
            f"decoder makes {per_frame} samples per frame"
        )
