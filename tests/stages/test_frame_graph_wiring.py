"""The graph paths (talker decode step, code predictor) as the runner drives them.

The code predictor's graph path (`platform.cuda_graphs`) as the runner drives it: on the
CPU the same bucketed path runs without capture, so CI checks the wiring (noise keys, padding
to a bucket, the fixed-policy draw) gives exactly the eager frames. Capture itself is checked
on CUDA (tests/cuda/test_predictor_graph_cuda.py, tests/cuda/test_talker_cuda.py)."""

from __future__ import annotations

import numpy as np

from tests.factories import eos_bundle, speech
from tests.stages.test_talker_engine import generate


def test_frames_through_the_graph_path_equal_the_eager_frames():
    reqs = [
        speech("a", seed=3, max_new_tokens=9, ignore_eos=True),
        speech("b", text="Something longer to say.", seed=4, max_new_tokens=7, ignore_eos=True),
        speech("c", seed=5, max_new_tokens=8, ignore_eos=True, temperature=0.0),
    ]
    eager, _, _ = generate(reqs)
    graphed, _, engine = generate(reqs, frame_graphs=True)
    assert engine.runner.model.frame_graphs is not None  # the graph path really ran
    assert graphed == eager
    assert [len(graphed[r]) for r in "abc"] == [9, 7, 8]


def test_decode_steps_through_the_talker_graph_path_give_the_eager_tokens():
    """The decode-graph function (bucket padding, RoPE table, reference attention on the CPU)
    in the runner's decode path: same frames as the eager forward, windows included."""
    reqs = [
        speech("a", seed=3, max_new_tokens=9, ignore_eos=True),
        speech("b", text="Something longer to say.", seed=4, max_new_tokens=7, ignore_eos=True),
    ]
    eager, _, _ = generate(reqs)
    graphed, _, engine = generate(reqs, decode_graphs=True, frame_graphs=True)
    assert engine.runner.model.decode_graphs is not None  # the graph path really ran
    assert graphed == eager
    windowed, _, _ = generate(reqs, decode_graphs=True, window_k=4)
    assert windowed == eager


def pcm_by_request(outputs) -> dict[str, np.ndarray]:
    parts: dict[str, list[np.ndarray]] = {}
    for o in outputs:
        if o.audio is not None:
            parts.setdefault(o.request_id, []).append(o.audio)
    return {rid: np.concatenate(p) for rid, p in parts.items()}


def test_fused_audio_through_the_decoder_step_graphs_equals_the_eager_decoder():
    """The decoder's per-frame step (bucket padding, the padding slot, device frames) gives
    the eager decoder's PCM: bitwise where the batch fills its bucket, within 1e-5 where the
    CPU's transposed convolution picks another kernel for the padded batch size."""
    reqs = [
        speech("a", seed=3, max_new_tokens=6, ignore_eos=True),
        speech("b", text="Something longer to say.", seed=4, max_new_tokens=5, ignore_eos=True),
        speech("c", seed=5, max_new_tokens=4, ignore_eos=True),
    ]
    eager_frames, eager_out, _ = generate(reqs, stream_decode=True)
    frames, outs, engine = generate(reqs, stream_decode=True, decode_graphs=True)
    assert 1 in engine.runner.model.slots.passes  # the step graphs really ran
    assert frames == eager_frames
    want, got = pcm_by_request(eager_out), pcm_by_request(outs)
    assert sorted(got) == ["a", "b", "c"]
    for rid in want:
        assert got[rid].shape == want[rid].shape == (len(frames[rid]) * 1920,)
        assert np.allclose(got[rid], want[rid], atol=1e-5, rtol=0)


def test_windows_whose_rows_stop_early_decode_padded_with_the_eager_pcm():
    """4-step windows over the decoder's pass graphs: c stops at its third token (a stop
    token), a, b and d at their length caps, all inside windows. The rows that stop early
    are padded to their window's longest row and cut back (`window_codes`), and no slot is
    decoded past its padding: frames and PCM equal the eager, single-step decoder's."""
    reqs = [
        speech("a", seed=3, max_new_tokens=6, ignore_eos=True),
        speech("b", text="Something longer to say.", seed=4, max_new_tokens=9, ignore_eos=True),
        speech("c", seed=5, max_new_tokens=9),
        speech("d", seed=6, max_new_tokens=5, ignore_eos=True),
    ]
    eager_frames, eager_out, _ = generate(reqs, stream_decode=True, bundle=eos_bundle())
    frames, outs, engine = generate(
        reqs, stream_decode=True, decode_graphs=True, window_k=4, bundle=eos_bundle()
    )
    slots = engine.runner.model.slots
    assert sorted(slots.passes) == [1, 2, 4] and slots.padded_rows >= 2
    assert not [o.error for o in outs if o.error]
    assert frames == eager_frames and [len(frames[r]) for r in "abcd"] == [6, 9, 3, 5]
    want, got = pcm_by_request(eager_out), pcm_by_request(outs)
    for rid in "abcd":
        audible = sum(len(f) == 16 for f in frames[rid])  # c's stop token makes no audio
        assert got[rid].shape == want[rid].shape == (audible * 1920,), rid
        assert np.allclose(got[rid], want[rid], atol=1e-5, rtol=0), rid
