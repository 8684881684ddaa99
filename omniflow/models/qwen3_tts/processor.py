"""Turns a `SpeechRequest` into the talker's engine `Request`: tokenize, lay out the prompt,
fill the sampling parameters with the model's rules (EOS, suppressed ids, min 2 frames)."""

from __future__ import annotations

import random

from omniflow.core.request import Request, SamplingParams
from omniflow.core.speech import SpeechRequest
from omniflow.models.qwen3_tts.prompt import PromptError, build_prompt
from omniflow.models.qwen3_tts.tokenizer import TextTokenizer
from omniflow.models.qwen3_tts.vocab import CodecVocab

DEFAULT_MAX_NEW_TOKENS = 2048
DEFAULT_NON_STREAMING = True
"""A request that does not say gets the whole-text prompt layout: the official default for
CustomVoice (`generate_custom_voice(non_streaming_mode=True)`), so a plain request is laid out
as the reference lays it out (docs/reference.md)."""
_seed_source = random.SystemRandom()


class TalkerProcessor:
    """Builds talker requests; raises PromptError (a ValueError) on bad input."""

    def __init__(
        self,
        tokenizer: TextTokenizer,
        vocab: CodecVocab,
        max_model_len: int,
        supports_instructions: bool = True,
    ) -> None:
        self.tokenizer = tokenizer
        self.vocab = vocab
        self.max_model_len = max_model_len
        self.supports_instructions = supports_instructions
        self.voices = tuple(sorted(vocab.speakers))
        self.languages = ("auto", *vocab.public_languages)

    @property
    def max_new_tokens(self) -> int:
        """The most frames a request may ask for (the prompt takes some of max_model_len)."""
        return self.max_model_len

    def make_request(self, speech: SpeechRequest) -> Request:
        instruct = None
        if speech.instructions:
            if not self.supports_instructions:
                raise PromptError("instructions are not supported by this model")
            instruct = self.tokenizer.encode_instruct(speech.instructions)
        prompt = build_prompt(
            self.tokenizer.encode_chat(speech.text),
            self.tokenizer.specials,
            self.vocab,
            speech.voice,
            speech.language,
            instruct,
            non_streaming=(
                DEFAULT_NON_STREAMING
                if speech.non_streaming_mode is None
                else speech.non_streaming_mode
            ),
        )
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
        )
