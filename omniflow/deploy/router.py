"""`deploy.router=least_loaded`: Ray Serve's request router customised through its public
extension point (`ray.serve.request_router.RequestRouter`, set on the deployment with
`RequestRouterConfig`). It runs where Serve routes (its HTTP proxy) and ranks the replicas
by their own gauges (deploy/load.py), because the default power of two choices compares
in-flight counts that lag a burst: requests sent at once went 5:1 to one of two replicas."""

from __future__ import annotations

import time
from typing import Any

from ray.serve.config import RequestRouterConfig
from ray.serve.request_router import (
    PendingRequest,
    ReplicaID,
    RequestRouter,
    RunningReplica,
)

from omniflow.deploy.load import REPORT_S, STALE_S, Gauges, Ledger, rank

ROUTERS = ("least_loaded", "default")


class LeastLoadedRouter(RequestRouter):
    """Every replica in its own rank, least loaded first: Serve sends the request to the
    first that accepts it (one at `max_ongoing_requests` refuses and the next is tried)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.ledger = Ledger()

    async def choose_replicas(
        self,
        candidate_replicas: list[RunningReplica],
        pending_request: PendingRequest | None = None,
    ) -> list[list[RunningReplica]]:
        by_name = {r.replica_id.unique_id: r for r in candidate_replicas}
        reports = [(name, Gauges.of(r.routing_stats)) for name, r in by_name.items()]
        ranked = rank(self.ledger, reports, time.time())
        if ranked and pending_request is not None:
            # counted at once, so the next request of a burst sees it
            self.ledger.reserve(pending_request.metadata.internal_request_id, ranked[0])
        return [[by_name[name]] for name in ranked]

    def on_request_routed(
        self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any
    ) -> None:
        self.ledger.routed(pending_request.metadata.internal_request_id, replica_id.unique_id)

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        self.ledger.completed(internal_request_id)

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self.ledger.forget(replica_id.unique_id)


def router_config(router: str) -> RequestRouterConfig:
    """The deployment's `request_router_config` for `deploy.router`: least_loaded has each
    replica report its gauges every REPORT_S; default keeps Serve's own router and period."""
    if router == "default":
        return RequestRouterConfig()
    return RequestRouterConfig(
        request_router_class=LeastLoadedRouter,
        request_routing_stats_period_s=REPORT_S,
        request_routing_stats_timeout_s=STALE_S,
    )
