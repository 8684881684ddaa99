"""Fewer frames than a window's in few passes: `codec_graph.pass_sizes` / `split_frames` and
`StreamSlots` over graph sets of 1, 2, 4 and 8 frames (CPU, tiny codec; the bucketed eager
path, which is what a CUDA graph records). A window cut short by an arrival leaves its rows
n < 8 frames; they go through log2(n) + 1 passes, not n per-frame ones, read on the device."""

from __future__ import annotations

import pytest
import torch

from omniflow.models.qwen3_tts.codec_graph import pass_sizes, split_frames
from omniflow.models.qwen3_tts.stream_slots import StreamSlots
from tests.models.test_codec_graph import pair
from tests.models.test_codec_window_graph import Counted, device_only_steps, step, window


@pytest.mark.parametrize(
    ("frames", "sizes"),
    [(1, (1,)), (2, (2, 1)), (3, (3, 2, 1)), (4, (4, 2, 1)), (6, (6, 4, 2, 1)), (8, (8, 4, 2, 1))],
)
def test_pass_sizes_are_the_window_and_the_powers_of_two_below_it(frames, sizes):
    assert pass_sizes(frames) == sizes


@pytest.mark.parametrize(
    ("n", "parts"), [(8, [8]), (7, [4, 2, 1]), (5, [4, 1]), (3, [2, 1]), (1, [1]), (16, [8, 8])]
)
def test_split_frames_takes_the_largest_passes_first(n, parts):
    assert split_frames(n, pass_sizes(8)) == parts
    assert sum(parts) == n


def test_split_frames_refuses_sizes_without_one():
    with pytest.raises(ValueError, match="no 1"):
        split_frames(3, (2,))
    with pytest.raises(ValueError, match="frames must be >= 1"):
        pass_sizes(0)


def sets(decoder) -> dict[int, Counted]:
    return {n: Counted(decoder, max_batch=4, buckets=(1, 2, 4), frames=n) for n in pass_sizes(8)}


def reference(ref, c: torch.Tensor, n: int, rows: int) -> list[torch.Tensor]:
    """Each row's first n frames decoded one frame at a time on a second decoder."""
    slots = [ref.allocate() for _ in range(rows)]
    out = [[] for _ in range(rows)]
    for s in range(n):
        for i, o in enumerate(ref.decode(slots, [c[i, s : s + 1] for i in range(rows)])):
            out[i].append(o)
    return [torch.cat(o) for o in out]


def test_a_cut_window_reads_its_codes_on_the_device_in_log_passes():
    """Seven steps of the same three rows (an 8-step window cut after its seventh): one call,
    codes from the steps' `next_frames` (the host tuples are zeros, so only the device codes
    can give the reference PCM), in a 4-, a 2- and a 1-frame pass."""
    a, ref = pair(num_slots=6)
    graphs = sets(a)
    slots = StreamSlots(a, graphs)
    ids = ["x", "y", "z"]
    c = window(3, 7, 90)
    pcm = slots.decode(device_only_steps(ids, c))
    assert {n: g.rows for n, g in graphs.items()} == {8: [], 4: [3], 2: [3], 1: [3]}
    assert slots.device_windows == 1
    for i, want in enumerate(reference(ref, c, 7, 3)):
        got = torch.from_numpy(pcm[ids[i]])
        assert got.shape == (7 * 1920,)
        assert torch.allclose(got, want, atol=1e-5, rtol=0), ids[i]


def test_rows_of_different_lengths_split_on_the_host():
    """Five steps in which w stops (EOS) at the fifth: x and y's five frames go as 4 + 1,
    w's four as one 4-frame pass, each row's PCM the reference's."""
    a, ref = pair(num_slots=6)
    graphs = sets(a)
    slots = StreamSlots(a, graphs)
    ids = ["x", "y", "w"]
    c = window(3, 5, 95)
    steps = [step(ids, [c[i, s] if s < 4 or i < 2 else None for i in range(3)]) for s in range(5)]
    pcm = slots.decode(steps)
    assert slots.device_windows == 0
    assert {n: g.rows for n, g in graphs.items()} == {8: [], 4: [2, 1], 2: [], 1: [2]}
    want = reference(ref, c, 5, 3)
    for i, rid in enumerate(ids):
        n = 5 if i < 2 else 4
        got = torch.from_numpy(pcm[rid])
        assert torch.allclose(got, want[i][: n * 1920], atol=1e-5, rtol=0), rid


def test_a_whole_window_is_still_one_pass():
    a, _ = pair(num_slots=4)
    graphs = sets(a)
    slots = StreamSlots(a, graphs)
    c = window(2, 8, 99)
    slots.decode([step(["x", "y"], [c[0, s], c[1, s]]) for s in range(8)])
    assert {n: g.rows for n, g in graphs.items()} == {8: [2], 4: [], 2: [], 1: []}


def test_pass_graphs_without_a_one_frame_set_are_refused():
    a, _ = pair(num_slots=2)
    with pytest.raises(ValueError, match="no 1-frame set"):
        StreamSlots(a, {4: Counted(a, max_batch=2, buckets=(1, 2), frames=4)})
