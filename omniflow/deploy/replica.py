"""One Ray Serve replica: the whole pipeline, built with `build_pipeline` and served with the
same FastAPI app as `omniflow serve` (`serve.run.make_app`), plus the replica header.

Ray Serve's ingress runs the app's lifespan in the replica, so the pipeline starts with the
replica and stops with it, as under uvicorn."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI
from ray import serve

from omniflow.build.pipeline import build_pipeline
from omniflow.config.resolve import build_graph
from omniflow.config.schema import OmniflowSpec
from omniflow.deploy.header import ReplicaHeader
from omniflow.deploy.voices import SharedVoices
from omniflow.logs import setup_logging
from omniflow.serve.run import make_app

log = logging.getLogger("omniflow.deploy")


@serve.ingress()
class OmniflowReplica:
    """A replica of the whole pipeline; `spec` is the validated config the CLI composed,
    `voices` the handle of the voice store every replica shares (deploy/voices.py)."""

    def __init__(self, spec: OmniflowSpec, voices: Any) -> None:
        setup_logging(spec.server.log_level)
        self.name = serve.get_replica_context().replica_tag
        graph = build_graph(spec)
        self.served = make_app(build_pipeline(graph), spec.server)
        self.served.add_middleware(ReplicaHeader, name=self.name)
        service = self.served.state.service
        service.voices.registry = SharedVoices(voices, spec.server.max_voices)
        log.info("replica %s built (%s, %s)", self.name, graph.model.name, graph.platform.name)

    def __serve_build_asgi_app__(self) -> FastAPI:
        return self.served
