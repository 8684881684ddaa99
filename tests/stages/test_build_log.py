"""The build says where its time went: one INFO line per stage (a GPU build takes about a
minute), and on CUDA one per family of captured graphs (`tests/cuda/test_build_log_cuda.py`)."""

from __future__ import annotations

import logging
import re

from tests.factories import build, tiny_bundle


def test_each_stage_logs_its_build_time(caplog):
    with caplog.at_level(logging.INFO, logger="omniflow.build.pipeline"):
        orch = build("qwen3_tts", bundle=tiny_bundle())
        orch.stop()
    lines = [r.getMessage() for r in caplog.records if r.name == "omniflow.build.pipeline"]
    stages = [
        m.group(1) for line in lines if (m := re.fullmatch(r"stage (\w+) built in \d+\.\d s", line))
    ]
    assert stages == ["talker", "code2wav"], lines
