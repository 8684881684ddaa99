"""`Readback`: codes reach the host as lists, a new copy supersedes an abandoned one, the
buffer grows with the batch; on a GPU the wait returns before work queued after the copy
ends."""

from __future__ import annotations

import pytest
import torch

from omniflow.device.readback import Readback


def test_codes_come_back_as_lists_and_the_buffer_grows():
    rb = Readback()
    small = torch.arange(6, dtype=torch.int64).view(2, 3)
    assert rb.wait(rb.start(small)) == [[0, 1, 2], [3, 4, 5]]
    big = torch.arange(15, dtype=torch.int64).view(5, 3) * 7
    pending = rb.start(big)
    big.zero_()  # the CPU copy was taken at start
    assert rb.wait(pending) == (torch.arange(15).view(5, 3) * 7).tolist()
    wide = torch.ones(1, 4, dtype=torch.int64)
    assert rb.wait(rb.start(wide)) == [[1, 1, 1, 1]]


def test_a_new_copy_supersedes_an_outstanding_one():
    """A step that failed between its sampling and its read-back leaves a copy behind: the
    next `start` must still work, and the abandoned copy can no longer be read."""
    rb = Readback()
    abandoned = rb.start(torch.zeros(1, 2, dtype=torch.int64))
    current = rb.start(torch.ones(1, 2, dtype=torch.int64))
    with pytest.raises(RuntimeError, match="superseded or read"):
        rb.wait(abandoned)
    assert rb.wait(current) == [[1, 1]]
    with pytest.raises(RuntimeError, match="superseded or read"):
        rb.wait(current)  # already read


def test_two_copies_in_flight_and_the_third_supersedes_the_unread_first():
    """A window reads step n while step n+1's copy is queued: with depth 2 both can be read,
    in order; a copy that was never read (a step discarded after a stop) is superseded when
    its buffer comes round again, and a buffer still holding a read copy is reused."""
    rb = Readback(depth=2)
    one = rb.start(torch.full((1, 2), 1, dtype=torch.int64))
    two = rb.start(torch.full((2, 2), 2, dtype=torch.int64))
    assert rb.wait(one) == [[1, 1]]
    three = rb.start(torch.full((1, 2), 3, dtype=torch.int64))  # one's buffer, read: reused
    assert rb.wait(two) == [[2, 2], [2, 2]]
    discarded = rb.start(torch.full((1, 2), 4, dtype=torch.int64))
    assert rb.wait(three) == [[3, 3]]
    five = rb.start(torch.full((3, 2), 5, dtype=torch.int64))  # three's buffer, read
    six = rb.start(torch.full((1, 2), 6, dtype=torch.int64))  # comes round to the unread 4
    with pytest.raises(RuntimeError, match="superseded or read"):
        rb.wait(discarded)
    assert rb.wait(five) == [[5, 5]] * 3
    assert rb.wait(six) == [[6, 6]]
    with pytest.raises(ValueError, match="depth"):
        Readback(depth=0)


@pytest.mark.cuda
def test_cuda_wait_does_not_wait_for_work_queued_after_the_copy():
    """The copy goes to pinned memory behind an event: after `wait` returns the codes, a
    long chain of matmuls queued after `start` is still running."""
    rb = Readback()
    codes = torch.arange(32, device="cuda", dtype=torch.int64).view(4, 8)
    pending = rb.start(codes)
    assert pending.host.is_pinned()
    a = torch.randn(8192, 8192, device="cuda")
    for _ in range(20):  # ~0.4 s of fp32 matmuls on an H200
        a = a @ a
        a = a / a.norm()
    after = torch.cuda.Event()
    after.record()
    assert rb.wait(pending) == torch.arange(32).view(4, 8).tolist()
    assert not after.query(), "wait() waited for the work queued after the copy"
    torch.cuda.synchronize()
