"""`omniflow bench` (one job, or a Hydra multirun sweep with -m) and `omniflow sweep summarize`."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from omniflow import cli
from omniflow.bench.job import load_in_child
from omniflow.bench.sweep import sweep_jobs
from omniflow.provenance import tree_fingerprint

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


def test_sweep_jobs_are_hydras_cartesian_product():
    jobs = sweep_jobs(["a.k=0,4", "platform=cpu", "b.c=1,2,3", "s='x,y'"])
    assert len(jobs) == 6
    assert jobs[0] == ["a.k=0", "platform=cpu", "b.c=1", "s='x,y'"]
    assert jobs[-1] == ["a.k=4", "platform=cpu", "b.c=3", "s='x,y'"]


def test_sweep_writes_one_result_per_job_and_a_summary(tmp_path, capsys):
    out = tmp_path / "sweep"
    r = omniflow(
        "bench",
        "-m",
        "pipeline.stages.talker.window_k=0,4",
        # fixed-length windows: slack sizing follows the wall clock (a fresh server's first
        # streams get single steps until a step is measured)
        "pipeline.stages.talker.playback_margin_ms=null",
        *SMALL,
        f"bench.out_dir={out}",
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stderr
    results = [json.loads((out / str(i) / "result.json").read_text()) for i in range(2)]
    assert [res["config"]["window_k"] for res in results] == [0, 4]
    # different stage graphs: each job built its own pipeline
    assert [res["config"]["pipeline_reused"] for res in results] == [False, False]
    for res in results:
        assert res["config"]["frames_per_prompt"] == [4, 4]
        assert res["config"]["codec_dtype"] == "float32"  # the CPU's; CUDA's is float16
        assert res["config"]["runtime"] == "in_process"  # the CPU's; CUDA's is process
        assert res["tree"] == tree_fingerprint()  # the build measured, commit or not
        assert res["summary"]["rtf"]["median"] > 0
        assert len(res["rounds"]) == 1 and res["rounds"][0]["requests"] == 2
        # the served streams carry exactly the frames asked for: none fails the length check
        assert res["rounds"][0]["completed"] == 2 and res["summary"]["failed"] == 0
        assert abs(res["rounds"][0]["audio_seconds"] - 2 * 4 * 1920 / 24000) < 1e-9
        assert res["command"].startswith("python -m omniflow bench ") and res["device"]
        # every step of the served stage, by kind: the prompts' prefill is a mixed step, the
        # rest decode steps (a window counted once)
        kinds = res["steps"]["talker"]
        assert kinds["mixed_step"]["count"] >= 1 and kinds["decode_step"]["count"] >= 1
        # phases only when asked; the wait for each step's audio always (every step of the
        # fused talker makes audio)
        assert set(kinds) == {"mixed_step", "decode_step", "audio_wait"}
        steps = kinds["mixed_step"]["count"] + kinds["decode_step"]["count"]
        assert kinds["audio_wait"]["count"] == steps
        assert res["config"]["phase_timing"] == "steps"
        assert kinds["decode_step"]["median_ms"] > 0 and kinds["mixed_step"]["total_s"] > 0
        # the server's first audio of the job's 2 requests, in parts that add up to it
        first = res["first_audio_parts"]
        assert first["requests"] == 2
        parts = first["intake_ms"] + first["made_ms"] + first["delivery_ms"]
        assert all(first[f"{p}_ms"] > 0 for p in ("intake", "made", "delivery"))
        assert abs(parts - first["total_ms"]) < 1e-6
    assert "pipeline.stages.talker.window_k=4" in results[1]["command"]
    assert results[0]["windows"] is None
    # K=0: each of the 3 frames after the prefill's is its own decode step, for both prompts
    # (together or apart); K=4: windows, each one decode step
    assert results[0]["steps"]["talker"]["decode_step"]["count"] >= 3
    # 4 frames per prompt: the prefill samples 1, one window of 3 steps does the rest
    windows = results[1]["windows"]
    assert windows["executed_windows"] > 0
    assert windows["executed_steps"] == 3 * windows["executed_windows"]
    assert windows["cut_windows"] == 0  # read from /metrics; two lanes, no arrival mid-window
    assert "arrival_steps" in windows and windows["audio_cycles"] == 0  # from /metrics too
    summary = (out / "summary.md").read_text()
    assert summary.count("\n| 0 | 0 |") == 1 and summary.count("\n| 4 | 0 |") == 1
    assert "| pipeline.stages.talker.window_k | failed |" in summary
    assert "![median RTF and worst underrun per job](rtf.png)" in summary
    assert (out / "rtf.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "RTF median" in r.stdout and f"results: {out}" in r.stdout  # the callback ran
    # Hydra ran the jobs: its launcher's log, its per-job record, the job's log file
    assert "Launching 2 jobs locally" in r.stderr
    # stderr is a file here: no bar frames (they ran into the log lines, issue 36), a line
    # per job instead; every line a log line of its own
    assert "sweep: job 2 of 2 done" in r.stderr and "\r" not in r.stderr
    assert all(line[:4].isdigit() or not line for line in r.stderr.splitlines()), r.stderr
    assert (out / "1" / ".hydra" / "overrides.yaml").is_file()
    assert "round 1/1" in (out / "1" / "bench.log").read_text()
    assert "first audio, server side (mean of 2 requests)" in (out / "1" / "bench.log").read_text()
    again = omniflow("sweep", "summarize", str(out), cwd=tmp_path)
    assert again.returncode == 0 and "RTF median" in again.stdout
    # running the same command again would overwrite these results: refused before Hydra
    # runs anything, untouched (the command's own entry point, in this process: the
    # refusal comes before any job, and a child would spend its time importing torch)
    before = (out / "0" / "result.json").read_bytes()
    argv = ["bench", "-m", "pipeline.stages.talker.window_k=0,4", *SMALL, f"bench.out_dir={out}"]
    assert cli.main(argv) == 2 and "already holds 2 job results" in capsys.readouterr().err
    assert (out / "0" / "result.json").read_bytes() == before


def test_single_bench_run_writes_nothing_without_out_dir(tmp_path):
    r = omniflow("bench", *SMALL, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["rtf"]["median"] > 0
    assert list(tmp_path.iterdir()) == []


def test_invalid_sweep_job_fails_before_anything_runs(tmp_path, capsys):
    """Every job is checked before Hydra runs the first (`omniflow bench`'s entry point, in
    this process: nothing runs, so a child would only add its imports)."""
    argv = ["bench", "-m", "pipeline.stages.talker.window_k=0,1", *SMALL]
    r = cli.main([*argv, f"bench.out_dir={tmp_path / 'x'}"])
    assert r == 2 and "window_k" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_summarize_needs_a_sweep_directory(tmp_path):
    r = omniflow("sweep", "summarize", str(tmp_path), cwd=tmp_path)
    assert r.returncode == 2 and "result.json" in r.stderr


def test_a_job_records_the_commit_under_test_and_its_command(monkeypatch):
    """A GPU machine's copy of the tree may carry no repository (or a stale one): the
    commit comes from OMNIFLOW_COMMIT when set."""
    from omniflow.provenance import commit

    monkeypatch.setenv("OMNIFLOW_COMMIT", "abc1234")
    assert commit() == "abc1234"
    monkeypatch.delenv("OMNIFLOW_COMMIT")
    assert commit() != "abc1234"


def test_hydra_cfg_job_prints_a_jobs_config_without_running_it(tmp_path):
    r = omniflow("bench", "--cfg", "job", "bench.concurrency=3", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "concurrency: 3" in r.stdout and "pipeline:" in r.stdout
    assert list(tmp_path.iterdir()) == []  # nothing ran, nothing written


def test_summary_plots_rtf_and_underrun_side_by_side(tmp_path, monkeypatch):
    """Two jobs' results -> a PNG with both panels, an RTF = 1 line and legends."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    from omniflow.bench.plot import Point, plot_sweep

    captured = {}
    real_savefig = plt.Figure.savefig

    def spy(fig, path, **kwargs):
        captured["axes"] = fig.axes
        return real_savefig(fig, path, **kwargs)

    monkeypatch.setattr(plt.Figure, "savefig", spy)
    points = [Point("c=1", "0", 0.2, 0.0), Point("c=1", "8", 0.3, 0.1)]
    path = plot_sweep(points, "window_k", tmp_path / "p.png")
    assert path is not None and path.read_bytes()[:4] == b"\x89PNG"
    rtf, under = captured["axes"]
    assert [t.get_text() for t in rtf.get_xticklabels()] == ["0", "8"]
    assert any(tuple(line.get_ydata()) == (1.0, 1.0) for line in rtf.get_lines())
    labels = [t.get_text() for t in rtf.get_legend().get_texts()]
    assert "c=1" in labels and "RTF = 1 (real time)" in labels
    assert "underrun" in under.get_ylabel() and under.get_legend() is not None


def test_a_failing_load_generator_fails_the_job():
    """The client runs as a child process; its failure (here: nothing listens, so the warm-up
    fails; a measured request that fails is recorded instead) is the job's."""
    with pytest.raises(RuntimeError, match="load generator failed"):
        load_in_child(["--url=http://127.0.0.1:9", "--num-prompts=1", "--warmup=1"])


def test_device_phase_timing_adds_every_phase_of_the_served_steps(tmp_path, capsys):
    """`bench.phase_timing=device`: the forward, prefill, sample and audio phases of the
    served stage are timed too (one synchronised time per call); a wrong value names the key.
    The job runs through `omniflow bench`'s entry point in this process (the command line
    as a child: test_single_bench_run_writes_nothing_without_out_dir)."""
    out = tmp_path / "job"
    assert cli.main(["bench", *SMALL, "bench.phase_timing=device", f"bench.out_dir={out}"]) == 0
    res = json.loads((out / "result.json").read_text())
    assert res["config"]["phase_timing"] == "device"
    kinds = res["steps"]["talker"]
    phases = {"forward", "prefill", "prefill_embed", "prefill_layout", "sample", "audio"}
    phases |= {"plan_state", "decode_layout", "record"}
    assert phases | {"decode_step", "mixed_step"} <= set(kinds)
    # every step samples and decodes audio once; a mixed step runs one prefill forward (and
    # its decode rows' forward when it has any), a decode step one forward
    steps = kinds["decode_step"]["count"] + kinds["mixed_step"]["count"]
    assert kinds["sample"]["count"] == steps and kinds["audio"]["count"] == steps
    assert kinds["prefill"]["count"] == kinds["prefill_layout"]["count"]
    assert kinds["prefill_embed"]["count"] == kinds["prefill"]["count"]
    assert kinds["prefill"]["count"] == kinds["mixed_step"]["count"]
    assert kinds["forward"]["count"] >= kinds["decode_step"]["count"]
    # every plan's state is applied before its step; every decode step lays its rows out;
    # without windows (this CPU job) every sampling is read back and recorded once (in a
    # window a step queued ahead of a stop is sampled again, not recorded twice)
    assert kinds["plan_state"]["count"] >= steps
    assert kinds["decode_layout"]["count"] >= kinds["decode_step"]["count"]
    assert kinds["record"]["count"] == kinds["sample"]["count"] == steps
    capsys.readouterr()
    assert cli.main(["bench", *SMALL, "bench.phase_timing=gpu"]) == 2
    assert "bench.phase_timing" in capsys.readouterr().err


def test_the_warm_ups_run_first_and_count_nowhere(tmp_path):
    """Warm-ups run in a load-generator call of their own before the measured rounds: the
    server-side first audio, the window counters and the talker's ms/frame cover the
    measured requests only (a first request pays one-off costs: with one round they once
    made the c1 mean 87 ms against 14)."""
    from omniflow.bench.job import run_job
    from omniflow.config.compose import compose

    args = ["platform=cpu", "bench.num_prompts=2", "bench.max_frames=4", "bench.rounds=1"]
    warm = [*args, "bench.warmup=3", "pipeline.stages.talker.window_k=2"]
    result = run_job(compose(warm), warm, None)
    first = result["first_audio_parts"]
    assert first["requests"] == 2  # the 2 measured requests, none of the 3 warm-ups
    parts = first["intake_ms"] + first["made_ms"] + first["delivery_ms"]
    assert abs(parts - first["total_ms"]) < 1e-6
    # made, split where the talker seated them: waiting for a seat, then the steps
    assert first["split_requests"] == 2
    assert abs(first["queued_ms"] + first["steps_ms"] - first["made_ms"]) < 1e-6
    # delivery, split where the request's handler took the audio off its queue
    assert first["handoff_ms"] > 0 and first["response_ms"] > 0
    assert abs(first["handoff_ms"] + first["response_ms"] - first["delivery_ms"]) < 1e-6
    # 2 requests x 4 frames: the first frame of each comes from its prefill, the other 3 from
    # windows of 2 (one window of 2 and one of 1, or merged across rows): never the warm-ups'
    assert result["windows"]["executed_steps"] <= 2 * 3
    assert result["steps"]["talker"]["mixed_step"]["count"] <= 2
    assert sum(r["completed"] for r in result["rounds"]) == 2
    # ms/frame over the measured frames only: 2 x 4, not the warm-ups' 3 x 4 besides
    assert result["served_frames"] == 8 and result["talker_ms_per_frame"] > 0


def test_a_job_without_a_frame_cap_asks_each_prompt_for_its_own_length(tmp_path):
    """`bench.max_frames` unset (the default): every prompt asks for its own frame count,
    and the load generator, which takes 0 as "no cap", is not handed the string 'None'."""
    from omniflow.bench.client import DEFAULT_PROMPTS, load_prompts
    from omniflow.bench.job import run_job
    from omniflow.config.compose import compose

    args = ["platform=cpu", "bench.num_prompts=1", "bench.rounds=1", "bench.warmup=0"]
    result = run_job(compose(args), args, None)
    want = [p.frames for p in load_prompts(DEFAULT_PROMPTS, 1)]
    assert result["config"]["frames_per_prompt"] == want and want[0] > 4
    assert result["rounds"][0]["completed"] == 1 and result["summary"]["failed"] == 0


def test_the_summary_says_how_many_windows_ran():
    from omniflow.bench.sweep import windows_cell

    assert windows_cell({}) == "-"
    assert windows_cell({"executed_windows": 12, "executed_steps": 96}) == "12 (96)"
    cut = {"executed_windows": 12, "executed_steps": 60, "cut_windows": 5}
    assert windows_cell(cut) == "12 (60), 5 cut"
    alone = {**cut, "arrival_steps": 7}
    assert windows_cell(alone) == "12 (60), 5 cut, 7 arrival steps"
    held = {**alone, "audio_cycles": 9}
    assert windows_cell(held) == "12 (60), 5 cut, 7 arrival steps, 9 held-audio cycles"


def test_the_summary_names_the_decoders_dtype_once_or_per_job():
    from omniflow.bench.sweep import precision

    def job(codec: str | None) -> dict:
        cfg = {"dtype": "bfloat16"} | ({} if codec is None else {"codec_dtype": codec})
        return {"config": cfg}

    assert precision([job("float16"), job("float16")]) == "bfloat16, decoder float16"
    assert precision([job("float16"), job("float32")]) == "bfloat16, decoder per job"
    assert precision([job(None)]) == "bfloat16"  # a result from before it was recorded
