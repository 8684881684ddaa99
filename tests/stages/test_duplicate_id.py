"""A request id already running is refused before any stage makes its request: a stage in a
Ray actor keeps what its `make_request` made until the request's Add, so making it first
would leave it there for good (`engine/orchestrator.py` submit)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from omniflow.build.pipeline import build_context, build_stage
from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from omniflow.engine.orchestrator import Orchestrator
from tests.factories import Collector, speech
from tests.stages.test_flow import wait_for


@dataclass
class Counted:
    """A stage's parts (what the orchestrator reads of them) with make_request counted."""

    inner: Any
    made: list[str]

    def __post_init__(self) -> None:
        self.frontend = self.inner.frontend
        self.reference = self.inner.reference
        self.max_chunk_frames = self.inner.max_chunk_frames

    def make_request(self, s: Any) -> Any:
        self.made.append(s.request_id)
        return self.inner.make_request(s)


def test_a_running_id_is_refused_before_any_stage_makes_its_request():
    graph = build_graph(compose(["pipeline=qwen3_tts", "platform=cpu"]))
    ctx = build_context(graph)
    made: list[str] = []
    engines, parts = {}, {}
    for name, stage in graph.stages.items():
        p, engines[name] = build_stage(stage, ctx)
        parts[name] = Counted(p, made)
    orch = Orchestrator(graph, engines, parts)
    orch.start()
    try:
        first = Collector()
        orch.submit(speech("a", max_new_tokens=400, ignore_eos=True), first)
        assert made == ["a", "a"]  # one request per stage
        wait_for(lambda: first.events)  # running, and known to the router
        with pytest.raises(ValueError, match="already running"):
            orch.submit(speech("a", max_new_tokens=4), Collector())
        assert made == ["a", "a"]
        orch.abort("a")
        first.wait()
    finally:
        orch.stop()
