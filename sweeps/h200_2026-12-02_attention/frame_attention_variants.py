"""Frame attention variants at the 1.7B code predictor's shapes (bf16, 16 q / 8 KV heads of
128, a 16-position cache): microseconds per launch (`do_bench_cudagraph`) and whether the
output and caches equal the first variant's (one warp, the kernel as committed at 380bbb3).
Run on the H200 as `python frame_attention_variants.py OUT.json` with the repository on
PYTHONPATH; reformatted for the linter after the run, the code otherwise as run."""

import json
import os
import sys
from functools import partial

import torch
import triton
import triton.language as tl
from triton.testing import do_bench_cudagraph

from omniflow.kernels import frame_attention as fa
from omniflow.kernels.norm_rope import norm_rope_row


@triton.jit
def _hoisted(
    q_ptr,
    k_ptr,
    v_ptr,
    qw_ptr,
    kw_ptr,
    cos_row,
    sin_row,
    kc_ptr,
    vc_ptr,
    out_ptr,
    stride_qb,
    stride_qh,
    stride_kb,
    stride_kh,
    stride_vb,
    stride_vh,
    stride_cb,
    stride_cs,
    stride_ch,
    stride_ob,
    stride_oh,
    start,
    eps,
    scale,
    GROUP: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    S_BLOCK: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    h = tl.program_id(1).to(tl.int64)
    cols = tl.arange(0, HEAD_DIM)
    cache = b * stride_cb + h * stride_ch
    pos = tl.arange(0, S_BLOCK)
    old = (pos < start)[:, None]
    offs = cache + pos[:, None] * stride_cs + cols[None, :]
    keys = tl.load(kc_ptr + offs, mask=old, other=0.0).to(tl.float32)
    vals = tl.load(vc_ptr + offs, mask=old, other=0.0).to(tl.float32)
    v = tl.load(v_ptr + b * stride_vb + h * stride_vh + cols)
    k = norm_rope_row(
        k_ptr + b * stride_kb + h * stride_kh, kw_ptr, cos_row, sin_row, eps, HEAD_DIM
    )
    new = (pos == start)[:, None]
    keys = tl.where(new, k.to(tl.float32)[None, :], keys)
    vals = tl.where(new, v.to(tl.float32)[None, :], vals)
    visible = pos <= start
    for g in tl.static_range(GROUP):
        qh = h * GROUP + g
        q = norm_rope_row(
            q_ptr + b * stride_qb + qh * stride_qh, qw_ptr, cos_row, sin_row, eps, HEAD_DIM
        )
        scores = tl.sum(q.to(tl.float32)[None, :] * keys, axis=1) * scale
        scores = tl.where(visible, scores, float("-inf"))
        p = tl.exp(scores - tl.max(scores, axis=0))
        p = p / tl.sum(p, axis=0)
        o = tl.sum(p[:, None] * vals, axis=0)
        tl.store(out_ptr + b * stride_ob + qh * stride_oh + cols, o.to(out_ptr.dtype.element_ty))
    tl.store(kc_ptr + cache + start * stride_cs + cols, k)
    tl.store(vc_ptr + cache + start * stride_cs + cols, v)


def launch(kernel, q, k, v, qw, kw, cos, sin, kc, vc, start, warps):
    bsz, _, hq, d = q.shape
    hkv = k.shape[2]
    out = torch.empty((bsz, 1, hq, d), device=q.device, dtype=q.dtype)
    kernel[(bsz, hkv)](
        q,
        k,
        v,
        qw,
        kw,
        cos,
        sin,
        kc,
        vc,
        out,
        q.stride(0),
        q.stride(2),
        k.stride(0),
        k.stride(2),
        v.stride(0),
        v.stride(2),
        kc.stride(0),
        kc.stride(1),
        kc.stride(2),
        out.stride(0),
        out.stride(2),
        start,
        1e-6,
        d**-0.5,
        GROUP=hq // hkv,
        HEAD_DIM=d,
        S_BLOCK=triton.next_power_of_2(kc.shape[1]),
        num_warps=warps,
    )
    return out


def main(out_path):
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    rows = []
    for bsz in (1, 32, 128):
        # q, k, v as views of one qkv projection, as the model has them
        qkv = torch.randn(bsz, 1, (16 + 8 + 8) * 128, device=dev, dtype=dt)
        q = qkv[..., :2048].view(bsz, 1, 16, 128)
        k = qkv[..., 2048:3072].view(bsz, 1, 8, 128)
        v = qkv[..., 3072:].view(bsz, 1, 8, 128)
        qw = torch.randn(128, device=dev, dtype=dt)
        kw = torch.randn(128, device=dev, dtype=dt)
        cos = torch.randn(1, 128, device=dev, dtype=dt)
        sin = torch.randn(1, 128, device=dev, dtype=dt)
        base_k = torch.randn(bsz, 16, 8, 128, device=dev, dtype=dt)
        base_v = torch.randn_like(base_k)
        for start in (2, 15):
            ref = None
            for name, kern in (("current", fa._frame_attention_kernel), ("hoisted", _hoisted)):
                for warps in (1, 2, 4, 8):
                    kc, vc = base_k.clone(), base_v.clone()
                    o = launch(kern, q, k, v, qw, kw, cos, sin, kc, vc, start, warps)
                    torch.cuda.synchronize()
                    if ref is None:
                        ref = (o, kc, vc)
                    same = all(torch.equal(a, b) for a, b in zip(ref, (o, kc, vc), strict=True))
                    us = 1000 * do_bench_cudagraph(
                        partial(launch, kern, q, k, v, qw, kw, cos, sin, kc, vc, start, warps),
                        rep=50,
                    )
                    row = dict(
                        batch=bsz,
                        start=start,
                        kernel=name,
                        warps=warps,
                        us=round(us, 2),
                        equal=same,
                    )
                    print(row, flush=True)
                    rows.append(row)
    with open(out_path, "w") as f:
        json.dump(
            dict(
                commit=os.environ.get("OMNIFLOW_COMMIT"),
                device=torch.cuda.get_device_name(),
                rows=rows,
            ),
            f,
            indent=1,
        )


main(sys.argv[1])
