"""Builds the talker (weights, tokenizer, vocab) from a resolved model config."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch

from omniflow.models.meta import materialize, on_meta
from omniflow.models.qwen3_tts.checkpoint_config import check_talker_config
from omniflow.models.qwen3_tts.loader import (
    load_state,
    read_config,
    vocab_from_config,
    weight_files,
)
from omniflow.models.qwen3_tts.modules import Qwen3TTSTalkerWeights, init_dummy
from omniflow.models.qwen3_tts.processor import CloneShape
from omniflow.models.qwen3_tts.reference import ReferenceEncoders, build_reference_encoders
from omniflow.models.qwen3_tts.talker import Talker
from omniflow.models.qwen3_tts.tokenizer import BPETokenizer, ByteTokenizer, TextTokenizer
from omniflow.models.qwen3_tts.vocab import CodecVocab, dummy_vocab
from omniflow.models.shapes import ModelConfig

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class TalkerBundle:
    talker: Talker
    tokenizer: TextTokenizer
    vocab: CodecVocab
    reference: ReferenceEncoders | None = None
    """A Base model's codec and speaker encoders (voice clone); None: CustomVoice."""

    @property
    def clone_shape(self) -> CloneShape | None:
        """What voice-clone requests must match; None: they are refused."""
        return self.reference.clone if self.reference is not None else None


def build_talker(config: ModelConfig, device: torch.device) -> TalkerBundle:
    """Dummy weights (seeded) or the checkpoint at config.path, on `device`."""
    dtype = DTYPES[config.dtype or "float32"]
    # Built without values, in place on the device: every parameter is then loaded or drawn,
    # so torch's default initialisation (slow on the CPU for a model's billions of
    # parameters) and an fp32 copy on the host were work thrown away.
    with on_meta():
        weights = Qwen3TTSTalkerWeights(config.talker, config.code_predictor)
    buffers = [name for name, _ in weights.named_buffers()]
    if buffers:  # `to_empty` would leave them without their computed values
        raise TypeError(f"talker weights have buffers {buffers}: build them with values")
    weights = materialize(weights.to(dtype=dtype), device)
    vocab = dummy_vocab(config.voice_design)
    tts_ids = (151671, 151672, 151673)
    if config.load == "checkpoint":
        assert config.path is not None
        directory = Path(config.path)
        checkpoint = read_config(directory)
        check_talker_config(checkpoint, config)
        vocab, tts_ids = vocab_from_config(checkpoint)
        load_state(weights, weight_files(directory), "talker.")
        log.info("loaded talker weights from %s", directory)
    else:
        init_dummy(weights, config.seed)
        # a Base model (it has a speaker encoder) loads a Base checkpoint, a VoiceDesign model
        # a VoiceDesign one: the CustomVoice preset would serve preset speakers instead
        preset = {"Base": "qwen3_tts_1_7b_base", "VoiceDesign": "qwen3_tts_1_7b_voicedesign"}.get(
            config.task_type, "qwen3_tts_1_7b"
        )
        log.warning(
            "model %s uses dummy weights (seed %d): the audio is noise, not speech. "
            "Load a checkpoint with model=%s model.path=DIR",
            config.name,
            config.seed,
            preset,
        )
    weights = weights.eval()
    if config.tokenizer == "bpe":
        assert config.path is not None
        tokenizer: TextTokenizer = BPETokenizer(config.path, tts_ids)
    else:
        tokenizer = ByteTokenizer()
        if config.talker.text_vocab_size < ByteTokenizer.VOCAB:
            raise ValueError(
                f"model.talker.text_vocab_size {config.talker.text_vocab_size} is smaller than "
                f"the byte tokenizer's {ByteTokenizer.VOCAB} ids"
            )
    reference = build_reference_encoders(config)
    return TalkerBundle(Talker(weights, config, vocab), tokenizer, vocab, reference)
