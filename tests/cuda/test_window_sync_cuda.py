"""GPU: inside a window the host waits for the device only at the step's read-back and
before it refills a pinned staging buffer whose last upload may still be queued
(`Staging.begin`, which waits for an earlier step, never for the queued one): dropping rows
from the decode layout (`DecodeBatch.select`, when a row reaches its k or stops) uploads its
index from pinned memory. A pageable upload would block until all queued work ran, the next
step's overlapped forward included (docs/engine.md, "Multi-step windows")."""

from __future__ import annotations

import pytest
import torch

from omniflow.worker.inputs import DecodeBatch
from tests.factories import speech, talker_engine

pytestmark = pytest.mark.cuda

DEV = torch.device("cuda")


def test_select_and_advance_do_not_read_the_device_back():
    engine, proc = talker_engine(max_num_seqs=4, num_kv_blocks=256, device=DEV)
    runner = engine.runner
    for i, text in enumerate(["Hello there.", "A longer one.", "Third."]):
        engine.add_request(proc.make_request(speech(f"r{i}", text=text, max_new_tokens=20)))
    for _ in range(4):
        engine.step()
    reqs = [runner.requests[f"r{i}"] for i in range(3)]
    assert all(r.in_decode for r in reqs)
    dec = DecodeBatch(runner.model, engine.scheduler.config, DEV, True)
    dec.load(reqs, steps=3)
    tokens = torch.zeros(3, dtype=torch.int64, device=DEV)
    frames = torch.zeros(3, runner.model.frame_width, dtype=torch.int64, device=DEV)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        dec.advance(tokens, frames, keep=[0, 2])
        dec.select([1])
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert dec.rows == 1 and dec.seq_lens == [reqs[2].num_computed + 2]
    x, _ = dec.inputs()
    assert x.positions.tolist() == [reqs[2].num_computed + 1]
