"""Host time of laying out one prefill step's inputs (`qwen3_tts.inputs.prefill_inputs`):
what the runner pays on the CPU before a mixed step's forward, for `--requests` prompts of the
shipped LibriSpeech texts (byte-level tokenizer, whole-text layout, the tiny preset's ids).

    python -m omniflow.bench.prefill_host --requests 32 128
"""

from __future__ import annotations

import argparse
import time

import torch

from omniflow.bench.client import DEFAULT_PROMPTS, load_prompts
from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from omniflow.core.speech import SpeechRequest
from omniflow.models.interface import PositionSpan
from omniflow.models.qwen3_tts import inputs
from omniflow.models.qwen3_tts.factory import build_talker
from omniflow.models.qwen3_tts.processor import TalkerProcessor


def per_call_ms(requests: int, calls: int = 10) -> tuple[int, float]:
    """(tokens laid out, ms per call) for the first `requests` prompts, whole prompts, each
    call on fresh requests (a prompt is laid out once, at its first prefill)."""
    graph = build_graph(compose(["platform=cpu"]))
    bundle = build_talker(graph.model, torch.device("cpu"))
    proc = TalkerProcessor(bundle.tokenizer, bundle.vocab, 4096)
    prompts = load_prompts(DEFAULT_PROMPTS, requests)
    rounds = []
    for _ in range(calls + 1):
        payloads = [
            proc.make_request(SpeechRequest.create(p.text, request_id=f"r{i}", voice="vivian"))
            for i, p in enumerate(prompts)
        ]
        rounds.append(
            [PositionSpan(r.payload, r.prompt_len, 0, r.prompt_len, ()) for r in payloads]
        )
    inputs.prefill_inputs(rounds[0], bundle.talker.num_groups, torch.device("cpu"))  # warm
    t0 = time.perf_counter()
    for spans in rounds[1:]:
        x = inputs.prefill_inputs(spans, bundle.talker.num_groups, torch.device("cpu"))
    return int(x.side_ids.shape[0]), 1e3 * (time.perf_counter() - t0) / calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--requests", type=int, nargs="+", default=[32, 128])
    args = ap.parse_args()
    for n in args.requests:
        tokens, ms = per_call_ms(n)
        print(f"{n} requests, {tokens} prompt tokens: {ms:.2f} ms per prefill_inputs call")


if __name__ == "__main__":
    main()
