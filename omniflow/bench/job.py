"""One benchmark job: serve the configured pipeline on loopback, load it over HTTP with the
shipped prompts in fixed-length mode, and write one result JSON (docs/performance.md).

The load generator (`omniflow.bench.client`) runs as its own process, as a real client does.
In the server's process it would share the interpreter lock with the engine thread and the
server's event loop, and its own per-chunk work would slow every decode step it measures.

Requests that fail are data, not the end of the job: each round records how many failed and
why, its latency and throughput cover the completed requests, and a warning names the first
error. Only a job in which no request completed at all fails (after writing its result).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry
from tqdm import tqdm

from omniflow.bench.client import (
    DEFAULT_PROMPTS,
    Outcome,
    error_counts,
    load_prompts,
    read_samples,
    summarize,
)
from omniflow.bench.mode import check_mode
from omniflow.bench.reuse import CACHE
from omniflow.bench.server_sums import first_audio_parts, server_totals, totals_since
from omniflow.bench.stage_counts import (
    prefills_since,
    stage_prefills,
    stage_windows,
    windows_since,
)
from omniflow.bench.step_kinds import StepKindTimer, device_sync
from omniflow.build.pipeline import build_pipeline
from omniflow.config.graph import ResolvedStage, StageGraph
from omniflow.config.resolve import build_graph
from omniflow.config.schema import OmniflowSpec
from omniflow.core.pipeline import NoTimer
from omniflow.errors import ConfigError
from omniflow.logs import BAR_DISABLE
from omniflow.serve.run import ServerThread

log = logging.getLogger(__name__)

VOICE = "vivian"


def commit() -> str:
    """The commit under test: OMNIFLOW_COMMIT when set (a GPU machine's copy of the tree may
    carry no repository, or a stale one), else git's HEAD."""
    if os.environ.get("OMNIFLOW_COMMIT"):
        return os.environ["OMNIFLOW_COMMIT"]
    out = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).parent,
    )
    return out.stdout.strip()


def device_name(device: str) -> str:
    """What ran the job (the GPU's name on CUDA)."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(torch.device(device))
    return platform.processor() or platform.machine()


def run_job(spec: OmniflowSpec, overrides: list[str], out_dir: Path | None) -> dict[str, Any]:
    """Run the job; write out_dir/result.json when out_dir is given; return the result.
    With `bench.rps` the job is open loop (bench/open_loop.py)."""
    check_mode(spec.bench)  # a key the job's loop would not read is refused, named
    if spec.bench.rps is not None:
        from omniflow.bench.open_loop import run_open_loop_job  # it imports this module

        return run_open_loop_job(spec, overrides, out_dir)
    graph = build_graph(spec)
    b = spec.bench
    prompts_file = b.prompts or DEFAULT_PROMPTS
    prompts = load_prompts(prompts_file, b.round_prompts, b.max_frames)
    if len(prompts) < b.round_prompts:  # never a silently smaller round
        key = "bench.prompts_per_lane" if b.round_prompts > b.num_prompts else "bench.num_prompts"
        raise ConfigError(
            key,
            f"a round needs {b.round_prompts} prompts and {prompts_file} holds {len(prompts)}",
        )
    ar = ar_stage(graph)
    rounds: list[dict[str, Any]] = []
    errors: list[str] = []
    if b.reuse_pipeline:
        pipeline, reused = CACHE.get(graph)  # started; left running for the next job
    else:  # a job of its own: no kept pipeline holds device memory beside it
        CACHE.close()
        pipeline, reused = build_pipeline(graph), False
    steps = StepKindTimer(
        device_sync(graph.platform.device) if b.phase_timing == "device" else None
    )
    client = [
        f"--prompts={prompts_file}",
        f"--num-prompts={b.round_prompts}",
        f"--max-frames={b.max_frames or 0}",  # the client's 0: no cap (null here)
        f"--concurrency={b.concurrency}",
        f"--model={graph.model.name}",
        f"--voice={VOICE}",
    ]
    try:
        # log lines (rounds, engine stats) print above the request bar, not through it: the
        # bar is this process's (RequestBar), and the log handler writes above it (logs.py)
        server = ServerThread(pipeline, spec.server, owns_pipeline=not b.reuse_pipeline)
        with server as srv:
            client.append(f"--url={srv.url}")
            registry = srv.app.state.service.metrics.registry
            if b.warmup:  # on their own, before anything is counted: a first request pays one-offs
                warm = RequestBar(registry, b.warmup, "warm-up")
                load_in_child([*client, f"--warmup={b.warmup}", "--warmup-only"], warm)
            before = server_totals(registry, ar.name)
            windows_before = stage_windows(pipeline.stats(), ar.name)
            prefills_before = stage_prefills(pipeline.stats(), ar.name)
            pipeline.set_phase_timer(steps)
            for i in range(b.rounds):
                bar = RequestBar(registry, b.round_prompts, f"round {i + 1}/{b.rounds}")
                outcome = load_in_child([*client, "--warmup=0"], bar)
                summary = summarize(outcome)
                rounds.append(summary)
                errors += [f.error for f in outcome.failures]
                log_round(i + 1, b.rounds, summary, outcome)
            accrued = totals_since(before, server_totals(registry, ar.name))
            first = first_audio_parts(accrued)
            step_s = accrued["step_s"]
            frames = accrued["audio_s"] * pipeline.info().sample_rate / 1920
            windows = windows_since(windows_before, stage_windows(pipeline.stats(), ar.name))
            prefills = prefills_since(prefills_before, stage_prefills(pipeline.stats(), ar.name))
    finally:  # a kept pipeline's later steps are not this job's, even after a failure
        pipeline.set_phase_timer(NoTimer())
    result = {
        "overrides": overrides,
        "config": {
            **graph_config(graph),
            "concurrency": b.concurrency,
            "num_prompts": len(prompts),
            "frames_per_prompt": [p.frames for p in prompts],
            "client": "separate process",
            "phase_timing": b.phase_timing,
            "pipeline_reused": reused,
        },
        "rounds": rounds,
        "summary": _across_rounds(rounds, errors),
        "talker_ms_per_frame": (1e3 * step_s / frames) if frames and step_s else None,
        "served_frames": round(frames),
        "windows": windows,
        "prefills": prefills,
        "steps": steps.summary(),
        "first_audio_parts": first,
        "commit": commit(),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "python -m omniflow bench " + " ".join(shlex.quote(o) for o in overrides),
        "device": device_name(graph.platform.device),
    }
    for stage, kinds in result["steps"].items():
        log.info(
            "steps of %s: %s",
            stage,
            "; ".join(
                f"{v['count']} {kind.split('_')[0]}, median {v['median_ms']:.1f} ms"
                for kind, v in kinds.items()
            ),
        )
    if first is not None:
        log.info(
            "first audio, server side (mean of %d requests): %.1f ms = intake %.1f + made %.1f"
            " + delivery %.1f",
            first["requests"],
            first["total_ms"],
            first["intake_ms"],
            first["made_ms"],
            first["delivery_ms"],
        )
    if prefills is not None:
        log.info(
            "prefills of %s: %d steps, %d tokens; %d on prompt graphs (%d replays), %d eager",
            ar.name,
            prefills["steps"],
            prefills["tokens"],
            prefills["graphed"],
            prefills["replays"],
            prefills["eager"],
        )
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "result.json").write_text(json.dumps(result, indent=2))
    if not any(r["completed"] for r in rounds):
        raise RuntimeError(
            f"no request completed: all {len(errors)} failed (first: {errors[0]})"
            + (f"; the failures are in {out_dir / 'result.json'}" if out_dir else "")
        )
    return result


def log_round(n: int, total: int, summary: dict[str, Any], outcome: Outcome) -> None:
    """The round's medians (when any request completed) and a warning naming its failures."""
    if summary["completed"]:
        log.info(
            "round %d/%d: rtf %.3f (median), ttfp %.3f s, %.2f audio-s/s",
            n,
            total,
            summary["rtf"]["median"],
            summary["ttfp_s"]["median"],
            summary["audio_throughput"],
        )
    if outcome.failures:
        first = outcome.failures[0]
        log.warning(
            "round %d/%d: %d of %d requests failed (first: prompt %d after %.2f s: %s)",
            n,
            total,
            summary["failed"],
            summary["requests"],
            first.prompt,
            first.after_s,
            first.error,
        )


def load_in_child(args: list[str], bar: RequestBar | None = None) -> Outcome:
    """Run `omniflow.bench.client` with `args` in a child process; its samples, failures and
    wall time. A failed request is in the outcome; a failing child (e.g. its warm-up) raises.

    With `bar`, the progress bar is drawn here, from the server's count of finished requests,
    and the child draws none (TQDM_DISABLE): a bar of the child's own, on the same stderr,
    is one this process's log lines cannot print above (they ran into it, on a terminal and
    in a file). Without, the child's bar goes to this process's stderr. Its stdout (a
    summary) is dropped, since `omniflow bench` prints the job's own summary there."""
    with tempfile.TemporaryDirectory(prefix="omniflow-bench-") as tmp:
        out = Path(tmp) / "samples.json"
        cmd = [sys.executable, "-m", "omniflow.bench.client", *args, f"--out={out}"]
        env = None if bar is None else {**os.environ, "TQDM_DISABLE": "1"}
        child = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, env=env)
        try:
            with bar if bar is not None else contextlib.nullcontext():
                while True:
                    try:
                        child.wait(timeout=BAR_POLL_S)
                        break
                    except subprocess.TimeoutExpired:
                        if bar is not None:
                            bar.poll()
        finally:  # (an interrupted job leaves no load generator behind)
            if child.poll() is None:
                child.kill()
                child.wait()
        if child.returncode != 0:
            raise RuntimeError(f"the load generator failed (exit {child.returncode}): {cmd}")
        return read_samples(out)


BAR_POLL_S = 0.2
"""How often the request bar reads the server's count."""


class RequestBar:
    """A progress bar over `total` requests, counted by the server's finished-request
    counter (`omniflow_requests_total`, every outcome) from when the bar is opened; drawn
    on a terminal only (logs.BAR_DISABLE), cleared when it closes (the round's log line
    then says what it did)."""

    def __init__(self, registry: CollectorRegistry, total: int, desc: str) -> None:
        self.registry, self.total, self.desc = registry, total, desc
        self.bar: tqdm | None = None
        self.start = 0

    def finished(self) -> int:
        return int(
            sum(
                sample.value
                for metric in self.registry.collect()
                if metric.name == "omniflow_requests"
                for sample in metric.samples
                if sample.name == "omniflow_requests_total"
            )
        )

    def __enter__(self) -> RequestBar:
        self.start = self.finished()
        self.bar = tqdm(
            total=self.total,
            desc=self.desc,
            unit=" req",
            leave=False,
            file=sys.stderr,
            disable=BAR_DISABLE,
        )
        return self

    def poll(self) -> None:
        assert self.bar is not None
        done = min(self.finished() - self.start, self.total)
        if done > self.bar.n:
            self.bar.update(done - self.bar.n)

    def __exit__(self, *exc: object) -> None:
        assert self.bar is not None
        self.bar.close()


def graph_config(graph: StageGraph) -> dict[str, Any]:
    """What a result records of the pipeline it measured (closed and open loop alike)."""
    ar = ar_stage(graph)
    return {
        "pipeline": graph.pipeline,
        "model": graph.model.name,
        "platform": graph.platform.name,
        "dtype": graph.platform.dtype,
        "window_k": ar.window_k,
        "playback_margin_ms": ar.playback_margin_ms,
        "async_scheduling": ar.scheduler.async_scheduling,
    }


def ar_stage(graph: StageGraph) -> ResolvedStage:
    """The pipeline's autoregressive stage (the one that generates frames): its step time per
    frame, window setting and window counters are what a job reports."""
    return next(s for s in graph.stages.values() if s.kind == "ar")


def _across_rounds(rounds: list[dict[str, Any]], errors: list[str]) -> dict[str, Any]:
    """Request counts and errors over all rounds; the median over rounds of each round's
    median, with the spread (min, max), over the rounds where any request completed (None
    if none did)."""
    done = [r for r in rounds if r["completed"]]

    def agg(values: list[float]) -> dict[str, float] | None:
        if not values:
            return None
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}

    return {
        "requests": sum(r["requests"] for r in rounds),
        "completed": sum(r["completed"] for r in rounds),
        "failed": sum(r["failed"] for r in rounds),
        "errors": error_counts(errors),
        "rtf": agg([r["rtf"]["median"] for r in done]),
        "ttfp_s": agg([r["ttfp_s"]["median"] for r in done]),
        "e2el_s": agg([r["e2el_s"]["median"] for r in done]),
        "audio_throughput": agg([r["audio_throughput"] for r in rounds]),  # 0: none completed
        "underrun_s": agg([r["underrun_s"]["max"] for r in done]),
    }
