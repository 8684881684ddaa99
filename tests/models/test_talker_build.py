"""`build_talker` creates the weights without values on the device and then draws (or loads)
every one: the result is the same, bit for bit, as building them with torch's default
initialisation, drawing the dummy values and converting (what it did before, at ~26 s of
default initialisation for the 1.7B model on a 2-core CPU)."""

from __future__ import annotations

import pytest
import torch

from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from omniflow.models.qwen3_tts.factory import build_talker
from omniflow.models.qwen3_tts.modules import Qwen3TTSTalkerWeights, init_dummy


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_dummy_weights_are_the_seeded_draws_of_a_default_built_model(dtype):
    cfg = build_graph(compose(["platform=cpu", f"model.dtype={dtype}"])).model
    built = build_talker(cfg, torch.device("cpu")).talker.weights
    want = Qwen3TTSTalkerWeights(cfg.talker, cfg.code_predictor)
    init_dummy(want, cfg.seed)
    want = want.to(dtype=getattr(torch, dtype))
    got, expected = built.state_dict(), want.state_dict()
    assert got.keys() == expected.keys()
    for name, tensor in expected.items():
        assert got[name].dtype == tensor.dtype and got[name].device.type == "cpu", name
        assert torch.equal(got[name], tensor), name


def test_weights_with_a_buffer_are_refused_rather_than_left_without_values(monkeypatch):
    from omniflow.models.qwen3_tts import factory

    class WithBuffer(Qwen3TTSTalkerWeights):
        def __init__(self, *shapes) -> None:
            super().__init__(*shapes)
            self.register_buffer("table", torch.arange(4.0))

    monkeypatch.setattr(factory, "Qwen3TTSTalkerWeights", WithBuffer)
    cfg = build_graph(compose(["platform=cpu"])).model
    with pytest.raises(TypeError, match="buffers"):
        build_talker(cfg, torch.device("cpu"))
