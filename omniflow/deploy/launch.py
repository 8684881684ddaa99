"""`omniflow serve deploy=ray`: start or join a Ray cluster, run N replicas of the pipeline
behind Ray Serve's HTTP proxy on server.host:server.port, and take them down on Ctrl-C or
SIGTERM.

Routing is `deploy.router`: least_loaded (deploy/router.py: the replicas' own gauges) or
Ray Serve's default (power of two choices); each replica accepts up to
`server.max_concurrent_requests` at once and applies its own admission (429) beyond that."""

from __future__ import annotations

import logging
import signal
import threading
from typing import Any

import ray
from ray import serve

from omniflow.config.deploy_schema import DeployConfig
from omniflow.config.schema import OmniflowSpec
from omniflow.deploy.board import new_board
from omniflow.deploy.replica import OmniflowReplica
from omniflow.deploy.router import router_config
from omniflow.deploy.voices import voice_store
from omniflow.serve.ready import READY, url_of

log = logging.getLogger("omniflow.deploy")
APP_NAME = "omniflow"


def actor_options(deploy: DeployConfig) -> dict[str, Any]:
    """`resources_per_replica` as Ray actor options (CPU, GPU and memory have their own
    keywords; any other name is a custom resource)."""
    resources = dict(deploy.resources_per_replica or {"CPU": 1.0})
    options: dict[str, Any] = {
        "num_cpus": resources.pop("CPU", 0.0),
        "num_gpus": resources.pop("GPU", 0.0),
    }
    if "memory" in resources:
        options["memory"] = resources.pop("memory")
    if resources:
        options["resources"] = resources
    return options


def application(spec: OmniflowSpec, deploy: DeployConfig) -> Any:
    """The Ray Serve application: `deploy.replicas` copies of `OmniflowReplica`, sharing
    one voice store and one board of reports."""
    return (
        serve.deployment(OmniflowReplica)
        .options(
            name="pipeline",
            num_replicas=deploy.replicas,
            ray_actor_options=actor_options(deploy),
            max_ongoing_requests=spec.server.max_concurrent_requests,
            request_router_config=router_config(deploy.router),
        )
        .bind(spec, voice_store(spec.server.max_voices), new_board())
    )


def start(spec: OmniflowSpec, deploy: DeployConfig) -> str:
    """Connect to (or start) the cluster, start Serve's proxy on server.host:server.port and
    run the replicas; returns once every replica is up. The URL served."""
    if not ray.is_initialized():
        ray.init(address=deploy.address, include_dashboard=False, log_to_driver=True)
    server = spec.server
    serve.start(
        http_options={
            "host": server.host,
            "port": server.port,
            "keep_alive_timeout_s": int(server.keep_alive_timeout_s),
        }
    )
    serve.run(application(spec, deploy), name=APP_NAME, route_prefix="/", blocking=False)
    return url_of(server.host, server.port)


def stop(deploy: DeployConfig) -> None:
    """Take the replicas down; a cluster this process started goes with them, a joined one
    keeps running (only this application is deleted)."""
    if deploy.address is None:
        serve.shutdown()
        ray.shutdown()
    else:
        serve.delete(APP_NAME)


def serve_on_ray(spec: OmniflowSpec, deploy: DeployConfig) -> int:
    """Serve until SIGINT or SIGTERM, then stop; exit status 0."""
    done = threading.Event()
    try:
        url = start(spec, deploy)
    except RuntimeError as exc:  # a replica failed to build: Serve's reason, then its logs
        log.error("the replicas did not start: %s", str(exc).splitlines()[0])
        stop(deploy)
        return 1
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    log.info("%d replica(s) on Ray Serve; %s on %s", deploy.replicas, READY, url)
    try:
        done.wait()
    finally:
        log.info("stopping the replicas")
        stop(deploy)
        log.info("omniflow stopped")
    return 0
