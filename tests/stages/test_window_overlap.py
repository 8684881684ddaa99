"""A decode window queues each next step (forward and sampling) before it reads the step's
codes back, and computes a step again for the kept rows when a row stopped: the order of the
model calls, through real engine steps of the tiny model (the codes' equality with single steps is
`test_runner_paths.py::test_window_replay_equals_single_steps_when_a_request_stops_mid_window`)."""

from __future__ import annotations

import dataclasses

import torch

from omniflow.config.schema import SchedulerConfig
from omniflow.engine.stage_engine import StageEngine
from omniflow.models.qwen3_tts.ar_model import build_ar_model
from omniflow.models.qwen3_tts.factory import TalkerBundle
from omniflow.models.qwen3_tts.processor import TalkerProcessor
from omniflow.sched.ar import ARScheduler
from omniflow.worker.ar_runner import ARModelRunner
from tests.factories import EOS, biased_bundle, eos_bundle, speech, tiny_bundle
from tests.stages.test_talker_engine import collect


def traced_engine(
    window_k: int, cases, bundle: TalkerBundle | None = None
) -> tuple[StageEngine, list[tuple[str, int]], TalkerProcessor]:
    """An engine over the EOS-prone tiny talker (or `bundle`) whose model logs (call, rows)
    for every decode forward, queued sample and read-back; and its request processor."""
    bundle = bundle if bundle is not None else eos_bundle()
    cfg = SchedulerConfig(max_model_len=256, block_size=4, num_kv_blocks=256)
    model = build_ar_model(bundle)
    calls: list[tuple[str, int]] = []
    hidden_of, queue, read = model.decode_hidden, model.queue_frames, model.read_frames

    def decode_hidden(x, meta):
        calls.append(("forward", x.tokens.shape[0]))
        return hidden_of(x, meta)

    def queue_frames(hidden, sampler):
        calls.append(("queue", hidden.shape[0]))
        return queue(hidden, sampler)

    def read_frames(queued):
        calls.append(("read", queued.next_tokens.shape[0]))
        return read(queued)

    model.decode_hidden = decode_hidden  # type: ignore[method-assign]
    model.queue_frames = queue_frames  # type: ignore[method-assign]
    model.read_frames = read_frames  # type: ignore[method-assign]
    runner = ARModelRunner(model, cfg, torch.device("cpu"), torch.float32)
    engine = StageEngine("talker", ARScheduler(cfg, window_k=window_k), runner)
    proc = TalkerProcessor(bundle.tokenizer, bundle.vocab, 256)
    for seed, (rid, min_new, ignore, text, max_new) in enumerate(cases):
        sp = speech(rid, text, seed=seed, max_new_tokens=max_new, ignore_eos=ignore)
        r = proc.make_request(sp)
        r.sampling = dataclasses.replace(r.sampling, min_new_tokens=min_new)
        engine.add_request(r)
    return engine, calls, proc


def test_each_next_step_is_queued_whole_before_the_codes_are_read():
    """One request that never stops early, 14 tokens in windows of 8: inside a window every
    read-back comes after the next step's forward and its sampling were queued (two steps
    outstanding when the host reads), except at the window's last step, where nothing
    follows (one outstanding)."""
    engine, calls, _ = traced_engine(8, [("b", 0, True, "Second one.", 14)])
    out = collect(engine.run_until_idle())
    assert len(out["b"]) == 14
    decode = calls[calls.index(("read", 1)) + 1 :]  # after the prompt's step
    outstanding = []
    queued = read = 0
    for i, (name, _) in enumerate(decode):
        if name == "queue":
            assert decode[i - 1][0] == "forward", decode  # each sample right behind its forward
            queued += 1
        elif name == "read":
            outstanding.append(queued - read)
            read += 1
    assert len(outstanding) == 13, decode
    ahead = outstanding.count(2)
    window_ends = outstanding.count(1)
    assert ahead + window_ends == 13 and ahead >= 10 and 1 <= window_ends <= 3, outstanding


def test_a_stop_mid_window_recomputes_the_step_for_the_rows_that_go_on():
    """'a' stops at its 6th token inside a window while 'b' and 'c' run on: the step after
    its stop was queued whole (forward and sampling) for three rows before the stop was
    read, then computed again for the two kept ones; the windowed run's codes equal single
    steps' (the discarded sampling never reached the penalty history)."""
    cases = [
        ("a", 5, False, "First.", 14),
        ("b", 0, True, "Second one.", 14),
        ("c", 9, False, "3", 14),
    ]
    engine, calls, _ = traced_engine(8, cases)
    windowed = collect(engine.run_until_idle())
    single_engine, _, _ = traced_engine(0, cases)
    assert windowed == collect(single_engine.run_until_idle())
    assert windowed["a"][-1] == (EOS,) and len(windowed["a"]) == 6
    recomputes = [
        i
        for i in range(len(calls) - 4)
        if calls[i : i + 5]
        == [("forward", 3), ("queue", 3), ("read", 3), ("forward", 2), ("queue", 2)]
    ]
    assert len(recomputes) == 1, calls


def test_a_forward_failing_inside_a_window_fails_its_request_and_not_the_next():
    """The next step's forward raises (an out-of-memory, say) after the step's sampling was
    queued: that request ends with the error, and a request after it is served normally (the
    abandoned read-back must not block the next one)."""
    engine, _, proc = traced_engine(4, [("a", 0, True, "Hello.", 8)])
    runner_model = engine.runner.model
    forward = runner_model.decode_hidden
    seen = {"n": 0}

    def failing(x, meta):
        seen["n"] += 1
        if seen["n"] == 2:  # the first speculative forward inside the first window
            raise RuntimeError("injected forward failure")
        return forward(x, meta)

    runner_model.decode_hidden = failing  # type: ignore[method-assign]
    outs = engine.run_until_idle()
    assert any(o.request_id == "a" and o.error and "injected" in o.error for o in outs), outs
    engine.add_request(
        proc.make_request(speech("b", "Hello.", seed=1, max_new_tokens=8, ignore_eos=True))
    )
    served = collect(engine.run_until_idle())
    assert len(served["b"]) == 8


def test_a_row_that_draws_eos_without_stopping_feeds_the_eos_frame_in_a_window():
    """A request whose stop ids leave EOS out draws EOS every step (the biased head) and goes
    on: its next input is the EOS frame (code0 alone, zeros after), which inside a window the
    device must set before the host has seen the codes. Every frame the decode steps feed is
    that frame, and the windowed codes equal single steps'."""

    def run(window_k: int):
        engine, _, proc = traced_engine(window_k, [])
        model = engine.runner.model
        forward = model.decode_hidden
        fed: list[list[int]] = []

        def recording(x, meta):
            fed.extend(x.frames.tolist())
            return forward(x, meta)

        model.decode_hidden = recording  # type: ignore[method-assign]
        sp = speech("e", "Go on.", seed=3, max_new_tokens=10)
        r = proc.make_request(sp)
        r.sampling = dataclasses.replace(r.sampling, stop_token_ids=(1,), min_new_tokens=0)
        engine.add_request(r)
        return collect(engine.run_until_idle())["e"], fed

    windowed, fed = run(8)
    assert windowed == run(0)[0]
    assert len(windowed) == 10 and windowed == [(EOS,)] * 10, windowed
    eos_frame = [EOS] + [0] * (len(fed[0]) - 1)
    assert len(fed) >= 9 and all(f == eos_frame for f in fed), fed


def test_a_discarded_step_never_reaches_the_penalty_history():
    """Between engine steps every running request's penalty mask holds exactly its tokens
    with the count it was recorded with (a count off by one would make the next prepare
    rebuild the mask from the host, which hides a discarded draw but waits for the device),
    through a window in which one row stops and the step after it is discarded."""
    cases = [
        ("a", 5, False, "First.", 14),
        ("b", 0, True, "Second one.", 14),
        ("c", 9, False, "3", 14),
    ]
    engine, calls, _ = traced_engine(8, cases)
    history = engine.runner.sampling.history
    checked = 0
    while engine.has_work:
        engine.step()
        for rid, r in engine.runner.requests.items():
            slot = history.slot_of.get(rid)
            if slot is None:
                continue
            assert history.recorded[slot] == len(r.tokens), rid
            assert set(history.seen[slot].nonzero().flatten().tolist()) == set(r.tokens), rid
            checked += 1
    assert checked >= 3
    assert [("forward", 3), ("queue", 3), ("read", 3), ("forward", 2)] in [
        calls[i : i + 4] for i in range(len(calls) - 3)
    ]  # the stop and its discarded step happened


def ramp_bundle() -> TalkerBundle:
    """The tiny model with codebook 0's head biased 50 - 0.1 i on ids 0..299: greedy with a
    strong repetition penalty, each step draws the best id not drawn yet, so a penalty mask
    that misses one token (the one queued but not read back) draws it again."""
    bias = torch.zeros(tiny_bundle().talker.shape.vocab_size)
    bias[:300] = 50.0 - 0.1 * torch.arange(300, dtype=torch.float32)
    return biased_bundle(bias)


def test_a_window_penalises_the_token_it_has_not_read_back_yet():
    """Greedy, repetition penalty 100, the ramped head: step n+1 is queued before step n's
    token reaches the host, so its penalty must already hold that token. Windowed codes equal
    single steps', and no codebook-0 id repeats."""
    bundle = ramp_bundle()

    def run(window_k: int):
        engine, _, proc = traced_engine(window_k, [], bundle)
        for rid, seed, n in (("g", 1, 20), ("h", 2, 13)):
            r = proc.make_request(speech(rid, "Other.", seed=seed, max_new_tokens=n))
            r.sampling = dataclasses.replace(
                r.sampling, temperature=0.0, repetition_penalty=100.0, ignore_eos=True
            )
            engine.add_request(r)
        return collect(engine.run_until_idle())

    windowed = run(8)
    assert windowed == run(0)
    first = [f[0] for f in windowed["g"]]
    assert len(first) == 20 and len(set(first)) == 20, first
