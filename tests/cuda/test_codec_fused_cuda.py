"""GPU: the streaming codec decoder's CUDA path (`codec_fused.py`, the convolutions' epilogues
in our kernels) gives the CPU's torch-path PCM and state, whole decoder, over chunks
(pytest -m cuda)."""

from __future__ import annotations

import pytest
import torch

from omniflow.models.qwen3_tts import codec_fused
from omniflow.models.qwen3_tts.codec_stream import StreamingDecoder
from tests.factories import biased_codec_decoder

pytestmark = pytest.mark.cuda


@pytest.fixture
def exact_fp32():
    """No TF32 in the GPU's convolutions and matmuls while the test runs: the comparison
    is then with float32 rounding alone (measured: up to 5.4e-5 apart in PCM of ~0.1-1 on
    the H200, from sin, accumulation order and attention; a lost bias or history moves it
    by ~0.1)."""
    saved = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = saved


def test_cuda_decoder_equals_the_cpu_decoder(exact_fp32, monkeypatch):
    calls = []
    unit = codec_fused.residual_unit
    monkeypatch.setattr(codec_fused, "residual_unit", lambda *a: calls.append(1) or unit(*a))
    cpu = StreamingDecoder(biased_codec_decoder(), 2, torch.device("cpu"), torch.float32)
    gpu = StreamingDecoder(biased_codec_decoder().cuda(), 2, torch.device("cuda"), torch.float32)
    g = torch.Generator().manual_seed(6)
    codes = [torch.randint(0, 2048, (12, 16), generator=g) for _ in range(2)]
    slots = [(cpu.allocate(), gpu.allocate()) for _ in codes]
    for a, b in ((0, 1), (1, 8), (8, 12)):  # one frame, a window, a chunk
        want = cpu.decode([s for s, _ in slots], [c[a:b] for c in codes])
        got = gpu.decode([s for _, s in slots], [c[a:b].cuda() for c in codes])
        for w, x in zip(want, got, strict=True):
            assert x.shape == w.shape == ((b - a) * 1920,)
            torch.testing.assert_close(x.cpu(), w, atol=2e-4, rtol=1e-3)
    for sc, sg in slots:
        want, got = cpu.snapshot(sc), gpu.snapshot(sg)
        for key in want:
            torch.testing.assert_close(got[key].cpu(), want[key], atol=2e-4, rtol=1e-3)
    assert calls  # the CUDA decoder took the fused path
