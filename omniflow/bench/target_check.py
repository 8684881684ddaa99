"""What a bench job's target refuses, checked before anything heavy is imported or built
(the CLI and a sweep's validation call it first): under `deploy=ray`, what a Ray deployment
cannot do, and what `omniflow serve deploy=ray` refuses; phase timing out of reach."""

from __future__ import annotations

from omniflow.config.deploy_schema import DeployConfig
from omniflow.config.graph import StageGraph
from omniflow.config.resolve import build_graph
from omniflow.config.schema import OmniflowSpec
from omniflow.deploy.preflight import check_deploy  # finds Ray, imports none
from omniflow.errors import ConfigError


def bench_graph(spec: OmniflowSpec) -> StageGraph:
    """The graph a bench job measures: under `bench.phase_timing=device` the engine stays in
    the job's process (its steps are synchronised there) unless `pipeline.runtime` is set."""
    return build_graph(spec, engine_here=spec.bench.phase_timing == "device")


def check_target(spec: OmniflowSpec, graph: StageGraph) -> DeployConfig | None:
    """The resolved deploy settings under deploy=ray (None: in-process), after refusing what
    a Ray deployment cannot do (a ConfigError naming the key: one line, exit 2); a device
    phase timing where the engine runs in another process is refused too."""
    if spec.bench.phase_timing == "device" and graph.runtime != "in_process":
        raise ConfigError(
            "bench.phase_timing",
            f"device synchronises the device around every phase of a step, and under "
            f"pipeline.runtime={graph.runtime} the steps run in another process, out of the "
            "job's reach; leave bench.phase_timing at steps, or pipeline.runtime unset (null) "
            "or in_process",
        )
    if spec.deploy.name != "ray":
        return None
    if spec.bench.phase_timing == "device":
        raise ConfigError(
            "bench.phase_timing",
            "device synchronises the device around every phase of a step, and under "
            "deploy=ray the steps run in the replicas' processes, out of the job's reach; "
            "leave bench.phase_timing at steps (result.json's steps is then null) or bench "
            "the pipeline in-process (deploy=local)",
        )
    return check_deploy(spec, graph)
