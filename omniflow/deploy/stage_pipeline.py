"""`pipeline.runtime: ray`: the two-stage pipeline with each stage in its own Ray actor, on
its own device (docs/deploy.md, Stages on Ray). The orchestrator, its router and the flow
control stay in the calling process; each stage's engine (scheduler, runner, and on a
receiver the chunk intake with its atomic chunks) runs in its actor, behind `RayStage`.

Frames go talker actor -> driver -> code2wav actor as ordinary Ray actor calls: a step's
frames are a few integers per request, inlined in the call (Ray passes small values without
the object store). Compiled graphs would pay where a static graph moves tensors every step;
here each message is small and the graph of messages is not static (arrivals, aborts,
pauses), so they are not used (not measured on a GPU)."""

from __future__ import annotations

import logging
from typing import Any

import ray

from omniflow.config.graph import StageGraph
from omniflow.deploy.remote_stage import RayStage, RemoteParts
from omniflow.deploy.stage_actor import stage_actor
from omniflow.deploy.stage_wire import Batch, StageFacts
from omniflow.engine.orchestrator import Orchestrator
from omniflow.errors import ConfigError

log = logging.getLogger("omniflow.deploy")


def stage_options(graph: StageGraph) -> dict[str, Any]:
    """What each stage's actor holds: one GPU on an accelerator (each stage on its own
    device), one CPU on the cpu platform."""
    if graph.platform.name == "cpu":
        return {"num_cpus": 1}
    return {"num_cpus": 1, "num_gpus": 1}


def check_cluster_fits(graph: StageGraph, options: dict[str, Any]) -> None:
    """Refuse what the cluster could never place (the actors would wait forever)."""
    have = ray.cluster_resources()
    for key, name in (("num_cpus", "CPU"), ("num_gpus", "GPU")):
        need = options.get(key, 0) * len(graph.stages)
        if need > have.get(name, 0.0):
            raise ConfigError(
                "pipeline.runtime",
                f"ray places each of the {len(graph.stages)} stages on its own {name} "
                f"({need:g} in all), and the Ray cluster has {have.get(name, 0.0):g}; use "
                "pipeline.runtime=in_process, or join a larger cluster (RAY_ADDRESS)",
            )


def build_ray_pipeline(graph: StageGraph) -> Orchestrator:
    """Every stage of `graph` built in its own actor (concurrently), wired through an
    orchestrator in this process (not started). Joins the Ray cluster `ray.init` finds
    (RAY_ADDRESS) or starts a local one."""
    if not ray.is_initialized():
        ray.init(include_dashboard=False, log_to_driver=True)
    options = stage_options(graph)
    check_cluster_fits(graph, options)
    level = logging.getLevelName(logging.getLogger("omniflow").getEffectiveLevel())
    actors = {name: stage_actor(graph, name, level, options) for name in graph.stages}
    try:
        facts: dict[str, StageFacts] = dict(
            zip(actors, ray.get([a.facts.remote() for a in actors.values()]), strict=True)
        )
        first: list[Batch] = ray.get([a.take.remote(0.0) for a in actors.values()])
    except ray.exceptions.RayError:
        for actor in actors.values():
            ray.kill(actor)
        raise
    engines = {
        name: RayStage(name, actors[name], batch.stats)
        for name, batch in zip(actors, first, strict=True)
    }
    parts = {name: RemoteParts.of(actors[name], facts[name]) for name in actors}
    log.info("stages %s built in Ray actors (%s each)", ", ".join(actors), options)
    return Orchestrator(graph, engines, parts)
