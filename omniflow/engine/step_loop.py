"""One stage's step loop: schedule -> execute -> update, in turn or pipelined.

`StepLoop` owns one scheduler and one runner (AR or generation: both meet at
`StepPlan`/`StepResult`) and, on a stage that receives chunks, the chunk intake. `step()`
runs one round and returns the outputs; tests and offline callers drive it directly, and
`StageEngine` (`engine/stage_engine.py`) runs it on a thread.

Async scheduling: step n+1 is planned while step n executes on the runner's worker thread;
`update(n)` happens after `schedule(n+1)`. Sync: strictly in turn. Both give the same tokens
for a seeded request (the runner feeds the token it sampled itself). A step's audio is the
runner's second output (`Runner.take_audio`): the loop applies the tokens first, then, under
async scheduling, submits the next step (planning it again when a window's fence held it
back) before it waits for that audio. Under async scheduling a window's chunks
(`audio_chunk_frames` below `window_k`) leave while it runs (`engine/chunk_inbox.py`).
"""

from __future__ import annotations

import dataclasses
import logging
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from omniflow.core.arrivals import Arrivals
from omniflow.core.audio import AudioFailed, PendingAudio
from omniflow.core.output import StageOutput
from omniflow.core.pipeline import NoTimer, PhaseTimer, StageStats
from omniflow.core.request import FinishReason
from omniflow.core.step import StepPlan, StepResult
from omniflow.engine.chunk_inbox import ChunkInbox
from omniflow.engine.connector import ChunkIntake
from omniflow.engine.contracts import Runner, Scheduler
from omniflow.engine.messages import (
    Abort,
    Add,
    EngineMessage,
    ExtendInput,
    Hold,
    Pause,
    ReceiveFrames,
    Resume,
)

log = logging.getLogger(__name__)


class StepLoop:
    """One stage: scheduler + runner, stepped by the caller."""

    def __init__(
        self,
        name: str,
        scheduler: Scheduler,
        runner: Runner,
        async_scheduling: bool = False,
        intake: ChunkIntake | None = None,
    ) -> None:
        self.name = name
        self.scheduler = scheduler
        self.runner = runner
        self.intake = intake
        """Chunk-receiving stages only: cuts upstream frames into whole chunks."""
        self.async_scheduling = async_scheduling
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"{name}-runner")
        self._inflight: tuple[StepPlan, Future[StepResult]] | None = None
        self._progressed = False
        self.num_steps = 0
        self._unsent: list[StageOutput] = []
        """A step's outputs between its update and their audio: requests the update ended are
        gone from the scheduler, so if the step dies there they are ended from here."""
        self.arrivals = Arrivals()
        """Set when a request arrives that the next step could seat; the runner ends a
        running window at its next step boundary (`core/arrivals.py`)."""
        runner.watch_arrivals(self.arrivals)
        self._chunks = ChunkInbox() if async_scheduling else None
        """A window's chunks as they are queued (async: the loop waits on the runner's thread)."""
        if self._chunks is not None:
            runner.send_chunks(self._chunks.chunk)
        self._early: list[StageOutput] = []
        """Chunks' audio sent while a step ran, for a loop stepped by its caller."""
        self.timer: PhaseTimer = NoTimer()
        """Times the wait for a step's audio (`audio_wait`); `set_timer` also gives it to the
        runner for the step's own phases."""

    @property
    def alive(self) -> bool:
        """A loop stepped by its caller never dies on its own (`StageEngine` can)."""
        return True

    def add_request(self, request: Any, sent_at: float | None = None) -> list[StageOutput]:
        """Admit now; a refusal is one error output."""
        try:
            self.scheduler.add_request(request, sent_at)
        except ValueError as exc:
            rid = request.request_id
            return [StageOutput(rid, finished=True, finish_reason="error", error=str(exc))]
        return []

    def abort_request(
        self, request_id: str, reason: FinishReason = "abort", error: str | None = None
    ) -> list[StageOutput]:
        """End a request now; one terminal output if it was still here."""
        if self.intake is not None:
            self.intake.close(request_id)
        if self.scheduler.finish(request_id, reason, error):
            return [StageOutput(request_id, finished=True, finish_reason=reason, error=error)]
        return []

    def apply(self, message: EngineMessage) -> list[StageOutput]:
        """Apply one message now (on the engine thread, or inline when not threaded)."""
        match message:
            case Add(request=request, initial_chunk_frames=first, sent_at=sent_at):
                outputs = self.add_request(request, sent_at)
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
            case ExtendInput(request_id=rid, text=text, done=done):
                return self.scheduler.extend_input(rid, text, done)
        return []  # Wake: nothing to apply, the loop just looks again

    def stats(self) -> StageStats:
        """Live gauges (read from another thread: plain counters, a consistent-enough view)."""
        g = self.scheduler.gauges()
        slots = self.runner.decoder_slots()
        return StageStats(
            **vars(g),  # the scheduler's gauges, as they are
            name=self.name,
            alive=self.alive,
            decoder_slots_used=None if slots is None else slots[0],
            decoder_slots_total=None if slots is None else slots[1],
            prefills=self.runner.prefills(),
        )

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_unfinished or self._inflight is not None

    @property
    def window_in_flight(self) -> bool:
        """A window is submitted (running, or queued behind a step) and its result not taken."""
        return self._inflight is not None and bool(self._inflight[0].window)

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
            audio = self.runner.take_audio(plan.step_id)
            done = self.scheduler.update(plan, result)
            self._unsent = done
            outputs = early + self._with_audio(done, audio)
            self._unsent = []
            return outputs
        submitted: Future[StepResult] | None = None
        if runs:
            submitted = self._submit(plan)
        # Terminal outputs produced while planning (a refused chunk, a receive deadline) come
        # with the in-flight step's results, never instead of them.
        outputs: list[StageOutput] = early
        if self._inflight is not None:
            prev_plan, prev = self._inflight
            failed = self._send_chunks(prev_plan)
            result = prev.result()
            audio = self.runner.take_audio(prev_plan.step_id)
            # The tokens first: the update lifts a window's fence. When the fence held this
            # round's plan back, plan and submit the next step before waiting for the audio.
            done = self.scheduler.update(prev_plan, result)
            taken: list[StageOutput] = []
            if submitted is None and audio is not None:
                # An arrival that cut the window is seated in this plan, not the one after.
                taken = self.take_arrivals() if self.arrivals.pending() else []
            self._unsent = done + taken  # ended here: the death path must still end them
            if submitted is None and audio is not None:
                plan = self.scheduler.schedule()
                # notices only (an AR scheduler ends requests in update and finish alone), so
                # they may go before the update's outputs
                outputs = outputs + self.scheduler.drain_outputs()
                if not plan.is_empty or plan.finished_ids:
                    submitted = self._submit(plan)
            finished = self._with_audio(done, audio)
            outputs = outputs + [self._chunk_failed(o, failed) for o in finished] + taken
            self._unsent = []
        self._inflight = (plan, submitted) if submitted is not None else None
        sent, self._early = self._early, []  # chunks' audio, before the step's own
        return sent + outputs

    def _submit(self, plan: StepPlan) -> Future[StepResult]:
        submitted = self._executor.submit(self.runner.execute, plan)
        if self._chunks is not None:
            self._chunks.watch(submitted)
        return submitted

    def _send_chunks(self, plan: StepPlan) -> dict[str, str]:
        """Send each chunk of the running step's audio as it is made, until the step ends;
        returns the requests whose chunk failed (they end with the step's outputs)."""
        failed: dict[str, str] = {}
        if self._chunks is None:
            return failed
        for chunk in self._chunks.drain():
            bad: dict[str, str] = {}
            try:
                pcm = chunk.result()
            except AudioFailed as exc:  # those requests only
                log.error("stage %s: audio of %s failed: %s", self.name, sorted(exc.errors), exc)
                pcm, bad = exc.pcm, exc.errors
            except (RuntimeError, ValueError) as exc:  # the chunk as a whole: the step's rows
                log.exception("stage %s: a window's audio chunk failed", self.name)
                pcm, bad = {}, dict.fromkeys(plan.num_scheduled_tokens, str(exc))
            failed.update(bad)
            # a request ended since the step was planned (aborted, or a chunk of the step
            # before failed) has had its terminal output: nothing of it may follow
            going = set(self.scheduler.unfinished_ids())
            self.send_early(
                [
                    StageOutput(rid, audio=a)
                    for rid, a in pcm.items()
                    if rid in going and rid not in failed
                ]
            )
        return failed

    def send_early(self, outputs: list[StageOutput]) -> None:
        """Outputs made while a step runs: here, kept for the step's own outputs (a loop
        stepped by its caller); `StageEngine` sends them at once."""
        self._early.extend(outputs)

    def _chunk_failed(self, output: StageOutput, failed: dict[str, str]) -> StageOutput:
        """A request one of whose chunks failed ends with that error (part of its audio is
        missing), as when the step's own audio fails."""
        if output.request_id not in failed or output.error is not None:
            return output
        return self._audio_failed(output, failed[output.request_id])

    def take_arrivals(self) -> list[StageOutput]:
        """Apply the messages queued while a step ran, before the next plan; returns their
        outputs. Called when an arrival cut a window, so that the arrival is prefilled in
        the step right after it. A loop stepped by its caller has no queue: nothing here."""
        return []

    def _with_audio(
        self, outputs: list[StageOutput], audio: PendingAudio | None
    ) -> list[StageOutput]:
        """The step's outputs with its audio, waited for now. A failed decode ends each of
        the step's requests with one error (a request still running is finished here: its
        tokens were applied)."""
        if audio is None:
            return outputs
        failed: dict[str, str] = {}
        with self.timer.phase(self.name, "audio_wait"):
            try:
                pcm = audio.result()
            except AudioFailed as exc:  # those requests only: the others' audio is good
                log.error("stage %s: audio of %s failed: %s", self.name, sorted(exc.errors), exc)
                pcm, failed = exc.pcm, exc.errors
            except (RuntimeError, ValueError) as exc:
                log.exception("stage %s: a step's audio failed", self.name)
                return [self._audio_failed(o, str(exc)) for o in outputs]
        with_audio = [
            self._audio_failed(o, failed[o.request_id])
            if o.request_id in failed
            else dataclasses.replace(o, audio=pcm[o.request_id])
            if o.request_id in pcm
            else o
            for o in outputs
        ]
        return with_audio + self._audio_alone(outputs, pcm, failed)

    def _audio_alone(
        self, outputs: list[StageOutput], pcm: dict[str, Any], failed: dict[str, str]
    ) -> list[StageOutput]:
        """Held frames of requests the step ran without (`worker/held_audio.py`: sat out or
        preempted), as audio-only outputs; none for a request that has ended (aborted, or
        its audio failed before): nothing of it may follow its terminal output."""
        listed = {o.request_id for o in outputs}
        extra = [rid for rid in (*pcm, *failed) if rid not in listed]
        if not extra:
            return []
        going = set(self.scheduler.unfinished_ids())
        return [
            self._audio_failed(StageOutput(rid), failed[rid])
            if rid in failed
            else StageOutput(rid, audio=pcm[rid])
            for rid in dict.fromkeys(extra)
            if rid in going
        ]

    def _audio_failed(self, output: StageOutput, error: str) -> StageOutput:
        if not output.finished:
            self.scheduler.finish(output.request_id, "error", error)
        return StageOutput(output.request_id, finished=True, finish_reason="error", error=error)

    def run_until_idle(self, max_steps: int = 1_000_000) -> list[StageOutput]:
        """Step until nothing is left (offline use and tests)."""
        outputs: list[StageOutput] = []
        for _ in range(max_steps):
            if not self.has_work:
                return outputs
            outputs.extend(self.step())
        raise RuntimeError(f"{self.name}: not idle after {max_steps} steps")

    def close(self) -> None:
        """Stop the runner's worker thread (after the last step)."""
        self._executor.shutdown(wait=True)
