"""The CustomVoice prompt layout, as (text id, codec id) pairs per position.

    [instruction]         optional user turn <|im_start|>user\\n{instruct}<|im_end|>\\n, text only
    next 3 positions      role tokens (<|im_start|> assistant \\n), text only
    next L-1 positions    codec prefix [think, think_bos, lang, think_eos | nothink, think_bos,
                          think_eos] + speaker + pad, paired with tts_pad ... tts_bos
    last position         the first text token + codec bos
Decode step t adds the t-th trailing text token (text[1:], then tts_eos, then tts_pad) to
the sum of the previous frame's 16 codebook embeddings.
"""

from __future__ import annotations

from dataclasses import dataclass

from omniflow.models.qwen3_tts.tokenizer import ROLE_LEN, SUFFIX_LEN
from omniflow.models.qwen3_tts.vocab import CodecVocab, TextSpecials

NO_CODEC = -1


class PromptError(ValueError):
    """A request the talker cannot take (empty text, unknown voice or language)."""


@dataclass(frozen=True)
class TalkerPrompt:
    """One request's talker inputs: the prompt positions and the trailing text."""

    text_ids: tuple[int, ...]
    codec_ids: tuple[int, ...]
    """Codec id per prompt position, NO_CODEC where the position is text only."""
    trailing_text: tuple[int, ...]
    pad_text_id: int

    @property
    def prompt_len(self) -> int:
        return len(self.text_ids)

    def trailing_at(self, step: int) -> int:
        """Text id added at decode step `step`."""
        return self.trailing_text[step] if step < len(self.trailing_text) else self.pad_text_id


def build_prompt(
    chat_ids: list[int],
    specials: TextSpecials,
    vocab: CodecVocab,
    speaker: str | None,
    language: str,
    instruct_ids: list[int] | None = None,
) -> TalkerPrompt:
    """Lay out a CustomVoice prompt from the tokenized chat string; a style instruction's
    user turn (`instruct_ids`) comes first, as text-only positions."""
    text = chat_ids[ROLE_LEN:-SUFFIX_LEN]
    if not text:
        raise PromptError("input text is empty")
    lang = language.lower()
    if lang == "auto":
        prefix = [vocab.nothink, vocab.think_bos, vocab.think_eos]
    elif lang in vocab.languages:
        prefix = [vocab.think, vocab.think_bos, vocab.languages[lang], vocab.think_eos]
    else:
        raise PromptError(f"unknown language {language!r}; known: auto, {sorted(vocab.languages)}")
    if speaker is not None:
        key = speaker.lower()
        if key not in vocab.speakers:
            raise PromptError(f"unknown voice {speaker!r}; known: {sorted(vocab.speakers)}")
        prefix.append(vocab.speakers[key])
    codec = [*prefix, vocab.pad, vocab.bos]
    n = len(codec)
    instruct = list(instruct_ids or [])
    text_ids = instruct + list(chat_ids[:ROLE_LEN])
    codec_ids = [NO_CODEC] * (len(instruct) + ROLE_LEN)
    text_ids += [specials.tts_pad] * (n - 2) + [specials.tts_bos]
    codec_ids += codec[:-1]
    text_ids.append(text[0])
    codec_ids.append(codec[-1])
    return TalkerPrompt(
        text_ids=tuple(text_ids),
        codec_ids=tuple(codec_ids),
        trailing_text=(*text[1:], specials.tts_eos),
        pad_text_id=specials.tts_pad,
    )
