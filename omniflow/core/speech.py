"""A speech request as the orchestrator receives it (from HTTP, `synth` or a benchmark)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SpeechRequest:
    """What to say, in which voice, and how to sample."""

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
