"""GPU checks of `PredictorGraphs` (run on the GPU machine: pytest -m cuda -s for the timings).

Replaying a bucket's graph must give exactly the codes of the same computation run eagerly
(same bucket, same padding, same seeds and counters), at the tiny shapes and at the 1.7B
code predictor's shapes with dummy weights in bfloat16. Where B is itself a bucket, that is
also exactly what the unpadded eager predictor gives. A batch padded to a larger bucket is
compared with the unpadded eager run only for information: cuBLAS may pick another kernel
for another row count, so on CUDA a row is not bitwise independent of the batch size.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import NamedTuple

import pytest
import torch
from torch import nn

from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from omniflow.models.qwen3_tts.code_predictor import CodePredictor
from omniflow.models.qwen3_tts.factory import build_talker
from omniflow.models.qwen3_tts.modules import CodePredictorModule, init_dummy
from omniflow.models.qwen3_tts.predictor_graph import PredictorGraphs, frame_codes
from omniflow.platforms.base import prepare_device
from tests.factories import tiny_model_config
from tests.models.test_predictor_graph import subtalker_sample

pytestmark = pytest.mark.cuda

DEV = torch.device("cuda")
MAX_BATCH = 64


def tiny_parts() -> tuple[CodePredictor, nn.Embedding]:
    cfg = tiny_model_config().model_copy(update={"dtype": "bfloat16"})
    talker = build_talker(cfg, DEV).talker
    return talker.predictor, talker.weights.talker.model.codec_embedding


def parts_1_7b() -> tuple[CodePredictor, nn.Embedding]:
    """Only the 1.7B code predictor and the talker's codec embedding (dummy weights, bf16):
    the whole talker would cost ~2B dummy draws for nothing tested here."""
    cfg = build_graph(compose(["platform=cpu", "model=qwen3_tts_1_7b"])).model
    width = cfg.talker.hidden_size
    module = CodePredictorModule(cfg.code_predictor, width)
    embedding = nn.Embedding(cfg.talker.vocab_size, width)
    init_dummy(module, seed=0)
    init_dummy(embedding, seed=1)
    module = module.to(device=DEV, dtype=torch.bfloat16).eval()
    embedding = embedding.to(device=DEV, dtype=torch.bfloat16).eval()
    return CodePredictor(module, cfg.code_predictor), embedding


class Pair(NamedTuple):
    """Two wrappers over one model: captured graphs, and the same buckets run eagerly."""

    name: str
    graphed: PredictorGraphs
    eager: PredictorGraphs


@pytest.fixture(scope="module", params=["tiny", "1.7b"])
def pair(request) -> Pair:
    """Built once per model; captures persist across the module's tests."""
    prepare_device("cuda")  # as the engine does before building a runner
    predictor, embedding = tiny_parts() if request.param == "tiny" else parts_1_7b()

    def make(capture: bool) -> PredictorGraphs:
        return PredictorGraphs(
            predictor, embedding, subtalker_sample, max_batch=MAX_BATCH, capture=capture
        )

    return Pair(request.param, make(True), make(False))


def frame_inputs(g: PredictorGraphs, b: int, seed: int):
    """hidden, code0, seeds, counters, temperature on the GPU; every third row greedy."""
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(b, g.hidden.shape[1], generator=gen).to(g.dtype)
    code0 = torch.randint(0, 2048, (b,), generator=gen)
    seeds = torch.randint(0, 2**40, (b,), generator=gen)
    counters = torch.randint(1, 1000, (b,), generator=gen)
    temperature = torch.tensor([0.9 if i % 3 != 1 else 0.0 for i in range(b)])
    return tuple(t.to(DEV) for t in (hidden, code0, seeds, counters, temperature))


def unpadded(g: PredictorGraphs, inputs) -> torch.Tensor:
    """The eager predictor at exactly B rows (what `Talker.complete_frames` computes)."""
    with torch.no_grad():
        return frame_codes(g.predictor, g.code0_embedding, *inputs, g.sample_fn)


@pytest.mark.parametrize("b", [1, 3, 32])
def test_replay_equals_eager(pair, b):
    _, graphed, eager = pair
    assert graphed.graphed and not eager.graphed
    results = []
    for seed in (b, 100 + b):  # the second replay: new values in the same buffers
        inputs = frame_inputs(graphed, b, seed)
        got = graphed.run(*inputs)
        assert torch.equal(got, eager.run(*inputs))
        alone = unpadded(graphed, inputs)
        if b in graphed.buckets:
            assert torch.equal(got, alone)
        else:
            rows = (got != alone).any(dim=1).sum().item()
            print(f"\nB={b} padded to {graphed.bucket_for(b)}: {rows}/{b} rows differ unpadded")
        results.append(got)
    assert graphed.bucket_for(b) in graphed.graphs
    assert not torch.equal(results[0], results[1])


def test_batch_above_the_largest_bucket_runs_eager(pair):
    graphed = pair.graphed
    b = MAX_BATCH + 5
    assert graphed.bucket_for(b) is None
    inputs = frame_inputs(graphed, b, seed=7)
    captured = set(graphed.graphs)
    assert torch.equal(graphed.run(*inputs), unpadded(graphed, inputs))
    assert set(graphed.graphs) == captured


def ms_per_call(fn: Callable[[], torch.Tensor], iters: int) -> float:
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) * 1e3 / iters


def test_timing_eager_vs_replay(pair):
    """Not an assertion: the per-frame cost, printed for the record (run with -s)."""
    name, graphed, eager = pair
    for b in (1, 32):
        inputs = frame_inputs(graphed, b, seed=11)
        eager_ms = ms_per_call(lambda inputs=inputs: eager.run(*inputs), iters=5)
        replay_ms = ms_per_call(lambda inputs=inputs: graphed.run(*inputs), iters=20)
        print(
            f"\n[{name}] code predictor B={b}: eager {eager_ms:.2f} ms, "
            f"graph replay {replay_ms:.2f} ms per frame ({eager_ms / replay_ms:.1f}x)"
        )
