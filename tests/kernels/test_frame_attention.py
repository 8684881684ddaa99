"""The code predictor's fused single-token attention (`kernels.frame_attention`) equals the
torch path it replaces: q/k norm + rotary, the cache slice write, `dense_causal_attention`.
CPU: the Triton interpreter; GPU: the 1.7B predictor's shapes in bf16, and inside a graph.
Also: a layer hands a `PreNormAttend` q/k as projected, with its norms."""

from __future__ import annotations

import pytest
import torch

from omniflow.kernels import frame_attention as fa
from omniflow.kernels.args import NormRopeArgs
from omniflow.models.layers.attention import dense_causal_attention
from omniflow.models.layers.norm import RMSNorm
from omniflow.models.layers.qwen3 import PreNormAttend, Qwen3Attention
from omniflow.models.layers.rotary import Rotary, apply_rotary
from omniflow.models.shapes import TransformerShape
from tests.kernels.interpret import expect_refusal, register, run_checks, run_group_in_child


def norms(d: int, dtype: torch.dtype, device: str, seed: int) -> tuple[RMSNorm, RMSNorm]:
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(2):
        n = RMSNorm(d, eps=1e-6)
        with torch.no_grad():
            n.weight.copy_(1 + 0.5 * torch.randn(d, generator=g))
        out.append(n.to(device=device, dtype=dtype))
    return out[0], out[1]


def reference(q, k, v, q_norm, k_norm, cos, sin, kc, vc, start):
    """The torch path: what the predictor ran before the kernel (caches updated in place)."""
    q = apply_rotary(q_norm.reference(q), cos, sin)
    k = apply_rotary(k_norm.reference(k), cos, sin)
    kc[:, start : start + 1] = k
    vc[:, start : start + 1] = v
    return dense_causal_attention(q.float(), kc.float(), vc.float(), start).to(q.dtype)


def case(b, hq, hkv, d, s, start, dtype, device="cpu", seed=0, packed=False):
    """Inputs of one pass; `packed`: q/k/v as views of one projection output, as the layer
    hands them over (row stride (hq + 2 hkv) d)."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=g)).to(device=device, dtype=dtype)

    if packed:
        qkv = rnd(b, 1, (hq + 2 * hkv) * d, scale=2)
        q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
        q, k, v = q.view(b, 1, hq, d), k.view(b, 1, hkv, d), v.view(b, 1, hkv, d)
    else:
        q, k, v = rnd(b, 1, hq, d, scale=2), rnd(b, 1, hkv, d, scale=2), rnd(b, 1, hkv, d)
    kc, vc = rnd(b, s, hkv, d), rnd(b, s, hkv, d)
    q_norm, k_norm = norms(d, dtype, device, seed)
    cos, sin = Rotary(d, 1_000_000.0).cos_sin(torch.tensor([start]), dtype)
    return q, k, v, q_norm, k_norm, cos.to(device), sin.to(device), kc, vc


def check(b, hq, hkv, d, s, start, dtype, device="cpu", seed=0, packed=False):
    q, k, v, qn, kn, cos, sin, kc, vc = case(b, hq, hkv, d, s, start, dtype, device, seed, packed)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    want = reference(q, k, v, qn, kn, cos, sin, kc_ref, vc_ref, start)
    args = NormRopeArgs(q, k, v, qn.weight, kn.weight, qn.eps, cos, sin, kc, vc)
    got = fa.frame_attention(args, start)
    assert got.shape == want.shape and got.dtype == want.dtype
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    # The new K/V land at `start` (K within the norm kernel's ulp), nothing else is touched.
    torch.testing.assert_close(kc[:, start], kc_ref[:, start], atol=tol, rtol=tol)
    assert torch.equal(vc[:, start], vc_ref[:, start])
    others = [i for i in range(s) if i != start]
    assert torch.equal(kc[:, others], kc_ref[:, others])
    assert torch.equal(vc[:, others], vc_ref[:, others])


def check_pass(b, hq, hkv, d, s, start, length, dtype, seed=0, packed=False):
    """`frame_pass`: `length` tokens per row from `start` (the predictor's first pass is two
    from 0) equal the torch path over the whole pass: norms and rotary per position, the
    cache slice written, causal attention within the pass and over the cached prefix.
    `packed`: q/k/v as views of one projection output, as the layer hands them over."""
    g = torch.Generator().manual_seed(seed)

    def rnd(*shape, scale=1.0):
        return (scale * torch.randn(*shape, generator=g)).to(dtype=dtype)

    if packed:
        qkv = rnd(b, length, (hq + 2 * hkv) * d, scale=2)
        q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=-1)
        q, k = q.view(b, length, hq, d), k.view(b, length, hkv, d)
        v = v.view(b, length, hkv, d)
    else:
        q, k, v = (
            rnd(b, length, hq, d, scale=2),
            rnd(b, length, hkv, d, scale=2),
            rnd(b, length, hkv, d),
        )
    kc, vc = rnd(b, s, hkv, d), rnd(b, s, hkv, d)
    qn, kn = norms(d, dtype, "cpu", seed)
    cos, sin = Rotary(d, 1_000_000.0).cos_sin(torch.arange(start, start + length), dtype)
    kc_ref, vc_ref = kc.clone(), vc.clone()
    qr = apply_rotary(qn.reference(q), cos, sin)
    kr = apply_rotary(kn.reference(k), cos, sin)
    kc_ref[:, start : start + length] = kr
    vc_ref[:, start : start + length] = v
    want = dense_causal_attention(qr.float(), kc_ref.float(), vc_ref.float(), start).to(dtype)
    got = fa.frame_pass(
        NormRopeArgs(q, k, v, qn.weight, kn.weight, qn.eps, cos, sin, kc, vc), start
    )
    assert got.shape == want.shape == (b, length, hq, d)
    tol = 2e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)
    span = list(range(start, start + length))
    torch.testing.assert_close(kc[:, span], kc_ref[:, span], atol=tol, rtol=tol)
    assert torch.equal(vc[:, span], vc_ref[:, span])
    others = [i for i in range(s) if i not in span]
    assert torch.equal(kc[:, others], kc_ref[:, others])
    assert torch.equal(vc[:, others], vc_ref[:, others])


def check_pass_refusals():
    """A pass whose keys, values or rotary rows do not match its queries is refused (a short
    cos would be an out-of-bounds read in the kernel)."""
    q, k, v = torch.randn(2, 2, 4, 16), torch.randn(2, 2, 2, 16), torch.randn(2, 2, 2, 16)
    kc, vc = torch.randn(2, 16, 2, 16), torch.randn(2, 16, 2, 16)
    qn, kn = norms(16, torch.float32, "cpu", 0)
    cos, sin = Rotary(16, 1_000_000.0).cos_sin(torch.arange(0, 2), torch.float32)
    for args, word in (
        ((q, k[:, :1], v, cos, sin), "keys"),
        ((q, k, v, cos[:1], sin[:1]), "rows"),
    ):
        qq, kk, vv, cc, ss = args
        full = (NormRopeArgs(qq, kk, vv, qn.weight, kn.weight, 1e-6, cc, ss, kc, vc), 0)
        expect_refusal(fa.frame_pass, full, word)


def check_refusals():
    q, k, v, qn, kn, cos, sin, kc, vc = case(2, 4, 2, 16, 16, 3, torch.float32)
    two = torch.cat([q, q], dim=1)
    for args, word in (
        ((two, k, v, 3), "one token"),
        ((q, k, v, 16), "start 16"),
        ((q, k[:, :, :1], v[:, :, :1], 3), "cache"),
    ):
        qq, kk, vv, start = args
        full = (NormRopeArgs(qq, kk, vv, qn.weight, kn.weight, 1e-6, cos, sin, kc, vc), start)
        expect_refusal(fa.frame_attention, full, word)


GROUPS = {
    "attention": lambda: [
        ("start 0 (only the new key)", lambda: check(2, 4, 2, 16, 16, 0, torch.float32)),
        ("start 5, GQA 2", lambda: check(3, 4, 2, 16, 16, 5, torch.float32, seed=1)),
        ("start 15 (last slot)", lambda: check(2, 6, 2, 32, 16, 15, torch.float32, seed=2)),
        ("S not a power of two", lambda: check(2, 2, 2, 16, 12, 7, torch.float32, seed=3)),
        ("bf16", lambda: check(2, 4, 2, 16, 16, 9, torch.bfloat16, seed=4)),
        ("packed q/k/v views", lambda: check(3, 4, 2, 16, 16, 6, torch.float32, packed=True)),
        ("a pass of 1 from 7", lambda: check_pass(2, 4, 2, 16, 16, 7, 1, torch.float32, 8)),
        ("a pass of 2 from 0", lambda: check_pass(2, 4, 2, 16, 16, 0, 2, torch.float32)),
        ("a pass of 3 from 4", lambda: check_pass(3, 4, 2, 16, 16, 4, 3, torch.float32, 5)),
        ("a bf16 pass of 2", lambda: check_pass(2, 4, 2, 16, 16, 0, 2, torch.bfloat16, 6)),
        (
            "a pass of packed q/k/v views",
            lambda: check_pass(3, 4, 2, 16, 16, 0, 2, torch.float32, 7, packed=True),
        ),
        ("pass refusals", check_pass_refusals),
        ("refusals", check_refusals),
    ],
}


register(__name__, sorted(GROUPS))


def run_interpreted(group: str) -> int:
    """Child entry point (see tests/kernels/interpret.py). The talker's fused
    norm+rotary+write checks (tests/kernels/test_norm_rope_write.py) run in the same child:
    each child pays ~3 s of imports."""
    from tests.kernels import test_norm_rope_write as nrw

    kernels = (fa._frame_attention_kernel, nrw.nw._norm_rope_write_kernel)
    return run_checks(group, kernels, GROUPS[group]() + nrw.GROUPS["write"]())


@pytest.mark.parametrize("group", sorted(GROUPS))
def test_kernel_matches_torch_in_triton_interpreter(group):
    run_group_in_child("tests.kernels.test_frame_attention", group)


def test_layer_hands_a_pre_norm_attend_the_projected_q_k_and_its_norms():
    """Through a `PreNormAttend` running the torch path by hand, the layer's output equals the
    plain path's: the layer passed q/k un-normalised, its own norms and the tables."""
    torch.manual_seed(0)
    shape = TransformerShape(
        hidden_size=32,
        num_layers=1,
        num_heads=4,
        num_kv_heads=2,
        head_dim=8,
        intermediate_size=64,
        rms_norm_eps=1e-6,
        rope_theta=10_000.0,
    )
    layer = Qwen3Attention(shape, layer_idx=3)
    with torch.no_grad():
        layer.q_norm.weight.uniform_(0.5, 1.5)
        layer.k_norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, 1, 32)
    cos, sin = Rotary(8, 10_000.0).cos_sin(torch.tensor([4]), torch.float32)
    kc, vc = torch.randn(2, 16, 2, 8), torch.randn(2, 16, 2, 8)
    kc2, vc2 = kc.clone(), vc.clone()
    seen = []

    def plain(i, q, k, v):
        kc[:, 4:5], vc[:, 4:5] = k, v
        return dense_causal_attention(q, kc, vc, 4)

    def pre_norm(i, q, k, v, q_norm, k_norm, c, s):
        seen.append(i)
        return reference(q, k, v, q_norm, k_norm, c, s, kc2, vc2, 4)

    want = layer(x, cos, sin, plain)
    got = layer(x, cos, sin, PreNormAttend(pre_norm))
    assert seen == [3]
    torch.testing.assert_close(got, want, atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(kc2, kc, atol=1e-6, rtol=1e-6)


@pytest.mark.cuda
@pytest.mark.parametrize("batch", [1, 128])
def test_cuda_real_shapes_and_graph_replay(batch):
    """The 1.7B predictor's heads (16 q, 8 kv, D 128, 16 slots) in bf16 at every position,
    then one launch captured in a CUDA graph replays on new inputs."""
    for start in range(16):
        check(batch, 16, 8, 128, 16, start, torch.bfloat16, "cuda", start, packed=start % 2 == 1)
    q, k, v, qn, kn, cos, sin, kc, vc = case(batch, 16, 8, 128, 16, 6, torch.bfloat16, "cuda")
    args = NormRopeArgs(q, k, v, qn.weight, kn.weight, qn.eps, cos, sin, kc, vc)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fa.frame_attention(args, 6)
    q.copy_(torch.randn_like(q))
    graph.replay()
    again = fa.frame_attention(args, 6)
    assert torch.equal(out, again)
