"""Paged KV-cache bookkeeping: a pool of fixed-size blocks and a block table per request.

Only ids live here; the tensors live in the runner. Allocation is all-or-nothing, so a
failed allocation leaves every table exactly as it was.
"""

from __future__ import annotations

from collections import deque


class BlockPool:
    """Free list of block ids."""

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self._free: deque[int] = deque(range(num_blocks))

    @property
    def num_free(self) -> int:
        return len(self._free)

    def take(self, n: int) -> list[int] | None:
        """n blocks, or None (and nothing taken) when fewer are free."""
        if n > len(self._free):
            return None
        return [self._free.popleft() for _ in range(n)]

    def give_back(self, block_ids: list[int]) -> None:
        self._free.extend(block_ids)


class KVCacheManager:
    """Block tables per request over one `BlockPool`."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.pool = BlockPool(num_blocks)
        self._tables: dict[str, list[int]] = {}

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    def block_ids(self, request_id: str) -> tuple[int, ...]:
        return tuple(self._tables.get(request_id, ()))

    def allocate_slots(self, request_id: str, num_tokens: int) -> list[int] | None:
        """Grow the table to hold `num_tokens`; return the new block ids, or None if full."""
        table = self._tables.setdefault(request_id, [])
        need = self.blocks_for(num_tokens) - len(table)
        if need <= 0:
            return []
        new = self.pool.take(need)
        if new is None:
            if not table:
                del self._tables[request_id]
            return None
        table.extend(new)
        return new

    def trim(self, request_id: str, num_tokens: int) -> None:
        """Free the blocks beyond what `num_tokens` needs (a window that fell short)."""
        table = self._tables.get(request_id)
        if not table:
            return
        keep = self.blocks_for(num_tokens)
        if keep < len(table):
            self.pool.give_back(table[keep:])
            del table[keep:]

    def free(self, request_id: str) -> None:
        self.pool.give_back(self._tables.pop(request_id, []))

    @property
    def num_used_blocks(self) -> int:
        return self.pool.num_blocks - self.pool.num_free
