"""On CUDA every pass of the code predictor runs the fused attention kernel
(`kernels.frame_attention`, one launch per token; the two-token first pass through
`frame_pass`); the frame it predicts equals the torch attention path's on the
same device: the same greedy codes and logits within fp32 rounding (tiny model, fp32), and
logits within bf16 rounding at the 1.7B shapes (where a near tie may flip a greedy code)."""

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
    """Codes [B, 15], the 15 logits (greedy) and how many fused-kernel launches `predict`
    made, with the fused path on or forced off."""
    from omniflow.kernels import frame_attention as fa

    original = cp._attend
    if not fused:
        monkeypatch.setattr(cp, "_attend", lambda c, s, n, cuda: original(c, s, n, False))
    launches = []
    kernel = fa.frame_attention

    def counted(*args, **kwargs):
        launches.append(1)
        return kernel(*args, **kwargs)

    monkeypatch.setattr(fa, "frame_attention", counted)
    logits_seen = []

    def greedy(logits, g):
        logits_seen.append(logits.float())
        return logits.argmax(-1)

    with torch.no_grad():
        emb0 = embedding(code0)
        codes = predictor.predict(hidden, emb0, greedy)
    monkeypatch.setattr(cp, "_attend", original)
    monkeypatch.setattr(fa, "frame_attention", kernel)
    return codes, torch.stack(logits_seen), len(launches)


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
    # every layer took the fused kernel once per token: the two-token first pass
    # (`frame_pass`) and the 14 single-token ones; forced off, none did
    tokens = predictor.shape.num_code_groups  # 2 + 14
    assert on == tokens * predictor.shape.num_layers and off == 0
    fp32 = dtype == torch.float32
    # Every pass of a row whose codes so far agree sees the same inputs: its logits differ
    # only by the attention's rounding. In fp32 no code differs at all; in bf16 a near tie
    # can flip a greedy code (random weights), after which the row is not compared.
    same_so_far = (fused == plain).cumprod(dim=1).bool()
    if fp32:
        assert same_so_far.all()
    for g in range(15):
        rows = same_so_far[:, g - 1] if g else torch.ones_like(same_so_far[:, 0])
        a, b = logits_f[g][rows], logits_p[g][rows]
        rel = ((a - b).norm() / b.norm()).item()
        assert rel < (1e-5 if fp32 else 2e-2), (g, rel)
