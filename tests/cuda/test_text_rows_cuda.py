"""GPU: the talker projects prompt text and computes codebook 0's logits at padded row
counts (`Talker.project_text`, `Talker.logits`), and the rows that count equal the unpadded
GEMM's within bf16's rounding."""

from __future__ import annotations

import pytest
import torch

from omniflow.models.qwen3_tts.factory import build_talker
from omniflow.models.qwen3_tts.talker import padded_rows
from tests.factories import tiny_model_config
from tests.models.test_text_rows import flipped, projected_rows

pytestmark = pytest.mark.cuda


def test_cuda_pads_the_text_rows_and_keeps_the_values():
    cfg = tiny_model_config().model_copy(update={"dtype": "bfloat16"})
    talker = build_talker(cfg, torch.device("cuda")).talker
    assert talker.pad_rows is True
    for n in (1, 37, 300):
        rows, got = projected_rows(talker, n)
        assert rows == [padded_rows(n)]
        talker.pad_rows = False
        try:
            plain_rows, plain = projected_rows(talker, n)
        finally:
            talker.pad_rows = True
        assert plain_rows == [n]
        torch.testing.assert_close(got, plain, rtol=2**-7, atol=1e-2)


def test_cuda_pads_the_logits_rows_and_keeps_the_values():
    cfg = tiny_model_config().model_copy(update={"dtype": "bfloat16"})
    talker = build_talker(cfg, torch.device("cuda")).talker
    gen = torch.Generator(device="cuda").manual_seed(1)
    hidden = torch.randn(
        100, talker.shape.hidden_size, generator=gen, device="cuda", dtype=torch.bfloat16
    )
    for n in (1, 3, 100):
        got, plain = flipped(talker, lambda n=n: talker.logits(hidden[:n]))
        assert got.shape == plain.shape
        torch.testing.assert_close(got.float(), plain.float(), rtol=2**-7, atol=1e-2)
