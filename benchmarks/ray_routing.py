"""Ray Serve routing on a local cluster: `deploy.router=default` against `least_loaded`
(docs/performance.md, "Ray Serve routing (CPU)"; docs/deploy.md, Routing).

    python -m benchmarks.ray_routing --bursts 4 6 8 --repeats 5

For each router in turn: a local Ray cluster of `--cpus` CPUs, `--replicas` replicas of the
model (`--model`, tiny CustomVoice by default), a warm-up request to each replica; then, per
burst size N, `--repeats` bursts of N streamed PCM requests sent at the same instant (one
asyncio loop; each waits for the cluster to be idle and every replica to have reported so).
Prints one markdown row per (router, N): how the streams split between replicas (the
`x-omniflow-replica` header), and p50/p95 of the time to the first audio byte and to the
end of the stream. `--json` writes every request's numbers too."""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import statistics
import time
from collections import Counter
from typing import Any

import httpx

from omniflow.deploy.header import REPLICA_HEADER


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def one(client: httpx.AsyncClient, url: str, body: dict) -> dict[str, Any]:
    """One streamed request: its replica, seconds to the first audio byte and to the end."""
    start = time.perf_counter()
    first = None
    async with client.stream("POST", f"{url}/v1/audio/speech", json=body) as response:
        async for chunk in response.aiter_bytes():
            if chunk and first is None:
                first = time.perf_counter() - start
    return {
        "status": response.status_code,
        "replica": response.headers.get(REPLICA_HEADER, "?"),
        "ttfb_s": first,
        "e2e_s": time.perf_counter() - start,
    }


async def burst(url: str, body: dict, n: int) -> list[dict[str, Any]]:
    limits = httpx.Limits(max_connections=n, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        return await asyncio.gather(*(one(client, url, body) for _ in range(n)))


def idle(url: str, settle_s: float) -> None:
    """Wait until no replica holds a request, then `settle_s` more (every report says so)."""
    while httpx.get(f"{url}/health", timeout=30).json().get("in_flight", 1):
        time.sleep(0.2)
    time.sleep(settle_s)


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def row(router: str, n: int, bursts: list[list[dict]]) -> dict[str, Any]:
    splits = [sorted(Counter(r["replica"] for r in b).values(), reverse=True) for b in bursts]
    splits = [s + [0] * (2 - len(s)) for s in splits]
    flat = [r for b in bursts for r in b]
    ttfb = [r["ttfb_s"] for r in flat if r["ttfb_s"] is not None]
    e2e = [r["e2e_s"] for r in flat]
    return {
        "router": router,
        "n": n,
        "splits": [":".join(map(str, s)) for s in splits],
        "even": sum(1 for s in splits if s[0] - s[-1] <= n % 2),
        "errors": sum(1 for r in flat if r["status"] != 200),
        "ttfb_p50_ms": 1000 * statistics.median(ttfb),
        "ttfb_p95_ms": 1000 * pct(ttfb, 0.95),
        "e2e_p50_s": statistics.median(e2e),
        "e2e_p95_s": pct(e2e, 0.95),
    }


def run_router(router: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    import ray
    from ray import serve

    from omniflow.config.compose import compose
    from omniflow.config.resolve import build_graph
    from omniflow.deploy.launch import start
    from omniflow.deploy.settings import resolve_deploy

    overrides = ["platform=cpu", f"model={args.model}", "deploy=ray"]
    overrides += [f"deploy.replicas={args.replicas}", f"deploy.router={router}"]
    overrides += [f"server.port={free_port()}", "server.log_level=warning"]
    spec = compose(overrides)
    body = {"model": spec.model.name, "voice": args.voice, "input": args.text}
    body |= {"response_format": "pcm", "stream": True, "ignore_eos": True, "seed": 1}
    body |= {"max_new_tokens": args.tokens}
    ray.init(num_cpus=args.cpus, include_dashboard=False, log_to_driver=False)
    try:
        url = start(spec, resolve_deploy(spec.deploy, build_graph(spec)))
        seen: set[str] = set()
        while len(seen) < args.replicas:  # one warm-up request per replica, one at a time
            seen.add(asyncio.run(burst(url, body, 1))[0]["replica"])
        rows = []
        for n in args.bursts:
            bursts = []
            for _ in range(args.repeats):
                idle(url, args.settle_s)
                bursts.append(asyncio.run(burst(url, body, n)))
            rows.append(row(router, n, bursts) | {"requests": bursts})
            print(json.dumps({k: v for k, v in rows[-1].items() if k != "requests"}), flush=True)
        return rows
    finally:
        serve.shutdown()
        ray.shutdown()


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| router | N | splits (per burst) | even | TTFB p50 / p95 ms | end-to-end p50 / p95 s |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r['router']} | {r['n']} | {' '.join(r['splits'])} | "
            f"{r['even']}/{len(r['splits'])} | {r['ttfb_p50_ms']:.0f} / {r['ttfb_p95_ms']:.0f} | "
            f"{r['e2e_p50_s']:.2f} / {r['e2e_p95_s']:.2f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--routers", nargs="+", default=["default", "least_loaded"])
    parser.add_argument("--bursts", nargs="+", type=int, default=[4, 6, 8])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--model", default="qwen3_tts_tiny")
    parser.add_argument("--voice", default="vivian")
    parser.add_argument("--text", default="A burst of requests, routed between the replicas.")
    parser.add_argument("--tokens", type=int, default=40, help="frames per request (ignore_eos)")
    parser.add_argument("--settle-s", type=float, default=2.5, help="idle time before a burst")
    parser.add_argument("--json", help="write every row, with each request's numbers, here")
    args = parser.parse_args()
    rows = [r for router in args.routers for r in run_router(router, args)]
    print(table(rows))
    if args.json:
        with open(args.json, "w") as out:
            json.dump(rows, out, indent=1)


if __name__ == "__main__":
    main()
