"""How much serving over HTTP slows the engine, without a model: a synthetic pipeline whose
steps mimic a GPU step (GIL-free device time, then a little host Python), served by the real
app to the real load generator.

    python -m benchmarks.serve_overhead --concurrency 128 --window 1 8 --frames 50

Why: on the H200 a 128-row decode step takes 33 ms in the engine alone
(`benchmarks.talker_baseline`; an earlier 15.8 ms was a 32-row step) and a one-prompt mixed step
46 ms, but a served c128 mixed step ~104 ms (docs/performance.md, "128 rows for real"). The
engine thread shares the interpreter
lock with the server's event loop, which handles one audio event per request per step (per
window with `window_k`). Here the model is replaced by `SyntheticPipeline`: each step sleeps
`--device-ms` (the GPU computing; the lock is free, as in a CUDA sync) and does `--host-ms`
of Python work (the engine's host work, holding the lock; a fixed amount of work calibrated
without contention, so a step that loses the lock to the event loop takes longer), split
into `--syncs` parts (each part's wait hands the lock back, as each device sync of a real step
does); every `--window` steps it
emits one event per live request with that many frames of PCM. The same load is first run with
a trivial in-process consumer (no HTTP: the step time the engine would have), then served to
`omniflow.bench.client` in its own process (no warm-up). Reported per case: median and mean
step time with and without HTTP, their ratio (`stretch`), events per second, the server
process's CPU per event (the synthetic engine's host work included), the mean rows per step
(whether the load kept `concurrency` streams going), and the load generator's failures.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from omniflow.bench.client import FRAME_RATE
from omniflow.bench.job import load_in_child
from omniflow.bench.outcome import summarize
from omniflow.config.server import ServerConfig
from omniflow.core.events import AudioEvent
from omniflow.core.pipeline import UNBOUNDED, PipelineInfo, PipelineStats, RequestLimits, StageStats
from omniflow.core.speech import SpeechRequest
from omniflow.serve.run import ServerThread

SAMPLES_PER_FRAME = 1920
INFO = PipelineInfo(
    model="synthetic",
    pipeline="synthetic",
    voices=("vivian",),
    languages=("auto",),
    sample_rate=24000,
    max_new_tokens=4096,
    supports_instructions=False,
    stages=("synthetic",),
)


@dataclass
class _Live:
    sink: Callable[[AudioEvent], None]
    total: int
    frames: int = 0


def python_work(iterations: int) -> int:
    """A fixed amount of pure-Python work that holds the interpreter lock while it runs (the
    engine's host work). Fixed work, not a fixed time: a thread that loses the lock to the
    event loop finishes later, which is the stretch this bench measures (an earlier version
    spun until a deadline, which no contention could lengthen)."""
    x = 0
    for i in range(iterations):
        x ^= i
    return x


def iterations_per_second(sample_s: float = 0.05) -> float:
    """How fast `python_work` runs on this machine without contention (calibrated once, before
    any server or engine thread exists)."""
    n = 10_000
    while True:
        t0 = time.perf_counter()
        python_work(n)
        took = time.perf_counter() - t0
        if took >= sample_s:
            return n / took
        n *= 2


@dataclass
class StepClock:
    """Wall time of every step taken while at least one request was live."""

    seconds: list[float] = field(default_factory=list)


class SyntheticPipeline:
    """The server's `Pipeline` surface over a model-free step loop (see the module doc)."""

    def __init__(
        self, device_s: float, host_s: float, window: int, syncs: int = 1, rate: float = 0.0
    ) -> None:
        """`rate`: `python_work` iterations per second (`iterations_per_second`); host time
        is spent as that fixed work. 0: calibrate here."""
        self.device_s, self.host_s, self.window, self.syncs = device_s, host_s, window, syncs
        self.part_iterations = round(host_s / syncs * (rate or iterations_per_second()))
        self.clock = StepClock()
        self._live: dict[str, _Live] = {}
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="synthetic-engine", daemon=True)
        self._pcm = (0.1 * np.sin(np.arange(SAMPLES_PER_FRAME * window) / 9.0)).astype(np.float32)

    def info(self) -> PipelineInfo:
        return INFO

    def stats(self) -> PipelineStats:
        with self._lock:
            n = len(self._live)
        return PipelineStats(
            in_flight=n, stages=(StageStats(name=INFO.stages[0], alive=True, running=n, waiting=0),)
        )

    def reference_encoder(self) -> None:
        return None

    def set_step_observer(self, observer: Callable[[str, float], None]) -> None:
        """Step times are kept in `clock` instead."""

    def submit(
        self,
        speech: SpeechRequest,
        sink: Callable[[AudioEvent], None],
        limits: RequestLimits = UNBOUNDED,
    ) -> None:
        with self._wake:
            self._live[speech.request_id] = _Live(sink, speech.max_new_tokens or 1)
            self._wake.notify()

    def consumed(self, request_id: str, samples: int) -> None:
        """No backpressure: the synthetic engine never pauses a request."""

    def abort(self, request_id: str, error: str | None = None) -> None:
        with self._lock:
            live = self._live.pop(request_id, None)
        if live is not None:
            reason = "abort" if error is None else "error"
            live.sink(AudioEvent(request_id, finished=True, finish_reason=reason, error=error))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        with self._wake:
            self._stopping = True
            self._wake.notify()
        self._thread.join(timeout=10)

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._live and not self._stopping:
                    self._wake.wait()
                if self._stopping:
                    return
            for _ in range(self.window):
                t0 = time.perf_counter()
                for _ in range(self.syncs):  # device time and host work, in `syncs` parts
                    time.sleep(self.device_s / self.syncs)  # the lock is free, as in a sync
                    python_work(self.part_iterations)  # host Python, holding the lock
                self.clock.seconds.append(time.perf_counter() - t0)
            self._emit()

    def _emit(self) -> None:
        with self._lock:
            live = list(self._live.items())
        for rid, r in live:
            n = min(self.window, r.total - r.frames)
            r.frames += n
            done = r.frames >= r.total
            r.sink(AudioEvent(rid, pcm=self._pcm[: n * SAMPLES_PER_FRAME], frames=r.frames))
            if done:
                with self._lock:
                    self._live.pop(rid, None)
                r.sink(AudioEvent(rid, finished=True, finish_reason="length"))


def offline(pipe: SyntheticPipeline, concurrency: int, frames: int) -> float:
    """All requests submitted at once to a consumer that only waits for the ends: the step
    time without a server. Returns the wall time."""
    ends = threading.Semaphore(0)
    t0 = time.perf_counter()
    for i in range(concurrency):
        speech = SpeechRequest.create(
            "x", request_id=f"o{i}", voice="vivian", max_new_tokens=frames
        )
        pipe.submit(speech, lambda ev: ev.finished and ends.release())
    for _ in range(concurrency):
        ends.acquire()
    return time.perf_counter() - t0


def step_summary(seconds: list[float]) -> dict[str, float]:
    return {
        "step_ms_median": 1e3 * statistics.median(seconds),
        "step_ms_mean": 1e3 * statistics.fmean(seconds),
        "steps": len(seconds),
    }


def run_case(args: argparse.Namespace, window: int) -> dict[str, Any]:
    device_s, host_s = args.device_ms / 1e3, args.host_ms / 1e3
    rate = iterations_per_second()  # once, before any thread competes for the lock
    quiet = SyntheticPipeline(device_s, host_s, window, args.syncs, rate)
    quiet.start()
    try:
        offline(quiet, args.concurrency, args.frames)
    finally:
        quiet.stop()
    base = step_summary(quiet.clock.seconds)

    pipe = SyntheticPipeline(device_s, host_s, window, args.syncs, rate)
    with tempfile.TemporaryDirectory(prefix="omniflow-overhead-") as tmp:
        prompts = Path(tmp) / "prompts.jsonl"
        row = json.dumps({"text": "A synthetic request.", "seconds": args.frames / FRAME_RATE})
        prompts.write_text((row + "\n") * args.num_prompts)
        with ServerThread(pipe, ServerConfig()) as server:
            client = [
                f"--url={server.url}",
                f"--prompts={prompts}",
                f"--num-prompts={args.num_prompts}",
                f"--max-frames={args.frames}",
                f"--concurrency={args.concurrency}",
                "--warmup=0",
                f"--model={INFO.model}",
                "--voice=vivian",
            ]
            pipe.clock.seconds.clear()
            cpu0 = resource.getrusage(resource.RUSAGE_SELF)
            outcome = load_in_child(client)
            cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    served = step_summary(pipe.clock.seconds)
    cpu_s = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    events = args.num_prompts * -(-args.frames // window)
    summary = summarize(outcome)
    return {
        "window": window,
        "no_http": base,
        "http": served,
        "stretch": served["step_ms_mean"] / base["step_ms_mean"],
        "events_per_s": events / outcome.wall_s,
        "server_cpu_us_per_event": 1e6 * cpu_s / events,
        "audio_throughput": summary["audio_throughput"],
        "failed": summary["failed"],
        "errors": summary["errors"],
        "mean_rows_per_step": args.num_prompts * args.frames / max(1, served["steps"]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--concurrency", type=int, default=128)
    ap.add_argument("--num-prompts", type=int, default=128)
    ap.add_argument("--frames", type=int, default=50)
    ap.add_argument("--window", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--device-ms", type=float, default=14.0, help="GIL-free time per step")
    ap.add_argument("--host-ms", type=float, default=1.0, help="Python time per step")
    ap.add_argument(
        "--syncs", type=int, default=1, help="device waits per step (each hands the lock back)"
    )
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    results = []
    for window in args.window:
        r = run_case(args, window)
        print(json.dumps(r), flush=True)
        results.append(r)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=2)


if __name__ == "__main__":
    main()
