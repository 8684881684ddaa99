"""Engine-level talker baseline: ms per frame for the talker step and the code predictor.

    python -m omniflow.bench.talker_baseline --model qwen3_tts_1_7b --platform cuda \
        --batch 1 32 --frames 100 --out result.json

Runs the real scheduler, runner and model (dummy weights, fixed length: EOS ignored), one
batch size at a time, and times every decode step: the talker forward + codebook-0 sample
(`talker_ms`), the 15 code-predictor steps (`predictor_ms`), and the whole engine step
(`step_ms`, including scheduling and input preparation). Prefill steps are excluded. CUDA
timings synchronise the device around each measured call.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import torch

from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from omniflow.core.speech import SpeechRequest
from omniflow.models.qwen3_tts.ar_model import build_ar_model
from omniflow.models.qwen3_tts.factory import DTYPES, build_talker
from omniflow.models.qwen3_tts.processor import TalkerProcessor
from omniflow.platforms.base import PLATFORMS, prepare_device
from omniflow.sched.ar import ARScheduler
from omniflow.stages.engine import StageEngine
from omniflow.stages.runner import ARModelRunner


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[..., Any], sink: list[float], device: torch.device) -> Callable[..., Any]:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        _sync(device)
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        _sync(device)
        sink.append((time.perf_counter() - t0) * 1e3)
        return out

    return wrapper


def run_batch(model: str, platform: str, batch: int, frames: int) -> dict[str, Any]:
    graph = build_graph(
        compose(
            [
                "pipeline=qwen3_tts",
                f"model={model}",
                f"platform={platform}",
                f"pipeline.stages.talker.scheduler.max_num_seqs={max(batch, 1)}",
            ]
        )
    )
    device = torch.device(graph.platform.device)
    prepare_device(device.type)
    stage = graph.stages["talker"]
    t0 = time.perf_counter()
    bundle = build_talker(graph.model, device)
    build_s = time.perf_counter() - t0
    runner = ARModelRunner(
        build_ar_model(bundle),
        stage.scheduler,
        device,
        DTYPES[graph.platform.dtype],
        batched_decode=PLATFORMS[graph.platform.name].batched_decode_attention,
    )
    engine = StageEngine("talker", ARScheduler(stage.scheduler), runner)
    proc = TalkerProcessor(bundle.tokenizer, bundle.vocab, stage.scheduler.max_model_len)
    talker_ms: list[float] = []
    predictor_ms: list[float] = []
    talker = bundle.talker
    talker.forward = _timed(talker.forward, talker_ms, device)  # type: ignore[method-assign]
    talker.complete_frames = _timed(  # type: ignore[method-assign]
        talker.complete_frames, predictor_ms, device
    )
    for i in range(batch):
        engine.add_request(
            proc.make_request(
                SpeechRequest(
                    f"r{i}",
                    f"Benchmark sentence number {i}.",
                    voice="vivian",
                    seed=i,
                    max_new_tokens=frames,
                    ignore_eos=True,
                )
            )
        )
    step_ms: list[float] = []
    decode_talker: list[float] = []
    decode_pred: list[float] = []
    produced = 0
    while engine.has_work:
        n_t, n_p = len(talker_ms), len(predictor_ms)
        _sync(device)
        t = time.perf_counter()
        outs = engine.step()
        _sync(device)
        dt = (time.perf_counter() - t) * 1e3
        produced += sum(len(o.tokens) for o in outs)
        decode = len(talker_ms) > n_t and len(predictor_ms) > n_p and engine.num_steps > 1
        if decode:
            step_ms.append(dt)
            decode_talker.append(talker_ms[-1])
            decode_pred.append(predictor_ms[-1])

    # the first step is the prefill: drop it (and its predictor call) from the decode series
    def summary(xs: list[float]) -> dict[str, float]:
        xs = xs[1:] if len(xs) > 1 else xs
        return {
            "mean": statistics.fmean(xs),
            "median": statistics.median(xs),
            "p90": sorted(xs)[int(0.9 * (len(xs) - 1))],
            "n": len(xs),
        }

    return {
        "model": model,
        "platform": graph.platform.name,
        "dtype": graph.platform.dtype,
        "batch": batch,
        "frames_per_request": frames,
        "frames_produced": produced,
        "build_s": build_s,
        "talker_ms_per_step": summary(decode_talker),
        "predictor_ms_per_step": summary(decode_pred),
        "engine_step_ms": summary(step_ms),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="qwen3_tts_1_7b")
    ap.add_argument("--platform", default="auto")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 32])
    ap.add_argument("--frames", type=int, default=100)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    # The GPU machine gets a copy of the tree without .git: OMNIFLOW_COMMIT names the commit.
    commit = (
        os.environ.get("OMNIFLOW_COMMIT")
        or subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False
        ).stdout.strip()
    )
    results = []
    for b in args.batch:
        r = run_batch(args.model, args.platform, b, args.frames)
        r["commit"] = commit
        r["date"] = datetime.now(UTC).isoformat(timespec="seconds")
        if torch.cuda.is_available():
            r["device_name"] = torch.cuda.get_device_name()
        print(json.dumps(r), flush=True)
        results.append(r)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
