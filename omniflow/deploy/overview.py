"""`GET /health` and `GET /metrics` over every replica, answered by whichever replica takes
the request: its own state now, the others' from the board (deploy/board.py, at most
`REPORT_S` old). Everything else goes to the replica's app unchanged.

`/health`: the body `omniflow serve` answers (`status`, `model`, `in_flight`, the sum over
the replicas) plus `replicas`, each replica's own answer by id, or `unreachable` with the
seconds since it was last heard from (until as many replicas as deployed report again: Ray
Serve restarts a dead one under a new id); `status` is `ok` when every replica is, `degraded`
(still 200) when some are not, `unavailable` (503) when none is.

`/metrics`: every replica's series with a `replica` label, each family's HELP and TYPE once,
plus `omniflow_replica_up{replica}` (1: reported within `STALE_S`)."""

from __future__ import annotations

import asyncio
import re
from typing import Any

from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST
from ray.exceptions import RayError

from omniflow.deploy.board import STALE_S, Report

_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?( .*)$")
BOARD_TIMEOUT_S = 2.0


class Overview:
    """ASGI middleware: GET /health and /metrics over all replicas. `own()` is this
    replica's state now, as a `Report`."""

    def __init__(self, app: Any, name: str, board: Any, own: Any, replicas: int) -> None:
        self.app, self.name, self.board, self.own = app, name, board, own
        self.replicas = replicas

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        path = scope.get("path")
        if scope["type"] != "http" or scope["method"] != "GET" or path not in PATHS:
            await self.app(scope, receive, send)
            return
        try:
            reports = await asyncio.wait_for(self.board.snapshot.remote(), BOARD_TIMEOUT_S)
        except (TimeoutError, RayError):  # no board: this replica alone, said so below
            reports = {}
        reports = current({**reports, self.name: self.own()}, self.replicas)
        await PATHS[path](reports)(scope, receive, send)


def current(reports: dict[str, Report], replicas: int) -> dict[str, Report]:
    """The reports without the unheard-from replicas once as many replicas as deployed are
    reporting (Ray Serve has replaced the dead ones, under new ids)."""
    fresh = {n: r for n, r in reports.items() if r.age_s <= STALE_S}
    return fresh if len(fresh) >= replicas else reports


def health(reports: dict[str, Report]) -> JSONResponse:
    replicas: dict[str, dict] = {}
    for name, report in sorted(reports.items()):
        if report.age_s > STALE_S:
            replicas[name] = {"status": "unreachable", "last_seen_s": round(report.age_s, 1)}
        else:
            replicas[name] = {k: v for k, v in report.health.items() if k != "model"}
    serving = [n for n, r in replicas.items() if r["status"] == "ok"]
    status = "ok" if len(serving) == len(replicas) else "degraded" if serving else "unavailable"
    model = next(iter(r.health.get("model") for r in reports.values()), None)
    body = {
        "status": status,
        "model": model,
        "in_flight": sum(r.get("in_flight", 0) for r in replicas.values()),
        "replicas": replicas,
    }
    return JSONResponse(body, status_code=200 if serving else 503)


def metrics(reports: dict[str, Report]) -> Response:
    heads: dict[str, list[str]] = {}
    samples: dict[str, list[str]] = {}
    up = []
    for name, report in sorted(reports.items()):
        fresh = report.age_s <= STALE_S
        up.append(f'omniflow_replica_up{{replica="{name}"}} {int(fresh)}')
        if fresh:
            _label(name, report.metrics, heads, samples)
    lines = [
        "# HELP omniflow_replica_up 1 if the replica reported within the last "
        f"{STALE_S:g} s (deploy=ray)",
        "# TYPE omniflow_replica_up gauge",
        *up,
    ]
    for family, head in heads.items():
        lines += head + samples[family]
    return Response("\n".join(lines) + "\n", media_type=CONTENT_TYPE_LATEST)


def _label(name: str, text: str, heads: dict, samples: dict) -> None:
    """One replica's exposition text into `heads` and `samples` by family, each sample
    labelled `replica="name"`."""
    family = None
    for line in text.splitlines():
        if line.startswith("# "):
            parts = line.split(" ", 3)
            if len(parts) >= 3 and parts[1] in ("HELP", "TYPE"):
                family = parts[2]
                head = heads.setdefault(family, [])
                if line not in head:
                    head.append(line)
                samples.setdefault(family, [])
            continue
        match = _SAMPLE.match(line)
        if match is None or family is None:
            continue
        metric, labels, rest = match.groups()
        labels = f'replica="{name}"' + (f",{labels}" if labels else "")
        samples[family].append(f"{metric}{{{labels}}}{rest}")


PATHS = {"/health": health, "/metrics": metrics}
