"""config.json hyperparameters against the preset: a checkpoint that states another RoPE
base, norm epsilon, MRoPE section, activation, ... is refused with the key named, since its
tensors' shapes alone would load (and compute something else than the official code)."""

from __future__ import annotations

import copy
import json

import pytest

from omniflow.models.qwen3_tts.checkpoint_config import (
    ConfigMismatch,
    check_codec_config,
    check_talker_config,
)
from omniflow.models.qwen3_tts.loader import CheckpointError, vocab_from_config
from tests.reference import ours
from tests.reference.cases import Fixture

PRESET = "qwen3_tts_tiny"


@pytest.fixture(scope="module")
def fx() -> Fixture:
    return Fixture.load(PRESET)


@pytest.fixture(scope="module")
def model(fx, tmp_path_factory):
    d = tmp_path_factory.mktemp("cfg")
    (d / "config.json").write_text(json.dumps(fx.talker_config))
    return ours.model_config(PRESET, d)


def tampered(cfg: dict, path: str, value) -> dict:
    out = copy.deepcopy(cfg)
    *parents, leaf = path.split(".")
    node = out
    for p in parents:
        node = node[p]
    if value is DELETE:
        del node[leaf]
    else:
        node[leaf] = value
    return out


DELETE = object()


def test_the_official_configs_pass(fx, model):
    check_talker_config(fx.talker_config, model)
    check_codec_config(fx.codec_config, model.codec)


@pytest.mark.parametrize(
    ("path", "value", "names"),
    [
        ("talker_config.rope_theta", 10000.0, "model.talker.rope_theta"),
        ("talker_config.rope_theta", DELETE, "model.talker.rope_theta"),  # official default 1e4
        ("talker_config.rms_norm_eps", 1e-5, "model.talker.rms_norm_eps"),
        ("talker_config.rope_scaling.mrope_section", [4, 4, 4], "mrope_section"),
        ("talker_config.rope_scaling.rope_type", "yarn", "rope_type"),
        ("talker_config.rope_scaling", DELETE, "talker_config.rope_scaling"),
        ("talker_config.partial_rotary_factor", 0.5, "partial_rotary_factor"),
        ("talker_config.hidden_act", "gelu", "talker_config.hidden_act"),
        ("talker_config.attention_bias", True, "talker_config.attention_bias"),
        ("talker_config.use_sliding_window", True, "talker_config.use_sliding_window"),
        ("talker_config.head_dim", 32, "model.talker.head_dim"),
        ("talker_config.num_code_groups", 8, "num_code_groups"),
        ("talker_config.text_vocab_size", DELETE, "talker_config.text_vocab_size"),
        (
            "talker_config.code_predictor_config.rope_theta",
            10000.0,
            "model.code_predictor.rope_theta",
        ),
        (
            "talker_config.code_predictor_config.rms_norm_eps",
            1e-5,
            "model.code_predictor.rms_norm_eps",
        ),
        (
            "talker_config.code_predictor_config.layer_types",
            ["sliding_attention"],
            "layer_types",
        ),
        ("tokenizer_type", "qwen3_tts_tokenizer_25hz", "tokenizer_type"),
    ],
)
def test_a_talker_mismatch_is_refused_naming_the_key(fx, model, path, value, names):
    with pytest.raises(ConfigMismatch, match=names.replace(".", r"\.")):
        check_talker_config(tampered(fx.talker_config, path, value), model)


@pytest.mark.parametrize(
    ("path", "value", "names"),
    [
        ("decoder_config.rope_theta", 1e6, "model.codec.rope_theta"),
        ("decoder_config.rms_norm_eps", 1e-6, "model.codec.rms_norm_eps"),
        ("decoder_config.sliding_window", 64, "model.codec.sliding_window"),
        ("decoder_config.head_dim", 8, "model.codec.head_dim"),
        ("decoder_config.num_key_value_heads", 1, "num_key_value_heads"),
        ("decoder_config.codebook_dim", 64, "codebook_dim"),
        ("decoder_config.upsample_rates", [8, 5, 4, 2], "model.codec.upsample_rates"),
        ("decoder_config.hidden_act", "gelu", "decoder_config.hidden_act"),
        ("output_sample_rate", 16000, "model.codec.sample_rate"),
        ("decode_upsample_rate", 960, "decode_upsample_rate"),
    ],
)
def test_a_codec_mismatch_is_refused_naming_the_key(fx, model, path, value, names):
    with pytest.raises(ConfigMismatch, match=names.replace(".", r"\.")):
        check_codec_config(tampered(fx.codec_config, path, value), model.codec)


def test_a_tampered_config_json_is_refused_when_loading(fx, tmp_path):
    """The loaders run the check: a checkpoint directory with another rope_theta."""
    tampered_config = tampered(fx.talker_config, "talker_config.rope_theta", 10000.0)
    directory = ours.write_checkpoint(tmp_path, fx, talker_config=tampered_config)
    with pytest.raises(CheckpointError, match=r"model\.talker\.rope_theta is 1000000\.0"):
        ours.load(ours.model_config(PRESET, directory))
    (tmp_path / "config.json").write_text(json.dumps(fx.talker_config))
    cfg = tampered(fx.codec_config, "decoder_config.rms_norm_eps", 1e-6)
    (tmp_path / "speech_tokenizer" / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"model\.codec\.rms_norm_eps"):
        ours.load(ours.model_config(PRESET, directory))


def test_a_dialect_must_name_a_language(fx):
    cfg = tampered(fx.talker_config, "talker_config.spk_is_dialect.dylan", "shanghai_dialect")
    with pytest.raises(CheckpointError, match="shanghai_dialect"):
        vocab_from_config(cfg)
    vocab, _ = vocab_from_config(fx.talker_config)
    assert vocab.dialects == {"dylan": "beijing_dialect", "eric": "sichuan_dialect"}


def test_dialects_are_read_from_the_config(fx):
    """spk_is_dialect acts as the checkpoint states it (not the defaults)."""
    cfg = tampered(fx.talker_config, "talker_config.spk_is_dialect.dylan", False)
    cfg = tampered(cfg, "talker_config.spk_is_dialect.vivian", "sichuan_dialect")
    vocab, _ = vocab_from_config(cfg)
    assert vocab.dialects == {"vivian": "sichuan_dialect", "eric": "sichuan_dialect"}
    assert vocab.language_id("chinese", "dylan") == vocab.languages["chinese"]
    assert vocab.language_id("auto", "vivian") == vocab.languages["sichuan_dialect"]
