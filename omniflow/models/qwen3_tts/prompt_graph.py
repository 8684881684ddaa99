"""The talker's prefill of whole prompts as one CUDA graph per token bucket.

Eagerly, a prefill pays its host launches, layer by layer, whatever its size (measured: see
docs/performance.md). That is a request's first audio at low load, and every mixed step's
extra cost while requests
keep arriving. Replaying a captured graph launches the 28 layers at once.

Which steps qualify (`covers_whole_contexts`): every request's step covers its whole context
(fresh prompts, and a recompute after preemption that fits in one step), so attention needs
no cached prefix: each request attends causally within its own contiguous tokens. The step is
laid out flat, padded to the smallest token bucket >= T. Every request's positions then start
at 0, so the graph numbers the segments itself (a new one at each position 0: the cumulative
count of zeros) and builds the mask from them (same segment, not after the query): nothing is
copied from the host, and a bucket's graph serves any mix of prompt lengths. A step of more
tokens than the largest bucket runs as several replays, each over consecutive whole requests
(`pack_requests`). Steps continuing a cached prefix (chunked prefill), and a single request
longer than the largest bucket, run the eager path (`Talker.forward`).

A padding row is inert: position 0 (so its own segment: it attends only to itself), its K/V
written to `dummy_slot`, embedding zeros. The K/V of real rows are written to the cache as the
eager path writes them, and attention reads this step's K/V directly (for a whole-context step
they are the same values the eager path gathers back from the cache).
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import AbstractContextManager, nullcontext

import torch
from torch.nn import functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from omniflow.models.layers.attention import AttentionMetadata, PagedAttentionMetadata, write_kv
from omniflow.models.layers.qwen3 import AnyAttend, KVCaches, run_layers_norm
from omniflow.models.qwen3_tts.decode_graph import TalkerGraphs, write_then_attend
from omniflow.models.qwen3_tts.talker import Talker

TOKEN_BUCKETS = (16, 32, 64, 128, 256, 512, 1024, 2048)
"""Token counts a prefill is padded to. The mask is dense over a bucket (T x T), so large
buckets pay attention over padding and across prompts: a step above `max_tokens` runs as
several replays of whole requests (`PromptGraphs.run`)."""


def covers_whole_contexts(meta: AttentionMetadata) -> bool:
    """Every request's step computes its whole context (no cached prefix to attend to)."""
    if not isinstance(meta, PagedAttentionMetadata):
        return False
    starts = meta.query_starts
    return all(starts[b + 1] - starts[b] == n for b, n in enumerate(meta.seq_lens))


def pack_requests(query_starts: Sequence[int], max_tokens: int) -> list[tuple[int, int]] | None:
    """Token ranges [a, b) over consecutive whole requests, each at most `max_tokens`
    (greedy, in order: a step's requests stay in their flat layout), covering every token;
    None when one request alone is longer (it cannot go through a bucket)."""
    groups: list[tuple[int, int]] = []
    start = query_starts[0]
    for a, b in zip(query_starts, query_starts[1:], strict=False):
        if b - a > max_tokens:
            return None
        if b - start > max_tokens:
            groups.append((start, a))
            start = a
    if query_starts[-1] > start:
        groups.append((start, query_starts[-1]))
    return groups


class PromptGraphs(TalkerGraphs):
    """Bucketed CUDA graphs of a whole-context prefill over the talker's layers (final norm
    included), captured lazily or all at once with `capture_all`. The KV caches are the
    runner's; a graph records their addresses. Without CUDA, or with `capture=False`, the same
    buffers, padding and step run eagerly (the CPU tests exercise everything but the
    capture)."""

    label = "prompt prefill"
    unit = "tokens"

    def __init__(
        self,
        talker: Talker,
        kv_caches: KVCaches,
        max_tokens: int,
        max_positions: int,
        dummy_slot: int,
        capture: bool = True,
        buckets: Sequence[int] = TOKEN_BUCKETS,
        warmup_iters: int = 2,
    ) -> None:
        super().__init__(
            talker, kv_caches, max_tokens, max_positions, dummy_slot, capture, buckets, warmup_iters
        )
        self.max_tokens = max_tokens
        dev, n = self.device, max_tokens
        hidden = talker.shape.hidden_size
        self.embeds = torch.zeros(n, hidden, device=dev, dtype=self.dtype)
        self.positions = torch.zeros(n, device=dev, dtype=torch.int64)
        self.slot_mapping = torch.full((n,), dummy_slot, device=dev, dtype=torch.int64)
        self.order = torch.arange(n, device=dev, dtype=torch.int64)
        self.out = torch.zeros(n, hidden, device=dev, dtype=self.dtype)
        self.served = 0
        """Prefills this path has run (the rest ran eagerly): logs and tests read it."""
        self.replays = 0
        """Replays (or eager bucket steps) those prefills took: more than one per prefill
        for steps above the largest bucket."""

    @torch.no_grad()
    def run(
        self, embeds: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor | None:
        """Final-norm hidden states [T, H] of a whole-context prefill (a new tensor), this
        step's K/V written at `meta.slot_mapping`; None when the step does not qualify (a
        cached prefix, or one request longer than the largest bucket): run it eagerly.

        A step of more tokens than the largest bucket runs as several replays, each over
        consecutive whole requests (`pack_requests`): every request attends only within
        itself, so how the requests are grouped changes nothing in the result. Eagerly such
        a step (a mixed step at high concurrency admitting a dozen or more new prompts at
        once) pays every layer's launches; a few replays pay none."""
        if not covers_whole_contexts(meta):
            return None
        groups = pack_requests(meta.query_starts, self.max_tokens)
        if not groups:  # a request above the largest bucket (or, never sent, no request)
            return None
        out = torch.empty_like(embeds, dtype=self.out.dtype)
        for a, b in groups:
            self._run_tokens(embeds[a:b], positions[a:b], meta.slot_mapping[a:b], out[a:b])
        self.served += 1
        self.replays += len(groups)
        return out

    def _run_tokens(
        self, embeds: torch.Tensor, positions: torch.Tensor, slots: torch.Tensor, dest: torch.Tensor
    ) -> None:
        """One replay over whole requests of at most `max_tokens` tokens in all, its hidden
        states copied to `dest` (before the next replay overwrites the static output)."""
        t = embeds.shape[0]
        k = self.bucket_for(t)
        if k is None:  # pack_requests keeps every group within max_tokens, itself a bucket
            raise RuntimeError(f"{t} tokens above the largest bucket ({self.max_tokens})")
        self.embeds[:t].copy_(embeds)
        self.positions[:t].copy_(positions)
        self.slot_mapping[:t].copy_(slots)
        self._pad(t, k)
        self._compute(k)
        dest.copy_(self.out[:t])

    @torch.no_grad()
    def capture_all(self) -> None:
        """Capture every bucket now; a no-op when not graphed. Every row is reset to padding
        first, so the warm-ups write only `dummy_slot` (rows left from an earlier prefill
        name slots that may belong to another request by now)."""
        if not self.graphed:
            return
        self._pad(0, self.max_tokens)
        super().capture_all()

    def _pad(self, start: int, stop: int) -> None:
        """Rows [start, stop) become padding (a smaller bucket after a larger one must not
        rewrite the earlier step's slots)."""
        if start < stop:
            self.embeds[start:stop].zero_()
            self.positions[start:stop].zero_()
            self.slot_mapping[start:stop].fill_(self.dummy_slot)

    def _step(self, k: int) -> None:
        pos, order = self.positions[:k], self.order[:k]
        seg = torch.cumsum((pos == 0).to(torch.int64), 0)  # a new request at each position 0
        mask = (seg[:, None] == seg[None, :]) & (order[None, :] <= order[:, None])
        mask = mask[None, None]  # [1, 1, k, k]: same request, not after the query
        slots = self.slot_mapping[:k]
        cos, sin = self.rope.lookup(pos)

        def sdpa(q: torch.Tensor, key: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            out = F.scaled_dot_product_attention(
                q.transpose(0, 1)[None],
                key.transpose(0, 1)[None],
                v.transpose(0, 1)[None],
                attn_mask=mask,
                enable_gqa=True,
            )
            return out[0].transpose(0, 1)

        def attend(layer: int, q: torch.Tensor, key: torch.Tensor, v: torch.Tensor):
            kc, vc = self.kv_caches[layer]
            write_kv(kc, vc, key, v, slots)
            return sdpa(q, key, v)

        def own(qn, kn, v, kc, vc) -> torch.Tensor:  # the step attends over its own K/V
            return sdpa(qn, kn, v)

        t = self.talker.weights.talker
        # On CUDA the q/k norms, rotary and K/V write are one launch per layer (four apart:
        # two norm+rotary kernels and two index copies), as in the decode step.
        chosen: AnyAttend = (
            write_then_attend(self.kv_caches, slots, own, keep_k=True) if self.fused else attend
        )
        with prefill_attention(self.device):
            self.out[:k] = run_layers_norm(
                t.model.layers, t.model.norm, self.embeds[:k], cos, sin, chosen
            )


def prefill_attention(device: torch.device) -> AbstractContextManager[None]:
    """The attention backends a prompt graph records. On CUDA, cuDNN's fused attention first:
    a masked, grouped-query step is outside flash attention (a mask) and torch's
    memory-efficient kernel (grouped heads), so without cuDNN it runs torch's math path in
    fp32 (two fp32 GEMMs, a softmax and about a dozen elementwise kernels per layer, a slower
    replay; measured: see docs/performance.md).
    `prepare_device` turns cuDNN attention off process-wide for its host time per call;
    recorded in a graph that cost is paid once, at capture (the eager
    `cuda_graphs=false` path pays it per layer: it is for debugging). Where cuDNN cannot run
    the step (float32) torch falls back to the math path, as before. Elsewhere: torch's
    choice, unchanged.

    The backend flags are process-wide: while this is entered, an attention call on another
    thread also prefers cuDNN. Served with graphs it is entered only while the pipeline is
    built (the captures, before any request), so nothing else runs beside it; on the eager
    debugging path the codec's attention on the decoder's thread may take cuDNN during a
    prefill (the same values to rounding, at cuDNN's host cost)."""
    if device.type != "cuda":
        return nullcontext()
    backends = [SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
    return sdpa_kernel(backends, set_priority=True)
