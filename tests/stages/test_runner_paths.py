"""The runner's two input paths agree, and the decode layout advances like a fresh one.

The prefill path (model-built per-position inputs, host-built metadata) is the reference the
decode path (persistent buffers, metadata from block tables on the device) must reproduce
bit for bit at the positions both can serve: one token per request at the end of its known
tokens.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from omniflow.config.schema import SchedulerConfig
from omniflow.core.step import StepResult
from omniflow.models.layers.attention import DecodeAttentionMetadata, PagedAttentionMetadata
from omniflow.sampling.sampler import BatchSampler
from omniflow.worker.inputs import DecodeBatch, build_prefill
from tests.factories import EOS, eos_bundle, speech, talker_engine
from tests.stages.test_talker_engine import collect, fixed


def decoding_runner(block_size: int = 64):
    """An engine whose three requests are all in decode, with their next block allocated."""
    engine, proc = talker_engine(block_size=block_size)
    for i, text in enumerate(["Hello there.", "A longer sentence, to differ.", "Hi."]):
        engine.add_request(proc.make_request(fixed(f"r{i}", 20, seed=i, text=text)))
    for _ in range(3):
        engine.step()
    runner = engine.runner
    reqs = [runner.requests[f"r{i}"] for i in range(3)]
    assert all(r.in_decode for r in reqs)
    assert all(r.num_computed // block_size < len(r.block_ids) for r in reqs)
    return engine, runner, reqs


def scheduler_config(engine) -> SchedulerConfig:
    return engine.scheduler.config


@pytest.mark.parametrize("batched", [False, True])
def test_decode_path_inputs_and_hidden_equal_the_prefill_path(batched):
    engine, runner, reqs = decoding_runner()
    model = runner.model
    pre = build_prefill(model, [(r, 1) for r in reqs], runner.block_size, runner.device, batched)
    dec = DecodeBatch(model, scheduler_config(engine), runner.device, batched)
    dec.load(reqs, steps=1)
    x, meta = dec.inputs()

    # per-position inputs
    assert x.tokens.tolist() == [r.tokens[-1] for r in reqs]
    assert x.frames.tolist() == [list(r.frames[-1]) for r in reqs]
    assert torch.equal(x.side_ids, pre.inputs.side_ids)
    assert torch.equal(x.frames, pre.inputs.codes) and bool(pre.inputs.code_mask.all())
    assert torch.equal(x.positions, pre.positions)
    assert torch.equal(model.embed_decode(x), model.embed_prefill(pre.inputs))
    # attention metadata
    assert torch.equal(meta.slot_mapping, pre.meta.slot_mapping)
    assert meta.seq_lens == pre.meta.seq_lens == tuple(r.num_computed + 1 for r in reqs)
    assert meta.context_lens.tolist() == list(meta.seq_lens)
    assert meta.block_tables.dtype == torch.int32
    if batched:
        assert isinstance(pre.meta, DecodeAttentionMetadata)
        assert torch.equal(meta.gather_slots, pre.meta.gather_slots)
        assert torch.equal(meta.gather_mask, pre.meta.gather_mask)
    else:
        assert isinstance(pre.meta, PagedAttentionMetadata)
        for b, ctx in enumerate(meta.seq_lens):
            assert torch.equal(meta.gather_slots[b, :ctx], pre.meta.context_slots[b])
    # the same hidden states (both write the same K/V at the new position)
    h_pre = model.forward(
        model.embed_prefill(pre.inputs), pre.positions, pre.meta, runner.kv_caches
    )
    h_dec = model.forward(model.embed_decode(x), x.positions, meta, runner.kv_caches)
    assert torch.equal(h_pre, h_dec)


def test_advance_equals_a_fresh_layout_of_the_remaining_rows():
    """One decode step, then rows 0 and 2 stay: the advanced layout (fed on the device) is the
    one a fresh load of those requests builds from the host."""
    engine, runner, reqs = decoding_runner()
    model = runner.model
    cfg = scheduler_config(engine)
    dec = DecodeBatch(model, cfg, runner.device, False)
    dec.load(reqs, steps=3)
    x, meta = dec.inputs()
    hidden = model.forward(model.embed_decode(x), x.positions, meta, runner.kv_caches)
    queued = model.queue_frames(hidden, BatchSampler(runner.sampling.prepare(reqs)))
    sample = model.read_frames(queued)
    for r, tok, out in zip(reqs, sample.tokens, sample.outputs, strict=True):
        r.num_computed += 1
        r.tokens.append(tok)
        r.frames.append(model.input_frame(tok, out))
    dec.advance(sample.next_tokens, sample.next_frames, keep=[0, 2])
    x1, meta1 = dec.inputs()
    fresh = DecodeBatch(model, cfg, runner.device, False)
    fresh.load([reqs[0], reqs[2]], steps=2)
    x2, meta2 = fresh.inputs()
    for a, b in zip(dataclasses.astuple(x1), dataclasses.astuple(x2), strict=True):
        assert torch.equal(a, b)
    assert torch.equal(meta1.slot_mapping, meta2.slot_mapping)
    assert torch.equal(meta1.context_lens, meta2.context_lens)
    assert torch.equal(meta1.gather_slots, meta2.gather_slots)
    assert meta1.seq_lens == meta2.seq_lens


def test_window_replay_equals_single_steps_when_a_request_stops_mid_window():
    """EOS always wins once allowed: 'a' stops at its 6th token, inside an 8-step window,
    while 'b' (ignore_eos) and 'c' go on. The window really ran several steps, 'a' left it
    early, and every token and frame is the single-step one."""

    def run(window_k: int) -> tuple[dict, list[StepResult]]:
        from omniflow.config.schema import SchedulerConfig
        from omniflow.engine.stage_engine import StageEngine
        from omniflow.models.qwen3_tts.ar_model import build_ar_model
        from omniflow.models.qwen3_tts.processor import TalkerProcessor
        from omniflow.sched.ar import ARScheduler
        from omniflow.worker.ar_runner import ARModelRunner

        bundle = eos_bundle()
        cfg = SchedulerConfig(max_model_len=256, block_size=4, num_kv_blocks=256)
        runner = ARModelRunner(build_ar_model(bundle), cfg, torch.device("cpu"), torch.float32)
        results: list[StepResult] = []
        execute = runner.execute

        def spy(plan):
            result = execute(plan)
            results.append(result)
            return result

        runner.execute = spy  # type: ignore[method-assign]
        engine = StageEngine("talker", ARScheduler(cfg, window_k=window_k), runner)
        proc = TalkerProcessor(bundle.tokenizer, bundle.vocab, 256)
        cases = (("a", 5, False, "First."), ("b", 0, True, "Second one."), ("c", 9, False, "3"))
        for seed, (rid, min_new, ignore, text) in enumerate(cases):
            # different texts and seeds: no row could borrow another's context unnoticed
            sp = speech(rid, text, seed=seed, max_new_tokens=14, ignore_eos=ignore)
            r = proc.make_request(sp)
            r.sampling = dataclasses.replace(r.sampling, min_new_tokens=min_new)
            engine.add_request(r)
        return collect(engine.run_until_idle()), results

    single, _ = run(0)
    windowed, results = run(8)
    assert windowed == single
    assert len(single["a"]) == 6 and single["a"][-1] == (EOS,)
    assert len(single["b"]) == 14 and (EOS,) not in single["b"]
    stop = [
        res
        for res in results
        if res.window_steps > 1
        and "a" in res.outputs
        and res.outputs["a"].tokens[-1] == EOS
        and len(res.outputs["a"].tokens) < len(res.outputs["b"].tokens) == res.window_steps
    ]
    assert stop, "no window in which 'a' stopped while 'b' ran on"
    assert stop[0].outputs["a"].frames[-1] is None


def test_mixed_step_as_one_padded_batch_equals_request_by_request(monkeypatch):
    """A mixed step (a 4-token recompute beside two decode rows): the batched layout is one
    padded index (no per-request tensors) and computes the reference's hidden states; above
    the cell cap it falls back to the per-request layout."""
    from omniflow.worker import inputs

    engine, runner, reqs = decoding_runner()
    model = runner.model
    rolled = dataclasses.replace(reqs[1], num_computed=reqs[1].num_computed - 3)
    order = [(reqs[0], 1), (rolled, 4), (reqs[2], 1)]
    ref = build_prefill(model, order, runner.block_size, runner.device, False)
    fast = build_prefill(model, order, runner.block_size, runner.device, True)
    assert isinstance(fast.meta, PagedAttentionMetadata) and fast.meta.padded is not None
    assert fast.meta.context_slots == () and ref.meta.padded is None
    outs = []
    for pre in (ref, fast):
        h = model.forward(
            model.embed_prefill(pre.inputs), pre.positions, pre.meta, runner.kv_caches
        )
        outs.append(h)
    torch.testing.assert_close(outs[1], outs[0], atol=1e-5, rtol=1e-5)
    monkeypatch.setattr(inputs, "PADDED_MAX_CELLS", 3 * max(ref.meta.seq_lens) - 1)
    over = build_prefill(model, order, runner.block_size, runner.device, True)
    assert over.meta.padded is None and len(over.meta.context_slots) == 3


def test_runner_keeps_each_penalty_history_on_the_device_and_frees_it_at_the_end(monkeypatch):
    """Through real engine steps the device masks equal each request's tokens, updated by
    the step's own record (no rebuild from the host after admission), and finished requests
    give their slots back."""
    engine, runner, reqs = decoding_runner()
    history = runner.sampling.history
    rebuilt: list[int] = []
    original = history._rebuild

    def counting(slot, tokens):
        rebuilt.append(slot)
        original(slot, tokens)

    monkeypatch.setattr(history, "_rebuild", counting)  # this test's runner only
    for _ in range(3):
        engine.step()
    assert rebuilt == []
    for r in reqs:
        slot = history.slot_of[r.request_id]
        assert set(history.seen[slot].nonzero().flatten().tolist()) == set(r.tokens)
        assert history.recorded[slot] == len(r.tokens)
    while engine.has_work:
        engine.step()
    assert history.slot_of == {}
