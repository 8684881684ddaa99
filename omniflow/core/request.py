"""A request as the engine sees it: prompt data, sampling parameters, state and outputs.

The scheduler owns the counters (`num_computed_tokens`, `num_placeholders`) and the state;
the model-specific prompt payload is opaque to it. A request's outputs (`output_tokens` and
the model's per-token `output_frames`) are exactly what a recompute after preemption needs.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Literal

from omniflow.core.live import LiveInput

FinishReason = Literal["stop", "length", "abort", "error"]


class RequestState(enum.Enum):
    """Lifecycle: WAITING -> RUNNING (<-> PREEMPTED) -> one FINISHED_* state."""

    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED_STOPPED = "finished_stopped"
    FINISHED_LENGTH = "finished_length"
    FINISHED_ABORTED = "finished_aborted"
    FINISHED_ERROR = "finished_error"

    @property
    def finished(self) -> bool:
        return self in _FINISHED

    @property
    def reason(self) -> FinishReason | None:
        return _REASONS.get(self)


_REASONS: dict[RequestState, FinishReason] = {
    RequestState.FINISHED_STOPPED: "stop",
    RequestState.FINISHED_LENGTH: "length",
    RequestState.FINISHED_ABORTED: "abort",
    RequestState.FINISHED_ERROR: "error",
}
_FINISHED = frozenset(_REASONS)
FINISHED_BY_REASON: dict[FinishReason, RequestState] = {v: k for k, v in _REASONS.items()}


MIN_SPEED, MAX_SPEED = 0.25, 4.0
"""A request's `speed` (the HTTP field, synth's key, the time-scaling's bounds)."""

FLOAT32_MAX = 3.4028234663852886e38
"""The largest finite float32: sampling settings above it become inf on the device."""


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples. Defaults are Qwen3-TTS's published talker settings."""

    temperature: float = 0.9
    top_k: int = 50
    """0 disables top-k."""
    top_p: float = 1.0
    repetition_penalty: float = 1.05
    seed: int | None = None
    """Same seed -> same tokens, whatever else is in the batch; None: a random seed."""
    max_new_tokens: int = 2048
    min_new_tokens: int = 2
    """Stop tokens are masked until this many tokens exist."""
    ignore_eos: bool = False
    """Stop tokens are never sampled: the request runs to max_new_tokens."""
    stop_token_ids: tuple[int, ...] = ()
    suppress_token_ids: tuple[int, ...] = ()
    """Ids that are never sampled."""

    def __post_init__(self) -> None:
        # Finite in float32 too: the draw divides logits by the temperature in float32, and
        # a banned id's -inf over an infinite temperature is NaN, which argmax would pick.
        checks = [
            (0 <= self.temperature <= FLOAT32_MAX, "temperature must be >= 0 and finite"),
            (self.top_k >= 0, "top_k must be >= 0"),
            (0 < self.top_p <= 1, "top_p must be in (0, 1]"),
            (
                0 < self.repetition_penalty <= FLOAT32_MAX,
                "repetition_penalty must be > 0 and finite",
            ),
            (self.max_new_tokens >= 1, "max_new_tokens must be >= 1"),
            (self.min_new_tokens >= 0, "min_new_tokens must be >= 0"),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)


@dataclass(eq=False)
class Request:
    """One generation request inside a stage engine (compared by identity)."""

    request_id: str
    prompt_len: int
    payload: Any
    """Model-specific prompt data (e.g. the talker's prompt layout); opaque to the scheduler."""
    sampling: SamplingParams
    seed: int
    """The resolved seed (sampling.seed, or one drawn at admission)."""
    arrival: int = 0
    state: RequestState = RequestState.WAITING
    num_computed_tokens: int = 0
    output_tokens: list[int] = field(default_factory=list)
    output_frames: list[Any] = field(default_factory=list)
    """The model's per-token outputs (a codec frame per talker token), aligned with tokens."""
    num_placeholders: int = 0
    """Tokens scheduled whose sample has not come back yet (async scheduling, windows)."""
    error: str | None = None
    live: LiveInput | None = None
    """Input still arriving (incremental text): it bounds the tokens it may sample."""
    seated_at: float | None = None
    """When a plan first seated it (`time.perf_counter`): the end of its queueing, which the
    server reports as a part of its first audio."""
    text_done_at: float | None = None
    """Live input: when the tokens of the step that took the end of its text came back to
    the scheduler (`time.perf_counter`; a window's at the window's end). What follows is the
    speech still to come after the text, which the server times (docs/websocket.md)."""

    @property
    def input_room(self) -> int | None:
        """Tokens it may still sample before more input must arrive (None: no bound)."""
        if self.live is None:
            return None
        allowed = self.live.tokens_allowed()
        return None if allowed is None else max(0, allowed - self.num_generated)

    @property
    def num_tokens(self) -> int:
        """Prompt + known outputs + in-flight placeholders: the sequence the runner will hold."""
        return self.prompt_len + len(self.output_tokens) + self.num_placeholders

    @property
    def num_generated(self) -> int:
        """Outputs including in-flight ones (what the length limit counts)."""
        return len(self.output_tokens) + self.num_placeholders

    @property
    def finished(self) -> bool:
        return self.state.finished
