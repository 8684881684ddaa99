"""What an open-loop trace's records say (`benchmarks/open_loop_trace.py`): the phases that
overlapped a request's wait, each phase kind's share of the wall time, the stalls a zero-buffer
player would have heard, and what a run added to a stage's window counters."""

from __future__ import annotations

import statistics
import threading
from dataclasses import dataclass, field

from omniflow.core.events import AudioEvent
from omniflow.core.pipeline import WindowCounters
from omniflow.core.player import stalls


@dataclass(frozen=True)
class Phase:
    stage: str
    name: str
    start: float
    end: float


@dataclass
class Arrival:
    """One request: when it was submitted, seated and first heard, and how it ended."""

    index: int
    submitted: float = 0.0
    seated: float | None = None
    first: float | None = None
    error: str | None = None
    chunks: list[tuple[float, int]] = field(default_factory=list, repr=False)
    """(made at, samples) of every audio event, in order."""
    done: threading.Event = field(default_factory=threading.Event, repr=False)

    def __call__(self, ev: AudioEvent) -> None:
        if ev.pcm is not None and ev.pcm.size:
            if self.first is None:
                self.first, self.seated = ev.made_at, ev.seated_at
            self.chunks.append((ev.made_at, int(ev.pcm.size)))
        if ev.finished:
            self.error = ev.error
            self.done.set()


def overlap(phases: list[Phase], start: float, end: float) -> dict[str, float]:
    """Seconds of each stage's phase (`stage.name`) inside [start, end]."""
    out: dict[str, float] = {}
    for p in phases:
        inside = min(p.end, end) - max(p.start, start)
        if inside > 0:
            key = f"{p.stage}.{p.name}"
            out[key] = out.get(key, 0.0) + inside
    return out


def describe(group: list[Arrival], phases: list[Phase]) -> dict[str, float]:
    """Mean ms of the group's queued and steps parts and of each phase during its wait."""
    if not group:
        return {}
    out = {
        "requests": len(group),
        "first_audio_ms": 1000 * statistics.mean(a.first - a.submitted for a in group),
        "queued_ms": 1000 * statistics.mean((a.seated or a.submitted) - a.submitted for a in group),
        "steps_ms": 1000 * statistics.mean(a.first - (a.seated or a.submitted) for a in group),
    }
    sums: dict[str, float] = {}
    for a in group:
        for name, s in overlap(phases, a.submitted, a.first).items():
            sums[name] = sums.get(name, 0.0) + s
    out.update({f"{name}_ms": 1000 * s / len(group) for name, s in sorted(sums.items())})
    return out


def phase_kinds(phases: list[Phase], wall_s: float) -> dict[str, dict[str, float]]:
    """Per `stage.name` (whole steps, `mixed_step` and `decode_step`, and the phases inside
    them): how many, their share of `wall_s`, and their length's p50 / p95 / max in ms."""
    lengths: dict[str, list[float]] = {}
    for p in phases:
        lengths.setdefault(f"{p.stage}.{p.name}", []).append(1000 * (p.end - p.start))
    out = {}
    for key, ms in sorted(lengths.items()):
        ms.sort()
        out[key] = {
            "count": len(ms),
            "share": sum(ms) / 1000 / wall_s if wall_s > 0 else 0.0,
            "p50_ms": ms[len(ms) // 2],
            "p95_ms": ms[min(len(ms) - 1, int(0.95 * len(ms)))],
            "max_ms": ms[-1],
        }
    return out


def stalled(
    arrivals: list[Arrival], phases: list[Phase], sample_rate: int, t0: float, longest: int
) -> list[dict]:
    """The `longest` stalls of a zero-buffer player fed each request's audio as it was made:
    when (s after the first arrival), how long, and the phases that overlapped the gap."""
    found = []
    for a in arrivals:
        if not a.chunks:
            continue
        times, sizes = zip(*a.chunks, strict=True)
        for s in stalls(times, sizes, bytes_per_second=sample_rate):
            found.append((s.length_s, a.index, s.at_s))
    found.sort(reverse=True)
    return [
        {
            "index": index,
            "at_s": at - t0,
            "length_ms": 1000 * length,
            "phases_ms": {k: 1000 * v for k, v in overlap(phases, at, at + length).items()},
        }
        for length, index, at in found[:longest]
    ]


def window_delta(before: WindowCounters, after: WindowCounters) -> dict:
    """What one rate's run added to a stage's window counters: windows planned by length,
    executed, the steps they ran, refusals by reason, cut by an arrival, arrival steps."""

    def minus(a: dict, b: dict) -> dict:
        return {k: a[k] - b.get(k, 0) for k in sorted(a) if a[k] != b.get(k, 0)}

    return {
        "planned": after.planned - before.planned,
        "executed": after.executed - before.executed,
        "steps": after.steps - before.steps,
        "sizes": minus(after.sizes, before.sizes),
        "refusals": minus(after.refusals, before.refusals),
        "cut": after.cut - before.cut,
        "arrival_steps": after.arrival_steps - before.arrival_steps,
    }
