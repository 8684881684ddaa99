"""The graph paths (talker decode step, code predictor) as the runner drives them.

The code predictor's graph path (`platform.cuda_graphs`) as the runner drives it: on the
CPU the same bucketed path runs without capture, so CI checks the wiring (noise keys, padding
to a bucket, the fixed-policy draw) gives exactly the eager frames. Capture itself is checked
on CUDA (tests/cuda/test_predictor_graph_cuda.py, tests/cuda/test_talker_cuda.py)."""

from __future__ import annotations

from tests.factories import speech
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
