"""Where a captured graph spends its time: kernel by kernel, in launch order, with the idle
gap before each. On CUDA. Four graphs: the code predictor's frame (`--graph predictor`, rows
`--batch`), the talker's decode step (`--graph decode`, rows `--batch` of `--context`
cached tokens each), a whole-prompt prefill over the talker's layers (`--graph prompt`, a token
bucket of `--tokens`: the first audio's largest part at c1), and the fused pipeline's
streaming codec decoder (`--graph codec`, rows `--batch`, `--frames` new frames per row: 1
for a single step and a request's first audio, `window_k` for a window's pass; in the
preset's `codec_dtype`, or `--codec-dtype`).

    OMNIFLOW_COMMIT=$(git rev-parse --short HEAD) python -m benchmarks.graph_trace \
        --model qwen3_tts_1_7b --batch 1 --out trace.json
    python -m benchmarks.graph_trace --graph prompt --tokens 128 --out prompt.json
    python -m benchmarks.graph_trace --graph codec --batch 128 --frames 8 --out codec.json
    python -m benchmarks.graph_trace --graph decode --batch 128 --context 100

Why: at batch 1 the code predictor's frame graph (~630 kernels) takes about twice its
kernels' summed time (docs/performance.md). Whether the rest is idle time between kernels
(which programmatic dependent launch or fewer launches would recover) or slow kernels is
read off the trace: per replay, the graph's wall time (CUDA events, no profiler), the sum
of kernel durations, and the gaps (one kernel's start minus the previous one's end) under
the profiler. Also printed: the kernels grouped by name with count, time and gap before
them. Every build applies the platform's process-wide settings first (`prepare_device`), as
a served pipeline does. The model is the named preset with dummy weights in its configured
dtype; the frame graph is the one the fused pipeline builds (`PredictorGraphs` with the
runner's fixed-policy draw).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from collections import defaultdict
from functools import partial
from pathlib import Path

import torch

from benchmarks.gemv_bench import provenance, replay_median_us
from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from omniflow.models.qwen3_tts.ar_model import SUBTALKER_TOP_K
from omniflow.models.qwen3_tts.codec_graph import DecoderStepGraphs
from omniflow.models.qwen3_tts.codec_loader import load_codec
from omniflow.models.qwen3_tts.codec_stream import StreamingDecoder
from omniflow.models.qwen3_tts.decode_graph import TalkerDecodeGraphs
from omniflow.models.qwen3_tts.factory import DTYPES, build_talker
from omniflow.models.qwen3_tts.predictor_graph import PredictorGraphs
from omniflow.models.qwen3_tts.prompt_graph import PromptGraphs
from omniflow.platforms.base import prepare_device
from omniflow.sampling.draw import draw_fixed_policy


def build_graphs(model: str, batch: int) -> PredictorGraphs:
    """The preset's talker (dummy weights, on the GPU) and its frame graph for `batch`
    (`.graphs[batch]`; keep the returned holder while replaying, as for the prompt graph)."""
    graph = build_graph(compose([f"model={model}", "platform=cuda"]))
    prepare_device("cuda", graph.platform.cudnn_benchmark)
    bundle = build_talker(graph.model, torch.device("cuda"))
    talker = bundle.talker
    graphs = PredictorGraphs(
        talker.predictor,
        talker.weights.talker.model.codec_embedding,
        partial(draw_fixed_policy, top_k=SUBTALKER_TOP_K),
        max_batch=batch,
        buckets=(batch,),
    )
    graphs.capture_all()
    return graphs


def build_prompt_graph(model: str, tokens: int) -> PromptGraphs:
    """The preset's talker (dummy weights, on the GPU) and its prompt-prefill graph for a
    bucket of `tokens` (`.graphs[tokens]`), over KV caches of the runner's layout (one pair
    per layer, a dummy slot past the pool where padding rows write). Replayed over zero
    embeddings: the same kernels and shapes as a real prompt of that bucket. Keep the
    returned holder while replaying: its static buffers and caches are what the graph reads
    and writes."""
    graph = build_graph(compose([f"model={model}", "platform=cuda"]))
    prepare_device("cuda", graph.platform.cudnn_benchmark)  # as served
    talker = build_talker(graph.model, torch.device("cuda")).talker
    shape = talker.shape
    slots = max(4096, tokens)
    dtype = graph.model.dtype or "float32"
    caches = [
        tuple(
            torch.zeros(
                slots + 1,
                shape.num_kv_heads,
                shape.head_dim,
                device="cuda",
                dtype=DTYPES[dtype],
            )
            for _ in range(2)
        )
        for _ in range(talker.num_layers)
    ]
    prompts = PromptGraphs(
        talker,
        caches,
        max_tokens=tokens,
        max_positions=slots,
        dummy_slot=slots,
        buckets=(tokens,),
    )
    prompts.capture_all()
    return prompts


def build_talker_graph(model: str, batch: int, context: int, block_size: int = 16):
    """The preset's talker (dummy weights, on the GPU) and its decode-step graph for `batch`
    rows (`.graphs[batch]`), each row with `context` cached tokens on blocks of its own (as
    `batch` requests mid-stream have: the paged kernel reads context lengths and block
    tables from the graph's static buffers at replay, so they are set after the capture).
    Keep the returned holder while replaying, as for the other graphs."""
    graph = build_graph(compose([f"model={model}", "platform=cuda"]))
    prepare_device("cuda", graph.platform.cudnn_benchmark)
    talker = build_talker(graph.model, torch.device("cuda")).talker
    shape = talker.shape
    per_row = -(-context // block_size)
    slots = batch * per_row * block_size
    dtype = DTYPES[graph.model.dtype or "float32"]
    caches = [
        tuple(
            torch.zeros(slots + 1, shape.num_kv_heads, shape.head_dim, device="cuda", dtype=dtype)
            for _ in range(2)
        )
        for _ in range(talker.num_layers)
    ]
    graphs = TalkerDecodeGraphs(
        talker,
        caches,
        block_size,
        max_batch=batch,
        max_blocks=per_row,
        max_positions=context + 1,
        dummy_slot=slots,
        buckets=(batch,),
    )
    graphs.capture_all()
    rows = torch.arange(batch * per_row, device="cuda", dtype=torch.int32).view(batch, per_row)
    graphs.block_tables[:batch].copy_(rows)
    graphs.context_lens[:batch].fill_(context)
    graphs.positions[:batch].fill_(context - 1)
    last = rows[:, (context - 1) // block_size].to(torch.int64) * block_size
    graphs.slot_mapping[:batch].copy_(last + (context - 1) % block_size)
    return graphs


def build_codec_graph(
    model: str, batch: int, frames: int, codec_dtype: str | None = None
) -> DecoderStepGraphs:
    """The preset's streaming codec decoder (dummy weights, on the GPU, in its `codec_dtype`
    unless given) and its graph for `batch` rows of `frames` new frames each
    (`.graphs[batch]`), over a slot pool of `batch` slots. Replayed over zero codes, each row
    on a slot of its own: the same kernels, shapes and state traffic as `batch` requests'
    step. Keep the returned holder while replaying, as for the other graphs."""
    overrides = [f"model={model}", "platform=cuda"]
    if codec_dtype is not None:
        overrides.append(f"model.codec_dtype={codec_dtype}")
    graph = build_graph(compose(overrides))
    # The process-wide settings a served fused pipeline runs its decoder under: with
    # cuDNN's benchmark on, a convolution's kernel is the fastest of those it times, else a
    # heuristic's pick (a bf16 dilated one took 11.5 ms of a 52 ms pass that way).
    prepare_device("cuda", graph.platform.cudnn_benchmark)
    spec = graph.model
    dtype = DTYPES[graph.platform.codec_dtype]
    weights = load_codec(spec.codec, None, spec.seed + 1).to(device="cuda", dtype=dtype).eval()
    decoder = StreamingDecoder(weights.decoder, batch, torch.device("cuda"), dtype)
    graphs = DecoderStepGraphs(decoder, batch, buckets=(batch,), frames=frames)
    graphs.capture_all()
    # Distinct slots, as `batch` requests have: the padding slot in every row would read and
    # write one slot's state `batch` times, mostly from L2, and understate the state copies.
    graphs.slot_ids[:batch].copy_(torch.arange(batch, device=graphs.slot_ids.device))
    return graphs


def kernel_spans(trace: Path) -> list[tuple[str, float, float]]:
    """(name, start us, duration us) of every GPU kernel in a chrome trace, by start."""
    events = json.loads(trace.read_text())["traceEvents"]
    spans = [
        (e["name"], float(e["ts"]), float(e["dur"]))
        for e in events
        if e.get("ph") == "X" and e.get("cat") == "kernel"
    ]
    return sorted(spans, key=lambda s: s[1])


def split_replays(spans: list[tuple[str, float, float]], replays: int) -> list[list]:
    """The spans cut into `replays` equal runs (every replay launches the same kernels)."""
    per = len(spans) // replays
    if per * replays != len(spans):
        raise RuntimeError(f"{len(spans)} kernels do not split into {replays} replays")
    return [spans[i * per : (i + 1) * per] for i in range(replays)]


def replay_stats(replay: list[tuple[str, float, float]]) -> dict:
    """Wall, kernel and gap time of one replay, and its kernels by name."""
    gaps = [0.0] + [
        max(0.0, s - (ps + pd)) for (_, ps, pd), (_, s, _) in zip(replay, replay[1:], strict=False)
    ]
    by_name: dict[str, list[float]] = defaultdict(lambda: [0, 0.0, 0.0])
    for (name, _, dur), gap in zip(replay, gaps, strict=True):
        row = by_name[name[:80]]
        row[0] += 1
        row[1] += dur
        row[2] += gap
    first, last = replay[0], replay[-1]
    return {
        "kernels": len(replay),
        "wall_us": last[1] + last[2] - first[1],
        "kernel_us": sum(d for _, _, d in replay),
        "gap_us": sum(gaps),
        "by_name": sorted(
            ({"name": n, "count": c, "us": t, "gap_us": g} for n, (c, t, g) in by_name.items()),
            key=lambda r: -(r["us"] + r["gap_us"]),
        ),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--model", default="qwen3_tts_1_7b")
    ap.add_argument(
        "--graph", choices=("predictor", "prompt", "codec", "decode"), default="predictor"
    )
    ap.add_argument("--batch", type=int, default=1, help="predictor, codec, decode: rows")
    ap.add_argument("--context", type=int, default=100, help="decode: cached tokens per row")
    ap.add_argument("--frames", type=int, default=1, help="codec: new frames per row")
    ap.add_argument(
        "--codec-dtype", choices=sorted(DTYPES), default=None, help="codec: else the preset's"
    )
    ap.add_argument("--tokens", type=int, default=128, help="prompt: the token bucket")
    ap.add_argument("--reps", type=int, default=50, help="timed replays (no profiler)")
    ap.add_argument("--traced", type=int, default=5, help="replays under the profiler")
    ap.add_argument("--out", default="graph_trace.json")
    args = ap.parse_args()
    if args.graph != "codec" and (args.frames != 1 or args.codec_dtype is not None):
        ap.error("--frames and --codec-dtype are for --graph codec")
    if not torch.cuda.is_available():
        sys.exit("graph_trace needs a CUDA GPU")
    # The holder stays referenced: dropped, it frees the graph's static inputs and caches,
    # and a replay over reused memory reads garbage indices (a device-side assert).
    if args.graph == "prompt":
        k, holder = args.tokens, build_prompt_graph(args.model, args.tokens)
    elif args.graph == "decode":
        k, holder = args.batch, build_talker_graph(args.model, args.batch, args.context)
    elif args.graph == "codec":
        k = args.batch
        holder = build_codec_graph(args.model, k, args.frames, args.codec_dtype)
    else:
        k, holder = args.batch, build_graphs(args.model, args.batch)
    graph = holder.graphs[k]
    replay_us = replay_median_us(graph, args.reps, calls=1)
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(args.traced):
            graph.replay()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        replays = split_replays(kernel_spans(path), args.traced)
    stats = [replay_stats(r) for r in replays]
    best = min(stats, key=lambda s: s["wall_us"])
    result = {
        **provenance(),
        "model": args.model,
        "graph": args.graph,
        "tokens" if args.graph == "prompt" else "batch": k,
        **(
            {"frames": args.frames, "codec_dtype": str(holder.decoder.dtype)}
            if args.graph == "codec"
            else {"context": args.context}
            if args.graph == "decode"
            else {}
        ),
        "replay_us_median": replay_us,
        "traced": {key: best[key] for key in ("kernels", "wall_us", "kernel_us", "gap_us")},
        "by_name": best["by_name"],
        "order": [(n[:60], round(s - replays[0][0][1], 2), round(d, 2)) for n, s, d in replays[0]],
    }
    Path(args.out).write_text(json.dumps(result, indent=1))
    t = result["traced"]
    print(
        f"{args.graph} {k}: replay {result['replay_us_median']:.1f} us (no profiler); traced "
        f"{t['kernels']} kernels, wall {t['wall_us']:.1f} us = kernels {t['kernel_us']:.1f} "
        f"+ gaps {t['gap_us']:.1f}"
    )
    for row in best["by_name"][:25]:
        print(f"{row['count']:5d} {row['us']:9.1f} us {row['gap_us']:9.1f} gap  {row['name']}")


if __name__ == "__main__":
    main()
