"""Builds a running pipeline from a resolved `StageGraph`: one engine per stage, in
topological order, each from the builder its arch's registry entry names.

Nothing here knows a stage name or a model family: the graph says which stages exist and how
they connect, the registry says what builds each. `pipeline.runtime: ray` builds each stage
in its own Ray actor instead (`deploy/stage_pipeline.py`), with the same `build_stage`;
`pipeline.runtime: process` builds the whole pipeline in a process of its own.
"""

from __future__ import annotations

import logging
import time

import torch

from omniflow.build.context import BuildContext
from omniflow.build.registry import builder
from omniflow.config.graph import ResolvedStage, StageGraph
from omniflow.engine.orchestrator import Orchestrator
from omniflow.engine.parts import StageParts
from omniflow.engine.process_pipeline import ProcessPipeline
from omniflow.engine.stage_engine import StageEngine
from omniflow.platforms.base import prepare_device

log = logging.getLogger(__name__)


def build_pipeline(
    graph: StageGraph, prebuilt: object | None = None
) -> Orchestrator | ProcessPipeline:
    """Every stage of `graph`, wired through an orchestrator (not started); under
    `pipeline.runtime: process` built in a process of its own, this process holding its
    stand-in (`engine/process_pipeline.py`).

    `prebuilt` hands the family builders an already built model (tests share weights between
    pipelines); by default each family builds from the graph's model config."""
    if graph.runtime == "process":
        if prebuilt is not None:
            raise ValueError("pipeline.runtime=process builds in the engine's process: no prebuilt")
        return ProcessPipeline(graph)
    if graph.runtime == "ray":  # each stage in a Ray actor (docs/deploy.md, Stages on Ray)
        from omniflow.deploy.preflight import require_ray_runtime

        require_ray_runtime()
        if prebuilt is not None:
            raise ValueError("pipeline.runtime=ray builds each stage in its actor: no prebuilt")
        from omniflow.deploy.stage_pipeline import build_ray_pipeline

        return build_ray_pipeline(graph)
    ctx = build_context(graph, prebuilt)
    engines: dict[str, StageEngine] = {}
    parts: dict[str, StageParts] = {}
    for name, stage in graph.stages.items():  # topological order
        parts[name], engines[name] = build_stage(stage, ctx)
    return Orchestrator(graph, engines, parts)


def build_context(graph: StageGraph, prebuilt: object | None = None) -> BuildContext:
    """The device prepared and the context the stage builders share."""
    device = torch.device(graph.platform.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("platform=cuda but no CUDA device is visible; use platform=cpu")
    prepare_device(device.type, graph.platform.cudnn_benchmark)
    dtype: torch.dtype = getattr(torch, graph.platform.dtype)  # a validated torch dtype name
    return BuildContext(graph, device, dtype, prebuilt=prebuilt)


def build_stage(stage: ResolvedStage, ctx: BuildContext) -> tuple[StageParts, StageEngine]:
    """One stage's parts and its engine (not started): in this process, or in its actor."""
    start = time.perf_counter()
    built = builder(stage.arch)(stage, ctx)
    # A GPU build takes about a minute (weights, graph captures, kernel compiles); the
    # capture logs and this line say where it went.
    log.info("stage %s built in %.1f s", stage.name, time.perf_counter() - start)
    engine = StageEngine(
        stage.name,
        built.scheduler,
        built.runner,
        async_scheduling=stage.scheduler.async_scheduling,
        intake=built.intake,
    )
    return built, engine
