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
from collections.abc import Callable

import torch

from omniflow.config.schema import SchedulerConfig
from omniflow.core.arrivals import Arrivals
from omniflow.core.audio import PendingAudio
from omniflow.core.pipeline import PhaseTimer, PrefillCounters
from omniflow.core.step import NewRequestData, RequestStepOutput, StepPlan, StepResult
from omniflow.device.upload import upload_ints
from omniflow.models.interface import ARModel, FrameSample, KVLayout
from omniflow.sampling.sampler import SamplingStaging
from omniflow.worker.ar_decode import decode_steps
from omniflow.worker.held_audio import HeldFrames
from omniflow.worker.inputs import DecodeBatch, RunnerRequest, build_prefill
from omniflow.worker.step_audio import StepAudio
from omniflow.worker.step_ops import StepOps, sampled_step
from omniflow.worker.window_gate import refused_step, window_refusal

log = logging.getLogger(__name__)


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
        audio_pass_steps: int = 0,
    ) -> None:
        self.model = model
        self.audio_chunk_frames = audio_chunk_frames
        """Inside a window, queue the audio of every this many steps as soon as they are read
        back (0: the whole window's at its end); see `worker/ar_decode.py`."""
        self.device = device
        self.dtype = dtype
        self.batched_decode = batched_decode
        self.block_size = scheduler.block_size
        self.max_model_len = scheduler.max_model_len
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
        self.sampling = SamplingStaging(
            scheduler.max_num_seqs,
            model.token_policy,
            device,
            max_requests=scheduler.max_resident_seqs or 0,
        )
        self.ops = StepOps(model, self.decode_batch, self.sampling)
        if audio_pass_steps > 1 and model.decoder_slots() is not None:
            self.ops.held = HeldFrames(model.queue_audio, self._ends)
        self.arrivals = Arrivals()
        """Set by the engine when a request arrives that the next step could seat: a
        window ends at its next step boundary (`watch_arrivals`)."""
        self._chunk_sink: Callable[[PendingAudio], None] | None = None
        """Where a window's chunks go as soon as they are queued (`send_chunks`)."""
        self._refusals_logged: set[str] = set()
        self._audio_cycle = 0
        """The held-audio cycle of the last plan (`StepPlan.audio_cycle`)."""
        self._prefill_steps = 0
        self._prefill_tokens = 0

    def send_chunks(self, sink: Callable[[PendingAudio], None]) -> None:
        """Hand each chunk of a window's audio to `sink` as soon as it is queued, not with
        the step's audio (`take_audio`): the engine sends it while the window runs."""
        self._chunk_sink = sink

    def watch_arrivals(self, arrivals: Arrivals) -> None:
        """End windows early when `arrivals` is set (the engine's flag)."""
        self.arrivals = arrivals

    def set_timer(self, timer: PhaseTimer, stage: str) -> None:
        """Time this runner's phases under the stage's name."""
        self.ops.timer, self.ops.stage_name = timer, stage

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

    def _let_go(self, held: HeldFrames, plan: StepPlan) -> None:
        """Before a plan's state changes: a preempted row's held frames are decoded (before
        its decoder state is parked), a finished one's dropped; another cycle (or none) lets
        everything go, a row the step leaves out lets go itself. A decoder call that fails
        here drops what is held (those streams lose those frames) instead of the stage."""
        new = plan.audio_cycle != self._audio_cycle
        self._audio_cycle = plan.audio_cycle
        try:
            held.release(plan.preempted_ids)
            held.drop(plan.finished_ids)
            held.release([r for r in held.rows if new or r not in plan.num_scheduled_tokens])
        except (RuntimeError, ValueError):
            log.exception("%s: held frames of %s not decoded", self.model.name, held.rows)
            held.drop(held.rows)

    def _ends(self, request_id: str) -> bool:
        """Whether the request made its last token in the step just recorded (its length
        cap; a stop frame shows in the frame itself)."""
        r = self.requests[request_id]
        made = len(r.tokens)
        return made >= r.sampling.max_new_tokens or r.prompt_len + made >= self.max_model_len

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
        held = self.ops.held
        if held is not None:
            self._let_go(held, plan)
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
        with self.ops.phase("plan_state"):  # admits, finishes, block tables: host
            self._apply_plan_state(plan)
        self.ops.audio_later = plan.audio_later
        if plan.is_empty:
            return StepResult(plan.step_id, {})
        order = list(plan.num_scheduled_tokens.items())
        decode = all(n == 1 or rid in plan.window for rid, n in order) and all(
            rid in self.requests and self.requests[rid].in_decode for rid, _ in order
        )
        kind = "decode_step" if decode else "mixed_step"
        try:
            with self.ops.phase(kind):
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
        if self.ops.held is not None and self._chunk_sink is not None:
            for part in self.ops.held.release_all():  # before the window's chunks go
                self._chunk_sink(part)
        outputs, audio, steps, cut = self._decode(dict(plan.window), plan.step_id)
        self._keep_audio(plan.step_id, audio)
        return StepResult(plan.step_id, outputs, window_steps=steps, window_cut=cut)

    # ------------------------------------------------------------------ steps

    def _run(
        self, order: list[tuple[str, int]], step_id: int
    ) -> tuple[dict[str, RequestStepOutput], StepAudio | None]:
        """One step; its audio comes back still being decoded. A mixed step's decoding rows
        run on the decode path (a CUDA graph replays them) and only the rest on the prefill
        path: while requests keep arriving most steps are mixed, and the running rows would
        otherwise decode eagerly beside every new prompt. The paths agree bit for bit on the
        CPU (tests/stages/test_runner_paths.py)."""
        if all(n == 1 and self.requests[rid].in_decode for rid, n in order):
            outputs, audio, _, _ = self._decode({rid: 1 for rid, _ in order}, step_id)
            return outputs, audio
        sampled = self._mixed_sample(order)
        if sampled is None:
            return {}, None
        reqs, sample, ahead = sampled
        outputs = self.ops.record(reqs, sample)
        step = sampled_step(reqs, sample)
        if ahead is not None:
            return outputs, self.ops.settle(ahead, step, step_id)
        return outputs, self.ops.audio([step], [], step_id)

    def _mixed_sample(
        self, order: list[tuple[str, int]]
    ) -> tuple[list[RunnerRequest], FrameSample, PendingAudio | None] | None:
        """A mixed step's forward (decoding rows on the decode path, the rest on the prefill
        path) and the frame of every row that reaches the end of its known tokens, read
        back, its audio queued ahead of the read where it can be; None when no row does (a
        prompt chunk)."""
        reqs = [(self.requests[rid], n) for rid, n in order]
        decoding = [r for r, n in reqs if n == 1 and r.in_decode]
        prefill = [(r, n) for r, n in reqs if not (n == 1 and r.in_decode)]
        hidden: list[torch.Tensor] = []
        if decoding:
            with self.ops.phase("decode_layout"):
                self.decode_batch.load(decoding, 1)
            hidden.append(self.ops.forward())
            for r in decoding:
                r.num_computed += 1
        with self.ops.phase("prefill_layout"):
            batch = build_prefill(
                self.model, prefill, self.block_size, self.device, self.batched_decode
            )
        # Pinned and non-blocking: a pageable copy would wait for the queued forwards.
        rows = None
        if batch.sample_rows:
            rows = upload_ints([row for _, row in batch.sample_rows], self.device)
        with self.ops.phase("prefill_embed"):  # eager, before the graph
            embeds = self.model.embed_prefill(batch.inputs)
        with self.ops.phase("prefill"):
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
        return sampled, *self.ops.sample(torch.cat(hidden), sampled)

    def _decode(
        self, ks: dict[str, int], step_id: int
    ) -> tuple[dict[str, RequestStepOutput], StepAudio | None, int, bool]:
        """The decode path (`worker/ar_decode.py`) over the rows of `ks`."""
        reqs = [self.requests[rid] for rid in ks]
        return decode_steps(
            self.ops,
            reqs,
            ks,
            step_id,
            self.audio_chunk_frames,
            self.arrivals.pending,
            self._chunk_sink,
        )
