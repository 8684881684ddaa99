"""A job's stage counters as flat result fields, counted from where the job started (a
reused pipeline's counters include the earlier jobs'): the AR stage's windows and prefills.

Why prefills are in the result: a mixed step's prefill takes the prompt graphs (one or more
replays) or runs eagerly, and at large batches the step times alone cannot say which
(measured: docs/performance.md, "The parts of a step"); these counts do.
"""

from __future__ import annotations

from omniflow.bench.samples import Samples
from omniflow.core.pipeline import PipelineStats, PrefillCounters, WindowCounters


def stage_prefills(stats: PipelineStats, stage: str) -> PrefillCounters | None:
    """The named stage's prefill counters (None for a stage without prefills)."""
    return next(s.prefills for s in stats.stages if s.name == stage)


def prefills_since(
    before: PrefillCounters | None, now: PrefillCounters | None
) -> dict[str, int] | None:
    """This job's prefills (a reused pipeline's counters started at the earlier jobs'
    totals): steps, tokens, on prompt graphs (`graphed`, with their `replays`), `eager`."""
    if now is None:
        return None
    b = before or PrefillCounters(0, 0, 0, 0)
    steps, graphed = now.steps - b.steps, now.graphed - b.graphed
    return {
        "steps": steps,
        "tokens": now.tokens - b.tokens,
        "graphed": graphed,
        "replays": now.replays - b.replays,
        "eager": steps - graphed,
    }


def stage_windows(stats: PipelineStats, stage: str) -> dict[str, int] | None:
    """The stage's window counters as flat result fields; None when windows are off."""
    w: WindowCounters | None = next(s.windows for s in stats.stages if s.name == stage)
    if w is None:
        return None
    flat = {
        "planned_windows": w.planned,
        "executed_windows": w.executed,
        "executed_steps": w.steps,
        "cut_windows": w.cut,
        "arrival_steps": w.arrival_steps,
        "audio_cycles": w.audio_cycles,
    }
    flat.update({f"refused_{k}": v for k, v in sorted(w.refusals.items())})
    return flat


def windows_since(
    before: dict[str, int] | None, now: dict[str, int] | None
) -> dict[str, int] | None:
    """This job's window counters: a reused pipeline's counters started at the previous
    jobs' totals."""
    if now is None or before is None:
        return now
    return {k: v - before.get(k, 0) for k, v in now.items()}


def windows_of(samples: Samples, stage: str) -> dict[str, int] | None:
    """`stage_windows` read from the server's metrics (serve/metrics.py's window counters);
    None when windows are off (no series for the stage)."""
    at = {"stage": stage}
    if not samples.has("omniflow_window_planned_total", at):
        return None
    flat = {
        key: int(samples.value(f"omniflow_window_{name}_total", at))
        for key, name in WINDOW_FIELDS.items()
    }
    refusals = samples.by_label("omniflow_window_refusals_total", "reason", at)
    flat.update({f"refused_{k}": int(v) for k, v in sorted(refusals.items())})
    return flat


WINDOW_FIELDS = {"planned_windows": "planned", "executed_windows": "executed"}
WINDOW_FIELDS |= {"executed_steps": "steps", "cut_windows": "cut"}
WINDOW_FIELDS |= {"arrival_steps": "arrival_steps", "audio_cycles": "audio_cycles"}


def prefills_of(samples: Samples, stage: str) -> PrefillCounters | None:
    """`stage_prefills` read from the server's metrics; None for a stage without prefills."""
    at = {"stage": stage}
    if not samples.has("omniflow_prefill_steps_total", at):
        return None

    def count(name: str) -> int:
        return int(samples.value(f"omniflow_prefill_{name}_total", at))

    steps, tokens, graphed = count("steps"), count("tokens"), count("graphed")
    return PrefillCounters(steps, tokens, graphed, count("graph_replays"))
