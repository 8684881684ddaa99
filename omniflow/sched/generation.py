"""The scheduler of a chunk-receiving generation stage (code2wav).

Each request receives chunks of codec frames from its upstream stage. A ready chunk is the
request's input for one step and is scheduled **whole or not at all**: if it does not fit
the budget left in this step it waits intact; a chunk larger than the entire per-step
budget can never run, so its request ends with exactly one error and its resources are
released. A request has at most one chunk in flight, so chunks decode in order and a
rejection is only issued once the earlier chunk's output has been delivered. A request
whose next chunk does not arrive within the receive deadline ends with one error. The
deadline is armed by the first chunk: before it, the request may legitimately wait in the
upstream stage's queue (an upstream that dies ends its requests through the orchestrator).

Backpressure (docs/reliability.md): a paused request keeps its chunks and decoder state but
is not scheduled, and its deadline does not run (it is not waiting on its upstream); each
output says how many received frames it used up (`consumed_frames`), which is how the
orchestrator measures this stage's backlog and pauses the upstream when it grows.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from omniflow.config.schema import StepLimits
from omniflow.core.output import StageOutput
from omniflow.core.pipeline import SchedulerGauges
from omniflow.core.request import FinishReason
from omniflow.core.step import StepPlan, StepResult


@dataclass(frozen=True)
class Chunk:
    """Frames for one step of a receiving stage."""

    frames: tuple[tuple[int, ...], ...]
    last: bool
    index: int


@dataclass(eq=False)
class GenRequest:
    """A request inside a generation stage: its queue of received chunks."""

    request_id: str
    chunks: deque[Chunk] = field(default_factory=deque)
    arrival: int = 0
    deadline: float = 0.0
    inflight: int = 0
    started: bool = False
    next_index: int = 0
    paused: bool = False


class GenerationScheduler:
    """Schedules whole received chunks under the token budget."""

    def __init__(
        self,
        config: StepLimits,
        tokens_per_frame: int,
        receive_timeout_s: float,
        atomic_chunks: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if not atomic_chunks:
            raise ValueError(
                "GenerationScheduler schedules each received chunk whole (atomic_chunks); "
                "a stage whose chunks may be split needs another scheduler"
            )
        self.config = config
        self.tokens_per_frame = tokens_per_frame
        self.receive_timeout_s = receive_timeout_s
        self.clock = clock
        self.requests: dict[str, GenRequest] = {}
        self._arrivals = itertools.count()
        self._step_ids = itertools.count()
        self._drop_in_runner: set[str] = set()
        self._outputs: list[StageOutput] = []

    # ------------------------------------------------------------------ intake

    def add_request(self, request: GenRequest, sent_at: float | None = None) -> None:
        """Queue a chunk request (seated as its chunks come: nothing is held, `sent_at`
        plays no part)."""
        if request.request_id in self.requests:
            raise ValueError(f"duplicate request id {request.request_id!r}")
        request.arrival = next(self._arrivals)
        request.deadline = float("inf")  # armed by the first chunk
        self.requests[request.request_id] = request

    def receive(self, request_id: str, frames: tuple[tuple[int, ...], ...], last: bool) -> None:
        """A chunk from upstream; dropped if the request already ended (aborted, failed)."""
        req = self.requests.get(request_id)
        if req is None:
            return
        req.chunks.append(Chunk(frames, last, req.next_index))
        req.next_index += 1
        req.deadline = self.clock() + self.receive_timeout_s

    def hold(self, request_id: str) -> None:
        """The upstream paused this request (preempted, recomputing): alive, so the receive
        deadline is disarmed until the next chunk re-arms it."""
        req = self.requests.get(request_id)
        if req is not None:
            req.deadline = float("inf")

    def extend_input(self, request_id: str, text: str, done: bool) -> list[StageOutput]:
        """A chunk-receiving stage's input is frames, never text: a live request's text goes
        to the source stage (the orchestrator sends it there), so this is a caller's bug."""
        raise TypeError(f"a generation stage takes no live text (request {request_id!r})")

    def pause(self, request_id: str) -> None:
        """Schedule none of the request's chunks until `resume` (its consumer is behind); the
        pause is announced downstream as `held`, as the AR scheduler does."""
        req = self.requests.get(request_id)
        if req is not None and not req.paused:
            req.paused = True
            self._outputs.append(StageOutput(request_id, held=True))

    def resume(self, request_id: str) -> None:
        """Schedule the request again; an armed deadline restarts now (the pause was not the
        upstream's stall)."""
        req = self.requests.get(request_id)
        if req is not None and req.paused:
            req.paused = False
            if req.deadline != float("inf"):
                req.deadline = self.clock() + self.receive_timeout_s

    def finish(self, request_id: str, reason: FinishReason, error: str | None = None) -> bool:
        req = self.requests.pop(request_id, None)
        if req is None:
            return False
        if req.started:
            self._drop_in_runner.add(request_id)
        return True

    @property
    def has_unfinished(self) -> bool:
        """Requests to serve, or decoder slots still to release (a step delivers it)."""
        return bool(self.requests) or bool(self._drop_in_runner)

    def unfinished_ids(self) -> list[str]:
        return list(self.requests)

    def drain_outputs(self) -> list[StageOutput]:
        """Outputs produced outside a step: rejections and deadlines (terminal), pause
        notices (`held`)."""
        out, self._outputs = self._outputs, []
        return out

    def first_audio_wait_s(self) -> None:
        """No estimate: a receiving stage's requests are seated by their upstream."""
        return None

    def seats_free(self) -> bool:
        """Never asks a window to end early: a code2wav stage runs none."""
        return False

    def seatable(self) -> bool:
        """As `seats_free`: no window to end early."""
        return False

    def gauges(self) -> SchedulerGauges:
        """Typed gauges for `Orchestrator.stats()`: decoding requests run, the rest wait. Read
        from other threads: one copy of the table (taken whole), then counted."""
        requests = list(self.requests.values())
        started = sum(1 for r in requests if r.started)
        paused = sum(1 for r in requests if r.paused)
        return SchedulerGauges(running=started, waiting=len(requests) - started, paused=paused)

    def chunk_tokens(self, chunk: Chunk) -> int:
        return len(chunk.frames) * self.tokens_per_frame

    # ------------------------------------------------------------------ planning

    def _fail(self, req: GenRequest, message: str) -> None:
        self.finish(req.request_id, "error", message)
        self._outputs.append(
            StageOutput(req.request_id, finished=True, finish_reason="error", error=message)
        )

    def schedule(self) -> StepPlan:
        now = self.clock()
        budget = self.config.max_num_batched_tokens
        active = sum(1 for r in self.requests.values() if r.started)
        scheduled: dict[str, int] = {}
        chunks: dict[str, Any] = {}
        for req in sorted(self.requests.values(), key=lambda r: r.arrival):
            if req.inflight:
                continue  # one chunk in flight per request: order, and rejections wait
            if req.paused:
                continue  # backpressure: neither scheduled nor judged stalled
            if not req.chunks:
                if now > req.deadline:
                    self._fail(
                        req,
                        f"upstream sent no chunk for {self.receive_timeout_s:g} s "
                        "(stalled or failed)",
                    )
                continue
            chunk = req.chunks[0]
            tokens = self.chunk_tokens(chunk)
            if tokens > self.config.max_num_batched_tokens:
                self._fail(
                    req,
                    f"chunk of {tokens} tokens exceeds the stage's whole per-step budget "
                    f"(max_num_batched_tokens={self.config.max_num_batched_tokens}); it can "
                    "never be scheduled",
                )
                continue
            if tokens > budget or len(scheduled) >= self.config.max_num_seqs:
                continue  # whole or not at all: it waits intact for the next step
            if not req.started:
                if active >= self.config.max_num_seqs:
                    continue
                active += 1
                req.started = True
            req.chunks.popleft()
            req.inflight += 1
            scheduled[req.request_id] = tokens
            chunks[req.request_id] = chunk
            budget -= tokens
        dropped = frozenset(self._drop_in_runner)
        self._drop_in_runner.clear()
        return StepPlan(
            step_id=next(self._step_ids),
            num_scheduled_tokens=scheduled,
            finished_ids=dropped,
            total_num_tokens=sum(scheduled.values()),
            chunks=chunks,
        )

    # ------------------------------------------------------------------ results

    def update(self, plan: StepPlan, result: StepResult) -> list[StageOutput]:
        outputs = self.drain_outputs()
        for rid in plan.num_scheduled_tokens:
            req = self.requests.get(rid)
            if req is None:
                continue  # ended while its chunk was in flight
            req.inflight -= 1
            req.deadline = self.clock() + self.receive_timeout_s
            out = result.outputs.get(rid)
            chunk: Chunk = plan.chunks[rid]
            if out is not None and out.error is not None:
                self._fail(req, out.error)
                outputs.extend(self.drain_outputs())
                continue
            if chunk.last:
                self.requests.pop(rid, None)
            outputs.append(
                StageOutput(
                    rid,
                    audio=out.audio if out is not None else None,
                    finished=chunk.last,
                    finish_reason="stop" if chunk.last else None,
                    consumed_frames=len(chunk.frames),
                )
            )
        return outputs
