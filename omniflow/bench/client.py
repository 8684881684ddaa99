"""HTTP load generator for `/v1/audio/speech` (docs/performance.md), fixed-length mode.

    python -m omniflow.bench.client --url http://127.0.0.1:8000 --concurrency 1 \
        --num-prompts 8 --warmup 1

Prompts default to the shipped LibriSpeech set (omniflow/bench/data/); --prompts FILE.jsonl
takes rows of {"text": ..., "seconds": ...}.

Each prompt asks for round(seconds x 12.5) frames (at most --max-frames) with EOS ignored, so
runs with dummy weights are comparable. Per request: ttfp (request sent -> first audio bytes),
e2el (-> end of stream), audio seconds (bytes / 48,000), rtf = e2el / audio seconds. Warm-ups
are excluded.

A measured request that fails (a transport error, a status other than 200, or a 200 stream
whose audio is not exactly the frames it asked for) is recorded as a `Failure` with its error
text and counted, never retried (a retry would hide a server bug) and never fatal to the run:
one dropped connection at concurrency 128 used to lose the whole job's numbers. A failing
warm-up request still fails the run: a server that cannot serve it is broken.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import ssl
import sys
import time
from pathlib import Path

import httpx
from tqdm import tqdm

from omniflow.bench.outcome import (
    Failure,
    Outcome,
    Sample,
    http_error,
    summarize,
    write_outcome,
)
from omniflow.bench.prompt_file import DEFAULT_PROMPTS, PromptFileError, read_prompt_rows
from omniflow.logs import BAR_DISABLE

FRAME_RATE = 12.5
SAMPLE_RATE = 24000
BYTES_PER_SECOND = 2 * SAMPLE_RATE  # PCM16 mono
BYTES_PER_FRAME = 2 * round(SAMPLE_RATE / FRAME_RATE)  # 1,920 samples per frame
EXIT_SOME_FAILED = 3
"""A load generator's exit status when it ran to the end and some measured requests failed
(its --out file holds them all): a script sees the failures; `omniflow bench`, which counts
them, reads the results as for 0. 1 stays a crash (a failed warm-up), 2 a usage error."""


@dataclasses.dataclass(frozen=True)
class Prompt:
    text: str
    frames: int


class BadResponse(Exception):
    """The server answered, but not with the audio asked for (status, or length)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status
        """The HTTP status when that was the fault (None: the audio's length)."""


def load_prompts(path: str | Path, limit: int, max_frames: int = 0) -> list[Prompt]:
    """The first `limit` prompts of a JSONL file, each capped at `max_frames` (0: no cap)."""
    out = []
    for row in read_prompt_rows(path, need_seconds=True, limit=limit):
        assert row.seconds is not None  # need_seconds
        frames = max(1, round(row.seconds * FRAME_RATE))
        out.append(Prompt(row.text, min(frames, max_frames) if max_frames else frames))
    return out


async def one(
    client: httpx.AsyncClient, url: str, model: str, voice: str, p: Prompt, seed: int
) -> Sample:
    body = {
        "model": model,
        "voice": voice,
        "input": p.text,
        "response_format": "pcm",
        "stream": True,
        "max_new_tokens": p.frames,
        "ignore_eos": True,
        "seed": seed,
    }
    t0 = time.perf_counter()
    ttfp = None
    size = 0
    underrun = 0.0
    async with client.stream("POST", url + "/v1/audio/speech", json=body) as r:
        if r.status_code != 200:
            raise BadResponse(http_error(r.status_code, await r.aread()), r.status_code)
        async for chunk in r.aiter_bytes():
            if not chunk:
                continue
            now = time.perf_counter() - t0
            if ttfp is None:
                ttfp = now
            # the player has wanted (now - ttfp) s of audio; it had size / rate
            underrun = max(underrun, (now - ttfp) - size / BYTES_PER_SECOND)
            size += len(chunk)
    e2el = time.perf_counter() - t0
    want = p.frames * BYTES_PER_FRAME
    if size != want:
        kind = "short" if size < want else "long"
        raise BadResponse(f"{kind} audio: got {size} of {want} bytes")
    return Sample(ttfp or e2el, e2el, size / BYTES_PER_SECOND, underrun)


async def measured(
    client: httpx.AsyncClient, url: str, model: str, voice: str, i: int, p: Prompt, seed: int
) -> Sample | Failure:
    """One measured request: its sample, or what made it fail (transport or response)."""
    t0 = time.perf_counter()
    try:
        return await one(client, url, model, voice, p, seed)
    except httpx.TransportError as exc:
        error = f"{type(exc).__name__}: {exc or '(no message)'}"
        return Failure(i, error[:300], time.perf_counter() - t0)
    except BadResponse as exc:
        return Failure(i, str(exc)[:300], time.perf_counter() - t0, status=exc.status)


async def run(
    url: str,
    prompts: list[Prompt],
    concurrency: int,
    warmup: int,
    model: str,
    voice: str,
    measure: bool = True,
) -> Outcome:
    """Warm-ups one by one (any failure raises), then, when `measure`, every prompt at
    `concurrency`: that many lanes, each sending its next prompt as soon as its previous one
    ends. (`omniflow bench` warms up in a call of its own, so the server's counters can be
    read between the warm-ups and the measured requests.)"""
    tls = ssl.create_default_context()  # built once: each one loads the CA store, slow per lane
    async with lane_client(tls) as client:
        for i in range(warmup):
            await one(client, url, model, voice, prompts[i % len(prompts)], seed=i)
    if not measure:
        return Outcome([], [], 0.0)
    queue = iter(enumerate(prompts))
    results: list[Sample | Failure | None] = [None] * len(prompts)

    async def lane(bar: tqdm) -> None:
        async with lane_client(tls) as client:
            for i, p in queue:  # one shared iterator: each prompt goes to exactly one lane
                sent = time.perf_counter() - t0
                result = await measured(client, url, model, voice, i, p, seed=1000 + i)
                results[i] = dataclasses.replace(result, sent_s=sent)
                bar.update(1)

    t0 = time.perf_counter()
    bar = tqdm(total=len(prompts), desc="requests", unit=" req", leave=False, disable=BAR_DISABLE)
    with bar:
        await asyncio.gather(*(lane(bar) for _ in range(min(concurrency, len(prompts)))))
    wall = time.perf_counter() - t0
    samples = [r for r in results if isinstance(r, Sample)]
    failures = [r for r in results if isinstance(r, Failure)]
    return Outcome(samples, failures, wall, lanes=min(concurrency, len(prompts)))


def lane_client(tls: ssl.SSLContext) -> httpx.AsyncClient:
    """A client of one keep-alive connection, one per concurrent lane.

    One client shared by all lanes spent most of the load generator's CPU in httpcore's pool
    bookkeeping, which scans every connection for every request and every stream it closes: at
    high concurrency the load generator saturated its core and kept few requests in flight
    (measured: docs/performance.md, "The load generator was the c128 bottleneck"). A pool of one
    has nothing to scan. (Shared, httpx's default of 100 connections also made concurrency
    128 two waves.)"""
    one_connection = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    return httpx.AsyncClient(timeout=600, limits=one_connection, verify=tls)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--prompts", default=str(DEFAULT_PROMPTS))
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-frames", type=int, default=0, help="cap per prompt (0: none)")
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--warmup-only", action="store_true", help="send the warm-ups, nothing else")
    ap.add_argument("--model", default="qwen3-tts-tiny")
    ap.add_argument("--voice", default="vivian")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.concurrency < 1:
        ap.error(f"--concurrency must be at least 1, got {args.concurrency}")
    if args.num_prompts < 1 or args.warmup < 0:
        ap.error("--num-prompts must be at least 1 and --warmup at least 0")
    try:
        prompts = load_prompts(args.prompts, args.num_prompts, args.max_frames)
    except PromptFileError as exc:
        ap.error(f"--prompts: {exc}")
    try:
        outcome = asyncio.run(
            run(
                args.url,
                prompts,
                args.concurrency,
                args.warmup,
                args.model,
                args.voice,
                measure=not args.warmup_only,
            )
        )
    except (httpx.HTTPError, BadResponse) as exc:  # only a warm-up raises: measured ones count
        detail = f"{type(exc).__name__}: {exc}" if isinstance(exc, httpx.HTTPError) else exc
        sys.exit(f"omniflow.bench.client: a warm-up request to {args.url} failed ({detail})")
    if args.warmup_only:
        if args.out:
            write_outcome(args.out, outcome, {"warmups": args.warmup})
        return
    summary = summarize(outcome) | {"concurrency": args.concurrency}
    print(json.dumps(summary, indent=2))
    if outcome.failures:
        first = outcome.failures[0]
        print(
            f"{summary['failed']} of {summary['requests']} requests failed "
            f"(first: prompt {first.prompt}, {first.error})",
            file=sys.stderr,
        )
    if args.out:
        write_outcome(args.out, outcome, summary)
    if outcome.failures:
        sys.exit(EXIT_SOME_FAILED)


def completed(returncode: int, out: Path) -> bool:
    """Whether a load generator run as a child ran to the end and wrote `out` (its failed
    requests, if any, are in it)."""
    return returncode == 0 or (returncode == EXIT_SOME_FAILED and out.is_file())


if __name__ == "__main__":
    main()
