"""The deploy settings resolved against the platform (no Ray needed): what `omniflow config
deploy=ray` prints and what `omniflow serve deploy=ray` deploys."""

from __future__ import annotations

from typing import Any

from omniflow.config.deploy_schema import DeployConfig
from omniflow.config.graph import StageGraph
from omniflow.errors import ConfigError

KEY = "deploy.resources_per_replica"


def resolve_deploy(deploy: DeployConfig, graph: StageGraph) -> DeployConfig:
    """`pipeline.runtime=ray` or `process` is refused (stage actors or an engine process
    inside a replica are not built).
    `resources_per_replica` unset: one CPU on the cpu platform, one GPU elsewhere; a GPU
    asked for on the cpu platform, or none on an accelerator, is refused (the replica would
    wait for a GPU forever, or would see none: Ray hides the GPUs an actor does not hold)."""
    if deploy.name != "ray":
        return deploy
    if graph.runtime == "ray":
        raise ConfigError(
            "pipeline.runtime",
            "ray (each stage in its own actor) inside deploy=ray replicas is not built: a "
            "replica holds the whole pipeline on its own device; use deploy=ray with "
            "pipeline.runtime=in_process, or pipeline.runtime=ray with deploy=local",
        )
    if graph.runtime == "process":
        raise ConfigError(
            "pipeline.runtime",
            "process (the engine in a process of its own) inside deploy=ray replicas is not "
            "built: each replica is a Ray actor, a process of its own already; use deploy=ray "
            "with pipeline.runtime=in_process",
        )
    platform = graph.platform.name
    resources = deploy.resources_per_replica
    if resources is None:
        resources = {"CPU": 1.0} if platform == "cpu" else {"GPU": 1.0}
    gpus = resources.get("GPU", 0.0)
    if platform == "cpu" and gpus:
        raise ConfigError(KEY, f"GPU: {gpus:g} on platform=cpu, which uses none; use {{CPU: 1}}")
    if platform == "cuda" and not gpus:
        raise ConfigError(
            KEY,
            "platform=cuda needs a GPU per replica (e.g. {GPU: 1}, or {GPU: 0.5} for two "
            "replicas on one card): Ray shows an actor only the GPUs it holds",
        )
    return deploy.model_copy(update={"resources_per_replica": resources})


def printed(deploy: DeployConfig) -> dict[str, Any]:
    """The deploy section of `omniflow config` (printed for deploy=ray only)."""
    return {"deploy": deploy.model_dump(mode="json")}
