"""omniflow against the official qwen-tts in one process, at the published models' widths.

Manual and slow (minutes, ~10 GB of memory): `python3 -m pytest -m reference_live
tests/reference -s`, with the official package installed as tests/reference/official.py
says. The text vocabulary is cut to 4,096 rows and the 1.7B talker to 8 layers, so both fit
a laptop; every width (hidden, heads, FFN, code predictor, codec) is the preset's.
"""

from __future__ import annotations

import pytest

from omniflow.config.compose import compose
from omniflow.config.resolve import build_graph
from tests.reference import ours
from tests.reference.cases import SEED

pytestmark = pytest.mark.reference_live

TOLERANCES = {
    "prompt": 1e-5,
    "logits": 1e-4,
    "predictor": 1e-4,
    "codec": 1e-4,
    "greedy": 0.0,
    "encoder": 0.0,
    "mel": 1e-4,
    "speaker": 1e-4,
}
SHRINK = ("model.talker.text_vocab_size=4096",)


@pytest.mark.parametrize(
    ("preset", "overrides"),
    [("qwen3_tts_0_6b", SHRINK), ("qwen3_tts_1_7b", (*SHRINK, "model.talker.num_layers=8"))],
)
def test_real_widths_match_the_official_implementation(tmp_path, preset, overrides):
    from tests.reference import official  # needs qwen-tts: fail loudly when it is missing

    spec = compose(["platform=cpu", f"model={preset}", "model.dtype=float32", *overrides])
    model = build_graph(spec).model
    tts, codec = official.build(model, SEED)
    official.save(tts, codec, tmp_path)
    tensors = official.outputs(tts, codec, model)
    del tts, codec
    loaded = ours.load(ours.model_config(preset, tmp_path, *overrides))
    diffs = ours.measure(loaded, tensors)
    print(f"\n{preset}: " + ", ".join(f"{k} {v:.2g}" for k, v in diffs.items()))
    for key, value in diffs.items():
        assert value <= TOLERANCES[key.split("/")[0]], (key, value)
