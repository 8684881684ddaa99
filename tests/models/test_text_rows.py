"""The talker's eager GEMMs over padded rows (`Talker.project_text` and `Talker.logits`, what
they do on CUDA): a step runs them at one of a few row counts, so cuBLAS meets no new shape
on an admitting step, and the rows that count are the unpadded GEMM's."""

from __future__ import annotations

import torch

from omniflow.models.qwen3_tts.talker import ROWS_MIN, TalkerInputs, padded_rows
from tests.factories import tiny_bundle


def test_padded_rows_are_powers_of_two_from_the_minimum():
    assert [padded_rows(n) for n in (0, 1, 16, 17, 100, 512, 513, 1800, 2048, 2049, 5000)] == [
        16,
        16,
        16,
        32,
        128,
        512,
        1024,
        2048,
        2048,
        2049,
        5000,
    ]
    assert ROWS_MIN == 16


def projected_rows(talker, n: int) -> tuple[list[int], torch.Tensor]:
    """The row counts the projection saw while embedding `n` prompt positions, and the
    embedding."""
    seen: list[int] = []
    hook = talker.weights.talker.text_projection.register_forward_hook(
        lambda _m, args, _out: seen.append(args[0].shape[0])
    )
    dev = talker.weights.talker.codec_head.weight.device
    ids = (torch.arange(n) % 400).to(dev)
    codes = torch.zeros(n, talker.num_groups, dtype=torch.int64, device=dev)
    mask = torch.zeros(n, talker.num_groups, dtype=torch.bool, device=dev)
    try:
        x = talker.embed(TalkerInputs(ids, codes, mask, later_codes=False))
    finally:
        hook.remove()
    return seen, x


def test_padded_projection_gives_the_rows_that_count_unchanged():
    talker = tiny_bundle().talker
    assert talker.pad_rows is False  # the CPU projects the rows as they are
    for n in (1, 17, 40):
        plain_rows, plain = projected_rows(talker, n)
        talker.pad_rows = True
        try:
            padded, got = projected_rows(talker, n)
        finally:
            talker.pad_rows = False
        assert plain_rows == [n] and padded == [padded_rows(n)]
        assert got.shape == plain.shape
        torch.testing.assert_close(got, plain, rtol=1e-6, atol=1e-6)


def flipped(talker, run):
    """`run()` with the talker's padding as it is, then with it flipped (and put back)."""
    first = run()
    talker.pad_rows = not talker.pad_rows
    try:
        return first, run()
    finally:
        talker.pad_rows = not talker.pad_rows


def test_logits_run_at_padded_rows_from_two_rows_and_keep_their_values(monkeypatch):
    """Codebook 0's logits: one row stays one row (the skinny GEMM's case), more rows run at
    `padded_rows`, and the rows that count are the unpadded GEMM's."""
    from omniflow.models.qwen3_tts import talker as talker_module

    talker = tiny_bundle().talker
    seen: list[int] = []
    linear = talker_module.run_linear

    def recording(module, x):
        seen.append(x.shape[0])
        return linear(module, x)

    monkeypatch.setattr(talker_module, "run_linear", recording)
    hidden = torch.randn(40, talker.shape.hidden_size, generator=torch.Generator().manual_seed(1))
    for n in (1, 2, 17, 40):
        seen.clear()
        plain, got = flipped(talker, lambda n=n: talker.logits(hidden[:n]))
        assert seen == [n, n if n == 1 else padded_rows(n)]
        assert got.shape == plain.shape == (n, talker.shape.vocab_size)
        torch.testing.assert_close(got, plain, rtol=1e-6, atol=1e-6)
