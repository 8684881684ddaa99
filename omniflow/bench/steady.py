"""A closed-loop round's steady state: the span in which every lane always had a request in
flight, past the opening burst.

Why: a round's audio-s/s over its whole wall time counts the opening burst (every lane's
first prompt prefilled at once) and the drain (lanes running out of prompts one by one), so
at high concurrency with prompts of natural length it reads below what the server sustains;
issue 35's target is a steady-state figure. The span runs from the first time a lane sent
its second prompt (the burst turning over) to the last send (after it, lanes fall idle). A
request's audio counts in proportion to the part of its delivery (first audio to end) inside
the span: streamed audio arrives at about an even pace, so this is an estimate, stated as one.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # outcome.py's summary calls this module
    from omniflow.bench.outcome import Failure, Sample


def steady_state(
    samples: Sequence[Sample], failures: Sequence[Failure], lanes: int
) -> dict[str, float | int | None] | None:
    """The span's length, its audio-s/s, the mean first audio of the completed requests
    sent in it (None: none completed) and how many sent in it failed (a lane whose request
    failed at once sends its next early, so failures can also start the span inside the
    opening burst: a figure with failures is not a clean steady state); None when the span
    is empty (no more requests than lanes) or a send time is unknown."""
    sends = [s.sent_s for s in samples] + [f.sent_s for f in failures]
    if lanes < 1 or len(sends) <= lanes or any(t is None for t in sends):
        return None
    ordered = sorted(t for t in sends if t is not None)
    start, end = ordered[lanes], ordered[-1]
    if end <= start:
        return None
    audio = 0.0
    for s in samples:
        assert s.sent_s is not None  # checked above
        first, last = s.sent_s + s.ttfp, s.sent_s + s.e2el
        if last > first:
            part = min(last, end) - max(first, start)
            audio += s.audio_s * max(0.0, part) / (last - first)
        elif start <= first <= end:
            audio += s.audio_s

    def inside(sent: float | None) -> bool:
        return sent is not None and start <= sent <= end

    heard = [s.ttfp for s in samples if inside(s.sent_s)]
    return {
        "start_s": start,
        "span_s": end - start,
        "audio_throughput": audio / (end - start),
        "requests": len(heard),
        "ttfp_mean_s": statistics.fmean(heard) if heard else None,
        "failed": sum(inside(f.sent_s) for f in failures),
    }
