"""The AR model runner: executes a `StepPlan` on the talker and answers with a `StepResult`.

It keeps each request's runner-side state (block table, the tokens and frames it sampled),
prepares the flattened batch (inputs, positions, slot mapping, per-request context slots),
runs the paged forward, samples codebook 0 where a request reached the end of its known
tokens, and completes those frames with the code predictor. The runner appends what it
samples to its own state at once, so under async scheduling the next plan can feed the
token before the scheduler has seen it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import numpy as np
import torch

from omniflow.config.schema import SchedulerConfig
from omniflow.core.request import SamplingParams
from omniflow.core.step import NewRequestData, RequestStepOutput, StepPlan, StepResult
from omniflow.models.layers.attention import PagedAttentionMetadata
from omniflow.models.qwen3_tts.codec_stream import StreamingDecoder
from omniflow.models.qwen3_tts.prompt import NO_CODEC, TalkerPrompt
from omniflow.models.qwen3_tts.talker import Talker, TalkerInputs
from omniflow.stages.sampler import SamplingBatch, sample

log = logging.getLogger(__name__)

SUBTALKER_TEMPERATURE = 0.9
SUBTALKER_TOP_K = 50


@dataclass
class RunnerRequest:
    """What the runner holds for one request."""

    request_id: str
    prompt: TalkerPrompt
    sampling: SamplingParams
    seed: int
    block_ids: list[int]
    num_computed: int
    tokens: list[int] = field(default_factory=list)
    frames: list[tuple[int, ...]] = field(default_factory=list)
    """Input frames per output token (EOS stored as (eos, 0, ...): never emitted)."""
    decoder_slot: int | None = None
    """Stream decode: the request's codec decoder slot (taken at its first frame)."""

    @property
    def num_tokens(self) -> int:
        return self.prompt.prompt_len + len(self.tokens)


class ARModelRunner:
    """Runs talker steps over a paged KV cache."""

    def __init__(
        self,
        talker: Talker,
        scheduler: SchedulerConfig,
        device: torch.device,
        dtype: torch.dtype,
        stream_decoder: StreamingDecoder | None = None,
        batched_decode: bool = False,
    ) -> None:
        self.talker = talker
        self.batched_decode = batched_decode
        self.stream_decoder = stream_decoder
        self._refusals_logged: set[str] = set()
        self._parked: dict[str, dict[str, torch.Tensor]] = {}
        """Decoder state of preempted requests, restored when they resume."""
        self.device = device
        self.dtype = dtype
        self.block_size = scheduler.block_size
        shape = talker.shape
        slots = scheduler.num_kv_blocks * scheduler.block_size
        self.kv_caches = [
            (
                torch.zeros(slots, shape.num_kv_heads, shape.head_dim, device=device, dtype=dtype),
                torch.zeros(slots, shape.num_kv_heads, shape.head_dim, device=device, dtype=dtype),
            )
            for _ in range(shape.num_layers)
        ]
        self.groups = talker.num_groups
        self.eos = talker.vocab.eos
        self.eos_frame = (self.eos,) + (0,) * (self.groups - 1)
        self.requests: dict[str, RunnerRequest] = {}
        vocab = shape.vocab_size
        self._suppress = torch.zeros(vocab, dtype=torch.bool, device=device)
        self._suppress[list(talker.vocab.suppressed_ids(vocab))] = True

    @property
    def parked_ids(self) -> frozenset[str]:
        """Preempted requests whose decoder state waits to be restored."""
        return frozenset(self._parked)

    def decoder_slots(self) -> tuple[int, int] | None:
        """(in use, total) streaming-decoder slots; None without stream decode."""
        dec = self.stream_decoder
        return None if dec is None else (dec.num_in_use, dec.num_slots)

    # ------------------------------------------------------------------ state

    def _admit(self, data: NewRequestData) -> None:
        frames = [self.eos_frame if f is None else tuple(f) for f in data.output_frames]
        slot = None
        snap = self._parked.pop(data.request_id, None)
        if snap is not None and self.stream_decoder is not None:
            slot = self.stream_decoder.allocate()
            self.stream_decoder.restore(slot, snap)
        self.requests[data.request_id] = RunnerRequest(
            request_id=data.request_id,
            prompt=data.payload,
            sampling=data.sampling,
            seed=data.seed,
            block_ids=list(data.block_ids),
            num_computed=data.num_computed_tokens,
            tokens=list(data.output_tokens),
            frames=frames,
            decoder_slot=slot,
        )

    def _drop(self, rid: str, preempted: bool) -> None:
        r = self.requests.pop(rid, None)
        if not preempted:
            self._parked.pop(rid, None)
        if r is None or r.decoder_slot is None or self.stream_decoder is None:
            return
        if preempted:
            self._parked[rid] = self.stream_decoder.snapshot(r.decoder_slot)
        self.stream_decoder.release(r.decoder_slot)

    def _apply_plan_state(self, plan: StepPlan) -> None:
        for rid in plan.finished_ids:
            self._drop(rid, rid in plan.preempted_ids)
        for data in plan.new_requests:
            self._admit(data)
        for c in plan.cached_requests:
            r = self.requests[c.request_id]
            r.block_ids.extend(c.new_block_ids)
            r.num_computed = c.num_computed_tokens

    # ------------------------------------------------------------------ execute

    @torch.no_grad()
    def execute(self, plan: StepPlan) -> StepResult:
        self._apply_plan_state(plan)
        if plan.is_empty:
            return StepResult(plan.step_id, {})
        order = list(plan.num_scheduled_tokens.items())
        try:
            if plan.window:
                return self._run_window(plan)
            return StepResult(plan.step_id, self._run(order))
        except (RuntimeError, ValueError) as exc:  # a model failure ends each request once
            log.exception("talker step %d failed", plan.step_id)
            message = f"talker step failed: {exc}"
            return StepResult(
                plan.step_id, {rid: RequestStepOutput(error=message) for rid, _ in order}
            )

    # ------------------------------------------------------------------ windows (DESIGN §7)

    def _window_refusal(self, plan: StepPlan) -> str | None:
        """Gate 3: re-check a window plan against what the runner holds."""
        if set(plan.num_scheduled_tokens) != set(plan.window):
            return "partial_window"
        for rid, k in plan.window.items():
            r = self.requests.get(rid)
            if r is None:
                return "unknown_request"
            if plan.num_scheduled_tokens[rid] != k or k < 1:
                return "plan_mismatch"
            if r.num_computed < r.prompt.prompt_len or r.num_computed + 1 != r.num_tokens:
                return "not_in_decode"
        return None

    def _run_window(self, plan: StepPlan) -> StepResult:
        """Replay up to k decode steps per request inside one execute, each step feeding the
        token it sampled into the next; a request leaves the window at its k or its EOS,
        and the loop ends once every request has left."""
        reason = self._window_refusal(plan)
        if reason is not None:
            if reason not in self._refusals_logged:
                self._refusals_logged.add(reason)
                log.info("window refused at run time (%s): running a single step", reason)
            single = self._run([(rid, 1) for rid in plan.num_scheduled_tokens])
            return StepResult(plan.step_id, single, window_steps=1, window_refusal=reason)
        parts: dict[str, list[RequestStepOutput]] = {rid: [] for rid in plan.window}
        left: set[str] = set()
        steps = 0
        for i in range(max(plan.window.values())):
            order = [(rid, 1) for rid, k in plan.window.items() if i < k and rid not in left]
            if not order:
                break
            steps += 1
            for rid, out in self._run(order).items():
                parts[rid].append(out)
                if out.tokens[0] in self.requests[rid].sampling.stop_token_ids:
                    left.add(rid)  # the runner bans stop ids until they may end a request
        merged = {rid: _concat(outs) for rid, outs in parts.items() if outs}
        return StepResult(plan.step_id, merged, window_steps=steps)

    # ------------------------------------------------------------------ one step

    def _run(self, order: list[tuple[str, int]]) -> dict[str, RequestStepOutput]:
        inputs, positions, meta, sample_rows = self._prepare(order)
        embeds = self.talker.embed(inputs)
        hidden = self.talker.forward(embeds, positions, meta, self.kv_caches)
        for rid, n in order:
            self.requests[rid].num_computed += n
        outputs: dict[str, RequestStepOutput] = {}
        if sample_rows:
            rows = torch.tensor([row for _, row in sample_rows], device=self.device)
            reqs = [self.requests[rid] for rid, _ in sample_rows]
            frames = self._sample_frames(hidden.index_select(0, rows), reqs)
            audio = self._stream_decode(reqs, frames) if self.stream_decoder else {}
            for req, frame in zip(reqs, frames, strict=True):
                code0 = frame[0]
                req.tokens.append(code0)
                is_eos = code0 == self.eos
                req.frames.append(self.eos_frame if is_eos else frame)
                outputs[req.request_id] = RequestStepOutput(
                    tokens=(code0,),
                    frames=(None if is_eos else frame,),
                    audio=audio.get(req.request_id),
                )
        return outputs

    def _stream_decode(
        self, reqs: list[RunnerRequest], frames: list[tuple[int, ...]]
    ) -> dict[str, object]:
        """Fused pipeline: each new (non-EOS) frame's 1,920 samples from the request's slot."""
        dec = self.stream_decoder
        assert dec is not None
        rows = [(r, f) for r, f in zip(reqs, frames, strict=True) if f[0] != self.eos]
        if not rows:
            return {}
        for r, _ in rows:
            if r.decoder_slot is None:
                r.decoder_slot = dec.allocate()
        codes = [torch.tensor([f], dtype=torch.int64) for _, f in rows]
        pcm = dec.decode([r.decoder_slot for r, _ in rows], codes)  # type: ignore[misc]
        return {r.request_id: p.float().cpu().numpy() for (r, _), p in zip(rows, pcm, strict=True)}

    def _prepare(
        self, order: list[tuple[str, int]]
    ) -> tuple[TalkerInputs, torch.Tensor, PagedAttentionMetadata, list[tuple[str, int]]]:
        text_ids: list[int] = []
        codes: list[tuple[int, ...]] = []
        masks: list[tuple[bool, ...]] = []
        positions: list[int] = []
        slots: list[int] = []
        starts = [0]
        seq_lens: list[int] = []
        context_slots: list[torch.Tensor] = []
        sample_rows: list[tuple[str, int]] = []
        bs = self.block_size
        zeros = (0,) * (self.groups - 1)
        prompt_mask = (True,) + (False,) * (self.groups - 1)
        no_mask = (False,) * self.groups
        full_mask = (True,) * self.groups
        for rid, n in order:
            r = self.requests[rid]
            p = r.prompt
            start = r.num_computed
            end = start + n
            if end > r.num_tokens:
                raise ValueError(f"{rid}: plan runs to {end} but only {r.num_tokens} tokens known")
            for pos in range(start, end):
                if pos < p.prompt_len:
                    text_ids.append(p.text_ids[pos])
                    cid = p.codec_ids[pos]
                    codes.append((max(cid, 0), *zeros))
                    masks.append(prompt_mask if cid != NO_CODEC else no_mask)
                else:
                    step = pos - p.prompt_len
                    text_ids.append(p.trailing_at(step))
                    codes.append(r.frames[step])
                    masks.append(full_mask)
                positions.append(pos)
                slots.append(r.block_ids[pos // bs] * bs + pos % bs)
            starts.append(len(positions))
            seq_lens.append(end)
            blocks = torch.tensor(r.block_ids[: -(-end // bs)], dtype=torch.int64)
            ctx = (blocks[:, None] * bs + torch.arange(bs)).flatten()[:end]
            context_slots.append(ctx)
            if end == r.num_tokens:
                sample_rows.append((rid, len(positions) - 1))
        dev = self.device
        inputs = TalkerInputs(
            text_ids=torch.tensor(text_ids, dtype=torch.int64, device=dev),
            codes=torch.tensor(codes, dtype=torch.int64, device=dev),
            code_mask=torch.tensor(masks, dtype=torch.bool, device=dev),
        )
        padded_slots = padded_mask = None
        if self.batched_decode and len(positions) == len(order):  # every request: 1 token
            # Built on the host, moved in one copy each.
            longest = max(seq_lens)
            host_slots = torch.zeros(len(order), longest, dtype=torch.int64)
            host_mask = torch.zeros(len(order), longest, dtype=torch.bool)
            for i, ctx in enumerate(context_slots):
                host_slots[i, : ctx.numel()] = ctx
                host_mask[i, : ctx.numel()] = True
            padded_slots, padded_mask = host_slots.to(dev), host_mask.to(dev)
            device_slots: tuple[torch.Tensor, ...] = ()
        else:
            device_slots = tuple(ctx.to(dev) for ctx in context_slots)
        meta = PagedAttentionMetadata(
            slot_mapping=torch.tensor(slots, dtype=torch.int64, device=dev),
            query_starts=tuple(starts),
            seq_lens=tuple(seq_lens),
            context_slots=device_slots,
            padded_slots=padded_slots,
            padded_mask=padded_mask,
        )
        return inputs, torch.tensor(positions, dtype=torch.int64, device=dev), meta, sample_rows

    # ------------------------------------------------------------------ sampling

    def _sample_frames(
        self, hidden: torch.Tensor, reqs: list[RunnerRequest]
    ) -> list[tuple[int, ...]]:
        dev = self.device
        sp = [r.sampling for r in reqs]
        seeds = torch.tensor([r.seed for r in reqs], dtype=torch.int64, device=dev)
        counters = torch.tensor([len(r.tokens) for r in reqs], dtype=torch.int64, device=dev)
        banned = self._suppress.expand(len(reqs), -1).clone()
        rows: list[int] = []  # (row, id) pairs to ban, applied in one indexed write
        ids: list[int] = []
        for i, (r, s) in enumerate(zip(reqs, sp, strict=True)):
            extra = list(s.suppress_token_ids)
            if s.ignore_eos or len(r.tokens) < s.min_new_tokens:
                extra += list(s.stop_token_ids) or [self.eos]
            rows.extend([i] * len(extra))
            ids.extend(extra)
        if rows:
            banned[torch.tensor(rows, device=dev), torch.tensor(ids, device=dev)] = True
        batch = SamplingBatch(
            temperature=torch.tensor([s.temperature for s in sp], device=dev),
            top_k=torch.tensor([s.top_k for s in sp], dtype=torch.int64, device=dev),
            top_p=torch.tensor([s.top_p for s in sp], device=dev),
            repetition_penalty=torch.tensor([s.repetition_penalty for s in sp], device=dev),
            seeds=seeds,
            counters=counters,
            history=tuple(tuple(r.tokens) for r in reqs),
            banned=banned,
            top_k_max=max(s.top_k for s in sp) if all(s.top_k > 0 for s in sp) else 0,
            use_top_p=any(s.top_p < 1.0 for s in sp),
            use_penalty=any(s.repetition_penalty != 1.0 for s in sp),
        )
        code0 = sample(self.talker.logits(hidden), batch, stream=0)
        code0_list = code0.tolist()
        acoustic = [i for i, c in enumerate(code0_list) if c != self.eos]
        frames: list[tuple[int, ...]] = [(c,) for c in code0_list]
        if acoustic:
            idx = torch.tensor(acoustic, device=dev)
            sub = SamplingBatch(
                temperature=torch.where(
                    batch.temperature[idx] > 0,
                    torch.full_like(batch.temperature[idx], SUBTALKER_TEMPERATURE),
                    torch.zeros_like(batch.temperature[idx]),
                ),
                top_k=torch.full((len(acoustic),), SUBTALKER_TOP_K, dtype=torch.int64, device=dev),
                top_p=torch.ones(len(acoustic), device=dev),
                repetition_penalty=torch.ones(len(acoustic), device=dev),
                seeds=seeds[idx],
                counters=counters[idx],
                top_k_max=SUBTALKER_TOP_K,
                use_top_p=False,
                use_penalty=False,
            )

            def sample_group(logits: torch.Tensor, group: int) -> torch.Tensor:
                return sample(logits, sub, stream=group)

            full = self.talker.complete_frames(
                hidden.index_select(0, idx), code0.index_select(0, idx), sample_group
            ).tolist()
            for i, frame in zip(acoustic, full, strict=True):
                frames[i] = tuple(frame)
        return frames


def _concat(outs: list[RequestStepOutput]) -> RequestStepOutput:
    """One output for several window steps of a request (tokens, frames, PCM in order)."""
    audio = [o.audio for o in outs if o.audio is not None]
    return RequestStepOutput(
        tokens=tuple(t for o in outs for t in o.tokens),
        frames=tuple(f for o in outs for f in o.frames),
        audio=np.concatenate(audio) if audio else None,
    )
