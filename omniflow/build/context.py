"""What a stage builder receives and returns (the registry names one builder per arch).

`build/pipeline.py` walks the graph's stages in topological order and, for each, calls the
builder its arch's registry entry names. A builder turns one resolved stage into its
scheduler, runner and request factory; it may share heavy objects (weights, tokenizer)
with the other stages of its family through `BuildContext.shared`. Nothing here knows a
model family or a stage name.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from omniflow.build.registry import ARCHS, import_target
from omniflow.config.graph import ResolvedStage, StageGraph
from omniflow.core.speech import SpeechRequest
from omniflow.engine.connector import ChunkIntake
from omniflow.engine.stage_engine import Runner, Scheduler


class EncodedVoice(Protocol):
    """An encoded voice-clone reference: what a `SpeechRequest` carries for a Base model."""

    @property
    def ref_codes(self) -> tuple[tuple[int, ...], ...]: ...

    @property
    def speaker_embedding(self) -> tuple[float, ...]: ...


class ReferenceEncoder(Protocol):
    """A Base model's reference encoders (codec encoder + speaker encoder)."""

    def encode(self, audio: torch.Tensor) -> EncodedVoice:
        """Mono float32 samples at the codec's sample rate -> codes and embedding."""
        ...


class SpeechFrontend(Protocol):
    """The source stage's view of a speech request: what it accepts and how it becomes the
    stage's engine request. Raises ValueError on input it cannot serve."""

    voices: tuple[str, ...]
    languages: tuple[str, ...]
    max_new_tokens: int
    supports_instructions: bool

    def make_request(self, speech: SpeechRequest) -> Any: ...


@dataclass
class BuildContext:
    """Shared by the builders of one pipeline."""

    graph: StageGraph
    device: torch.device
    dtype: torch.dtype
    prebuilt: Any = None
    """A model object a family builder uses instead of building its own (tests share one
    set of weights between pipelines); None: build from the graph's model config."""
    shared: dict[str, Any] = field(default_factory=dict)

    def share(self, key: str, build: Callable[[], Any]) -> Any:
        """One object per key for the whole pipeline (weights built once for all stages)."""
        if key not in self.shared:
            self.shared[key] = build()
        return self.shared[key]


@dataclass(frozen=True)
class StageParts:
    """One built stage, before it is wrapped in an engine."""

    scheduler: Scheduler
    runner: Runner
    make_request: Callable[[SpeechRequest], Any]
    """The stage's engine request for an admitted speech request."""
    frontend: SpeechFrontend | None = None
    """Set by source stages (the ones taking the request's text)."""
    reference: ReferenceEncoder | None = None
    """Source stages of a Base model: the voice-clone reference encoders (front ends encode
    a reference recording with them before submitting; `Orchestrator.reference_encoder`)."""
    intake: ChunkIntake | None = None
    """Set by stages that receive chunks from an upstream stage."""
    max_chunk_frames: int | None = None
    """Receivers: the largest first chunk a request may ask for (the budget rule)."""


class StageBuilder(Protocol):
    def __call__(self, stage: ResolvedStage, ctx: BuildContext) -> StageParts: ...


def load_builder(arch: str) -> StageBuilder:
    """Import the builder the registry names for `arch` (on first use)."""
    builder: StageBuilder = import_target(ARCHS[arch].builder)  # type: ignore[assignment]
    return builder
