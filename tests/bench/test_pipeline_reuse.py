"""`bench.reuse_pipeline`: a sweep's jobs with the same stage graph share one built pipeline
(the build is most of a GPU job), a different graph builds anew and stops the old one, and
a reusing job's results are its own (window counters counted from where it started)."""

from __future__ import annotations

import gc
import weakref
from dataclasses import dataclass, field
from types import SimpleNamespace

from omniflow.bench.job import run_job
from omniflow.bench.reuse import CACHE, PipelineCache
from omniflow.build.pipeline import build_pipeline
from omniflow.config.compose import compose
from omniflow.config.graph import StageGraph
from omniflow.config.resolve import build_graph
from omniflow.engine.orchestrator import Orchestrator


@dataclass
class FakePipeline:
    graph: StageGraph
    calls: list[str] = field(default_factory=list)
    healthy: bool = True

    def stats(self) -> SimpleNamespace:
        return SimpleNamespace(healthy=self.healthy)

    def start(self) -> None:
        self.calls.append("start")

    def stop(self) -> None:
        self.calls.append("stop")


def test_equal_graphs_share_a_started_pipeline_and_another_graph_stops_it():
    built: list[FakePipeline] = []

    def build(graph: StageGraph) -> FakePipeline:
        built.append(FakePipeline(graph))
        return built[-1]

    cache = PipelineCache(build)  # type: ignore[arg-type]
    a = build_graph(compose(["platform=cpu"]))
    b = build_graph(compose(["platform=cpu", "pipeline.stages.talker.window_k=4"]))
    first, reused = cache.get(a)
    assert not reused and first.calls == ["start"]
    again, reused = cache.get(build_graph(compose(["platform=cpu", "bench.concurrency=4"])))
    assert reused and again is first  # bench keys are not part of the graph
    other, reused = cache.get(b)
    assert not reused and other is not first
    assert first.calls == ["start", "stop"] and other.calls == ["start"]
    other.healthy = False  # a stage died in the last job: never handed on
    rebuilt, reused = cache.get(b)
    assert not reused and rebuilt is not other and other.calls == ["start", "stop"]
    cache.close()
    assert rebuilt.calls == ["start", "stop"] and len(built) == 3 and not cache.kept


def test_a_reusing_job_reports_its_own_window_counters():
    args = [
        "platform=cpu",
        "pipeline.stages.talker.window_k=4",
        # windows of a fixed length: slack sizing follows the wall clock, and the reused
        # pipeline's clock starts with the first job's step times
        "pipeline.stages.talker.playback_margin_ms=null",
        "bench.num_prompts=2",
        "bench.max_frames=6",
        "bench.rounds=1",
        "bench.warmup=0",
    ]
    CACHE.close()  # whatever an earlier test in this process left
    first = run_job(compose(args), args, None)
    second = run_job(compose(args), args, None)
    assert first["config"]["pipeline_reused"] is False
    assert second["config"]["pipeline_reused"] is True
    assert first["windows"]["executed_windows"] > 0
    assert second["windows"] == first["windows"]  # the same prompts: the same windows
    # prefills likewise, counted from where each job started; no prompt graphs on the CPU
    p = first["prefills"]
    assert p["steps"] >= 1 and p["tokens"] > 0 and p["graphed"] == 0 and p["eager"] == p["steps"]
    assert second["prefills"] == p
    assert CACHE.kept
    off = [*args, "bench.reuse_pipeline=false"]  # its own pipeline, none kept beside it
    assert run_job(compose(off), off, None)["config"]["pipeline_reused"] is False
    assert not CACHE.kept


def test_a_replaced_pipeline_is_released(monkeypatch):
    """The kept pipeline a new graph replaces is gone after the next job, not merely stopped:
    nothing the served job made (the app, its routes, the metrics) still reaches it. On the
    GPU a leaked one keeps its weights, KV pools and CUDA graphs; a sweep alternating two
    graphs ran out of memory at its fourth build."""
    built: list[weakref.ref[Orchestrator]] = []

    def build(graph: StageGraph) -> Orchestrator:
        pipeline = build_pipeline(graph)
        built.append(weakref.ref(pipeline))
        return pipeline

    monkeypatch.setattr(CACHE, "build", build)
    base = ["platform=cpu", "bench.num_prompts=2", "bench.max_frames=4", "bench.rounds=1"]
    CACHE.close()
    for k in (2, 4):
        args = [*base, "bench.warmup=1", f"pipeline.stages.talker.window_k={k}"]
        assert run_job(compose(args), args, None)["summary"]["failed"] == 0
    gc.collect()
    assert len(built) == 2
    assert built[0]() is None, "the replaced pipeline is still reachable"
    assert built[1]() is not None and CACHE.kept  # the kept one is, of course
    CACHE.close()
    gc.collect()
    assert built[1]() is None
