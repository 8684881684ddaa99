"""A speech request as the orchestrator receives it (from HTTP, `synth` or a benchmark)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass


@dataclass(frozen=True)
class SpeechRequest:
    """What to say, in which voice, and how to sample.

    Build one with `SpeechRequest.create`: every front end (HTTP, `synth`, the benchmarks)
    goes through it, so request ids and the normalisation of user-typed fields agree."""

    request_id: str
    text: str
    voice: str | None = None
    language: str = "auto"
    seed: int | None = None
    max_new_tokens: int | None = None
    """Most frames to generate; None: the stage's max_model_len allows."""
    ignore_eos: bool = False
    """Generate exactly max_new_tokens frames (fixed-length benchmarks)."""
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    instructions: str | None = None
    """Style instruction (CustomVoice 1.7B), e.g. "Speak slowly and warmly"."""
    initial_chunk_frames: int | None = None
    """Two-stage pipeline: frames in the first chunk to code2wav (None: the edge's)."""
    non_streaming_mode: bool | None = None
    """Prompt text layout, as the official implementation names it: True puts the whole
    text in the prompt, False feeds it one token per decode step; None: the model's default
    (docs/reference.md)."""
    speaker_embedding: tuple[float, ...] | None = None
    """Voice clone (Base models): the reference speaker's embedding, as the model's speaker
    encoder computes it from the reference audio (`models/qwen3_tts/reference.py`). Set, the
    request is a voice clone and `voice` must be None."""
    ref_codes: tuple[tuple[int, ...], ...] | None = None
    """Voice clone in context: the reference audio's codec frames (16 codes each, the codec
    encoder's), with `ref_text` its transcript. None with a speaker embedding: x-vector only."""
    ref_text: str | None = None
    """Transcript of the reference audio (in-context cloning)."""
    incremental: bool = False
    """`text` is what has arrived so far: more follows through `Pipeline.extend`, the last
    piece marked done (docs/websocket.md, incremental mode)."""

    @property
    def is_clone(self) -> bool:
        return self.speaker_embedding is not None

    @classmethod
    def create(
        cls,
        text: str,
        *,
        request_id: str | None = None,
        id_prefix: str = "speech",
        voice: str | None = None,
        language: str | None = "auto",
        seed: int | None = None,
        max_new_tokens: int | None = None,
        ignore_eos: bool = False,
        temperature: float | None = None,
        top_k: int | None = None,
        top_p: float | None = None,
        repetition_penalty: float | None = None,
        instructions: str | None = None,
        initial_chunk_frames: int | None = None,
        non_streaming_mode: bool | None = None,
        speaker_embedding: tuple[float, ...] | None = None,
        ref_codes: tuple[tuple[int, ...], ...] | None = None,
        ref_text: str | None = None,
        incremental: bool = False,
    ) -> SpeechRequest:
        """The one way front ends build a request from user-level fields.

        A missing `request_id` becomes `<id_prefix>-<32 hex>` (unique, so a front end never
        collides with another's ids). Voice and language names are matched without regard to
        case or surrounding spaces (the model's tables are lower case), a missing or blank
        language means "auto", and blank instructions mean none (no empty style turn)."""
        lang = (language or "").strip().lower() or "auto"
        style = instructions if instructions and instructions.strip() else None
        return cls(
            request_id=request_id or f"{id_prefix}-{uuid.uuid4().hex}",
            text=text,
            voice=voice.strip().lower() if voice is not None else None,
            language=lang,
            seed=seed,
            max_new_tokens=max_new_tokens,
            ignore_eos=ignore_eos,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            repetition_penalty=repetition_penalty,
            instructions=style,
            initial_chunk_frames=initial_chunk_frames,
            non_streaming_mode=non_streaming_mode,
            speaker_embedding=speaker_embedding,
            ref_codes=ref_codes,
            ref_text=ref_text,
            incremental=incremental,
        )
