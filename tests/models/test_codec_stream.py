"""The streaming decoder equals the full-sequence decode (fp32 CPU, within 1e-5)."""

from __future__ import annotations

import functools

import pytest
import torch
from torch.overrides import TorchFunctionMode

from omniflow.models.qwen3_tts.codec_modules import SpeechTokenizerWeights, init_dummy_codec
from omniflow.models.qwen3_tts.codec_stream import SlotsExhausted, StreamingDecoder
from tests.factories import tiny_model_config

SPF = 1920


@functools.cache
def decoder():
    w = SpeechTokenizerWeights(tiny_model_config().codec)
    init_dummy_codec(w, 7)
    return w.decoder.eval()


def codes(t: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2048, (t, 16), generator=g)


def full(c: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return decoder()(c[None])[0]


def stream(c: torch.Tensor, chunk: int, dec: StreamingDecoder | None = None) -> torch.Tensor:
    dec = dec or StreamingDecoder(decoder(), 4, torch.device("cpu"), torch.float32)
    slot = dec.allocate()
    parts = [dec.decode([slot], [c[i : i + chunk]])[0] for i in range(0, c.shape[0], chunk)]
    dec.release(slot)
    return torch.cat(parts)


def test_full_decode_is_nontrivial_and_1920_samples_per_frame():
    out = full(codes(10, 0))
    assert out.shape == (10 * SPF,)
    assert float(out.std()) > 0.01 and float(out.abs().max()) < 1.0


@functools.cache
def full_reference(t: int, seed: int) -> torch.Tensor:
    """The full decode of codes(t, seed), computed once for every chunking compared to it."""
    return full(codes(t, seed))


@pytest.mark.parametrize("chunk", [1, 7, 25])
def test_chunked_streaming_equals_full_decode(chunk):
    # 100 frames cross the 72-frame attention window, so the KV window's slide is tested.
    c = codes(100, 1)
    ref = full_reference(100, 1)
    got = stream(c, chunk)
    assert got.shape == ref.shape == (100 * SPF,)
    assert torch.allclose(got, ref, atol=1e-5, rtol=0)


def test_ragged_batch_of_three_requests():
    dec = StreamingDecoder(decoder(), 4, torch.device("cpu"), torch.float32)
    seqs = [codes(40, 2), codes(33, 3), codes(57, 4)]
    chunking = [[1, 7, 25, 7], [5, 5, 3, 20], [25, 25, 7]]
    slots = [dec.allocate() for _ in seqs]
    got: list[list[torch.Tensor]] = [[] for _ in seqs]
    offsets = [0, 0, 0]
    for step in range(4):
        rows, chunks = [], []
        for i, plan in enumerate(chunking):
            if step < len(plan):
                n = plan[step]
                rows.append(i)
                chunks.append(seqs[i][offsets[i] : offsets[i] + n])
                offsets[i] += n
        pcm = dec.decode([slots[i] for i in rows], chunks)
        for i, p in zip(rows, pcm, strict=True):
            got[i].append(p)
    for i, c in enumerate(seqs):
        out = torch.cat(got[i])
        assert out.shape == (c.shape[0] * SPF,)
        assert torch.allclose(out, full(c), atol=1e-5, rtol=0)


def test_slot_reuse_does_not_leak_state():
    dec = StreamingDecoder(decoder(), 1, torch.device("cpu"), torch.float32)
    stream(codes(30, 5), 7, dec)  # leaves the only slot dirty, then releases it
    c = codes(20, 6)
    assert torch.allclose(stream(c, 4, dec), full(c), atol=1e-5, rtol=0)


def test_snapshot_restore_continues_exactly():
    c = codes(30, 8)
    dec = StreamingDecoder(decoder(), 2, torch.device("cpu"), torch.float32)
    a = dec.allocate()
    first = dec.decode([a], [c[:12]])[0]
    snap = dec.snapshot(a)
    dec.release(a)
    b = dec.allocate()
    dec.decode([b], [codes(5, 9)])  # dirty the new slot, then restore into it
    dec.restore(b, snap)
    rest = dec.decode([b], [c[12:]])[0]
    assert torch.allclose(torch.cat([first, rest]), full(c), atol=1e-5, rtol=0)


def test_slots_run_out_with_a_clear_error():
    dec = StreamingDecoder(decoder(), 1, torch.device("cpu"), torch.float32)
    dec.allocate()
    with pytest.raises(SlotsExhausted):
        dec.allocate()


def test_allocate_many_hands_out_zeroed_slots_in_allocate_order():
    """Three slots dirtied and released, then taken back in one call (one fill per state
    tensor): each is exactly a fresh slot (state zero, position 0), in the order three
    `allocate` calls give; asking for more than are free takes none."""
    dec = StreamingDecoder(decoder(), 4, torch.device("cpu"), torch.float32)
    fresh = StreamingDecoder(decoder(), 4, torch.device("cpu"), torch.float32)
    dirty = [dec.allocate() for _ in range(3)]
    dec.decode(dirty, [codes(9, 20 + i) for i in range(3)])
    for s in dirty:
        dec.release(s)
    twin = StreamingDecoder(decoder(), 4, torch.device("cpu"), torch.float32)
    for s in [twin.allocate() for _ in range(3)]:
        twin.release(s)
    order = [twin.allocate() for _ in range(3)]
    got = dec.allocate_many(3)
    assert got == order and sorted(got) == sorted(dirty)
    clean = fresh.snapshot(fresh.allocate())
    for s in got:
        snap = dec.snapshot(s)
        assert dec.position(s) == 0
        for name, t in clean.items():
            assert torch.equal(snap[name], t), (s, name)
    assert dec.num_free == 1
    with pytest.raises(SlotsExhausted, match="2 decoder slots asked for, 1 of 4 free"):
        dec.allocate_many(2)
    assert dec.num_free == 1 and dec.allocate_many(0) == []


class Writes(TorchFunctionMode):
    """The tensor calls that fill or copy, by name."""

    NAMES = ("zero_", "fill_", "index_fill_", "copy_", "clone", "__setitem__")

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[str] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", "")
        if name in self.NAMES:
            self.seen.append(name)
        return func(*args, **(kwargs or {}))


def test_a_slot_is_zeroed_saved_and_restored_in_one_op_each_whatever_its_state():
    """The carried state is one row per slot (positions beside it): taking, parking and
    restoring a slot costs the same few launches for the codec's dozens of state tensors,
    on the way to a new request's first audio."""
    dec = StreamingDecoder(decoder(), 4, torch.device("cpu"), torch.float32)
    assert len(decoder().state_shapes()) > 10
    for take in (lambda: [dec.allocate()], lambda: dec.allocate_many(2)):
        with Writes() as mode:
            slots = take()
        assert len(mode.seen) == 2, mode.seen  # the state rows, the positions
    dec.decode(slots, [codes(3, 1), codes(3, 2)])
    with Writes() as mode:
        snap = dec.snapshot(slots[0])
    assert mode.seen == ["clone", "clone"]
    with Writes() as mode:
        dec.restore(slots[1], snap)
    assert len(mode.seen) == 2, mode.seen
    assert torch.equal(dec.snapshot(slots[1])["state"], snap["state"])
