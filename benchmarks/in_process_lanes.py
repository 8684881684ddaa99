"""The served closed-loop round without HTTP: what the engine alone sustains.

    python -m benchmarks.in_process_lanes --model qwen3_tts_1_7b --platform cuda \
        --override experiment=high_concurrency --concurrency 128 --prompts 512 --rounds 2

Why: issue 35 asks whether serving (the HTTP loop sharing the engine's process and GIL)
costs the engine more than 5 % at c128, the bar for moving the engine into a process of its
own. A round here sends the load generator's requests (`omniflow/bench/client.py`: the same
prompts at natural length unless `--max-frames`, lanes, seeds 1000 + i, `ignore_eos`) to the
pipeline in-process, under the server's limits (admission by deadline, flow control with
every PCM event taken at once, the heap frozen after the warm-up as `omniflow serve` does),
and is summarised the same way (`bench/outcome.summarize`: the whole round and its steady
state). Beside served rounds of the same build in one call (`RATES="" CLOSED=128:512
MAX_FRAMES=0 benchmarks/open_loop_runs.sh`), the difference is what HTTP costs.
"""

from __future__ import annotations

import argparse
import gc
import json
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass

from benchmarks.pipeline_args import pipeline_parser, spec_of
from omniflow.bench.client import BYTES_PER_FRAME, Prompt, load_prompts
from omniflow.bench.outcome import Failure, Outcome, Sample, summarize
from omniflow.bench.prompt_file import DEFAULT_PROMPTS, PromptFileError
from omniflow.build.pipeline import build_pipeline
from omniflow.config.resolve import build_graph
from omniflow.core.events import AudioEvent
from omniflow.core.pipeline import Pipeline, PipelineUnavailable, RequestLimits
from omniflow.core.speech import SpeechRequest
from omniflow.serve.run import freeze_heap

SAMPLES_PER_FRAME = BYTES_PER_FRAME // 2


@dataclass
class Lane:
    """One request in flight on a lane: its audio as it arrives, read as the load
    generator's zero-buffer player reads the HTTP body (`client.one`)."""

    index: int
    prompt: Prompt
    sent: float
    """`time.perf_counter` when submitted."""
    done: queue.SimpleQueue[Lane]
    sample_rate: int = 24000
    took: Callable[[int], None] | None = None
    """Told every PCM event's samples, as the server tells the pipeline what it sent."""
    samples: int = 0
    first: float | None = None
    underrun: float = 0.0
    end: float = 0.0
    error: str | None = None

    def __call__(self, ev: AudioEvent) -> None:
        self.take(ev, time.perf_counter() - self.sent)

    def take(self, ev: AudioEvent, now: float) -> None:
        """`ev` arrived `now` seconds after the request was sent."""
        if ev.pcm is not None and ev.pcm.size:
            if self.first is None:
                self.first = now
            self.underrun = max(self.underrun, (now - self.first) - self.samples / self.sample_rate)
            self.samples += ev.pcm.size
            if self.took is not None:
                self.took(ev.pcm.size)
        if ev.finished:
            self.end = now
            self.error = ev.error
            self.done.put(self)

    def result(self, t0: float) -> Sample | Failure:
        """A sample when it ended with all its audio (exactly its frames, as the served
        client asks), else a failure; `t0`: the round's start."""
        want = self.prompt.frames * SAMPLES_PER_FRAME
        sent_s = self.sent - t0
        if self.error is None and self.samples != want:
            kind = "short" if self.samples < want else "long"
            self.error = f"{kind} audio: got {self.samples} of {want} samples"
        if self.error is not None:
            return Failure(self.index, self.error[:300], self.end, sent_s=sent_s)
        audio_s = self.samples / self.sample_rate
        return Sample(self.first or self.end, self.end, audio_s, self.underrun, sent_s=sent_s)


@dataclass(frozen=True)
class Target:
    """The pipeline a round submits to, and what the server would submit with."""

    orch: Pipeline
    limits: RequestLimits
    voice: str
    sample_rate: int


def submit(
    target: Target, rid: str, i: int, p: Prompt, seed: int, done: queue.SimpleQueue[Lane]
) -> Lane:
    """Submit prompt `i` as the load generator would; a refusal (the server's 503 or 4xx)
    ends the lane's request at once, as a failure."""
    lane = Lane(i, p, time.perf_counter(), done, target.sample_rate)
    lane.took = lambda n: target.orch.consumed(rid, n)
    speech = SpeechRequest.create(
        p.text,
        request_id=rid,
        voice=target.voice,
        seed=seed,
        max_new_tokens=p.frames,
        ignore_eos=True,
    )
    try:
        target.orch.submit(speech, lane, target.limits)
    except (PipelineUnavailable, ValueError) as err:  # Overloaded is a PipelineUnavailable
        lane.take(AudioEvent(rid, finished=True, finish_reason="error", error=str(err)), 0.0)
    return lane


def one_round(target: Target, prompts: list[Prompt], concurrency: int, label: str) -> Outcome:
    """Every prompt through `concurrency` lanes, each submitting its next prompt as soon as
    its previous one ended (the lanes share one list, so each prompt goes to one lane)."""
    done: queue.SimpleQueue[Lane] = queue.SimpleQueue()
    lanes = min(concurrency, len(prompts))
    results: list[Sample | Failure | None] = [None] * len(prompts)

    def send(i: int) -> None:
        submit(target, f"{label}-{i}", i, prompts[i], 1000 + i, done)

    t0 = time.perf_counter()
    for i in range(lanes):
        send(i)
    following = iter(range(lanes, len(prompts)))
    for _ in range(len(prompts)):
        ended = done.get(timeout=1800)
        results[ended.index] = ended.result(t0)
        nxt = next(following, None)
        if nxt is not None:
            send(nxt)
    wall = time.perf_counter() - t0
    samples = [r for r in results if isinstance(r, Sample)]
    failures = [r for r in results if isinstance(r, Failure)]
    return Outcome(samples, failures, wall, lanes=lanes)


def run(args: argparse.Namespace) -> list[dict]:
    """Build, warm up with prompt 0 (a failure stops the run), then the rounds' summaries."""
    prompts = load_prompts(args.prompts_file, args.prompts, args.max_frames)  # before the build
    spec = spec_of(args)
    orch = build_pipeline(build_graph(spec))
    limits = RequestLimits(spec.server.max_buffered_audio_s, spec.server.max_first_audio_wait_s)
    target = Target(orch, limits, args.voice, orch.info().sample_rate)
    orch.start()
    try:
        warm: queue.SimpleQueue[Lane] = queue.SimpleQueue()
        submit(target, "warmup", 0, prompts[0], 0, warm)
        failed = warm.get(timeout=1800).result(0.0)
        if isinstance(failed, Failure):
            raise SystemExit(f"the warm-up request failed: {failed.error}")
        freeze_heap()
        rounds = []
        for r in range(args.rounds):
            summary = summarize(one_round(target, prompts, args.concurrency, f"r{r + 1}"))
            steady = summary["steady"] or {}
            print(
                f"round {r + 1}: {summary['completed']} of {summary['requests']} completed, "
                f"{summary['audio_throughput']:.2f} audio-s/s, steady state "
                f"{steady.get('audio_throughput', float('nan')):.2f} "
                f"(mean first audio {1e3 * (steady.get('ttfp_mean_s') or float('nan')):.0f} ms)",
                flush=True,
            )
            rounds.append(summary)
    finally:
        gc.unfreeze()
        orch.stop()
    return rounds


def main() -> None:
    ap = pipeline_parser(__doc__)
    ap.add_argument("--concurrency", type=int, default=128, help="lanes")
    ap.add_argument("--prompts", type=int, default=512, help="prompts a round")
    ap.add_argument("--prompts-file", default=str(DEFAULT_PROMPTS))
    ap.add_argument("--max-frames", type=int, default=0, help="cap per prompt (0: natural)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--voice", default="vivian")
    ap.add_argument("--out", default=None, help="the rounds' summaries as JSON")
    args = ap.parse_args()
    if min(args.concurrency, args.prompts, args.rounds) < 1:
        ap.error("--concurrency, --prompts and --rounds must each be at least 1")
    if args.max_frames < 0:
        ap.error("--max-frames must be 0 (natural length) or more")
    try:
        rounds = run(args)
    except PromptFileError as err:
        ap.error(str(err))
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "rounds": rounds}, f, indent=2)


if __name__ == "__main__":
    main()
