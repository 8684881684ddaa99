"""The codec encoder and speaker encoder: dummy weights for the tiny preset, strict loading
from the published layout, and config mismatches named. Their numbers are compared with the
official implementation in tests/reference/test_reference_fixtures.py."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from omniflow.models.qwen3_tts.codec_encoder import CodecEncoderShape, load_codec_encoder
from omniflow.models.qwen3_tts.loader import CheckpointError
from omniflow.models.qwen3_tts.speaker_encoder import SpeakerEncoderShape, load_speaker_encoder
from tests.factories import tiny_model_config
from tests.reference import ours
from tests.reference.cases import Fixture, make_audio


@pytest.fixture(scope="module")
def fx() -> Fixture:
    return Fixture.load("qwen3_tts_tiny")


@pytest.fixture
def checkpoint(fx, tmp_path):
    return ours.write_checkpoint(tmp_path, fx, seed=1)


def test_the_toy_shapes_are_the_reference_tested_ones(fx):
    m = tiny_model_config()
    assert CodecEncoderShape.toy(m.codec) == CodecEncoderShape.from_config(fx.codec_config)
    spk = SpeakerEncoderShape.from_config(fx.talker_config["speaker_encoder_config"])
    assert SpeakerEncoderShape.toy(m.talker.hidden_size) == spk


def test_dummy_encoders_are_deterministic_and_shaped():
    m = tiny_model_config()
    audio = make_audio("unit", 5000)[None]
    enc_a = load_codec_encoder(CodecEncoderShape.toy(m.codec), None, seed=3)
    enc_b = load_codec_encoder(CodecEncoderShape.toy(m.codec), None, seed=3)
    codes = enc_a.encode(audio)
    assert codes.shape == (1, 3, 16) and codes.equal(enc_b.encode(audio))
    assert int(codes.min()) >= 0 and int(codes.max()) < m.codec.codebook_size
    spk = load_speaker_encoder(SpeakerEncoderShape.toy(m.talker.hidden_size), None, seed=3)
    other = load_speaker_encoder(SpeakerEncoderShape.toy(m.talker.hidden_size), None, seed=4)
    emb = spk.embed(audio)
    assert emb.shape == (1, m.talker.hidden_size) and torch.isfinite(emb).all()
    assert not emb.equal(other.embed(audio))


def test_config_mismatches_are_refused_naming_the_key(fx, checkpoint):
    m = tiny_model_config()
    cfg = copy.deepcopy(fx.talker_config)
    cfg["speaker_encoder_config"]["enc_se_channels"] = 4
    (checkpoint / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="speaker_encoder_config.enc_se_channels"):
        load_speaker_encoder(SpeakerEncoderShape.toy(m.talker.hidden_size), checkpoint, 0)
    cfg = copy.deepcopy(fx.codec_config)
    cfg["encoder_config"]["num_hidden_layers"] = 2
    (checkpoint / "speech_tokenizer" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="num_hidden_layers"):
        load_codec_encoder(CodecEncoderShape.toy(m.codec), checkpoint, 0)
    cfg["encoder_config"]["hidden_act"] = "relu"
    with pytest.raises(CheckpointError, match=r"encoder_config\.hidden_act"):
        CodecEncoderShape.from_config(cfg)


def test_missing_tensors_are_named(checkpoint):
    m = tiny_model_config()
    path = checkpoint / "model.safetensors"
    tensors = load_file(str(path))
    del tensors["speaker_encoder.asp.conv.weight"]
    save_file(tensors, str(path))
    with pytest.raises(CheckpointError, match=r"speaker_encoder\.asp\.conv\.weight"):
        load_speaker_encoder(SpeakerEncoderShape.toy(m.talker.hidden_size), checkpoint, 0)
    path = checkpoint / "speech_tokenizer" / "model.safetensors"
    tensors = load_file(str(path))
    key = "encoder.quantizer.acoustic_residual_vector_quantizer.layers.3.codebook.embed_sum"
    del tensors[key]
    save_file(tensors, str(path))
    with pytest.raises(CheckpointError, match=key.replace(".", r"\.")):
        load_codec_encoder(CodecEncoderShape.toy(m.codec), checkpoint, 0)


def test_speaker_shape_rules():
    with pytest.raises(ValueError, match="sum"):
        SpeakerEncoderShape(enc_channels=(16, 16, 16, 16, 40))
