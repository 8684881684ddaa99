"""The driver's side of a stage in a Ray actor (`pipeline.runtime: ray`): `RayStage` stands
where an in-process `StageEngine` stands for the orchestrator and its router — typed engine
messages in through `send`, the stage's outputs out through `on_output` — so routing, the
chunk intake (in the receiving stage's actor) and backpressure are the in-process code.

Messages leave in numbered batches from one sender thread (one Ray call per batch, not per
message); outputs come back by a long poll from one poller thread, with the stage's gauges.
A stage whose actor dies ends each request it held with one error and answers admissions
with one error, as a dead in-process engine does, while Ray restarts the actor
(`stage_actor.STAGE_RESTARTS`); once the new actor has built its stage and started, the stage
serves again. Past the restarts it stays down."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import ray
import torch
from ray.exceptions import (
    ActorUnavailableError,
    GetTimeoutError,
    RayActorError,
    RayError,
    RayTaskError,
)

from omniflow.core.output import StageOutput
from omniflow.core.pipeline import NoTimer, PhaseTimer, PipelineUnavailable, StageStats
from omniflow.core.speech import SpeechRequest
from omniflow.core.voice import EncodedVoice
from omniflow.deploy import stage_wire as wire
from omniflow.engine.messages import Abort, Add, EngineMessage

log = logging.getLogger(__name__)

POLL_S = 0.5
"""Longest wait of one poll with nothing to return (the gauges are at most this old when
the stage is idle; a busy stage answers at each output)."""


class AdmissionGauge:
    """The source stage's first-audio estimate as its last poll carried it (what the
    orchestrator's admission reads of a stage's scheduler)."""

    def __init__(self) -> None:
        self.wait_s: float | None = None

    def first_audio_wait_s(self) -> float | None:
        return self.wait_s


class RayStage:
    """One stage in its Ray actor, seen from the driver: an orchestrator's engine."""

    def __init__(self, name: str, actor: Any, stats: StageStats) -> None:
        self.name = name
        self.actor = actor
        self.on_output: Callable[[StageOutput], None] | None = None
        self.step_observer: Callable[[float], None] | None = None
        self.scheduler = AdmissionGauge()
        self._stats = stats
        self._outbox: queue.SimpleQueue[tuple[int, EngineMessage] | None] = queue.SimpleQueue()
        """Messages with the generation they were queued in; None stops the sender."""
        self._generation = 0
        """The actor's starts so far, less one: a message or send of an earlier one is stale
        (queued before the actor died) and never reaches the new actor's stage."""
        self._lock = threading.Lock()
        self._open: set[str] = set()
        """Requests admitted here and not ended: each gets one error if the actor dies."""
        self._death: str | None = None
        self._sent: queue.SimpleQueue[tuple[int, Any]] = queue.SimpleQueue()
        """The sends' results (Ray object refs) by generation: the poller raises what one of
        the current generation raised."""
        self._stopping = threading.Event()
        self._sender = threading.Thread(target=self._send_loop, name=f"{name}-ray-send")
        self._poller = threading.Thread(target=self._poll_loop, name=f"{name}-ray-poll")

    @property
    def alive(self) -> bool:
        return self._death is None and self._stats.alive

    def stats(self) -> StageStats:
        return replace(self._stats, alive=self.alive)

    def set_timer(self, timer: PhaseTimer) -> None:
        """Step phases are timed in the stage's own thread, which is in another process."""
        if not isinstance(timer, NoTimer):
            raise NotImplementedError(
                f"stage {self.name} runs in a Ray actor (pipeline.runtime=ray): its step "
                "phases are not timed; use pipeline.runtime=in_process to time them"
            )

    def send(self, message: EngineMessage) -> None:
        """Queue `message` for the actor (any thread); a dead stage refuses an admission
        with one error at once."""
        with self._lock:
            if self._death is None:
                if isinstance(message, Add):
                    self._open.add(message.request.request_id)
                elif isinstance(message, Abort):
                    self._open.discard(message.request_id)
                self._outbox.put((self._generation, message))
                return
        if isinstance(message, Add) and self.on_output is not None:
            rid, error = message.request.request_id, self._death
            self.on_output(StageOutput(rid, finished=True, finish_reason="error", error=error))

    def start(self) -> None:
        ray.get(self.actor.start.remote(self._generation))
        self._sender.start()
        self._poller.start()

    def stop(self) -> None:
        self._stopping.set()
        self._outbox.put(None)
        self._sender.join(timeout=30)
        try:
            ray.get(self.actor.stop.remote(), timeout=30)
        except RayError:  # already dead: nothing to stop
            log.debug("stage %s: its actor was gone at stop", self.name)
        self._poller.join(timeout=30)
        ray.kill(self.actor)

    def _send_loop(self) -> None:
        """Everything queued goes in one numbered batch (numbered from 0 in each generation);
        messages of an earlier generation are dropped; None (stop) ends the loop."""
        seq, generation = 0, 0
        item = self._outbox.get()
        while item is not None:
            batch = [item]
            while not self._outbox.empty() and (item := self._outbox.get()) is not None:
                batch.append(item)
            current = self._generation
            if current != generation:
                seq, generation = 0, current
            messages = tuple(m for g, m in batch if g == current)
            if messages:
                ref = self.actor.send.remote(current, seq, messages)
                self._sent.put((current, ref))  # the poller checks it
                seq += 1
            if item is not None:
                item = self._outbox.get()

    def _poll_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                batch: wire.Batch = ray.get(self.actor.take.remote(POLL_S))
                self._check_sends()
            except RayError as exc:
                if self._stopping.is_set():
                    return
                if isinstance(exc, RayTaskError):  # the stage's state is unknown: it stays down
                    self._die(
                        f"stage {self.name} failed: its Ray actor could not apply a "
                        f"message ({exc.cause!r})"
                    )
                    return
                self._die(f"stage {self.name} failed: its Ray actor died ({type(exc).__name__})")
                if not self._restarted():
                    return
                continue
            self._stats = batch.stats
            self.scheduler.wait_s = batch.first_audio_wait_s
            if self.step_observer is not None:
                for seconds in batch.step_seconds:
                    self.step_observer(seconds)
            for out in batch.outputs:
                if out.finished:
                    with self._lock:
                        self._open.discard(out.request_id)
                if self.on_output is not None:
                    self.on_output(out)

    def _check_sends(self) -> None:
        """Raise what a finished send raised (RayTaskError): a message the actor could not
        apply leaves the stage's state unknown, so it is the stage's death."""
        pending = []
        while not self._sent.empty():
            generation, ref = self._sent.get()
            if generation == self._generation:  # an earlier actor's sends died with it
                pending.append(ref)
        done, rest = ray.wait(pending, num_returns=len(pending), timeout=0) if pending else ([], [])
        for ref in rest:
            self._sent.put((self._generation, ref))
        ray.get(done)

    def _restarted(self) -> bool:
        """Wait for Ray to restart the actor (it builds the stage again) and start it under
        the next generation; False once the actor is gone for good or the stage stops. A
        call that reaches the actor while it restarts fails as unavailable and is sent again
        (`start` is idempotent per generation)."""
        generation = self._generation + 1
        started = self.actor.start.remote(generation)
        while not self._stopping.is_set():
            try:
                ray.get(started, timeout=POLL_S)
            except GetTimeoutError:
                continue
            except ActorUnavailableError:
                self._stopping.wait(POLL_S)
                started = self.actor.start.remote(generation)
                continue
            except RayError as exc:
                log.error("stage %s: its Ray actor was not restarted (%s)", self.name, exc)
                return False
            with self._lock:
                self._generation, self._death = generation, None
            log.warning("stage %s: its Ray actor was restarted; serving again", self.name)
            return True
        return False

    def _die(self, reason: str) -> None:
        log.error("%s", reason)
        with self._lock:
            self._death = reason
            ended, self._open = self._open, set()
        for rid in ended:
            if self.on_output is not None:
                self.on_output(StageOutput(rid, finished=True, finish_reason="error", error=reason))


@dataclass(frozen=True)
class RemoteFrontend:
    """The source stage's `SpeechFrontend` on the driver: its facts, and `make_request`
    made and checked in the actor (one round trip; ValueError as in-process)."""

    actor: Any
    voices: tuple[str, ...]
    languages: tuple[str, ...]
    max_new_tokens: int
    supports_instructions: bool

    @classmethod
    def of(cls, actor: Any, facts: wire.FrontendFacts) -> RemoteFrontend:
        f = facts
        return cls(actor, f.voices, f.languages, f.max_new_tokens, f.supports_instructions)

    def make_request(self, speech: SpeechRequest) -> wire.Prepared:
        try:
            ray.get(self.actor.prepare.remote(speech))
        except RayTaskError as exc:  # the actor's ValueError, without Ray's traceback text
            if isinstance(exc.cause, ValueError):
                raise exc.cause from None
            if isinstance(exc.cause, wire.NotStarted):  # restarted, its death not yet seen here
                raise PipelineUnavailable(str(exc.cause)) from None
            raise
        except RayActorError as exc:  # it died since the liveness check: a 503, not a 500
            raise PipelineUnavailable(f"the source stage's Ray actor died ({exc})") from None
        return wire.Prepared(speech.request_id)


@dataclass(frozen=True)
class RemoteReference:
    """A Base model's reference encoders, in the source stage's actor (one round trip)."""

    actor: Any

    def encode(self, audio: torch.Tensor) -> EncodedVoice:
        try:
            return ray.get(self.actor.encode_reference.remote(audio))
        except RayActorError as exc:
            raise PipelineUnavailable(f"the source stage's Ray actor died ({exc})") from None


@dataclass(frozen=True)
class RemoteParts:
    """What the orchestrator reads of a built stage (`engine/parts.StageParts`'s fields it
    uses), for a stage in an actor."""

    make_request: Callable[[SpeechRequest], wire.Prepared | wire.Deferred]
    frontend: RemoteFrontend | None
    reference: RemoteReference | None
    max_chunk_frames: int | None

    @classmethod
    def of(cls, actor: Any, facts: wire.StageFacts) -> RemoteParts:
        if facts.frontend is None:
            return cls(wire.Deferred, None, None, facts.max_chunk_frames)
        frontend = RemoteFrontend.of(actor, facts.frontend)
        reference = RemoteReference(actor) if facts.clones else None
        return cls(frontend.make_request, frontend, reference, facts.max_chunk_frames)
