"""The resolved stage graph: what will run, after every build-time rule has been applied.

`build_graph` (config/resolve.py) produces it; the runner, the CLI's `config` command and the
server read it. Everything here is immutable and already checked.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import Field

from omniflow.config.schema import (
    ARStageConfig,
    GenerationStageConfig,
    SchedulerConfig,
    StageConfig,
    StepLimits,
    UpstreamConfig,
)
from omniflow.core.capabilities import Payload
from omniflow.core.frozen import Frozen
from omniflow.models.shapes import ModelConfig


def receives_chunks(stage: StageConfig) -> bool:
    """The one predicate for "this stage receives chunks from an upstream stage".

    Chunk intake and the scheduler's atomic-chunk rule both use the resolved
    `atomic_chunks` field, which is set from this predicate alone.
    """
    return stage.upstream is not None


class ResolvedStage(Frozen):
    """One stage with every derived field filled in."""

    name: str = Field(description="Stage name.")
    kind: Literal["ar", "generation"] = Field(description="Stage kind.")
    arch: str = Field(description="Registry name of the component.")
    window_k: int = Field(description="Multi-step window (0 off).")
    prompt_graph_tokens: int = Field(
        description="Largest prompt-graph bucket (tokens per replay; larger whole-prompt steps "
        "replay it over groups of requests; 0: eager; AR only)."
    )
    audio_chunk_frames: int = Field(
        description="Frames per decoder pass inside a window (0: one pass at the window's end)."
    )
    audio_pass_steps: int = Field(
        0, description="Single steps whose frames a stream may hold for one pass (0: none)."
    )
    playback_margin_ms: int | None = Field(
        None,
        description="The playback clock's margin: it sizes windows, seats arrivals alone and "
        "informs admission (None: no clock; windows run window_k steps).",
    )
    stream_decode: bool = Field(description="Owns the streaming decoder and emits PCM.")
    ref_context_frames: int | None = Field(
        description="Decoder priming frames after resolution (None: stage decodes no audio)."
    )
    receives_chunks: bool = Field(description="Receives chunks from an upstream stage.")
    atomic_chunks: bool = Field(description="Received chunks are scheduled whole or not at all.")
    output: Payload = Field(description="What the stage emits.")
    upstream: UpstreamConfig | None = Field(description="The incoming edge, if any.")
    downstream: str | None = Field(description="The stage this one feeds, if any.")
    is_final: bool = Field(description="Whether this stage's output is the request's output.")
    scheduler: SchedulerConfig | StepLimits = Field(
        description="Scheduler limits (AR stages: with the KV cache)."
    )


class ResolvedPlatform(Frozen):
    """The concrete platform (auto resolved)."""

    name: Literal["cpu", "cuda", "npu"] = Field(description="Platform.")
    device: str = Field(description="torch device string.")
    dtype: Literal["float32", "bfloat16", "float16"] = Field(description="Compute dtype.")
    codec_dtype: Literal["float32", "bfloat16", "float16"] = Field(
        description="The streaming codec decoder's dtype (`model.codec_dtype`, else the "
        "platform's)."
    )
    cuda_graphs: bool = Field(description="CUDA graphs in use.")
    cudnn_benchmark: bool = Field(description="CUDA: cuDNN picks convolution algorithms by timing.")
    gpu_memory_utilization: float | None = Field(
        description="Fraction of GPU memory the KV pools are sized from (None: num_kv_blocks)."
    )


@dataclass(frozen=True)
class StageGraph:
    """Stages in topological order (sources first), the final stage, platform and model."""

    pipeline: str
    runtime: str
    stages: dict[str, ResolvedStage]
    final_stage: str
    platform: ResolvedPlatform
    model: ModelConfig

    def edges(self) -> list[tuple[str, str]]:
        """(upstream, downstream) pairs."""
        return [(s.upstream.stage, s.name) for s in self.stages.values() if s.upstream]

    def to_dict(self) -> dict[str, Any]:
        """Plain data for printing (`omniflow config`)."""
        return {
            "pipeline": self.pipeline,
            "runtime": self.runtime,
            "final_stage": self.final_stage,
            "stages": {n: _printed(s) for n, s in self.stages.items()},
            "platform": self.platform.model_dump(mode="json"),
            "model": self.model.model_dump(mode="json"),
        }


def _printed(stage: ResolvedStage) -> dict[str, Any]:
    """A stage as `omniflow config` prints it: every key settable as printed, so an AR
    stage's own keys (which a generation stage's schema does not have) are left out of a
    generation stage's."""
    data = stage.model_dump(mode="json")
    if stage.kind != "ar":
        for key in AR_ONLY:
            data.pop(key, None)
    return data


AR_ONLY = tuple(set(ARStageConfig.model_fields) - set(GenerationStageConfig.model_fields))
"""Keys of an AR stage's schema that a generation stage's lacks (e.g. `audio_chunk_frames`)."""
