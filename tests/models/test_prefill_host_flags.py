"""What a prefill takes from the host instead of reading it back from the device (each read
stalls an eager prefill's launches on CUDA; tests/cuda/test_prefill_sync_cuda.py checks that
none is left): whether any position has codes past column 0, and the rotary table's bound.
Both must give exactly what the device read gave."""

from __future__ import annotations

import dataclasses

import torch

from omniflow.models.layers.rotary import Rotary
from omniflow.models.qwen3_tts.talker import TalkerInputs
from omniflow.worker.inputs import build_prefill
from tests.stages.test_runner_paths import decoding_runner


def test_the_later_codes_flag_is_what_the_mask_says_and_embeds_the_same():
    _, runner, reqs = decoding_runner()
    model, bs, dev = runner.model, runner.block_size, runner.device
    prompts = build_prefill(
        model, [(dataclasses.replace(r, num_computed=0), r.prompt_len) for r in reqs], bs, dev, True
    )
    frames = build_prefill(
        model,
        [(dataclasses.replace(r, num_computed=r.num_computed - 3), 3) for r in reqs],
        bs,
        dev,
        True,
    )
    for batch, want in ((prompts, False), (frames, True)):
        x = batch.inputs
        assert x.later_codes is want
        assert bool(x.code_mask[:, 1:].any()) is want
        talker = model.talker
        read = talker.embed(TalkerInputs(x.side_ids, x.codes, x.code_mask))
        told = talker.embed(TalkerInputs(x.side_ids, x.codes, x.code_mask, x.later_codes))
        assert torch.equal(read, told)
    # a flag that lies changes the model's prefill embedding: the flag reaches the talker and
    # acts there (nothing reads the mask instead)
    x = frames.inputs
    lie = model.embed_prefill(dataclasses.replace(x, later_codes=False))
    assert not torch.equal(lie, model.embed_prefill(x))


def test_a_host_bound_gives_the_rotary_table_the_device_read_gives():
    positions = torch.tensor([[3, 17], [40, 0]])
    plain, bounded = Rotary(16, 10000.0), Rotary(16, 10000.0)
    cos, sin = plain.cos_sin(positions, torch.float32)
    cos_b, sin_b = bounded.cos_sin(positions, torch.float32, bound=41)
    assert torch.equal(cos, cos_b) and torch.equal(sin, sin_b)
    # a larger position later grows the table either way
    far = torch.tensor([700])
    want = plain.cos_sin(far, torch.float32)[0]
    assert torch.equal(want, bounded.cos_sin(far, torch.float32, bound=701)[0])
    # a fresh table sized by the bound alone: exactly `bound` rows must cover position 599
    edge = Rotary(16, 10000.0)
    assert torch.equal(
        edge.cos_sin(torch.tensor([599]), torch.float32, bound=600)[0],
        plain.cos_sin(torch.tensor([599]), torch.float32)[0],
    )


class RecordingRotary(Rotary):
    """A `Rotary` that records each call's bound beside its largest position."""

    def __init__(self, base: Rotary) -> None:
        super().__init__(base.head_dim, 1.0)
        self.inv_freq = base.inv_freq
        self.calls: list[tuple[int | None, int]] = []

    def cos_sin(self, positions, dtype, bound=None):
        self.calls.append((bound, int(positions.max())))
        return super().cos_sin(positions, dtype, bound)


def test_the_talker_bounds_its_rotary_lookup_by_the_steps_context_lengths():
    """Talker.forward passes the host's longest context as the bound: above every position
    (a smaller bound would index past the table) and no read needed."""
    _, runner, reqs = decoding_runner()
    model = runner.model
    batch = build_prefill(
        model,
        [(dataclasses.replace(r, num_computed=r.num_computed - 3), 3) for r in reqs],
        runner.block_size,
        runner.device,
        True,
    )
    talker = model.talker
    original = talker.rotary
    talker.rotary = RecordingRotary(original)
    try:
        model.forward(
            model.embed_prefill(batch.inputs), batch.positions, batch.meta, runner.kv_caches
        )
        calls = talker.rotary.calls
    finally:
        talker.rotary = original
    assert calls == [(max(batch.meta.seq_lens), int(batch.positions.max()))]
    assert calls[0][0] == calls[0][1] + 1
