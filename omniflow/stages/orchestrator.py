"""Routes speech requests through the stage graph and streams PCM out in order.

The orchestrator is the one public interface of a running pipeline (serve, synth and the
offline bench use only this). Per request it guarantees:
- PCM events arrive in order (they come from the final stage's single engine thread);
- exactly one terminal event (finished, error or abort), after which nothing else arrives;
- an error or abort in any stage ends the request in every stage, releasing KV blocks and
  decoder slots.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from omniflow.core.output import StageOutput
from omniflow.core.pipeline import PipelineInfo, PipelineStats, PipelineUnavailable
from omniflow.core.request import FinishReason
from omniflow.core.speech import SpeechRequest
from omniflow.graph import StageGraph
from omniflow.models.qwen3_tts.processor import TalkerProcessor
from omniflow.sched.generation import GenerationScheduler, GenRequest
from omniflow.stages.connector import ChunkConnector
from omniflow.stages.engine import StageEngine

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class AudioEvent:
    """PCM for one request (float32 in [-1, 1], 24 kHz mono), or its end."""

    request_id: str
    pcm: np.ndarray | None = None
    frames: int = 0
    """Codec frames generated so far by the talker (for progress)."""
    finished: bool = False
    finish_reason: FinishReason | None = None
    error: str | None = None


Sink = Callable[[AudioEvent], None]


@dataclass
class _Live:
    sink: Sink
    frames: int = 0
    talker_reason: FinishReason | None = None


class Orchestrator:
    """Runs a validated pipeline: a talker stage, optionally followed by code2wav."""

    def __init__(
        self,
        graph: StageGraph,
        talker: StageEngine,
        processor: TalkerProcessor,
        code2wav: StageEngine | None = None,
        connector: ChunkConnector | None = None,
    ) -> None:
        self.graph = graph
        self.talker = talker
        self.processor = processor
        self.code2wav = code2wav
        self.connector = connector
        self.sample_rate = graph.model.codec.sample_rate
        self._live: dict[str, _Live] = {}
        self._lock = threading.Lock()
        talker.on_output = self._on_talker
        if code2wav is not None:
            code2wav.on_output = self._on_code2wav

    @property
    def engines(self) -> list[StageEngine]:
        return [e for e in (self.talker, self.code2wav) if e is not None]

    # ------------------------------------------------------------------ public surface

    def info(self) -> PipelineInfo:
        """Static facts of this pipeline (all that serve and bench need to know of it)."""
        vocab = self.processor.vocab
        return PipelineInfo(
            model=self.graph.model.name,
            pipeline=self.graph.pipeline,
            voices=tuple(sorted(vocab.speakers)),
            languages=("auto", *sorted(vocab.languages)),
            sample_rate=self.sample_rate,
            max_new_tokens=self.processor.max_model_len,
            supports_instructions=self.graph.model.supports_instructions,
            stages=tuple(self.graph.stages),
        )

    def stats(self) -> PipelineStats:
        """Live gauges per stage, and the requests in flight."""
        return PipelineStats(in_flight=self.num_live, stages=tuple(e.stats() for e in self.engines))

    def set_step_observer(self, observer: Callable[[str, float], None]) -> None:
        """Call `observer(stage name, seconds)` after each productive engine step."""
        for engine in self.engines:
            name = engine.name
            engine.step_observer = lambda seconds, name=name: observer(name, seconds)

    def start(self) -> None:
        for e in self.engines:
            e.start()

    def stop(self) -> None:
        for e in self.engines:
            e.stop()

    # ------------------------------------------------------------------ requests

    def submit(self, speech: SpeechRequest, sink: Sink) -> None:
        """Start a request. Invalid input raises ValueError before anything is queued."""
        dead = [e.name for e in self.engines if not e.alive]
        if dead:
            raise PipelineUnavailable(f"stage {dead[0]!r} has stopped; the pipeline is down")
        request = self.processor.make_request(speech)
        with self._lock:
            if speech.request_id in self._live:
                raise ValueError(f"request id {speech.request_id!r} is already running")
            self._live[speech.request_id] = _Live(sink)
        if self.code2wav is not None and self.connector is not None:
            rid = speech.request_id
            self.connector.open(rid, speech.initial_chunk_frames)
            gen = GenRequest(rid)
            self.code2wav.submit(gen)
        self.talker.submit(request)

    def abort(self, request_id: str) -> None:
        """Client went away: end the request everywhere; its sink gets one 'abort' event."""
        self._end(request_id, AudioEvent(request_id, finished=True, finish_reason="abort"))

    @property
    def num_live(self) -> int:
        with self._lock:
            return len(self._live)

    # ------------------------------------------------------------------ stage outputs

    def _end(self, request_id: str, event: AudioEvent, origin: StageEngine | None = None) -> None:
        with self._lock:
            live = self._live.pop(request_id, None)
        if live is None:
            return
        for engine in self.engines:
            if engine is not origin:
                engine.abort(request_id)
        if self.connector is not None:
            self.connector.close(request_id)
        live.sink(event)

    def _deliver(
        self,
        request_id: str,
        pcm: np.ndarray | None,
        frames_added: int,
        talker_reason: FinishReason | None = None,
    ) -> None:
        with self._lock:
            live = self._live.get(request_id)
            if live is None:
                return
            live.frames += frames_added
            live.talker_reason = talker_reason or live.talker_reason
            frames = live.frames
        if pcm is not None and pcm.size:
            live.sink(AudioEvent(request_id, pcm=pcm, frames=frames))

    def _finish_ok(self, request_id: str, reason: FinishReason | None) -> None:
        with self._lock:
            live = self._live.pop(request_id, None)
        if live is not None:
            live.sink(
                AudioEvent(
                    request_id,
                    frames=live.frames,
                    finished=True,
                    finish_reason=live.talker_reason or reason,
                )
            )

    def _on_talker(self, out: StageOutput) -> None:
        rid = out.request_id
        if out.error is not None or out.finish_reason == "abort":
            if out.error is not None:
                self._end(
                    rid,
                    AudioEvent(rid, finished=True, finish_reason="error", error=out.error),
                    origin=self.talker,
                )
            return
        audio_frames = [f for f in out.frames if f is not None]
        if self.code2wav is None or self.connector is None:
            self._deliver(rid, out.audio, len(audio_frames))
            if out.finished:
                self._finish_ok(rid, out.finish_reason)
            return
        self._deliver(rid, None, len(audio_frames), out.finish_reason)
        chunks = self.connector.push(rid, audio_frames, out.finished)
        if not chunks:
            return
        scheduler = self.code2wav.scheduler
        assert isinstance(scheduler, GenerationScheduler)

        def hand_over() -> list[StageOutput]:
            for c in chunks:
                scheduler.receive(rid, c.frames, c.last)
            return []

        self.code2wav.call(hand_over)

    def _on_code2wav(self, out: StageOutput) -> None:
        rid = out.request_id
        if out.error is not None:
            self._end(
                rid,
                AudioEvent(rid, finished=True, finish_reason="error", error=out.error),
                origin=self.code2wav,
            )
            return
        if out.finish_reason == "abort":
            return
        self._deliver(rid, out.audio, 0)
        if out.finished:
            self._finish_ok(rid, "stop")
