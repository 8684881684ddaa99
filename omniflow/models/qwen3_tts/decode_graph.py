"""The talker's decode step (embedding, 28 layers over the paged KV cache, final norm) as one
CUDA graph per batch bucket.

Eagerly a decode step is a few hundred small kernels, so at small batches it is bound by
launch overhead; replaying a captured graph launches them all at once. A graph records fixed
shapes and addresses, so each bucket reads its inputs from static buffers: `run` copies B rows
into the first B rows of the smallest bucket >= B, pads the rest with inert rows, replays,
and returns a copy of the first B rows of the static output.

What makes the step capturable (`decode_hidden`, the one function both paths run):
- the embedding is `embed_decode` (no host read; same op order as the eager path);
- RoPE comes from a `RopeTable` built up front for `max_positions` positions, indexed by the
  positions tensor (`Rotary.cos_sin` reads the host to grow its table);
- attention reads block tables and context lengths from device tensors of fixed shape
  ([bucket, max_blocks]), never sized by their values. On CUDA that is the Triton kernel
  `kernels.paged_decode.paged_decode_attention`; on the CPU (nothing is captured there) it is
  its torch reference `kernels.paged_decode_ref.paged_decode_attention_ref`, which equals
  `Talker.forward` with the batched torch decode attention to ~1e-6 in fp32. On CUDA the
  q/k norms, rotary and the K/V write before it are one launch per layer
  (`kernels.norm_rope_write`, same roundings as the separate kernels).

A padding row is inert: context length 0 (the kernel writes zeros and reads no cache), position
0, its K/V written to `dummy_slot` (a slot the runner reserves and nothing reads), ids 0.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from omniflow.device.bucket_graphs import BATCH_BUCKETS, BucketGraphs
from omniflow.kernels.args import NormRopeArgs, PagedContext
from omniflow.kernels.paged_decode_ref import paged_decode_attention_ref
from omniflow.models.interface import DecodeInputs
from omniflow.models.layers.attention import write_kv
from omniflow.models.layers.qwen3 import (
    AnyAttend,
    KVCaches,
    PreNormAttend,
    fused_norm_rope,
    run_layers_norm,
)
from omniflow.models.layers.rope_table import RopeTable
from omniflow.models.qwen3_tts.inputs import embed_decode
from omniflow.models.qwen3_tts.talker import Talker

DecodeAttentionFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, PagedContext], torch.Tensor]
"""(q [B, Hq, D], k_cache, v_cache [slots, Hkv, D] with this step's K/V written, the rows'
`PagedContext`: block tables [B, max_blocks] int32, context lengths [B] int32, block size)
-> [B, Hq, D]; a row of context length 0 gives zeros."""


def decode_attention_for(device: torch.device) -> DecodeAttentionFn:
    """The Triton kernel on CUDA (graph-safe), its torch reference elsewhere."""
    if device.type == "cuda":
        # Imported here: triton comes with CUDA builds of torch, a CPU install may lack it.
        from omniflow.kernels.paged_decode import paged_decode_attention

        return paged_decode_attention
    return paged_decode_attention_ref


def check_kv_layout(talker: Talker, kv_caches: KVCaches, dummy_slot: int) -> torch.Tensor:
    """One cache pair per talker layer and a dummy slot inside the pool (where a graph's
    padding rows write): what every talker graph over the runner's caches needs. Returns the
    first K cache (its device, dtype and slot count describe them all)."""
    if len(kv_caches) != talker.num_layers:
        raise ValueError(f"{len(kv_caches)} KV caches for {talker.num_layers} layers")
    k_cache = kv_caches[0][0]
    if not 0 <= dummy_slot < k_cache.shape[0]:
        raise ValueError(f"dummy_slot {dummy_slot} outside the {k_cache.shape[0]} KV slots")
    return k_cache


@torch.no_grad()
def decode_hidden(
    talker: Talker,
    rope: RopeTable,
    x: DecodeInputs,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    slot_mapping: torch.Tensor,
    kv_caches: KVCaches,
    block_size: int,
    attention: DecodeAttentionFn,
    fused: bool,
) -> torch.Tensor:
    """Final-norm hidden states [B, H] of one decode step, this step's K/V written at
    `slot_mapping`: what a bucket's graph records, and the eager path. `Talker.forward` over
    `embed_decode`, with RoPE from the table and attention from block tables; `fused`: the
    q/k norms, rotary and K/V write in one Triton launch per layer (`write_then_attend`)."""
    embeds = embed_decode(talker, x)
    cos, sin = rope.lookup(x.positions)
    context = PagedContext(block_tables, context_lens, block_size)

    def attend(layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        kc, vc = kv_caches[layer]
        write_kv(kc, vc, k, v, slot_mapping)
        return attention(q, kc, vc, context)

    def paged(qn, kn, v, kc, vc) -> torch.Tensor:  # the step's K/V are read from the cache
        return attention(qn, kc, vc, context)

    t = talker.weights.talker
    chosen: AnyAttend = (
        write_then_attend(kv_caches, slot_mapping, paged, keep_k=False) if fused else attend
    )
    return run_layers_norm(t.model.layers, t.model.norm, embeds, cos, sin, chosen)


AttendNormed = Callable[
    [torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor
]
"""(normalised, rotated q; the same K when kept, else None; v; k_cache, v_cache with this
step's K/V written) -> the attention output."""


def write_then_attend(
    kv_caches: KVCaches, slot_mapping: torch.Tensor, attend: AttendNormed, keep_k: bool
) -> PreNormAttend:
    """A layer's attention with its q/k norms, rotary and K/V write in one Triton launch
    (`kernels.norm_rope_write`, CUDA or the interpreter), then `attend`: the talker's decode
    step reads its K back from the cache; a whole-prompt prefill (`prompt_graph.py`) keeps
    its normalised K (`keep_k`) to attend over its own tokens."""

    def write(args: NormRopeArgs) -> torch.Tensor:  # NormRopeKernel
        # Imported here: Triton is needed on CUDA machines only.
        from omniflow.kernels.norm_rope_write import norm_rope_write

        k = args.k
        kn = torch.empty(k.shape, device=k.device, dtype=k.dtype) if keep_k else None
        qn = norm_rope_write(args, slot_mapping, kn)
        return attend(qn, kn, args.v, args.k_cache, args.v_cache)

    return fused_norm_rope(kv_caches, write)


class TalkerGraphs(BucketGraphs):
    """Bucketed graphs of a step over the talker's layers and the runner's KV caches (a
    graph records their addresses, so they must live as long as this object): the decode
    step's and the whole-prompt prefill's. Both check the caches' layout, run on their
    device and dtype, and read RoPE from one table built up front."""

    def __init__(
        self,
        talker: Talker,
        kv_caches: KVCaches,
        max_rows: int,
        max_positions: int,
        dummy_slot: int,
        capture: bool,
        buckets: Sequence[int],
        warmup_iters: int,
    ) -> None:
        k_cache = check_kv_layout(talker, kv_caches, dummy_slot)
        self.talker = talker
        self.kv_caches = kv_caches
        self.dummy_slot = dummy_slot
        super().__init__(k_cache.device, max_rows, buckets, capture, warmup_iters)
        self.dtype = k_cache.dtype
        self.fused = self.device.type == "cuda"
        """q/k norms, rotary and the K/V write in one Triton launch per layer
        (`norm_rope_write`): on CUDA. The CPU tests set it under Triton's interpreter to
        check that step against the plain one."""
        # Built now, eagerly: building reads the largest position back to the host.
        self.rope = RopeTable(talker.rotary, max_positions, self.device, self.dtype)


class TalkerDecodeGraphs(TalkerGraphs):
    """Bucketed CUDA graphs of `decode_hidden`, captured lazily on a bucket's first use (or
    all at once with `capture_all`) into one memory pool shared by the buckets.

    The buckets share one set of static buffers of `max_batch` rows (bucket k reads and writes
    rows [:k]): replays run one at a time on one stream. The KV caches are the runner's; a
    graph records their addresses, so they must live as long as this object. Without CUDA, or
    with `capture=False`, the same buffers, padding and function run eagerly (the CPU tests
    and a kill switch exercise everything but the capture). Above the largest bucket the
    function runs eagerly on the caller's tensors."""

    label = "talker decode-step"

    def __init__(
        self,
        talker: Talker,
        kv_caches: KVCaches,
        block_size: int,
        max_batch: int,
        max_blocks: int,
        max_positions: int,
        dummy_slot: int,
        capture: bool = True,
        buckets: Sequence[int] = BATCH_BUCKETS,
        attention: DecodeAttentionFn | None = None,
        warmup_iters: int = 2,
    ) -> None:
        super().__init__(
            talker, kv_caches, max_batch, max_positions, dummy_slot, capture, buckets, warmup_iters
        )
        self.block_size = block_size
        self.max_batch = max_batch
        self.max_blocks = max_blocks
        dev = self.device
        self.attention = attention if attention is not None else decode_attention_for(dev)
        n, i64, i32 = max_batch, torch.int64, torch.int32
        self.tokens = torch.zeros(n, device=dev, dtype=i64)
        self.frames = torch.zeros(n, talker.num_groups, device=dev, dtype=i64)
        self.side_ids = torch.zeros(n, device=dev, dtype=i64)
        self.positions = torch.zeros(n, device=dev, dtype=i64)
        self.block_tables = torch.zeros(n, max_blocks, device=dev, dtype=i32)
        self.context_lens = torch.zeros(n, device=dev, dtype=i32)
        self.slot_mapping = torch.full((n,), dummy_slot, device=dev, dtype=i64)
        self.out = torch.zeros(n, talker.shape.hidden_size, device=dev, dtype=self.dtype)

    @torch.no_grad()
    def run(
        self,
        x: DecodeInputs,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> torch.Tensor:
        """Hidden states [B, H] (final norm) of B decode rows, as a new tensor (a clone of the
        static output: the next replay overwrites it). block_tables [B, <= max_blocks] int32;
        context_lens [B] int32, this step's token included; slot_mapping [B] int64, where this
        step's K/V go. Every position must be below `max_positions`."""
        b = x.tokens.shape[0]
        self._check(b, x, block_tables, context_lens, slot_mapping)
        k = self.bucket_for(b)
        if k is None:
            return self._hidden(x, block_tables, context_lens, slot_mapping)
        self._load(b, k, x, block_tables, context_lens, slot_mapping)
        self._compute(k)
        return self.out[:b].clone()

    @torch.no_grad()
    def capture_all(self) -> None:
        """Capture every bucket now (largest first, so the smaller ones reuse its pool
        memory) instead of on first use; a no-op when not graphed. Every row is reset to
        padding first, so the warm-ups write only `dummy_slot`: rows left from an earlier
        step could name blocks since given to another request."""
        if not self.graphed:
            return
        self._pad(0, self.max_batch)
        super().capture_all()

    def _warm_up(self, k: int) -> None:
        """The real step on the rows just loaded (Triton compiles and cuBLAS initialises
        here, not inside the capture): it writes each row's K/V to its own slot, and running
        it again writes the same values to the same slots (padding rows only touch
        `dummy_slot`), so the replay that follows finds the cache as if only it had run."""
        super()._warm_up(k)

    def _check(
        self,
        b: int,
        x: DecodeInputs,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        """Shapes only (reading values would synchronise with the device)."""
        rows = {
            "frames": (x.frames.shape[0],),
            "side_ids": tuple(x.side_ids.shape),
            "positions": tuple(x.positions.shape),
            "block_tables": (block_tables.shape[0],),
            "context_lens": tuple(context_lens.shape),
            "slot_mapping": tuple(slot_mapping.shape),
        }
        for name, shape in rows.items():
            if shape != (b,):
                raise ValueError(f"{name} has {shape} rows, expected ({b},)")
        if block_tables.shape[1] > self.max_blocks:
            raise ValueError(f"{block_tables.shape[1]} block table columns > {self.max_blocks}")

    def _load(
        self,
        b: int,
        k: int,
        x: DecodeInputs,
        block_tables: torch.Tensor,
        context_lens: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        """Rows [:b] from the inputs (block table columns past the input's zeroed), rows
        [b:k] padding."""
        pairs = (
            (self.tokens, x.tokens),
            (self.frames, x.frames),
            (self.side_ids, x.side_ids),
            (self.positions, x.positions),
            (self.context_lens, context_lens),
            (self.slot_mapping, slot_mapping),
        )
        for buf, src in pairs:
            buf[:b].copy_(src)
        width = block_tables.shape[1]
        self.block_tables[:b, :width].copy_(block_tables)
        if width < self.max_blocks:
            self.block_tables[:b, width:].zero_()
        if b < k:
            self._pad(b, k)

    def _pad(self, start: int, end: int) -> None:
        """Rows [start:end] inert: no context (zeros out, no cache read), K/V to the dummy
        slot, position and ids 0."""
        for buf in (
            self.tokens,
            self.frames,
            self.side_ids,
            self.positions,
            self.block_tables,
            self.context_lens,
        ):
            buf[start:end].zero_()
        self.slot_mapping[start:end].fill_(self.dummy_slot)

    def _inputs(self, k: int) -> DecodeInputs:
        return DecodeInputs(
            tokens=self.tokens[:k],
            frames=self.frames[:k],
            side_ids=self.side_ids[:k],
            positions=self.positions[:k],
        )

    def _step(self, k: int) -> None:
        """Bucket k's computation over the static buffers (what its graph records)."""
        tables, lens, slots = self.block_tables[:k], self.context_lens[:k], self.slot_mapping[:k]
        self.out[:k].copy_(self._hidden(self._inputs(k), tables, lens, slots))

    def _hidden(
        self, x: DecodeInputs, tables: torch.Tensor, lens: torch.Tensor, slots: torch.Tensor
    ) -> torch.Tensor:
        """`decode_hidden` over these rows with this object's talker, caches and attention:
        a bucket's step over the static buffers, or a batch above the largest bucket."""
        return decode_hidden(
            self.talker,
            self.rope,
            x,
            tables,
            lens,
            slots,
            self.kv_caches,
            self.block_size,
            self.attention,
            self.fused,
        )
