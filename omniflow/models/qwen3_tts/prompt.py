"""The CustomVoice prompt layouts, as (text id, codec id) pairs per position.

    [instruction]         optional user turn <|im_start|>user\\n{instruct}<|im_end|>\\n, text only
    next 3 positions      role tokens (<|im_start|> assistant \\n), text only
    next L-1 positions    codec prefix [think, think_bos, lang, think_eos | nothink, think_bos,
                          think_eos] + speaker + pad, paired with tts_pad ... tts_bos
then one of the two text layouts of the official implementation (`non_streaming_mode`):

    streaming text        the first text token + codec bos; decode step t adds the t-th
                          trailing text token (text[1:], then tts_eos, then tts_pad)
    whole text            every text token and tts_eos, each + codec pad, then tts_pad +
                          codec bos; every decode step adds tts_pad

A decode step's input is that text id's projected embedding plus the sum of the previous
frame's 16 codebook embeddings. The language id follows `CodecVocab.language_id` (a dialect
speaker's dialect replaces Chinese and `auto`). docs/reference.md has the comparison with
the official prompt embeddings.
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
    """Text ids added at decode steps 0, 1, ... (empty in the whole-text layout)."""
    pad_text_id: int

    @property
    def prompt_len(self) -> int:
        return len(self.text_ids)

    def trailing_at(self, step: int) -> int:
        """Text id added at decode step `step`."""
        return self.trailing_text[step] if step < len(self.trailing_text) else self.pad_text_id


def codec_prefix(vocab: CodecVocab, speaker: str | None, language: str) -> list[int]:
    """The think/language tags and the speaker id (no pad, bos), as the official builds them.
    Raises PromptError on a language a request may not name (dialects included)."""
    lang = language.lower()
    if lang != "auto" and lang not in vocab.public_languages:
        raise PromptError(
            f"unknown language {language!r}; known: auto, {list(vocab.public_languages)}"
        )
    key = speaker.lower() if speaker is not None else None
    if key is not None and key not in vocab.speakers:
        raise PromptError(f"unknown voice {speaker!r}; known: {sorted(vocab.speakers)}")
    lang_id = vocab.language_id(lang, key)
    if lang_id is None:
        prefix = [vocab.nothink, vocab.think_bos, vocab.think_eos]
    else:
        prefix = [vocab.think, vocab.think_bos, lang_id, vocab.think_eos]
    if key is not None:
        prefix.append(vocab.speakers[key])
    return prefix


def build_prompt(
    chat_ids: list[int],
    specials: TextSpecials,
    vocab: CodecVocab,
    speaker: str | None,
    language: str,
    instruct_ids: list[int] | None = None,
    non_streaming: bool = False,
) -> TalkerPrompt:
    """Lay out a CustomVoice prompt from the tokenized chat string; a style instruction's
    user turn (`instruct_ids`) comes first, as text-only positions. `non_streaming` puts the
    whole text in the prompt (the official `non_streaming_mode=True`)."""
    text = chat_ids[ROLE_LEN:-SUFFIX_LEN]
    if not text:
        raise PromptError("input text is empty")
    codec = [*codec_prefix(vocab, speaker, language), vocab.pad, vocab.bos]
    n = len(codec)
    instruct = list(instruct_ids or [])
    text_ids = instruct + list(chat_ids[:ROLE_LEN])
    codec_ids = [NO_CODEC] * (len(instruct) + ROLE_LEN)
    text_ids += [specials.tts_pad] * (n - 2) + [specials.tts_bos]
    codec_ids += codec[:-1]
    if non_streaming:
        whole = [*text, specials.tts_eos]
        text_ids += [*whole, specials.tts_pad]
        codec_ids += [vocab.pad] * len(whole) + [vocab.bos]
        trailing: tuple[int, ...] = ()
    else:
        text_ids.append(text[0])
        codec_ids.append(codec[-1])
        trailing = (*text[1:], specials.tts_eos)
    return TalkerPrompt(
        text_ids=tuple(text_ids),
        codec_ids=tuple(codec_ids),
        trailing_text=trailing,
        pad_text_id=specials.tts_pad,
    )
