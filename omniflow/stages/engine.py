"""The per-stage engine loop: schedule -> execute -> update (DESIGN §5).

`StageEngine` owns one scheduler and one runner. `step()` runs one round and returns the
outputs; tests and offline callers drive it directly. `start()` runs the loop on a thread
(the embedded, in-process runtime): submissions and aborts arrive through a thread-safe
queue, outputs leave through the `on_output` callback. A process-per-stage runtime would
implement the same `StageEngineHandle` interface.

Async scheduling: step n+1 is planned while step n executes on the runner's worker
thread; `update(n)` happens after `schedule(n+1)`. Sync: strictly in turn. Both give the
same tokens for a seeded request (the runner feeds the token it sampled itself).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from omniflow.core.output import StageOutput
from omniflow.core.request import Request
from omniflow.core.step import StepPlan, StepResult
from omniflow.sched.ar import ARScheduler
from omniflow.stages.runner import ARModelRunner

log = logging.getLogger(__name__)

OutputSink = Callable[[StageOutput], None]


class StageEngineHandle(Protocol):
    """What the orchestrator uses: submit, abort, start, stop."""

    def submit(self, request: Request) -> None: ...
    def abort(self, request_id: str) -> None: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...


@dataclass(frozen=True)
class _Submit:
    request: Request


@dataclass(frozen=True)
class _Abort:
    request_id: str


class StageEngine:
    """One AR stage: scheduler + runner, stepped inline or on a thread."""

    def __init__(
        self,
        name: str,
        scheduler: ARScheduler,
        runner: ARModelRunner,
        async_scheduling: bool = False,
        on_output: OutputSink | None = None,
    ) -> None:
        self.name = name
        self.scheduler = scheduler
        self.runner = runner
        self.async_scheduling = async_scheduling
        self.on_output = on_output
        self._inbox: queue.Queue[_Submit | _Abort | None] = queue.Queue()
        self._executor = ThreadPoolExecutor(1, thread_name_prefix=f"{name}-runner")
        self._inflight: tuple[StepPlan, Future[StepResult]] | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self.num_steps = 0

    # ------------------------------------------------------------------ inline API

    def add_request(self, request: Request) -> list[StageOutput]:
        """Admit now (engine thread or inline use); a refusal is one error output."""
        try:
            self.scheduler.add_request(request)
        except ValueError as exc:
            return [
                StageOutput(
                    request.request_id, finished=True, finish_reason="error", error=str(exc)
                )
            ]
        return []

    def abort_request(self, request_id: str) -> list[StageOutput]:
        if self.scheduler.finish(request_id, "abort"):
            return [StageOutput(request_id, finished=True, finish_reason="abort")]
        return []

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_unfinished or self._inflight is not None

    def step(self) -> list[StageOutput]:
        """One round: sync -> schedule, execute, update; async -> schedule n+1, update n."""
        self.num_steps += 1
        if not self.async_scheduling:
            plan = self.scheduler.schedule()
            if plan.is_empty and not plan.finished_ids:
                return []
            return self.scheduler.update(plan, self.runner.execute(plan))
        plan = self.scheduler.schedule()
        submitted: Future[StepResult] | None = None
        if not plan.is_empty or plan.finished_ids:
            submitted = self._executor.submit(self.runner.execute, plan)
        outputs: list[StageOutput] = []
        if self._inflight is not None:
            prev_plan, prev = self._inflight
            outputs = self.scheduler.update(prev_plan, prev.result())
        self._inflight = (plan, submitted) if submitted is not None else None
        return outputs

    def run_until_idle(self, max_steps: int = 1_000_000) -> list[StageOutput]:
        """Step until nothing is left (offline use and tests)."""
        outputs: list[StageOutput] = []
        for _ in range(max_steps):
            if not self.has_work:
                return outputs
            outputs.extend(self.step())
        raise RuntimeError(f"{self.name}: not idle after {max_steps} steps")

    # ------------------------------------------------------------------ threaded API

    def submit(self, request: Request) -> None:
        self._inbox.put(_Submit(request))

    def abort(self, request_id: str) -> None:
        self._inbox.put(_Abort(request_id))

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
        if self.on_output is None:
            return
        for out in outputs:
            self.on_output(out)

    def _drain(self, block: bool) -> None:
        try:
            item = self._inbox.get(block=block)
        except queue.Empty:
            return
        while True:
            if isinstance(item, _Submit):
                self._emit(self.add_request(item.request))
            elif isinstance(item, _Abort):
                self._emit(self.abort_request(item.request_id))
            try:
                item = self._inbox.get_nowait()
            except queue.Empty:
                return

    def _loop(self) -> None:
        try:
            while not self._stopping.is_set():
                self._drain(block=not self.has_work)
                if self._stopping.is_set():
                    break
                if self.has_work:
                    self._emit(self.step())
        except Exception as exc:  # noqa: BLE001 - the loop is dying: end every request once
            log.exception("stage %s: engine loop failed", self.name)
            self._fail_all(f"stage {self.name} failed: {exc}")

    def _fail_all(self, message: str) -> None:
        for rid in list(self.scheduler.requests):
            self.scheduler.finish(rid, "error", message)
            self._emit([StageOutput(rid, finished=True, finish_reason="error", error=message)])
