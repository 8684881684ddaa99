"""`benchmarks.open_loop_table`: the rows of an `open_loop_runs.sh` directory, a failed
client shown as failed, closed-loop rounds summarised per variant and concurrency."""

from __future__ import annotations

import json

from benchmarks.open_loop_table import closed_rows, table


def open_summary(p50: float, stalled: int, rejected: int = 0) -> dict:
    return {
        "requests": 100,
        "succeeded": 100 - rejected,
        "rejected": rejected,
        "first_audio_ms": {"p50": p50, "p95": p50 * 2, "p99": p50 * 3},
        "underrun_requests": stalled,
        "server": {"commit": "3e9f80a318e9a143df031be1fc0ff21f1f934cdd", "tree": "a873d4c96261"},
    }


def closed(throughput: float, failed: int = 0) -> dict:
    return {"summary": {"audio_throughput": throughput, "failed": failed}, "samples": []}


def test_open_and_closed_rows(tmp_path):
    (tmp_path / "new_rps20.json").write_text(json.dumps(open_summary(30.0, 0)))
    (tmp_path / "new_rps5.json").write_text(json.dumps(open_summary(10.0, 1, rejected=4)))
    (tmp_path / "new_rps20_requests.json").write_text("{}")  # timelines: not a row
    (tmp_path / "hc_ac8_rps40.json").write_text("")  # the client died: no summary
    for r, t in ((1, 500.0), (2, 520.0), (3, 510.0)):
        (tmp_path / f"new_c128_r{r}.json").write_text(json.dumps(closed(t, failed=r - 1)))
    (tmp_path / "old_c1_r1.json").write_text(json.dumps(closed(14.5)))
    (tmp_path / "old_c1_r2.json").write_text("")
    lines = table(tmp_path).splitlines()
    assert lines[2] == "| hc_ac8 | 40 | failed: no summary (see its .err) | | | | |"
    # rates in numeric order within a variant, refusals and stalls of the succeeded
    assert (
        lines[3] == "| new | 5 | 100 | 4 | 10.0 / 20.0 / 30.0 | 1 of 96 | 3e9f80a / a873d4c96261 |"
    )
    assert lines[4].startswith("| new | 20 | 100 | 0 | 30.0 / 60.0 / 90.0 | 0 of 100 |")
    assert "| new | c128 | 3 | 510.00 (500.00-520.00) | 3 |" in lines
    assert "| old | c1 | 2, 1 round(s) without a summary | 14.50 | 0 |" in lines


def test_closed_rounds_are_grouped_by_variant_and_concurrency(tmp_path):
    for name, t in (("a_c32_r1", 1.0), ("a_c32_r2", 3.0), ("a_c128_r1", 5.0), ("b_c32_r1", 7.0)):
        (tmp_path / f"{name}.json").write_text(json.dumps(closed(t)))
    rows = {(r["label"], r["concurrency"]): sorted(r["throughput"]) for r in closed_rows(tmp_path)}
    assert rows == {("a", 32): [1.0, 3.0], ("a", 128): [5.0], ("b", 32): [7.0]}


def test_an_empty_directory_says_so(tmp_path):
    assert table(tmp_path) == f"no open_loop_runs.sh results in {tmp_path}"
