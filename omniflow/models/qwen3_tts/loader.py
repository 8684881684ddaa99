"""Checkpoint I/O in the published Qwen3-TTS layout.

    DIR/config.json                 talker_config (shapes, codec ids, spk_id, languages),
                                    tts_{pad,bos,eos}_token_id
    DIR/model.safetensors           talker.* and talker.code_predictor.* (or sharded, with
                                    model.safetensors.index.json)
    DIR/speech_tokenizer/           the codec (decoder.*), read by the codec loader

Loading is strict inside `talker.`: a missing or mis-shaped tensor, or an unexpected one,
is a `CheckpointError` naming the tensor. Other top-level groups (speaker_encoder.* in Base
checkpoints) are not the talker's and are skipped. config.json's hyperparameters are
compared with the preset by `checkpoint_config.py` (a RoPE base or norm epsilon has no shape).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn
from tqdm import tqdm

from omniflow.models.qwen3_tts.modules import Qwen3TTSTalkerWeights
from omniflow.models.qwen3_tts.vocab import CodecVocab
from omniflow.models.shapes import CodePredictorShape, TalkerShape, TransformerShape

PREFIX = "talker."


class CheckpointError(ValueError):
    """The checkpoint does not match the model it is loaded into."""


def weight_files(directory: Path) -> list[Path]:
    index = directory / "model.safetensors.index.json"
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [directory / n for n in names]
    single = directory / "model.safetensors"
    if single.is_file():
        return [single]
    raise CheckpointError(f"{directory}: no model.safetensors (or its index)")


def load_state(module: nn.Module, files: list[Path], prefix: str) -> None:
    """Copy tensors named `prefix...` into `module` (whose own keys carry that prefix)."""
    expected = module.state_dict()
    seen: set[str] = set()
    for path in files:
        with safe_open(str(path), framework="pt") as f:
            # a progress bar on a terminal (weights of a real model take a while)
            for key in tqdm(f.keys(), f"loading {path.name}", leave=False, disable=None):
                if not key.startswith(prefix):
                    continue
                if key not in expected:
                    raise CheckpointError(f"unexpected tensor {key!r} in {path.name}")
                tensor = f.get_tensor(key)
                want = expected[key]
                if tuple(tensor.shape) != tuple(want.shape):
                    raise CheckpointError(
                        f"tensor {key!r} has shape {tuple(tensor.shape)}, "
                        f"the model expects {tuple(want.shape)}"
                    )
                with torch.no_grad():
                    want.copy_(tensor.to(want.dtype))
                seen.add(key)
    missing = sorted(set(expected) - seen)
    if missing:
        more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
        raise CheckpointError(f"missing tensor {missing[0]!r}{more}")


def read_config(directory: Path) -> dict:
    path = directory / "config.json"
    if not path.is_file():
        raise CheckpointError(f"{directory}: no config.json")
    return json.loads(path.read_text())


def vocab_from_config(cfg: dict) -> tuple[CodecVocab, tuple[int, int, int]]:
    """Codec ids, speakers, languages and dialects, and the tts_{pad,bos,eos} text ids."""
    t = cfg.get("talker_config", {})
    base = CodecVocab()
    languages = {k.lower(): v for k, v in t.get("codec_language_id", base.languages).items()}
    speakers = {k.lower(): v for k, v in t.get("spk_id", base.speakers).items()}
    raw_dialects = t.get("spk_is_dialect", base.dialects if "spk_id" not in t else {}) or {}
    dialects = {k.lower(): str(v).lower() for k, v in raw_dialects.items() if v}
    for speaker, dialect in dialects.items():
        if dialect not in languages:
            raise CheckpointError(
                f"talker_config.spk_is_dialect names {dialect!r} for {speaker!r}, which is not "
                f"in talker_config.codec_language_id"
            )
    vocab = CodecVocab(
        pad=t.get("codec_pad_id", base.pad),
        bos=t.get("codec_bos_id", base.bos),
        eos=t.get("codec_eos_token_id", base.eos),
        think=t.get("codec_think_id", base.think),
        nothink=t.get("codec_nothink_id", base.nothink),
        think_bos=t.get("codec_think_bos_id", base.think_bos),
        think_eos=t.get("codec_think_eos_id", base.think_eos),
        languages=languages,
        speakers=speakers,
        dialects=dialects,
    )
    tts = (
        cfg.get("tts_pad_token_id", 151671),
        cfg.get("tts_bos_token_id", 151672),
        cfg.get("tts_eos_token_id", 151673),
    )
    return vocab, tts


def talker_hyperparameters(talker: TalkerShape, predictor: CodePredictorShape) -> dict:
    """`talker_config` hyperparameters in the published spelling (the keys the official code
    reads; `checkpoint_config.check_talker_config` compares them with a preset)."""

    def common(s: TransformerShape) -> dict:
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
        }

    half = talker.head_dim // 2  # any sections covering it compute the same (equal streams)
    mrope = [24, 20, 20] if half == 64 else [half - 2 * (half // 3), half // 3, half // 3]
    return {
        **common(talker),
        "vocab_size": talker.vocab_size,
        "text_vocab_size": talker.text_vocab_size,
        "text_hidden_size": talker.text_hidden_size,
        "num_code_groups": predictor.num_code_groups,
        "rope_scaling": {"rope_type": "default", "mrope_section": mrope, "interleaved": True},
        "code_predictor_config": {
            **common(predictor),
            "vocab_size": predictor.codebook_size,
            "num_code_groups": predictor.num_code_groups,
        },
    }


def save_talker(
    module: Qwen3TTSTalkerWeights,
    directory: Path,
    vocab: CodecVocab,
    extra_config: dict | None = None,
) -> None:
    """Write `module` (keys `talker.*`) and a config.json in the published layout, with the
    hyperparameters of the shapes `module` was built from."""
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()}
    save_file(tensors, str(directory / "model.safetensors"))
    v = asdict(vocab)
    talker_config = {
        **talker_hyperparameters(module.talker_shape, module.predictor_shape),
        "codec_pad_id": v["pad"],
        "codec_bos_id": v["bos"],
        "codec_eos_token_id": v["eos"],
        "codec_think_id": v["think"],
        "codec_nothink_id": v["nothink"],
        "codec_think_bos_id": v["think_bos"],
        "codec_think_eos_id": v["think_eos"],
        "codec_language_id": v["languages"],
        "spk_id": v["speakers"],
        "spk_is_dialect": {name: v["dialects"].get(name, False) for name in v["speakers"]},
    }
    cfg = {"talker_config": talker_config, **(extra_config or {})}
    (directory / "config.json").write_text(json.dumps(cfg, indent=2))
