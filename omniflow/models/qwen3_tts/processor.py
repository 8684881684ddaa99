"""Turns a `SpeechRequest` into the talker's engine `Request`: tokenize, lay out the prompt,
fill the sampling parameters with the model's rules (EOS, suppressed ids, min 2 frames)."""

from __future__ import annotations

import random
from dataclasses import dataclass, replace

import torch

from omniflow.core.request import Request, SamplingParams
from omniflow.core.speech import SpeechRequest
from omniflow.models.qwen3_tts.live_text import LiveText
from omniflow.models.qwen3_tts.prompt import (
    PromptError,
    TalkerPrompt,
    build_clone_prompt,
    build_prompt,
)
from omniflow.models.qwen3_tts.tokenizer import ROLE_LEN, SUFFIX_LEN, TextTokenizer
from omniflow.models.qwen3_tts.vocab import CodecVocab

DEFAULT_MAX_NEW_TOKENS = 2048
DEFAULT_NON_STREAMING = True
"""A request that does not say gets the whole-text prompt layout: the official default for
CustomVoice (`generate_custom_voice(non_streaming_mode=True)`), so a plain request is laid out
as the reference lays it out (docs/reference.md)."""
DEFAULT_CLONE_NON_STREAMING = False
"""Voice clone's default layout: the official `generate_voice_clone(non_streaming_mode=False)`."""


@dataclass(frozen=True)
class CloneShape:
    """What a voice-clone request's reference must match (a Base model's talker)."""

    hidden_size: int
    """Width of the speaker embedding."""
    num_groups: int
    """Codes per reference frame."""
    codebook_size: int


_seed_source = random.SystemRandom()


class TalkerProcessor:
    """Builds talker requests; raises PromptError (a ValueError) on bad input."""

    def __init__(
        self,
        tokenizer: TextTokenizer,
        vocab: CodecVocab,
        max_model_len: int,
        supports_instructions: bool = True,
        clone: CloneShape | None = None,
        voice_design: bool = False,
    ) -> None:
        """`clone`: the reference shape voice-clone requests must match; None refuses them
        (a CustomVoice model has no speaker encoder). `voice_design`: a VoiceDesign model,
        whose requests describe their voice in `instructions` and name no preset voice."""
        self.tokenizer = tokenizer
        self.vocab = vocab
        self.max_model_len = max_model_len
        self.supports_instructions = supports_instructions
        self.clone = clone
        self.voice_design = voice_design
        self.voices = tuple(sorted(vocab.speakers))
        self.languages = ("auto", *vocab.public_languages)

    @property
    def max_new_tokens(self) -> int:
        """The most frames a request may ask for (the prompt takes some of max_model_len)."""
        return self.max_model_len

    def make_request(self, speech: SpeechRequest) -> Request:
        live = self._live_text(speech) if speech.incremental else None
        chat = self._chat_ids(speech.text, live)
        if speech.is_clone:
            prompt = self._clone_prompt(speech, chat)
        else:
            prompt = self._voice_prompt(speech, chat)
        if live is not None:
            prompt = replace(prompt, trailing_text=(), live=live)
        room = self.max_model_len - prompt.prompt_len
        if room < 1:
            raise ValueError(
                f"input is {prompt.prompt_len} prompt tokens; max_model_len is {self.max_model_len}"
            )
        max_new = speech.max_new_tokens or min(DEFAULT_MAX_NEW_TOKENS, room)
        base = SamplingParams()
        sampling = SamplingParams(
            temperature=base.temperature if speech.temperature is None else speech.temperature,
            top_k=base.top_k if speech.top_k is None else speech.top_k,
            top_p=base.top_p if speech.top_p is None else speech.top_p,
            repetition_penalty=(
                base.repetition_penalty
                if speech.repetition_penalty is None
                else speech.repetition_penalty
            ),
            seed=speech.seed,
            max_new_tokens=max_new,
            min_new_tokens=2,
            ignore_eos=speech.ignore_eos,
            stop_token_ids=(self.vocab.eos,),
        )
        seed = speech.seed if speech.seed is not None else _seed_source.getrandbits(62)
        return Request(
            request_id=speech.request_id,
            prompt_len=prompt.prompt_len,
            payload=prompt,
            sampling=sampling,
            seed=seed,
            live=live,
        )

    def _live_text(self, speech: SpeechRequest) -> LiveText:
        """Incremental text: the streaming layout (one text token a decode step), which an
        in-context clone cannot take (its prompt holds text as long as its reference)."""
        if speech.non_streaming_mode:
            raise PromptError("an incremental request uses the streaming text layout")
        if speech.ref_codes is not None:
            raise PromptError(
                "an in-context voice clone (reference codes and transcript) cannot take "
                "incremental text; use a preset voice or a speaker-embedding clone"
            )
        return LiveText(self._body_ids, self.tokenizer.specials.tts_eos, speech.text)

    def _body_ids(self, text: str) -> list[int]:
        return self.tokenizer.encode_chat(text)[ROLE_LEN:-SUFFIX_LEN]

    def _chat_ids(self, text: str, live: LiveText | None) -> list[int]:
        """The chat string's ids; for live text, around the committed tokens so far."""
        if live is None:
            return self.tokenizer.encode_chat(text)
        frame = self.tokenizer.encode_chat("")
        return [*frame[:ROLE_LEN], *live.ids, *frame[ROLE_LEN:]]

    def _voice_prompt(self, speech: SpeechRequest, chat: list[int]) -> TalkerPrompt:
        """CustomVoice (a preset speaker, optional style instruction) or VoiceDesign (the
        official `generate_voice_design`: the description's user turn, no speaker id)."""
        if self.voice_design:
            if speech.voice is not None:
                raise PromptError("a VoiceDesign request names no voice: instructions describe it")
            if not (speech.instructions and speech.instructions.strip()):
                raise PromptError("a VoiceDesign request needs instructions (the voice described)")
        instruct = None
        if speech.instructions:
            if not self.supports_instructions:
                raise PromptError("instructions are not supported by this model")
            instruct = self.tokenizer.encode_instruct(speech.instructions)
        if speech.ref_codes is not None or speech.ref_text is not None:
            raise PromptError("ref_codes and ref_text need a speaker_embedding (voice clone)")
        return build_prompt(
            chat,
            self.tokenizer.specials,
            self.vocab,
            speech.voice,
            speech.language,
            instruct,
            non_streaming=_layout(speech, DEFAULT_NON_STREAMING),
        )

    def _clone_prompt(self, speech: SpeechRequest, chat: list[int]) -> TalkerPrompt:
        """A Base-model prompt: in context with ref_codes + ref_text, else x-vector only."""
        shape = self.clone
        if shape is None:
            raise PromptError("this model does not clone voices (a Base model does)")
        if speech.voice is not None:
            raise PromptError("a voice clone request names no voice")
        if speech.instructions:
            raise PromptError("instructions are not supported with voice clone")
        assert speech.speaker_embedding is not None
        emb = torch.tensor(speech.speaker_embedding, dtype=torch.float32)
        if emb.shape != (shape.hidden_size,) or not bool(emb.isfinite().all()):
            raise PromptError(
                f"speaker_embedding must be {shape.hidden_size} finite numbers, "
                f"got {tuple(emb.shape)}"
            )
        ref_ids = None
        frames: tuple[tuple[int, ...], ...] = ()
        if speech.ref_codes is not None:
            if not speech.ref_text or not speech.ref_text.strip():
                raise PromptError("in-context voice clone needs ref_text")
            frames = tuple(tuple(int(c) for c in f) for f in speech.ref_codes)
            if not frames:
                raise PromptError("ref_codes is empty")
            for f in frames:
                if len(f) != shape.num_groups or not all(0 <= c < shape.codebook_size for c in f):
                    raise PromptError(
                        f"ref_codes frames must be {shape.num_groups} codes in "
                        f"[0, {shape.codebook_size})"
                    )
            ref_ids = self._body_ids(speech.ref_text)
        elif speech.ref_text is not None:
            raise PromptError("ref_text needs ref_codes (or leave it out: x-vector only)")
        return build_clone_prompt(
            chat,
            self.tokenizer.specials,
            self.vocab,
            speech.language,
            emb,
            ref_ids,
            frames,
            non_streaming=_layout(speech, DEFAULT_CLONE_NON_STREAMING),
        )


def _layout(speech: SpeechRequest, default: bool) -> bool:
    """The request's `non_streaming_mode`, or where it leaves it out the task's default (the
    official generate function's); incremental text is always streamed."""
    if speech.incremental:
        return False
    return default if speech.non_streaming_mode is None else speech.non_streaming_mode
