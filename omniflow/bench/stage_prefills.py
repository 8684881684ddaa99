"""A job's prefill counters (`PrefillCounters` of the AR stage) as flat result fields.

Why in the result: a mixed step's prefill takes the prompt graphs (one or more replays) or
runs eagerly, and the two cost alike at 128 rows on the H200 (docs/benchmarks.md), so the
step times alone cannot say which path a job's mixed steps took; these counts do.
"""

from __future__ import annotations

from omniflow.core.pipeline import PipelineStats, PrefillCounters


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
