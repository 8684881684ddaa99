"""The real-size Base presets (`model=qwen3_tts_0_6b_base`, `model=qwen3_tts_1_7b_base`):
they compose, state the published checkpoints' shapes (config.json files in the published
layout pass every cross-check the loaders make, and a config of the other size or type is
refused naming the key), and their encoders build at those widths with dummy weights. The
talkers (0.9B and 1.9B parameters) are built only on a GPU (`-m cuda`)."""

from __future__ import annotations

import copy
import json

import pytest

from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from omniflow.models.qwen3_tts.checkpoint_config import (
    ConfigMismatch,
    check_codec_config,
    check_talker_config,
)
from omniflow.models.qwen3_tts.codec_encoder import CodecEncoderShape, load_codec_encoder
from omniflow.models.qwen3_tts.loader import CheckpointError
from omniflow.models.qwen3_tts.reference import build_reference_encoders
from omniflow.models.qwen3_tts.speaker_encoder import (
    SpeakerEncoderShape,
    check_speaker_encoder_config,
    load_speaker_encoder,
)
from tests.factories import Collector, build
from tests.models.test_base_preset import clone_request
from tests.reference.cases import make_audio

SIBLING = {"qwen3_tts_0_6b_base": "qwen3_tts_0_6b", "qwen3_tts_1_7b_base": "qwen3_tts_1_7b"}
SIZE = {"qwen3_tts_0_6b_base": "0b6", "qwen3_tts_1_7b_base": "1b7"}


def preset(name: str, *overrides: str):
    return build_graph(compose(["platform=cpu", f"model={name}", *overrides])).model


def _lm(hidden: int, intermediate: int, layers: int) -> dict:
    return {
        "hidden_size": hidden,
        "intermediate_size": intermediate,
        "num_hidden_layers": layers,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "rms_norm_eps": 1e-06,
        "rope_theta": 1000000,
        "hidden_act": "silu",
        "attention_bias": False,
        "max_position_embeddings": 32768,
    }


def published_config(size: str) -> dict:
    """config.json of Qwen3-TTS-12Hz-{0.6B,1.7B}-Base as published (the keys the official
    code reads; the codec id tables are left out: the vocabulary has its own tests)."""
    hidden, intermediate = {"0b6": (1024, 3072), "1b7": (2048, 6144)}[size]
    return {
        "architectures": ["Qwen3TTSForConditionalGeneration"],
        "model_type": "qwen3_tts",
        "tokenizer_type": "qwen3_tts_tokenizer_12hz",
        "tts_model_size": size,
        "tts_model_type": "base",
        "speaker_encoder_config": {"enc_dim": hidden, "sample_rate": 24000},
        "talker_config": {
            **_lm(hidden, intermediate, 28),
            "vocab_size": 3072,
            "text_vocab_size": 151936,
            "text_hidden_size": 2048,
            "num_code_groups": 16,
            "rope_scaling": {"interleaved": True, "mrope_section": [24, 20, 20]},
            "use_sliding_window": False,
            "spk_id": {},
            "code_predictor_config": {
                **_lm(1024, 3072, 5),
                "vocab_size": 2048,
                "num_code_groups": 16,
                "use_sliding_window": False,
                "layer_types": ["full_attention"] * 5,
            },
        },
    }


PUBLISHED_CODEC = {
    "model_type": "qwen3_tts_tokenizer_12hz",
    "encoder_valid_num_quantizers": 16,
    "input_sample_rate": 24000,
    "output_sample_rate": 24000,
    "decode_upsample_rate": 1920,
    "encode_downsample_rate": 1920,
    "encoder_config": {
        "_frame_rate": 12.5,
        "attention_bias": False,
        "audio_channels": 1,
        "codebook_dim": 256,
        "codebook_size": 2048,
        "compress": 2,
        "dilation_growth_rate": 2,
        "head_dim": 64,
        "hidden_act": "gelu",
        "hidden_size": 512,
        "intermediate_size": 2048,
        "kernel_size": 7,
        "last_kernel_size": 3,
        "norm_eps": 1e-05,
        "num_attention_heads": 8,
        "num_filters": 64,
        "num_hidden_layers": 8,
        "num_key_value_heads": 8,
        "num_quantizers": 32,
        "num_residual_layers": 1,
        "num_semantic_quantizers": 1,
        "pad_mode": "constant",
        "residual_kernel_size": 3,
        "rope_theta": 10000.0,
        "sampling_rate": 24000,
        "sliding_window": 250,
        "upsampling_ratios": [8, 6, 5, 4],
        "use_causal_conv": True,
        "use_conv_shortcut": False,
        "vector_quantization_hidden_dimension": 256,
    },
    "decoder_config": {
        "attention_bias": False,
        "codebook_dim": 512,
        "codebook_size": 2048,
        "decoder_dim": 1536,
        "head_dim": 64,
        "hidden_act": "silu",
        "hidden_size": 512,
        "intermediate_size": 1024,
        "latent_dim": 1024,
        "num_attention_heads": 16,
        "num_hidden_layers": 8,
        "num_key_value_heads": 16,
        "num_quantizers": 16,
        "rms_norm_eps": 1e-05,
        "rope_theta": 10000,
        "sliding_window": 72,
        "upsample_rates": [8, 5, 4, 3],
        "upsampling_ratios": [2, 2],
    },
}


@pytest.mark.parametrize("name", sorted(SIBLING))
def test_a_base_preset_is_its_custom_voice_sibling_plus_the_encoders(name):
    m, sibling = preset(name), preset(SIBLING[name])
    assert m.load == "dummy" and m.name == f"qwen3-tts-12hz-{SIZE[name][0]}.{SIZE[name][2]}b-base"
    for part in ("talker", "code_predictor", "codec"):
        assert getattr(m, part) == getattr(sibling, part)
    assert sibling.speaker_encoder is None and sibling.codec_encoder is None
    assert m.speaker_encoder.enc_dim == m.talker.hidden_size
    assert not m.supports_instructions  # Base models take no style instruction


@pytest.mark.parametrize("name", sorted(SIBLING))
def test_the_published_configs_pass_every_cross_check(name):
    m, cfg = preset(name), published_config(SIZE[name])
    check_talker_config(cfg, m)
    check_codec_config(PUBLISHED_CODEC, m.codec)
    check_speaker_encoder_config(SpeakerEncoderShape(**m.speaker_encoder.model_dump()), cfg)
    ours = CodecEncoderShape(**m.codec_encoder.model_dump())
    assert CodecEncoderShape.from_config(PUBLISHED_CODEC) == ours


def tampered(cfg: dict, path: str, value) -> dict:
    out = copy.deepcopy(cfg)
    *parents, leaf = path.split(".")
    node = out
    for p in parents:
        node = node[p]
    if value is None:
        del node[leaf]
    else:
        node[leaf] = value
    return out


@pytest.mark.parametrize(
    ("name", "size", "path", "value", "names"),
    [
        ("qwen3_tts_1_7b_base", "0b6", None, None, "model.talker.hidden_size is 2048"),
        ("qwen3_tts_0_6b_base", "1b7", None, None, "model.talker.hidden_size is 1024"),
        ("qwen3_tts_0_6b_base", "0b6", "tts_model_type", "custom_voice", "tts_model_type"),
        ("qwen3_tts_1_7b_base", "1b7", "tts_model_type", None, "tts_model_type = None"),
        (
            "qwen3_tts_1_7b_base",
            "1b7",
            "talker_config.code_predictor_config.num_hidden_layers",
            4,
            "model.code_predictor.num_layers",
        ),
    ],
)
def test_a_config_of_another_size_or_type_is_refused(name, size, path, value, names):
    cfg = published_config(size)
    if path is not None:
        cfg = tampered(cfg, path, value)
    with pytest.raises(ConfigMismatch, match=names):
        check_talker_config(cfg, preset(name))


def test_the_speaker_encoder_of_the_other_size_is_refused(tmp_path):
    """The 0.6B's 1,024-wide embedding under the 1.7B preset: its loader refuses it before
    reading a tensor."""
    (tmp_path / "config.json").write_text(json.dumps(published_config("0b6")))
    shape = SpeakerEncoderShape(**preset("qwen3_tts_1_7b_base").speaker_encoder.model_dump())
    with pytest.raises(CheckpointError, match="speaker_encoder_config.enc_dim = 1024"):
        load_speaker_encoder(shape, tmp_path, 0)


@pytest.mark.parametrize(
    ("key", "value"), [("num_hidden_layers", 4), ("upsampling_ratios", [8, 5, 4, 2])]
)
def test_a_codec_encoder_of_another_shape_is_refused(tmp_path, key, value):
    d = tmp_path / "speech_tokenizer"
    d.mkdir()
    (d / "config.json").write_text(
        json.dumps(tampered(PUBLISHED_CODEC, f"encoder_config.{key}", value))
    )
    shape = CodecEncoderShape(**preset("qwen3_tts_0_6b_base").codec_encoder.model_dump())
    with pytest.raises(CheckpointError, match=f"codec encoder {key}"):
        load_codec_encoder(shape, tmp_path, 0)


def test_the_0_6b_encoders_build_and_encode_at_the_published_widths():
    """Dummy weights at the real widths (40M + 9M parameters): 4,000 samples -> 3 frames
    (1,920 samples each, the last padded) of 16 codes, and an embedding as wide as the
    talker: the shapes its requests must have."""
    m = preset("qwen3_tts_0_6b_base")
    encoders = build_reference_encoders(m)
    assert encoders is not None
    got = encoders.encode(make_audio("base-preset", 4000))
    assert len(got.ref_codes) == 3 and {len(f) for f in got.ref_codes} == {16}
    assert all(0 <= c < 2048 for f in got.ref_codes for c in f)
    assert len(got.speaker_embedding) == encoders.clone.hidden_size == 1024


def test_the_1_7b_speaker_encoder_embeds_as_wide_as_its_talker():
    """The 1.7B Base preset differs from the 0.6B's encoders only in the embedding width."""
    small, large = preset("qwen3_tts_0_6b_base"), preset("qwen3_tts_1_7b_base")
    assert large.codec_encoder == small.codec_encoder
    shape = SpeakerEncoderShape(**large.speaker_encoder.model_dump())
    speaker = load_speaker_encoder(shape, None, 0)
    emb = speaker.embed(make_audio("base-preset", 4000)[None])
    assert emb.shape == (1, 2048) and bool(emb.isfinite().all())


@pytest.mark.cuda
@pytest.mark.parametrize("name", sorted(SIBLING))
def test_a_real_size_base_pipeline_clones_a_voice_on_cuda(name):
    """The whole Base model at its real size with dummy weights (bf16): a voice-clone
    request runs to its length."""
    orch = build("qwen3_tts_fused", "platform=cuda", f"model={name}", "model.dtype=bfloat16")
    try:
        encoder = orch.reference_encoder()
        assert encoder is not None
        reference = encoder.encode(make_audio("base-preset", 24000))
        c = Collector()
        orch.submit(clone_request("real-size", reference), c)
        assert c.wait(300).terminal.error is None and c.pcm.size == 6 * 1920
    finally:
        orch.stop()
