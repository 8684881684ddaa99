"""The `open_loop` object of result.json from an open-loop run's records (either transport),
and the `--out` file that keeps every record: counts, first audio, stalls, the load and the
audio delivered in the measured window; over WebSocket also the last audio after input.done.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from omniflow.bench.client import BYTES_PER_FRAME
from omniflow.bench.mode import Plan
from omniflow.bench.open_run import Request
from omniflow.bench.outcome import error_counts
from omniflow.core.player import BYTES_PER_SECOND


def percentiles(xs: Sequence[float]) -> dict[str, float | None]:
    """p50, p95 and p99 by linear interpolation between the sorted values (None: no values)."""
    ys = sorted(xs)

    def at(q: float) -> float | None:
        if not ys:
            return None
        pos = q * (len(ys) - 1)
        lo = int(pos)
        hi = min(lo + 1, len(ys) - 1)
        return ys[lo] + (ys[hi] - ys[lo]) * (pos - lo)

    return {"p50": at(0.50), "p95": at(0.95), "p99": at(0.99)}


def peak_in_flight(spans: Sequence[tuple[float, float]], start: float, end: float) -> int:
    """The most (sent, ended) spans open at once at any time in [start, end]; a span is open
    from its start up to, not including, its end."""
    events = []
    for s, e in spans:
        if e <= start or s > end:  # over before the region, or begun after it
            continue
        events += [(max(s, start), 1), (e, -1)]  # open across `start`: counted from it on
    events.sort()  # at equal times an end (-1) before a start: back to back is not overlap
    peak = now = 0
    for _, step in events:
        now += step
        peak = max(peak, now)
    return peak


def summarize(requests: Sequence[Request], plan: Plan) -> dict[str, Any]:
    """The `open_loop` object of result.json: the measured requests' counts, first audio,
    stalls, the load and the audio delivered in the window."""
    counted = [r for r in requests if r.counted]
    ok = [r for r in counted if r.outcome == "ok"]
    rejected = [r for r in counted if r.outcome == "rejected"]
    failed = [r for r in counted if r.outcome == "failed"]
    stalled = [r for r in ok if r.stalls]
    start, stop = plan.window
    last_end = max((r.ended_s for r in counted), default=stop)
    ms = 1e3
    out = {
        "rps": plan.rps,
        "transport": plan.transport,
        "arrivals": plan.arrivals,
        "seed": plan.seed,
        "warmup_s": plan.warmup_s,
        "duration_s": plan.duration_s,
        "requests": len(counted),
        "arrival_rps": len(counted) / plan.duration_s,
        "succeeded": len(ok),
        "rejected": len(rejected),
        "failed": len(failed),
        "errors": error_counts([r.error or "" for r in rejected + failed]),
        "first_audio_ms": _ms(percentiles([r.first_audio_s for r in ok if r.first_audio_s])),
        "e2e_ms": _ms(percentiles([r.e2e_s for r in ok])),
        "underrun_requests": len(stalled),
        "underrun_fraction": len(stalled) / len(ok) if ok else None,
        "stall_ms": {
            "total": ms * sum(r.stall_s for r in ok),
            "largest": ms * max((r.largest_stall_s for r in ok), default=0.0),
        },
        "peak_in_flight": peak_in_flight(
            [(r.sent_s, r.ended_s) for r in requests], start, last_end
        ),
        "delivered_audio_s_per_s": sum(r.window_bytes for r in requests)
        / BYTES_PER_SECOND
        / plan.duration_s,
        "audio_s": sum(r.audio_bytes for r in ok) / BYTES_PER_SECOND,
        "frames_per_request": _per_request_frames(ok),
        "send_lag_ms_max": ms * max((r.sent_s - r.arrival_s for r in requests), default=0.0),
    }
    if plan.transport == "http":  # sending -> the refusal's answer: past capacity, at once
        out["rejected_ms"] = _ms(percentiles([r.e2e_s for r in rejected]))
    # (over WebSocket a session is timed from its first word, and a refusal can come before)
    if plan.transport == "websocket":  # the text's pace, and what the model took after it
        after = [r.after_done_s for r in ok if r.after_done_s is not None]
        out["word_interval_ms"] = plan.word_interval_ms
        out["last_audio_after_done_ms"] = _ms(percentiles(after))
    return out


def _ms(p: dict[str, float | None]) -> dict[str, float | None]:
    return {k: (None if v is None else 1e3 * v) for k, v in p.items()}


def _per_request_frames(ok: Sequence[Request]) -> dict[str, float] | None:
    """The measured requests' lengths in codec frames: natural lengths, so they vary."""
    if not ok:
        return None
    frames = [r.audio_bytes / BYTES_PER_FRAME for r in ok]
    return {"min": min(frames), "mean": sum(frames) / len(frames), "max": max(frames)}


def write_requests(path: str | Path, plan: Plan, requests: Sequence[Request]) -> None:
    """The `--out` file: the plan and every request's record."""
    data = {"plan": asdict(plan), "requests": [asdict(r) for r in requests]}
    Path(path).write_text(json.dumps(data, indent=1))


def read_requests(path: str | Path) -> tuple[Plan, list[Request]]:
    data = json.loads(Path(path).read_text())
    requests = [
        Request(**(r | {"chunks": tuple((t, n) for t, n in r.get("chunks", ()))}))
        for r in data["requests"]
    ]
    return Plan(**data["plan"]), requests
