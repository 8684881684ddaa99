"""What `omniflow serve deploy=ray` checks before anything is built: Ray is installed (found,
not imported: one line and exit 2 without it), the settings fit the platform, and a local
cluster has the CPUs and GPUs the replicas hold."""

from __future__ import annotations

import importlib.util
import os

from omniflow.config.deploy_schema import DeployConfig
from omniflow.config.graph import StageGraph
from omniflow.config.schema import OmniflowSpec
from omniflow.deploy.settings import KEY, resolve_deploy
from omniflow.errors import ConfigError

INSTALL = 'pip install "omniflow[ray]"'


def check_deploy(spec: OmniflowSpec, graph: StageGraph) -> DeployConfig:
    """The resolved deploy settings, or a `ConfigError` (printed as one line, exit 2)."""
    require_ray()
    deploy = resolve_deploy(spec.deploy, graph)
    check_ingress(deploy)
    if deploy.address is None:
        check_local_fit(deploy)
    return deploy


HA_PROXY = "RAY_SERVE_ENABLE_HA_PROXY"
"""Ray Serve's HAProxy ingress, set in the environment before launch (docs/deploy.md)."""


def check_ingress(deploy: DeployConfig) -> None:
    """With HAProxy as Ray Serve's ingress, Ray refuses a custom request router on the
    ingress deployment, and says so only as a traceback once the deployment starts: refuse
    `least_loaded` beside it here, naming the key."""
    if os.environ.get(HA_PROXY) == "1" and deploy.router != "default":
        raise ConfigError(
            "deploy.router",
            f"{HA_PROXY}=1 is set and Ray Serve takes no custom request router beside its "
            f"HAProxy ingress (HAProxy balances by fewest connections): set "
            f"deploy.router=default, or unset {HA_PROXY} to keep {deploy.router}",
        )


def require_ray() -> None:
    """Ray and Ray Serve are importable (without importing them)."""
    for module in ("ray", "aiohttp"):  # ray[serve]'s proxy needs aiohttp; bare ray lacks it
        if importlib.util.find_spec(module) is None:
            raise ConfigError(
                "deploy",
                f"deploy=ray needs Ray Serve, which is not installed ({module} not found): "
                f"{INSTALL}, or serve without deploy=ray",
            )


def require_ray_runtime() -> None:
    """`pipeline.runtime=ray` needs Ray (not Serve): one line, before anything is built."""
    if importlib.util.find_spec("ray") is None:
        raise ConfigError(
            "pipeline.runtime",
            f"pipeline.runtime=ray needs Ray, which is not installed (ray not found): {INSTALL}, "
            "or use pipeline.runtime=in_process",
        )


def check_local_fit(deploy: DeployConfig) -> None:
    """A local cluster gets this machine's CPUs and GPUs: replicas that ask for more would
    wait for resources that never come, so they are refused here."""
    resources = deploy.resources_per_replica or {}
    have = {"CPU": float(os.cpu_count() or 1), "GPU": float(_gpu_count())}
    for name, total in have.items():
        need = resources.get(name, 0.0) * deploy.replicas
        if need > total:
            raise ConfigError(
                "deploy.replicas",
                f"{deploy.replicas} replicas x {name}: {resources[name]:g} = {need:g} {name}s, "
                f"and this machine has {total:g} (a local cluster: deploy.address=null); "
                f"lower deploy.replicas or {KEY}, or join a cluster with deploy.address",
            )


def _gpu_count() -> int:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    try:
        import torch

        return torch.cuda.device_count()
    except ImportError:
        return 0
