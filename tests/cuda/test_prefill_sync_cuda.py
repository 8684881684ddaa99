"""GPU: an eager prefill forward (embedding and all layers, both attention paths) never reads
the device back. Each read stalls the host until the queued work is done, and the layers
after it launch into an idle GPU: a per-layer read made a 1.7B one-prompt prefill take 70 ms
instead of 36 (docs/performance.md, "Prefill without host reads")."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from omniflow.worker.inputs import build_prefill
from tests.factories import speech, talker_engine

pytestmark = pytest.mark.cuda

DEV = torch.device("cuda")


@pytest.mark.parametrize("batched", [True, False])  # padded attention, or per request
def test_prefills_of_prompts_and_of_recomputed_frames_run_without_a_host_read(batched):
    engine, proc = talker_engine(max_num_seqs=4, num_kv_blocks=256, device=DEV)
    runner = engine.runner
    block_size = runner.block_size
    for i, text in enumerate(["Hello there.", "A longer sentence, to differ."]):
        engine.add_request(proc.make_request(speech(f"r{i}", text=text, max_new_tokens=20)))
    for _ in range(6):
        engine.step()
    reqs = [runner.requests[f"r{i}"] for i in range(2)]
    assert all(r.in_decode and len(r.tokens) >= 4 for r in reqs)
    # whole prompts (text only), and each request's last 3 computed positions recomputed
    # (output frames: codes past column 0, as after a preemption)
    prompts = [(dataclasses.replace(r, num_computed=0), r.prompt_len) for r in reqs]
    recompute = [(dataclasses.replace(r, num_computed=r.num_computed - 3), 3) for r in reqs]
    for order, later in ((prompts, False), (recompute, True)):
        # the layout's copies are pageable, each a stream synchronisation: outside the check
        # (pinned ones measured slower, docs/performance.md, "Not kept")
        batch = build_prefill(runner.model, order, block_size, DEV, batched)
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            embeds = runner.model.embed_prefill(batch.inputs)
            out = runner.model.forward(embeds, batch.positions, batch.meta, runner.kv_caches)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert batch.inputs.later_codes is later
        assert out.shape[0] == sum(n for _, n in order) and bool(torch.isfinite(out).all())
