"""On CUDA the code predictor's single-token passes run the fused attention kernel
(`kernels.frame_attention`); the frame it predicts equals the torch attention path's on the
same device: the same greedy codes, logits within fp32 rounding (tiny model, fp32) and within
bf16 rounding at the 1.7B shapes."""

from __future__ import annotations

import pytest
import torch

from omniflow.models.qwen3_tts import code_predictor as cp
from omniflow.models.qwen3_tts.factory import build_talker
from omniflow.platforms.base import prepare_device
from tests.cuda.test_predictor_graph_cuda import DEV, parts_1_7b
from tests.factories import tiny_model_config

pytestmark = pytest.mark.cuda


def predict(predictor, embedding, hidden, code0, fused: bool, monkeypatch):
    """Codes [B, 15] and the 15 logits, greedy, with the fused path on or forced off."""
    original = cp._attend
    if not fused:
        monkeypatch.setattr(cp, "_attend", lambda c, s, n, cuda: original(c, s, n, False))
    seen_fused = []
    logits_seen = []

    def greedy(logits, g):
        logits_seen.append(logits.float())
        return logits.argmax(-1)

    with torch.no_grad():
        seen_fused.append(isinstance(cp._attend([], 1, 1, True), cp.PreNormAttend))
        emb0 = embedding(code0)
        codes = predictor.predict(hidden, emb0, greedy)
    monkeypatch.setattr(cp, "_attend", original)
    return codes, torch.stack(logits_seen), seen_fused[0]


@pytest.mark.parametrize("name", ["tiny", "1.7b"])
def test_fused_predictor_equals_the_torch_attention_path(name, monkeypatch):
    prepare_device("cuda")
    if name == "tiny":
        talker = build_talker(tiny_model_config().model_copy(update={"dtype": "float32"}), DEV)
        predictor = talker.talker.predictor
        embedding = talker.talker.weights.talker.model.codec_embedding
    else:
        predictor, embedding = parts_1_7b()
    dtype = embedding.weight.dtype
    gen = torch.Generator().manual_seed(3)
    b = 8
    hidden = torch.randn(b, embedding.embedding_dim, generator=gen).to(DEV, dtype)
    code0 = torch.randint(0, 1024, (b,), generator=gen).to(DEV)
    fused, logits_f, on = predict(predictor, embedding, hidden, code0, True, monkeypatch)
    plain, logits_p, off = predict(predictor, embedding, hidden, code0, False, monkeypatch)
    assert on and not off
    tol = 1e-4 if dtype == torch.float32 else 5e-2
    # Logits of the first pass (two tokens, no fused kernel) are equal; later ones close.
    assert torch.equal(logits_f[0], logits_p[0])
    same_so_far = (fused == plain).cumprod(dim=1).bool()
    assert same_so_far[:, -1].float().mean() >= (1.0 if dtype == torch.float32 else 0.75)
    for g in range(1, 15):
        rows = same_so_far[:, g - 1]
        torch.testing.assert_close(logits_f[g][rows], logits_p[g][rows], atol=tol, rtol=tol)
