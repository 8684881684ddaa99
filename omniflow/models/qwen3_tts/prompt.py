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

Base models (voice clone, `build_clone_prompt`) put the reference speaker's embedding where
the speaker id goes (no speaker id; the codec prefix is [think tags..., SPEAKER, pad, bos]).
Speaker-embedding only (`x_vector_only_mode`) then takes either text layout above. In-context
cloning replaces the "first text token + codec bos" position with two streams, T1 text
positions (ref_text, then the text, then tts_eos) and T2 = 1 + F codec positions (codec bos,
then the F reference frames, each the sum of its 16 codebook embeddings):

    streaming text        position i pairs text i with codec i for i < T2 (text past its end
                          is tts_pad); text positions past T2 are the trailing text
    whole text            T1 positions text + codec pad, then T2 positions tts_pad + codec;
                          every decode step adds tts_pad
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
import torch

from omniflow.models.qwen3_tts.tokenizer import ROLE_LEN, SUFFIX_LEN
from omniflow.models.qwen3_tts.vocab import CodecVocab, TextSpecials

NO_CODEC = -1


class PromptError(ValueError):
    """A request the talker cannot take (empty text, unknown voice or language)."""


@dataclass(frozen=True)
class PromptLayout:
    """Per prompt position: text id [P], codec ids [P, G] and which of them count [P, G]."""

    text_ids: np.ndarray
    codes: np.ndarray
    mask: np.ndarray


class LiveTrailing(Protocol):
    """Trailing text still arriving (`live_text.LiveText`)."""

    def trailing_at(self, step: int, pad_id: int) -> int: ...


@dataclass(frozen=True)
class TalkerPrompt:
    """One request's talker inputs: the prompt positions and the trailing text."""

    text_ids: tuple[int, ...]
    codec_ids: tuple[int, ...]
    """Codec id per prompt position, NO_CODEC where the position is text only."""
    trailing_text: tuple[int, ...]
    """Text ids added at decode steps 0, 1, ... (empty in the whole-text layout)."""
    pad_text_id: int
    ref_frames: tuple[tuple[int, ...], ...] = ()
    """Voice clone in context: whole reference frames (16 codes, all summed) at positions
    ref_start, ref_start + 1, ... (their codec_ids are NO_CODEC)."""
    ref_start: int = -1
    speaker_embedding: torch.Tensor | None = field(default=None, compare=False)
    """Voice clone: the speaker encoder's [hidden] vector, added at `speaker_pos` in place
    of a speaker id (that position's codec id is NO_CODEC)."""
    speaker_pos: int = -1
    live: LiveTrailing | None = field(default=None, compare=False)
    """Incremental text (`live_text.py`): the trailing text as it arrives, in place of
    `trailing_text`."""
    layout_cache: dict[int, PromptLayout] = field(default_factory=dict, compare=False, repr=False)
    """`layout` per code-group count (filled on first use)."""

    def ref_frame_at(self, pos: int) -> tuple[int, ...] | None:
        """The reference frame at prompt position `pos`, or None."""
        i = pos - self.ref_start
        return self.ref_frames[i] if 0 <= i < len(self.ref_frames) else None

    @property
    def prompt_len(self) -> int:
        return len(self.text_ids)

    def layout(self, groups: int) -> PromptLayout:
        """The prompt positions' inputs as arrays of `groups` codes per position, built once
        per request: a prefill step slices them instead of looping over positions."""
        cached = self.layout_cache.get(groups)
        if cached is None:
            cached = self.layout_cache[groups] = self._build_layout(groups)
        return cached

    def _build_layout(self, groups: int) -> PromptLayout:
        n = self.prompt_len
        codec = np.asarray(self.codec_ids, dtype=np.int64).reshape(n)
        codes = np.zeros((n, groups), dtype=np.int64)
        mask = np.zeros((n, groups), dtype=bool)
        codes[:, 0] = np.maximum(codec, 0)
        mask[:, 0] = codec != NO_CODEC
        if self.ref_frames:  # whole frames: every code counts
            rows = slice(self.ref_start, self.ref_start + len(self.ref_frames))
            codes[rows] = np.asarray(self.ref_frames, dtype=np.int64)
            mask[rows] = True
        return PromptLayout(np.asarray(self.text_ids, dtype=np.int64).reshape(n), codes, mask)

    def trailing_at(self, step: int) -> int:
        """Text id added at decode step `step`."""
        if self.live is not None:
            return self.live.trailing_at(step, self.pad_text_id)
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


def build_clone_prompt(
    chat_ids: list[int],
    specials: TextSpecials,
    vocab: CodecVocab,
    language: str,
    speaker_embedding: torch.Tensor,
    ref_text_ids: list[int] | None = None,
    ref_frames: tuple[tuple[int, ...], ...] = (),
    non_streaming: bool = False,
) -> TalkerPrompt:
    """Lay out a Base-model prompt, as the official `generate` does with a voice-clone prompt:
    in context (`ref_text_ids` and `ref_frames` given: the reference transcript's body ids and
    its codec frames) or speaker-embedding only (both None/empty)."""
    text = chat_ids[ROLE_LEN:-SUFFIX_LEN]
    if not text:
        raise PromptError("input text is empty")
    icl = ref_text_ids is not None
    if icl and (not ref_text_ids or not ref_frames):
        raise PromptError("in-context voice clone needs a non-empty ref_text and reference codes")
    prefix = codec_prefix(vocab, None, language)
    speaker_pos = ROLE_LEN + len(prefix)
    codec = [*prefix, NO_CODEC, vocab.pad, vocab.bos]
    n = len(codec)
    text_ids = list(chat_ids[:ROLE_LEN]) + [specials.tts_pad] * (n - 2) + [specials.tts_bos]
    codec_ids = [NO_CODEC] * ROLE_LEN + codec[:-1]
    ref_start = -1
    trailing: tuple[int, ...] = ()
    if not icl:
        # The CustomVoice text layouts with the vector in the speaker slot.
        if non_streaming:
            whole = [*text, specials.tts_eos]
            text_ids += [*whole, specials.tts_pad]
            codec_ids += [vocab.pad] * len(whole) + [vocab.bos]
        else:
            text_ids.append(text[0])
            codec_ids.append(vocab.bos)
            trailing = (*text[1:], specials.tts_eos)
    else:
        icl_text = [*ref_text_ids, *text, specials.tts_eos]
        n_codec = 1 + len(ref_frames)
        if non_streaming:
            text_ids += icl_text + [specials.tts_pad] * n_codec
            codec_ids += [vocab.pad] * len(icl_text) + [vocab.bos]
            ref_start = len(codec_ids)
            codec_ids += [NO_CODEC] * len(ref_frames)
        else:
            head = icl_text[:n_codec]
            text_ids += head + [specials.tts_pad] * (n_codec - len(head))
            codec_ids.append(vocab.bos)
            ref_start = len(codec_ids)
            codec_ids += [NO_CODEC] * len(ref_frames)
            trailing = tuple(icl_text[n_codec:])
    return TalkerPrompt(
        text_ids=tuple(text_ids),
        codec_ids=tuple(codec_ids),
        trailing_text=trailing,
        pad_text_id=specials.tts_pad,
        ref_frames=tuple(ref_frames) if icl else (),
        ref_start=ref_start,
        speaker_embedding=speaker_embedding,
        speaker_pos=speaker_pos,
    )
