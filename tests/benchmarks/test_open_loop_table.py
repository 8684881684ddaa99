"""`benchmarks.open_loop_table`: the rows of an `open_loop_runs.sh` directory, a failed
client shown as failed, closed-loop rounds summarised per variant and concurrency."""

from __future__ import annotations

import json

import pytest

from benchmarks.open_loop_table import closed_rows, table


def open_summary(p50: float, stalled: int, rejected: int = 0, **more) -> dict:
    return more | {
        "requests": 100,
        "succeeded": 100 - rejected,
        "rejected": rejected,
        "first_audio_ms": {"p50": p50, "p95": p50 * 2, "p99": p50 * 3},
        "underrun_requests": stalled,
        "server": {"commit": "3e9f80a318e9a143df031be1fc0ff21f1f934cdd", "tree": "a873d4c96261"},
    }


def closed(throughput: float, failed: int = 0, steady: float | None = None) -> dict:
    summary = {"audio_throughput": throughput, "failed": failed}
    if steady is not None:  # a client from before the steady state has no such key
        summary["steady"] = {"audio_throughput": steady, "ttfp_mean_s": steady / 1e4}
    return {"summary": summary, "samples": []}


def test_open_and_closed_rows(tmp_path):
    (tmp_path / "new_rps20.json").write_text(json.dumps(open_summary(30.0, 0)))
    (tmp_path / "new_rps5.json").write_text(
        json.dumps(open_summary(10.0, 1, rejected=4, rejected_ms={"p50": 3.0, "p95": 12.3}))
    )
    (tmp_path / "new_rps20_requests.json").write_text("{}")  # timelines: not a row
    (tmp_path / "hc_ac8_rps40.json").write_text("")  # the client died: no summary
    for r, t in ((1, 500.0), (2, 520.0), (3, 510.0)):
        (tmp_path / f"new_c128_r{r}.json").write_text(
            json.dumps(closed(t, failed=r - 1, steady=t + 100))
        )
    (tmp_path / "old_c1_r1.json").write_text(json.dumps(closed(14.5)))
    (tmp_path / "old_c1_r2.json").write_text("")
    lines = table(tmp_path).splitlines()
    assert lines[2] == "| hc_ac8 | 40 | failed: no summary (see its .err) | | | | |"
    # rates in numeric order within a variant, refusals (and how fast, where the summary has
    # it) and stalls of the succeeded
    assert lines[3] == (
        "| new | 5 | 100 | 4 (p95 12 ms) | 10.0 / 20.0 / 30.0 | 1 of 96 | 3e9f80a / a873d4c96261 |"
    )
    assert lines[4].startswith("| new | 20 | 100 | 0 | 30.0 / 60.0 / 90.0 | 0 of 100 |")
    # steady state: median (spread) of the rounds' figures, their mean first audio (61 ms)
    assert (
        "| new | c128 | 3 | 510.00 (500.00-520.00) | 610.00 (600.00-620.00), first audio 61 ms"
        " | 3 |" in lines
    )
    assert "| old | c1 | 2, 1 round(s) without a summary | 14.50 | - | 0 |" in lines


def test_closed_rounds_are_grouped_by_variant_and_concurrency(tmp_path):
    for name, t in (("a_c32_r1", 1.0), ("a_c32_r2", 3.0), ("a_c128_r1", 5.0), ("b_c32_r1", 7.0)):
        (tmp_path / f"{name}.json").write_text(json.dumps(closed(t)))
    rows = {(r["label"], r["concurrency"]): sorted(r["throughput"]) for r in closed_rows(tmp_path)}
    assert rows == {("a", 32): [1.0, 3.0], ("a", 128): [5.0], ("b", 32): [7.0]}


def test_an_empty_directory_says_so(tmp_path):
    assert table(tmp_path) == f"no open_loop_runs.sh results in {tmp_path}"


def metrics_text(
    first: list[tuple[float, float, float, float]], cut: int, alone: int, replica: str | None = None
) -> str:
    """A server's /metrics with `first` audios as (intake, queued, steps, delivery) seconds,
    delivery split 3:1 into handoff and response (`replica`: every series labelled as a Ray
    deployment's merged /metrics labels them)."""
    from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

    r = CollectorRegistry()
    extra = {} if replica is None else {"replica": replica}
    names = list(extra)

    def hist(name: str) -> Histogram:
        h = Histogram(f"omniflow_first_audio{name}_seconds", "h", names, registry=r)
        return h.labels(**extra) if extra else h

    total, intake, made, delivery = hist(""), hist("_intake"), hist("_made"), hist("_delivery")
    queued, steps = hist("_queued"), hist("_steps")
    handoff, response = hist("_handoff"), hist("_response")
    for i, q, s, d in first:
        for h, v in ((total, i + q + s + d), (intake, i), (made, q + s), (delivery, d)):
            h.observe(v)
        queued.observe(q)
        steps.observe(s)
        handoff.observe(0.75 * d)
        response.observe(0.25 * d)
    for name, value in (("cut", cut), ("arrival_steps", alone), ("executed", 10 + cut)):
        c = Counter(f"omniflow_window_{name}", "c", ["stage", *names], registry=r)
        c.labels(stage="talker", **extra).inc(value)
    return generate_latest(r).decode()


EARLIER = [(0.001, 0.5, 0.5, 0.001)]  # a slow request of an earlier rate: not this one's
THIS = [(0.001, 0.002, 0.020, 0.003), (0.003, 0.004, 0.040, 0.001)]
ROW = "| 2 | 37.0 | 2.0 | 33.0 = 3.0 + 30.0 | 2.0 = 1.5 + 0.5 | 4 | 5 | 5 |"


def test_the_servers_part_of_a_rate_is_its_readings_difference(tmp_path):
    """Per rate, the server's first audio in parts over that rate's requests only: the
    reading after it less the one before (the server's earlier rates), window counts too."""
    (tmp_path / "new_rps20.json").write_text(json.dumps(open_summary(30.0, 0)))
    (tmp_path / "new_rps20.before.metrics").write_text(metrics_text(EARLIER, cut=3, alone=1))
    (tmp_path / "new_rps20.metrics").write_text(metrics_text(EARLIER + THIS, cut=8, alone=5))
    (tmp_path / "new_rps40.metrics").write_text(metrics_text(THIS, cut=1, alone=1))  # no before
    lines = table(tmp_path).splitlines()
    assert lines[-1] == "| new | 20 " + ROW
    assert not any(line.startswith("| new | 40 | 2 |") for line in lines)


def test_a_dead_server_a_ray_deployment_and_an_older_tree(tmp_path):
    """A server that died leaves an empty reading: its row says so and the others stand; a
    Ray deployment's replicas are summed; counters an older tree lacks show as "-"."""
    (tmp_path / "dead_rps20.before.metrics").write_text(metrics_text(EARLIER, cut=0, alone=0))
    (tmp_path / "dead_rps20.metrics").write_text("")
    ray_before = metrics_text(EARLIER, 3, 1, replica="0") + metrics_text([], 0, 0, replica="1")
    ray_after = metrics_text(EARLIER + THIS[:1], 5, 3, replica="0") + metrics_text(
        THIS[1:], 3, 2, replica="1"
    )
    (tmp_path / "ray_rps20.before.metrics").write_text(ray_before)
    (tmp_path / "ray_rps20.metrics").write_text(ray_after)

    def older(text: str) -> str:  # a tree from before the window counters and delivery split
        gone = ("omniflow_window_", "_handoff_", "_response_")
        return "\n".join(line for line in text.splitlines() if not any(g in line for g in gone))

    (tmp_path / "old_rps20.before.metrics").write_text(older(metrics_text([], 0, 0)))
    (tmp_path / "old_rps20.metrics").write_text(older(metrics_text(THIS, 0, 0)))
    lines = table(tmp_path).splitlines()
    assert "| dead | 20 | - | - | - | - | - | - | - | - |" in lines
    assert "| ray | 20 " + ROW in lines
    assert "| old | 20 | 2 | 37.0 | 2.0 | 33.0 = 3.0 + 30.0 | 2.0 | - | - | - |" in lines


def fake_tree(root, name: str, crash: bool = False):
    """A tree whose `python -m omniflow serve` writes its pid to `root/NAME.pid`, says it is
    ready and waits for SIGINT (`crash`: exits instead, as a server dying after its build)."""
    package = root / name / "omniflow"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    wait = "" if crash else "try:\n    signal.pause()\nexcept KeyboardInterrupt:\n    pass\n"
    (package / "__main__.py").write_text(
        f"import os, signal\nopen({str(root / name)!r} + '.pid', 'w').write(str(os.getpid()))\n"
        "print('omniflow ready', flush=True)\n" + wait
    )
    return root / name


def alive(root, name: str) -> bool:
    import os

    pid = int((root / f"{name}.pid").read_text())
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def run_script(tmp_path, order: str, *variants: str, together: str = ""):
    import os
    import subprocess
    from pathlib import Path

    script = Path(__file__).parents[2] / "benchmarks" / "open_loop_runs.sh"
    env = {**os.environ, "RATES": "", "ORDER": order}  # no rates: servers start and stop
    env["TOGETHER"] = together
    return subprocess.run(
        ["bash", str(script), str(tmp_path / "out"), *variants],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_abba_runs_each_variant_first_once_and_last_once(tmp_path):
    a, b = fake_tree(tmp_path, "a"), fake_tree(tmp_path, "b")
    r = run_script(tmp_path, "abba", f"old,{a}", f"new,{b}")
    assert r.returncode == 0, r.stderr
    timing = (tmp_path / "out" / "timing.txt").read_text().splitlines()
    ready = [line.split()[0] for line in timing if " ready after " in line]
    assert ready == ["old_1", "new_1", "new_2", "old_2"]
    assert not list((tmp_path / "out").glob("*_rps*"))  # RATES="" runs no rate
    assert run_script(tmp_path, "abab", f"old,{a}").returncode == 2


def test_together_starts_each_server_once_then_measures_them_in_order(tmp_path):
    a, b = fake_tree(tmp_path, "a"), fake_tree(tmp_path, "b")
    r = run_script(tmp_path, "abba", f"old,{a}", f"new,{b}", together="1")
    assert r.returncode == 0, r.stderr
    events = [
        line.split()[:2] for line in (tmp_path / "out" / "timing.txt").read_text().splitlines()
    ]
    assert events[:2] == [["old", "ready"], ["new", "ready"]]  # both built before any measure
    assert [e[0] for e in events if e[1] == "measured"] == ["old_1", "new_1", "new_2", "old_2"]
    assert sorted(e[0] for e in events if e[1] == "done") == ["new", "old"]  # both stopped
    logs = sorted(p.name for p in (tmp_path / "out").glob("serve_*.log"))
    assert logs == ["serve_new.log", "serve_old.log"]  # one start each
    assert run_script(tmp_path, "", f"old,{a}", together="yes").returncode == 2
    assert not alive(tmp_path, "a") and not alive(tmp_path, "b")


def test_together_skips_a_server_that_died_and_stops_the_others(tmp_path):
    live, crash = fake_tree(tmp_path, "live"), fake_tree(tmp_path, "crash", crash=True)
    r = run_script(tmp_path, "", f"gone,{crash}", f"up,{live}", together="1")
    assert r.returncode == 0, r.stderr
    timing = (tmp_path / "out" / "timing.txt").read_text()
    assert "gone died after" in timing and "up measured after" in timing
    assert "gone measured" not in timing and not alive(tmp_path, "live")


@pytest.mark.parametrize("together", ["", "1"])
def test_bad_variants_are_refused_before_any_server_starts(tmp_path, together):
    live = fake_tree(tmp_path, "live")
    for bad, words in (
        ((f"up,{live}", f"up,{live}"), "the label up is given twice"),
        ((f"up,{live}", f"down,{tmp_path / 'nowhere'}"), "holds no omniflow/"),
    ):
        r = run_script(tmp_path, "", *bad, together=together)
        assert r.returncode == 2 and words in r.stderr, r.stderr
        assert not (tmp_path / "live.pid").exists()  # nothing was started


def test_both_orders_side_by_side(tmp_path):
    (tmp_path / "old_1_rps20.json").write_text(json.dumps(open_summary(30.0, 0)))  # p95 60
    (tmp_path / "old_2_rps20.json").write_text(json.dumps(open_summary(20.0, 0)))  # p95 40
    (tmp_path / "new_1_rps20.json").write_text(json.dumps(open_summary(25.0, 0)))  # alone
    for name, t in (("old_1_c128_r1", 300.0), ("old_1_c128_r2", 310.0), ("old_2_c128_r1", 330.0)):
        (tmp_path / f"{name}.json").write_text(json.dumps(closed(t)))
    lines = table(tmp_path).splitlines()
    assert "| old | 20 req/s p95 ms | 60.00 | 40.00 | 50.00 |" in lines
    assert "| old | c128 audio-s/s | 305.00 | 330.00 | 317.50 |" in lines
    assert not any(line.startswith("| new | 20 req/s") for line in lines)  # one pass only
