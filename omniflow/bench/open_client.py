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
many requests saturated the load generator's core (docs/performance.md). The arrivals, the
records and the summary are the WebSocket generator's too (bench/open_run.py,
bench/open_stats.py; bench/ws_client.py).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import ssl
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from omniflow.bench.arrivals import KINDS
from omniflow.bench.client import DEFAULT_PROMPTS, EXIT_SOME_FAILED, lane_client
from omniflow.bench.mode import Plan
from omniflow.bench.open_run import Outcome, Request, Target, Trace, drive, whole_pcm
from omniflow.bench.open_stats import summarize, write_requests
from omniflow.bench.outcome import REJECTED, http_error
from omniflow.bench.prompt_file import PromptFileError, read_prompt_rows


def load_texts(path: str | Path) -> list[str]:
    """The `text` of every row of a JSONL prompt file, in order."""
    return [row.text for row in read_prompt_rows(path, need_seconds=False)]


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


async def send(
    client: httpx.AsyncClient, url: str, payload: dict[str, Any], trace: Trace
) -> tuple[Outcome, str | None]:
    """Send one request and read its stream into `trace`; its outcome and error text."""
    trace.sent = time.perf_counter()
    try:
        async with client.stream("POST", url + "/v1/audio/speech", json=payload) as r:
            if r.status_code != 200:
                text = http_error(r.status_code, await r.aread())
                return ("rejected" if r.status_code in REJECTED else "failed"), text
            async for chunk in r.aiter_bytes():
                if chunk:
                    trace.times.append(time.perf_counter())
                    trace.sizes.append(len(chunk))
    except httpx.HTTPError as exc:  # transport (a dropped connection, a timeout) or decoding
        return "failed", f"{type(exc).__name__}: {str(exc) or '(no message)'}"
    return whole_pcm(trace, "a 200 stream")


async def run(target: Target, plan: Plan) -> list[Request]:
    """Every arrival of the plan, sent at its time; their records, in arrival order."""
    tls = ssl.create_default_context()  # built once for every client
    idle: list[httpx.AsyncClient] = []
    made: list[httpx.AsyncClient] = []

    async def attempt(trace: Trace) -> tuple[Outcome, str | None]:
        if idle:
            client = idle.pop()
        else:
            client = lane_client(tls)
            made.append(client)
        text = target.text(trace.index)
        payload = body(text, trace.index, target.model, target.voice, target.max_frames)
        result = await send(client, target.url, payload, trace)
        idle.append(client)  # its connection is whole (not cancelled): the next may reuse it
        return result

    try:
        return await drive(plan, attempt)
    finally:
        for client in made:
            await client.aclose()


def parser(description: str | None) -> argparse.ArgumentParser:
    """The options both transports' load generators take."""
    ap = argparse.ArgumentParser(
        description=description, formatter_class=argparse.RawTextHelpFormatter
    )
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
    return ap


def plan_of(ap: argparse.ArgumentParser, args: argparse.Namespace, **transport: Any) -> Plan:
    """The plan the parsed options ask for (`transport`: Plan's transport fields)."""
    if args.rps <= 0 or args.duration_s <= 0 or args.warmup_s < 0 or args.drain_s <= 0:
        ap.error("--rps, --duration-s and --drain-s must be positive, --warmup-s at least 0")
    return Plan(
        args.rps, args.arrivals, args.duration_s, args.warmup_s, args.seed, args.drain_s,
        **transport,
    )  # fmt: skip


def target_of(ap: argparse.ArgumentParser, args: argparse.Namespace) -> Target:
    """The target the parsed options name (its prompts read from `--prompts`; a bad file
    ends the run in one line)."""
    try:
        texts = load_texts(args.prompts)
    except PromptFileError as exc:
        ap.error(f"--prompts: {exc}")
    return Target(args.url, texts, args.model, args.voice, args.max_frames)


def report(args: argparse.Namespace, plan: Plan, requests: list[Request]) -> None:
    """Write the `--out` file (when asked) and print the summary."""
    if args.out:
        write_requests(args.out, plan, requests)
    summary = summarize(requests, plan) | {"server": server_build(args.url)}
    print(json.dumps(summary, indent=2))
    if summary["failed"] or summary["rejected"]:
        first = next((r.error for r in requests if r.counted and r.error), None)
        print(
            f"{summary['rejected']} rejected and {summary['failed']} failed of "
            f"{summary['requests']} measured requests (first: {first})",
            file=sys.stderr,
        )
    if summary["failed"]:  # a refusal (429/503) is the server's answer, not a failure
        sys.exit(EXIT_SOME_FAILED)


def server_build(url: str) -> dict[str, str] | None:
    """The build the server reports on `/health` (`provenance.py`: commit and tree
    fingerprint), so that a result says which code it measured; None where it says none."""
    try:
        health = httpx.get(url.rstrip("/") + "/health", timeout=10).json()
    except (httpx.HTTPError, ValueError):
        return None
    build = health.get("build") if isinstance(health, dict) else None
    return build if isinstance(build, dict) else None


def main() -> None:
    ap = parser(__doc__)
    args = ap.parse_args()
    plan = plan_of(ap, args)
    report(args, plan, asyncio.run(run(target_of(ap, args), plan)))


if __name__ == "__main__":
    main()
