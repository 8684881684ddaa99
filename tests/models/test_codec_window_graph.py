"""A window's frames decoded in one pass: `DecoderStepGraphs(frames=n)` and `StreamSlots`
(CPU, tiny codec; the bucketed eager path, which is what a CUDA graph records).

The reference is `StreamingDecoder.decode` on a second decoder over the same module holding
the same slot state (see test_codec_graph.py for why padded buckets are compared to 1e-5)."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from omniflow.models.interface import FrameSample, SampledStep
from omniflow.models.qwen3_tts.codec_graph import DecoderStepGraphs
from omniflow.models.qwen3_tts.stream_slots import StreamSlots
from tests.models.test_codec_graph import advanced, assert_same_state, pair
from tests.models.test_codec_stream import codes


def window(rows: int, n: int, seed: int) -> torch.Tensor:
    return torch.stack([codes(n, 2000 + seed + i) for i in range(rows)])


@pytest.mark.parametrize("frames", [[70], [0, 70, 9, 3], [2, 0, 5]])
def test_window_graphs_equal_decode_of_n_frames(frames):
    """B = 1 and 4 exactly a bucket, 3 padded to 4; 70 frames in crosses the KV window."""
    a, b = pair(num_slots=6)
    g = DecoderStepGraphs(a, max_batch=4, buckets=(1, 2, 4), frames=3)
    slots = advanced(a, b, frames=frames, seed=70 + len(frames))
    ids = torch.tensor(slots)
    exact = g.bucket_for(len(slots)) == len(slots)
    for step in range(2):
        c = window(len(slots), 3, 10 * step)
        got = g.run(ids, c)
        want = torch.stack(b.decode(slots, list(c)))
        assert got.shape == (len(slots), 3 * 1920)
        if exact:
            assert torch.equal(got, want)
            assert_same_state(a, b, slots)
        else:
            assert torch.allclose(got, want, atol=1e-5, rtol=0)
    assert [a.position(s) for s in slots] == [n + 6 for n in frames]
    with pytest.raises(ValueError, match="rows"):
        g.run(ids, window(len(slots), 2, 0))  # two frames per row: not this graph's


class Counted(DecoderStepGraphs):
    """Counts replays (here: bucketed eager runs) and the rows they carried."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.rows: list[int] = []

    def run(self, slot_ids, codes):
        self.rows.append(int(slot_ids.shape[0]))
        return super().run(slot_ids, codes)


def step(ids: list[str], frames: list[torch.Tensor | None]) -> SampledStep:
    outputs = tuple(None if f is None else tuple(f.tolist()) for f in frames)
    dense = torch.stack([torch.zeros(16, dtype=torch.int64) if f is None else f for f in frames])
    sample = FrameSample(
        tokens=tuple(0 for _ in ids), outputs=outputs, next_tokens=dense[:, 0], next_frames=dense
    )
    return SampledStep(tuple(ids), sample)


def device_only_steps(ids: list[str], c: torch.Tensor) -> list[SampledStep]:
    """A step per frame of `c` [rows, n, 16] whose host tuples are deliberately wrong
    (zeros): only PCM decoded from the device codes (`next_frames`) can match a reference."""
    steps = []
    for s in range(c.shape[1]):
        good = step(ids, [c[i, s] for i in range(len(ids))])
        wrong = tuple(tuple(0 for _ in range(16)) for _ in ids)
        steps.append(SampledStep(good.request_ids, dataclasses.replace(good.sample, outputs=wrong)))
    return steps


def test_stream_slots_decode_a_window_per_request_in_one_pass():
    """Three steps of a window: x, y and z each sample three frames, w stops (EOS) at the
    third step. All four go through the 3-frame graph in one run (w padded, its PCM cut back
    to its two frames: `window_codes`), never the eager decoder while graphs exist; each
    request's PCM equals its frames decoded one step at a time."""
    a, ref = pair(num_slots=6)
    per_frame = Counted(a, max_batch=4, buckets=(1, 2, 4))
    windowed = Counted(a, max_batch=4, buckets=(1, 2, 4), frames=3)
    slots = StreamSlots(a, {1: per_frame, 3: windowed})
    ids = ["x", "y", "z", "w"]
    c = window(4, 3, 50)
    steps = [step(ids, [c[i, s] for i in range(4)]) for s in range(2)]
    steps.append(step(ids, [c[0, 2], c[1, 2], c[2, 2], None]))
    pcm = slots.decode(steps)
    assert windowed.rows == [4] and per_frame.rows == []
    assert list(pcm) == ids and [len(pcm[r]) for r in ids] == [5760, 5760, 5760, 3840]
    ref_slots = [ref.allocate() for _ in ids]
    for s in range(3):
        rows = [i for i in range(4) if s < 2 or i < 3]
        out = ref.decode([ref_slots[i] for i in rows], [c[i, s : s + 1] for i in rows])
        for i, o in zip(rows, out, strict=True):
            got = torch.from_numpy(pcm[ids[i]][s * 1920 : (s + 1) * 1920])
            assert torch.allclose(got, o, atol=1e-5, rtol=0), (ids[i], s)
    # one step alone takes the per-frame graph, from the frames on the device
    one = slots.decode([step(["x", "y"], [c[0, 0], c[1, 0]])])
    assert per_frame.rows == [2] and windowed.rows == [4] and len(one["x"]) == 1920


def test_without_graphs_a_window_is_decoded_eagerly():
    """No graphs (a kill switch, or a decoder built without them): every group of rows runs
    the eager decoder once, with the same PCM as one step at a time."""
    a, ref = pair(num_slots=4)
    slots = StreamSlots(a)
    ids = ["x", "w"]
    c = window(2, 3, 60)
    steps = [step(ids, [c[0, s], c[1, s] if s < 2 else None]) for s in range(3)]
    pcm = slots.decode(steps)
    assert [len(pcm[r]) for r in ids] == [5760, 3840]
    ref_slots = [ref.allocate() for _ in ids]
    for s in range(3):
        rows = [0, 1] if s < 2 else [0]
        out = ref.decode([ref_slots[i] for i in rows], [c[i, s : s + 1] for i in rows])
        for i, o in zip(rows, out, strict=True):
            got = torch.from_numpy(pcm[ids[i]][s * 1920 : (s + 1) * 1920])
            assert torch.allclose(got, o, atol=1e-5, rtol=0), (ids[i], s)


def test_a_whole_window_reads_its_codes_on_the_device():
    """Every row sampled a frame at every step: the window graph takes the steps'
    `next_frames` stacked on the device (`device_windows`), not codes rebuilt from the
    host's tuples. The host tuples here are deliberately wrong (zeros), so the PCM can only
    equal the reference if the device codes were decoded; a window whose row stops early
    is read on the device too, that row padded (`test_decoder_passes.py`)."""
    a, ref = pair(num_slots=6)
    per_frame = Counted(a, max_batch=4, buckets=(1, 2, 4))
    windowed = Counted(a, max_batch=4, buckets=(1, 2, 4), frames=3)
    slots = StreamSlots(a, {1: per_frame, 3: windowed})
    ids = ["x", "y", "z"]
    c = window(3, 3, 80)
    pcm = slots.decode(device_only_steps(ids, c))
    assert slots.device_windows == 1 and windowed.rows == [3] and per_frame.rows == []
    ref_slots = [ref.allocate() for _ in ids]
    want = ref.decode(ref_slots, [c[i] for i in range(3)])
    for i, rid in enumerate(ids):
        assert torch.allclose(torch.from_numpy(pcm[rid]), want[i], atol=1e-5, rtol=0), rid
    eos = [step(ids, [c[i, s] if s < 2 or i else None for i in range(3)]) for s in range(3)]
    slots.decode(eos)
    assert slots.device_windows == 2 and windowed.rows == [3, 3]
