"""What a load generator run measured: each completed request's sample, each failed one's
error, the wall time; the `--out` file that holds them; and their summary (counts, the most
frequent errors, latency and throughput over the completed requests)."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

from omniflow.bench.steady import steady_state

MAX_ERRORS = 5
"""Distinct error texts a summary lists (the rest are counted together)."""
REJECTED = (429, 503)
"""Statuses of a server refusing load (too many in flight; at capacity, shutting down or a
stage down)."""


def http_error(status: int, body: bytes) -> str:
    """A response other than 200 as one line: its status and the start of its body, as text
    (the server's JSON error), not a Python bytes literal."""
    return f"HTTP {status}: {body[:200].decode('utf-8', 'replace')}"


def http_status(error: str | None) -> int | None:
    """The status an `http_error` line names (None: another kind of failure)."""
    head = (error or "").partition(":")[0]
    number = head.removeprefix("HTTP ")
    return int(number) if head.startswith("HTTP ") and number.isdigit() else None


@dataclass(frozen=True)
class Sample:
    ttfp: float
    e2el: float
    audio_s: float
    underrun_s: float
    """Worst buffer deficit of a player that starts playing at the first audio bytes."""
    sent_s: float | None = None
    """When it was sent, seconds from the round's start (None: a file from before it)."""

    @property
    def rtf(self) -> float:
        return self.e2el / self.audio_s


@dataclass(frozen=True)
class Failure:
    """A measured request that did not deliver its audio."""

    prompt: int
    """Index of its prompt in the run."""
    error: str
    """What went wrong, e.g. `ReadError: ...`, `HTTP 503: ...`, `short audio: got N of M bytes`."""
    after_s: float
    """Seconds from sending the request until it failed."""
    sent_s: float | None = None
    """When it was sent, seconds from the round's start (None: a file from before it)."""
    status: int | None = None
    """The HTTP status the server answered with (None: no answer, or a 200 cut short)."""

    @property
    def refused(self) -> bool:
        """The server refused it (429 or 503) rather than failing it."""
        return self.status in REJECTED


@dataclass(frozen=True)
class Outcome:
    """A run's measured requests: the completed ones, the failed ones and the wall time."""

    samples: list[Sample]
    failures: list[Failure]
    wall_s: float
    lanes: int = 0
    """Requests kept in flight (the concurrency; 0: unknown, no steady state)."""


def write_outcome(path: str | Path, outcome: Outcome, summary: dict) -> None:
    """The `--out` file: the summary, and every sample and failure."""
    data = {
        "summary": summary,
        "wall_s": outcome.wall_s,
        "lanes": outcome.lanes,
        "samples": [asdict(s) for s in outcome.samples],
        "failures": [asdict(f) for f in outcome.failures],
    }
    Path(path).write_text(json.dumps(data, indent=2))


def read_samples(path: str | Path) -> Outcome:
    """The samples, failures and wall time a `--out` file holds."""
    data = json.loads(Path(path).read_text())
    return Outcome(
        [Sample(**s) for s in data["samples"]],
        [Failure(**f) for f in data.get("failures", [])],
        data["wall_s"],
        data.get("lanes", 0),
    )


def summarize(outcome: Outcome) -> dict:
    """Counts, the most frequent errors, and latency and throughput over the completed
    requests only (None when none completed)."""
    samples = outcome.samples

    def stats(xs: list[float]) -> dict | None:
        if not xs:
            return None
        return {
            "median": statistics.median(xs),
            "mean": statistics.fmean(xs),
            "min": min(xs),
            "max": max(xs),
        }

    total_audio = sum(s.audio_s for s in samples)
    return {
        "requests": len(samples) + len(outcome.failures),
        "completed": len(samples),
        "failed": len(outcome.failures),
        "refused": sum(f.refused for f in outcome.failures),  # of the failed: 429 or 503
        "errors": error_counts([f.error for f in outcome.failures]),
        "ttfp_s": stats([s.ttfp for s in samples]),
        # Each completed request's first audio in prompt order (the order sent at c1): a
        # round's trend shows what its medians hide, e.g. a warm-up that did not reach
        # everything (measured: docs/performance.md, "c1 mean first audio, client", per round).
        "ttfp_ms_each": [round(1e3 * s.ttfp, 3) for s in samples],
        "e2el_s": stats([s.e2el for s in samples]),
        "rtf": stats([s.rtf for s in samples]),
        "underrun_s": stats([s.underrun_s for s in samples]),
        "audio_seconds": total_audio,
        "audio_throughput": total_audio / outcome.wall_s,
        "wall_s": outcome.wall_s,
        # past the opening burst, before the drain (bench/steady.py); None: no such span
        "steady": steady_state(samples, outcome.failures, outcome.lanes),
    }


def error_counts(errors: list[str]) -> list[dict]:
    """The MAX_ERRORS most frequent error texts with their counts (ties: first seen first),
    then the rest together, so the counts add up to the failures."""
    ranked = Counter(errors).most_common()
    out = [{"error": e, "count": n} for e, n in ranked[:MAX_ERRORS]]
    rest = ranked[MAX_ERRORS:]
    if rest:
        out.append({"error": f"({len(rest)} other errors)", "count": sum(n for _, n in rest)})
    return out
