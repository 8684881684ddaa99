"""Codec checkpoint I/O: `speech_tokenizer/config.json` and its safetensors (`decoder.*`).

Only the decoder is loaded (encoder tensors are skipped). The preset's codec shape must
match the checkpoint's `decoder_config`, every hyperparameter the official decoder reads
(`checkpoint_config.check_codec_config`); a mismatch names the preset key to change.
"""

from __future__ import annotations

import json
from pathlib import Path

from omniflow.models.qwen3_tts.checkpoint_config import check_codec_config
from omniflow.models.qwen3_tts.codec_modules import SpeechTokenizerWeights, init_dummy_codec
from omniflow.models.qwen3_tts.loader import CheckpointError, load_state, weight_files
from omniflow.models.shapes import CodecShape


def codec_dir(model_dir: Path) -> Path:
    return model_dir / "speech_tokenizer"


def load_codec(shape: CodecShape, model_dir: Path | None, seed: int) -> SpeechTokenizerWeights:
    """The codec decoder from `model_dir/speech_tokenizer/`, or dummy weights (seeded)."""
    weights = SpeechTokenizerWeights(shape)
    if model_dir is None:
        init_dummy_codec(weights, seed)
        return weights
    d = codec_dir(model_dir)
    cfg_path = d / "config.json"
    if not cfg_path.is_file():
        raise CheckpointError(f"{d}: no config.json")
    check_codec_config(json.loads(cfg_path.read_text()), shape)
    load_state(weights, weight_files(d), "decoder.")
    return weights


def save_codec(weights: SpeechTokenizerWeights, model_dir: Path) -> None:
    """Write the decoder in the published layout (tests and conversions)."""
    from safetensors.torch import save_file

    d = codec_dir(model_dir)
    d.mkdir(parents=True, exist_ok=True)
    s = weights.decoder.shape
    tensors = {k: v.detach().contiguous().cpu() for k, v in weights.state_dict().items()}
    save_file(tensors, str(d / "model.safetensors"))
    cfg = {
        "decoder_config": {
            "codebook_size": s.codebook_size,
            "head_dim": s.head_dim,
            "num_key_value_heads": s.num_kv_heads or s.num_heads,
            "rope_theta": s.rope_theta,
            "rms_norm_eps": s.rms_norm_eps,
            "layer_scale_initial_scale": s.layer_scale,
            "hidden_act": "silu",
            "attention_bias": False,
            "codebook_dim": 2 * s.codebook_dim,
            "latent_dim": s.latent_dim,
            "hidden_size": s.hidden_size,
            "num_hidden_layers": s.num_layers,
            "num_attention_heads": s.num_heads,
            "intermediate_size": s.intermediate_size,
            "sliding_window": s.sliding_window,
            "num_quantizers": s.num_quantizers,
            "decoder_dim": s.decoder_dim,
            "upsample_rates": list(s.upsample_rates),
            "upsampling_ratios": list(s.upsampling_ratios),
        },
        "output_sample_rate": s.sample_rate,
        "decode_upsample_rate": 1920,
    }
    (d / "config.json").write_text(json.dumps(cfg, indent=2))
