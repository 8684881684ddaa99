"""The talker's fused q/k norm + rotary + K/V write (`kernels.norm_rope_write`, decode and
whole-prompt prefill) equals the separate steps it replaces: `RMSNorm` + `apply_rotary` on q
and k, `write_kv` at the slots; the prompt graph's step through it equals its plain step.
CPU: the Triton interpreter (run from test_frame_attention.py's child); GPU: the 1.7B
talker's heads in bf16."""

from __future__ import annotations

import pytest
import torch

from omniflow.kernels import norm_rope_write as nw
from omniflow.kernels.args import NormRopeArgs
from omniflow.models.layers.attention import write_kv
from omniflow.models.layers.rotary import Rotary, apply_rotary
from tests.kernels.interpret import expect_refusal
from tests.kernels.test_frame_attention import norms


def case(t, hq, hkv, d, slots, dtype, device="cpu", seed=0):
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=g)).to(device=device, dtype=dtype)

    # q/k/v as views of one packed projection output, as the layer hands them over.
    packed = rnd(t, (hq + 2 * hkv) * d, scale=2)
    q, k, v = packed.split([hq * d, hkv * d, hkv * d], dim=-1)
    q, k, v = q.view(t, hq, d), k.view(t, hkv, d), v.view(t, hkv, d)
    kc, vc = rnd(slots, hkv, d), rnd(slots, hkv, d)
    positions = torch.randint(0, 4000, (t,), generator=g)
    cos, sin = Rotary(d, 1_000_000.0).cos_sin(positions, dtype)
    slot_mapping = torch.randperm(slots, generator=g)[:t].to(device)
    q_norm, k_norm = norms(d, dtype, device, seed)
    return q, k, v, q_norm, k_norm, cos.to(device), sin.to(device), kc, vc, slot_mapping


def check(t, hq, hkv, d, slots, dtype, device="cpu", seed=0, k_out=False):
    """`k_out`: the normalised K is also stored there, the same values the cache gets."""
    q, k, v, qn, kn, cos, sin, kc, vc, sm = case(t, hq, hkv, d, slots, dtype, device, seed)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    q_ref = apply_rotary(qn.reference(q), cos, sin)
    k_ref = apply_rotary(kn.reference(k), cos, sin)
    write_kv(kc_ref, vc_ref, k_ref, v, sm)
    ko = torch.full(k.shape, float("nan"), device=device, dtype=dtype) if k_out else None
    args = NormRopeArgs(q, k, v, qn.weight, kn.weight, qn.eps, cos, sin, kc, vc)
    got = nw.norm_rope_write(args, sm, k_out=ko)
    if ko is not None:
        assert torch.equal(ko, kc[sm])  # bitwise the K the cache got, every row written
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    assert got.shape == q.shape and got.dtype == q.dtype
    torch.testing.assert_close(got, q_ref, atol=tol, rtol=tol)
    torch.testing.assert_close(kc, kc_ref, atol=tol, rtol=tol)
    assert torch.equal(vc, vc_ref)
    untouched = torch.ones(slots, dtype=torch.bool)
    untouched[sm.cpu()] = False
    assert torch.equal(kc[untouched.to(kc.device)], kc_ref[untouched.to(kc.device)])


def check_refusals():
    q, k, v, qn, kn, cos, sin, kc, vc, sm = case(3, 4, 2, 16, 32, torch.float32)
    for args, word in (
        ((q, k, v, cos[:2], sm), "cos"),
        ((q, k, v, cos, sm[:2]), "slots"),
        ((q, k[:, :1], v[:, :1], cos, sm), "cache"),
    ):
        qq, kk, vv, cc, ss = args
        full = (NormRopeArgs(qq, kk, vv, qn.weight, kn.weight, 1e-6, cc, sin, kc, vc), ss)
        expect_refusal(nw.norm_rope_write, full, word)
    args = NormRopeArgs(q, k, v, qn.weight, kn.weight, 1e-6, cos, sin, kc, vc)
    for bad in (k[:2].clone(), k.clone().double(), k.clone().transpose(0, 1).contiguous().mT):
        expect_refusal(nw.norm_rope_write, (args, sm, bad), "k_out")


def check_prompt_step():
    """`PromptGraphs` with `fused` set (what CUDA runs: `norm_rope_write` keeping K for the
    step's own attention) equals its plain step on the same inputs: hidden states, and the
    K/V written at every slot (a step that attended over un-normalised K, or wrote K/V to
    the wrong slots, would not)."""
    from tests.models.test_prompt_graph import graphs, snapshot, whole_prompts
    from tests.stages.test_runner_paths import decoding_runner

    _, runner, reqs = decoding_runner()
    batch = whole_prompts(runner, reqs, True)
    embeds = runner.model.embed_prefill(batch.inputs)
    before = snapshot(runner.kv_caches)
    plain = graphs(runner, 256)
    assert not plain.fused
    want = plain.run(embeds, batch.positions, batch.meta)
    want_kv = snapshot(runner.kv_caches)
    for c, c0 in zip((c for p in runner.kv_caches for c in p), before, strict=True):
        c.copy_(c0)
    fused = graphs(runner, 256)
    fused.fused = True
    got = fused.run(embeds, batch.positions, batch.meta)
    assert got is not None and want is not None
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    dummy = runner.model.kv.dummy_slot
    for c, w in zip((c for p in runner.kv_caches for c in p), want_kv, strict=True):
        torch.testing.assert_close(c[:dummy], w[:dummy], atol=2e-5, rtol=2e-5)


def check_decode_step():
    """`TalkerDecodeGraphs` with `fused` set (what CUDA runs: `norm_rope_write`, then paged
    attention reading the K back from the cache) equals the plain step: hidden states and
    the K/V written."""
    from tests.models.test_decode_graph import clone, decode_case, graphs, kv_caches

    start = kv_caches(seed=3)
    case = decode_case(3, seed=13)
    plain_kv, fused_kv = clone(start), clone(start)
    plain = graphs(plain_kv)
    assert not plain.fused
    want = plain.run(*case.args)
    fused = graphs(fused_kv)
    fused.fused = True
    got = fused.run(*case.args)
    torch.testing.assert_close(got, want, atol=2e-5, rtol=2e-5)
    # later layers' inputs differ by the norms' last bits, so their V too
    for (k, v), (k0, v0) in zip(fused_kv, plain_kv, strict=True):
        torch.testing.assert_close(k, k0, atol=2e-5, rtol=2e-5)
        torch.testing.assert_close(v, v0, atol=2e-5, rtol=2e-5)


GROUPS = {
    "write": lambda: [
        ("fp32 GQA 2", lambda: check(3, 4, 2, 16, 40, torch.float32)),
        ("fp32 GQA 3", lambda: check(5, 6, 2, 32, 64, torch.float32, seed=1)),
        ("bf16", lambda: check(4, 4, 4, 16, 32, torch.bfloat16, seed=2)),
        ("K out too (prefill)", lambda: check(6, 4, 2, 16, 40, torch.float32, seed=3, k_out=True)),
        ("bf16 K out too", lambda: check(5, 4, 2, 16, 40, torch.bfloat16, seed=4, k_out=True)),
        ("refusals", check_refusals),
        ("the prompt graph's fused step", check_prompt_step),
        ("the decode step's fused path", check_decode_step),
    ],
}


# The interpreter run of GROUPS happens in tests/kernels/test_frame_attention.py's child
# (one child for both attention-side kernels saves its ~3 s of imports).


@pytest.mark.cuda
@pytest.mark.parametrize("tokens", [1, 128])
def test_cuda_real_shapes(tokens):
    """The 1.7B talker's heads (16 q, 8 kv, D 128) in bf16."""
    check(tokens, 16, 8, 128, 4096, torch.bfloat16, "cuda", seed=tokens)
