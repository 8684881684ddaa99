"""A bench job's target under `deploy=ray`: the Ray Serve deployment `omniflow serve
deploy=ray` runs (deploy/launch.py's `start`), on a free loopback port, read through its
merged `/metrics` (every replica's series, labelled; deploy/overview.py).

What cannot be had from there is null in the result, with the reason: the step kinds
(`steps`: the steps run in the replicas' processes, where no timer of the job's reaches).
The other server figures are the replicas' own counters, summed over the replicas and also
given per replica; a replica reports every second, so the job reads them once they have
settled (bench/target.py)."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager

import httpx
import ray
from ray import serve

from omniflow.bench.client import SAMPLE_RATE
from omniflow.bench.ray_kept import KEPT, Stop
from omniflow.bench.reuse import CACHE
from omniflow.bench.samples import Reading, reading_of_text
from omniflow.bench.target import Served
from omniflow.config.deploy_schema import DeployConfig
from omniflow.config.graph import StageGraph
from omniflow.config.schema import OmniflowSpec
from omniflow.deploy.board import REPORT_S
from omniflow.deploy.launch import start, stop

STEPS_NULL = (
    "step phases are timed in the serving process, and under deploy=ray the steps run in "
    "the replicas' processes"
)
METRICS_TIMEOUT_S = 30.0


@contextmanager
def on_ray(spec: OmniflowSpec, graph: StageGraph, deploy: DeployConfig) -> Iterator[Served]:
    """The deployment, running until the block ends; with `bench.reuse_pipeline` it is kept
    for the next job with the same settings (bench/ray_kept.py)."""
    CACHE.close()  # an in-process pipeline an earlier job kept: its device memory back
    key = repr((graph, deploy, spec.server))
    if spec.bench.reuse_pipeline:
        url, reused = KEPT.get(key, lambda: launch(spec, deploy))
        yield served(url, deploy, reused)
        return
    KEPT.close()
    url, down = launch(spec, deploy)
    try:
        yield served(url, deploy, reused=False)
    finally:
        down()


def served(url: str, deploy: DeployConfig, reused: bool) -> Served:
    """The running deployment as a bench target."""
    return Served(
        url=url,
        read=lambda: read_metrics(url),
        sample_rate=SAMPLE_RATE,  # what the load generator reads the PCM at
        reused=reused,
        deploy=deploy.model_dump(mode="json"),
        lag_s=REPORT_S + 0.2,
        servers=deploy.replicas,
        per_replica=True,
        nulls={"steps": STEPS_NULL},
    )


def read_metrics(url: str) -> Reading:
    """The deployment's merged /metrics, by replica."""
    response = httpx.get(f"{url}/metrics", timeout=METRICS_TIMEOUT_S)
    response.raise_for_status()
    return reading_of_text(response.text)


def launch(spec: OmniflowSpec, deploy: DeployConfig) -> tuple[str, Stop]:
    """Start the deployment as `omniflow serve deploy=ray` does, on a free loopback port;
    its URL and how to take it down (a cluster this process had joined before, as a test's
    is, stays up: only Serve goes)."""
    joined = ray.is_initialized()
    server = spec.server.model_copy(update={"host": "127.0.0.1", "port": free_port()})
    spec = spec.model_copy(update={"server": server})

    def down() -> None:
        if joined:
            serve.shutdown()
        elif ray.is_initialized():  # (at exit, Ray may have shut itself down already)
            stop(deploy)

    try:
        url = start(spec, deploy)
    except RuntimeError:  # a replica failed to build: nothing left behind
        down()
        raise
    return url, down


def free_port() -> int:
    """A loopback port free now (Serve's proxy binds it next)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
