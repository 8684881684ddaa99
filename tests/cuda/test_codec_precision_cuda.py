"""GPU: `model.codec_dtype` below float32 keeps the stated bound (tests/codec_bound.py,
docs/performance.md) on the CUDA path (Triton epilogues, cuDNN, CUDA graphs), and the graphs
replay what the same step computes eagerly in that dtype (pytest -m cuda).

The reference is float32 on the CPU (no TF32): the official implementation's PCM for the
fixture's weights, the CPU decoder's for dummy weights at the 1.7B preset's widths.
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch

from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from omniflow.models.qwen3_tts.codec_graph import DecoderStepGraphs
from omniflow.models.qwen3_tts.codec_loader import load_codec
from omniflow.models.qwen3_tts.codec_modules import CodecDecoder
from omniflow.models.qwen3_tts.codec_stream import StreamingDecoder
from omniflow.platforms.base import prepare_device
from tests.codec_bound import DTYPES, assert_within_bound
from tests.models.test_codec_precision import fixture_decoder

pytestmark = pytest.mark.cuda

DEV = torch.device("cuda")
CHUNKS = (1, 8, 3)
"""A frame (the fused talker's step), a window, and a two-stage chunk, in turn."""


@functools.cache
def real_width() -> tuple[CodecDecoder, torch.Tensor, torch.Tensor]:
    """The 1.7B preset's codec with dummy weights, 12 codes and their float32 CPU PCM."""
    cfg = build_graph(compose(["platform=cpu", "model=qwen3_tts_1_7b"])).model
    dec = load_codec(cfg.codec, None, cfg.seed + 1).decoder.eval()
    codes = torch.randint(0, 2048, (12, 16), generator=torch.Generator().manual_seed(11))
    with torch.no_grad():
        return dec, codes, dec(codes[None])[0]


def chunked(dec: StreamingDecoder, codes: torch.Tensor) -> torch.Tensor:
    slot = dec.allocate()
    parts, start, i = [], 0, 0
    while start < codes.shape[0]:
        n = CHUNKS[i % len(CHUNKS)]
        parts.append(dec.decode([slot], [codes[start : start + n].to(DEV)])[0])
        start, i = start + n, i + 1
    dec.release(slot)
    return torch.cat(parts)


def on_gpu(dec: CodecDecoder, dtype: torch.dtype, slots: int = 1) -> StreamingDecoder:
    prepare_device("cuda")  # as the engine does before building a runner
    return StreamingDecoder(copy.deepcopy(dec).to(device=DEV, dtype=dtype), slots, DEV, dtype)


@pytest.mark.parametrize("weights", ["fixture", "dummy"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gpu_decoder_within_the_bound(weights, dtype):
    fp32, codes, want = fixture_decoder() if weights == "fixture" else real_width()
    dec = on_gpu(fp32, dtype)
    assert dec.fused  # the CUDA path: Triton SnakeBeta and bias epilogues
    got = chunked(dec, codes)
    assert got.dtype == dtype
    assert assert_within_bound(want, got.cpu(), dtype, weights).max_abs > 0
    plain = on_gpu(fp32, dtype)
    plain.fused = False  # torch's modules on the GPU: rounds after each op, still in bound
    assert_within_bound(want, chunked(plain, codes).cpu(), dtype, weights)


@pytest.mark.parametrize("frames", [1, 8])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_graph_replay_equals_eager_in_the_reduced_dtype(frames, dtype):
    """As tests/cuda/test_codec_graph_cuda.py for float32: a bucket's replay against the
    same bucket run eagerly (`capture=False`) on a twin pool holding the same slot state,
    PCM and carried state, within one rounding of `dtype` (torch.testing's defaults for it)."""
    fp32, _, _ = real_width()
    graphed, eager = (
        DecoderStepGraphs(on_gpu(fp32, dtype, slots=4), 4, capture=c, frames=frames)
        for c in (True, False)
    )
    assert graphed.graphed and graphed.pcm.dtype == dtype
    a, b = graphed.decoder, eager.decoder
    slots = [a.allocate() for _ in range(3)]
    assert [b.allocate() for _ in range(3)] == slots
    gen = torch.Generator().manual_seed(frames)
    for s, n in zip(slots, (70, 0, 5), strict=True):  # one slot crosses the 72-frame window
        if n:
            a.decode([s], [torch.randint(0, 2048, (n, 16), generator=gen).to(DEV)])
        b.restore(s, a.snapshot(s))
    ids = torch.tensor(slots, device=DEV)
    per_row = (16,) if frames == 1 else (frames, 16)
    for _ in range(4):
        c = torch.randint(0, 2048, (3, *per_row), generator=gen).to(DEV)
        got, want = graphed.run(ids, c), eager.run(ids, c)
        assert got.dtype == dtype and got.shape == (3, frames * 1920)
        torch.testing.assert_close(got, want)
        for s in slots:
            sa, sb = a.snapshot(s), b.snapshot(s)
            assert torch.equal(sa.pop("position"), sb.pop("position"))
            for k in sa:
                assert sa[k].dtype == dtype
                torch.testing.assert_close(sa[k], sb[k])
    assert float(got.float().std()) > 0.01
