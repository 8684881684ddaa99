"""`platform=auto` (the default) without importing torch where its build has no GPU backend:
the installed torch's generated `torch/version.py` says so, read without importing torch, so
`omniflow config` and every early refusal start in well under a second on a CPU build."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

from omniflow.platforms.base import torch_build_has_gpu

GPU_BUILD = torch.version.cuda is not None or torch.version.hip is not None


def python(code: str, **env: str) -> str:
    r = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **env},
    )
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_this_process_reads_what_torch_says():
    assert torch_build_has_gpu() is GPU_BUILD


def test_omniflow_config_imports_torch_only_on_a_gpu_build():
    out = python(
        "import sys\n"
        "from omniflow import cli\n"
        "cli.main(['config'])\n"
        "print('torch imported:', 'torch' in sys.modules)\n"
    )
    assert out.rstrip().endswith(f"torch imported: {GPU_BUILD}")
    if not GPU_BUILD:
        assert "\nplatform:\n  name: cpu\n" in out  # auto resolved without torch


@pytest.mark.parametrize(("cuda", "hip"), [("'12.4'", "None"), ("None", "'6.2'")])
def test_a_gpu_build_is_read_from_its_version_file(tmp_path, cuda, hip):
    """A stand-in torch whose package fails to import: its version file alone is read."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise ImportError('never imported')\n")
    (tmp_path / "torch" / "version.py").write_text(f"cuda = {cuda}\nhip = {hip}\n")
    code = "from omniflow.platforms.base import torch_build_has_gpu as f; print(f())"
    assert python(code, PYTHONPATH=str(tmp_path)).strip() == "True"


@pytest.mark.parametrize(
    ("version", "want"),
    [(None, "True"), ("cuda = None\n", "True"), ("cuda = (\n", "True")],
    ids=["no_version_file", "no_hip_attribute", "unreadable"],
)
def test_a_build_record_missing_or_partial_is_no_crash(tmp_path, version, want):
    """No version.py, one without `hip`, one that does not parse: not the record torch
    writes, so torch itself answers (True: it is imported); `platform=auto` never fails."""
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise ImportError('never imported')\n")
    if version is not None:
        (tmp_path / "torch" / "version.py").write_text(version)
    code = "from omniflow.platforms.base import torch_build_has_gpu as f; print(f())"
    assert python(code, PYTHONPATH=str(tmp_path)).strip() == want
