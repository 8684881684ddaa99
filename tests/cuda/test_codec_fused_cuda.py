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
    for name in ("residual_unit", "trans_conv"):
        fn = getattr(codec_fused, name)
        monkeypatch.setattr(codec_fused, name, lambda *a, n=name, f=fn: calls.append(n) or f(*a))
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
    assert set(calls) == {"residual_unit", "trans_conv"}  # the CUDA decoder took the fused path


def test_fused_and_torch_paths_agree_on_the_gpu(exact_fp32):
    """The same decoder on the same GPU with the epilogues fused and not (`fused`): the same
    sums in the same order, so float32 agrees to the last bits (the CPU comparison above
    also spans sin's and the convolutions' CPU-GPU differences)."""
    fused = StreamingDecoder(biased_codec_decoder().cuda(), 1, torch.device("cuda"), torch.float32)
    plain = StreamingDecoder(biased_codec_decoder().cuda(), 1, torch.device("cuda"), torch.float32)
    assert fused.fused and plain.fused
    plain.fused = False
    g = torch.Generator().manual_seed(8)
    codes = torch.randint(0, 2048, (9, 16), generator=g).cuda()
    a, b = fused.allocate(), plain.allocate()
    for lo, hi in ((0, 1), (1, 9)):
        got = fused.decode([a], [codes[lo:hi]])[0]
        want = plain.decode([b], [codes[lo:hi]])[0]
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
