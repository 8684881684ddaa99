"""Prometheus metrics of the server, all prefixed `omniflow_`, in a registry of its own."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from omniflow.sched.window import WindowStats
from omniflow.stages.orchestrator import Orchestrator

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)


class Metrics:
    def __init__(self, orchestrator: Orchestrator) -> None:
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "omniflow_requests", "Speech requests by outcome", ["outcome"], registry=r
        )
        self.in_flight = Gauge("omniflow_requests_in_flight", "Speech requests running", registry=r)
        self.audio_seconds = Counter("omniflow_audio_seconds", "Seconds of audio sent", registry=r)
        self.first_audio = Histogram(
            "omniflow_first_audio_seconds",
            "Request arrival to first audio bytes",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            "omniflow_e2e_seconds",
            "Request arrival to last audio bytes",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.step = Histogram(
            "omniflow_stage_step_seconds",
            "Engine step time per stage",
            ["stage"],
            buckets=STEP_BUCKETS,
            registry=r,
        )
        kv = Gauge("omniflow_kv_blocks_in_use", "KV-cache blocks in use", ["stage"], registry=r)
        for outcome in ("ok", "error", "abort", "rejected"):
            self.requests.labels(outcome)
        talker = orchestrator.talker
        kv.labels(talker.name).set_function(lambda: talker.scheduler.kv.num_used_blocks)
        for engine in orchestrator.engines:
            histogram = self.step.labels(engine.name)
            engine.step_observer = histogram.observe
        if talker.scheduler.window_k:  # a stage without windows exports nothing about them
            r.register(WindowCollector(talker.name, talker.scheduler.window_stats))


class WindowCollector(Collector):
    """Multi-step window counters of one stage (DESIGN §7), read at scrape time."""

    def __init__(self, stage: str, stats: WindowStats) -> None:
        self.stage = stage
        self.stats = stats

    def collect(self) -> Iterator[CounterMetricFamily]:
        s = self.stats
        for name, doc, value in (
            ("omniflow_window_planned", "Windows planned", s.planned_windows),
            (
                "omniflow_window_executed",
                "Windows executed with more than one step",
                s.executed_windows,
            ),
            ("omniflow_window_steps", "Forward steps executed inside windows", s.executed_steps),
        ):
            family = CounterMetricFamily(name, doc, labels=["stage"])
            family.add_metric([self.stage], value)
            yield family
        refusals = CounterMetricFamily(
            "omniflow_window_refusals", "Windows refused, by reason", labels=["stage", "reason"]
        )
        for reason, count in sorted(s.refusals.items()):
            refusals.add_metric([self.stage, reason], count)
        yield refusals
