"""The device work an AR runner step is made of, shared by its mixed steps and its decode path
(`worker/ar_decode.py`): the decode batch's forward, the frame sampling queued and read back,
what was sampled appended to the requests, and the step's audio queued."""

from __future__ import annotations

from contextlib import AbstractContextManager

import torch

from omniflow.core.audio import PendingAudio
from omniflow.core.pipeline import NoTimer, PhaseTimer
from omniflow.core.step import RequestStepOutput
from omniflow.models.interface import ARModel, FrameSample, QueuedFrames, SampledStep
from omniflow.sampling.draw import SamplingBatch
from omniflow.sampling.sampler import BatchSampler, SamplingStaging
from omniflow.worker.held_audio import HeldFrames
from omniflow.worker.inputs import DecodeBatch, RunnerRequest
from omniflow.worker.step_audio import StepAudio

Queued = tuple[SamplingBatch, QueuedFrames]
"""A step's sampling batch (recorded in the penalty history once the step is kept) and its
queued frames."""


class StepOps:
    """One AR stage's forward, sampling, recording and audio calls, each timed as its phase."""

    def __init__(self, model: ARModel, decode_batch: DecodeBatch, sampling: SamplingStaging):
        self.model = model
        self.decode_batch = decode_batch
        self.sampling = sampling
        self.timer: PhaseTimer = NoTimer()
        """Benchmarks time the step's phases through this hook (no cost by default)."""
        self.stage_name = model.name
        self.held: HeldFrames | None = None
        """Single steps' frames held for a later pass (`audio_pass_steps`); None: never."""
        self.audio_later: frozenset[str] = frozenset()
        """The running plan's rows whose frame may be held (`StepPlan.audio_later`)."""

    def phase(self, name: str) -> AbstractContextManager[object]:
        return self.timer.phase(self.stage_name, name)

    def queue_step(self, reqs: list[RunnerRequest], pending: int) -> Queued:
        """The decode batch's next forward and its sampling, queued (not recorded)."""
        return self.queue_sample(self.forward(), reqs, pending)

    def forward(self) -> torch.Tensor:
        """The decode batch's next hidden states (its K/V written), queued."""
        x, meta = self.decode_batch.inputs()
        with self.phase("forward"):
            return self.model.decode_hidden(x, meta)

    def sample(
        self, hidden: torch.Tensor, reqs: list[RunnerRequest]
    ) -> tuple[FrameSample, PendingAudio | None]:
        """The rows' frames sampled, recorded in the penalty history, their audio queued
        ahead where it can be (`audio_ahead`), and read back."""
        batch, queued = self.queue_sample(hidden, reqs, pending=0)
        self.sampling.record(batch, queued.next_tokens)  # the penalty history, on device
        ahead = self.audio_ahead(reqs, queued)
        return self.read(queued), ahead

    def queue_sample(self, hidden: torch.Tensor, reqs: list[RunnerRequest], pending: int) -> Queued:
        """The rows' frame sampling queued on the device, for their token after `pending`
        ones not yet read back; the caller records it in the penalty history once kept."""
        with self.phase("sample"):
            batch = self.sampling.prepare(reqs, pending)
            return batch, self.model.queue_frames(hidden, BatchSampler(batch))

    def read(self, queued: QueuedFrames) -> FrameSample:
        with self.phase("readback"):
            return self.model.read_frames(queued)

    def record(
        self, reqs: list[RunnerRequest], sample: FrameSample
    ) -> dict[str, RequestStepOutput]:
        """Append each row's token and input frame to its request; one output per row, in
        row order, without audio (`StepAudio` brings it)."""
        outputs: dict[str, RequestStepOutput] = {}
        with self.phase("record"):
            for r, token, output in zip(reqs, sample.tokens, sample.outputs, strict=True):
                r.tokens.append(token)
                r.frames.append(self.model.input_frame(token, output))
                outputs[r.request_id] = RequestStepOutput(tokens=(token,), frames=(output,))
        return outputs

    def audio(
        self, steps: list[SampledStep], queued: list[PendingAudio], step_id: int
    ) -> StepAudio | None:
        """The PCM of the frames sampled, still being decoded: the audio `queued` earlier (a
        window's first chunks, in order), then that of `steps`, queued now in one pass for
        the step or the rest of the window; held frames (`held`) first. A single step's rows
        in `audio_later` hold its frame instead. None without any."""
        if self.model.decoder_slots() is None:  # no stream decode: this stage makes no audio
            return None
        with self.phase("audio"):
            if self.held is not None and len(steps) == 1 and not queued:
                pending = self.held.step(steps[0], self.audio_later)
            else:
                before = self.held.release_all() if self.held is not None else []
                now = [self.model.queue_audio(steps)] if steps else []
                pending = [*before, *queued, *now]
        return StepAudio(pending, self.model.name, step_id) if pending else None

    def audio_ahead(self, reqs: list[RunnerRequest], queued: QueuedFrames) -> PendingAudio | None:
        """A step's audio queued before its frames are read back (`ARModel.queue_audio_ahead`):
        the host queues the decoder while the device still samples, instead of after the
        read-back, where the device sat idle waiting for it. None where the audio waits for
        the read: held frames (`held`) choose per row; a row that could draw a frameless id
        and go on would have its slot decoded again after a frame that is not audio; a stage
        without stream decode makes none."""
        if self.held is not None or self.model.decoder_slots() is None:
            return None
        frameless = self.model.token_policy.frameless_ids
        if any(t not in r.sampling.stop_token_ids for r in reqs for t in frameless):
            return None
        with self.phase("audio"):
            return self.model.queue_audio_ahead([r.request_id for r in reqs], queued)

    def settle(self, ahead: PendingAudio, step: SampledStep, step_id: int) -> StepAudio | None:
        """The audio queued ahead for `step`, without the rows that drew the stop token; None
        when every row did (a request's last step): its pass is not audio, and the step's
        ending outputs need not wait for it."""
        rows = zip(step.request_ids, step.sample.outputs, strict=True)
        silent = frozenset(r for r, f in rows if f is None)
        if len(silent) == len(step.request_ids):
            return None
        return StepAudio([ahead], self.model.name, step_id, silent)


def sampled_step(reqs: list[RunnerRequest], sample: FrameSample) -> SampledStep:
    return SampledStep(tuple(r.request_id for r in reqs), sample)


def concat(outs: list[RequestStepOutput]) -> RequestStepOutput:
    """One output for several decode steps of a request (tokens and frames in order)."""
    if len(outs) == 1:
        return outs[0]
    return RequestStepOutput(
        tokens=tuple(t for o in outs for t in o.tokens),
        frames=tuple(f for o in outs for f in o.frames),
    )
