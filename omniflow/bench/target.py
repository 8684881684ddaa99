"""Where a bench job sends its load and reads the server's figures: the configured pipeline
served in this process (`deploy=local`), or a Ray Serve deployment of it (`deploy=ray`,
bench/ray_target.py). The job's loop, its load generator (a child process talking HTTP)
and its result are the same for both; what a target cannot measure is null in the result,
with the reason in its `nulls`."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from omniflow.bench.ray_kept import KEPT
from omniflow.bench.reuse import CACHE
from omniflow.bench.samples import Reading, Samples, reading_of
from omniflow.bench.server_view import Snapshot, snapshot_of
from omniflow.bench.target_check import check_target
from omniflow.build.pipeline import build_pipeline
from omniflow.config.graph import StageGraph
from omniflow.config.schema import OmniflowSpec
from omniflow.core.pipeline import NoTimer, PhaseTimer
from omniflow.serve.run import ServerThread
from omniflow.serve.warmup import warmup_frames

SETTLE_TIMEOUT_S = 30.0
"""How long a lagging target's counts may take to settle before the job gives up on them."""


@dataclass
class Served:
    """A running target: its URL, its metrics now (`read`, by server), and what it allows."""

    url: str
    read: Callable[[], Reading]
    sample_rate: int
    reused: bool
    """Whether the pipeline (deploy=ray: the deployment) was kept from an earlier job."""
    deploy: dict[str, Any]
    """The deploy settings, as the result's config records them."""
    time_steps: Callable[[PhaseTimer], None] | None = None
    """Sets the pipeline's step-phase timer; None where the steps run in other processes."""
    lag_s: float = 0.0
    """How old a server's figures in `read()` may be (Ray: each replica reports every
    second); 0: read as they are now."""
    servers: int = 1
    per_replica: bool = False
    """Whether the result gives each server's own counts (`replicas`; deploy=ray)."""
    nulls: dict[str, str] = field(default_factory=dict)
    """Result fields this target cannot have, and why."""

    def finished(self) -> int:
        """Requests finished by every server (the request bar's count)."""
        return sum(int(s.value("omniflow_requests_total")) for s in self.read().values())

    def snapshot(self, stage: str) -> tuple[Snapshot, str | None]:
        """Every server's counts now, or (lagging figures) once two readings `lag_s` apart
        agree with all servers reporting; with the reason when they did not in time."""
        if not self.lag_s:
            return snapshot_of(self.read(), stage), None
        deadline = time.monotonic() + SETTLE_TIMEOUT_S
        last: Snapshot | None = None
        while True:
            reading = {n: s for n, s in self.read().items() if up(s)}
            now = snapshot_of(reading, stage)
            if len(now) == self.servers and now == last:
                return now, None
            if time.monotonic() > deadline:
                if len(now) != self.servers:
                    return now, f"{len(now)} of {self.servers} replicas reporting their metrics"
                return now, f"the replicas' counts still changed after {SETTLE_TIMEOUT_S:g} s"
            last = now
            time.sleep(self.lag_s)


def up(samples: Samples) -> bool:
    """A server whose series are in the reading: in-process always; a replica while it
    reports (`omniflow_replica_up` 1; a stale one's series are left out of /metrics)."""
    return not samples.has("omniflow_replica_up") or samples.value("omniflow_replica_up") == 1


@contextmanager
def open_target(spec: OmniflowSpec, graph: StageGraph, stage: str) -> Iterator[Served]:
    """The job's target, running until the block ends (a kept one after it: reuse)."""
    deploy = check_target(spec, graph)
    if deploy is not None:
        from omniflow.bench.ray_target import on_ray  # imports Ray

        with on_ray(spec, graph, deploy) as served:
            yield served
        return
    with in_process(spec, graph) as served:
        yield served


@contextmanager
def in_process(spec: OmniflowSpec, graph: StageGraph) -> Iterator[Served]:
    """The pipeline served on a loopback port in this process (kept for the next job with
    `bench.reuse_pipeline`)."""
    KEPT.close()  # a deployment an earlier job kept: its replicas' devices back
    reuse = spec.bench.reuse_pipeline
    if reuse:
        pipeline, reused = CACHE.get(graph)  # started; left running for the next job
    else:  # a job of its own: no kept pipeline holds device memory beside it
        CACHE.close()
        pipeline, reused = build_pipeline(graph), False
    try:
        # log lines (rounds, engine stats) print above the request bar, not through it: the
        # bar is this process's (RequestBar), and the log handler writes above it (logs.py)
        warmup = 0 if reused else warmup_frames(spec.server, graph)  # a kept one is warm
        with ServerThread(pipeline, spec.server, owns_pipeline=not reuse, warmup=warmup) as srv:
            registry = srv.app.state.service.metrics.registry
            yield Served(
                url=srv.url,
                read=lambda: reading_of(registry.collect()),
                sample_rate=pipeline.info().sample_rate,
                reused=reused,
                deploy={"name": "local"},
                # steps are timed in this process or the engine's own (stages on Ray: not)
                time_steps=None if graph.runtime == "ray" else pipeline.set_phase_timer,
            )
    finally:  # a kept pipeline's later steps are not this job's, even after a failure
        pipeline.set_phase_timer(NoTimer())
