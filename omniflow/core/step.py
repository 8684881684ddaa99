"""The frozen step contract between a scheduler and a model runner.

The scheduler emits a `StepPlan`; the runner executes it and answers with a `StepResult`.
Nothing else passes between them. New requests travel in full once (`NewRequestData`);
afterwards only diffs travel (`CachedRequestData`: new block ids, the computed count).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from omniflow.core.request import SamplingParams


@dataclass(frozen=True)
class NewRequestData:
    """Everything the runner needs to start (or, after preemption, rebuild) a request."""

    request_id: str
    payload: Any
    """Model-specific prompt data."""
    prompt_len: int
    sampling: SamplingParams
    seed: int
    output_tokens: tuple[int, ...]
    """Tokens already generated (non-empty when resuming after preemption)."""
    output_frames: tuple[Any, ...]
    """The model's per-token outputs already generated (recompute inputs)."""
    block_ids: tuple[int, ...]
    num_computed_tokens: int
    """Tokens whose KV is already in the cache (0 for new and recomputed requests)."""


@dataclass(frozen=True)
class CachedRequestData:
    """A request the runner already holds: what changed since the last plan."""

    request_id: str
    new_block_ids: tuple[int, ...]
    num_computed_tokens: int
    """Tokens whose KV is in the cache before this step runs."""
    num_blocks: int
    """The request's block-table length after this plan (new blocks included). It can be
    shorter than the runner's table plus the new blocks: a window that fell short gives its
    unused blocks back, and the runner must drop them too."""


@dataclass(frozen=True)
class StepPlan:
    """One scheduling round."""

    step_id: int
    num_scheduled_tokens: Mapping[str, int]
    """Tokens to compute this step per request, in batch order."""
    new_requests: tuple[NewRequestData, ...] = ()
    cached_requests: tuple[CachedRequestData, ...] = ()
    finished_ids: frozenset[str] = frozenset()
    """Requests that ended (finished, aborted, preempted) since the last plan: free their
    runner-side state before running this step."""
    preempted_ids: frozenset[str] = frozenset()
    """The subset of `finished_ids` that were preempted and will be resumed (recomputed):
    model-side state that recompute cannot rebuild (a stream decoder's) is parked for them."""
    total_num_tokens: int = 0
    window: Mapping[str, int] = field(default_factory=dict)
    """Multi-step window: the frames each request samples in it (k); empty when no window is
    open. Every window row decodes, so its scheduled tokens are k."""
    chunks: Mapping[str, Any] = field(default_factory=dict)
    """Chunk-receiving stages: the received chunk each scheduled request consumes."""
    audio_later: frozenset[str] = frozenset()
    """Requests whose frame of this (single) step may wait to be decoded with those of the
    next steps (`audio_pass_steps`); every other request's held frames are decoded now."""
    audio_cycle: int = 0
    """The held-audio cycle this step belongs to (0: none): a step of another cycle first
    decodes whatever the runner still holds, so no hold outlasts the cycle that sized it."""

    @property
    def is_empty(self) -> bool:
        return not self.num_scheduled_tokens


@dataclass(frozen=True)
class RequestStepOutput:
    """What one step produced for one request."""

    tokens: tuple[int, ...] = ()
    """Sampled tokens (empty for a prefill chunk that did not reach the end)."""
    frames: tuple[Any, ...] = ()
    """Model outputs aligned with tokens (a codec frame per talker token, None for EOS)."""
    audio: Any = None
    """PCM a generation stage (code2wav) made this step. An AR stage's audio is not here: its
    runner hands it back by its own call (`take_audio`, `core/audio.py`)."""
    error: str | None = None
    """Set when the model failed for this request: it ends with exactly one error."""


@dataclass(frozen=True)
class StepResult:
    """The runner's answer to one plan."""

    step_id: int
    outputs: Mapping[str, RequestStepOutput]
    window_steps: int = 0
    """Forward steps the runner executed for a window plan (0 without a window)."""
    window_refusal: str | None = None
    """Why the runner ran a window plan as a single step (run-time gate), if it did."""
    window_cut: bool = False
    """An arrival waiting for a seat ended the window before its planned length."""
