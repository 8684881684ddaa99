"""One open-loop benchmark job (`omniflow bench bench.rps=R`): serve the configured pipeline on
loopback, send requests at their arrival times from a load generator of its own process
(omniflow/bench/open_client.py) and write result.json with its `open_loop` object.

What a listener feels is the time to first audio and whether playback stalls, under requests
that arrive when they arrive, not in a closed-loop burst: the object has the measured
requests' first-audio percentiles, how many stalled a zero-buffer player and for how long,
the most requests in flight and the audio delivered per second of the window
(docs/performance.md says how to run it).

Order: the server starts; `bench.warmup` requests go one by one (they pay one-off costs, as in
the closed loop); then the open-loop run: `bench.warmup_s` seconds of arrivals sent but not
counted, `bench.duration_s` seconds measured, and the measured requests' drain. The
server-side figures (`steps`, `first_audio_parts`, `windows`, `prefills`) cover the whole
open-loop run, its warm-up seconds included; the `open_loop` object covers the measured
requests only.

`bench.transport=websocket`: each arrival is an incremental session on WS
/v1/audio/speech/stream fed its text a word every `bench.word_interval_ms`
(omniflow/bench/ws_client.py); the `bench.warmup` requests still go over HTTP.
"""

from __future__ import annotations

import logging
import shlex
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from tqdm.contrib.logging import logging_redirect_tqdm

from omniflow.bench.client import DEFAULT_PROMPTS, completed
from omniflow.bench.job import (
    VOICE,
    ar_stage,
    device_name,
    graph_config,
    load_in_child,
    refusal_hint,
    write_result,
)
from omniflow.bench.mode import Plan, open_plan
from omniflow.bench.open_run import Request
from omniflow.bench.open_stats import read_requests, summarize
from omniflow.bench.outcome import http_status
from omniflow.bench.server_view import accrued, server_fields
from omniflow.bench.step_kinds import StepKindTimer, device_sync
from omniflow.bench.target import open_target
from omniflow.bench.target_check import bench_graph
from omniflow.config.schema import OmniflowSpec
from omniflow.provenance import build

log = logging.getLogger(__name__)


def run_open_loop_job(
    spec: OmniflowSpec, overrides: list[str], out_dir: Path | None
) -> dict[str, Any]:
    """Run the job; write out_dir/result.json when out_dir is given. Returns the result, whose
    `summary` is its `open_loop` object (what `omniflow bench` prints)."""
    b = spec.bench
    plan = open_plan(b)
    prompts_file = b.prompts or DEFAULT_PROMPTS  # checked by run_job
    graph = bench_graph(spec)
    ar = ar_stage(graph)
    steps = StepKindTimer(
        device_sync(graph.platform.device) if b.phase_timing == "device" else None
    )
    model = graph.model.name
    max_frames = b.max_frames or 0
    with logging_redirect_tqdm(), open_target(spec, graph, ar.name) as served:
        if b.warmup:
            load_in_child(
                [
                    f"--url={served.url}",
                    f"--prompts={prompts_file}",
                    f"--num-prompts={b.warmup}",
                    f"--max-frames={max_frames}",
                    f"--model={model}",
                    f"--voice={VOICE}",
                    f"--warmup={b.warmup}",
                    "--warmup-only",
                ]
            )
        before, unsettled = served.snapshot(ar.name)
        if served.time_steps is not None:
            served.time_steps(steps)
        log.info(
            "open loop: %g req/s (%s arrivals, seed %d) for %g s after %g s of warm-up%s",
            plan.rps,
            plan.arrivals,
            plan.seed,
            plan.duration_s,
            plan.warmup_s,
            over(plan),
        )
        requests = open_loop_in_child(plan, served.url, str(prompts_file), model, VOICE, max_frames)
        after, unsettled_after = served.snapshot(ar.name)
    got = unsettled or unsettled_after or accrued(before, after)
    fields, nulls = server_fields(got, served.sample_rate, served.per_replica)
    when = datetime.now(UTC).isoformat(timespec="seconds")
    command = "python -m omniflow bench " + " ".join(shlex.quote(o) for o in overrides)
    record = {
        "device": device_name(graph.platform.device),
        **build(),  # commit and tree: which code ran, commit known or not
        "date": when,
        "command": command,
    }
    summary = summarize(requests, plan) | record
    result = {
        "overrides": overrides,
        "config": {
            "mode": "open loop",
            **graph_config(graph),
            "prompts": Path(prompts_file).name,
            "max_frames": b.max_frames,
            "warmup_requests": b.warmup,
            "client": "separate process",
            "phase_timing": b.phase_timing,
            "pipeline_reused": served.reused,
            "deploy": served.deploy,
        },
        "open_loop": summary,
        **fields,
        "steps": steps.summary() if served.time_steps is not None else None,
        "nulls": served.nulls | nulls,
        **record,
    }
    log_open_loop(summary)
    refused = {http_status(r.error) for r in requests if r.counted and r.outcome == "rejected"}
    if refused - {None}:  # which limit refused them, and the key that sets it
        log.warning("open loop: %s", refusal_hint(refused - {None}, spec.server))
    if out_dir is not None:
        write_result(out_dir, result)
    if not summary["succeeded"]:
        first = summary["errors"][0]["error"] if summary["errors"] else "none arrived"
        raise RuntimeError(
            f"no measured request succeeded: {summary['requests']} arrived (first error: {first})"
            + (f"; the result is in {out_dir / 'result.json'}" if out_dir else "")
        )
    return result | {"summary": summary}


def open_loop_in_child(
    plan: Plan, url: str, prompts: str, model: str, voice: str, max_frames: int
) -> list[Request]:
    """Run the transport's load generator (`omniflow.bench.open_client`, or `ws_client`) in
    a child process; every request's record. Its progress bar goes to this process's stderr;
    its stdout (a summary) is dropped."""
    websocket = plan.transport == "websocket"
    with tempfile.TemporaryDirectory(prefix="omniflow-open-loop-") as tmp:
        out = Path(tmp) / "requests.json"
        cmd = [
            sys.executable,
            "-m",
            "omniflow.bench.ws_client" if websocket else "omniflow.bench.open_client",
            f"--url={url}",
            f"--prompts={prompts}",
            f"--rps={plan.rps!r}",
            f"--arrivals={plan.arrivals}",
            f"--duration-s={plan.duration_s!r}",
            f"--warmup-s={plan.warmup_s!r}",
            f"--seed={plan.seed}",
            f"--drain-s={plan.drain_s!r}",
            f"--max-frames={max_frames}",
            f"--model={model}",
            f"--voice={voice}",
            f"--out={out}",
        ]
        if websocket:
            cmd.append(f"--word-interval-ms={plan.word_interval_ms!r}")
        done = subprocess.run(cmd, stdout=subprocess.DEVNULL, check=False)
        if not completed(done.returncode, out):
            raise RuntimeError(
                f"the open-loop load generator failed (exit {done.returncode}): {cmd}"
            )
        _, requests = read_requests(out)
        return requests


def over(plan: Plan) -> str:
    """How the arrivals speak, for the log (nothing for HTTP, the default)."""
    if plan.transport != "websocket":
        return ""
    return f", over WebSocket (incremental, a word every {plan.word_interval_ms:g} ms)"


def log_open_loop(s: dict[str, Any]) -> None:
    """The run in one line, and a warning naming what was rejected or failed."""

    def ms(v: float | None) -> str:
        return "-" if v is None else f"{v:.0f}"

    first = s["first_audio_ms"]
    log.info(
        "open loop %g req/s: %d requests, %d succeeded, %d rejected, %d failed; first audio "
        "p50/p95/p99 %s/%s/%s ms; %d stalled (%s), largest stall %s ms; peak %d in flight; "
        "%.2f audio-s/s",
        s["rps"],
        s["requests"],
        s["succeeded"],
        s["rejected"],
        s["failed"],
        ms(first["p50"]),
        ms(first["p95"]),
        ms(first["p99"]),
        s["underrun_requests"],
        "-" if s["underrun_fraction"] is None else f"{100 * s['underrun_fraction']:.1f} %",
        ms(s["stall_ms"]["largest"]),
        s["peak_in_flight"],
        s["delivered_audio_s_per_s"],
    )
    if "last_audio_after_done_ms" in s:
        after = s["last_audio_after_done_ms"]
        log.info(
            "open loop %g req/s over WebSocket, a word every %g ms: last audio after "
            "input.done p50/p95/p99 %s/%s/%s ms",
            s["rps"],
            s["word_interval_ms"],
            ms(after["p50"]),
            ms(after["p95"]),
            ms(after["p99"]),
        )
    if s["errors"]:
        timed = s.get("rejected_ms") or {}
        answered = (
            f" (answered in p50/p95 {ms(timed['p50'])}/{ms(timed['p95'])} ms)"
            if s["rejected"] and timed
            else ""
        )
        log.warning(
            "open loop %g req/s: %d rejected%s, %d failed of %d measured requests (first: %s)",
            s["rps"],
            s["rejected"],
            answered,
            s["failed"],
            s["requests"],
            s["errors"][0]["error"],
        )
