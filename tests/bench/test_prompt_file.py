"""Benchmark prompt files: a bad file is one line naming the file, the line and the field,
from the bench (before a model is built) and from the standalone load generators."""

from __future__ import annotations

import subprocess
import sys

import pytest

from omniflow import cli
from omniflow.bench import job, open_loop
from omniflow.bench.prompt_file import PromptFileError, read_prompt_rows


def write(tmp_path, *lines: str):
    path = tmp_path / "prompts.jsonl"
    path.write_text("".join(line + "\n" for line in lines))
    return path


@pytest.mark.parametrize(
    ("lines", "message"),
    [
        (['{"text": "a", "seconds": 1}', "not json"], "line 2: not JSON"),
        (['["a", 1]'], "line 1: a JSON object is expected"),
        (['{"seconds": 1}'], "line 1: 'text' must be a non-empty string"),
        (['{"text": " ", "seconds": 1}'], "line 1: 'text' must be a non-empty string"),
        (['{"text": "a"}'], "line 1: 'seconds' must be a positive number (missing)"),
        (['{"text": "a", "seconds": "5"}'], "'seconds' must be a positive number ('5')"),
        (['{"text": "a", "seconds": 0}'], "'seconds' must be a positive number (0)"),
        (['{"text": "a", "seconds": true}'], "'seconds' must be a positive number (True)"),
        ([], "holds no prompts"),
    ],
)
def test_a_bad_line_is_named(tmp_path, lines, message):
    path = write(tmp_path, *lines)
    with pytest.raises(PromptFileError) as err:
        read_prompt_rows(path, need_seconds=True)
    assert str(err.value).startswith(str(path)) and message in str(err.value)


def test_rows_without_seconds_serve_natural_length_runs_and_blank_lines_are_skipped(tmp_path):
    path = write(tmp_path, '{"id": "x", "text": "one"}', "", '{"text": "two", "seconds": 2.5}')
    rows = read_prompt_rows(path, need_seconds=False)
    assert [(r.text, r.seconds) for r in rows] == [("one", None), ("two", 2.5)]
    # a limit stops reading there: a bad line after it is not this run's concern
    bad_later = write(tmp_path, '{"text": "one", "seconds": 1}', "not json")
    assert len(read_prompt_rows(bad_later, need_seconds=True, limit=1)) == 1


def test_a_missing_file_or_a_directory(tmp_path):
    with pytest.raises(PromptFileError, match="nofile.jsonl does not exist"):
        read_prompt_rows(tmp_path / "nofile.jsonl", need_seconds=False)
    with pytest.raises(PromptFileError, match="is a directory"):
        read_prompt_rows(tmp_path, need_seconds=False)


def refuse_builds(monkeypatch):
    def build(*_args, **_kwargs):
        raise AssertionError("a model was built before the prompt file was checked")

    monkeypatch.setattr(job, "bench_graph", build)
    monkeypatch.setattr(open_loop, "bench_graph", build)


@pytest.mark.parametrize("multirun", [False, True])
def test_bench_refuses_a_bad_prompt_file_in_one_line_before_building(
    tmp_path, monkeypatch, capsys, multirun
):
    refuse_builds(monkeypatch)
    path = write(tmp_path, '{"text": "hi"}')
    argv = ["bench", f"bench.prompts={path}", "bench.num_prompts=1", "bench.rounds=1"]
    if multirun:
        argv = ["bench", "-m", *argv[1:], "bench.concurrency=1,2", f"bench.out_dir={tmp_path}/s"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert f"bench.prompts: {path}: line 1: 'seconds' must be a positive number" in err
    assert "Traceback" not in err


def test_an_open_loop_takes_text_only_rows_past_its_warm_ups(tmp_path, monkeypatch):
    """Natural length needs no `seconds`; the warm-ups (fixed-length, the first
    `bench.warmup` lines) do."""
    path = write(tmp_path, '{"text": "a", "seconds": 1}', '{"text": "b"}')
    refuse_builds(monkeypatch)
    args = ["bench.rps=1", "bench.duration_s=1", f"bench.prompts={path}"]
    for warmup in (0, 1):
        with pytest.raises(AssertionError, match="a model was built"):  # past the check
            cli.main(["bench", *args, f"bench.warmup={warmup}"])
    assert cli.main(["bench", *args, "bench.warmup=2"]) == 2  # line 2 warms up too


def test_a_round_larger_than_the_file_names_the_key(tmp_path, monkeypatch, capsys):
    refuse_builds(monkeypatch)
    path = write(tmp_path, '{"text": "hi", "seconds": 1}')
    argv = ["bench", f"bench.prompts={path}", "bench.num_prompts=2", "bench.rounds=1"]
    assert cli.main(argv) == 2
    assert "bench.num_prompts: a round needs 2 prompts" in capsys.readouterr().err


@pytest.mark.parametrize("module", ["omniflow.bench.client", "omniflow.bench.open_client"])
def test_the_load_generators_refuse_a_bad_file_in_one_line(tmp_path, module):
    path = write(tmp_path, "not json")
    extra = ["--rps", "1"] if module.endswith("open_client") else []
    r = subprocess.run(
        [sys.executable, "-m", module, "--prompts", str(path), *extra],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert f"--prompts: {path}: line 1: not JSON" in r.stderr


def test_the_client_without_a_server_says_so_in_one_line(tmp_path):
    r = subprocess.run(
        [sys.executable, "-m", "omniflow.bench.client", "--url", "http://127.0.0.1:9"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 1 and "Traceback" not in r.stderr
    assert "a warm-up request to http://127.0.0.1:9 failed (ConnectError" in r.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["omniflow.bench.client", "--num-prompts", "2", "--warmup", "0"],
        ["omniflow.bench.open_client", "--rps", "5", "--duration-s", "1", "--warmup-s", "0"],
    ],
)
def test_a_run_whose_requests_failed_exits_non_zero_and_says_why(tmp_path, args):
    """Measured requests that failed (no server) end the run with EXIT_SOME_FAILED and the
    first error; the results file is written all the same (`omniflow bench` reads it)."""
    from omniflow.bench.client import EXIT_SOME_FAILED

    out = tmp_path / "out.json"
    r = subprocess.run(
        [sys.executable, "-m", *args, "--url", "http://127.0.0.1:9", "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == EXIT_SOME_FAILED, r.stderr
    assert "ConnectError" in r.stderr.splitlines()[-1] and out.is_file()


def test_the_client_refuses_a_round_of_no_prompts():
    r = subprocess.run(
        [sys.executable, "-m", "omniflow.bench.client", "--num-prompts", "0"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "--num-prompts must be at least 1" in r.stderr


def test_a_sweep_hands_hydra_its_prompt_files_as_absolute_paths(tmp_path, monkeypatch):
    """A job may run in a directory of its own (`hydra.job.chdir=true`)."""
    from omniflow.bench.app import absolute_prompts

    monkeypatch.chdir(tmp_path)
    got = absolute_prompts(["bench.prompts=a.jsonl,sub/b.jsonl", "bench.prompts=null", "x=1"])
    assert got == [
        f"bench.prompts={tmp_path / 'a.jsonl'},{tmp_path / 'sub' / 'b.jsonl'}",
        "bench.prompts=null",
        "x=1",
    ]
