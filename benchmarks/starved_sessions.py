"""What text-starved WebSocket sessions cost everyone else (issue 37's goal: c32 closed-loop
throughput with 8 of them open within 2 % of without).

    python -m benchmarks.starved_sessions --url http://127.0.0.1:8000 --starved 8 \
        --concurrency 32 --num-prompts 128 --max-frames 50 --model MODEL

Against a running `omniflow serve` (its `server.ws_idle_timeout_s` longer than the run): the
closed-loop load generator (`omniflow.bench.client`, its own process) runs once alone, then
once while `--starved` incremental sessions (`WS /v1/audio/speech/stream`) each hold a
request that has had its first words and waits for the rest; the rounds alternate
`--rounds` times. Prints each round's throughput and the ratio of the medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from pathlib import Path

from websockets.sync.client import ClientConnection, connect

from omniflow.bench.client import completed

FIRST_WORDS = "These first words start a request that then waits for the rest "
QUIET_S = 2.0
"""A session that sent no audio for this long has spoken its words and is text-starved."""


def open_starved(url: str, model: str, voice: str) -> ClientConnection:
    """A session whose utterance has started and is waiting for more text (not ended)."""
    ws = connect(url.replace("http", "ws", 1) + "/v1/audio/speech/stream")
    config = {"type": "session.config", "model": model, "voice": voice, "incremental": True}
    ws.send(json.dumps({**config, "response_format": "pcm", "stream_audio": True}))
    ws.send(json.dumps({"type": "input.text", "text": FIRST_WORDS}))
    while not isinstance(message := ws.recv(timeout=60), bytes):  # its first audio: running
        event = json.loads(message)
        if event["type"] == "error":
            raise RuntimeError(f"a starved session was refused: {event['message']}")
    try:  # the audio of its first words, until none comes: it waits for text now
        while True:
            ws.recv(timeout=QUIET_S)
    except TimeoutError:
        return ws


def closed_loop(args: argparse.Namespace) -> dict:
    """One run of the closed-loop load generator; its summary."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.json"
        cmd = [sys.executable, "-m", "omniflow.bench.client", f"--url={args.url}"]
        cmd += [f"--concurrency={args.concurrency}", f"--num-prompts={args.num_prompts}"]
        cmd += [f"--max-frames={args.max_frames}", f"--model={args.model}"]
        cmd += [f"--voice={args.voice}", "--warmup=0", f"--out={out}"]
        done = subprocess.run(cmd, check=False, stdout=subprocess.DEVNULL)
        if not completed(done.returncode, out):  # failed requests are in the summary
            raise subprocess.CalledProcessError(done.returncode, cmd)
        return json.loads(out.read_text())["summary"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", default="http://127.0.0.1:8000")
    ap.add_argument("--starved", type=int, default=8)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--num-prompts", type=int, default=128)
    ap.add_argument("--max-frames", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--model", default="qwen3-tts-tiny")
    ap.add_argument("--voice", default="vivian")
    args = ap.parse_args()
    warm = argparse.Namespace(**{**vars(args), "num_prompts": args.concurrency})
    closed_loop(warm)  # one-offs (first requests, graph buckets) before anything counts
    rows: dict[str, list[float]] = {"alone": [], "starved": []}
    for _ in range(args.rounds):
        rows["alone"].append(closed_loop(args)["audio_throughput"])
        with ExitStack() as sessions:
            for _ in range(args.starved):
                sessions.enter_context(open_starved(args.url, args.model, args.voice))
            rows["starved"].append(closed_loop(args)["audio_throughput"])
    alone, starved = (statistics.median(v) for v in rows.values())
    print(json.dumps({**rows, "ratio_of_medians": starved / alone, "args": vars(args)}, indent=2))


if __name__ == "__main__":
    main()
