"""Checkpoint I/O in the published Qwen3-TTS layout.

    DIR/config.json                 talker_config (shapes, codec ids, spk_id, languages),
                                    tts_{pad,bos,eos}_token_id
    DIR/model.safetensors           talker.* and talker.code_predictor.* (or sharded, with
                                    model.safetensors.index.json)
    DIR/speech_tokenizer/           the codec (decoder.*), read by the codec loader

Loading is strict inside `talker.`: a missing or mis-shaped tensor, or an unexpected one,
is a `CheckpointError` naming the tensor. Other top-level groups (speaker_encoder.* in Base
checkpoints) are not the talker's and are skipped.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import nn

from omniflow.models.qwen3_tts.vocab import CodecVocab

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
            for key in f.keys():  # noqa: SIM118 - safe_open is not a mapping
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
    """Codec ids, speakers and languages, and the tts_{pad,bos,eos} text ids."""
    t = cfg.get("talker_config", {})
    base = CodecVocab()
    vocab = CodecVocab(
        pad=t.get("codec_pad_id", base.pad),
        bos=t.get("codec_bos_id", base.bos),
        eos=t.get("codec_eos_token_id", base.eos),
        think=t.get("codec_think_id", base.think),
        nothink=t.get("codec_nothink_id", base.nothink),
        think_bos=t.get("codec_think_bos_id", base.think_bos),
        think_eos=t.get("codec_think_eos_id", base.think_eos),
        languages={k.lower(): v for k, v in t.get("codec_language_id", base.languages).items()},
        speakers={k.lower(): v for k, v in t.get("spk_id", base.speakers).items()},
    )
    tts = (
        cfg.get("tts_pad_token_id", 151671),
        cfg.get("tts_bos_token_id", 151672),
        cfg.get("tts_eos_token_id", 151673),
    )
    return vocab, tts


def save_talker(
    module: nn.Module, directory: Path, vocab: CodecVocab, extra_config: dict | None = None
) -> None:
    """Write `module` (keys `talker.*`) and a config.json in the published layout."""
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous().cpu() for k, v in module.state_dict().items()}
    save_file(tensors, str(directory / "model.safetensors"))
    v = asdict(vocab)
    talker_config = {
        "codec_pad_id": v["pad"],
        "codec_bos_id": v["bos"],
        "codec_eos_token_id": v["eos"],
        "codec_think_id": v["think"],
        "codec_nothink_id": v["nothink"],
        "codec_think_bos_id": v["think_bos"],
        "codec_think_eos_id": v["think_eos"],
        "codec_language_id": v["languages"],
        "spk_id": v["speakers"],
    }
    cfg = {"talker_config": talker_config, **(extra_config or {})}
    (directory / "config.json").write_text(json.dumps(cfg, indent=2))
