"""`StageStats.prefills`: an AR stage counts its prefill forwards, the tokens they computed,
and how many ran on the prompt graphs (with their replays); a generation stage has none.
Benchmarks read these to tell whether mixed steps took the graphed path (`bench/job.py`);
`/metrics` exports them (`tests/serve/test_health.py`)."""

from __future__ import annotations

from omniflow.core.pipeline import PrefillCounters
from tests.factories import Collector, FirstAudio, build, speech

SHORT = ("Hello there.", "A longer sentence, to differ.")
LONG = "This prompt is long enough that the prompt's tokens alone exceed the bucket."


def prefills(orch, stage: str = "talker") -> PrefillCounters | None:
    return next(s.prefills for s in orch.stats().stages if s.name == stage)


def run(orch, texts: tuple[str, ...], tag: str) -> None:
    sinks = []
    for i, text in enumerate(texts):
        sinks.append(Collector())
        orch.submit(speech(f"{tag}{i}", text=text, max_new_tokens=3, ignore_eos=True), sinks[-1])
    for s in sinks:
        assert s.wait().terminal.error is None


def test_whole_prompts_count_as_graphed_and_a_prompt_above_the_bucket_as_eager():
    """A 48-token bucket (run eagerly on the CPU through the same path): two short prompts
    are graphed prefills; one longer than the bucket is declined and runs eagerly. Tokens
    are the prompts' whatever the path (the same prompts with no prompt graphs)."""
    orch = build("qwen3_tts_fused", "pipeline.stages.talker.prompt_graph_tokens=48")
    try:
        run(orch, SHORT, "s")
        short = prefills(orch)
        assert short is not None and short.steps >= 1 and short.tokens > 0
        assert short.graphed == short.steps and short.replays >= short.graphed
        run(orch, (LONG,), "l")
        after = prefills(orch)
        assert after.steps == short.steps + 1  # one prompt, one step
        assert after.graphed == short.graphed and after.replays == short.replays
        assert after.tokens - short.tokens > 48
    finally:
        orch.stop()
    eager = build("qwen3_tts_fused")  # the CPU default: no prompt graphs
    try:
        run(eager, SHORT, "s")
        plain = prefills(eager)
        assert plain is not None and plain.tokens == short.tokens
        assert plain.graphed == 0 and plain.replays == 0 and plain.steps >= 1
    finally:
        eager.stop()


def test_only_the_ar_stage_of_the_two_stage_pipeline_has_prefills():
    orch = build("qwen3_tts")
    try:
        run(orch, SHORT[:1], "t")
        talker = prefills(orch, "talker")
        assert talker is not None and talker.steps >= 1 and talker.tokens > 0
        assert prefills(orch, "code2wav") is None
    finally:
        orch.stop()


def test_a_prefill_beside_decoding_rows_and_a_chunked_prefill_count_exactly():
    """A request arriving while another decodes is prefilled in a mixed step: one more step,
    its prompt's tokens only (not the decoding row's). A prompt chunked over steps of 8
    tokens counts every chunk's step, those that sample nothing included."""
    orch = build("qwen3_tts_fused")
    try:
        run(orch, SHORT[:1], "alone")
        alone = prefills(orch)
        assert alone.steps == 1
        prompt = alone.tokens  # the one prompt's tokens
        first, second = FirstAudio(), Collector()
        orch.submit(speech("a", text=SHORT[0], max_new_tokens=24, ignore_eos=True), first)
        assert first.started.wait(60)
        orch.submit(speech("b", text=SHORT[0], max_new_tokens=3, ignore_eos=True), second)
        assert second.wait().terminal.error is None and first.wait().terminal.error is None
        both = prefills(orch)
        assert (both.steps, both.tokens) == (alone.steps + 2, alone.tokens + 2 * prompt)
    finally:
        orch.stop()
    chunked = build("qwen3_tts_fused", "pipeline.stages.talker.scheduler.max_num_batched_tokens=8")
    try:
        run(chunked, SHORT[:1], "c")
        p = prefills(chunked)
        assert p.tokens == prompt and p.steps == -(-prompt // 8) and p.graphed == 0
    finally:
        chunked.stop()
