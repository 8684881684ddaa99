"""`StreamingDecoder.decode_step` and `DecoderStepGraphs`' eager path (CPU, tiny codec).

The reference is `StreamingDecoder.decode` one frame per row, on a second decoder over the same
module holding the same slot state: equality here (bitwise, PCM and carried state) means the
device-only step and the graph wrapper change nothing but how the step is launched.

A batch padded to a larger bucket is the one exception: oneDNN's transposed conv picks its
kernel by batch size (so does cuDNN on CUDA), so a row is not bitwise independent of the batch
size. Padded runs are compared bitwise with the same padded batch through `decode_step` on a
third decoder, and with `decode` to within 1e-5 (the difference is ~2e-7).
"""

from __future__ import annotations

import pytest
import torch

from omniflow.models.layers.rotary import Rotary
from omniflow.models.qwen3_tts.codec_graph import DecoderStepGraphs
from omniflow.models.qwen3_tts.codec_stream import (
    ROPE_FRAMES,
    SlotsExhausted,
    StepRope,
    StreamingDecoder,
)
from tests.models.test_codec_stream import codes, decoder
from tests.models.test_predictor_graph import HostReads

CPU = torch.device("cpu")


def pair(num_slots: int = 4, rope_frames: int = ROPE_FRAMES, n: int = 2):
    """Decoders over one module: the first runs the step under test, the others references."""
    return tuple(
        StreamingDecoder(decoder(), num_slots, CPU, torch.float32, rope_frames) for _ in range(n)
    )


def advanced(a: StreamingDecoder, *refs: StreamingDecoder, frames: list[int], seed: int):
    """One slot per entry in every decoder (the same ids), slot i `frames[i]` frames in (0 =
    fresh), decoded in `a` and copied into the references."""
    slots = [a.allocate() for _ in frames]
    a.decode(slots, [codes(n, seed + i) for i, n in enumerate(frames)])
    for ref in refs:
        assert [ref.allocate() for _ in frames] == slots
        for s in slots:
            ref.restore(s, a.snapshot(s))
    return slots


def assert_same_state(a: StreamingDecoder, b: StreamingDecoder, slots: list[int]) -> None:
    for s in slots:
        sa, sb = a.snapshot(s), b.snapshot(s)
        assert sa.keys() == sb.keys()
        for name in sa:
            assert torch.equal(sa[name], sb[name]), (s, name)


def by_decode(b: StreamingDecoder, slots: list[int], frame: torch.Tensor) -> torch.Tensor:
    """The reference: `decode` with one frame per row."""
    return torch.stack(b.decode(slots, [frame[i : i + 1] for i in range(len(slots))]))


def padded(p: StreamingDecoder, slots: list[int], frame: torch.Tensor, k: int) -> torch.Tensor:
    """The reference for a bucket of k rows: the same padded batch through `decode_step`."""
    n = len(slots)
    ids = torch.tensor(slots + [p.padding_slot] * (k - n))
    pad = torch.zeros(k - n, frame.shape[1], dtype=torch.int64)
    return p.decode_step(ids, torch.cat([frame, pad]))[:n]


def frame(rows: int, seed: int) -> torch.Tensor:
    return codes(rows, 1000 + seed)


@pytest.mark.parametrize("frames", [[70], [0, 70, 9]])
def test_decode_step_equals_decode(frames):
    # 70 frames in, four more steps cross the 72-frame KV window; fresh slots start at 0.
    a, b = pair()
    slots = advanced(a, b, frames=frames, seed=len(frames))
    order = slots[::-1]  # rows need not follow slot order
    ids = torch.tensor(order)
    for step in range(4):
        c = frame(len(order), step)
        got = a.decode_step(ids, c)
        want = by_decode(b, order, c)
        assert got.shape == (len(order), 1920)
        assert torch.equal(got, want)
        assert_same_state(a, b, slots)
    assert [a.position(s) for s in slots] == [n + 4 for n in frames]
    assert float(got.std()) > 0.01


def test_decode_step_past_the_rope_table():
    """Positions past the table take their RoPE from the on-device formula instead: the same
    ops as `Rotary`'s table, so on the CPU the same bits (on CUDA, within the last bit)."""
    a, b = pair(rope_frames=3)
    slots = advanced(a, b, frames=[1, 0], seed=7)
    ids = torch.tensor(slots)
    for step in range(5):  # positions 1..5 and 0..4: inside the table, then past it
        c = frame(2, 10 + step)
        assert torch.equal(a.decode_step(ids, c), by_decode(b, slots, c))
        assert_same_state(a, b, slots)
    rotary = Rotary(16, 1e4)
    rope = StepRope(Rotary(16, 1e4), 100, CPU)
    positions = torch.tensor([[0, 1], [99, 100], [5000, 70000]])
    got = rope.cos_sin(positions, torch.float32)
    want = rotary.cos_sin(positions, torch.float32)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_the_padding_slot_is_never_handed_out():
    dec = StreamingDecoder(decoder(), 2, CPU, torch.float32)
    assert dec.padding_slot == dec.num_slots == 2
    assert sorted(dec.allocate() for _ in range(2)) == [0, 1]
    with pytest.raises(SlotsExhausted):
        dec.allocate()
    with pytest.raises(ValueError):
        dec.release(dec.padding_slot)
    assert dec.num_in_use == 2 and dec.num_free == 0


def graphs(dec: StreamingDecoder, max_batch: int = 4, buckets=(1, 2, 4)) -> DecoderStepGraphs:
    g = DecoderStepGraphs(dec, max_batch=max_batch, buckets=buckets)
    assert not g.graphed  # the CPU runs the bucketed eager path
    return g


@pytest.mark.parametrize("frames", [[70], [0, 70, 9], [3, 0, 1, 0, 5, 2], [4, 0, 2, 1]])
def test_graph_wrapper_eager_path_equals_decode(frames):
    """B = 1 and 4 (buckets), 3 (padded to 4) and 6 (above the largest bucket: eager)."""
    a, b, p = pair(num_slots=6, n=3)
    g = graphs(a)
    slots = advanced(a, b, p, frames=frames, seed=20 + len(frames))
    ids = torch.tensor(slots)
    k = g.bucket_for(len(slots))
    exact = k is None or k == len(slots)
    for step in range(3):
        c = frame(len(slots), 20 + step)
        got = g.run(ids, c)
        want = by_decode(b, slots, c)
        if exact:
            assert torch.equal(got, want)
            assert_same_state(a, b, slots)
        else:
            assert torch.equal(got, padded(p, slots, c, k))
            assert_same_state(a, p, slots)
            assert torch.allclose(got, want, atol=1e-5, rtol=0)


def test_padding_rows_leave_real_slots_untouched():
    a, b, p = pair(n=3)
    g = graphs(a, buckets=(4,))
    slots = advanced(a, b, p, frames=[5, 2, 0], seed=30)
    before = [a.snapshot(s) for s in slots]
    pad_pos = a.position(a.padding_slot)
    c = frame(1, 30)
    got = g.run(torch.tensor(slots[1:2]), c)
    assert torch.equal(got, padded(p, slots[1:2], c, 4))
    assert torch.allclose(got, by_decode(b, slots[1:2], c), atol=1e-5, rtol=0)
    assert_same_state(a, p, slots)  # slot 1 moved on one frame; 0 and 2 did not move
    for s, snap in zip(slots, before, strict=True):
        same = all(torch.equal(snap[k], v) for k, v in a.snapshot(s).items())
        assert same == (s != slots[1])
    assert a.position(a.padding_slot) == pad_pos + 1  # the three padding rows' writes


def test_warm_up_touches_only_the_padding_slot():
    """What precedes every capture; the static buffers still hold the last batch's real slots
    when it runs, and it must not advance them."""
    a, p = pair()
    g = graphs(a, buckets=(4,))
    slots = advanced(a, p, frames=[5, 2, 0], seed=40)
    ids = torch.tensor(slots)
    c = frame(3, 40)
    assert torch.equal(g.run(ids, c), padded(p, slots, c, 4))
    pad_pos = a.position(a.padding_slot)
    g.warm_up(4)
    assert_same_state(a, p, slots)
    assert a.position(a.padding_slot) == pad_pos + g.warmup_iters
    c = frame(3, 41)  # and the real slots continue exactly
    assert torch.equal(g.run(ids, c), padded(p, slots, c, 4))
    assert_same_state(a, p, slots)


def test_run_returns_copies_and_refuses_bad_shapes():
    a, b = pair()
    g = graphs(a)
    slots = advanced(a, b, frames=[1, 1], seed=50)
    ids = torch.tensor(slots)
    first = g.run(ids, frame(2, 50))
    kept = first.clone()
    second = g.run(ids, frame(2, 51))
    assert torch.equal(first, kept) and not torch.equal(first, second)
    assert g.run(ids[:0], frame(0, 52)).shape == (0, 1920)
    with pytest.raises(ValueError, match="rows"):
        g.run(ids, frame(3, 53))
    with pytest.raises(ValueError, match="rows"):
        g.run(ids, frame(2, 54)[:, :15])


def test_the_step_reads_nothing_back_to_the_host():
    """The CPU stand-in for a capture: `decode_step` alone (past the RoPE table too) and a
    padded bucket of the wrapper."""
    a, b = pair(rope_frames=3)
    g = graphs(a)
    slots = advanced(a, b, frames=[4, 0, 2], seed=60)
    ids = torch.tensor(slots)
    with HostReads() as mode:
        a.decode_step(ids, frame(3, 60))
        g.run(ids, frame(3, 61))
    assert mode.seen == []
