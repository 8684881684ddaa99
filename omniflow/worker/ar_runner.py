"""The generic AR model runner: executes a `StepPlan` on an `ARModel` and answers with a
`StepResult`.

It keeps each request's runner-side state (block table, the tokens and input frames it
sampled), builds the step's inputs on one of two paths (`worker/inputs.py`: prefill for mixed
steps, decode when every request computes its next token), runs the paged forward, and asks
the model to sample a frame where a request reached the end of its known tokens. It appends
what it samples to its own state at once, so under async scheduling the next plan can feed
the token before the scheduler has seen it. What tokens mean (prompt layout, stop frames,
banned ids, frame completion, audio) is the model's (`models/interface.py`).
"""

from __future__ import annotations

import logging

import torch

from omniflow.config.schema import SchedulerConfig
from omniflow.core.audio import PendingAudio
from omniflow.core.pipeline import NoTimer, PhaseTimer, PrefillCounters
from omniflow.core.step import NewRequestData, RequestStepOutput, StepPlan, StepResult
from omniflow.device.upload import upload_ints
from omniflow.models.interface import (
    ARModel,
    FrameSample,
    KVLayout,
    QueuedFrames,
    SampledStep,
)
from omniflow.sampling.draw import SamplingBatch
from omniflow.sampling.sampler import BatchSampler, SamplingStaging
from omniflow.worker.inputs import DecodeBatch, RunnerRequest, build_prefill
from omniflow.worker.step_audio import StepAudio
from omniflow.worker.window_gate import first_step_tokens, refused_step, window_refusal

log = logging.getLogger(__name__)

_Queued = tuple[SamplingBatch, QueuedFrames]
"""A step's sampling batch (recorded in the penalty history once the step is kept) and its
queued frames."""


class ARModelRunner:
    """Runs an AR model's steps over a paged KV cache."""

    def __init__(
        self,
        model: ARModel,
        scheduler: SchedulerConfig,
        device: torch.device,
        dtype: torch.dtype,
        batched_decode: bool = False,
        audio_chunk_frames: int = 0,
    ) -> None:
        self.model = model
        self.audio_chunk_frames = audio_chunk_frames
        """Inside a window, queue the audio of every this many steps as soon as they are read
        back (0: the whole window's at its end); see `_decode`."""
        self.device = device
        self.dtype = dtype
        self.batched_decode = batched_decode
        self.block_size = scheduler.block_size
        spec = model.kv_spec
        slots = scheduler.num_kv_blocks * scheduler.block_size
        # One slot past the pool: padded rows of a captured decode bucket write their K/V
        # there, and no block table points at it.
        shape = (slots + 1, spec.num_kv_heads, spec.head_dim)
        kv = [torch.zeros(shape, device=device, dtype=dtype) for _ in range(2 * spec.num_layers)]
        self.kv_caches = list(zip(kv[::2], kv[1::2], strict=True))
        self.requests: dict[str, RunnerRequest] = {}
        self._pending_audio: dict[int, StepAudio] = {}
        """Each step's audio until the engine takes it (`take_audio`)."""
        self.decode_batch = DecodeBatch(model, scheduler, device, batched_decode)
        model.attach_kv(
            KVLayout(
                self.kv_caches,
                scheduler.block_size,
                self.decode_batch.max_blocks,
                dummy_slot=slots,
                max_batch=scheduler.max_num_seqs,
            )
        )
        self.sampling = SamplingStaging(scheduler.max_num_seqs, model.token_policy, device)
        self._refusals_logged: set[str] = set()
        self.timer: PhaseTimer = NoTimer()
        """Benchmarks time the step's phases through this hook (no cost by default)."""
        self.stage_name = model.name
        self._prefill_steps = 0
        self._prefill_tokens = 0

    def set_timer(self, timer: PhaseTimer, stage: str) -> None:
        """Time this runner's phases under the stage's name."""
        self.timer, self.stage_name = timer, stage

    @property
    def parked_ids(self) -> frozenset[str]:
        """Preempted requests whose model-side state waits to be restored."""
        return self.model.parked_ids()

    def decoder_slots(self) -> tuple[int, int] | None:
        """(in use, total) streaming-decoder slots; None without stream decode."""
        return self.model.decoder_slots()

    def prefills(self) -> PrefillCounters:
        """Prefill forwards so far, and how many ran on the model's prompt graphs."""
        graphed, replays = self.model.prompt_graph_counts()
        return PrefillCounters(self._prefill_steps, self._prefill_tokens, graphed, replays)

    # ------------------------------------------------------------------ state

    def _admit(self, data: NewRequestData) -> None:
        self.model.admit(data.request_id)
        frames = [
            self.model.input_frame(t, f)
            for t, f in zip(data.output_tokens, data.output_frames, strict=True)
        ]
        self.requests[data.request_id] = RunnerRequest(
            request_id=data.request_id,
            payload=data.payload,
            prompt_len=data.prompt_len,
            sampling=data.sampling,
            seed=data.seed,
            block_ids=list(data.block_ids),
            num_computed=data.num_computed_tokens,
            tokens=list(data.output_tokens),
            frames=frames,
        )

    def _apply_plan_state(self, plan: StepPlan) -> None:
        for rid in plan.finished_ids:
            self.requests.pop(rid, None)
            self.sampling.release(rid)
            if rid in plan.preempted_ids:
                self.model.preempt(rid)
            else:
                self.model.finish(rid)
        for data in plan.new_requests:
            self._admit(data)
        for c in plan.cached_requests:
            r = self.requests[c.request_id]
            del r.block_ids[c.num_blocks - len(c.new_block_ids) :]  # blocks given back
            r.block_ids.extend(c.new_block_ids)
            r.num_computed = c.num_computed_tokens

    # ------------------------------------------------------------------ execute

    @torch.no_grad()
    def execute(self, plan: StepPlan) -> StepResult:
        self._apply_plan_state(plan)
        if plan.is_empty:
            return StepResult(plan.step_id, {})
        order = list(plan.num_scheduled_tokens.items())
        decode = all(n == 1 or rid in plan.window for rid, n in order) and all(
            rid in self.requests and self.requests[rid].in_decode for rid, _ in order
        )
        kind = "decode_step" if decode else "admitting_window" if plan.window else "mixed_step"
        try:
            with self.timer.phase(self.stage_name, kind):
                if plan.window:
                    return self._run_window(plan)
                outputs, audio = self._run(order, plan.step_id)
                self._keep_audio(plan.step_id, audio)
                return StepResult(plan.step_id, outputs)
        except (RuntimeError, ValueError) as exc:  # a model failure ends each request once
            log.exception("%s step %d failed", self.model.name, plan.step_id)
            message = f"{self.model.name} step failed: {exc}"
            return StepResult(
                plan.step_id, {rid: RequestStepOutput(error=message) for rid, _ in order}
            )

    def take_audio(self, step_id: int) -> PendingAudio | None:
        """The audio of step `step_id`, still being decoded (None: it made none); handed out
        once. Called from the engine thread while the next step may be executing."""
        return self._pending_audio.pop(step_id, None)

    def _keep_audio(self, step_id: int, audio: StepAudio | None) -> None:
        if audio is not None:
            self._pending_audio[step_id] = audio

    # ---------------------------------------------------------- windows (docs/architecture.md)

    def _window_refusal(self, plan: StepPlan) -> str | None:
        """Gate 3 (`worker/window_gate.py`)."""
        return window_refusal(plan, self.requests)

    def _run_window(self, plan: StepPlan) -> StepResult:
        reason = self._window_refusal(plan)
        if reason is not None:
            if reason not in self._refusals_logged:
                self._refusals_logged.add(reason)
                log.info("window refused at run time (%s): running a single step", reason)
            order, errors = refused_step(plan, self.requests)
            single, audio = self._run(order, plan.step_id) if order else ({}, None)
            for rid, message in errors.items():
                single[rid] = RequestStepOutput(error=message)
            self._keep_audio(plan.step_id, audio)
            return StepResult(plan.step_id, single, window_steps=1, window_refusal=reason)
        firsts = {rid: first_step_tokens(plan, rid) for rid in plan.window}
        if all(n == 1 and self.requests[rid].in_decode for rid, n in firsts.items()):
            outputs, audio, steps = self._decode(dict(plan.window), plan.step_id)
        else:
            outputs, audio, steps = self._admitting_window(dict(plan.window), firsts, plan.step_id)
        self._keep_audio(plan.step_id, audio)
        return StepResult(plan.step_id, outputs, window_steps=steps)

    def _admitting_window(
        self, ks: dict[str, int], firsts: dict[str, int], step_id: int
    ) -> tuple[dict[str, RequestStepOutput], StepAudio | None, int]:
        """A window opened on a step that admits new requests (`window_admits`): its first
        step is the mixed step (the new prompts prefilled whole beside one decode token of
        the running rows, every row sampled), and the rows that go on decode the rest of the
        window together on the decode path. One decoder pass covers the whole window, as in
        any window: without it the mixed step would be a step of its own, with its own
        decoder pass and scheduling turn-around, and the running rows would make one frame
        in it instead of a window's k (docs/engine.md, "Windows that admit")."""
        sampled = self._mixed_sample(list(firsts.items()))
        if sampled is None:  # gate 3 passed it: every row reaches the end of its known tokens
            raise RuntimeError("an admitting window's first step sampled no row")
        reqs, sample = sampled
        outputs = self._record(reqs, sample)
        first = self._step(reqs, sample)
        rest = {
            r.request_id: ks[r.request_id] - 1
            for r, token in zip(reqs, sample.tokens, strict=True)
            if ks[r.request_id] > 1 and token not in r.sampling.stop_token_ids
        }
        if not rest:
            return outputs, self._audio([first], [], step_id), 1
        more, audio, steps = self._decode(rest, step_id, done=[first])
        for rid, out in more.items():
            outputs[rid] = _concat([outputs[rid], out])
        return outputs, audio, steps + 1

    # ------------------------------------------------------------------ steps

    def _run(
        self, order: list[tuple[str, int]], step_id: int
    ) -> tuple[dict[str, RequestStepOutput], StepAudio | None]:
        """One step. A mixed step runs its decoding rows (one token at the end of their
        known tokens) on the decode path, where a CUDA graph replays them, and only the
        rest on the prefill path: while requests keep arriving, most steps are mixed, and
        the running requests would otherwise decode eagerly beside every new prompt. The
        two paths agree bit for bit on the CPU (tests/stages/test_runner_paths.py); all
        rows are then sampled in one call. The audio comes back still being decoded
        (`worker/step_audio.py`)."""
        if all(n == 1 and self.requests[rid].in_decode for rid, n in order):
            outputs, audio, _ = self._decode({rid: 1 for rid, _ in order}, step_id)
            return outputs, audio
        sampled = self._mixed_sample(order)
        if sampled is None:
            return {}, None
        reqs, sample = sampled
        outputs = self._record(reqs, sample)
        return outputs, self._audio([self._step(reqs, sample)], [], step_id)

    def _mixed_sample(
        self, order: list[tuple[str, int]]
    ) -> tuple[list[RunnerRequest], FrameSample] | None:
        """A mixed step's forward (decoding rows on the decode path, the rest on the prefill
        path) and the frame of every row that reaches the end of its known tokens, read
        back; None when no row does (a prompt chunk)."""
        reqs = [(self.requests[rid], n) for rid, n in order]
        decoding = [r for r, n in reqs if n == 1 and r.in_decode]
        prefill = [(r, n) for r, n in reqs if not (n == 1 and r.in_decode)]
        hidden: list[torch.Tensor] = []
        if decoding:
            self.decode_batch.load(decoding, 1)
            x, meta = self.decode_batch.inputs()
            with self.timer.phase(self.stage_name, "forward"):
                hidden.append(self.model.decode_hidden(x, meta))
            for r in decoding:
                r.num_computed += 1
        with self.timer.phase(self.stage_name, "prefill_layout"):
            batch = build_prefill(
                self.model, prefill, self.block_size, self.device, self.batched_decode
            )
        # Pinned and non-blocking: a pageable copy would wait for the queued forwards.
        rows = None
        if batch.sample_rows:
            rows = upload_ints([row for _, row in batch.sample_rows], self.device)
        with self.timer.phase(self.stage_name, "prefill_embed"):  # eager, before the graph
            embeds = self.model.embed_prefill(batch.inputs)
        with self.timer.phase(self.stage_name, "prefill"):
            out = self.model.forward(embeds, batch.positions, batch.meta, self.kv_caches)
        self._prefill_steps += 1
        self._prefill_tokens += sum(n for _, n in prefill)
        for r, n in prefill:
            r.num_computed += n
        if rows is not None:
            hidden.append(out.index_select(0, rows))
        sampled = decoding + [r for r, _ in batch.sample_rows]
        if not sampled:
            return None
        return sampled, self._sample(torch.cat(hidden), sampled)

    def _decode(
        self, ks: dict[str, int], step_id: int, done: list[SampledStep] | None = None
    ) -> tuple[dict[str, RequestStepOutput], StepAudio | None, int]:
        """Decode path: request r computes up to ks[r] tokens, one per step, each step feeding
        the token and frame it sampled into the next on the device. A request leaves at its
        k or at a stop token; the layout is built once and only shrinks. Returns the outputs
        (several steps concatenated), their audio still being decoded (`StepAudio`), and
        the number of steps run.

        Overlap: the GPU runs a whole step ahead of the host's bookkeeping. Before the host reads
        step n's codes back, step n+1 is queued whole for every row still short of its k
        (which the host knows): its forward and its sampling, keyed by the counters the rows
        will have (`SamplingStaging.prepare(pending=1)`), so the host's reading, recording and
        next preparation run while the GPU computes, and the GPU does not wait for the host
        between steps (a batch-1 frame's host work is ~1.5 ms beside ~4 ms of GPU work). A
        step's draw joins the penalty history only once the step is kept (at the top of its
        iteration). If a row stopped at step n, step n+1 was computed needlessly for it: it
        is discarded (never recorded; its read-back is never read) and computed again for the
        rows that go on, so every kept row's codes come from the same batch as without the
        overlap, bit for bit.

        With `audio_chunk_frames` C, the audio of steps 1..C, C+1..2C, ... is queued
        (`ARModel.queue_audio`) as soon as the last of them is read back, while the GPU
        computes the next step, and handed back with the rest at the window's end: a model that
        decodes on a stream of its own does so beside the window's later steps.

        `done`: steps of the same window already sampled (an admitting window's mixed first
        step), whose audio goes with this window's."""
        reqs = [self.requests[rid] for rid in ks]
        self.decode_batch.load(reqs, max(ks.values()))
        parts: dict[str, list[RequestStepOutput]] = {r.request_id: [] for r in reqs}
        sampled: list[SampledStep] = list(done or [])
        chunks: list[PendingAudio] = []  # audio queued before the window's end
        steps = 0
        current: _Queued | None = self._queue_step(reqs, pending=0)
        while current is not None:
            steps += 1
            for r in reqs:
                r.num_computed += 1
            batch, queued = current
            self.sampling.record(batch, queued.next_tokens)  # the penalty history, on device
            going = [i for i, r in enumerate(reqs) if steps < ks[r.request_id]]
            ahead: _Queued | None = None
            if going:
                self.decode_batch.advance(queued.next_tokens, queued.next_frames, going)
                ahead = self._queue_step([reqs[i] for i in going], pending=1)
            sample = self._read_sample(queued)
            outs = self._record(reqs, sample)
            sampled.append(self._step(reqs, sample))
            row_of = {i: j for j, i in enumerate(going)}  # a request's row in the layout
            keep = []
            for i, r in enumerate(reqs):
                out = outs[r.request_id]
                parts[r.request_id].append(out)
                if i in row_of and out.tokens[0] not in r.sampling.stop_token_ids:
                    keep.append(i)  # the sampler bans stop ids until they may end a request
            if len(keep) < len(going):
                self.decode_batch.select([row_of[i] for i in keep])
                kept = [reqs[i] for i in keep]
                # The kept rows' step again, as without the overlap; their tokens are read.
                ahead = self._queue_step(kept, pending=0) if kept else None
            reqs = [reqs[i] for i in keep]
            current = ahead
            if current is not None and len(sampled) == self.audio_chunk_frames:
                with self.timer.phase(self.stage_name, "audio"):
                    chunks.append(self.model.queue_audio(sampled))
                sampled = []
        outputs = {rid: _concat(outs) for rid, outs in parts.items()}
        return outputs, self._audio(sampled, chunks, step_id), steps

    def _queue_step(self, reqs: list[RunnerRequest], pending: int) -> _Queued:
        """The decode batch's next forward and its sampling, queued (not recorded)."""
        return self._queue_sample(self._forward(), reqs, pending)

    def _forward(self) -> torch.Tensor:
        """The decode batch's next hidden states (its K/V written), queued."""
        x, meta = self.decode_batch.inputs()
        with self.timer.phase(self.stage_name, "forward"):
            return self.model.decode_hidden(x, meta)

    def _sample(self, hidden: torch.Tensor, reqs: list[RunnerRequest]) -> FrameSample:
        batch, queued = self._queue_sample(hidden, reqs, pending=0)
        self.sampling.record(batch, queued.next_tokens)  # the penalty history, on device
        return self._read_sample(queued)

    def _queue_sample(
        self, hidden: torch.Tensor, reqs: list[RunnerRequest], pending: int
    ) -> _Queued:
        """The rows' frame sampling queued on the device, for their token after `pending`
        ones not yet read back; the caller records it in the penalty history once kept."""
        with self.timer.phase(self.stage_name, "sample"):
            batch = self.sampling.prepare(reqs, pending)
            return batch, self.model.queue_frames(hidden, BatchSampler(batch))

    def _read_sample(self, queued: QueuedFrames) -> FrameSample:
        with self.timer.phase(self.stage_name, "readback"):
            return self.model.read_frames(queued)

    def _record(
        self, reqs: list[RunnerRequest], sample: FrameSample
    ) -> dict[str, RequestStepOutput]:
        """Append each row's token and input frame to its request; one output per row, in
        row order, without audio (`StepAudio` brings it, `worker/step_audio.py`)."""
        outputs: dict[str, RequestStepOutput] = {}
        for r, token, output in zip(reqs, sample.tokens, sample.outputs, strict=True):
            r.tokens.append(token)
            r.frames.append(self.model.input_frame(token, output))
            outputs[r.request_id] = RequestStepOutput(tokens=(token,), frames=(output,))
        return outputs

    @staticmethod
    def _step(reqs: list[RunnerRequest], sample: FrameSample) -> SampledStep:
        return SampledStep(tuple(r.request_id for r in reqs), sample)

    def _audio(
        self, steps: list[SampledStep], queued: list[PendingAudio], step_id: int
    ) -> StepAudio | None:
        """The PCM of the frames sampled, still being decoded: the audio `queued` earlier (a
        window's first chunks, in order), then that of `steps` (the model's post-frame hook),
        queued now in one pass for the step or the rest of the window. None without any."""
        if self.model.decoder_slots() is None:  # no stream decode: this stage makes no audio
            return None
        with self.timer.phase(self.stage_name, "audio"):
            pending = [*queued, self.model.queue_audio(steps)] if steps else queued
        return StepAudio(pending, self.model.name, step_id) if pending else None


def _concat(outs: list[RequestStepOutput]) -> RequestStepOutput:
    """One output for several decode steps of a request (tokens and frames in order)."""
    if len(outs) == 1:
        return outs[0]
    return RequestStepOutput(
        tokens=tuple(t for o in outs for t in o.tokens),
        frames=tuple(f for o in outs for f in o.frames),
    )
