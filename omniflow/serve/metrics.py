"""Prometheus metrics of the server, all prefixed `omniflow_`, in a registry of its own.

Request counters and latencies are recorded by the responses; per-stage gauges, window and
prefill counters are read from `pipeline.stats()` at scrape time (one consistent snapshot per
scrape, nothing to keep in sync), and step times arrive through the pipeline's step observer.
A series exists only for stages that have the quantity: a stage without a KV cache, decoder
or windows exports nothing about it. The process's own gauges (`process_resident_memory_bytes`
and friends, where the platform has them) come from prometheus_client's process collector.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Protocol, TypeVar

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from omniflow.core.pipeline import (
    Pipeline,
    PipelineStats,
    PrefillCounters,
    StageStats,
    WindowCounters,
)
from omniflow.core.player import Stall

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
FIRST_AUDIO_PART_BUCKETS = (0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 2.5, 10)
STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1)

T = TypeVar("T")

STAGE_GAUGES: tuple[tuple[str, str, Callable[[StageStats], float | None]], ...] = (
    ("omniflow_kv_blocks_in_use", "KV-cache blocks in use", lambda s: s.kv_blocks_used),
    (
        "omniflow_decoder_slots_in_use",
        "Streaming codec decoder slots in use",
        lambda s: s.decoder_slots_used,
    ),
    ("omniflow_requests_running", "Requests being computed by the stage", lambda s: s.running),
    ("omniflow_requests_waiting", "Requests queued at the stage", lambda s: s.waiting),
    (
        "omniflow_requests_paused",
        "Requests paused by backpressure (their consumer is behind)",
        lambda s: s.paused,
    ),
    (
        "omniflow_backlog_frames",
        "Frames received from the upstream stage and not yet consumed",
        lambda s: s.backlog_frames,
    ),
    (
        "omniflow_stream_slack_min_seconds",
        "The least playback slack of a running stream (its next frame's deadline - now; "
        "negative: late), on stages that size windows by slack",
        lambda s: s.min_slack_s,
    ),
)


class Activity(Protocol):
    """Told when the server starts working (a request starts with none running) and when
    it goes idle (the last running request ends); `core/heap.py` `IdleRelease` is one."""

    def busy(self) -> None: ...

    def idle(self) -> None: ...


class Metrics:
    def __init__(self, pipeline: Pipeline) -> None:
        self._running = 0
        self.watchers: list[Activity] = []
        r = self.registry = CollectorRegistry()
        self.requests = Counter(
            "omniflow_requests", "Speech requests by outcome", ["outcome"], registry=r
        )
        self.in_flight = Gauge("omniflow_requests_in_flight", "Speech requests running", registry=r)
        self.audio_seconds = Counter("omniflow_audio_seconds", "Seconds of audio sent", registry=r)
        self.first_audio = Histogram(
            "omniflow_first_audio_seconds",
            "Request arrival to its first audio bytes sent (a whole response: its body ready);"
            " the sum of its three parts, omniflow_first_audio_{intake,made,delivery}_seconds",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )

        # First audio in three parts that add up to it, so a slow first audio says where it
        # went: the server's own intake, the pipeline (queueing, prefill, the first frame and
        # its decode), or the way back to the socket (engine thread -> event loop, response).
        def part(name: str, doc: str) -> Histogram:
            name = f"omniflow_first_audio_{name}_seconds"
            return Histogram(name, doc, buckets=FIRST_AUDIO_PART_BUCKETS, registry=r)

        self.first_audio_intake = part(
            "intake", "Request arrival to its submission to the pipeline (body, validation, voice)"
        )
        self.first_audio_made = part(
            "made",
            "Submission to the pipeline making the request's first audio (a whole response:"
            " its last)",
        )
        self.first_audio_delivery = part(
            "delivery",
            "First audio made to its first bytes sent (hand-off to the event loop, response"
            " start, encoding)",
        )
        # The pipeline's part in two, where its source stage says when it seated the request:
        # waiting for a seat, against what came after (under async scheduling the step in
        # flight, then its own steps to the first frame and that frame's decoder pass).
        self.first_audio_queued = part(
            "queued",
            "Submission to the plan that first seated the request in its source stage (made's"
            " first part; under sync scheduling it includes the step in flight)",
        )
        self.first_audio_steps = part(
            "steps",
            "That plan to the first audio made, a whole response's last (made's second part;"
            " a request preempted before its first audio waits again in here)",
        )
        # Delivery in two: the crossing from the engine's thread (or process) to the request's
        # handler on the event loop, against the response's own work after it.
        self.first_audio_handoff = part(
            "handoff",
            "First audio made to its request's handler taking it on the event loop (delivery's"
            " first part: the engine's thread or process to the loop)",
        )
        self.first_audio_response = part(
            "response",
            "That handler taking it to its first bytes sent (delivery's second part: response"
            " start, encoding, the write)",
        )
        self.e2e = Histogram(
            "omniflow_e2e_seconds",
            "Request arrival to its last audio bytes sent (a whole response: its body ready)",
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
        self.refusals = Counter(
            "omniflow_refusals",
            "Speech requests refused before they started, by reason: in_flight (429, the "
            "in-flight cap), first_audio_wait (503, could not be seated within "
            "server.max_first_audio_wait_s), unavailable (503, a stage stopped), invalid (4xx)",
            ["reason"],
            registry=r,
        )
        self.stalls = Counter(
            "omniflow_stalls",
            "Streamed audio sent later than a zero-buffer player starting at the stream's "
            "first audio needed it (the stalls the server can see; a client adds its network)",
            registry=r,
        )
        self.stall_seconds = Counter(
            "omniflow_stall_seconds", "Total length of those stalls", registry=r
        )
        for outcome in ("ok", "error", "abort", "rejected"):
            self.requests.labels(outcome)
        for reason in ("in_flight", "first_audio_wait", "unavailable", "invalid"):
            self.refusals.labels(reason)
        for stage in pipeline.info().stages:
            self.step.labels(stage)
        pipeline.set_step_observer(lambda stage, seconds: self.step.labels(stage).observe(seconds))
        r.register(StageCollector(pipeline.stats))
        ProcessCollector(registry=r)
        engine = pipeline.info().engine_pid
        if engine is not None:  # omniflow_engine_process_*: none once that process is gone
            ProcessCollector(namespace="omniflow_engine", pid=lambda: engine, registry=r)

    def first_audio_sent(
        self,
        arrived: float,
        submitted: float,
        made: float,
        sent: float,
        seated: float | None,
        taken: float,
    ) -> None:
        """A request's first audio went out: its latency from arrival, and the three parts
        (`time.perf_counter` values; `made` from the engine's thread, the same clock); `made`
        split at `seated` and delivery at `taken` (its handler took the event), which assume
        one host's monotonic clock: a stage on another host (`pipeline.runtime=ray` across
        machines) gives no meaningful split, and a value outside its part is dropped."""
        self.first_audio.observe(sent - arrived)
        self.first_audio_intake.observe(submitted - arrived)
        self.first_audio_made.observe(made - submitted)
        self.first_audio_delivery.observe(sent - made)
        if seated is not None and submitted <= seated <= made:
            self.first_audio_queued.observe(seated - submitted)
            self.first_audio_steps.observe(made - seated)
        if made <= taken <= sent:
            self.first_audio_handoff.observe(taken - made)
            self.first_audio_response.observe(sent - taken)

    def stalled(self, stall: Stall | None) -> None:
        """Count a stall a streamed response's player saw (None: none)."""
        if stall is not None:
            self.stalls.inc()
            self.stall_seconds.inc(stall.length_s)

    def request_started(self) -> None:
        """A speech request runs: the in-flight gauge, and `watchers` if it is the only one."""
        self.in_flight.inc()
        self._running += 1
        if self._running == 1:
            for watcher in self.watchers:
                watcher.busy()

    def request_ended(self) -> None:
        """A speech request ended: the in-flight gauge, and `watchers` if none is left."""
        self.in_flight.dec()
        self._running -= 1
        if self._running == 0:
            for watcher in self.watchers:
                watcher.idle()


class StageCollector(Collector):
    """Per-stage gauges, window and prefill counters, from one `stats()` snapshot per
    scrape."""

    def __init__(self, stats: Callable[[], PipelineStats]) -> None:
        self.stats = stats

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        stats = self.stats()
        stages = stats.stages
        yield GaugeMetricFamily(
            "omniflow_buffered_audio_seconds",
            "Audio generated and not yet taken by its client, all requests",
            value=stats.buffered_audio_s,
        )
        for name, doc, read in STAGE_GAUGES:
            values = [(s.name, read(s)) for s in stages]
            present = [(stage, v) for stage, v in values if v is not None]
            if present:
                family = GaugeMetricFamily(name, doc, labels=["stage"])
                for stage, value in present:
                    family.add_metric([stage], value)
                yield family
        yield from window_families(stages)
        yield from prefill_families(stages)


def stage_counters(
    rows: list[tuple[str, T]], specs: tuple[tuple[str, str, Callable[[T], int]], ...]
) -> Iterator[CounterMetricFamily]:
    """One counter family per (name, doc, read) in `specs`, a series per (stage, counters)
    row."""
    for name, doc, read in specs:
        family = CounterMetricFamily(name, doc, labels=["stage"])
        for stage, counters in rows:
            family.add_metric([stage], read(counters))
        yield family


PREFILL_COUNTERS: tuple[tuple[str, str, Callable[[PrefillCounters], int]], ...] = (
    ("omniflow_prefill_steps", "Steps with a prefill forward", lambda p: p.steps),
    ("omniflow_prefill_tokens", "Tokens prefilled", lambda p: p.tokens),
    (
        "omniflow_prefill_graphed",
        "Prefill forwards on the prompt-graph path (replays where graphs are captured)",
        lambda p: p.graphed,
    ),
    (
        "omniflow_prefill_graph_replays",
        "Prompt-graph replays of the graphed prefills",
        lambda p: p.replays,
    ),
)
WINDOW_COUNTERS: tuple[tuple[str, str, Callable[[WindowCounters], int]], ...] = (
    ("omniflow_window_planned", "Windows planned", lambda w: w.planned),
    ("omniflow_window_executed", "Windows executed with more than one step", lambda w: w.executed),
    ("omniflow_window_steps", "Forward steps executed inside windows", lambda w: w.steps),
    ("omniflow_window_cut", "Windows an arrival ended before their length", lambda w: w.cut),
    (
        "omniflow_window_arrival_steps",
        "Steps the running streams sat out so that arrivals were prefilled alone",
        lambda w: w.arrival_steps,
    ),
    (
        "omniflow_window_audio_cycles",
        "Runs of single steps whose frames playing streams held for one decoder pass",
        lambda w: w.audio_cycles,
    ),
)


def prefill_families(stages: tuple[StageStats, ...]) -> Iterator[CounterMetricFamily]:
    """Prefill counters of the AR stages: whether mixed steps take the prompt graphs."""
    ar = [(s.name, s.prefills) for s in stages if s.prefills is not None]
    if ar:
        yield from stage_counters(ar, PREFILL_COUNTERS)


def window_families(stages: tuple[StageStats, ...]) -> Iterator[CounterMetricFamily]:
    """Multi-step window counters (and arrival steps) of the stages that have windows or a
    playback clock."""
    windowed = [(s.name, s.windows) for s in stages if s.windows is not None]
    if not windowed:
        return
    yield from stage_counters(windowed, WINDOW_COUNTERS)
    refusals = CounterMetricFamily(
        "omniflow_window_refusals", "Windows refused, by reason", labels=["stage", "reason"]
    )
    sizes = CounterMetricFamily(
        "omniflow_window_sizes",
        "Windows planned, by their length in steps (sized by the streams' playback slack)",
        labels=["stage", "steps"],
    )
    for stage, w in windowed:
        for reason, count in sorted(w.refusals.items()):
            refusals.add_metric([stage, reason], count)
        for k, count in sorted(w.sizes.items()):
            sizes.add_metric([stage, str(k)], count)
    yield refusals
    yield sizes
