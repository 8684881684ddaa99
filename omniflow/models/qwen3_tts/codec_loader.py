"""Codec checkpoint I/O: `speech_tokenizer/config.json` and its safetensors (`decoder.*`).

Only the decoder is loaded (encoder tensors are skipped). The preset's codec shape must
match the checkpoint's `decoder_config`; a mismatch names the preset key to change.
"""

from __future__ import annotations

import json
from pathlib import Path

from omniflow.config.schema import CodecShape
from omniflow.models.qwen3_tts.codec_modules import SpeechTokenizerWeights, init_dummy_codec
from omniflow.models.qwen3_tts.loader import CheckpointError, load_state, weight_files

# preset key -> (decoder_config key, how the checkpoint states it)
_CHECKED = {
    "codebook_size": "codebook_size",
    "latent_dim": "latent_dim",
    "hidden_size": "hidden_size",
    "num_layers": "num_hidden_layers",
    "num_heads": "num_attention_heads",
    "intermediate_size": "intermediate_size",
    "sliding_window": "sliding_window",
    "num_quantizers": "num_quantizers",
    "decoder_dim": "decoder_dim",
}


def codec_dir(model_dir: Path) -> Path:
    return model_dir / "speech_tokenizer"


def check_shape(shape: CodecShape, cfg: dict) -> None:
    dec = cfg.get("decoder_config", cfg)
    for ours, theirs in _CHECKED.items():
        if theirs in dec and dec[theirs] != getattr(shape, ours):
            raise CheckpointError(
                f"model.codec.{ours} is {getattr(shape, ours)} but the checkpoint's "
                f"decoder_config.{theirs} is {dec[theirs]}"
            )
    if "codebook_dim" in dec and dec["codebook_dim"] != 2 * shape.codebook_dim:
        raise CheckpointError(
            f"model.codec.codebook_dim must be half the checkpoint's codebook_dim "
            f"({dec['codebook_dim']})"
        )
    for key, ours in (
        ("upsample_rates", shape.upsample_rates),
        ("upsampling_ratios", shape.upsampling_ratios),
    ):
        if key in dec and tuple(dec[key]) != tuple(ours):
            raise CheckpointError(f"model.codec.{key} is {ours}, the checkpoint has {dec[key]}")


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
    check_shape(shape, json.loads(cfg_path.read_text()))
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
