"""One benchmark job: serve the configured pipeline on loopback (in this process, or as a Ray
Serve deployment with `deploy=ray`: bench/target.py), load it over HTTP with the shipped
prompts in fixed-length mode, and write one result JSON (docs/performance.md).

The load generator (`omniflow.bench.client`) runs as its own process, as a real client does.
In the server's process it would share the interpreter lock with the engine thread and the
server's event loop, and its own per-chunk work would slow every decode step it measures.

Requests that fail are data, not the end of the job: each round records how many failed and
why, its latency and throughput cover the completed requests, and a warning names the first
error. Only a job in which no request completed at all fails (after writing its result).
"""

from __future__ import annotations

import json
import logging
import platform
import shlex
import statistics
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from omniflow.bench.child import RequestBar, load_in_child
from omniflow.bench.client import DEFAULT_PROMPTS, load_prompts
from omniflow.bench.mode import check_mode
from omniflow.bench.outcome import Outcome, error_counts, summarize
from omniflow.bench.prompt_file import check_bench_prompts
from omniflow.bench.server_view import accrued, server_fields
from omniflow.bench.step_kinds import StepKindTimer, device_sync
from omniflow.bench.target import open_target
from omniflow.bench.target_check import bench_graph
from omniflow.config.graph import ResolvedStage, StageGraph
from omniflow.config.schema import OmniflowSpec
from omniflow.config.server import ServerConfig
from omniflow.logs import setup_logging
from omniflow.provenance import build

log = logging.getLogger(__name__)

VOICE = "vivian"


def device_name(device: str) -> str:
    """What ran the job (the GPU's name on CUDA)."""
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(torch.device(device))
    return platform.processor() or platform.machine()


def run_job(spec: OmniflowSpec, overrides: list[str], out_dir: Path | None) -> dict[str, Any]:
    """Run the job; write out_dir/result.json when out_dir is given; return the result.
    With `bench.rps` the job is open loop (bench/open_loop.py)."""
    setup_logging(spec.server.log_level)  # the served app's loggers are this process's
    check_mode(spec.bench)  # a key the job's loop would not read is refused, named
    check_bench_prompts(spec.bench)  # before the build: one line, not after a minute's capture
    if spec.bench.rps is not None:
        from omniflow.bench.open_loop import run_open_loop_job  # it imports this module

        return run_open_loop_job(spec, overrides, out_dir)
    b = spec.bench
    prompts_file = b.prompts or DEFAULT_PROMPTS
    prompts = load_prompts(prompts_file, b.round_prompts, b.max_frames)
    graph = bench_graph(spec)
    ar = ar_stage(graph)
    rounds: list[dict[str, Any]] = []
    errors: list[str] = []
    refused: set[int] = set()  # the statuses the server refused with
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
    with open_target(spec, graph, ar.name) as served:
        client.append(f"--url={served.url}")
        if b.warmup:  # on their own, before anything is counted: a first request pays one-offs
            warm = RequestBar(served.finished, b.warmup, "warm-up")
            load_in_child([*client, f"--warmup={b.warmup}", "--warmup-only"], warm)
        before, unsettled = served.snapshot(ar.name)
        if served.time_steps is not None:
            served.time_steps(steps)
        for i in range(b.rounds):
            bar = RequestBar(served.finished, b.round_prompts, f"round {i + 1}/{b.rounds}")
            outcome = load_in_child([*client, "--warmup=0"], bar)
            summary = summarize(outcome)
            rounds.append(summary)
            errors += [f.error for f in outcome.failures]
            refused |= {f.status for f in outcome.failures if f.refused and f.status}
            log_round(i + 1, b.rounds, summary, outcome)
        after, unsettled_after = served.snapshot(ar.name)
    if refused:
        log.warning(refusal_hint(refused, spec.server))
    got = unsettled or unsettled_after or accrued(before, after)
    fields, nulls = server_fields(got, served.sample_rate, served.per_replica)
    result = {
        "overrides": overrides,
        "config": {
            **graph_config(graph),
            "concurrency": b.concurrency,
            "num_prompts": len(prompts),
            "frames_per_prompt": [p.frames for p in prompts],
            "client": "separate process",
            "phase_timing": b.phase_timing,
            "pipeline_reused": served.reused,
            "deploy": served.deploy,
        },
        "rounds": rounds,
        "summary": _across_rounds(rounds, errors),
        **fields,
        "steps": steps.summary() if served.time_steps is not None else None,
        "nulls": served.nulls | nulls,
        **build(),  # commit and tree: which code ran, commit known or not
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "command": "python -m omniflow bench " + " ".join(shlex.quote(o) for o in overrides),
        "device": device_name(graph.platform.device),
    }
    for why in result["nulls"].items():
        log.info("%s: null (%s)", *why)
    for stage, kinds in (result["steps"] or {}).items():
        log.info(
            "steps of %s: %s",
            stage,
            "; ".join(
                f"{v['count']} {kind}, median {v['median_ms']:.1f} ms" for kind, v in kinds.items()
            ),
        )
    first, prefills = result["first_audio_parts"], result["prefills"]
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
        if first["queued_ms"] is not None:
            log.info(
                "made, split (mean of %d requests): queued %.1f ms for a seat + %.1f ms of steps",
                first["split_requests"],
                first["queued_ms"],
                first["steps_ms"],
            )
        if first["handoff_ms"] is not None:
            log.info(
                "delivery, split: %.1f ms to the request's handler + %.1f ms of response",
                first["handoff_ms"],
                first["response_ms"],
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
        write_result(out_dir, result)
    if not any(r["completed"] for r in rounds):
        raise RuntimeError(
            f"no request completed: all {len(errors)} failed (first: {errors[0]})"
            + (f"; the failures are in {out_dir / 'result.json'}" if out_dir else "")
        )
    return result


def log_round(n: int, total: int, summary: dict[str, Any], outcome: Outcome) -> None:
    """The round's medians (when any request completed) and a warning naming its failures."""
    if summary["completed"]:
        steady = summary["steady"]
        log.info(
            "round %d/%d: rtf %.3f (median), ttfp %.3f s, %.2f audio-s/s%s",
            n,
            total,
            summary["rtf"]["median"],
            summary["ttfp_s"]["median"],
            summary["audio_throughput"],
            "" if steady is None else f"; steady state {steady_text(steady)}",
        )
    refused = [f for f in outcome.failures if f.refused]
    other = [f for f in outcome.failures if not f.refused]
    for what, failures in (("refused by the server", refused), ("failed", other)):
        if failures:
            first = failures[0]
            log.warning(
                "round %d/%d: %d of %d requests %s (first: prompt %d after %.2f s: %s)",
                n,
                total,
                len(failures),
                summary["requests"],
                what,
                first.prompt,
                first.after_s,
                first.error,
            )


def write_result(out_dir: Path, result: dict[str, Any]) -> None:
    """out_dir/result.json (the directory made, parents and all), and where it went."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "result.json"
    path.write_text(json.dumps(result, indent=2))
    log.info("wrote %s", path)


def refusal_hint(statuses: set[int], server: ServerConfig) -> str:
    """Where the server's refusals (`statuses`, 429 and 503) came from and the key that
    changes each: a closed-loop run past what the machine serves in real time measures
    refusals, not throughput."""
    why = []
    if 503 in statuses:
        limit = server.max_first_audio_wait_s
        why.append(
            "503: shutting down or a stage down (server.max_first_audio_wait_s is null)"
            if limit is None
            else f"503: it could not seat a request within server.max_first_audio_wait_s={limit}"
            " s; =null queues them instead, to measure throughput past real time"
        )
    if 429 in statuses:
        why.append(
            f"429: past server.max_concurrent_requests={server.max_concurrent_requests}; raise "
            "it or lower bench.concurrency"
        )
    return "the server refused requests (" + "; ".join(why) + ")"


def steady_text(steady: dict[str, Any]) -> str:
    """A round's steady state in a log line (bench/steady.py)."""
    first, failed = steady["ttfp_mean_s"], steady["failed"]
    if first is None:
        return f"none (the {failed} requests sent in it failed)"
    unclean = f" (not clean: {failed} of the requests sent in it failed)" if failed else ""
    return (
        f"{steady['audio_throughput']:.2f} audio-s/s over {steady['span_s']:.1f} s, first "
        f"audio {1e3 * first:.0f} ms mean{unclean}"
    )


def graph_config(graph: StageGraph) -> dict[str, Any]:
    """What a result records of the pipeline it measured (closed and open loop alike)."""
    ar = ar_stage(graph)
    return {
        "pipeline": graph.pipeline,
        "model": graph.model.name,
        "platform": graph.platform.name,
        "runtime": graph.runtime,  # the engine's process: the null resolves by platform and job
        "dtype": graph.platform.dtype,
        "codec_dtype": graph.platform.codec_dtype,
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
    steady = [r for r in done if r["steady"] is not None]  # more prompts than lanes

    def agg(values: list[float]) -> dict[str, float] | None:
        if not values:
            return None
        return {"median": statistics.median(values), "min": min(values), "max": max(values)}

    return {
        "requests": sum(r["requests"] for r in rounds),
        "completed": sum(r["completed"] for r in rounds),
        "failed": sum(r["failed"] for r in rounds),
        "refused": sum(r["refused"] for r in rounds),
        "errors": error_counts(errors),
        "rtf": agg([r["rtf"]["median"] for r in done]),
        "ttfp_s": agg([r["ttfp_s"]["median"] for r in done]),
        "e2el_s": agg([r["e2el_s"]["median"] for r in done]),
        "audio_throughput": agg([r["audio_throughput"] for r in rounds]),  # 0: none completed
        "steady_audio_throughput": agg([r["steady"]["audio_throughput"] for r in steady]),
        "steady_ttfp_mean_s": agg(
            [r["steady"]["ttfp_mean_s"] for r in steady if r["steady"]["ttfp_mean_s"] is not None]
        ),
        "underrun_s": agg([r["underrun_s"]["max"] for r in done]),
    }
