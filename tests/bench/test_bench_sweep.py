"""`omniflow bench` (one job, or a Hydra-style sweep with -m) and `omniflow sweep summarize`."""

from __future__ import annotations

import json
import subprocess
import sys

from omniflow.bench.sweep import expand

SMALL = [
    "platform=cpu",
    "bench.num_prompts=2",
    "bench.max_frames=4",
    "bench.rounds=1",
    "bench.warmup=0",
]


def omniflow(*args: str, cwd) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "omniflow", *args],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=cwd,
    )


def test_expand_is_the_cartesian_product_of_sweeps():
    jobs, swept = expand(["a.k=0,4", "platform=cpu", "b.c=1,2,3", "s='x,y'"])
    assert swept == ["a.k", "b.c"]
    assert len(jobs) == 6
    assert jobs[0] == ["a.k=0", "platform=cpu", "b.c=1", "s='x,y'"]
    assert jobs[-1] == ["a.k=4", "platform=cpu", "b.c=3", "s='x,y'"]


def test_sweep_writes_one_result_per_job_and_a_summary(tmp_path):
    out = tmp_path / "sweep"
    r = omniflow(
        "bench",
        "-m",
        "pipeline.stages.talker.window_k=0,4",
        *SMALL,
        f"bench.out_dir={out}",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    results = [json.loads((out / str(i) / "result.json").read_text()) for i in range(2)]
    assert [res["config"]["window_k"] for res in results] == [0, 4]
    for res in results:
        assert res["config"]["frames_per_prompt"] == [4, 4]
        assert res["summary"]["rtf"]["median"] > 0
        assert len(res["rounds"]) == 1 and res["rounds"][0]["requests"] == 2
        assert abs(res["rounds"][0]["audio_seconds"] - 2 * 4 * 1920 / 24000) < 1e-9
        assert res["command"].startswith("python -m omniflow bench ") and res["device"]
    assert "pipeline.stages.talker.window_k=4" in results[1]["command"]
    assert results[0]["windows"] is None
    # 4 frames per prompt: the prefill samples 1, one window of 3 steps does the rest
    windows = results[1]["windows"]
    assert windows["executed_windows"] > 0
    assert windows["executed_steps"] == 3 * windows["executed_windows"]
    summary = (out / "summary.md").read_text()
    assert summary.count("\n| 0 |") == 1 and summary.count("\n| 4 |") == 1
    assert (out / "rtf.svg").read_text().startswith("<svg")
    again = omniflow("sweep", "summarize", str(out), cwd=tmp_path)
    assert again.returncode == 0 and "RTF median" in again.stdout
    assert "job 2/2" in r.stderr  # progress is logged


def test_single_bench_run_writes_nothing_without_out_dir(tmp_path):
    r = omniflow("bench", *SMALL, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["rtf"]["median"] > 0
    assert list(tmp_path.iterdir()) == []


def test_invalid_sweep_job_fails_before_anything_runs(tmp_path):
    r = omniflow(
        "bench",
        "-m",
        "pipeline.stages.talker.window_k=0,1",
        *SMALL,
        f"bench.out_dir={tmp_path / 'x'}",
        cwd=tmp_path,
    )
    assert r.returncode == 2 and "window_k" in r.stderr
    assert not (tmp_path / "x").exists()


def test_summarize_needs_a_sweep_directory(tmp_path):
    r = omniflow("sweep", "summarize", str(tmp_path), cwd=tmp_path)
    assert r.returncode == 2 and "result.json" in r.stderr


def test_a_job_records_the_commit_under_test_and_its_command(monkeypatch):
    """A GPU machine's copy of the tree may carry no repository (or a stale one): the
    commit comes from OMNIFLOW_COMMIT when set."""
    from omniflow.bench.job import commit

    monkeypatch.setenv("OMNIFLOW_COMMIT", "abc1234")
    assert commit() == "abc1234"
    monkeypatch.delenv("OMNIFLOW_COMMIT")
    assert commit() != "abc1234"
