"""GPU checks of `DecoderStepGraphs` (run on the GPU machine: pytest -m cuda -s for the timings).

At the 1.7B preset's codec shapes, dummy weights, fp32 (as the fused pipeline builds its
decoder: `stages.qwen3_tts._stream_decoder`). Replaying a bucket's graph must give what the same
bucket gives eagerly (`capture=False`: the same padding and the same step on a twin decoder
holding the same slot state) to within 1e-5, PCM and carried state, over successive frames
from slots at different positions (fresh, mid-window, about to cross the 72-frame KV window):
fp32 kernels may differ only in which one is selected. Capturing must leave every real slot's
state exactly as it was (the warm-up runs on the padding slot only).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from typing import NamedTuple

import pytest
import torch

from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from omniflow.models.qwen3_tts.codec_graph import DecoderStepGraphs
from omniflow.models.qwen3_tts.codec_loader import load_codec
from omniflow.models.qwen3_tts.codec_modules import CodecDecoder
from omniflow.models.qwen3_tts.codec_stream import StreamingDecoder
from omniflow.platforms.base import prepare_device

pytestmark = pytest.mark.cuda

DEV = torch.device("cuda")
MAX_BATCH = 32
SLOTS = 40
TOL = 1e-5


@pytest.fixture(scope="module")
def codec() -> CodecDecoder:
    """The 1.7B codec decoder with dummy weights, on the GPU in fp32."""
    prepare_device("cuda")  # as the engine does before building a runner
    cfg = build_graph(compose(["platform=cpu", "model=qwen3_tts_1_7b"])).model
    weights = load_codec(cfg.codec, None, cfg.seed + 1)
    return weights.to(device=DEV, dtype=torch.float32).eval().decoder


class Pair(NamedTuple):
    """Captured graphs and the same buckets run eagerly, each over its own slot pool."""

    graphed: DecoderStepGraphs
    eager: DecoderStepGraphs


@pytest.fixture(scope="module")
def pair(codec) -> Pair:
    """Built once; captures persist across the module's tests."""

    def make(capture: bool) -> DecoderStepGraphs:
        dec = StreamingDecoder(codec, SLOTS, DEV, torch.float32)
        return DecoderStepGraphs(dec, MAX_BATCH, capture=capture)

    return Pair(make(True), make(False))


def codes(rows: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2048, (rows, 16), generator=gen).to(DEV)


def start(pair: Pair, frames: list[int], seed: int) -> list[int]:
    """One slot per entry in both pools (the same ids), slot i `frames[i]` frames in, decoded
    eagerly in the graphed pool and copied into the eager one."""
    a, b = pair.graphed.decoder, pair.eager.decoder
    slots = [a.allocate() for _ in frames]
    assert [b.allocate() for _ in frames] == slots
    a.decode(slots, [codes(n, seed + i) for i, n in enumerate(frames)])
    for s in slots:
        b.restore(s, a.snapshot(s))
    return slots


def finish(pair: Pair, slots: list[int]) -> None:
    for s in slots:
        pair.graphed.decoder.release(s)
        pair.eager.decoder.release(s)


def state_diff(a: StreamingDecoder, b: StreamingDecoder, slots: list[int]) -> float:
    """Largest difference over the slots' carried state; inf if a position differs."""
    diffs = []
    for s in slots:
        sa, sb = a.snapshot(s), b.snapshot(s)
        if not torch.equal(sa.pop("position"), sb.pop("position")):
            return float("inf")
        diffs += [(sa[k] - sb[k]).abs().max() for k in sa]
    return torch.stack(diffs).max().item()


@pytest.mark.parametrize("b", [1, 3, 32])
def test_replay_equals_eager(pair, b):
    graphed, eager = pair
    assert graphed.graphed and not eager.graphed
    slots = start(pair, [(70, 0, 35)[i % 3] for i in range(b)], seed=b)
    ids = torch.tensor(slots, device=DEV)
    for step in range(5):
        c = codes(b, 100 * b + step)
        got, want = graphed.run(ids, c), eager.run(ids, c)
        assert got.shape == (b, 1920)
        assert (got - want).abs().max().item() <= TOL
        assert state_diff(graphed.decoder, eager.decoder, slots) <= TOL
    assert float(got.std()) > 0.01
    assert graphed.bucket_for(b) in graphed.graphs
    finish(pair, slots)


def test_batch_above_the_largest_bucket_runs_eager(pair):
    graphed, eager = pair
    b = MAX_BATCH + 2
    slots = start(pair, [i % 5 for i in range(b)], seed=7)
    ids = torch.tensor(slots, device=DEV)
    captured = set(graphed.graphs)
    c = codes(b, 8)
    assert torch.equal(graphed.run(ids, c), eager.run(ids, c))
    assert set(graphed.graphs) == captured
    finish(pair, slots)


def test_capture_leaves_real_slots_untouched(codec):
    """The static buffers hold a real slot (from the last run) when the other buckets are
    captured; neither their warm-ups nor the recordings may move any real slot."""
    dec = StreamingDecoder(codec, 8, DEV, torch.float32)
    g = DecoderStepGraphs(dec, max_batch=8)
    slots = [dec.allocate() for _ in range(3)]
    dec.decode(slots, [codes(n, 20 + n) for n in (70, 5, 0)])
    g.run(torch.tensor(slots[:1], device=DEV), codes(1, 30))  # captures bucket 1
    before = [dec.snapshot(s) for s in slots]
    pad_pos = dec.position(dec.padding_slot)
    g.capture_all()
    assert set(g.graphs) == set(g.buckets)
    for s, snap in zip(slots, before, strict=True):
        after = dec.snapshot(s)
        assert all(torch.equal(snap[k], after[k]) for k in snap), s
    assert dec.position(dec.padding_slot) > pad_pos  # the warm-ups ran, on the padding slot


def ms_per_call(fn: Callable[[], object], iters: int) -> float:
    fn()
    torch.cuda.synchronize()
    begin = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - begin) * 1e3 / iters


def test_timing_eager_vs_replay(pair):
    """Not an assertion: the per-step cost, printed for the record (run with -s). `decode` is
    today's per-step path (host lists of slots and codes)."""
    graphed, eager = pair
    for b in (1, 32):
        slots = start(pair, [0] * b, seed=40)
        ids = torch.tensor(slots, device=DEV)
        c = codes(b, 41)
        rows = [c[i : i + 1] for i in range(b)]
        decode_ms = ms_per_call(partial(eager.decoder.decode, slots, rows), iters=5)
        eager_ms = ms_per_call(partial(eager.run, ids, c), iters=5)
        replay_ms = ms_per_call(partial(graphed.run, ids, c), iters=20)
        print(
            f"\ncodec step B={b}: decode {decode_ms:.2f} ms, eager step {eager_ms:.2f} ms, "
            f"graph replay {replay_ms:.2f} ms ({eager_ms / replay_ms:.1f}x)"
        )
        finish(pair, slots)
