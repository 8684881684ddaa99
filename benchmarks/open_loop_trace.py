"""What the slowest first audios waited for under open-loop arrivals: the pipeline in-process
(no HTTP), seeded Poisson arrivals of the shipped prompts at their natural length, and every
stage step's phases on one clock.

    python -m benchmarks.open_loop_trace --model qwen3_tts_1_7b --platform cuda --rps 20 60 \
        --seconds 20 --out trace.json

Why: the served open-loop runs give first-audio percentiles and the server's mean parts
(queued, steps), not what a slow request met on its way. Here each request keeps its
submission, seat and first-audio times, and every step its phases (`mixed_step` or
`decode_step`: a whole execute; `audio_wait`: the engine waiting for a step's audio; the
runner's inner phases), host times without device syncs. Printed: first audio p50 / p95 / p99
(interpolated, as the served runs'), and for the faster half and the slowest `--slowest`
fraction the mean queued and steps parts and the mean time each stage's phase kind overlapped a
request's wait; each phase kind's count, share of the wall time and length percentiles (with
`--sync-phases`, each phase's own device work); the windows each stage planned, by length,
and ran; and the longest stalls of a zero-buffer player
fed each request's audio as the pipeline made it (`core/player.py`), each with the phases that
overlapped it. `--out` keeps it all.
"""

from __future__ import annotations

import argparse
import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict

from benchmarks.pipeline_args import pipeline_parser, spec_of
from benchmarks.trace_parts import (
    Arrival,
    Phase,
    describe,
    phase_kinds,
    stalled,
    window_delta,
)
from omniflow.bench.arrivals import arrival_times
from omniflow.bench.open_stats import percentiles
from omniflow.bench.prompt_file import DEFAULT_PROMPTS, read_prompt_rows
from omniflow.bench.step_kinds import device_sync
from omniflow.build.pipeline import build_pipeline
from omniflow.config.resolve import build_graph
from omniflow.core.pipeline import Pipeline, WindowCounters
from omniflow.core.player import stalls
from omniflow.core.speech import SpeechRequest


class RecordingTimer:
    """A `PhaseTimer` that keeps every phase's host start and end: without `sync` no device
    synchronisation (the steps keep their own overlap); with it (`--sync-phases`) the device
    is waited for around every phase, so each phase holds its own device work (slower steps:
    for where a step's time goes, not for latencies)."""

    def __init__(self, sync: Callable[[], None] | None = None) -> None:
        self.phases: list[Phase] = []
        self.sync = sync
        self._lock = threading.Lock()

    def clear(self) -> None:
        with self._lock:
            self.phases.clear()

    @contextmanager
    def phase(self, stage: str, name: str) -> Iterator[None]:
        if self.sync is not None:
            self.sync()
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.sync is not None:
                self.sync()
            end = time.perf_counter()
            with self._lock:
                self.phases.append(Phase(stage, name, start, end))


def run(args: argparse.Namespace) -> dict:
    """Each of `args.rps` in turn on one pipeline (built once, warmed by one request)."""
    graph = build_graph(spec_of(args))
    texts = [row.text for row in read_prompt_rows(args.prompts, need_seconds=False)]
    orch = build_pipeline(graph)
    timer = RecordingTimer(device_sync(graph.platform.device) if args.sync_phases else None)
    orch.set_phase_timer(timer)
    orch.start()
    try:
        warm = Arrival(-1)
        orch.submit(SpeechRequest.create(texts[0], request_id="warmup", voice=args.voice), warm)
        if not warm.done.wait(600) or warm.error is not None or warm.first is None:
            raise SystemExit(f"the warm-up request failed: {warm.error or 'no audio in 600 s'}")
        rate = orch.info().sample_rate
        runs = [one_rate(orch, timer, texts, rps, rate, args) for rps in args.rps]
    finally:
        orch.stop()
    return {"command": {k: v for k, v in vars(args).items() if k != "out"}, "rates": runs}


def windows(orch: Pipeline) -> dict[str, WindowCounters]:
    """Each windowed stage's cumulative window counters now."""
    return {st.name: st.windows for st in orch.stats().stages if st.windows is not None}


def one_rate(
    orch: Pipeline,
    timer: RecordingTimer,
    texts: list[str],
    rps: float,
    rate: int,
    args: argparse.Namespace,
) -> dict:
    """Seeded Poisson arrivals at `rps` for `args.seconds`, waited out, then described."""
    timer.clear()
    before = windows(orch)
    arrivals: list[Arrival] = []
    t0 = time.perf_counter()
    for i, at in enumerate(arrival_times(rps, args.seconds, seed=args.seed)):
        delay = t0 + at - time.perf_counter()
        if delay > 0:
            time.sleep(delay)  # the arrival process itself, not a synchronisation
        a = Arrival(i, submitted=time.perf_counter())
        cap = {"max_new_tokens": args.max_frames} if args.max_frames else {}
        speech = SpeechRequest.create(
            texts[i % len(texts)], request_id=f"r{rps}_{i}", voice=args.voice, seed=i, **cap
        )
        orch.submit(speech, a)
        arrivals.append(a)
    for a in arrivals:
        if not a.done.wait(args.seconds + 120):
            raise SystemExit(f"request {a.index} at {rps} req/s did not end")
    wall = time.perf_counter() - t0
    after = windows(orch)
    # a step of the rate before can end after this one began: only this rate's own
    phases = [p for p in timer.phases if p.start >= t0]
    heard = [a for a in arrivals if a.first is not None and a.error is None]
    heard.sort(key=lambda a: a.first - a.submitted)
    ms = [1000 * (a.first - a.submitted) for a in heard]
    slow = heard[int(len(heard) * (1 - args.slowest)) :]
    return {
        "rps": rps,
        "requests": len(arrivals),
        "heard": len(heard),
        "failed": [a.index for a in arrivals if a.error is not None or a.first is None],
        "first_audio_ms": percentiles(ms),  # as the served runs' (None: none heard)
        "faster_half": describe(heard[: len(heard) // 2], phases),
        "slowest": describe(slow, phases),
        "steps": phase_kinds(phases, wall),
        "stalled_requests": sum(
            1 for a in heard if stalls(*zip(*a.chunks, strict=True), bytes_per_second=rate)
        ),
        "stalls": stalled(heard, phases, rate, t0, args.stalls),
        "windows": {name: window_delta(before[name], after[name]) for name in after},
        "arrivals": [
            {"index": a.index, "submitted": a.submitted, "seated": a.seated, "first": a.first}
            for a in arrivals
        ],
        "start": t0,
        "phases": [asdict(p) for p in phases],
    }


def main() -> None:
    ap = pipeline_parser(__doc__)
    ap.add_argument(
        "--rps", type=float, nargs="+", default=[10.0], help="mean arrivals a second, each in turn"
    )
    ap.add_argument("--seconds", type=float, default=20.0, help="how long arrivals come")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompts", default=str(DEFAULT_PROMPTS))
    ap.add_argument("--voice", default="vivian")
    ap.add_argument("--max-frames", type=int, default=0, help="cap per request (0: none)")
    ap.add_argument("--slowest", type=float, default=0.05, help="the fraction described")
    ap.add_argument("--stalls", type=int, default=10, help="how many stalls to describe")
    ap.add_argument(
        "--sync-phases",
        action="store_true",
        help="wait for the device around every phase: where a step's time goes, slower steps",
    )
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if not 0 < args.slowest < 1:
        ap.error(f"--slowest must be between 0 and 1, got {args.slowest}")
    result = run(args)
    keys = ("rps", "requests", "heard", "failed", "first_audio_ms", "stalled_requests")
    for one in result["rates"]:
        print(json.dumps({k: one[k] for k in keys}))
        print("faster half:", json.dumps(one["faster_half"]))
        print("slowest:", json.dumps(one["slowest"]))
        for key, kind in one["steps"].items():
            print(f"{key}:", json.dumps(kind))
        for name, counts in one["windows"].items():
            print(f"{name} windows:", json.dumps(counts))
        for stall in one["stalls"]:
            print("stall:", json.dumps(stall))
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
