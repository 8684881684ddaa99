"""Fewer frames than a window's in few passes: `codec_graph.pass_sizes` / `split_frames` and
`StreamSlots` over graph sets of 1, 2, 4 and 8 frames (CPU, tiny codec; the bucketed eager
path, which is what a CUDA graph records). A window cut short by an arrival leaves its rows
n < 8 frames; they go through log2(n) + 1 passes, not n per-frame ones, read on the device."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from omniflow.core.audio import AudioFailed
from omniflow.models.interface import SampledStep
from omniflow.models.qwen3_tts.codec_graph import pass_sizes, split_frames
from omniflow.models.qwen3_tts.pending_pcm import PendingPcm
from omniflow.models.qwen3_tts.stream_slots import StreamSlots
from omniflow.models.qwen3_tts.window_codes import prefix_counts
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


def ragged(c: torch.Tensor, ids: list[str], counts: dict[str, int], eos: set[str]):
    """A window's steps whose rows leave as real ones do: row r has a frame in each of its
    first counts[r] steps, then (in `eos`) one more step with no frame (its stop token), or
    (not in `eos`) is gone (its length cap). Host tuples are zeros, as in
    `device_only_steps`: only PCM decoded from the device codes can match a reference."""
    steps = []
    for s in range(max(counts.values()) + 1):
        rows = [i for i, r in enumerate(ids) if counts[r] > s or (r in eos and counts[r] == s)]
        if not rows:
            break
        got = step([ids[i] for i in rows], [c[i, s] if counts[ids[i]] > s else None for i in rows])
        wrong = tuple(None if f is None else (0,) * 16 for f in got.sample.outputs)
        steps.append(SampledStep(got.request_ids, dataclasses.replace(got.sample, outputs=wrong)))
    return steps


def test_rows_that_stop_early_run_the_longest_rows_passes_padded():
    """Five steps: x and y sample five frames, w stops (stop token) after four, v leaves
    after two (its length cap). All four rows go through the 4- and the 1-frame pass once,
    codes read on the device; w's and v's PCM cut back to their own frames, each row's the
    reference's."""
    a, ref = pair(num_slots=6)
    graphs = sets(a)
    slots = StreamSlots(a, graphs)
    ids = ["x", "y", "w", "v"]
    counts = {"x": 5, "y": 5, "w": 4, "v": 2}
    c = window(4, 5, 95)
    pcm = slots.decode(ragged(c, ids, counts, eos={"w"}))
    assert slots.device_windows == 1
    assert {n: g.rows for n, g in graphs.items()} == {8: [], 4: [4], 2: [], 1: [4]}
    assert list(pcm) == ids
    want = reference(ref, c, 5, 4)
    for i, rid in enumerate(ids):
        got = torch.from_numpy(pcm[rid])
        assert got.shape == (counts[rid] * 1920,), rid
        assert torch.allclose(got, want[i][: counts[rid] * 1920], atol=1e-5, rtol=0), rid


def test_a_slot_run_past_its_last_frame_is_never_decoded_again():
    """w's slot took padding after its last frame (it was to end with the window): another
    frame for w is refused, not decoded into garbled audio; once w has finished, its id
    may come back with a fresh slot. A row that had every frame goes on."""
    a, _ = pair(num_slots=6)
    slots = StreamSlots(a, sets(a))
    c = window(2, 3, 97)
    slots.decode(ragged(c, ["x", "w"], {"x": 3, "w": 1}, eos={"w"}))
    more = window(2, 1, 98)
    with pytest.raises(RuntimeError, match=r"\['w'\] were run past their last frame"):
        slots.decode([step(["x", "w"], [more[0, 0], more[1, 0]])])
    assert len(slots.decode([step(["x"], [more[0, 0]])])["x"]) == 1920
    slots.finish("w")
    assert len(slots.decode([step(["w"], [more[1, 0]])])["w"]) == 1920


def test_a_row_with_a_gap_is_grouped_on_the_host():
    """Frames that are not a prefix of the steps (none in this step, one in the next) are
    not what a window makes: the rows are grouped by frame count on the host, unpadded."""
    a, ref = pair(num_slots=6)
    graphs = sets(a)
    slots = StreamSlots(a, graphs)
    c = window(2, 3, 96)
    steps = [step(["x", "w"], [c[0, s], None if s == 1 else c[1, s]]) for s in range(3)]
    assert prefix_counts(steps) is None
    assert prefix_counts([steps[0], step(["z"], [c[0, 1]])]) is None  # a row not in the first
    pcm = slots.decode(steps)
    assert slots.device_windows == 0
    assert {n: g.rows for n, g in graphs.items()} == {8: [], 4: [], 2: [1, 1], 1: [1]}
    assert [len(pcm[r]) for r in ("x", "w")] == [3 * 1920, 2 * 1920]


def test_padding_is_cut_before_the_overflow_check():
    """A reduced-precision decoder's PCM is checked for inf/NaN only where it is audio: a
    padded row's tail (`keep`) is dropped first; inf within its frames still fails it."""
    rows = torch.zeros(2, 4)
    rows[1, 3] = float("inf")
    pcm = PendingPcm(("x", "w"), [(["x", "w"], rows)], dtype=torch.float16, keep={"w": 2})
    out = pcm.result()
    assert [len(out["x"]), len(out["w"])] == [4, 2]
    rows = torch.zeros(2, 4)
    rows[1, 1] = float("inf")
    with pytest.raises(AudioFailed) as failed:
        PendingPcm(("x", "w"), [(["x", "w"], rows)], dtype=torch.float16, keep={"w": 2}).result()
    assert list(failed.value.errors) == ["w"]


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
