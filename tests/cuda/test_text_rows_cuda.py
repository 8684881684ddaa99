"""GPU: the talker projects prompt text at padded row counts (`Talker.project_text`), and the
rows that count equal an unpadded projection's within bf16's rounding."""

from __future__ import annotations

import pytest
import torch

from omniflow.models.qwen3_tts.factory import build_talker
from omniflow.models.qwen3_tts.talker import padded_rows
from tests.factories import tiny_model_config
from tests.models.test_text_rows import projected_rows

pytestmark = pytest.mark.cuda


def test_cuda_pads_the_text_rows_and_keeps_the_values():
    cfg = tiny_model_config().model_copy(update={"dtype": "bfloat16"})
    talker = build_talker(cfg, torch.device("cuda")).talker
    assert talker.pad_text_rows is True
    for n in (1, 37, 300):
        rows, got = projected_rows(talker, n)
        assert rows == [padded_rows(n)]
        talker.pad_text_rows = False
        try:
            plain_rows, plain = projected_rows(talker, n)
        finally:
            talker.pad_text_rows = True
        assert plain_rows == [n]
        torch.testing.assert_close(got, plain, rtol=2**-7, atol=1e-2)
