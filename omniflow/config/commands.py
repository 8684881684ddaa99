"""The settings of the `synth` and `bench` commands: a module of their own, so the commands
that read them (and `omniflow config`'s help) need not import the stage graph's schema."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from omniflow.core.frozen import Frozen
from omniflow.core.request import MAX_SPEED, MIN_SPEED


class SynthConfig(Frozen):
    """`omniflow synth` settings (one offline request)."""

    text: str = Field("Hello there.", description="Text to speak.")
    out: str = Field(
        "out.wav", description="Output file; its extension picks the format (wav, flac, mp3, ...)."
    )
    voice: str | None = Field(
        None, description="Speaker; unset: vivian, or none with ref_audio (a voice clone)."
    )
    language: str = Field("auto", description="Language, or auto.")
    instructions: str | None = Field(
        None, description="Style instruction; on a VoiceDesign model, the voice described."
    )
    ref_audio: str | None = Field(
        None, description="Voice clone (a Base model): the reference recording's file."
    )
    ref_text: str | None = Field(
        None, description="Voice clone: the reference's transcript (in-context cloning)."
    )
    x_vector_only_mode: bool = Field(
        False, description="Voice clone from the speaker embedding alone (no ref_text)."
    )
    seed: int | None = Field(None, description="Sampling seed.")
    max_new_tokens: int | None = Field(None, ge=1, description="Most frames to generate.")
    ignore_eos: bool = Field(False, description="Generate exactly max_new_tokens frames.")
    speed: float = Field(
        1.0,
        ge=MIN_SPEED,
        le=MAX_SPEED,
        description="0.25-4.0: the speech faster or slower, its pitch kept (README, Speed).",
    )
    texts: str | None = Field(
        None,
        description="Batch: a JSONL file, one request a line (id, text, and optionally voice, "
        "language, instructions, seed, max_new_tokens, speed, ref_audio + ref_text or "
        "x_vector_only_mode; those set here are every line's defaults, with ignore_eos); each "
        "becomes out_dir/ID.FORMAT; files already there are skipped (a rerun resumes).",
    )
    out_dir: str | None = Field(None, description="Batch (texts): the directory of the files.")
    format: Literal["wav", "flac", "mp3", "opus", "pcm"] | None = Field(
        None, description="Batch (texts): the files' format (null: wav)."
    )
    concurrency: int | None = Field(
        None, ge=1, le=1024, description="Batch (texts): requests in flight at once (null: 8)."
    )


class BenchConfig(Frozen):
    """`omniflow bench` settings (one job of a sweep)."""

    prompts: str | None = Field(None, description="JSONL prompt file; unset: the shipped set.")
    num_prompts: int = Field(16, ge=1, description="Prompts per round (see prompts_per_lane).")
    concurrency: int = Field(1, ge=1, description="Requests in flight.")
    prompts_per_lane: int | None = Field(
        None,
        ge=1,
        description="When set, a round sends at least this many prompts per request in flight "
        "(max(num_prompts, prompts_per_lane * concurrency)): one sweep over concurrency keeps "
        "every level past its ramp-up instead of measuring the highest ones on a single wave.",
    )
    warmup: int = Field(2, ge=0, description="Warm-up requests, excluded from results.")
    rounds: int = Field(3, ge=1, description="Measured rounds.")
    max_frames: int | None = Field(None, ge=1, description="Cap on frames per request.")
    out_dir: str | None = Field(None, description="Where the job's result JSON goes.")
    phase_timing: Literal["steps", "device"] = Field(
        "steps",
        description="What result.json's `steps` times: `steps`, each served step by kind "
        "(decode / mixed) on the host clock, perturbing nothing; `device`, also the forward, "
        "sample and audio phases, with a device synchronisation around each (exact phases, "
        "slower steps: for finding where a served step's time goes, not for throughput; the "
        "engine then runs in the job's process where pipeline.runtime is null).",
    )
    reuse_pipeline: bool = Field(
        True,
        description="Keep the built pipeline for the sweep's next job when its stage graph is "
        "the same (jobs differing only in bench.* keys other than phase_timing, which may "
        "move the engine's process); false: every job builds its own.",
    )
    rps: float | None = Field(
        None,
        gt=0,
        le=10000,
        description="Open loop: requests arriving per second, each at its time whether or not "
        "earlier ones have ended (prompts at their natural length, streamed as PCM; result.json's "
        "`open_loop`); unset: closed loop (concurrency, num_prompts, rounds, which open loop "
        "refuses at other than their defaults).",
    )
    arrivals: Literal["poisson", "constant"] | None = Field(
        None,
        description="Open loop (needs rps): how arrivals are spaced, `poisson` (seeded "
        "exponential gaps) or `constant` (one every 1/rps s); unset: poisson.",
    )
    duration_s: float | None = Field(
        None,
        gt=0,
        le=86400,
        description="Open loop (needs rps): seconds of arrivals measured, after warmup_s; "
        "unset: 60.",
    )
    warmup_s: float | None = Field(
        None,
        ge=0,
        le=3600,
        description="Open loop (needs rps): seconds of arrivals before the measured ones, sent "
        "at the same rate but not counted (after the `warmup` requests, sent one by one); "
        "unset: 10.",
    )
    seed: int | None = Field(
        None,
        ge=0,
        description="Open loop (needs rps): seed of the Poisson arrival times (the same seed, "
        "the same arrivals); unset: 0.",
    )
    drain_s: float | None = Field(
        None,
        gt=0,
        le=3600,
        description="Open loop (needs rps): how long measured requests may still run after the "
        "measured window closes; any still running then is aborted and counted as failed; "
        "unset: 120.",
    )
    transport: Literal["http", "websocket"] = Field(
        "http",
        description="Open loop: how each arrival speaks, `http` (a streamed POST "
        "/v1/audio/speech) or `websocket` (an incremental session on WS "
        "/v1/audio/speech/stream fed one word every word_interval_ms; needs rps).",
    )
    word_interval_ms: float = Field(
        10.0,
        ge=0,
        le=10000,
        description="transport=websocket only: milliseconds between the words of a session's "
        "text (each word its own input.text), as an LLM writing it would send them.",
    )

    @property
    def round_prompts(self) -> int:
        """Prompts each round sends: num_prompts, raised to prompts_per_lane per lane."""
        return max(self.num_prompts, (self.prompts_per_lane or 0) * self.concurrency)
