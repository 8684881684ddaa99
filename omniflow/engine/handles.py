"""What the orchestrator uses of a stage: its engine (`StageHandle`) and its built parts
(`StageFront`). An in-process `StageEngine` and its `StageParts` meet them, and so does a
stage in a Ray actor (`deploy/remote_stage.py`: `RayStage`, `RemoteParts`), so the
orchestrator and its router run either unchanged."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

from omniflow.core.output import StageOutput
from omniflow.core.pipeline import PhaseTimer, StageStats
from omniflow.core.speech import SpeechRequest
from omniflow.core.voice import ReferenceEncoder
from omniflow.engine.messages import EngineMessage
from omniflow.engine.parts import SpeechFrontend


class AdmissionEstimate(Protocol):
    """The part of a stage's scheduler the orchestrator's admission reads."""

    def first_audio_wait_s(self) -> float | None: ...


class StageHandle(Protocol):
    """A stage's engine as the orchestrator drives it: typed messages in, outputs out."""

    name: str
    on_output: Callable[[StageOutput], None] | None
    step_observer: Callable[[float], None] | None

    @property
    def scheduler(self) -> AdmissionEstimate: ...
    @property
    def alive(self) -> bool: ...
    def send(self, message: EngineMessage) -> None: ...
    def start(self) -> None: ...
    def stop(self) -> None: ...
    def stats(self) -> StageStats: ...
    def set_timer(self, timer: PhaseTimer) -> None: ...


class StageFront(Protocol):
    """A built stage's request factory and what the orchestrator offers of it."""

    @property
    def make_request(self) -> Callable[[SpeechRequest], Any]: ...
    @property
    def frontend(self) -> SpeechFrontend | None: ...
    @property
    def reference(self) -> ReferenceEncoder | None: ...
    @property
    def max_chunk_frames(self) -> int | None: ...
