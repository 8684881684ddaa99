"""Engine-level per-step breakdown: ms per decode step for the forward, the frame sampling
(code predictor included), the audio decode and the whole engine step.

    python -m benchmarks.talker_baseline --model qwen3_tts_1_7b --platform cuda \
        --pipeline qwen3_tts_fused --batch 1 32 --frames 100 --out result.json

Builds the pipeline with the normal builder (`build_pipeline`), installs a timing hook
(`Orchestrator.set_phase_timer`; on CUDA it synchronises the device around each phase, so
phases are exact but the step is a little slower than untimed) and runs `batch` fixed-length
requests (dummy weights, EOS ignored) through the started pipeline. `decode_step` counts only
steps in which every request computes its next frame (`mixed_step`: the others); `forward`,
`sample` and `audio` are per call and include a mixed step's decode rows; `readback` is the
host waiting for a step's codes (with the device synchronised around each phase, little more
than the copy); `prefill` is a mixed step's prefill forward (its layers; the prompt
graph's replay where one serves it), `prefill_embed` the prompt's embedding before it,
`prefill_layout` the host building its inputs; `audio_wait` the wait for a step's audio.
The result's `prefills` counts the stage's prefill forwards and how many ran on the prompt
graphs (the rest eagerly).
With windows (`window_k`, recorded in the result; the fused pipeline's default on CUDA is 8)
a `decode_step` is one window of up to K
frames and `audio` one window's decoder pass: add `pipeline.stages.talker.window_k=0` for
per-frame figures.

`--requests N` (more than the batch) keeps `batch` requests in flight until N have ended,
each new one submitted as one ends, with the shipped LibriSpeech texts: the steady state of a
busy server, where most steps are mixed, measured without HTTP. With `--frames 0` each
request is its prompt's natural length: requests of one length end together and the next
ones arrive in a wave, natural lengths spread the arrivals out as served traffic does.

    python -m benchmarks.talker_baseline --model qwen3_tts_1_7b --platform cuda \
        --batch 128 --requests 512 --frames 50 pipeline.stages.talker.scheduler.max_num_seqs=128

A batch larger than the stage's `scheduler.max_num_seqs` is refused: the scheduler would run
only that many rows per step, and the figures would be for a smaller batch than asked.

`--profile PREFIX` writes PREFIX.b<batch>.txt per batch size: the GPU kernels summed by
category (matmul, attention, norm/rotary, sampling, convolution, elementwise, copy), with
launches and milliseconds per engine step (`benchmarks.kernel_categories`), then torch's kernel
and host-op tables. (The profiler slows the steps; read it for where the time goes, not for
the step time.)
"""

from __future__ import annotations

import argparse
import gzip
import json
import queue
import statistics
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import torch

from benchmarks.kernel_categories import category_table, kernel_rows
from benchmarks.timeline import RangeTimer, load_trace, summarize, timeline_profiler
from omniflow.bench.client import DEFAULT_PROMPTS, Prompt, load_prompts
from omniflow.bench.job import ar_stage
from omniflow.bench.stage_counts import prefills_since, stage_prefills
from omniflow.bench.step_kinds import StepKindTimer, device_sync
from omniflow.build.pipeline import build_pipeline
from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from omniflow.core.events import AudioEvent
from omniflow.core.speech import SpeechRequest
from omniflow.provenance import commit


class BatchTooLarge(ValueError):
    """The batch asked for is above the stage's `max_num_seqs`: the scheduler would run
    smaller steps than the figures claim."""


def summary(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {"n": 0}
    return {
        "mean": statistics.fmean(xs),
        "median": statistics.median(xs),
        # Interpolated: the index rounded down gave the minimum for two values.
        "p90": statistics.quantiles(xs, n=10, method="inclusive")[-1] if len(xs) > 1 else xs[0],
        "n": len(xs),
    }


def engine_steps(timer: StepKindTimer) -> int:
    """Steps the busiest stage ran (decode and mixed): what a profile is divided by."""
    counts = [
        sum(len(p.get(kind, [])) for kind in ("decode_step", "mixed_step"))
        for p in timer.seconds.values()
    ]
    return max(counts, default=0)


def kernel_profiler(device: str) -> torch.profiler.profile:
    """A profiler of host ops and (on CUDA) every kernel, graph replays included."""
    acts = [torch.profiler.ProfilerActivity.CPU]
    if device.startswith("cuda"):
        acts.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(activities=acts)


def write_kernel_table(prof: torch.profiler.profile, path: str, steps: int) -> None:
    """The kernels by category per step (`benchmarks.kernel_categories`), then the ops and kernels
    by device time (then host time), with call counts: which kernels a step launches, how
    many, and what they cost."""
    avg = prof.key_averages()
    with open(path, "w") as f:
        f.write(category_table(kernel_rows(avg), steps))
        f.write("\n")
        for key in ("cuda_time_total", "cpu_time_total"):
            f.write(avg.table(sort_by=key, row_limit=60, max_name_column_width=90))
            f.write("\n")


def run_batch(
    model: str,
    platform: str,
    pipeline: str,
    batch: int,
    frames: int,
    profile: str | None = None,
    overrides: tuple[str, ...] = (),
    requests: int = 0,
    timeline: str | None = None,
    timeline_span: tuple[int, int] = (0, 0),
) -> dict[str, Any]:
    graph = build_graph(
        compose(
            [f"pipeline={pipeline}", f"model={model}", f"platform={platform}"]
            + ["pipeline.runtime=in_process", *overrides]  # its timer hooks this process's steps
        )
    )
    stage = ar_stage(graph)
    rows = stage.scheduler.max_num_seqs
    if batch > rows:
        key = f"pipeline.stages.{stage.name}.scheduler.max_num_seqs"
        raise BatchTooLarge(
            f"--batch {batch} exceeds {key}={rows}: a step would run at most {rows} rows. "
            f"Pass {key}={batch} (and enough KV blocks) as an override."
        )
    total = max(requests, batch)
    t0 = time.perf_counter()
    orch = build_pipeline(graph)
    build_s = time.perf_counter() - t0
    timer = StepKindTimer(device_sync(graph.platform.device))  # every phase, synchronised
    # A timeline marks the phases as profiler ranges instead, synchronising nothing.
    orch.set_phase_timer(RangeTimer() if timeline else timer)
    ends: queue.Queue[AudioEvent] = queue.Queue()
    prof = None
    if profile:
        prof = kernel_profiler(graph.platform.device)
    elif timeline:
        prof = timeline_profiler(graph.platform.device)
    # The timeline's span: from the request that ends `first`, `count` more (0: to the end).
    first, count = timeline_span if timeline else (0, 0)
    last = first + count if count else None
    recording = False
    orch.start()
    try:
        if prof is not None and first == 0:
            prof.start()
            recording = True
        prompts = (
            load_prompts(DEFAULT_PROMPTS, total)
            if requests
            else [Prompt(f"Benchmark sentence number {i}.", frames) for i in range(total)]
        )

        def submit(i: int) -> None:
            prompt = prompts[i % len(prompts)]
            speech = SpeechRequest.create(
                prompt.text,
                request_id=f"r{i}",
                voice="vivian",
                seed=i,
                max_new_tokens=frames or prompt.frames,  # 0: the prompt's natural length
                ignore_eos=True,
            )
            orch.submit(speech, lambda ev: ev.finished and ends.put(ev))

        for i in range(batch):
            submit(i)
        errors = []
        for done in range(total):
            event = ends.get(timeout=600)
            if event.error:
                errors.append(event.error)
            # the span's edges before the next arrival, so that its admitting step is in
            if prof is not None and not recording and done + 1 == first:
                prof.start()
                recording = True
            elif recording and done + 1 == last:
                prof.stop()
                recording = False
            if done + batch < total:  # one ends, the next arrives: `batch` stay in flight
                submit(done + batch)
        prefills = prefills_since(None, stage_prefills(orch.stats(), stage.name))
    finally:
        if recording:
            prof.stop()
        orch.stop()
    if prof is not None and profile:
        write_kernel_table(prof, f"{profile}.b{batch}.txt", engine_steps(timer))
    summary_of_trace = None
    if prof is not None and timeline:
        trace = Path(f"{timeline}.b{batch}.json")
        prof.export_chrome_trace(str(trace))
        summary_of_trace = summarize(load_trace(trace))
        Path(f"{trace}.gz").write_bytes(gzip.compress(trace.read_bytes()))
        trace.unlink()
    info = orch.info()
    phases: dict[str, Any] = {}
    for stage, names in sorted(timer.seconds.items()):
        for name, xs in sorted(names.items()):
            phases[f"{stage}.{name}"] = summary([1e3 * x for x in xs])
    return {
        "model": model,
        "pipeline": pipeline,
        "stages": info.stages,
        "platform": graph.platform.name,
        "dtype": graph.platform.dtype,
        "codec_dtype": graph.platform.codec_dtype,
        "window_k": {name: s.window_k for name, s in graph.stages.items()},
        "batch": batch,
        "requests": total,
        "frames_per_request": frames or "natural",
        "overrides": list(overrides),
        "errors": errors,
        "build_s": build_s,
        "phases_ms": phases,
        "prefills": prefills,
        "timeline": summary_of_trace,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="qwen3_tts_1_7b")
    ap.add_argument("--platform", default="auto")
    ap.add_argument("--pipeline", default="qwen3_tts_fused")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    ap.add_argument(
        "--frames",
        type=int,
        default=100,
        help="frames per request; 0 with --requests: each prompt's natural length (arrivals "
        "spread out as requests of different lengths end, as a served bench's are)",
    )
    ap.add_argument(
        "--requests",
        type=int,
        default=0,
        help="requests in all per batch size, `batch` in flight (LibriSpeech texts); a batch "
        "at least this large, or 0: one burst of `batch`",
    )
    ap.add_argument("--out", default=None)
    ap.add_argument(
        "--profile", default=None, help="path prefix: write a kernel table per batch size"
    )
    ap.add_argument(
        "--timeline",
        default=None,
        help="path prefix: profile without device syncs, write PREFIX.b<batch>.json.gz (a "
        "chrome trace with the phases as ranges) and add its summary (benchmarks.timeline); "
        "phases_ms is then empty (nothing is synchronised to time them)",
    )
    ap.add_argument(
        "--timeline-span",
        type=int,
        nargs=2,
        default=(0, 0),
        metavar=("FROM", "COUNT"),
        help="with --timeline: record from the FROMth ended request for COUNT more (0: to "
        "the end); a busy steady state without the ramp, in a trace small enough to read",
    )
    ap.add_argument(
        "overrides", nargs="*", help="further config overrides, e.g. model.codec_dtype=bfloat16"
    )
    args = ap.parse_args()
    if args.profile and args.timeline:
        ap.error("--profile synchronises every phase, --timeline none: pass one of them")
    if args.requests < 0 or 0 < args.requests < min(args.batch):
        ap.error(f"--requests {args.requests}: 0 (one burst) or at least the smallest --batch")
    span_from, span_count = args.timeline_span
    if (span_from or span_count) and not args.timeline:
        ap.error("--timeline-span needs --timeline (it bounds the timeline's recording)")
    if min(span_from, span_count) < 0 or span_from >= max(args.requests, min(args.batch)):
        ap.error("--timeline-span FROM COUNT: both at least 0, FROM below the requests run")
    if args.frames < 0 or (args.frames == 0 and not args.requests):
        ap.error(f"--frames {args.frames}: at least 1, or 0 (natural lengths) with --requests")
    tree = commit()  # OMNIFLOW_COMMIT on a GPU machine's copy of the tree (no .git)
    results = []
    for b in args.batch:
        try:
            r = run_batch(
                args.model,
                args.platform,
                args.pipeline,
                b,
                args.frames,
                args.profile,
                tuple(args.overrides),
                args.requests,
                args.timeline,
                tuple(args.timeline_span),
            )
        except BatchTooLarge as exc:
            ap.error(str(exc))
        r["commit"] = tree
        r["date"] = datetime.now(UTC).isoformat(timespec="seconds")
        if torch.cuda.is_available():
            r["device_name"] = torch.cuda.get_device_name()
        print(json.dumps(r), flush=True)
        results.append(r)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
