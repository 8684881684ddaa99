"""What the engine needs from a scheduler and a runner, and what the orchestrator needs from
an engine: the protocols every stage kind meets (`StepPlan`/`StepResult` pass between them,
`core/step.py`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from omniflow.core.arrivals import Arrivals
from omniflow.core.audio import PendingAudio
from omniflow.core.output import StageOutput
from omniflow.core.pipeline import PhaseTimer, PrefillCounters, SchedulerGauges
from omniflow.core.request import FinishReason
from omniflow.core.step import StepPlan, StepResult
from omniflow.engine.messages import EngineMessage


class Scheduler(Protocol):
    """What the engine needs from a scheduler."""

    def add_request(self, request: Any, sent_at: float | None = None) -> None:
        """Queue a request; ValueError when it can never be served. `sent_at`: when it was
        sent (`time.monotonic`), for a scheduler that holds arrivals."""
        ...

    @property
    def has_unfinished(self) -> bool: ...
    def schedule(self) -> StepPlan: ...
    def update(self, plan: StepPlan, result: StepResult) -> list[StageOutput]: ...
    def finish(self, request_id: str, reason: FinishReason, error: str | None = None) -> bool: ...
    def unfinished_ids(self) -> list[str]: ...
    def drain_outputs(self) -> list[StageOutput]:
        """Outputs produced outside update(): terminal ones while planning (a chunk rejected,
        a deadline) and `held` notices (preempted, paused)."""
        ...

    def pause(self, request_id: str) -> None:
        """Backpressure: hold the request out of planning, keeping its state."""
        ...

    def resume(self, request_id: str) -> None:
        """Plan a paused request again."""
        ...

    def extend_input(self, request_id: str, text: str, done: bool) -> list[StageOutput]:
        """More input for a live request (`core/live.py`): nothing, or its one error output
        when it cannot take it (not live, or the text does not fit). An ended one: nothing."""
        ...

    def first_audio_wait_s(self) -> float | None:
        """Expected seconds before a request added now is seated (None: no estimate);
        read from another thread (admission control)."""
        ...

    def seats_free(self) -> bool:
        """Whether a request added now could be seated at the next step (read from another
        thread: a hint for cutting a running window short, never a promise)."""
        ...

    def seatable(self) -> bool:
        """Whether a request already waiting could be seated at the next step (on the engine
        thread, after its inbox is applied: whether a window in flight should end early)."""
        ...

    def gauges(self) -> SchedulerGauges:
        """Typed gauges for `Orchestrator.stats()` and the periodic log line."""
        ...


class Runner(Protocol):
    """What the engine needs from a worker: a step's tokens, then (by its own call) its audio."""

    def execute(self, plan: StepPlan) -> StepResult:
        """Run one plan; the tokens it sampled. Audio it queued waits for `take_audio`."""
        ...

    def take_audio(self, step_id: int) -> PendingAudio | None:
        """The audio step `step_id` queued, still being made (None: none); handed out once."""
        ...

    def watch_arrivals(self, arrivals: Arrivals) -> None:
        """End a running window at its next step boundary whenever `arrivals` is set."""
        ...

    def send_chunks(self, sink: Callable[[PendingAudio], None]) -> None:
        """Hand each chunk of a window's audio to `sink` as soon as it is queued, instead of
        keeping it for `take_audio` (an engine that sends audio while a step runs)."""
        ...

    def decoder_slots(self) -> tuple[int, int] | None:
        """(in use, total) streaming-decoder slots; None when the runner owns none."""
        ...

    def prefills(self) -> PrefillCounters | None:
        """Prefill forwards so far; None for a runner without prefills (generation)."""
        ...

    def set_timer(self, timer: PhaseTimer, stage: str) -> None:
        """Time the runner's step phases (benchmarks)."""
        ...


class StageEngineHandle(Protocol):
    """What the orchestrator uses."""

    name: str

    def send(self, message: EngineMessage) -> None: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...
