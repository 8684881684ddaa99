"""Offline pipeline benchmark: the orchestrator without HTTP, fixed-length requests.

    python -m benchmarks.offline --model qwen3_tts_1_7b --platform cuda \
        --pipelines qwen3_tts_fused qwen3_tts --concurrency 1 8 --frames 100 --out r.json

Per configuration: one warm-up request, then `concurrency` requests submitted together;
reports median time to first audio, median end-to-end time, median RTF (e2e / audio
seconds) and audio throughput (audio seconds / wall seconds), and checks every request got
exactly frames x 1,920 samples.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time
from dataclasses import dataclass, field

from omniflow.build.pipeline import build_pipeline
from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from omniflow.core.events import AudioEvent
from omniflow.core.speech import SpeechRequest
from omniflow.engine.orchestrator import Orchestrator


@dataclass
class Tracker:
    t0: float
    done: threading.Event = field(default_factory=threading.Event)
    samples: int = 0
    first: float | None = None
    end: float = 0.0
    error: str | None = None

    def __call__(self, ev: AudioEvent) -> None:
        if ev.pcm is not None:
            self.samples += ev.pcm.size
            if self.first is None:
                self.first = time.perf_counter() - self.t0
        if ev.finished:
            self.end = time.perf_counter() - self.t0
            self.error = ev.error
            self.done.set()


def submit(orch: Orchestrator, rid: str, seed: int, frames: int) -> Tracker:
    tracker = Tracker(time.perf_counter())
    orch.submit(
        SpeechRequest.create(
            "A benchmark sentence for the pipeline.",
            request_id=rid,
            voice="vivian",
            seed=seed,
            max_new_tokens=frames,
            ignore_eos=True,
        ),
        tracker,
    )
    return tracker


def measure(
    model: str,
    platform: str,
    pipeline: str,
    concurrency: int,
    frames: int,
    overrides: list[str] | None = None,
) -> dict:
    base = [f"pipeline={pipeline}", f"platform={platform}", f"model={model}"]
    base.append("pipeline.runtime=in_process")  # offline: no server to share a lock with
    graph = build_graph(compose(base + list(overrides or [])))
    orch = build_pipeline(graph)
    sr = orch.info().sample_rate
    orch.start()
    try:
        submit(orch, "warmup", 0, frames).done.wait(600)
        t0 = time.perf_counter()
        runs = [submit(orch, f"r{i}", i, frames) for i in range(concurrency)]
        for r in runs:
            r.done.wait(1800)
        wall = time.perf_counter() - t0
    finally:
        orch.stop()
    return {
        "model": model,
        "pipeline": pipeline,
        "platform": graph.platform.name,
        "window_k": {name: s.window_k for name, s in graph.stages.items()},
        "concurrency": concurrency,
        "overrides": list(overrides or []),
        "frames": frames,
        "errors": [r.error for r in runs if r.error],
        "samples_ok": all(r.samples == frames * 1920 for r in runs),
        "ttfp_median_s": statistics.median(r.first or r.end for r in runs),
        "e2e_median_s": statistics.median(r.end for r in runs),
        "rtf_median": statistics.median(r.end / max(r.samples / sr, 1e-9) for r in runs),
        "audio_throughput": sum(r.samples for r in runs) / sr / wall,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="qwen3_tts_tiny")
    ap.add_argument("--platform", default="auto")
    ap.add_argument("--pipelines", nargs="+", default=["qwen3_tts_fused", "qwen3_tts"])
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--frames", type=int, default=100)
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--override",
        action="append",
        default=[],
        help="a Hydra override for every run, e.g. pipeline.stages.talker.window_k=12",
    )
    args = ap.parse_args()
    results = []
    for p in args.pipelines:
        for c in args.concurrency:
            r = measure(args.model, args.platform, p, c, args.frames, args.override)
            print(json.dumps(r), flush=True)
            results.append(r)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
