"""`StreamingDecoder.decode_step` and `DecoderStepGraphs`' eager path (CPU, tiny codec).

The reference is `StreamingDecoder.decode` one frame per row, on a second decoder over the same
module holding the same slot state: equality here (bitwise, PCM and carried state) means the
device-only step and the graph wrapper change nothing but how the step is launched.
"""

from __future__ import annotations

import pytest
import torch

from omniflow.models.qwen3_tts.codec_graph import DecoderStepGraphs
from omniflow.models.qwen3_tts.codec_stream import ROPE_FRAMES, SlotsExhausted, StreamingDecoder
from tests.models.test_codec_stream import codes, decoder
from tests.models.test_predictor_graph import HostReads

CPU = torch.device("cpu")


def pair(num_slots: int = 4, rope_frames: int = ROPE_FRAMES):
    """Two decoders over one module: one runs the step under test, the other `decode`."""
    return tuple(
        StreamingDecoder(decoder(), num_slots, CPU, torch.float32, rope_frames) for _ in range(2)
    )


def advanced(a: StreamingDecoder, b: StreamingDecoder, frames: list[int], seed: int) -> list[int]:
    """One slot per entry in both decoders (the same ids), slot i `frames[i]` frames in (0 =
    fresh), decoded in `a` and copied into `b`."""
    slots = [a.allocate() for _ in frames]
    assert [b.allocate() for _ in frames] == slots
    a.decode(slots, [codes(n, seed + i) for i, n in enumerate(frames)])
    for s in slots:
        b.restore(s, a.snapshot(s))
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


def frame(rows: int, seed: int) -> torch.Tensor:
    return codes(rows, 1000 + seed)


@pytest.mark.parametrize("frames", [[70], [0, 70, 9]])
def test_decode_step_equals_decode(frames):
    # 70 frames in, four more steps cross the 72-frame KV window; fresh slots start at 0.
    a, b = pair()
    slots = advanced(a, b, frames, seed=len(frames))
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
    """Positions past the table take their RoPE from the on-device formula instead."""
    a, b = pair(rope_frames=3)
    slots = advanced(a, b, [1, 0], seed=7)
    ids = torch.tensor(slots)
    for step in range(5):  # positions 1..5 and 0..4: inside the table, then past it
        c = frame(2, 10 + step)
        got = a.decode_step(ids, c)
        want = by_decode(b, slots, c)
        assert torch.allclose(got, want, atol=1e-6, rtol=0)
    for s in slots:
        sa, sb = a.snapshot(s), b.snapshot(s)
        for name in sa:
            assert torch.allclose(sa[name], sb[name], atol=1e-6, rtol=0), name


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


@pytest.mark.parametrize("frames", [[70], [0, 70, 9], [3, 0, 1, 0, 5, 2]])
def test_graph_wrapper_eager_path_equals_decode(frames):
    """B = 1 (a bucket), 3 (padded to 4) and 6 (above the largest bucket: eager)."""
    a, b = pair(num_slots=6)
    g = graphs(a)
    slots = advanced(a, b, frames, seed=20 + len(frames))
    ids = torch.tensor(slots)
    for step in range(3):
        c = frame(len(slots), 20 + step)
        assert torch.equal(g.run(ids, c), by_decode(b, slots, c))
        assert_same_state(a, b, slots)


def test_padding_rows_leave_real_slots_untouched():
    a, b = pair()
    g = graphs(a, buckets=(4,))
    slots = advanced(a, b, [5, 2, 0], seed=30)
    before = a.snapshot(slots[0]), a.snapshot(slots[2])
    pad_pos = a.position(a.padding_slot)
    c = frame(1, 30)
    assert torch.equal(g.run(torch.tensor(slots[1:2]), c), by_decode(b, slots[1:2], c))
    assert_same_state(a, b, slots)  # slot 1 moved on as `decode` moved it; 0 and 2 did not
    for s, snap in zip((slots[0], slots[2]), before, strict=True):
        assert all(torch.equal(snap[k], v) for k, v in a.snapshot(s).items())
    assert a.position(a.padding_slot) == pad_pos + 1  # the three padding rows' writes


def test_warm_up_touches_only_the_padding_slot():
    """What precedes every capture; the static buffers still hold the last batch's real slots
    when it runs, and it must not advance them."""
    a, b = pair()
    g = graphs(a, buckets=(4,))
    slots = advanced(a, b, [5, 2, 0], seed=40)
    ids = torch.tensor(slots)
    c = frame(3, 40)
    assert torch.equal(g.run(ids, c), by_decode(b, slots, c))
    pad_pos = a.position(a.padding_slot)
    g.warm_up(4)
    assert_same_state(a, b, slots)
    assert a.position(a.padding_slot) == pad_pos + g.warmup_iters
    c = frame(3, 41)  # and the real slots continue exactly
    assert torch.equal(g.run(ids, c), by_decode(b, slots, c))


def test_run_returns_copies_and_refuses_bad_shapes():
    a, b = pair()
    g = graphs(a)
    slots = advanced(a, b, [1, 1], seed=50)
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
    slots = advanced(a, b, [4, 0, 2], seed=60)
    ids = torch.tensor(slots)
    with HostReads() as mode:
        a.decode_step(ids, frame(3, 60))
        g.run(ids, frame(3, 61))
    assert mode.seen == []
