"""Qwen3-TTS token ids: codec specials, CustomVoice speakers and languages, text specials.

The defaults are the published 12 Hz CustomVoice values; a real checkpoint's config.json
overrides them (the loader reads `talker_config.spk_id`, `codec_language_id`, ...).
"""

from __future__ import annotations

from dataclasses import dataclass, field

LANGUAGES = {
    "english": 2050,
    "german": 2052,
    "spanish": 2054,
    "chinese": 2055,
    "japanese": 2058,
    "french": 2061,
    "korean": 2064,
    "russian": 2069,
    "italian": 2070,
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

    def suppressed_ids(self, vocab_size: int) -> tuple[int, ...]:
        """Ids never sampled while decoding: the top 1,024 ids except EOS (reference rule)."""
        return tuple(i for i in range(vocab_size - 1024, vocab_size) if i != self.eos)


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
