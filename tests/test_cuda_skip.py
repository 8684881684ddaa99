"""A plain `pytest` on a machine without CUDA skips the GPU tests, saying why, instead of
failing them (tests/conftest.py); CI's `-m "not cuda"` deselects them as before."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_tests_are_skipped_with_the_reason():
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-rs",
            "-p",
            "no:cacheprovider",
            "tests/cuda/test_kv_sizing_cuda.py",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "skipped" in r.stdout and "failed" not in r.stdout and "passed" not in r.stdout
    assert "needs a CUDA GPU" in r.stdout
