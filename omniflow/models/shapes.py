"""A model preset's schema: its family, its shapes and where its weights come from.

The models own their shapes; the config schema validates a preset against this (a pydantic
leaf that imports no torch, so reading a config builds nothing).
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from omniflow.core.frozen import Dtype, Frozen

CODE_FRAME_RATE = 12.5
"""Qwen3-TTS's code frames a second (talker steps, codec frames)."""


class TransformerShape(Frozen):
    """A Qwen3 decoder stack's shape."""

    num_layers: int = Field(ge=1, description="Decoder layers.")
    hidden_size: int = Field(ge=1, description="Residual width.")
    num_heads: int = Field(ge=1, description="Query heads.")
    num_kv_heads: int = Field(ge=1, description="Key/value heads (GQA).")
    head_dim: int = Field(ge=2, description="Width of one head.")
    intermediate_size: int = Field(ge=1, description="SwiGLU inner width.")
    rms_norm_eps: float = Field(1e-6, gt=0, description="RMSNorm epsilon.")
    rope_theta: float = Field(1e6, gt=0, description="RoPE base.")


class TalkerShape(TransformerShape):
    """The talker: codec-token LM over summed text + codec embeddings."""

    vocab_size: int = Field(3072, ge=1, description="Codec vocabulary (acoustic + special ids).")
    text_vocab_size: int = Field(ge=1, description="Text vocabulary.")
    text_hidden_size: int = Field(ge=1, description="Text embedding width before projection.")


class CodePredictorShape(TransformerShape):
    """The code predictor: codebooks 1..15 of each frame from the talker's hidden state."""

    num_code_groups: int = Field(16, ge=2, description="Codebooks per frame.")
    codebook_size: int = Field(2048, ge=2, description="Entries per acoustic codebook.")


class CodecShape(Frozen):
    """The 12.5 Hz codec decoder (codes -> 24 kHz PCM)."""

    num_quantizers: int = Field(16, ge=1, description="RVQ codebooks.")
    codebook_size: int = Field(2048, ge=2, description="Entries per codebook.")
    codebook_dim: int = Field(
        256, ge=1, description="Width of one codebook entry (the projections output twice it)."
    )
    latent_dim: int = Field(1024, ge=1, description="Width after the pre-conv.")
    hidden_size: int = Field(512, ge=1, description="Transformer width.")
    num_layers: int = Field(8, ge=1, description="Transformer layers.")
    num_heads: int = Field(16, ge=1, description="Transformer heads.")
    head_dim: int = Field(64, ge=2, description="Transformer head width.")
    num_kv_heads: int | None = Field(None, ge=1, description="KV heads; unset: num_heads.")
    intermediate_size: int = Field(1024, ge=1, description="Transformer MLP width.")
    rms_norm_eps: float = Field(1e-5, gt=0, description="Transformer RMSNorm epsilon.")
    layer_scale: float = Field(0.01, description="Initial layer scale (dummy weights).")
    sliding_window: int = Field(72, ge=1, description="Attention window in frames.")
    rope_theta: float = Field(1e4, gt=0, description="RoPE base.")
    upsampling_ratios: tuple[int, ...] = Field((2, 2), description="Upsample+ConvNeXt factors.")
    upsample_rates: tuple[int, ...] = Field((8, 5, 4, 3), description="Conv decoder factors.")
    decoder_dim: int = Field(1536, ge=1, description="Conv decoder input width.")
    sample_rate: int = Field(24000, ge=1, description="Output sample rate.")


class CodecEncoderConfig(Frozen):
    """The speech tokenizer's encoder (24 kHz audio -> 16-codebook 12.5 Hz codes; a Mimi
    encoder), as `encoder_config` in speech_tokenizer/config.json spells it. Base models."""

    num_filters: int = Field(64, ge=1, description="First SEANet convolution's channels.")
    kernel_size: int = Field(7, ge=1, description="First convolution's kernel.")
    last_kernel_size: int = Field(3, ge=1, description="Last convolution's kernel.")
    residual_kernel_size: int = Field(3, ge=1, description="Residual blocks' kernel.")
    dilation_growth_rate: int = Field(2, ge=1, description="Dilation growth per residual layer.")
    num_residual_layers: int = Field(1, ge=1, description="Residual layers per SEANet stage.")
    compress: int = Field(2, ge=1, description="Residual blocks' channel compression.")
    upsampling_ratios: tuple[int, ...] = Field(
        (8, 6, 5, 4), description="SEANet strides (applied in reverse: 24 kHz -> 25 Hz)."
    )
    hidden_size: int = Field(512, ge=1, description="Transformer width.")
    num_hidden_layers: int = Field(8, ge=1, description="Transformer layers.")
    num_attention_heads: int = Field(8, ge=1, description="Transformer heads.")
    num_key_value_heads: int = Field(8, ge=1, description="Transformer KV heads.")
    head_dim: int = Field(64, ge=2, description="Transformer head width.")
    intermediate_size: int = Field(2048, ge=1, description="Transformer MLP width.")
    norm_eps: float = Field(1e-5, gt=0, description="Transformer LayerNorm epsilon.")
    rope_theta: float = Field(1e4, gt=0, description="Transformer RoPE base.")
    codebook_size: int = Field(2048, ge=2, description="Entries per codebook.")
    codebook_dim: int = Field(256, ge=1, description="Codebook entry width.")
    vector_quantization_hidden_dimension: int = Field(
        256, ge=1, description="Quantizer input width."
    )
    num_quantizers: int = Field(32, ge=1, description="Quantizer codebooks in the checkpoint.")
    num_semantic_quantizers: int = Field(1, ge=1, description="Semantic (first) codebooks.")
    frame_rate: float = Field(12.5, gt=0, description="Code frames per second.")
    sampling_rate: int = Field(24000, ge=1, description="Input sample rate.")
    valid_quantizers: int = Field(
        16, ge=1, description="Codes kept per frame (`encoder_valid_num_quantizers`)."
    )


class SpeakerEncoderConfig(Frozen):
    """The ECAPA-TDNN speaker encoder (128-bin log-mel -> speaker embedding), as
    `speaker_encoder_config` in a Base checkpoint's config.json spells it."""

    mel_dim: int = Field(128, ge=1, description="Log-mel bins.")
    enc_dim: int = Field(1024, ge=1, description="Embedding width (the talker's hidden size).")
    enc_channels: tuple[int, ...] = Field(
        (512, 512, 512, 512, 1536), description="Channels per TDNN layer."
    )
    enc_kernel_sizes: tuple[int, ...] = Field((5, 3, 3, 3, 1), description="Kernels per layer.")
    enc_dilations: tuple[int, ...] = Field((1, 2, 3, 4, 1), description="Dilations per layer.")
    enc_attention_channels: int = Field(128, ge=1, description="Attentive pooling width.")
    enc_res2net_scale: int = Field(8, ge=1, description="Res2Net scale.")
    enc_se_channels: int = Field(128, ge=1, description="Squeeze-excitation width.")
    sample_rate: int = Field(24000, ge=1, description="Input sample rate.")


class ModelConfig(Frozen):
    """A model preset: family, shapes and where the weights come from."""

    family: Literal["qwen3_tts"] = Field(description="Model family (selects the registry).")
    name: str = Field(description="Served model name.")
    load: Literal["auto", "dummy", "checkpoint"] = Field(
        "auto", description="auto: checkpoint when `path` is set, else dummy weights."
    )
    path: str | None = Field(None, description="Checkpoint directory (published layout).")
    seed: int = Field(0, description="Seed of the deterministic dummy initialisation.")
    allow_large_dummy: bool = Field(
        False,
        description="On the CPU, build dummy weights (noise, not speech) even when they and "
        "the KV cache take over 1 GiB (a real-size preset without model.path); refused "
        "where it cannot act (a checkpoint, or another platform).",
    )
    dtype: Dtype | None = Field(None, description="Weights/activations dtype; unset: platform's.")
    codec_dtype: Dtype | None = Field(
        None,
        description="The streaming codec decoder's dtype; unset: the platform's (float16 on "
        "CUDA, float32 elsewhere). float32 gives exact PCM; bfloat16 and float16 a faster "
        "decoder at large batches on a GPU, PCM within a stated bound of float32's "
        "(docs/reference.md).",
    )
    tokenizer: Literal["auto", "byte", "bpe"] = Field(
        "auto", description="auto: the checkpoint's BPE with a path, else byte-level."
    )
    supports_instructions: bool = Field(
        True, description="Style instructions are part of the prompt (the 0.6B model has none)."
    )
    voice_design: bool = Field(
        False,
        description="A VoiceDesign model (the checkpoint's tts_model_type 'voice_design'): no "
        "preset speakers; each request describes its voice in `instructions`.",
    )
    talker: TalkerShape = Field(description="Talker shape.")
    code_predictor: CodePredictorShape = Field(description="Code predictor shape.")
    codec: CodecShape = Field(description="Codec decoder shape.")
    codec_encoder: CodecEncoderConfig | None = Field(
        None, description="Base models (voice clone): the codec encoder's shape; unset: none."
    )
    speaker_encoder: SpeakerEncoderConfig | None = Field(
        None,
        description="Base models (voice clone): the speaker encoder's shape; unset: a "
        "CustomVoice model, which refuses voice-clone requests.",
    )

    @property
    def task_type(self) -> str:
        """The speech task the model serves (the API's `task_type`): Base where it has a
        speaker encoder (voice clone), VoiceDesign where it is declared so, else CustomVoice."""
        if self.speaker_encoder is not None:
            return "Base"
        return "VoiceDesign" if self.voice_design else "CustomVoice"
