"""A mixed step runs its decoding rows on the decode path (graph-replayed on CUDA) and only
the new prompts on the prefill path, and samples them together: the same tokens as a request
running alone."""

from __future__ import annotations

from tests.factories import talker_engine
from tests.stages.test_talker_engine import collect, fixed


class Spy:
    """Counts the rows each path of the runner's model computes, per call (the eager decode
    path calls `forward` too: only the runner's own prefill calls are counted there)."""

    def __init__(self, model) -> None:
        self.decode_rows: list[int] = []
        self.prefill_tokens: list[int] = []
        self.decoding = False
        decode_hidden, forward = model.decode_hidden, model.forward

        def spy_decode(x, meta):
            self.decode_rows.append(int(x.tokens.shape[0]))
            self.decoding = True
            try:
                return decode_hidden(x, meta)
            finally:
                self.decoding = False

        def spy_forward(embeds, positions, meta, caches):
            if not self.decoding:
                self.prefill_tokens.append(int(embeds.shape[0]))
            return forward(embeds, positions, meta, caches)

        model.decode_hidden, model.forward = spy_decode, spy_forward


def test_a_mixed_step_decodes_the_running_rows_on_the_decode_path():
    alone, proc = talker_engine()
    alone.add_request(proc.make_request(fixed("a", 8, seed=3)))
    want = collect(alone.run_until_idle())["a"]

    engine, proc = talker_engine()
    spy = Spy(engine.runner.model)
    engine.add_request(proc.make_request(fixed("a", 8, seed=3)))
    outputs = engine.step() + engine.step()  # a's prefill, then one decode step
    assert spy.decode_rows == [1] and len(spy.prefill_tokens) == 1
    b = proc.make_request(fixed("b", 4, seed=4, text="A second request arrives."))
    engine.add_request(b)
    outputs += engine.step()  # mixed: a decodes, b's prompt is prefilled
    assert spy.decode_rows == [1, 1]  # a, on the decode path
    assert spy.prefill_tokens[-1] == b.prompt_len  # b's prompt and nothing of a's
    outputs += engine.run_until_idle()
    frames = collect(outputs)
    assert frames["a"] == want and len(frames["b"]) == 4
