"""Reference priming of the fused talker's decoder slots (`StreamSlots` + `ReferencePriming`),
eagerly and through the bucketed per-frame step (`DecoderStepGraphs` without capture)."""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch

from omniflow.core.speech import SpeechRequest
from omniflow.models.qwen3_tts.codec_graph import DecoderStepGraphs
from omniflow.models.qwen3_tts.priming import ReferencePriming
from omniflow.models.qwen3_tts.stream_slots import StreamSlots
from tests.factories import tiny_decoder
from tests.models.test_codec_window_graph import step

SPF = 1920


def codes(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 2048, (n, 16), generator=g, dtype=torch.int64)


def clone(rid: str, ref: torch.Tensor) -> SpeechRequest:
    return SpeechRequest(
        request_id=rid,
        text="Hi.",
        speaker_embedding=(0.5,) * 64,
        ref_codes=tuple(tuple(r) for r in ref.tolist()),
        ref_text="Hey.",
    )


class Owner:
    """Stands in for a stage request object (what `ReferencePriming` ties an entry to)."""


def slots_with(frames: int | None, graphs: bool, num_slots: int = 4):
    dec = tiny_decoder(num_slots)
    step = {1: DecoderStepGraphs(dec, num_slots, capture=False)} if graphs else None
    priming = ReferencePriming(frames)
    return StreamSlots(dec, step, priming), priming


def run(slots: StreamSlots, rows: dict[str, torch.Tensor], start: int = 0, stop: int | None = None):
    """Decode frames [start:stop) of each row's codes, one step per frame; PCM per row."""
    n = min(len(c) for c in rows.values()) if stop is None else stop
    out: dict[str, list[np.ndarray]] = {rid: [] for rid in rows}
    for t in range(start, n):
        rids = list(rows)
        pcm = slots.decode([step(rids, [rows[r][t] for r in rids])])
        for rid in rids:
            out[rid].append(pcm[rid])
    return {rid: np.concatenate(p) for rid, p in out.items()}


def full_decode(prefix: torch.Tensor, gen: torch.Tensor) -> np.ndarray:
    """A fresh slot decoding prefix + generated frames in one call: the reference audio."""
    dec = tiny_decoder(1)
    (pcm,) = dec.decode([dec.allocate()], [torch.cat([prefix, gen])])
    return pcm.numpy()


@pytest.mark.parametrize("graphs", [False, True])
def test_primed_slot_emits_only_the_generated_frames_in_the_references_context(graphs):
    ref, gen = codes(30, 1), codes(5, 2)
    slots, priming = slots_with(24, graphs)
    owner = Owner()
    priming.register(clone("a", ref), owner)
    got = run(slots, {"a": gen})["a"]
    assert got.shape == (5 * SPF,)  # the priming frames' PCM never comes out
    want = full_decode(ref[-24:], gen)[24 * SPF :]
    assert np.allclose(got, want, atol=1e-5, rtol=0)
    assert len(priming) == 0  # taken by the slot


def test_context_length_changes_the_audio_and_zero_means_none():
    ref, gen = codes(30, 1), codes(4, 2)
    pcm = {}
    for n in (None, 0, 8, 24):
        slots, priming = slots_with(n, False)
        owner = Owner()
        priming.register(clone("a", ref), owner)
        pcm[n] = run(slots, {"a": gen})["a"]
    plain = full_decode(ref[:0], gen)
    assert np.array_equal(pcm[None], pcm[0])  # no stage setting / 0: no priming
    assert np.allclose(pcm[0], plain, atol=1e-5, rtol=0)
    assert not np.allclose(pcm[8], pcm[0], atol=1e-3)
    assert not np.allclose(pcm[8], pcm[24], atol=1e-3)


@pytest.mark.parametrize("graphs", [False, True])
def test_rows_primed_together_keep_their_own_context(graphs):
    """Different reference lengths in one step (grouped by length), beside an unprimed row."""
    refs = {"a": codes(3, 1), "b": codes(7, 2), "c": codes(7, 3)}
    gens = {"a": codes(3, 4), "b": codes(3, 5), "c": codes(3, 6), "plain": codes(3, 7)}
    slots, priming = slots_with(72, graphs)
    owners = [Owner() for _ in refs]
    for (rid, ref), owner in zip(refs.items(), owners, strict=True):
        priming.register(clone(rid, ref), owner)
    got = run(slots, gens)
    for rid, gen in gens.items():
        prefix = refs.get(rid, gen[:0])
        want = full_decode(prefix, gen)[len(prefix) * SPF :]
        assert np.allclose(got[rid], want, atol=1e-5, rtol=0), rid


@pytest.mark.parametrize("graphs", [False, True])
def test_preempted_primed_slot_resumes_exactly(graphs):
    ref, gen = codes(20, 1), codes(6, 2)
    calm, p1 = slots_with(12, graphs)
    o1 = Owner()
    p1.register(clone("a", ref), o1)
    want = run(calm, {"a": gen})["a"]

    squeezed, p2 = slots_with(12, graphs, num_slots=1)
    o2 = Owner()
    p2.register(clone("a", ref), o2)
    first = run(squeezed, {"a": gen}, 0, 2)["a"]
    squeezed.preempt("a")
    assert squeezed.decoder.num_free == 1
    squeezed.admit("a")  # restored, not primed again
    rest = run(squeezed, {"a": gen}, 2)["a"]
    assert np.allclose(np.concatenate([first, rest]), want, atol=1e-6, rtol=0)


def test_preempted_before_its_first_frame_is_still_primed():
    ref, gen = codes(20, 1), codes(3, 2)
    calm, p1 = slots_with(12, False)
    o1 = Owner()
    p1.register(clone("a", ref), o1)
    want = run(calm, {"a": gen})["a"]
    slots, p2 = slots_with(12, False)
    o2 = Owner()
    p2.register(clone("a", ref), o2)
    slots.preempt("a")  # no slot yet: nothing parked, the codes still wait
    slots.admit("a")
    assert np.array_equal(run(slots, {"a": gen})["a"], want)


def test_waiting_codes_leave_with_finish_or_with_their_request():
    ref = codes(5, 1)
    priming = ReferencePriming(72)
    slots = StreamSlots(tiny_decoder(1), None, priming)
    keep = Owner()
    priming.register(clone("done", ref), keep)
    slots.finish("done")  # ended before its first frame
    assert len(priming) == 0
    gone = Owner()
    priming.register(clone("cancelled", ref), gone)
    assert len(priming) == 1
    del gone  # cancelled before it reached the runner: its stage request is dropped
    gc.collect()
    assert len(priming) == 0


def test_a_live_ids_codes_are_not_replaced_nor_dropped_by_a_duplicate():
    priming = ReferencePriming(72)
    live = Owner()
    priming.register(clone("x", codes(5, 1)), live)
    dup = Owner()
    priming.register(clone("x", codes(5, 2)), dup)
    del dup
    gc.collect()
    taken = priming.take("x")
    assert taken is not None and torch.equal(taken, codes(5, 1))


def test_requests_without_reference_codes_are_not_primed():
    priming = ReferencePriming(72)
    owner = Owner()
    voice = SpeechRequest(request_id="cv", text="Hi.", voice="vivian")
    xvec = SpeechRequest(request_id="xv", text="Hi.", speaker_embedding=(0.5,) * 64)
    priming.register(voice, owner)
    priming.register(xvec, owner)
    assert len(priming) == 0
