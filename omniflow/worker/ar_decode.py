"""The AR runner's decode path: every row computes its next tokens one step at a time, each
step feeding what it sampled into the next on the device, with the GPU kept a step ahead of
the host's bookkeeping (a single decode step is a window of one)."""

from __future__ import annotations

from collections.abc import Callable

from omniflow.core.audio import PendingAudio
from omniflow.core.step import RequestStepOutput
from omniflow.models.interface import SampledStep
from omniflow.worker.inputs import RunnerRequest
from omniflow.worker.step_audio import StepAudio
from omniflow.worker.step_ops import Queued, StepOps, concat, sampled_step


def decode_steps(
    ops: StepOps,
    reqs: list[RunnerRequest],
    ks: dict[str, int],
    step_id: int,
    audio_chunk_frames: int,
    arrived: Callable[[], bool] = lambda: False,
    early: Callable[[PendingAudio], None] | None = None,
) -> tuple[dict[str, RequestStepOutput], StepAudio | None, int, bool]:
    """Request r computes up to ks[r] tokens and leaves at its k or at a stop token; the layout
    is built once and only shrinks. Returns the outputs (steps concatenated), their audio
    still being decoded, the number of steps run, and whether an arrival cut the window.

    Overlap: before the host reads step n back, step n+1 is queued for every row still short
    of its k, keyed by the counters the rows will have (`SamplingStaging.prepare(pending=1)`),
    so the GPU does not wait on the host's reading, recording and preparing between steps. A
    step's draw joins the penalty history only once the step is kept; if a row stopped at step
    n, step n+1 is discarded and queued again for the rows that go on, so every kept row's
    codes are bit for bit those without the overlap.

    With `audio_chunk_frames` C, the audio of every C steps is queued as soon as they are read
    back, so a model that decodes on a stream of its own does so beside the later steps; with
    `early` each such chunk goes there at once (the engine sends it while the window runs,
    `engine/chunk_inbox.py`) and the step's own audio holds only the rest.

    `arrived()` true at a step boundary ends the window there (no step queued ahead): a
    request waiting to be seated is prefilled at the next step, not after the whole window.
    The scheduler rolls the rows' unused steps back as after a stop token."""
    with ops.phase("decode_layout"):
        ops.decode_batch.load(reqs, max(ks.values()))
    parts: dict[str, list[RequestStepOutput]] = {r.request_id: [] for r in reqs}
    sampled: list[SampledStep] = []
    chunks: list[PendingAudio] = []  # audio queued before the window's end
    single: StepAudio | None = None  # a single step's audio, queued before its read
    steps, cut = 0, False
    current: Queued | None = ops.queue_step(reqs, pending=0)
    while current is not None:
        steps += 1
        for r in reqs:
            r.num_computed += 1
        batch, queued = current
        ops.sampling.record(batch, queued.next_tokens)  # the penalty history, on device
        going = [i for i, r in enumerate(reqs) if steps < ks[r.request_id]]
        cut_rows: set[int] = set()
        if going and arrived():  # a cut, unless each of these rows stops here anyway
            cut_rows, going = set(going), []
        ahead: Queued | None = None
        if going:
            ops.decode_batch.advance(queued.next_tokens, queued.next_frames, going)
            ahead = ops.queue_step([reqs[i] for i in going], pending=1)
        before_read = None
        if steps == 1 and not going:  # a single step: its audio queued before the read
            before_read = ops.audio_ahead(reqs, queued)
        sample = ops.read(queued)
        outs = ops.record(reqs, sample)
        sampled.append(sampled_step(reqs, sample))
        if before_read is not None:
            single = ops.settle(before_read, sampled[0], step_id)
        row_of = {i: j for j, i in enumerate(going)}  # a request's row in the layout
        keep = []
        for i, r in enumerate(reqs):
            out = outs[r.request_id]
            parts[r.request_id].append(out)
            goes_on = out.tokens[0] not in r.sampling.stop_token_ids
            if i in row_of and goes_on:
                keep.append(i)  # the sampler bans stop ids until they may end a request
            cut = cut or (i in cut_rows and goes_on)
        if len(keep) < len(going):
            ops.decode_batch.select([row_of[i] for i in keep])
            kept = [reqs[i] for i in keep]
            # The kept rows' step again, as without the overlap; their tokens are read.
            ahead = ops.queue_step(kept, pending=0) if kept else None
        reqs = [reqs[i] for i in keep]
        current = ahead
        if current is not None and len(sampled) == audio_chunk_frames:
            with ops.phase("audio"):
                chunk = ops.model.queue_audio(sampled)
            if early is None:
                chunks.append(chunk)
            else:
                early(chunk)
            sampled = []
    outputs = {rid: concat(outs) for rid, outs in parts.items()}
    if single is not None:  # (None: every row stopped, and the rest below has no frame)
        return outputs, single, steps, cut
    return outputs, ops.audio(sampled, chunks, step_id), steps, cut
