"""`model.codec_dtype` below float32: the decoder's PCM within the stated bound of float32's
(tests/codec_bound.py, docs/performance.md), on the CPU, for fixed inputs.

Two weight sets: the tiny preset's dummy codec (biases and SnakeBeta parameters zero), and the
official-reference fixture's (every tensor drawn, SnakeBeta's beta around 1 so the PCM stays
inside the clamp), compared with the official implementation's float32 PCM. Each runs the
streaming decoder (the pipelines' path) one frame and five frames at a time, and the
full-sequence decode. The error must also be non-zero: a decoder that silently stayed float32
would pass any bound. (`biased_codec_decoder` is no measure here: its drawn biases drive 74 %
of the samples into the clamp, a gain at which float32's own last bits would move the PCM.)
"""

from __future__ import annotations

import copy
import functools

import pytest
import torch

from omniflow.models.qwen3_tts.codec_graph import DecoderStepGraphs
from omniflow.models.qwen3_tts.codec_modules import CodecDecoder, SpeechTokenizerWeights
from omniflow.models.qwen3_tts.codec_stream import StreamingDecoder
from tests.codec_bound import BOUNDS, DTYPES, assert_within_bound, pcm_error
from tests.factories import biased_codec_decoder, tiny_model_config
from tests.models.test_codec_stream import codes, decoder
from tests.reference.cases import Fixture
from tests.reference.weights import draw_all

CPU = torch.device("cpu")


@functools.cache
def fixture_decoder() -> tuple[CodecDecoder, torch.Tensor, torch.Tensor]:
    """The reference fixture's codec (weights drawn by name, as test_reference_fixtures.py
    draws them), its codes [12, 16] and the official float32 PCM of them."""
    fx = Fixture.load("qwen3_tts_tiny")
    w = SpeechTokenizerWeights(tiny_model_config().codec)
    drawn = draw_all(fx.codec_shapes, fx.meta["seed"])
    w.load_state_dict({k: v for k, v in drawn.items() if k.startswith("decoder.")})
    return w.decoder.eval(), fx.tensors["codec/codes"], fx.tensors["codec/pcm"]


def weights_and_codes(which: str) -> tuple[CodecDecoder, torch.Tensor, torch.Tensor]:
    """(float32 decoder, codes, float32 PCM to compare with)."""
    if which == "fixture":
        return fixture_decoder()
    c = codes(12, 5)
    with torch.no_grad():
        return decoder(), c, decoder()(c[None])[0]


def streamed(dec: StreamingDecoder, c: torch.Tensor, chunk: int) -> torch.Tensor:
    slot = dec.allocate()
    parts = [dec.decode([slot], [c[i : i + chunk]])[0] for i in range(0, c.shape[0], chunk)]
    dec.release(slot)
    return torch.cat(parts)


@pytest.mark.parametrize("which", ["dummy", "fixture"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_reduced_precision_pcm_within_the_bound(which, dtype):
    fp32, c, want = weights_and_codes(which)
    low = copy.deepcopy(fp32).to(dtype)
    dec = StreamingDecoder(low, 1, CPU, dtype)
    assert {p.dtype for p in low.parameters()} == {dtype}
    for chunk in (1, 5):
        got = streamed(dec, c, chunk)
        assert got.dtype == dtype and got.shape == want.shape
        assert assert_within_bound(want, got, dtype, which).max_abs > 0
    slot = dec.allocate()
    dec.decode([slot], [c[:3]])
    assert {t.dtype for t in dec.snapshot(slot).values()} == {dtype, torch.int64}
    with torch.no_grad():
        full = low(c[None])[0]  # the whole-sequence decode
    assert_within_bound(want, full, dtype, which)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_the_bound_sees_a_lost_bias(dtype):
    """The bound is tight enough to see a real fault: the fixture's decoder with the first
    block's transposed-convolution bias dropped breaches it."""
    fp32, c, want = fixture_decoder()
    with torch.no_grad():
        low = copy.deepcopy(fp32).to(dtype)
        bias = low.decoder[1].block[1].conv.bias
        assert bias is not None
        bias.zero_()
    got = streamed(StreamingDecoder(low, 1, CPU, dtype), c, 1)
    assert pcm_error(want, got).snr_db < BOUNDS["fixture"][dtype].snr_db


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_step_path_equals_decode_bitwise(dtype):
    """What a CUDA graph records (`decode_step` through `DecoderStepGraphs`' buffers, here
    eager) is `decode`'s computation in the reduced dtype too: the static PCM buffer, the
    slot pool and the RoPE table all take the decoder's dtype, so nothing rounds differently."""
    low = copy.deepcopy(biased_codec_decoder()).to(dtype)
    a, b = (StreamingDecoder(low, 2, CPU, dtype) for _ in range(2))
    g = DecoderStepGraphs(a, max_batch=2, buckets=(2,), capture=False)
    assert g.pcm.dtype == dtype
    slots = [a.allocate() for _ in range(2)]
    assert [b.allocate() for _ in range(2)] == slots
    for s, n in zip(slots, (70, 3), strict=True):  # one slot crosses the 72-frame window
        a.decode([s], [codes(n, 30 + n)])
        b.restore(s, a.snapshot(s))
    ids = torch.tensor(slots)
    for step in range(3):
        c = codes(2, 40 + step)
        got = g.run(ids, c)
        want = torch.stack(b.decode(slots, [c[i : i + 1] for i in range(2)]))
        assert got.dtype == dtype and torch.equal(got, want)
        for s in slots:
            sa, sb = a.snapshot(s), b.snapshot(s)
            assert all(torch.equal(sa[k], sb[k]) for k in sa), (s, step)
