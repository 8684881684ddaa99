"""GPU: `benchmarks.graph_trace` builds the graphs it traces (pytest -m cuda)."""

from __future__ import annotations

import pytest
import torch

from benchmarks.graph_trace import (
    build_codec_graph,
    build_graphs,
    build_prompt_graph,
    build_talker_graph,
)

pytestmark = pytest.mark.cuda


def test_the_prompt_graph_and_the_frame_graph_build_and_replay():
    """Both holders kept while the graphs replay: built one after the other, the second's
    allocations would otherwise reuse the first's freed static inputs (the first version of
    this test dropped them and a replay read garbage positions: a device-side assert)."""
    prompt = build_prompt_graph("qwen3_tts_tiny", 16)
    frame = build_graphs("qwen3_tts_tiny", 2)
    for graph in (prompt.graphs[16], frame.graphs[2]):
        graph.replay()
    torch.cuda.synchronize()
    assert prompt.out[:16].isfinite().all()
    codes = frame.out[:2]  # codebooks 1..15 of two frames, each an id of its codebook
    assert codes.shape == (2, 15) and ((codes >= 0) & (codes < 2048)).all()


@pytest.mark.parametrize("frames", [1, 3])
def test_the_codec_graph_builds_and_replays_in_the_dtype_asked(frames):
    """`--graph codec`: `frames` new frames for each of 2 rows, 1,920 samples a frame, in the
    codec dtype given (the preset's is float32), under the cuDNN settings a served fused
    pipeline sets (`cudnn.benchmark` on: the conftest puts the flag back afterwards)."""
    torch.backends.cudnn.benchmark = False
    codec = build_codec_graph("qwen3_tts_tiny", 2, frames, "bfloat16")
    assert torch.backends.cudnn.benchmark
    codec.graphs[2].replay()
    torch.cuda.synchronize()
    assert codec.pcm.dtype == torch.bfloat16
    assert codec.pcm.shape == (2, frames * 1920) and codec.pcm.isfinite().all()


def test_the_talker_graph_reads_the_context_it_was_given():
    """`--graph decode`: every row has `context` cached tokens on blocks of its own. A replay
    writes each row's new K at its last position, in the row's own last block (and nowhere
    else), and the paged kernel reads the whole context: cutting it to one token changes
    the output."""
    talker = build_talker_graph("qwen3_tts_tiny", 3, 20)
    k_cache = talker.kv_caches[0][0]
    k_cache.normal_()  # every cached position contributes to the attention
    before = k_cache.clone()
    talker.graphs[3].replay()
    torch.cuda.synchronize()
    written = (k_cache != before).flatten(1).any(1).nonzero().flatten().tolist()
    bs = talker.block_size
    tables = talker.block_tables[:3].tolist()
    want = sorted(tables[row][19 // bs] * bs + 19 % bs for row in range(3))
    assert written == want and len(set(want)) == 3
    out = talker.out[:3].clone()
    assert out.isfinite().all()
    talker.context_lens[:3].fill_(1)
    talker.graphs[3].replay()
    torch.cuda.synchronize()
    assert not torch.equal(out, talker.out[:3])


def _kernel_names(run) -> list[str]:
    acts = [torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        run()
        torch.cuda.synchronize()
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


def test_prompt_and_predictor_attention_leave_the_fp32_math_path():
    """bf16, as served (`prepare_device` turns cuDNN attention off process-wide): the prompt
    graph records cuDNN's fused attention after one norm+rotary+K/V-write launch per layer,
    and every pass of the predictor's frame our fused
    kernel (its two-token first pass too, through `frame_pass`), so neither replay runs
    torch's math path (its fp32 softmax kernel) or, in the predictor, any SDPA kernel."""
    prompt = build_prompt_graph("qwen3_tts_tiny", 16)
    frame = build_graphs("qwen3_tts_tiny", 2)
    assert prompt.dtype == torch.bfloat16
    names = _kernel_names(prompt.graphs[16].replay)
    assert not [n for n in names if "softmax" in n.lower()], names
    assert [n for n in names if "cudnn" in n.lower()], names
    # q/k norms, rotary and the K/V write: one launch per layer, none of the four it replaced
    layers = prompt.talker.num_layers
    assert len([n for n in names if "_norm_rope_write_kernel" in n]) == layers, names
    assert not [n for n in names if "index_copy" in n or "_rms_norm_rope_kernel" in n], names
    names = _kernel_names(frame.graphs[2].replay)
    assert not [n for n in names if "softmax" in n.lower() or "flash" in n.lower()], names
    fused = [n for n in names if "_frame_attention_kernel" in n]
    layers = frame.predictor.shape.num_layers
    assert len(fused) == frame.predictor.shape.num_code_groups * layers, names
