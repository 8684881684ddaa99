"""The official `qwen-tts` classes' configs for omniflow's presets, written in the published
spelling by code of their own (not omniflow's loader), so that a mapping error on either side
shows up as a refused or mis-shaped load (`official.py` builds the models from them)."""

from __future__ import annotations

from typing import Any

from omniflow.models.qwen3_tts.tokenizer import ByteTokenizer
from omniflow.models.shapes import ModelConfig

# The published CustomVoice tables (talker_config of the 12 Hz checkpoints).
PUBLISHED_LANGUAGES = {
    "chinese": 2055,
    "english": 2050,
    "german": 2053,
    "italian": 2070,
    "portuguese": 2071,
    "spanish": 2054,
    "japanese": 2058,
    "korean": 2064,
    "french": 2061,
    "russian": 2069,
    "beijing_dialect": 2074,
    "sichuan_dialect": 2062,
}
PUBLISHED_SPEAKERS = {
    "serena": 3066,
    "vivian": 3065,
    "uncle_fu": 3010,
    "ryan": 3061,
    "aiden": 2861,
    "ono_anna": 2873,
    "sohee": 2864,
    "eric": 2875,
    "dylan": 2878,
}
PUBLISHED_DIALECTS = {name: False for name in PUBLISHED_SPEAKERS} | {
    "eric": "sichuan_dialect",
    "dylan": "beijing_dialect",
}


def _transformer(s: Any) -> dict:
    return {
        "hidden_size": s.hidden_size,
        "intermediate_size": s.intermediate_size,
        "num_hidden_layers": s.num_layers,
        "num_attention_heads": s.num_heads,
        "num_key_value_heads": s.num_kv_heads,
        "head_dim": s.head_dim,
        "rms_norm_eps": s.rms_norm_eps,
        "rope_theta": s.rope_theta,
        "hidden_act": "silu",
        "attention_bias": False,
        "max_position_embeddings": 32768,
    }


def tts_config(model: ModelConfig) -> dict:
    """Qwen3TTSConfig kwargs for `model`'s shapes (CustomVoice, byte-tokenizer specials)."""
    t, p = model.talker, model.code_predictor
    s = ByteTokenizer().specials
    half = t.head_dim // 2
    sections = [24, 20, 20] if half == 64 else [half - 2 * (half // 3), half // 3, half // 3]
    talker = {
        **_transformer(t),
        "vocab_size": t.vocab_size,
        "text_vocab_size": t.text_vocab_size,
        "text_hidden_size": t.text_hidden_size,
        "num_code_groups": p.num_code_groups,
        "rope_scaling": {"rope_type": "default", "mrope_section": sections, "interleaved": True},
        "codec_eos_token_id": 2150,
        "codec_think_id": 2154,
        "codec_nothink_id": 2155,
        "codec_think_bos_id": 2156,
        "codec_think_eos_id": 2157,
        "codec_pad_id": 2148,
        "codec_bos_id": 2149,
        "codec_language_id": dict(PUBLISHED_LANGUAGES),
        "spk_id": dict(PUBLISHED_SPEAKERS),
        "spk_is_dialect": dict(PUBLISHED_DIALECTS),
        "code_predictor_config": {
            **_transformer(p),
            "vocab_size": p.codebook_size,
            "num_code_groups": p.num_code_groups,
        },
    }
    return {
        "talker_config": talker,
        "speaker_encoder_config": speaker_encoder_config(model),
        "tokenizer_type": "qwen3_tts_tokenizer_12hz",
        # a Base model has the speaker encoder (saved as speaker_encoder.*); the CustomVoice
        # paths compared here do not depend on the type
        "tts_model_type": "base",
        "tts_model_size": model.name,
        "im_start_token_id": s.im_start,
        "im_end_token_id": s.im_end,
        "tts_pad_token_id": s.tts_pad,
        "tts_bos_token_id": s.tts_bos,
        "tts_eos_token_id": s.tts_eos,
    }


def speaker_encoder_config(model: ModelConfig) -> dict:
    """The published speaker encoder with the talker's width (its embedding takes a codec
    embedding's place); at toy widths, toy channels."""
    hidden = model.talker.hidden_size
    if hidden >= 256:
        return {"enc_dim": hidden}
    return {
        "enc_dim": hidden,
        "enc_channels": [16, 16, 16, 16, 48],
        "enc_attention_channels": 8,
        "enc_se_channels": 8,
    }


def codec_config(model: ModelConfig) -> dict:
    """Qwen3TTSTokenizerV2Config kwargs for the preset's codec (decoder shapes; a Mimi
    encoder at the preset's width, not compared yet)."""
    c = model.codec
    small = c.hidden_size < 256
    encoder = (
        {
            "hidden_size": c.hidden_size,
            "num_hidden_layers": 1,
            "num_attention_heads": 2,
            "num_key_value_heads": 2,
            "head_dim": c.hidden_size // 2,
            "intermediate_size": 2 * c.hidden_size,
            "num_filters": 4,
            "upsample_groups": c.hidden_size,
            "codebook_dim": c.codebook_dim,
            "vector_quantization_hidden_dimension": c.codebook_dim,
            "codebook_size": c.codebook_size,
            "num_quantizers": 32,
            "frame_rate": 12.5,
        }
        if small
        else {"num_quantizers": 32, "frame_rate": 12.5}
    )
    return {
        "encoder_config": encoder,
        "decoder_config": {
            "codebook_size": c.codebook_size,
            "codebook_dim": 2 * c.codebook_dim,
            "hidden_size": c.hidden_size,
            "latent_dim": c.latent_dim,
            "rope_theta": c.rope_theta,
            "num_attention_heads": c.num_heads,
            "num_key_value_heads": c.num_kv_heads or c.num_heads,
            "head_dim": c.head_dim,
            "sliding_window": c.sliding_window,
            "intermediate_size": c.intermediate_size,
            "hidden_act": "silu",
            "rms_norm_eps": c.rms_norm_eps,
            "num_hidden_layers": c.num_layers,
            "num_quantizers": c.num_quantizers,
            "upsample_rates": list(c.upsample_rates),
            "upsampling_ratios": list(c.upsampling_ratios),
            "decoder_dim": c.decoder_dim,
        },
        "encoder_valid_num_quantizers": 16,
        "input_sample_rate": c.sample_rate,
        "output_sample_rate": c.sample_rate,
        "decode_upsample_rate": 1920,
        "encode_downsample_rate": 1920,
    }
