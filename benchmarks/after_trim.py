"""What does a request pay for arriving just after its process gave its free heap back?

    python -m benchmarks.after_trim --model qwen3_tts_1_7b --platform cuda --pairs 40

Why: a process that has gone idle returns glibc's free heap with `malloc_trim(0)`
(`core/heap.py` `IdleRelease`), and the next request touches fresh pages again as it
allocates: page faults on its first step, the step its first audio waits for. How long a
process waits idle before trimming is set by that cost against the resident memory it saves
(docs/performance.md). The pipeline runs in this process (no HTTP); requests go one at a
time, each after a short pause, in the order none, trim, trim, none, ... (so a linear drift
cancels),
a `trim` request right after a `malloc_trim(0)`; printed: the first audio's median and mean
per kind.
"""

from __future__ import annotations

import json
import queue
import statistics
import time
from collections.abc import Callable

from benchmarks.pipeline_args import pipeline_parser, spec_of
from omniflow.build.pipeline import build_pipeline
from omniflow.config.resolve import build_graph
from omniflow.core.events import AudioEvent
from omniflow.core.heap import malloc_trim
from omniflow.core.pipeline import Pipeline
from omniflow.core.speech import SpeechRequest

TEXT = "The quick brown fox jumps over the lazy dog, and then it rests a while."
PAUSE_S = 0.3
"""Between requests: the engine settles, as a server idles between arrivals."""


def first_audio_s(pipeline: Pipeline, i: int, frames: int) -> float:
    """Seconds from submitting request `i` to its first non-empty PCM."""
    done: queue.SimpleQueue[AudioEvent] = queue.SimpleQueue()
    first: list[float] = []
    start = time.perf_counter()

    def sink(ev: AudioEvent) -> None:
        if not first and ev.pcm is not None and ev.pcm.size:
            first.append(time.perf_counter() - start)
        if ev.finished:
            done.put(ev)

    speech = SpeechRequest.create(
        TEXT, request_id=f"r{i}", voice="vivian", seed=i, max_new_tokens=frames, ignore_eos=True
    )
    pipeline.submit(speech, sink)
    ended = done.get(timeout=600)
    if ended.error or not first:
        raise SystemExit(f"request {i} failed: {ended.error or 'no audio'}")
    return first[0]


def measure(
    pipeline: Pipeline, pairs: int, frames: int, release: Callable[[], object]
) -> dict[str, list[float]]:
    """First audio (ms) of `pairs` requests of each kind, after three warm-up requests."""
    for i in range(3):
        first_audio_s(pipeline, i, frames)
    got: dict[str, list[float]] = {"none": [], "trim": []}
    for i in range(2 * pairs):
        kind = "trim" if i % 4 in (1, 2) else "none"
        time.sleep(PAUSE_S)  # the idle gap itself is what is measured against
        if kind == "trim":
            release()
        got[kind].append(1e3 * first_audio_s(pipeline, 100 + i, frames))
    return got


def main() -> None:
    ap = pipeline_parser(__doc__)
    ap.add_argument("--pairs", type=int, default=40, help="requests of each kind")
    ap.add_argument("--frames", type=int, default=20, help="frames a request")
    ap.add_argument("--out", default=None, help="every first audio as JSON")
    args = ap.parse_args()
    if args.pairs < 1 or args.frames < 1:
        ap.error("--pairs and --frames must each be at least 1")
    release = malloc_trim()
    if release is None:
        ap.error("this C library has no malloc_trim: nothing to measure")
    pipeline = build_pipeline(build_graph(spec_of(args)))
    pipeline.start()
    try:
        got = measure(pipeline, args.pairs, args.frames, release)
    finally:
        pipeline.stop()
    for kind, ms in got.items():
        print(
            f"{kind}: first audio median {statistics.median(ms):.2f} ms, "
            f"mean {statistics.fmean(ms):.2f} ms over {len(ms)}"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "first_audio_ms": got}, f, indent=2)


if __name__ == "__main__":
    main()
