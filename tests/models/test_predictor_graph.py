"""The capture-safe code predictor and `PredictorGraphs`' eager path (CPU, tiny model).

The reference for every check is the per-frame loop as it was before it became
capture-safe (kept inline below) or `Talker.complete_frames`, drawing codebooks 1..15 with
the runner's sampler under the subtalker policy, so equality here means the graph wrapper
changes nothing but the launch count.
"""

from __future__ import annotations

import pytest
import torch
from torch.overrides import TorchFunctionMode, resolve_name

from omniflow.device.bucket_graphs import bucket_sizes
from omniflow.models.layers.attention import dense_causal_attention
from omniflow.models.layers.qwen3 import run_layers
from omniflow.models.layers.rotary import Rotary
from omniflow.models.qwen3_tts.code_predictor import CodePredictor, SampleFn
from omniflow.models.qwen3_tts.predictor_graph import PredictorGraphs
from omniflow.models.qwen3_tts.talker import Talker
from omniflow.sampling.draw import SamplingBatch, sample
from tests.factories import tiny_bundle

SUBTALKER_TOP_K = 50


def subtalker_batch(
    seeds: torch.Tensor, counters: torch.Tensor, temperature: torch.Tensor
) -> SamplingBatch:
    """What `SamplingBatch.with_fixed_policy(None, 0.9, 50)` gives, from plain tensors."""
    n = seeds.shape[0]
    return SamplingBatch(
        temperature=temperature,
        top_k=torch.full_like(seeds, SUBTALKER_TOP_K),
        top_p=torch.ones(n, device=seeds.device),
        repetition_penalty=torch.ones(n, device=seeds.device),
        seeds=seeds,
        counters=counters,
        use_top_p=False,
        use_penalty=False,
    )


def subtalker_sample(
    logits: torch.Tensor,
    g: int,
    seeds: torch.Tensor,
    counters: torch.Tensor,
    temperature: torch.Tensor,
) -> torch.Tensor:
    """The `FrameSampleFn` a runner would inject: device ops only under these settings."""
    return sample(logits, subtalker_batch(seeds, counters, temperature), stream=g)


def bound_sample(seeds, counters, temperature) -> SampleFn:
    batch = subtalker_batch(seeds, counters, temperature)
    return lambda logits, g: sample(logits, batch, stream=g)


def frame_inputs(b: int, seed: int, device: str = "cpu", dtype=torch.float32):
    """hidden, code0, seeds, counters, temperature for b rows, sampled and greedy mixed."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(b, tiny_bundle().talker.shape.hidden_size, generator=gen)
    code0 = torch.randint(0, 2048, (b,), generator=gen)
    seeds = torch.randint(0, 2**40, (b,), generator=gen)
    counters = torch.randint(1, 1000, (b,), generator=gen)
    temperature = torch.tensor([0.9 if i % 3 != 1 else 0.0 for i in range(b)])
    out = (hidden.to(dtype), code0, seeds, counters, temperature)
    return tuple(t.to(device) for t in out)


def reference_frames(talker: Talker, hidden, code0, seeds, counters, temperature):
    """Codes 1..15 through `Talker.complete_frames`, as the runner calls it today."""
    frames = talker.complete_frames(hidden, code0, bound_sample(seeds, counters, temperature))
    return frames[:, 1:]


@torch.no_grad()
def reference_predict(predictor: CodePredictor, hidden, code0_embed, sample_fn: SampleFn):
    """The eager loop before it became capture-safe: fresh caches, `Rotary.cos_sin` per step."""
    m = predictor.module
    s = predictor.shape
    rotary = Rotary(s.head_dim, s.rope_theta)
    groups = s.num_code_groups
    b = hidden.shape[0]
    caches = [
        (
            hidden.new_zeros(b, groups, s.num_kv_heads, s.head_dim),
            hidden.new_zeros(b, groups, s.num_kv_heads, s.head_dim),
        )
        for _ in range(s.num_layers)
    ]
    x = m.small_to_mtp_projection(torch.stack([hidden, code0_embed], dim=1))
    codes = []
    start = 0
    for g in range(1, groups):
        length = x.shape[1]
        positions = torch.arange(start, start + length, device=x.device)
        cos, sin = rotary.cos_sin(positions, x.dtype)

        def attend(layer, q, k, v, start=start, length=length):
            kc, vc = caches[layer]
            kc[:, start : start + length] = k
            vc[:, start : start + length] = v
            return dense_causal_attention(q, kc, vc, start)

        out = m.model.norm(run_layers(m.model.layers, x, cos, sin, attend))
        code = sample_fn(m.lm_head[g - 1](out[:, -1]), g)
        codes.append(code)
        start += length
        if g < groups - 1:
            x = m.small_to_mtp_projection(m.model.codec_embedding[g - 1](code)).unsqueeze(1)
    return torch.stack(codes, dim=1)


def graphs(max_batch: int = 8, buckets=(1, 2, 4, 8)) -> PredictorGraphs:
    talker = tiny_bundle().talker
    return PredictorGraphs(
        talker.predictor,
        talker.weights.talker.model.codec_embedding,
        subtalker_sample,
        max_batch=max_batch,
        buckets=buckets,
    )


def test_predict_is_bit_identical_to_the_reference_loop():
    talker = tiny_bundle().talker
    hidden, code0, seeds, counters, temp = frame_inputs(5, seed=1)
    emb0 = talker.weights.talker.model.codec_embedding(code0)
    want = reference_predict(talker.predictor, hidden, emb0, bound_sample(seeds, counters, temp))
    got = talker.predictor.predict(hidden, emb0, bound_sample(seeds, counters, temp))
    assert torch.equal(got, want)
    # Preallocated caches holding another frame's values give the same codes.
    caches = talker.predictor.new_caches(5, hidden.device, hidden.dtype)
    for k, v in caches:
        k.normal_()
        v.normal_()
    again = talker.predictor.predict(hidden, emb0, bound_sample(seeds, counters, temp), caches)
    assert torch.equal(again, want)
    # The draws really depend on the seeds (so equality above is not vacuous).
    other = talker.predictor.predict(hidden, emb0, bound_sample(seeds + 1, counters, temp))
    assert not torch.equal(other, want)


@pytest.mark.parametrize("b", [1, 3])
def test_run_equals_complete_frames(b):
    g = graphs()
    inputs = frame_inputs(b, seed=10 + b)
    assert not g.graphed  # the CPU runs the bucketed eager path
    assert torch.equal(g.run(*inputs), reference_frames(tiny_bundle().talker, *inputs))


def test_padding_rows_do_not_change_real_rows():
    talker = tiny_bundle().talker
    padded = graphs(max_batch=4, buckets=(4,))
    assert padded.bucket_for(3) == 4
    padded.run(*frame_inputs(4, seed=20))  # leaves a fourth row behind in the buffers
    inputs = frame_inputs(3, seed=21)
    got = padded.run(*inputs)
    alone = graphs(max_batch=3, buckets=(3,)).run(*inputs)
    assert torch.equal(got, alone)
    assert torch.equal(got, reference_frames(talker, *inputs))
    # The padding row was reset to a greedy zero row, not left as the previous batch's.
    assert padded.temperature[3].item() == 0 and padded.code0[3].item() == 0
    assert not padded.hidden[3].any()


def test_successive_runs_follow_new_inputs_and_return_copies():
    talker = tiny_bundle().talker
    g = graphs()
    first_in, second_in = frame_inputs(3, seed=30), frame_inputs(3, seed=31)
    first = g.run(*first_in)
    kept = first.clone()
    second = g.run(*second_in)
    assert torch.equal(first, kept)  # not a view of the static output
    assert torch.equal(first, reference_frames(talker, *first_in))
    assert torch.equal(second, reference_frames(talker, *second_in))
    assert not torch.equal(first, second)


def test_only_counters_change_between_runs():
    """Consecutive frames of the same requests differ only by their counters."""
    talker = tiny_bundle().talker
    g = graphs()
    hidden, code0, seeds, counters, temp = frame_inputs(3, seed=40)
    for step in range(3):
        got = g.run(hidden, code0, seeds, counters + step, temp)
        want = reference_frames(talker, hidden, code0, seeds, counters + step, temp)
        assert torch.equal(got, want)


def test_batch_above_the_largest_bucket_runs_eager():
    g = graphs(max_batch=2, buckets=(1, 2))
    inputs = frame_inputs(5, seed=50)
    assert g.bucket_for(5) is None
    assert torch.equal(g.run(*inputs), reference_frames(tiny_bundle().talker, *inputs))


def test_bucket_sizes():
    assert bucket_sizes(8) == (1, 2, 4, 8)
    assert bucket_sizes(100) == (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 100)
    assert bucket_sizes(256)[-2:] == (128, 256)
    assert bucket_sizes(1) == (1,)
    assert graphs(max_batch=6, buckets=(1, 4, 8)).buckets == (1, 4, 6)
    with pytest.raises(ValueError):
        bucket_sizes(0)


HOST_READS = {
    "torch.Tensor.item",
    "torch.Tensor.tolist",
    "torch.Tensor.numpy",
    "torch.Tensor.__bool__",
    "torch.Tensor.__int__",
    "torch.Tensor.__float__",
    "torch.Tensor.__index__",
    "torch.Tensor.nonzero",
    "torch.nonzero",
    "torch.Tensor.masked_select",
    "torch.masked_select",
    "torch.Tensor.unique",
    "torch.unique",
}
"""Calls that read a value back to the host or size a result by values: a CUDA graph
capture fails on them (or records a stale shape)."""


class HostReads(TorchFunctionMode):
    """Records every host-reading call, and indexing by a boolean mask (value-sized)."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = resolve_name(func) or repr(func)
        masked = name.endswith(("__getitem__", "__setitem__")) and any(
            isinstance(a, torch.Tensor) and a.dtype == torch.bool for a in _flat(args[1:2])
        )
        if name in HOST_READS or masked:
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


def _flat(items):
    for item in items:
        if isinstance(item, tuple | list):
            yield from _flat(item)
        else:
            yield item


@pytest.mark.parametrize("b", [3, 8])
def test_the_frame_reads_nothing_back_to_the_host(b):
    """The CPU stand-in for a capture: bucket 4 (padded) and the full bucket 8."""
    g = graphs()
    inputs = frame_inputs(b, seed=70)
    with HostReads() as mode:
        g.run(*inputs)
    assert mode.seen == []


def test_host_reads_are_detected():
    with HostReads() as mode:
        x = torch.arange(4)
        x.max().item()
        x[x > 1] = 0
    assert mode.seen == ["torch.Tensor.item", "torch.Tensor.__setitem__"]


def test_mismatched_row_counts_are_refused():
    hidden, code0, seeds, counters, temp = frame_inputs(3, seed=60)
    with pytest.raises(ValueError, match="counters"):
        graphs().run(hidden, code0, seeds, counters[:1], temp)
