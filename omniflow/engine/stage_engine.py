"""The per-stage engine loop: schedule -> execute -> update.

`StageEngine` owns one scheduler and one runner (AR or generation: both meet at
`StepPlan`/`StepResult`) and, on a stage that receives chunks, the chunk intake. `step()`
runs one round and returns the outputs; tests and offline callers drive it directly.
`start()` runs the loop on a thread (the embedded, in-process runtime): work arrives as typed
messages (`engine/messages.py`) through a thread-safe queue and is applied on the engine
thread, outputs leave through the `on_output` callback. A process-per-stage runtime would
implement the same `StageEngineHandle` interface over IPC.

Async scheduling: step n+1 is planned while step n executes on the runner's worker
thread; `update(n)` happens after `schedule(n+1)`. Sync: strictly in turn. Both give the
same tokens for a seeded request (the runner feeds the token it sampled itself). A step's
audio may come back still decoding (`StepResult.late_audio`): the engine applies the
tokens first, then, under async scheduling, submits the next step (planning it again when a
window's fence held it back) before it waits for that audio (`worker/step_audio.py`).
"""

from __future__ import annotations

import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Protocol

from omniflow.core.output import StageOutput
from omniflow.core.pipeline import NoTimer, PhaseTimer, PrefillCounters, StageStats
from omniflow.core.request import FinishReason
from omniflow.core.step import StepPlan, StepResult
from omniflow.engine.connector import ChunkIntake
from omniflow.engine.messages import (
    Abort,
    Add,
    EngineMessage,
    Hold,
    Pause,
    ReceiveFrames,
    Resume,
    Wake,
)
from omniflow.sched.gauges import SchedulerGauges
from omniflow.worker.step_audio import outputs_with_audio

log = logging.getLogger(__name__)

OutputSink = Callable[[StageOutput], None]

STATS_INTERVAL_S = 10.0
"""How often a busy engine logs one INFO line of throughput and queue state."""

IDLE_WAIT_S = 0.02
"""How long the loop waits for input when requests exist but nothing could be scheduled
(e.g. a code2wav request waiting for its next chunk); deadlines are checked at this pace."""


class Scheduler(Protocol):
    """What the engine needs from a scheduler."""

    def add_request(self, request: Any) -> None:
        """Queue a request; ValueError when it can never be served."""
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

    def stats(self) -> dict[str, int]:
        """Gauges for the periodic log line (requests running/waiting, KV use)."""
        ...

    def gauges(self) -> SchedulerGauges:
        """Typed gauges for `Orchestrator.stats()`."""
        ...


class Runner(Protocol):
    def execute(self, plan: StepPlan) -> StepResult: ...
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


class StageEngine:
    """One stage: scheduler + runner, stepped inline or on a thread."""

    def __init__(
        self,
        name: str,
        scheduler: Scheduler,
        runner: Runner,
        async_scheduling: bool = False,
        on_output: OutputSink | None = None,
        intake: ChunkIntake | None = None,
    ) -> None:
        self.name = name
        self.scheduler = scheduler
        self.runner = runner
        self.intake = intake
        """Chunk-receiving stages only: cuts upstream frames into whole chunks."""
        self.async_scheduling = async_scheduling
        self.on_output = on_output
        self._inbox: queue.Queue[EngineMessage | None] = queue.Queue()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"{name}-runner")
        self._inflight: tuple[StepPlan, Future[StepResult]] | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._dead = threading.Event()
        """Set when the loop died: the stage takes no more work."""
        self._send_lock = threading.Lock()
        self._death: str | None = None
        self._progressed = False
        self.num_steps = 0
        self._unsent: list[StageOutput] = []
        """A step's outputs between its update and their audio: requests the update ended are
        gone from the scheduler, so if the step dies there `_fail_all` ends them from here."""
        self.timer: PhaseTimer = NoTimer()
        """Times the wait for a step's late audio (`audio_wait`); `set_timer` also gives it to
        the runner for the step's own phases."""
        self.step_observer: Callable[[float], None] | None = None
        """Called with each productive step's duration in seconds (metrics)."""
        self._stats_at = time.monotonic()
        self._stats_steps = 0
        self._stats_outputs = 0

    # ------------------------------------------------------------------ inline API

    def add_request(self, request: Any) -> list[StageOutput]:
        """Admit now (engine thread or inline use); a refusal is one error output."""
        try:
            self.scheduler.add_request(request)
        except ValueError as exc:
            rid = request.request_id
            return [StageOutput(rid, finished=True, finish_reason="error", error=str(exc))]
        return []

    def submit(self, request: Any, initial_chunk_frames: int | None = None) -> None:
        """Thread-safe admission (applied on the engine thread)."""
        self.send(Add(request, initial_chunk_frames))

    def abort_request(
        self, request_id: str, reason: FinishReason = "abort", error: str | None = None
    ) -> list[StageOutput]:
        """End a request now; one terminal output if it was still here."""
        if self.intake is not None:
            self.intake.close(request_id)
        if self.scheduler.finish(request_id, reason, error):
            return [StageOutput(request_id, finished=True, finish_reason=reason, error=error)]
        return []

    @property
    def alive(self) -> bool:
        """False once the engine loop has died (its requests have each had one error)."""
        return not self._dead.is_set()

    def stats(self) -> StageStats:
        """Live gauges (read from another thread: plain counters, a consistent-enough view)."""
        g = self.scheduler.gauges()
        slots = self.runner.decoder_slots()
        return StageStats(
            name=self.name,
            alive=self.alive,
            running=g.running,
            waiting=g.waiting,
            kv_blocks_used=g.kv_blocks_used,
            kv_blocks_total=g.kv_blocks_total,
            decoder_slots_used=None if slots is None else slots[0],
            decoder_slots_total=None if slots is None else slots[1],
            windows=g.windows,
            prefills=self.runner.prefills(),
            preemptions=g.preemptions,
            paused=g.paused,
        )

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_unfinished or self._inflight is not None

    def set_timer(self, timer: PhaseTimer) -> None:
        """Time this stage's step phases (benchmarks): the runner's and the audio wait."""
        self.timer = timer
        self.runner.set_timer(timer, self.name)

    def step(self) -> list[StageOutput]:
        """One round: sync -> schedule, execute, update; async -> schedule n+1, update n."""
        self.num_steps += 1
        plan = self.scheduler.schedule()
        early = self.scheduler.drain_outputs()
        runs = not plan.is_empty or bool(plan.finished_ids)
        self._progressed = not plan.is_empty or self._inflight is not None or bool(early)
        if not self.async_scheduling:
            if not runs:
                return early
            result = self.runner.execute(plan)
            done = self.scheduler.update(plan, dataclasses.replace(result, late_audio=None))
            self._unsent = done
            outputs = early + self._with_late_audio(done, result)
            self._unsent = []
            return outputs
        submitted: Future[StepResult] | None = None
        if runs:
            submitted = self._executor.submit(self.runner.execute, plan)
        # Terminal outputs produced while planning (a refused chunk, a receive deadline) come
        # with the in-flight step's results, never instead of them.
        outputs: list[StageOutput] = early
        if self._inflight is not None:
            prev_plan, prev = self._inflight
            result = prev.result()
            # The tokens first: the update lifts a window's fence. The step's audio may still
            # be decoding (`StepResult.late_audio`); when the fence held this round's plan
            # back, plan and submit the next step before waiting for that audio.
            done = self.scheduler.update(prev_plan, dataclasses.replace(result, late_audio=None))
            self._unsent = done  # ended by the update: the death path must still end them
            if submitted is None and result.late_audio is not None:
                plan = self.scheduler.schedule()
                # notices only (an AR scheduler ends requests in update and finish alone), so
                # they may go before the update's outputs
                outputs = outputs + self.scheduler.drain_outputs()
                if not plan.is_empty or plan.finished_ids:
                    submitted = self._executor.submit(self.runner.execute, plan)
            outputs = outputs + self._with_late_audio(done, result)
            self._unsent = []
        self._inflight = (plan, submitted) if submitted is not None else None
        return outputs

    def _with_late_audio(self, outputs: list[StageOutput], result: StepResult) -> list[StageOutput]:
        """The step's outputs with its audio, waited for now (`worker/step_audio.py`); a
        request still running whose audio failed is finished here (its tokens were applied)."""
        if result.late_audio is None:
            return outputs
        with self.timer.phase(self.name, "audio_wait"):
            out, failed = outputs_with_audio(outputs, result)
        for rid, error in failed:
            self.scheduler.finish(rid, "error", error)
        return out

    def run_until_idle(self, max_steps: int = 1_000_000) -> list[StageOutput]:
        """Step until nothing is left (offline use and tests)."""
        outputs: list[StageOutput] = []
        for _ in range(max_steps):
            if not self.has_work:
                return outputs
            outputs.extend(self.step())
        raise RuntimeError(f"{self.name}: not idle after {max_steps} steps")

    # ------------------------------------------------------------------ threaded API

    def send(self, message: EngineMessage) -> None:
        """Queue a message for the engine thread (thread-safe). Once the loop has died, a
        request sent here ends at once with one error instead of waiting forever."""
        with self._send_lock:
            if not self._dead.is_set():
                self._inbox.put(message)
                return
        self._emit(self._refuse(message))

    def abort(self, request_id: str) -> None:
        self.send(Abort(request_id))

    def apply(self, message: EngineMessage) -> list[StageOutput]:
        """Apply one message now (on the engine thread, or inline when not threaded)."""
        match message:
            case Add(request=request, initial_chunk_frames=first):
                outputs = self.add_request(request)
                if self.intake is not None and not outputs:
                    self.intake.open(request.request_id, first)
                return outputs
            case Abort(request_id=rid, reason=reason, error=error):
                return self.abort_request(rid, reason, error)
            case ReceiveFrames(request_id=rid, frames=frames, finished=finished):
                if self.intake is None:
                    raise TypeError(f"stage {self.name} receives no frames (no upstream)")
                self.intake.receive(rid, frames, finished)
                return []
            case Hold(request_id=rid):
                if self.intake is not None:
                    self.intake.hold(rid)
                return []
            case Pause(request_id=rid):
                self.scheduler.pause(rid)
                return []
            case Resume(request_id=rid):
                self.scheduler.resume(rid)
                return []
            case Wake():
                return []

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name=f"{self.name}-engine", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stopping.set()
        self._inbox.put(None)
        if self._thread is not None:
            self._thread.join(timeout=30)
        self._executor.shutdown(wait=True)

    def _emit(self, outputs: list[StageOutput]) -> None:
        for out in outputs:
            if out.finished and self.intake is not None:
                self.intake.close(out.request_id)  # ended here: no more chunks to cut
            if self.on_output is not None:
                self.on_output(out)

    def _drain(self, timeout: float | None) -> None:
        """Apply queued commands; wait up to `timeout` for the first (None: forever)."""
        try:
            item = self._inbox.get(timeout=timeout) if timeout != 0 else self._inbox.get_nowait()
        except queue.Empty:
            return
        while item is not None:
            self._emit(self.apply(item))
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _loop(self) -> None:
        try:
            while not self._stopping.is_set():
                self._drain(timeout=0 if self.has_work else None)
                if self._stopping.is_set():
                    break
                if self.has_work:
                    t0 = time.perf_counter()
                    outputs = self.step()
                    if self._progressed and self.step_observer is not None:
                        self.step_observer(time.perf_counter() - t0)
                    self._emit(outputs)
                    self._log_stats(outputs)
                    if not self._progressed:
                        self._drain(timeout=IDLE_WAIT_S)
        except Exception as exc:  # noqa: BLE001 - the loop is dying: end every request once
            # Any escape here is a bug, not a request's failure (the runner turns model errors
            # into per-request errors). Each request still gets exactly one error output, and
            # `abort_request` releases its scheduler state (KV blocks, queues); queued
            # admissions are refused and later sends are answered at once (see `send`).
            log.exception("stage %s: engine loop failed", self.name)
            self._death = f"stage {self.name} failed: {exc}"
            with self._send_lock:
                self._dead.set()
            self._fail_all(self._death)
            self._refuse_pending()

    def _log_stats(self, outputs: list[StageOutput]) -> None:
        if self._progressed:
            self._stats_steps += 1
            self._stats_outputs += sum(len(o.tokens) or (o.audio is not None) for o in outputs)
        now = time.monotonic()
        if now - self._stats_at < STATS_INTERVAL_S:
            return
        if self._stats_steps:
            span = now - self._stats_at
            gauges = " ".join(f"{k}={v}" for k, v in self.scheduler.stats().items())
            log.info(
                "stage %s: %.1f steps/s, %.1f outputs/s, %s",
                self.name,
                self._stats_steps / span,
                self._stats_outputs / span,
                gauges,
            )
        self._stats_at, self._stats_steps, self._stats_outputs = now, 0, 0

    def _refuse(self, message: EngineMessage) -> list[StageOutput]:
        """A dead stage answers an admission with one error; other messages are moot."""
        if isinstance(message, Add):
            error = self._death or f"stage {self.name} is not running"
            rid = message.request.request_id
            return [StageOutput(rid, finished=True, finish_reason="error", error=error)]
        return []

    def _refuse_pending(self) -> None:
        """Messages queued before the loop died are never applied: refuse them now."""
        while True:
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return
            if item is not None:
                self._emit(self._refuse(item))

    def _fail_all(self, message: str) -> None:
        for rid in self.scheduler.unfinished_ids():
            self._emit(self.abort_request(rid, "error", message))
        ended = {o.request_id for o in self._unsent if o.finished}
        self._unsent = []
        for rid in ended:  # ended by an update whose outputs the dying step never returned
            self._emit([StageOutput(rid, finished=True, finish_reason="error", error=message)])
