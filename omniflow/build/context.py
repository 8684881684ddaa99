"""What a stage builder receives and returns (`build/registry.py` names one builder per arch).

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

from omniflow.config.graph import ResolvedStage, StageGraph
from omniflow.engine.parts import StageParts


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


class StageBuilder(Protocol):
    def __call__(self, stage: ResolvedStage, ctx: BuildContext) -> StageParts: ...
