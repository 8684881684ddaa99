"""`/health` latency during a burst of speech requests (docs/reliability.md).

    python -m benchmarks.burst --url http://127.0.0.1:8000 --requests 1000
    python -m benchmarks.burst --client httpx --probe-every 0.01 --runs 5

Fires `--requests` speech requests at once, each on its own connection (a burst of clients,
not a pipelined one), while a second process asks `/health` every `--probe-every` seconds on a
kept-alive connection, and prints one JSON object: how the speech requests were answered
(status counts, failures) and the latencies of the health probes sent while the burst was in
flight (median, p99, max, how many took over 100 ms). The burst writes its requests straight
to asyncio streams: an HTTP client library costs a few milliseconds of CPU per new
connection, which on a small machine would spread the 1,000 arrivals over seconds. Run it in
its own process (the tests and `benchmarks.soak` do), so that its CPU is not the
server's. `--client httpx` sends the burst from one `httpx.AsyncClient` instead (its pool of
100 connections, kept alive between requests): the client of issue 36 item 16.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import statistics
import time
from collections import Counter
from multiprocessing.connection import Connection
from multiprocessing.synchronize import Event
from typing import Any
from urllib.parse import urlsplit

import httpx

BODY = {
    "model": "qwen3-tts-tiny",
    "voice": "vivian",
    "input": "A burst of requests.",
    "response_format": "pcm",
    "ignore_eos": True,
}
PROBE_START_S = 60.0


class HealthProbe:
    """Asks /health on one kept-alive connection until stopped, from its own process;
    records (sent at, seconds, status) per answer, times on the system-wide monotonic clock.

    Its own process, because a thread beside the burst's event loop shares that loop's GIL:
    while the loop opens and writes 1,000 connections (hundreds of milliseconds of Python in
    one turn) the probe thread cannot even read its answer, and a slow probe then measures
    the client, not the server."""

    def __init__(self, url: str, every_s: float) -> None:
        context = multiprocessing.get_context("spawn")
        self._ready, self._stop = context.Event(), context.Event()
        self._samples, sender = context.Pipe(duplex=False)
        self._process = context.Process(
            target=probe_until,
            args=(url, every_s, self._ready, self._stop, sender),
            daemon=True,
        )
        self.samples: list[tuple[float, float, int]] = []

    def __enter__(self) -> HealthProbe:
        self._process.start()
        if not self._ready.wait(PROBE_START_S):
            self._process.kill()
            raise RuntimeError(f"the health probe did not answer within {PROBE_START_S} s")
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if not self._samples.poll(PROBE_START_S):
            self._process.kill()
            raise RuntimeError("the health probe process did not report its samples")
        self.samples = self._samples.recv()
        self._process.join()

    def between(self, start: float, end: float) -> list[tuple[float, float, int]]:
        return [s for s in self.samples if start <= s[0] <= end]


def probe_until(url: str, every_s: float, ready: Event, stop: Event, report: Connection) -> None:
    """The probe process: one probe that opens the connection, `ready`, then a probe every
    `every_s` until `stop`; the samples go back on `report`."""
    samples: list[tuple[float, float, int]] = []
    with httpx.Client(timeout=60) as client:
        client.get(url + "/health")
        ready.set()
        while not stop.is_set():
            t0 = time.monotonic()
            status = client.get(url + "/health").status_code
            samples.append((t0, time.monotonic() - t0, status))
            stop.wait(every_s)
    report.send(samples)


def latency_summary(seconds: list[float]) -> dict[str, Any]:
    if not seconds:
        return {"probes": 0}
    xs = sorted(seconds)
    return {
        "probes": len(xs),
        "median_ms": 1e3 * statistics.median(xs),
        "p99_ms": 1e3 * xs[min(len(xs) - 1, int(0.99 * len(xs)))],
        "max_ms": 1e3 * xs[-1],
        "over_100ms": sum(x > 0.1 for x in xs),
    }


async def post(host: str, port: int, request: bytes) -> str:
    """One request on a new connection (`Connection: close`); its status, or "failed: ..."."""
    try:
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(request)
        answer = await reader.read()  # to EOF: the whole response, then the server closes
        writer.close()
    except OSError as exc:
        return f"failed: {type(exc).__name__}"
    status = answer.split(b" ", 2)[1:2]
    return status[0].decode() if status else "failed: no response"


async def fire(url: str, n: int, frames: int, model: str) -> tuple[Counter[str], float]:
    """n requests at once; the status of each."""
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 80
    body = json.dumps({**BODY, "model": model, "max_new_tokens": frames}).encode()
    request = (
        f"POST /v1/audio/speech HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    ).encode() + body
    t0 = time.perf_counter()
    answers = await asyncio.gather(*(post(host, port, request) for _ in range(n)))
    return Counter(answers), time.perf_counter() - t0


async def fire_httpx(url: str, n: int, frames: int, model: str) -> tuple[Counter[str], float]:
    """n requests at once from one async httpx client (its default pool: 100 connections,
    reused as answers come back); the status of each."""
    body = {**BODY, "model": model, "max_new_tokens": frames}

    async def one(client: httpx.AsyncClient) -> str:
        try:
            return str((await client.post(url + "/v1/audio/speech", json=body)).status_code)
        except httpx.HTTPError as exc:
            return f"failed: {type(exc).__name__}"

    async with httpx.AsyncClient(timeout=120) as client:
        t0 = time.perf_counter()
        answers = await asyncio.gather(*(one(client) for _ in range(n)))
    return Counter(answers), time.perf_counter() - t0


FIRE = {"sockets": fire, "httpx": fire_httpx}


def burst(
    url: str,
    n: int,
    frames: int,
    probe_every_s: float,
    model: str,
    idle_s: float = 0.3,
    client: str = "sockets",
) -> dict[str, Any]:
    with HealthProbe(url, probe_every_s) as probe:
        time.sleep(idle_s)  # probes before the burst: the idle figure
        start = time.monotonic()
        statuses, wall = asyncio.run(FIRE[client](url, n, frames, model))
        end = time.monotonic()
    during = probe.between(start, end)
    idle = probe.between(0.0, start)
    return {
        "requests": n,
        "frames_per_request": frames,
        "statuses": dict(statuses),
        "wall_s": wall,
        "health_during": latency_summary([s for _, s, _ in during])
        | {"statuses": dict(Counter(str(c) for _, _, c in during))},
        "health_idle": latency_summary([s for _, s, _ in idle]),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--frames", type=int, default=2, help="max_new_tokens of each request")
    ap.add_argument("--probe-every", type=float, default=0.02, help="seconds between probes")
    ap.add_argument("--model", default="qwen3-tts-tiny")
    ap.add_argument("--idle", type=float, default=0.3, help="seconds of probes before the burst")
    ap.add_argument("--client", choices=sorted(FIRE), default="sockets")
    ap.add_argument("--runs", type=int, default=1, help="bursts, one after another")
    args = ap.parse_args()
    for _ in range(args.runs):
        result = burst(
            args.url,
            args.requests,
            args.frames,
            args.probe_every,
            args.model,
            args.idle,
            args.client,
        )
        print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
