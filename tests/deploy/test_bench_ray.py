"""`omniflow bench deploy=ray`: the same job, load generator and result.json against a Ray
Serve deployment of two replicas of the tiny model, on the session's shared cluster. The
server-side figures come from the deployment's merged /metrics, summed over the replicas
and given per replica; what a deployment cannot give (the step kinds) is null, with why.
One deployment for both jobs (`bench.reuse_pipeline`, the default, keeps it): ~20 s on
two cores, most of it the replicas' builds."""

from __future__ import annotations

import importlib.util
import json

import pytest

from omniflow import cli
from omniflow.bench.client import FRAME_RATE

JOB = ["bench", "platform=cpu", "deploy=ray", "deploy.replicas=2", "server.log_level=warning"]
JOB += ["bench.max_frames=4", "bench.warmup=0"]
# routing and the replicas' counts are the subject, not admission by deadline: two replicas on
# a shared 2-core machine can step slower than their audio and would refuse (503)
JOB += ["server.max_first_audio_wait_s=null"]
CLOSED = ["bench.num_prompts=4", "bench.concurrency=4", "bench.rounds=1"]
OPEN = ["bench.rps=4", "bench.duration_s=1", "bench.warmup_s=0"]


def run(tmp_path, name: str, *more: str) -> dict:
    out = tmp_path / name
    assert cli.main([*JOB, *more, f"bench.out_dir={out}"]) == 0
    return json.loads((out / "result.json").read_text())


@pytest.mark.ray
def test_closed_and_open_loop_jobs_on_two_replicas(ray_cluster, tmp_path):
    from omniflow.bench.ray_kept import KEPT

    try:
        closed = run(tmp_path, "closed", *CLOSED)
        opened = run(tmp_path, "open", *OPEN)
    finally:
        KEPT.close()  # the replicas' CPUs back to the shared cluster
    check_closed_loop(closed)
    assert opened["config"]["pipeline_reused"] is True  # the deployment the first job kept
    loop, replicas = opened["open_loop"], opened["replicas"]
    assert loop["succeeded"] == loop["requests"] > 0
    # the server counts the whole open-loop run: the measured requests are among them
    assert sum(r["requests"] for r in replicas.values()) >= loop["requests"]
    assert opened["first_audio_parts"]["requests"] == sum(r["requests"] for r in replicas.values())
    assert opened["steps"] is None and "replicas' processes" in opened["nulls"]["steps"]


def check_closed_loop(result: dict) -> None:
    """4 requests of 4 frames at concurrency 4: the burst reaches both replicas (least_loaded
    splits it), and the replicas' own counts add up to what the load generator saw."""
    assert result["config"]["deploy"] == {
        "name": "ray",
        "replicas": 2,
        "resources_per_replica": {"CPU": 1.0},
        "address": None,
        "router": "least_loaded",
    }
    assert result["config"]["pipeline_reused"] is False
    summary, replicas = result["summary"], result["replicas"]
    assert summary["completed"] == 4 and summary["failed"] == 0
    assert len(replicas) == 2 and all(r["requests"] >= 1 for r in replicas.values()), replicas
    assert sum(r["requests"] for r in replicas.values()) == 4
    assert sum(r["first_audio_requests"] for r in replicas.values()) == 4
    assert result["first_audio_parts"]["requests"] == 4
    served_audio = sum(r["audio_s"] for r in replicas.values())
    assert result["served_frames"] == 16 == round(served_audio * FRAME_RATE)
    assert result["rounds"][0]["audio_seconds"] == pytest.approx(served_audio)
    throughput = result["rounds"][0]["audio_seconds"] / result["rounds"][0]["wall_s"]
    assert summary["audio_throughput"]["median"] == pytest.approx(throughput)
    assert result["talker_ms_per_frame"] > 0
    assert result["prefills"]["steps"] >= 2  # at least one prefill step on each replica
    assert result["steps"] is None and set(result["nulls"]) == {"steps"}


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["bench.phase_timing=device"], "bench.phase_timing: device synchronises"),
        (["-m", "bench.phase_timing=device"], "bench.phase_timing: device synchronises"),
        (["deploy.replicas=3"], "deploy.replicas: 3 replicas x CPU: 1 = 3 CPUs"),
    ],
)
def test_what_a_deployment_cannot_do_is_refused_in_one_line(capsys, monkeypatch, argv, words):
    monkeypatch.setattr("os.cpu_count", lambda: 2)
    monkeypatch.setattr("omniflow.deploy.preflight.require_ray", lambda: None)  # CI: no Ray
    assert cli.main(["bench", "platform=cpu", "deploy=ray", *argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and words in err, err


def test_bench_without_ray_is_one_line(capsys, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "ray" else real(name, *a)
    )
    assert cli.main(["bench", "platform=cpu", "deploy=ray"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "deploy: deploy=ray needs Ray Serve" in err, err
