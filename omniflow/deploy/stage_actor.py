"""One stage of the pipeline in its own Ray actor (`pipeline.runtime: ray`): the stage's
scheduler, runner and chunk intake, built by `build.pipeline.build_stage` and run by the
same `StageEngine` thread as in-process. The driver's `RayStage` (deploy/remote_stage.py)
sends it the engine's typed messages in numbered batches and long-polls its outputs.

A threaded actor (a long poll must not block the sends) runs calls concurrently and in no
promised order, so each batch carries a number and is applied in that order (`Sequencer`).

Ray restarts a dead actor up to `STAGE_RESTARTS` times, running `__init__` again (a fresh
stage: the requests it held died with it). Batches carry the generation the driver gave at
`start`: a batch sent to the actor before it died can reach the new one, and is dropped. Ray
also reports an actor that did not die as unavailable (a lost call), which the driver takes
for a death: a `start` with a new generation then aborts what the actor held and starts its
numbering afresh, as a restarted actor would."""

from __future__ import annotations

import threading
from typing import Any

import ray
import torch

from omniflow.build.pipeline import build_context, build_stage
from omniflow.config.graph import StageGraph
from omniflow.core.output import StageOutput
from omniflow.core.speech import SpeechRequest
from omniflow.core.voice import EncodedVoice
from omniflow.deploy.stage_wire import (
    Batch,
    Deferred,
    FrontendFacts,
    NotStarted,
    Prepared,
    StageFacts,
)
from omniflow.engine.messages import Abort, Add, EngineMessage
from omniflow.logs import setup_logging

CALLS_AT_ONCE = 8
"""The actor's threads: one long poll, the sends, the front end's `prepare` calls."""

STAGE_RESTARTS = 3
"""How often Ray restarts a stage's actor that died; past that the stage stays down (a stage
that dies at every build or every request would otherwise be rebuilt forever)."""


class Outbox:
    """The engine's outputs and step durations until the driver's next `take`, and which
    requests are open (admitted, not finished) in this generation."""

    def __init__(self) -> None:
        self.ready = threading.Condition()
        self.outputs: list[StageOutput] = []
        self.steps: list[float] = []
        self.closed = False
        self.open: set[str] = set()
        self.dropped: set[str] = set()
        """Requests of an earlier generation, aborted: their outputs are not the driver's."""

    def admitted(self, request_id: str) -> None:
        with self.ready:
            self.open.add(request_id)

    def output(self, out: StageOutput) -> None:
        with self.ready:
            if out.request_id in self.dropped:
                if out.finished:
                    self.dropped.discard(out.request_id)
                return
            if out.finished:
                self.open.discard(out.request_id)
            self.outputs.append(out)
            self.ready.notify_all()

    def reset(self) -> set[str]:
        """A new generation: what is waiting goes, and the open requests' outputs are
        dropped from now on; returns those requests (to abort)."""
        with self.ready:
            ended, self.open = self.open, set()
            self.dropped |= ended
            self.outputs, self.steps = [], []
            return ended

    def step(self, seconds: float) -> None:
        with self.ready:
            self.steps.append(seconds)

    def take(self, timeout_s: float) -> tuple[list[StageOutput], list[float]]:
        """What is here, waiting up to `timeout_s` for the first output."""
        with self.ready:
            self.ready.wait_for(lambda: self.outputs or self.closed, timeout_s)
            outputs, steps = self.outputs, self.steps
            self.outputs, self.steps = [], []
            return outputs, steps

    def close(self) -> None:
        with self.ready:
            self.closed = True
            self.ready.notify_all()


class Sequencer:
    """Batches applied in the order they were numbered by their one sender."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.next = 0
        self.early: dict[int, tuple[EngineMessage, ...]] = {}

    def apply(self, seq: int, messages: tuple[EngineMessage, ...], apply: Any) -> None:
        """Apply this batch and those it unblocks, in order, under the lock. A batch counts
        as applied before its messages are, so one that raises cannot hold back the rest."""
        with self.lock:
            self.early[seq] = messages
            while self.next in self.early:
                batch = self.early.pop(self.next)
                self.next += 1
                for message in batch:
                    apply(message)


class StageActor:
    """A stage and its engine in this actor; the driver's calls below."""

    def __init__(self, graph: StageGraph, name: str, log_level: str) -> None:
        setup_logging(log_level)
        self.name = name
        self.parts, self.engine = build_stage(graph.stages[name], build_context(graph))
        self.outbox = Outbox()
        self.engine.on_output = self.outbox.output
        self.engine.step_observer = self.outbox.step
        self.sequencer = Sequencer()
        self.generation: int | None = None
        """The driver's count of this stage's starts (`start`); None until started."""
        self.generation_lock = threading.Lock()
        """Held by `start` and around each batch's check and application."""
        self.prepared: dict[str, Any] = {}
        """Source stage: requests made by `prepare`, until their `Add`."""
        self.prepared_lock = threading.Lock()

    def facts(self) -> StageFacts:
        f = self.parts.frontend
        frontend = (
            None
            if f is None
            else FrontendFacts(f.voices, f.languages, f.max_new_tokens, f.supports_instructions)
        )
        clones = self.parts.reference is not None
        return StageFacts(self.name, frontend, clones, self.parts.max_chunk_frames)

    def start(self, generation: int) -> None:
        """Run the engine; batches of another `generation` are stale from now on. The driver
        sends it again when a call may not have arrived (the same generation: nothing
        changes). A new generation on a running actor (it did not die, the driver took it
        for dead and ended its requests): those requests are aborted, the prepared ones
        dropped, and batches numbered from 0 again."""
        with self.generation_lock:
            if self.generation is None:
                self.engine.start()
            elif generation != self.generation:
                self.sequencer = Sequencer()
                with self.prepared_lock:
                    self.prepared.clear()
                for rid in self.outbox.reset():
                    self.engine.send(Abort(rid))
            self.generation = generation

    def stop(self) -> None:
        self.engine.stop()
        self.outbox.close()

    def prepare(self, speech: SpeechRequest) -> None:
        """Make the source stage's request now: ValueError (invalid input) goes back to the
        driver's `submit` before anything is queued, as in-process."""
        if self.generation is None:  # restarted by Ray, not yet started by the driver
            raise NotStarted(f"stage {self.name} is restarting")
        request = self.parts.make_request(speech)
        with self.prepared_lock:
            self.prepared[speech.request_id] = request

    def send(self, generation: int, seq: int, messages: tuple[EngineMessage, ...]) -> None:
        """Apply batch `seq` in order; one sent to this stage before a restart is dropped."""
        with self.generation_lock:
            if generation == self.generation:
                self.sequencer.apply(seq, messages, self._apply)

    def _apply(self, message: EngineMessage) -> None:
        """A request this stage cannot make ends with one error; the others go on."""
        try:
            local = self._local(message)
        except (KeyError, ValueError) as exc:
            assert isinstance(message, Add)  # only an Add makes a request
            rid = message.request.request_id
            error = f"stage {self.name} could not take request {rid}: {exc!r}"
            self.outbox.output(StageOutput(rid, finished=True, finish_reason="error", error=error))
            return
        if isinstance(local, Add):
            self.outbox.admitted(local.request.request_id)
        self.engine.send(local)

    def _local(self, message: EngineMessage) -> EngineMessage:
        """An `Add` with its stage request made here; an `Abort` drops a prepared one."""
        match message:
            case Add(request=Prepared(request_id=rid), initial_chunk_frames=first):
                with self.prepared_lock:
                    return Add(self.prepared.pop(rid), first)
            case Add(request=Deferred(speech=speech), initial_chunk_frames=first):
                return Add(self.parts.make_request(speech), first)
            case Abort(request_id=rid):
                with self.prepared_lock:
                    self.prepared.pop(rid, None)
        return message

    def take(self, timeout_s: float) -> Batch:
        """The outputs since the last call (waiting up to `timeout_s` for one) and the gauges."""
        outputs, steps = self.outbox.take(timeout_s)
        wait = self.engine.scheduler.first_audio_wait_s()
        return Batch(tuple(outputs), tuple(steps), self.engine.stats(), wait)

    def encode_reference(self, audio: torch.Tensor) -> EncodedVoice:
        """Voice clone: the source stage's reference encoders, for the driver's front end."""
        reference = self.parts.reference
        assert reference is not None, f"stage {self.name} has no reference encoders"
        return reference.encode(audio)


def stage_actor(graph: StageGraph, name: str, log_level: str, options: dict[str, Any]) -> Any:
    """A new actor building stage `name` of `graph` with Ray actor `options` (resources)."""
    remote = ray.remote(StageActor).options(
        max_concurrency=CALLS_AT_ONCE, max_restarts=STAGE_RESTARTS, **options
    )
    return remote.remote(graph, name, log_level)
