"""One-off host-to-device indices: the values arrive, and on CUDA the copy does not wait for
the work queued before it (a pageable copy would: the host stalls, and the GPU idles while
the host catches up)."""

from __future__ import annotations

import pytest
import torch

from omniflow.device.upload import to_device, upload_ints


def test_values_and_dtype_on_the_cpu():
    got = upload_ints([3, 1, 2], torch.device("cpu"))
    assert got.dtype == torch.int64 and got.tolist() == [3, 1, 2]
    codes = torch.arange(6).view(2, 3)
    assert torch.equal(to_device(codes, torch.device("cpu")), codes)


@pytest.mark.cuda
def test_cuda_upload_queues_without_waiting_for_earlier_work():
    dev = torch.device("cuda")
    a = torch.randn(4096, 4096, device=dev)
    for _ in range(10):  # work queued ahead of the copies
        a = a @ a
        a = a / a.norm()
    torch.cuda.set_sync_debug_mode("error")
    try:
        ids = upload_ints([5, 7, 11], dev)
        codes = to_device(torch.arange(32).view(2, 16), dev)
    finally:
        torch.cuda.set_sync_debug_mode(0)
    assert ids.tolist() == [5, 7, 11] and codes.sum().item() == sum(range(32))
    with pytest.raises(RuntimeError):  # the check above can fail: a pageable copy is caught
        torch.cuda.set_sync_debug_mode("error")
        try:
            torch.tensor([1, 2], device=dev)
        finally:
            torch.cuda.set_sync_debug_mode(0)
