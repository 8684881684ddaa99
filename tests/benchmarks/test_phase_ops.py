"""`benchmarks.phase_ops`: a phase's host time op by op, on a hand-made trace."""

from __future__ import annotations

import gzip
import json

import pytest

from benchmarks.phase_ops import main, phase_ops


def x(cat: str, name: str, ts: float, dur: float, tid: int = 1) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": 1, "tid": tid}


def rng(phase: str, ts: float, dur: float, tid: int = 1) -> dict:
    return x("user_annotation", f"omniflow.talker.{phase}", ts, dur, tid)


EVENTS = [
    # a mixed step's sample phase: 1,000 us, two outermost ops (one holding another)
    rng("mixed_step", 0, 5000),
    rng("sample", 1000, 1000),
    x("cpu_op", "aten::linear", 1100, 500),
    x("cpu_op", "aten::addmm", 1150, 400),  # inside aten::linear: not counted again
    x("cpu_op", "aten::index_put_", 1700, 200),
    x("cpu_op", "aten::linear", 2500, 300),  # after the range: not its op
    # a decode step's sample phase: 600 us, one op; outside the mixed step
    rng("decode_step", 6000, 2000),
    rng("sample", 6200, 600),
    x("cpu_op", "aten::linear", 6300, 100),
    # another thread: its op does not count in this thread's range
    x("cpu_op", "aten::fill_", 1920, 50, tid=2),
]


def test_the_outermost_ops_of_each_range_and_the_time_between_them():
    got = phase_ops(EVENTS, "talker.mixed_step>talker.sample")
    assert got["ranges"] == 1 and got["mean_ms"] == pytest.approx(1.0)
    assert [(r["op"], r["calls"], r["ms"]) for r in got["ops"]] == [
        ("aten::linear", 1.0, pytest.approx(0.5)),
        ("aten::index_put_", 1.0, pytest.approx(0.2)),
    ]
    assert got["between_ms"] == pytest.approx(0.3)  # 1,000 - 500 - 200 us


def test_a_single_name_takes_every_range_and_averages_per_range():
    got = phase_ops(EVENTS, "talker.sample", top=1)
    assert got["ranges"] == 2 and got["mean_ms"] == pytest.approx(0.8)
    assert got["ops"] == [{"op": "aten::linear", "calls": 1.0, "ms": pytest.approx(0.3)}]
    assert got["other_ms"] == pytest.approx(0.1)  # index_put_'s 200 us over 2 ranges
    assert got["between_ms"] == pytest.approx((300 + 500) / 2 / 1e3)


def test_no_such_phase_gives_no_ranges():
    assert phase_ops(EVENTS, "talker.audio")["ranges"] == 0


def test_the_command_reads_a_gzipped_trace(tmp_path, capsys):
    path = tmp_path / "t.json.gz"
    path.write_bytes(gzip.compress(json.dumps({"traceEvents": EVENTS}).encode()))
    main([str(path), "talker.mixed_step>talker.sample"])
    out = capsys.readouterr().out
    assert "1 ranges, 1.000 ms each" in out and "aten::index_put_" in out
