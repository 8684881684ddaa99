"""Codec checkpoint round trip in the published speech_tokenizer/ layout."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from omniflow.models.qwen3_tts.codec_loader import codec_dir, load_codec, save_codec
from omniflow.models.qwen3_tts.codec_modules import SpeechTokenizerWeights, init_dummy_codec
from omniflow.models.qwen3_tts.loader import CheckpointError
from tests.factories import tiny_model_config


def saved(tmp_path):
    shape = tiny_model_config().codec
    w = SpeechTokenizerWeights(shape)
    init_dummy_codec(w, 3)
    save_codec(w, tmp_path)
    return shape, w


def test_round_trip_is_bit_exact(tmp_path):
    shape, w = saved(tmp_path)
    loaded = load_codec(shape, tmp_path, seed=0).state_dict()
    for key, value in w.state_dict().items():
        assert key.startswith("decoder.")
        assert torch.equal(loaded[key], value), key
    keys = set(load_file(str(codec_dir(tmp_path) / "model.safetensors")))
    assert "decoder.pre_transformer.layers.0.self_attn_layer_scale.scale" in keys
    assert "decoder.decoder.1.block.1.conv.weight" in keys  # transposed conv, [in, out, k]
    assert "decoder.quantizer.rvq_first.vq.layers.0._codebook.embedding_sum" in keys


def test_missing_tensor_and_shape_mismatch_are_named(tmp_path):
    shape, _ = saved(tmp_path)
    f = codec_dir(tmp_path) / "model.safetensors"
    tensors = load_file(str(f))
    tensors["encoder.some.weight"] = torch.zeros(1)  # encoder tensors are skipped
    del tensors["decoder.pre_conv.conv.weight"]
    save_file(tensors, str(f))
    with pytest.raises(CheckpointError, match=r"decoder\.pre_conv\.conv\.weight"):
        load_codec(shape, tmp_path, seed=0)


def test_config_mismatch_names_the_preset_key(tmp_path):
    shape, _ = saved(tmp_path)
    cfg_path = codec_dir(tmp_path) / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["decoder_config"]["sliding_window"] = 64
    cfg_path.write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"model\.codec\.sliding_window"):
        load_codec(shape, tmp_path, seed=0)
