"""The autoregressive scheduler: continuous batching over a paged KV cache.

Each `schedule()` builds one `StepPlan` under a token budget and a row cap: running
requests first (oldest first; by playback deadline when more are resident than a step has
rows, `sched/seating.py`), then waiting ones (unless held: `arrival_hold_ms`); a waiting
context that would fit whole next step waits for it rather than being split now; longer
ones are prefilled in chunks. When KV blocks run out the newest running request is
preempted and later recomputed from its prompt and outputs. `update()` applies results.

Sync and async scheduling share this code. Under async scheduling the engine calls
`schedule()` for step n+1 before `update()` of step n: a request whose step has reached the
end of its known tokens gets a placeholder for the token being sampled, and the next plan
may schedule that placeholder's position (the runner holds the sampled token itself).

Backpressure (docs/reliability.md): a paused request is held out of planning (as behind the
window fence) and keeps its KV blocks and place; the pause is announced downstream as `held`,
as a preemption is, so receive deadlines wait. A text-starved one sits out too (`core/live.py`).
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable

from omniflow.config.schema import SchedulerConfig
from omniflow.core.output import StageOutput
from omniflow.core.pipeline import SchedulerGauges
from omniflow.core.request import FINISHED_BY_REASON, FinishReason, Request, RequestState
from omniflow.core.step import StepPlan, StepResult
from omniflow.sched.ar_admission import (
    SeatGaps,
    admissible_waiting,
    arrival_hold,
    first_audio_wait_s,
    holds,
    queued_at,
)
from omniflow.sched.ar_plan import StepDraft, assemble_plan
from omniflow.sched.ar_tokens import take_tokens, tokens_to_schedule
from omniflow.sched.audio_cycle import AudioCycle
from omniflow.sched.kv_cache import KVCacheManager
from omniflow.sched.live_input import extend_live, playing
from omniflow.sched.playback import PlaybackClock
from omniflow.sched.runner_roster import RunnerRoster
from omniflow.sched.seating import (
    arrivals_alone,
    free_seats,
    preemption_victim,
    row_order,
    rows_for_arrivals,
)
from omniflow.sched.window import Candidate, WindowStats, plan_window, reconcile_window


class ARScheduler:
    """Plans steps for one AR stage and applies their results."""

    def __init__(
        self,
        config: SchedulerConfig,
        window_k: int = 0,
        playback: PlaybackClock | None = None,
        clock: Callable[[], float] = time.monotonic,
        audio_pass_steps: int = 0,
        limit_key: str = "scheduler.max_model_len",
    ) -> None:
        self.config = config
        self.limit_key = limit_key  # as `omniflow config` prints it: the cut warning names it
        self.audio_cycle = AudioCycle(audio_pass_steps, playback)
        """Single steps whose audio rows may hold and decode in one pass (`audio_cycle.py`)."""
        self.seats = SeatGaps(clock)
        """How often a seat frees (admission control, `first_audio_wait_s`)."""
        self.playback = playback
        """Each stream's slack and the step time (`sched/playback.py`): sizes windows, seats
        arrivals alone, informs admission; None: none of these, windows of window_k."""
        self.window_k = window_k
        self.window_stats = WindowStats()
        self._outstanding: dict[str, int] = {}
        """Requests with a window in flight (the fence), held until update() reconciles it."""
        self.kv = KVCacheManager(config.num_kv_blocks, config.block_size)
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self._step_ids = itertools.count()
        self._arrivals = itertools.count()
        self._expected: dict[int, dict[str, int]] = {}
        """step id -> tokens each request will sample in it (placeholders to reconcile)."""
        self._roster = RunnerRoster()
        self.num_preemptions = 0
        self._held: list[StageOutput] = []
        """Preemption and pause notices for downstream stages (drained with the plan)."""
        self._paused: set[str] = set()
        """Requests held out of planning until their consumer catches up (backpressure)."""
        self._queued_at: dict[str, float] = {}  # arrivals' times (playback clock): holds

    # ------------------------------------------------------------------ intake

    def add_request(self, request: Request, sent_at: float | None = None) -> None:
        """Queue a request (`sent_at`: when it was sent, where a hold counts from); a prompt
        that cannot fit max_model_len is refused (ValueError)."""
        if request.request_id in self.requests:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        if request.prompt_len + 1 > self.config.max_model_len:
            raise ValueError(
                f"prompt of {request.prompt_len} tokens leaves no room to generate within "
                f"max_model_len {self.config.max_model_len}"
            )
        request.arrival = next(self._arrivals)
        request.state = RequestState.WAITING
        self._queued_at[request.request_id] = queued_at(self.playback, sent_at)
        self.requests[request.request_id] = request
        self.waiting.append(request)

    def finish(self, request_id: str, reason: FinishReason, error: str | None = None) -> bool:
        """End a request now (abort, error); False when it is not (or no longer) here."""
        request = self.requests.get(request_id)
        if request is None:
            return False
        request.error = error
        self._finish(request, FINISHED_BY_REASON[reason])
        return True

    def extend_input(self, request_id: str, text: str, done: bool) -> list[StageOutput]:
        """More text for a live request (`live_input.extend_live`); its one terminal output
        when that ends it (text it cannot take; its length cap, reached already)."""
        req = self.requests.get(request_id)
        if req is None:
            return []  # ended already: the text has nowhere to go
        end = extend_live(req, text, done, self.playback)
        if end is None:
            return []
        reason, error = end
        self.finish(request_id, reason, error)
        return [StageOutput(request_id, finished=True, finish_reason=reason, error=error)]

    def pause(self, request_id: str) -> None:
        """Hold the request out of planning; it keeps its KV blocks and its place. A request
        not (or no longer) here is ignored: the pause raced with its end."""
        if request_id in self.requests and request_id not in self._paused:
            self._paused.add(request_id)
            self._held.append(StageOutput(request_id, held=True))

    def resume(self, request_id: str) -> None:
        """Plan the request again (no-op when it is not paused)."""
        self._paused.discard(request_id)

    @property
    def has_unfinished(self) -> bool:
        """Requests to serve, or runner-side state still to release (a step delivers it)."""
        return bool(self.requests) or self._roster.has_drops

    def unfinished_ids(self) -> list[str]:
        return list(self.requests)

    def drain_outputs(self) -> list[StageOutput]:
        """Non-terminal notices produced while planning: requests preempted (`held`). The AR
        scheduler ends requests only in update() and finish()."""
        out, self._held = self._held, []
        return out

    def first_audio_wait_s(self) -> float | None:
        """`ar_admission.first_audio_wait_s` now (read from another thread: an estimate)."""
        free = free_seats(self.config, self.playback, self.running)
        held = arrival_hold(*self._queue(), self.config, self.playback).left_s
        seats = (free, self.seats, self.playback, self.config.max_num_seqs, held)
        return first_audio_wait_s(self.waiting, self.running, *seats)

    def seats_free(self) -> bool:
        """A request added now could be seated next step (`free_seats`): not while held."""
        held = holds(list(self.waiting), self.running, self._paused, self.config, self.playback)
        return not held and free_seats(self.config, self.playback, self.running) > 0

    def seatable(self) -> bool:
        """A seat is free and an admissible request waits for it (not paused or text-starved)."""
        return self.seats_free() and admissible_waiting(self.waiting, self._paused) > 0

    def gauges(self) -> SchedulerGauges:
        """Typed gauges for `Orchestrator.stats()`."""
        # arrival steps and held-audio cycles need no window
        clocked = self.window_k or self.playback is not None or self.audio_cycle.steps > 1
        windows = self.window_stats.counters(self.audio_cycle.cycles) if clocked else None
        clock = self.playback
        return SchedulerGauges(
            running=len(self.running),
            waiting=len(self.waiting),
            kv_blocks_used=self.kv.num_used_blocks,
            kv_blocks_total=self.kv.pool.num_blocks,
            windows=windows,
            preemptions=self.num_preemptions,
            paused=len(self._paused),
            min_slack_s=None if clock is None else clock.min_slack(playing(self.running)),
        )

    # ------------------------------------------------------------------ planning

    def schedule(self) -> StepPlan:
        """Plan one step."""
        draft = StepDraft(self.config.max_num_batched_tokens)
        preempted_now = False
        rows = self.config.max_num_seqs
        hold = arrival_hold(*self._queue(), self.config, self.playback).steps
        free = 0 if hold is not None else free_seats(self.config, self.playback, self.running)
        kept, spare = rows_for_arrivals(self.waiting, self._paused, free, self.kv)
        kept = min(kept, rows - 1) if self.running else kept  # running streams keep a row
        held = self._outstanding.keys() | self._paused
        queued = admissible_waiting(self.waiting, self._paused)
        self.seats.planned(queued, len(self.running), free, self.playback, rows)
        alone = arrivals_alone(self.running, kept, queued, held, rows, spare, self.playback)
        if not alone:
            preempted_now = self._seat_running(rows - kept, draft)

        # The room a waiting context would have next step: what the running requests leave
        # now (all of them, when they sit this step out), less one token for each request
        # admitted below (it decodes next step).
        room = draft.budget - len(self.running) if alone else draft.budget
        for req in list(self.waiting):
            if draft.budget <= 0 or preempted_now or free <= 0 or len(draft.scheduled) >= rows:
                break
            if req.request_id in self._paused or req.input_room == 0:
                continue  # preempted while paused or text-starved: it waits, others go on
            if req.num_placeholders:
                break  # a preempted request waits until its in-flight sample is reconciled
            n = self._tokens_to_schedule(req, draft.budget)
            if n == 0 or n < req.num_tokens - req.num_computed_tokens <= room:
                # A context that will fit whole next step waits for it: a split one continues
                # on a cached prefix, which no prompt graph serves, and takes its whole step's
                # prefill to the eager path.
                break
            blocks = self.kv.allocate_slots(req.request_id, req.num_computed_tokens + n)
            if blocks is None:
                break
            self.waiting.remove(req)
            self._queued_at.pop(req.request_id, None)
            req.state = RequestState.RUNNING
            if req.seated_at is None:  # the first seat (a preempted request comes back)
                req.seated_at = time.perf_counter()
            self.running.append(req)
            free -= 1
            draft.take(req, n, blocks)
            room -= 1

        if alone and not draft.scheduled:  # no arrival fitted after all: the step is theirs
            alone = False
            preempted_now = self._seat_running(rows, draft)
        self.window_stats.arrival_steps += alone
        scheduled, new_blocks = draft.scheduled, draft.new_blocks
        before = draft.computed_before
        candidates = [
            Candidate(self.requests[rid], n, before[rid], not self._roster.knows(rid))
            for rid, n in scheduled.items()
        ]
        window, extra = (
            ({}, {})
            if self.audio_cycle.running
            else plan_window(
                self.window_k,
                candidates,
                waiting=0 if hold is not None else admissible_waiting(self.waiting, self._paused),
                budget=self.config.max_num_batched_tokens,
                max_model_len=self.config.max_model_len,
                kv=self.kv,
                stats=self.window_stats,
                slack_k=self._slack_k(scheduled, hold),
            )
        )
        later = self.audio_cycle.plan(candidates, bool(window))
        for rid, k in window.items():
            scheduled[rid] += k - 1  # its single step's tokens, then k - 1 decode steps
            new_blocks[rid] = new_blocks[rid] + extra[rid]
            self._outstanding[rid] = k
        step_id = next(self._step_ids)
        plan, expected = assemble_plan(
            step_id, scheduled, new_blocks, window, self.requests, self.kv, self._roster
        )
        plan = self.audio_cycle.stamp(plan, later)
        if expected:  # a plan never submitted (the engine plans again) leaves nothing behind
            self._expected[step_id] = expected
        if self.playback is not None and not plan.is_empty and not alone:
            # an arrival step (prefills only) is not timed: it is no decode step
            self.playback.planned(step_id)
        return plan

    def _seat_running(self, rows: int, draft: StepDraft) -> bool:
        """Give running requests up to `rows` rows of the step, preempting the newest when KV
        runs out. Returns whether anyone was preempted."""
        preempted = False
        for req in row_order(self.running, rows, self.playback):
            if draft.budget <= 0 or len(draft.scheduled) >= rows:
                break
            if req not in self.running:
                continue  # preempted above to make room for another
            n = self._tokens_to_schedule(req, draft.budget)
            if n == 0:
                continue
            blocks = self.kv.allocate_slots(req.request_id, req.num_computed_tokens + n)
            while blocks is None:
                victim = preemption_victim(self.running, req, self._paused, draft.scheduled)
                self.running.remove(victim)
                self._preempt(victim)
                preempted = True
                if victim is req:
                    break
                blocks = self.kv.allocate_slots(req.request_id, req.num_computed_tokens + n)
            if blocks is None:
                break
            draft.take(req, n, blocks)
        return preempted

    def _slack_k(self, scheduled: dict[str, int], hold: int | None = None) -> int | None:
        """The window length the scheduled streams' slack (and a hold's steps) allow."""
        if self.playback is None or self.window_k < 2:
            return None
        streams = [(rid, len(self.requests[rid].output_tokens)) for rid in scheduled]
        k = self.playback.window_steps(self.window_k, streams, self.playback.now())
        return k if hold is None else min(k, hold)

    def _queue(self) -> tuple:  # for the hold rules; a copy: other threads read it too
        return list(self.waiting), self._paused, self._queued_at, self.running

    def _tokens_to_schedule(self, req: Request, budget: int) -> int:
        """`tokens_to_schedule`: 0 behind the window fence or while paused (backpressure)."""
        if req.request_id in self._outstanding or req.request_id in self._paused:
            return 0
        return tokens_to_schedule(req, budget, self.config.max_model_len)

    def _preempt(self, req: Request) -> None:
        """Free the request's KV; it recomputes from prompt + outputs when resumed."""
        self.kv.free(req.request_id)
        req.state = RequestState.PREEMPTED
        req.num_computed_tokens = 0
        self._roster.preempt(req.request_id)
        self.waiting.appendleft(req)
        self.num_preemptions += 1
        self._held.append(StageOutput(req.request_id, held=True))

    # ------------------------------------------------------------------ results

    def update(self, plan: StepPlan, result: StepResult) -> list[StageOutput]:
        """Apply a step's tokens: append them, finish requests, release resources. The
        step's audio is not here: the engine takes it from the runner by its own call, so
        the scheduler never waits on the device."""
        expected = self._expected.pop(plan.step_id, {})
        now = 0.0
        if self.playback is not None:
            rows = len(plan.num_scheduled_tokens)
            now = self.playback.step_done(plan.step_id, result.window_steps or 1, rows)
        if plan.window:
            self.window_stats.record(result)
        outputs: list[StageOutput] = []
        for rid in plan.num_scheduled_tokens:
            if rid in plan.window:
                # Only the window's own update lifts its fence: under async scheduling the
                # update of an older single step can arrive after the window was planned.
                self._outstanding.pop(rid, None)
            req = self.requests.get(rid)
            if req is None:
                continue  # ended while this step was in flight; its outputs are dropped
            req.num_placeholders -= expected.get(rid, 0)
            out = result.outputs.get(rid)
            if rid in plan.window and req.state is RequestState.RUNNING:
                reconcile_window(req, plan.window[rid], out.tokens if out else (), self.kv)
            if out is None:
                continue
            if out.error is not None:
                req.error = out.error
                self._finish(req, RequestState.FINISHED_ERROR)
                outputs.append(
                    StageOutput(rid, finished=True, finish_reason="error", error=out.error)
                )
                continue
            if not out.tokens:
                continue
            if self.playback is not None:
                self.playback.frames_made(rid, len(req.output_tokens), now)
            output, state = take_tokens(req, out, self.config.max_model_len, self.limit_key)
            if state is not None:
                self._finish(req, state)
            outputs.append(output)
        return outputs

    def _finish(self, req: Request, state: RequestState) -> None:
        if req.state is RequestState.RUNNING:
            self.seats.freed()
        req.state = state
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self.kv.free(req.request_id)
        self._outstanding.pop(req.request_id, None)
        self._paused.discard(req.request_id)
        self._queued_at.pop(req.request_id, None)
        self._roster.finish(req.request_id)
        self.requests.pop(req.request_id, None)
        if self.playback is not None:
            self.playback.forget(req.request_id)
