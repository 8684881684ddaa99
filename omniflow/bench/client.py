"""HTTP load generator for `/v1/audio/speech` (docs/benchmarks.md), fixed-length mode.

    python -m omniflow.bench.client --url http://127.0.0.1:8000 --concurrency 1 \
        --num-prompts 8 --warmup 1

Prompts default to the shipped LibriSpeech set (omniflow/bench/data/); --prompts FILE.jsonl
takes rows of {"text": ..., "seconds": ...}.

Each prompt asks for round(seconds x 12.5) frames (at most --max-frames) with EOS ignored, so
runs with dummy weights are comparable. Per request: ttfp (request sent -> first audio bytes),
e2el (-> end of stream), audio seconds (bytes / 48,000), rtf = e2el / audio seconds. Warm-ups
are excluded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import httpx
from tqdm import tqdm

FRAME_RATE = 12.5
DEFAULT_PROMPTS = Path(__file__).parent / "data" / "librispeech_pc_test_clean.jsonl"
BYTES_PER_SECOND = 2 * 24000


@dataclass(frozen=True)
class Prompt:
    text: str
    frames: int


@dataclass(frozen=True)
class Sample:
    ttfp: float
    e2el: float
    audio_s: float
    underrun_s: float
    """Worst buffer deficit of a player that starts playing at the first audio bytes."""

    @property
    def rtf(self) -> float:
        return self.e2el / self.audio_s


def load_prompts(path: str | Path, limit: int, max_frames: int = 0) -> list[Prompt]:
    """The first `limit` prompts of a JSONL file, each capped at `max_frames` (0: no cap)."""
    out = []
    with open(path) as f:
        for line in f:
            row = json.loads(line)
            frames = max(1, round(row["seconds"] * FRAME_RATE))
            out.append(Prompt(row["text"], min(frames, max_frames) if max_frames else frames))
            if len(out) == limit:
                break
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
            raise RuntimeError(f"HTTP {r.status_code}: {(await r.aread())[:200]!r}")
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
    return Sample(ttfp or e2el, e2el, size / BYTES_PER_SECOND, underrun)


async def run(
    url: str, prompts: list[Prompt], concurrency: int, warmup: int, model: str, voice: str
) -> tuple[list[Sample], float]:
    # httpx pools at most 100 connections by default: at concurrency 128 the last 28 requests
    # waited for the first ones to end (measured as a second wave on the GPU, half the
    # throughput). One connection per concurrent request, all kept alive between requests.
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        for i in range(warmup):
            await one(client, url, model, voice, prompts[i % len(prompts)], seed=i)
        sem = asyncio.Semaphore(concurrency)

        async def bounded(i: int, p: Prompt) -> Sample:
            async with sem:
                return await one(client, url, model, voice, p, seed=1000 + i)

        t0 = time.perf_counter()
        with tqdm(total=len(prompts), desc="requests", unit=" req", leave=False) as bar:

            async def counted(i: int, p: Prompt) -> Sample:
                sample = await bounded(i, p)
                bar.update(1)
                return sample

            samples = await asyncio.gather(*(counted(i, p) for i, p in enumerate(prompts)))
        return list(samples), time.perf_counter() - t0


def read_samples(path: str | Path) -> tuple[list[Sample], float]:
    """The samples and wall time a `--out` file holds."""
    data = json.loads(Path(path).read_text())
    return [Sample(**s) for s in data["samples"]], data["wall_s"]


def summarize(samples: list[Sample], wall: float) -> dict:
    def stats(xs: list[float]) -> dict:
        return {
            "median": statistics.median(xs),
            "mean": statistics.fmean(xs),
            "min": min(xs),
            "max": max(xs),
        }

    total_audio = sum(s.audio_s for s in samples)
    return {
        "requests": len(samples),
        "ttfp_s": stats([s.ttfp for s in samples]),
        "e2el_s": stats([s.e2el for s in samples]),
        "rtf": stats([s.rtf for s in samples]),
        "underrun_s": stats([s.underrun_s for s in samples]),
        "audio_seconds": total_audio,
        "audio_throughput": total_audio / wall,
        "wall_s": wall,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--prompts", default=str(DEFAULT_PROMPTS))
    ap.add_argument("--num-prompts", type=int, default=8)
    ap.add_argument("--max-frames", type=int, default=0, help="cap per prompt (0: none)")
    ap.add_argument("--concurrency", type=int, default=1)
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--model", default="qwen3-tts-tiny")
    ap.add_argument("--voice", default="vivian")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    prompts = load_prompts(args.prompts, args.num_prompts, args.max_frames)
    samples, wall = asyncio.run(
        run(args.url, prompts, args.concurrency, args.warmup, args.model, args.voice)
    )
    summary = summarize(samples, wall) | {"concurrency": args.concurrency}
    print(json.dumps(summary, indent=2))
    if args.out:
        Path(args.out).write_text(
            json.dumps(
                {"summary": summary, "wall_s": wall, "samples": [asdict(s) for s in samples]},
                indent=2,
            )
        )


if __name__ == "__main__":
    main()
