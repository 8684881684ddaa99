"""A voice-clone reference, encoded: what a `SpeechRequest` carries for a Base model.

The request boundary is the encoders' outputs, not raw audio: the front end (HTTP, `synth`,
a voice registry) decodes and resamples the reference once, runs `encode_reference`, and
puts `ref_codes` and `speaker_embedding` on the request. So the talker processor stays a
cheap, CPU-only layout step, a registry can cache the encoded reference, and the same
request replays bit for bit. docs/architecture.md ("Voice clone") describes the layouts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from omniflow.models.qwen3_tts.codec_encoder import (
    CodecEncoderShape,
    CodecEncoderWeights,
    load_codec_encoder,
)
from omniflow.models.qwen3_tts.processor import CloneShape
from omniflow.models.qwen3_tts.speaker_encoder import (
    SpeakerEncoderShape,
    SpeakerEncoderWeights,
    load_speaker_encoder,
)
from omniflow.models.shapes import ModelConfig


@dataclass(frozen=True)
class EncodedReference:
    """Reference codes (frames of 16 codes, 12.5 Hz) and the speaker embedding."""

    ref_codes: tuple[tuple[int, ...], ...]
    speaker_embedding: tuple[float, ...]


@torch.no_grad()
def encode_reference(
    audio: torch.Tensor, codec_encoder: CodecEncoderWeights, speaker: SpeakerEncoderWeights
) -> EncodedReference:
    """Encode 24 kHz mono audio [N] as the official `create_voice_clone_prompt` does: the
    speech tokenizer's codes and the speaker encoder's embedding of the same samples."""
    if audio.dim() != 1 or audio.numel() == 0:
        raise ValueError(
            f"reference audio must be non-empty mono samples, got {tuple(audio.shape)}"
        )
    x = audio.to(torch.float32)[None]
    codes = codec_encoder.encode(x)[0]
    embedding = speaker.embed(x)[0]
    return EncodedReference(
        ref_codes=tuple(tuple(int(c) for c in f) for f in codes.tolist()),
        speaker_embedding=tuple(float(v) for v in embedding.tolist()),
    )


@dataclass(frozen=True)
class ReferenceEncoders:
    """A Base model's encoders, and the reference shape its requests must match."""

    codec_encoder: CodecEncoderWeights
    speaker: SpeakerEncoderWeights
    clone: CloneShape

    def encode(self, audio: torch.Tensor) -> EncodedReference:
        return encode_reference(audio, self.codec_encoder, self.speaker)


def build_reference_encoders(config: ModelConfig) -> ReferenceEncoders | None:
    """The encoders a Base preset states (`model.codec_encoder`, `model.speaker_encoder`),
    from the checkpoint (strict, config files cross-checked) or seeded dummy weights; None
    for a CustomVoice preset (neither key; config/model_rules.py checks the pair and their
    sizes against the talker). fp32 on the CPU: they run once per reference."""
    enc_cfg, spk_cfg = config.codec_encoder, config.speaker_encoder
    if enc_cfg is None or spk_cfg is None:  # both or neither (config/model_rules.py)
        return None
    groups = config.code_predictor.num_code_groups
    path = Path(config.path) if config.load == "checkpoint" and config.path else None
    codec_encoder = load_codec_encoder(CodecEncoderShape(**enc_cfg.model_dump()), path, config.seed)
    speaker = load_speaker_encoder(SpeakerEncoderShape(**spk_cfg.model_dump()), path, config.seed)
    clone = CloneShape(config.talker.hidden_size, groups, config.codec.codebook_size)
    return ReferenceEncoders(codec_encoder, speaker, clone)
