"""A request's voice and language checked against the model config alone, before anything
is built, so that a command refuses a mistyped voice at once instead of after the build (on
a GPU a 1.7B build loads its weights and captures its graphs for about a minute). The vocab
is the one the talker will be built with: the checkpoint's `config.json`, or the defaults
for dummy weights (`factory.build_talker`'s rule); the rules are the prompt builder's own
(`prompt.codec_prefix`)."""

from __future__ import annotations

from pathlib import Path

from omniflow.errors import ConfigError
from omniflow.models.qwen3_tts.loader import read_config, vocab_from_config
from omniflow.models.qwen3_tts.prompt import PromptError, codec_prefix
from omniflow.models.qwen3_tts.vocab import CodecVocab, dummy_vocab
from omniflow.models.shapes import ModelConfig


def model_vocab(model: ModelConfig) -> CodecVocab:
    """The speakers, languages and codec ids the built talker will have."""
    if model.load == "checkpoint" and model.path is not None:
        return vocab_from_config(read_config(Path(model.path)))[0]
    return dummy_vocab(model.voice_design)


def check_voice_and_language(model: ModelConfig, voice: str | None, language: str) -> None:
    """ConfigError keyed by the request field (`language`, then `voice`) the model cannot
    take; `voice` None is a request with no preset speaker (a voice clone)."""
    vocab = model_vocab(model)
    for field, speaker, lang in (("language", None, language), ("voice", voice, "auto")):
        try:
            codec_prefix(vocab, speaker, lang)
        except PromptError as exc:
            raise ConfigError(field, str(exc)) from None


def prompt_facts(model: ModelConfig) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The voices and languages the built talker's front end will list (`TalkerProcessor`:
    speakers sorted, "auto" first), from the model config alone."""
    vocab = model_vocab(model)
    return tuple(sorted(vocab.speakers)), ("auto", *vocab.public_languages)
