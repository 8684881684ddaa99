"""One Ray Serve replica: the whole pipeline, built with `build_pipeline` and served with the
same FastAPI app as `omniflow serve` (`serve.run.make_app`), plus the replica header.

Ray Serve's ingress runs the app's lifespan in the replica, so the pipeline starts with the
replica and stops with it, as under uvicorn."""

from __future__ import annotations

import logging
import time
from typing import Any

from fastapi import FastAPI
from ray import serve

from omniflow.build.pipeline import build_pipeline
from omniflow.config.resolve import build_graph
from omniflow.config.schema import OmniflowSpec, SchedulerConfig, StepLimits
from omniflow.deploy.board import Report, Reporter, health_of
from omniflow.deploy.header import ReplicaHeader
from omniflow.deploy.load import gauges_of
from omniflow.deploy.overview import Overview
from omniflow.deploy.voices import SharedVoices
from omniflow.logs import setup_logging
from omniflow.serve.run import make_app
from omniflow.serve.warmup import warmup_frames

log = logging.getLogger("omniflow.deploy")


@serve.ingress()
class OmniflowReplica:
    """A replica of the whole pipeline; `spec` is the validated config the CLI composed,
    `voices` the handle of the voice store every replica shares (deploy/voices.py), `board`
    that of the replicas' reports (deploy/board.py), which /health and /metrics answer from
    (deploy/overview.py)."""

    def __init__(self, spec: OmniflowSpec, voices: Any, board: Any) -> None:
        self.reporter: Reporter | None = None
        """Set once the replica is built (a build that fails leaves nothing to stop)."""
        setup_logging(spec.server.log_level)
        self.name = serve.get_replica_context().replica_tag
        graph = build_graph(spec)
        self.pipeline = build_pipeline(graph)
        self.served = make_app(self.pipeline, spec.server, warmup=warmup_frames(spec.server, graph))
        service = self.served.state.service
        service.voices.registry = SharedVoices(voices, spec.server.max_voices)
        self.served.add_middleware(
            Overview, name=self.name, board=board, own=self.report, replicas=spec.deploy.replicas
        )
        self.served.add_middleware(ReplicaHeader, name=self.name)  # outermost: on every answer
        self.reporter = Reporter(board, self.name, self.state)
        source = next(iter(graph.stages.values()))  # where a new request is seated first
        self.source, self.seats = source.name, seats_of(source.scheduler)
        log.info("replica %s built (%s, %s)", self.name, graph.model.name, graph.platform.name)

    def __serve_build_asgi_app__(self) -> FastAPI:
        return self.served

    def state(self) -> tuple[dict, int, str]:
        """This replica's /health body and status code and its /metrics text."""
        state = self.served.state
        body, code = health_of(state.service.health(state.speech_sessions.load))
        service = state.service
        return body, code, bytes(service.metrics_response().body).decode()

    def record_routing_stats(self) -> dict[str, float]:
        """Ray Serve asks for this every deploy/load.py REPORT_S and hands it to the request
        router (deploy/router.py): this replica's in-flight streams and free seats."""
        stats = self.pipeline.stats()
        return gauges_of(stats, self.source, self.seats, time.time()).as_stats()

    def report(self) -> Report:
        return Report(*self.state(), age_s=0.0)

    def __del__(self) -> None:
        if self.reporter is not None:
            self.reporter.stop()


def seats_of(limits: SchedulerConfig | StepLimits) -> int:
    """Requests a stage holds at once: max_resident_seqs where set, else max_num_seqs."""
    if isinstance(limits, SchedulerConfig) and limits.max_resident_seqs:
        return limits.max_resident_seqs
    return limits.max_num_seqs
