"""Qwen3-TTS token ids: codec specials, CustomVoice speakers and languages, text specials.

The defaults are the published 12 Hz CustomVoice values; a real checkpoint's config.json
overrides them (the loader reads `talker_config.spk_id`, `codec_language_id`,
`spk_is_dialect`, ...).

Dialects are language ids (`beijing_dialect`, `sichuan_dialect`) that no request names: the
official prompt uses one when a dialect speaker (`spk_is_dialect`: dylan -> Beijing, eric ->
Sichuan) speaks Chinese or `auto`, and its list of supported languages leaves out every key
containing "dialect". `CodecVocab.language_id` is that rule, in one place.
"""

from __future__ import annotations

from dataclasses import dataclass, field

LANGUAGES = {
    "english": 2050,
    "german": 2053,
    "spanish": 2054,
    "chinese": 2055,
    "japanese": 2058,
    "french": 2061,
    "sichuan_dialect": 2062,
    "korean": 2064,
    "russian": 2069,
    "italian": 2070,
    "portuguese": 2071,
    "beijing_dialect": 2074,
}
SPEAKERS = {
    "serena": 3066,
    "vivian": 3065,
    "uncle_fu": 3010,
    "dylan": 2878,
    "eric": 2875,
    "ryan": 3061,
    "aiden": 2861,
    "ono_anna": 2873,
    "sohee": 2864,
}
DIALECTS = {"dylan": "beijing_dialect", "eric": "sichuan_dialect"}
"""Speakers whose Chinese is a dialect (`spk_is_dialect`; the others are false)."""
DIALECT_LANGUAGES = ("chinese", "auto")
"""The requested languages a dialect speaker's dialect replaces (the official rule)."""


@dataclass(frozen=True)
class CodecVocab:
    """Special ids of the talker's codec vocabulary."""

    pad: int = 2148
    bos: int = 2149
    eos: int = 2150
    think: int = 2154
    nothink: int = 2155
    think_bos: int = 2156
    think_eos: int = 2157
    num_acoustic: int = 2048
    """Ids below this are codebook-0 codes."""
    languages: dict[str, int] = field(default_factory=lambda: dict(LANGUAGES))
    speakers: dict[str, int] = field(default_factory=lambda: dict(SPEAKERS))
    dialects: dict[str, str] = field(default_factory=lambda: dict(DIALECTS))
    """Speaker -> the language key of its dialect (speakers without one are absent)."""

    @property
    def public_languages(self) -> tuple[str, ...]:
        """Languages a request may name: every language id except the dialects, sorted."""
        return tuple(sorted(k for k in self.languages if "dialect" not in k))

    def language_id(self, language: str, speaker: str | None) -> int | None:
        """The codec language id of the prompt (None: `auto` without a dialect, the
        nothink prefix). `language` must be `auto` or one of `public_languages`; a dialect
        speaker speaking Chinese or `auto` gets its dialect's id instead."""
        dialect = self.dialects.get(speaker) if speaker is not None else None
        if dialect is not None and language in DIALECT_LANGUAGES:
            return self.languages[dialect]
        return None if language == "auto" else self.languages[language]

    def suppressed_ids(self, vocab_size: int) -> tuple[int, ...]:
        """Ids never sampled while decoding: the top 1,024 ids except EOS (reference rule)."""
        return tuple(i for i in range(vocab_size - 1024, vocab_size) if i != self.eos)


def dummy_vocab(voice_design: bool) -> CodecVocab:
    """The tables of a model with dummy weights: the published CustomVoice ones; a VoiceDesign
    model's have no speakers (the published VoiceDesign config.json's `spk_id` is empty)."""
    if voice_design:
        return CodecVocab(speakers={}, dialects={})
    return CodecVocab()


@dataclass(frozen=True)
class TextSpecials:
    """Text-side special ids (the tokenizer's)."""

    im_start: int
    im_end: int
    assistant: int
    newline: int
    tts_pad: int
    tts_bos: int
    tts_eos: int
