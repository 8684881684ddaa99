"""/health and /metrics over the replicas from their reports (deploy/overview.py), without a
cluster: a stale replica is unreachable, some down is degraded (200), all down 503; every
series gets its replica label, each family's HELP and TYPE once."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("ray")  # board.py defines a Ray actor class (no cluster started)

from omniflow.deploy.board import STALE_S, Report  # noqa: E402
from omniflow.deploy.overview import current, health, metrics  # noqa: E402

TEXT = """# HELP omniflow_requests_total Speech requests by outcome
# TYPE omniflow_requests_total counter
omniflow_requests_total{outcome="ok"} 3.0
# HELP omniflow_requests_in_flight Speech requests running
# TYPE omniflow_requests_in_flight gauge
omniflow_requests_in_flight 1.0
"""


def report(status: str = "ok", in_flight: int = 1, age_s: float = 0.0) -> Report:
    body = {"status": status, "model": "m", "in_flight": in_flight}
    return Report(body, 200 if status == "ok" else 503, TEXT, age_s)


def answer(reports: dict[str, Report]) -> tuple[int, dict]:
    response = health(reports)
    return response.status_code, json.loads(response.body)


def test_health_sums_and_names_every_replica():
    code, body = answer({"a": report(in_flight=2), "b": report(in_flight=3)})
    assert code == 200 and body["status"] == "ok" and body["in_flight"] == 5
    assert body["replicas"] == {
        "a": {"status": "ok", "in_flight": 2},
        "b": {"status": "ok", "in_flight": 3},
    }


def test_a_stale_or_dead_replica_degrades_and_none_serving_is_503():
    code, body = answer({"a": report(), "b": report(age_s=STALE_S + 1)})
    assert code == 200 and body["status"] == "degraded"
    assert body["replicas"]["b"] == {"status": "unreachable", "last_seen_s": STALE_S + 1}
    code, body = answer({"a": report("unavailable"), "b": report(age_s=STALE_S + 1)})
    assert code == 503 and body["status"] == "unavailable"


def test_metrics_label_every_series_by_replica():
    text = metrics({"a": report(), "b": report(), "c": report(age_s=STALE_S + 1)}).body.decode()
    assert text.count("# TYPE omniflow_requests_total counter") == 1
    assert 'omniflow_requests_total{replica="a",outcome="ok"} 3.0' in text
    assert 'omniflow_requests_in_flight{replica="b"} 1.0' in text
    assert 'omniflow_replica_up{replica="c"} 0' in text and 'replica="c",' not in text


def test_a_replaced_replica_is_dropped_once_enough_report():
    dead = report(age_s=STALE_S + 1)
    assert set(current({"a": report(), "b": dead}, 2)) == {"a", "b"}  # not yet replaced
    assert set(current({"a": report(), "b": dead, "c": report()}, 2)) == {"a", "c"}
