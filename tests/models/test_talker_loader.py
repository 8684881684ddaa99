"""Loader round trip in the published layout, and errors naming the tensor."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from omniflow.errors import ConfigError
from omniflow.models.qwen3_tts.factory import build_talker
from omniflow.models.qwen3_tts.loader import CheckpointError, save_talker
from omniflow.models.qwen3_tts.modules import Qwen3TTSTalkerWeights, init_dummy
from omniflow.models.qwen3_tts.vocab import CodecVocab
from tests.factories import tiny_model_config


def saved_tiny(tmp_path: Path) -> tuple[Path, Qwen3TTSTalkerWeights]:
    cfg = tiny_model_config()
    weights = Qwen3TTSTalkerWeights(cfg.talker, cfg.code_predictor)
    init_dummy(weights, seed=123)
    vocab = CodecVocab(speakers={"vivian": 3065, "tester": 3000})
    save_talker(
        weights,
        tmp_path,
        vocab,
        {"tts_pad_token_id": 259, "tts_bos_token_id": 260, "tts_eos_token_id": 261},
    )
    return tmp_path, weights


def load(path: Path):
    graph = build_graph(compose(["platform=cpu", f"model.path={path}", "model.tokenizer=byte"]))
    return build_talker(graph.model, torch.device("cpu"))


def test_published_key_names():
    cfg = tiny_model_config()
    keys = set(Qwen3TTSTalkerWeights(cfg.talker, cfg.code_predictor).state_dict())
    for key in (
        "talker.model.codec_embedding.weight",
        "talker.model.text_embedding.weight",
        "talker.model.layers.0.self_attn.q_norm.weight",
        "talker.model.layers.0.mlp.gate_proj.weight",
        "talker.text_projection.linear_fc1.bias",
        "talker.codec_head.weight",
        "talker.code_predictor.model.codec_embedding.14.weight",
        "talker.code_predictor.lm_head.0.weight",
        "talker.code_predictor.small_to_mtp_projection.weight",
    ):
        assert key in keys


def test_round_trip_is_bit_exact(tmp_path):
    path, weights = saved_tiny(tmp_path)
    bundle = load(path)
    loaded = bundle.talker.weights.state_dict()
    for key, value in weights.state_dict().items():
        assert torch.equal(loaded[key], value), key
    assert bundle.vocab.speakers["tester"] == 3000  # config.json was read


def test_missing_tensor_is_named(tmp_path):
    path, _ = saved_tiny(tmp_path)
    tensors = load_file(str(path / "model.safetensors"))
    del tensors["talker.code_predictor.lm_head.3.weight"]
    save_file(tensors, str(path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"talker\.code_predictor\.lm_head\.3\.weight"):
        load(path)


def test_misshaped_tensor_is_named(tmp_path):
    path, _ = saved_tiny(tmp_path)
    tensors = load_file(str(path / "model.safetensors"))
    tensors["talker.codec_head.weight"] = torch.zeros(10, 10)
    save_file(tensors, str(path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"talker\.codec_head\.weight.*shape"):
        load(path)


def test_foreign_groups_are_skipped_but_unknown_talker_tensors_refused(tmp_path):
    path, _ = saved_tiny(tmp_path)
    tensors = load_file(str(path / "model.safetensors"))
    tensors["speaker_encoder.fc.weight"] = torch.zeros(2, 2)
    save_file(tensors, str(path / "model.safetensors"))
    load(path)
    tensors["talker.model.extra.weight"] = torch.zeros(2)
    save_file(tensors, str(path / "model.safetensors"))
    with pytest.raises(CheckpointError, match=r"talker\.model\.extra\.weight"):
        load(path)


def test_missing_checkpoint_files(tmp_path):
    # the graph refuses a directory without config.json (omniflow config says so too) ...
    with pytest.raises(ConfigError, match="model.path.*config.json"):
        load(tmp_path)
    # ... and the loader, given one anyway, names the missing file
    (tmp_path / "config.json").write_text("{}")
    model = build_graph(compose(["platform=cpu", f"model.path={tmp_path}"])).model
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(CheckpointError, match="config.json"):
        build_talker(model.model_copy(update={"path": str(empty)}), torch.device("cpu"))
