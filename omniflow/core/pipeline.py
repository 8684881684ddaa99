"""The public surface of a running pipeline: what serve, synth and bench may read.

`Pipeline` is the protocol serve, synth and bench type against (the orchestrator implements
it; tests serve a small fake with the same behaviour). `info()` answers a `PipelineInfo`
(static facts: the served model, its voices and languages, limits, capabilities) and
`stats()` a `PipelineStats` (live gauges per stage). Nothing outside `engine/` reaches into
engines, schedulers or runners; a stage living in another process answers the same values.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from typing import Protocol

from omniflow.core.events import Sink
from omniflow.core.speech import SpeechRequest
from omniflow.core.voice import ReferenceEncoder


class PipelineUnavailable(RuntimeError):
    """A stage's loop died: the pipeline takes no new requests (HTTP 503)."""


class Overloaded(PipelineUnavailable):
    """This request's first audio could not be made within the caller's wait: it is refused
    at once (a 503 with `Retry-After`) rather than queued for seconds."""

    def __init__(self, message: str, retry_after_s: float) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


@dataclass(frozen=True)
class RequestLimits:
    """What a caller bounds for one request it submits (None: unbounded)."""

    max_buffered_s: float | None = None
    """Audio the request may get ahead of its consumer, who reports what it took with
    `consumed`; with that much unread the request pauses (flow control)."""
    max_wait_s: float | None = None
    """The longest wait for a seat; a request that would wait longer is refused at once
    (`Overloaded`) instead of queued."""


UNBOUNDED = RequestLimits()
"""An in-process caller's limits: its sink takes everything as it comes, it waits."""


@dataclass(frozen=True)
class PipelineInfo:
    """Static facts of a built pipeline."""

    model: str
    """Served model name (`model` field of the speech API, `/v1/models`)."""
    pipeline: str
    """Pipeline name from the configuration."""
    voices: tuple[str, ...]
    """Preset speakers, sorted."""
    languages: tuple[str, ...]
    """Accepted languages, "auto" first."""
    sample_rate: int
    """Output PCM sample rate (Hz)."""
    max_new_tokens: int
    """The largest `max_new_tokens` a request may ask for (frames)."""
    supports_instructions: bool
    """Whether style instructions are part of the prompt on this model."""
    stages: tuple[str, ...]
    """Stage names in topological order (sources first; the last is the final stage)."""
    task_types: tuple[str, ...] = ("CustomVoice",)
    """Speech tasks the model serves."""
    engine_pid: int | None = None
    """The engine's process where it is not the caller's (`pipeline.runtime: process`): the
    server reports its memory and CPU too; None: the engine runs in the caller's process."""


@dataclass(frozen=True)
class WindowCounters:
    """Multi-step window counters of one AR stage (cumulative)."""

    planned: int
    executed: int
    steps: int
    refusals: dict[str, int] = field(default_factory=dict)
    sizes: dict[int, int] = field(default_factory=dict)
    """Planned windows by their length in steps (slack-sized windows vary)."""
    cut: int = 0
    """Windows an arrival ended before their planned length (`core/arrivals.py`)."""
    arrival_steps: int = 0
    """Steps the running streams sat out so that arrivals were prefilled alone."""
    audio_cycles: int = 0
    """Runs of single steps whose frames playing streams held for one decoder pass
    (`audio_pass_steps`, `sched/audio_cycle.py`)."""


@dataclass(frozen=True)
class PrefillCounters:
    """Prefill forwards of one AR stage (cumulative): how many ran on the prompt graphs and
    how many replays they took, so a benchmark says whether its mixed steps took the
    graphed path or paid eager launches: at large batches the step times alone cannot tell
    the two apart (measured: docs/performance.md, "The parts of a step"). Read from another
    thread while a step runs, the fields may be a step apart (`graphed` counts before `steps`
    does); each only grows, and a benchmark reads them when the stage is idle."""

    steps: int
    """Steps with a prefill forward (mixed and prefill steps)."""
    tokens: int
    """Tokens those forwards computed."""
    graphed: int
    """Of `steps`, those run on the prompt-graph path (the rest ran the eager prefill): CUDA
    graph replays where graphs are captured; where they are not (the CPU,
    `platform.cuda_graphs=false` with an explicit `prompt_graph_tokens`) the same padded
    step, run eagerly."""
    replays: int
    """Prompt-graph replays the graphed ones took (more than one for a step above the
    largest bucket)."""


@dataclass(frozen=True, kw_only=True)
class SchedulerGauges:
    """Live gauges a stage's scheduler reports (`Scheduler.gauges()`); the stage's own
    `StageStats` are these and what the stage adds, so the two never drift apart."""

    running: int
    """Requests being computed (AR: running queue; generation: decoding)."""
    waiting: int
    """Requests queued (AR: waiting; generation: started but without a ready chunk)."""
    kv_blocks_used: int | None = None
    """AR stages: KV-cache blocks in use (None for stages without a KV cache)."""
    kv_blocks_total: int | None = None
    windows: WindowCounters | None = None
    """Present on a stage with window_k > 0 or a playback clock (its arrival steps)."""
    preemptions: int | None = None
    """AR stages: requests preempted (recomputed later) so far."""
    paused: int = 0
    """Requests held out of scheduling because whoever consumes their output is behind
    (backpressure: the client, or the downstream stage's backlog)."""
    min_slack_s: float | None = None
    """Stages sizing windows by playback slack: the least slack of a running stream, in
    seconds (negative: late; None: no clock, or no stream playing yet)."""


@dataclass(frozen=True, kw_only=True)
class StageStats(SchedulerGauges):
    """Live gauges of one stage: its scheduler's, and the stage's own."""

    name: str
    alive: bool
    """False once the stage's loop has died."""
    decoder_slots_used: int | None = None
    """Stages owning a streaming codec decoder: slots in use (None otherwise)."""
    decoder_slots_total: int | None = None
    prefills: PrefillCounters | None = None
    """AR stages (None for a generation stage, which has no prefill)."""
    backlog_frames: int | None = None
    """Chunk-receiving stages: frames received from upstream and not yet consumed, summed
    over requests (None for a stage without an upstream)."""


@dataclass(frozen=True)
class PipelineStats:
    """Live gauges of the whole pipeline."""

    in_flight: int
    """Requests admitted and not yet ended."""
    stages: tuple[StageStats, ...]
    buffered_audio_s: float = 0.0
    """Audio handed to consumers and not yet taken by them (all requests, seconds)."""

    @property
    def healthy(self) -> bool:
        return all(s.alive for s in self.stages)


class PhaseTimer(Protocol):
    """Times named phases of a stage's step (benchmarks): `with timer.phase(stage, name):`.
    Phases: `plan_state` (a plan's admits, finishes and block tables, host, before and
    outside the step's own phase), `decode_step` / `mixed_step` (the rest of an execute;
    decode: every request computes its next token), `decode_layout` (the decode rows'
    inputs, host), `forward` (decode rows),
    `prefill_layout` (a mixed step's prefill inputs, host), `prefill_embed` and `prefill`
    (its prefill forward), `sample` (the frame, code predictor included), `readback`,
    `record` (the sampled tokens appended, host), `audio`."""

    def phase(self, stage: str, name: str) -> AbstractContextManager[object]: ...


class PhaseRecord(PhaseTimer, Protocol):
    """A phase timer that also takes phases timed elsewhere: an engine in another process
    (`pipeline.runtime=process`) times them on its host clock and hands over the seconds."""

    def add(self, stage: str, name: str, seconds: float) -> None: ...


class NoTimer:
    """The default: phases cost nothing."""

    def phase(self, stage: str, name: str) -> AbstractContextManager[object]:
        return nullcontext()

    def add(self, stage: str, name: str, seconds: float) -> None:
        return None


class Pipeline(Protocol):
    """What `Orchestrator` offers the server (see omniflow/core/pipeline.py)."""

    def info(self) -> PipelineInfo: ...

    def stats(self) -> PipelineStats: ...

    def reference_encoder(self) -> ReferenceEncoder | None:
        """A Base model's voice-clone encoders; None: the model does not clone voices."""
        ...

    def set_step_observer(self, observer: Callable[[str, float], None]) -> None: ...

    def submit(self, speech: SpeechRequest, sink: Sink, limits: RequestLimits = UNBOUNDED) -> None:
        """ValueError: bad input; PipelineUnavailable: a stage has stopped; Overloaded: the
        request could not be seated within `limits.max_wait_s`."""
        ...

    def consumed(self, request_id: str, samples: int) -> None:
        """The response took `samples` of the request's audio (backpressure credit)."""
        ...

    def abort(self, request_id: str, error: str | None = None) -> None:
        """End the request: its sink's terminal event is an abort, or an error with `error`."""
        ...

    def extend(self, request_id: str, text: str, done: bool) -> None:
        """More text for a request submitted `incremental`; `done`: its last. Text that
        cannot be taken ends the request with an error event; an ended one ignores it."""
        ...

    def start(self) -> None: ...

    def stop(self) -> None: ...
