"""Open-loop HTTP load generator for `/v1/audio/speech` (`omniflow bench bench.rps=R`).

    python -m omniflow.bench.open_client --url http://127.0.0.1:8000 --rps 2 \
        --duration-s 30 --warmup-s 5

Requests arrive when they arrive: at seeded Poisson times (or one every 1/rps s with
`--arrivals constant`, bench/arrivals.py) from the run's start to warm-up + duration, each
sent at its time whether or not earlier ones have ended. Those that arrive in the first
`--warmup-s` seconds are sent but not counted; those of the next `--duration-s` are measured.
Each takes the next text of the prompt set (in file order, from the first, wrapping) at its
natural length: no `max_new_tokens` unless `--max-frames` caps it, EOS honoured, so the
model decides the length (dummy weights: the text's speaking-rate estimate, README.md).
Each streams raw PCM (`stream: true`, `response_format: "pcm"`) as a client does.

Per request: first audio (sending -> the first non-empty audio bytes), e2e (-> end of
stream), and the stalls of a zero-buffer player that starts at first audio (core/player.py).
A 429 or 503 is `rejected`; a transport error, another status, or a stream without whole
16-bit audio is `failed`; a measured request still running `--drain-s` after the window
closes is aborted and `failed`. None is retried.

Like the closed-loop client (bench/client.py), each request in flight has its own
single-connection httpx client (a free list of them, reused with keep-alive): a pool shared by
many requests saturated the load generator's core (docs/performance.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import httpx
from tqdm import tqdm

from omniflow.bench.arrivals import KINDS, arrival_times
from omniflow.bench.client import BYTES_PER_FRAME, DEFAULT_PROMPTS, error_counts, lane_client
from omniflow.bench.mode import Plan
from omniflow.core.player import BYTES_PER_SECOND, stalls

REJECTED = (429, 503)
"""Statuses of a server refusing load (too many in flight; shutting down or a stage down)."""

Outcome = Literal["ok", "rejected", "failed"]


@dataclass(frozen=True)
class Request:
    """One arrival, on the run's clock (seconds from its start)."""

    index: int
    arrival_s: float
    """When it was due (its arrival time)."""
    sent_s: float
    """When it was sent (later than arrival_s by the load generator's lag)."""
    ended_s: float
    """When its stream ended, or it failed."""
    counted: bool
    """It arrived in the measured window."""
    outcome: Outcome
    error: str | None
    first_audio_s: float | None
    """Sending -> the first non-empty audio bytes (None: no audio came)."""
    e2e_s: float
    """Sending -> the end of its stream (or its failure)."""
    audio_bytes: int
    window_bytes: int
    """Of its audio bytes, those received inside the measured window."""
    stalls: int
    stall_s: float
    """The player's stalls: how many, their total and the largest."""
    largest_stall_s: float
    chunks: tuple[tuple[float, int], ...] = ()
    """Every audio chunk as (seconds since sending, bytes): where first audio and stalls
    came from (the `--out` file's timeline)."""


@dataclass
class _Trace:
    """A request as it goes: what a record is made of, also when it is aborted."""

    index: int
    arrival_s: float
    sent: float = 0.0  # perf_counter
    times: list[float] = field(default_factory=list)
    sizes: list[int] = field(default_factory=list)


def load_texts(path: str | Path) -> list[str]:
    """The `text` of every row of a JSONL prompt file, in order."""
    with open(path) as f:
        texts = [json.loads(line)["text"] for line in f if line.strip()]
    if not texts:
        raise ValueError(f"{path} holds no prompts")
    return texts


def body(text: str, index: int, model: str, voice: str, max_frames: int) -> dict[str, Any]:
    """What a streaming client sends: the text at its natural length (capped when asked)."""
    out: dict[str, Any] = {
        "model": model,
        "voice": voice,
        "input": text,
        "response_format": "pcm",
        "stream": True,
        "seed": 1000 + index,
    }
    if max_frames:
        out["max_new_tokens"] = max_frames
    return out


def record(
    trace: _Trace,
    t0: float,
    end: float,
    plan: Plan,
    outcome: Outcome,
    error: str | None,
) -> Request:
    """The request's record: first audio, e2e and the player's stalls from its timeline."""
    start, stop = plan.window
    first = trace.times[0] - trace.sent if trace.times else None
    played = stalls(trace.times, trace.sizes)
    in_window = sum(
        n for t, n in zip(trace.times, trace.sizes, strict=True) if start <= t - t0 < stop
    )
    return Request(
        index=trace.index,
        arrival_s=trace.arrival_s,
        sent_s=trace.sent - t0,
        ended_s=end - t0,
        counted=start <= trace.arrival_s < stop,
        outcome=outcome,
        error=None if error is None else error[:300],
        first_audio_s=first,
        e2e_s=end - trace.sent,
        audio_bytes=sum(trace.sizes),
        window_bytes=in_window,
        stalls=len(played),
        stall_s=sum(s.length_s for s in played),
        largest_stall_s=max((s.length_s for s in played), default=0.0),
        chunks=tuple(
            (round(t - trace.sent, 6), n) for t, n in zip(trace.times, trace.sizes, strict=True)
        ),
    )


async def send(
    client: httpx.AsyncClient, url: str, payload: dict[str, Any], trace: _Trace
) -> tuple[Outcome, str | None]:
    """Send one request and read its stream into `trace`; its outcome and error text."""
    trace.sent = time.perf_counter()
    try:
        async with client.stream("POST", url + "/v1/audio/speech", json=payload) as r:
            if r.status_code != 200:
                text = f"HTTP {r.status_code}: {(await r.aread())[:200]!r}"
                return ("rejected" if r.status_code in REJECTED else "failed"), text
            async for chunk in r.aiter_bytes():
                if chunk:
                    trace.times.append(time.perf_counter())
                    trace.sizes.append(len(chunk))
    except httpx.HTTPError as exc:  # transport (a dropped connection, a timeout) or decoding
        return "failed", f"{type(exc).__name__}: {str(exc) or '(no message)'}"
    size = sum(trace.sizes)
    if size == 0:
        return "failed", "no audio: a 200 stream ended empty"
    if size % 2:
        return "failed", f"not whole 16-bit samples: {size} bytes"
    return "ok", None


async def run(
    url: str,
    texts: Sequence[str],
    plan: Plan,
    model: str,
    voice: str,
    max_frames: int = 0,
) -> list[Request]:
    """Every arrival of the plan, sent at its time; their records, in arrival order."""
    times = arrival_times(plan.rps, plan.window[1], plan.arrivals, plan.seed)
    tls = ssl.create_default_context()  # built once for every client
    idle: list[httpx.AsyncClient] = []
    made: list[httpx.AsyncClient] = []
    records: list[Request | None] = [None] * len(times)
    in_flight = 0
    bar = tqdm(total=len(times), desc="open loop: warm-up", unit=" req", leave=False)
    t0 = time.perf_counter()

    async def one(i: int, at: float) -> None:
        nonlocal in_flight
        if idle:
            client = idle.pop()
        else:
            client = lane_client(tls)
            made.append(client)
        trace = _Trace(i, at)
        payload = body(texts[i % len(texts)], i, model, voice, max_frames)
        outcome: Outcome = "failed"
        error: str | None = "the load generator stopped before it ended"
        in_flight += 1
        try:
            outcome, error = await send(client, url, payload, trace)
            idle.append(client)  # its connection is whole: the next request may reuse it
        except asyncio.CancelledError:  # still running when the drain ended
            outcome = "failed"
            error = f"aborted: still running {plan.drain_s:g} s after the measured window closed"
            raise
        finally:
            in_flight -= 1
            if not trace.sent:  # cancelled before it was sent
                trace.sent = time.perf_counter()
            records[i] = record(trace, t0, time.perf_counter(), plan, outcome, error)
            bar.update(1)
            bar.set_postfix(in_flight=in_flight, refresh=False)

    tasks: list[asyncio.Task[None]] = []
    try:
        for i, at in enumerate(times):
            delay = t0 + at - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            if at >= plan.warmup_s and bar.desc.endswith("warm-up"):
                bar.set_description("open loop: measured")
            tasks.append(asyncio.create_task(one(i, at)))
        bar.set_description("open loop: drain")
        deadline = t0 + plan.window[1] + plan.drain_s
        if tasks:
            _, pending = await asyncio.wait(tasks, timeout=max(0.0, deadline - time.perf_counter()))
            for task in pending:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
    finally:
        bar.close()
        for client in made:
            await client.aclose()
    return [r for r in records if r is not None]


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
    return {
        "rps": plan.rps,
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
        "first_audio_ms": {
            k: (None if v is None else ms * v)
            for k, v in percentiles([r.first_audio_s for r in ok if r.first_audio_s]).items()
        },
        "e2e_ms": {
            k: (None if v is None else ms * v)
            for k, v in percentiles([r.e2e_s for r in ok]).items()
        },
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--prompts", default=str(DEFAULT_PROMPTS))
    ap.add_argument("--rps", type=float, required=True, help="requests arriving per second")
    ap.add_argument("--arrivals", choices=KINDS, default="poisson")
    ap.add_argument("--duration-s", type=float, default=60.0, help="measured seconds")
    ap.add_argument("--warmup-s", type=float, default=10.0, help="seconds sent, not counted")
    ap.add_argument("--seed", type=int, default=0, help="seed of the arrival times")
    ap.add_argument("--drain-s", type=float, default=120.0)
    ap.add_argument("--max-frames", type=int, default=0, help="cap per request (0: none)")
    ap.add_argument("--model", default="qwen3-tts-tiny")
    ap.add_argument("--voice", default="vivian")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.rps <= 0 or args.duration_s <= 0 or args.warmup_s < 0 or args.drain_s <= 0:
        ap.error("--rps, --duration-s and --drain-s must be positive, --warmup-s at least 0")
    plan = Plan(args.rps, args.arrivals, args.duration_s, args.warmup_s, args.seed, args.drain_s)
    texts = load_texts(args.prompts)
    requests = asyncio.run(run(args.url, texts, plan, args.model, args.voice, args.max_frames))
    if args.out:
        write_requests(args.out, plan, requests)
    summary = summarize(requests, plan)
    print(json.dumps(summary, indent=2))
    if summary["failed"] or summary["rejected"]:
        print(
            f"{summary['rejected']} rejected and {summary['failed']} failed of "
            f"{summary['requests']} measured requests",
            file=sys.stderr,
        )


if __name__ == "__main__":
    main()
