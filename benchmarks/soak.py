"""Soak: steady load plus clients that stop reading, watched through /metrics until idle.

    python -m benchmarks.soak --minutes 5 --concurrency 32 --stalled 20 --out soak/
    python -m benchmarks.soak --url http://127.0.0.1:8000 ...   # a server already running

Not run in CI (docs/reliability.md has its figures). Unless `--url` is given it starts
`python -m omniflow serve server.port=0` with `--serve` overrides (default: none, the
embedded default), so the memory it reports is the server's alone. For `--minutes`, each of
`--rounds` times, it keeps `--concurrency` streamed requests running (the shipped prompts in
fixed-length mode, read in full) and `--stalled` clients that read the response headers and
a few kilobytes, then nothing for `--hold` seconds (longer than it takes the server to pause
them and then drop them) before reading what is left and starting again. Every `--every`
seconds it reads /metrics: resident memory, KV blocks and decoder slots in use, requests
running, waiting and paused, buffered audio. After each round it waits for the gauges to
return to idle, and reads resident memory again `--settle` seconds later (the server gives
its free heap back once idle); after the last it fires `--burst` requests at once while
probing /health (`benchmarks.burst`), and writes `soak.json` (settings, per round the
samples, totals, peaks and the idle check, then the burst) under `--out`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import socket
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.burst import burst
from omniflow.bench.client import DEFAULT_PROMPTS, load_prompts
from omniflow.provenance import commit
from omniflow.serve.ready import READY

GAUGES = {
    "rss_mb": "process_resident_memory_bytes",
    "kv_blocks": "omniflow_kv_blocks_in_use",
    "decoder_slots": "omniflow_decoder_slots_in_use",
    "running": "omniflow_requests_running",
    "waiting": "omniflow_requests_waiting",
    "paused": "omniflow_requests_paused",
    "buffered_audio_s": "omniflow_buffered_audio_seconds",
    "in_flight": "omniflow_requests_in_flight",
}
IDLE_KEYS = ("kv_blocks", "decoder_slots", "running", "waiting", "paused", "in_flight")


def gauges(url: str) -> dict[str, float]:
    """The soak's gauges from one /metrics scrape, each summed over stages."""
    text = httpx.get(url + "/metrics", timeout=30).text
    values: Counter[str] = Counter()
    names = {v: k for k, v in GAUGES.items()}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in names:
                values[names[sample.name]] += sample.value
    values["rss_mb"] /= 2**20
    return dict(values)


def start_server(overrides: list[str], log_path: Path) -> tuple[subprocess.Popen[str], str]:
    """`omniflow serve` on a free loopback port; its log goes to `log_path`."""
    cmd = [sys.executable, "-m", "omniflow", "serve", "server.port=0", *overrides]
    proc = subprocess.Popen(cmd, stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    assert proc.stderr is not None
    log = log_path.open("w")
    for line in proc.stderr:
        log.write(line)
        if m := re.search(r"on (http://[\d.]+:\d+)", line):
            url = m.group(1)
        if READY in line:
            threading.Thread(target=lambda: log.writelines(proc.stderr), daemon=True).start()
            return proc, url
    raise RuntimeError(f"server did not start; see {log_path}")


async def reader(
    url: str, prompts: list[Any], first: int, deadline: float, totals: Counter[str]
) -> None:
    """One steady client: streamed requests read in full, back to back, until `deadline`."""
    async with httpx.AsyncClient(timeout=600) as client:
        i = first
        while time.monotonic() < deadline:
            p = prompts[i % len(prompts)]
            i += 1
            body = {"model": "qwen3-tts-tiny", "voice": "vivian", "input": p.text}
            body |= {"response_format": "pcm", "stream": True, "ignore_eos": True}
            body["max_new_tokens"] = p.frames
            try:
                async with client.stream("POST", url + "/v1/audio/speech", json=body) as r:
                    size = sum([len(c) async for c in r.aiter_bytes()])
                ok = r.status_code == 200 and size == p.frames * 1920 * 2
                totals["ok" if ok else f"bad {r.status_code}"] += 1
                totals["audio_s"] += size / 48000 if ok else 0
            except httpx.HTTPError as exc:
                totals[f"failed {type(exc).__name__}"] += 1


async def stalled(host: str, port: int, hold_s: float, deadline: float, totals: Counter) -> None:
    """A client that reads the headers and a little audio, then nothing for `hold_s`; then
    it reads what is left: a body cut short means the server dropped it (as it should)."""
    body = json.dumps(
        {"model": "qwen3-tts-tiny", "voice": "vivian", "input": "I stop reading now."}
        | {"response_format": "pcm", "stream": True, "ignore_eos": True, "max_new_tokens": 2000}
    ).encode()
    head = (
        f"POST /v1/audio/speech HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    ).encode()
    loop = asyncio.get_running_loop()
    first = True
    while first or time.monotonic() + hold_s < deadline:  # no session outlives the load
        first = False
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # a small window
        sock.setblocking(False)
        await loop.sock_connect(sock, (host, port))
        r, w = await asyncio.open_connection(sock=sock)
        w.write(head + body)
        await r.readexactly(4096)
        await asyncio.sleep(hold_s)  # the stall itself (the thing under test)
        try:
            rest = await asyncio.wait_for(r.read(), timeout=60)
            totals["completed" if rest.endswith(b"0\r\n\r\n") else "dropped"] += 1
        except TimeoutError:
            totals["still streaming after the hold"] += 1
        w.close()


async def load(url: str, args: argparse.Namespace, totals: Counter, stalls: Counter) -> None:
    prompts = load_prompts(DEFAULT_PROMPTS, 256)
    deadline = time.monotonic() + 60 * args.minutes
    host, port = url.split("//")[1].split(":")
    tasks = [reader(url, prompts, i, deadline, totals) for i in range(args.concurrency)]
    tasks += [stalled(host, int(port), args.hold, deadline, stalls) for _ in range(args.stalled)]
    await asyncio.gather(*tasks)


def sample(url: str, t0: float, stop: threading.Event, every_s: float, out: list) -> None:
    while not stop.wait(every_s):
        out.append({"t_s": round(time.monotonic() - t0, 1)} | gauges(url))
        print(json.dumps(out[-1]), flush=True)


def wait_idle(url: str, timeout_s: float) -> tuple[float, dict[str, float]]:
    t0 = time.monotonic()
    while True:
        g = gauges(url)
        if all(g.get(k, 0) == 0 for k in IDLE_KEYS) and g.get("buffered_audio_s", 0) == 0:
            return time.monotonic() - t0, g
        if time.monotonic() - t0 > timeout_s:
            return float("nan"), g
        time.sleep(0.5)


def soak_round(url: str, args: argparse.Namespace, index: int) -> dict[str, Any]:
    """One load phase, sampled, then the wait for idle."""
    samples: list[dict[str, float]] = []
    stop = threading.Event()
    t0 = time.monotonic()
    sampler = threading.Thread(target=sample, args=(url, t0, stop, args.every, samples))
    sampler.start()
    totals: Counter[str] = Counter()
    stalls: Counter[str] = Counter()
    try:
        asyncio.run(load(url, args, totals, stalls))
    finally:
        stop.set()
        sampler.join()
    seconds_to_idle, idle = wait_idle(url, 120)
    return {
        "round": index,
        "requests": dict(totals),
        "stalled_clients": dict(stalls),
        "peak": {k: max(s.get(k, 0) for s in samples) for k in GAUGES} if samples else {},
        "idle_after": idle | {"seconds_to_idle": seconds_to_idle},
        "rss_settled_mb": settled_rss(url, args.settle),
        "samples": samples,
    }


def settled_rss(url: str, settle_s: float) -> float:
    """Resident memory `settle_s` after the server went idle: it returns its allocator's
    free heap once idle for `serve.memory.IDLE_TRIM_S` (docs/reliability.md)."""
    time.sleep(settle_s)  # a fixed wait on purpose: the figure is "some seconds after idle"
    return gauges(url)["rss_mb"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--url", default=None, help="a running server (default: start one)")
    ap.add_argument("--serve", nargs="*", default=[], help="overrides for the started server")
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=1, help="load phases, each followed by idle")
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--stalled", type=int, default=20)
    # On Linux loopback the server's socket send buffer grows to net.ipv4.tcp_wmem's max
    # (4 MiB, ~40 s of PCM) before a client that does not read blocks a send: the hold has
    # to outlast filling it, then the server's own buffer, then the stalled-client timeout.
    ap.add_argument("--hold", type=float, default=240.0, help="seconds a stalled client waits")
    ap.add_argument("--every", type=float, default=5.0, help="seconds between samples")
    ap.add_argument(
        "--settle", type=float, default=3.0, help="seconds after idle to read memory again"
    )
    ap.add_argument("--burst", type=int, default=1000)
    ap.add_argument("--out", default="soak")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    proc, url = (None, args.url) if args.url else start_server(args.serve, out / "server.log")
    try:
        warm = {"model": "qwen3-tts-tiny", "voice": "vivian", "input": "Warm up."}
        httpx.post(url + "/v1/audio/speech", json=warm, timeout=120).raise_for_status()
        idle_before = gauges(url) | {"rss_settled_mb": settled_rss(url, args.settle)}
        rounds = [soak_round(url, args, i + 1) for i in range(args.rounds)]
        burst_result = burst(url, args.burst, 2, 0.02, "qwen3-tts-tiny") if args.burst else None
        after_burst = wait_idle(url, 120)[1]
    finally:
        if proc is not None:
            proc.terminate()
            proc.wait(timeout=60)
    result = {
        "command": "python -m benchmarks.soak " + " ".join(sys.argv[1:]),
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": commit(),
        "settings": vars(args),
        "idle_before": idle_before,
        "rounds": rounds,
        "burst": burst_result,
        "after_burst": after_burst,
    }
    (out / "soak.json").write_text(json.dumps(result, indent=2))
    brief = {k: v for k, v in result.items() if k != "rounds"}
    brief["rounds"] = [{k: v for k, v in r.items() if k != "samples"} for r in rounds]
    print(json.dumps(brief, indent=2))


if __name__ == "__main__":
    main()
