"""Sampling settings the device cannot hold are refused at submission, naming the setting,
and the pipeline keeps serving. A temperature above the largest float32 became inf in the
draw; a banned id's -inf divided by it is NaN, which argmax picked: the sampled id was out
of the codec's range and the talker stage died, taking every later request with it."""

from __future__ import annotations

import math

import pytest

from omniflow.core.request import FLOAT32_MAX, SamplingParams
from tests.factories import Collector, build, speech


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("temperature", math.inf),
        ("temperature", 1e39),
        ("temperature", math.nan),
        ("repetition_penalty", math.inf),
        ("repetition_penalty", 1e39),
    ],
)
def test_a_setting_past_float32_is_refused_naming_it(field, value):
    with pytest.raises(ValueError, match=f"{field} must be .* finite"):
        SamplingParams(**{field: value})


def test_the_largest_float32_and_zero_are_accepted():
    SamplingParams(temperature=FLOAT32_MAX, repetition_penalty=FLOAT32_MAX)
    SamplingParams(temperature=0.0)  # greedy


def test_an_infinite_temperature_is_refused_at_submit_and_the_pipeline_keeps_serving():
    orch = build("qwen3_tts_fused")
    try:
        with pytest.raises(ValueError, match="temperature"):
            orch.submit(speech("hot", temperature=1e39, max_new_tokens=4), Collector())
        ok = Collector()
        orch.submit(speech("after", max_new_tokens=3, ignore_eos=True), ok)
        assert ok.wait().terminal.error is None and len(ok.pcm) == 3 * 1920
        assert orch.stats().healthy
    finally:
        orch.stop()
