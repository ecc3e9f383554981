"""kopf's own writes (finalizers, its annotations, status patches, Events) wait for the lead like
the controller's: a replica whose lead lapsed makes none of them, and its reads and watches go on."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import kopf
import pytest
from kopf._cogs.clients import api as kopf_api
from kubernetes import client
from kubernetes.client.rest import ApiException

from queueworker_controller.leader import ElectionTiming, LeaderElector, NotLeading, guard_kopf_writes


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FreeLease:
    """The Lease API of a cluster where the Lease does not exist yet: the first attempt takes it."""

    def read_namespaced_lease(self, *args: Any, **kwargs: Any) -> None:
        raise ApiException(status=404)

    def create_namespaced_lease(self, *args: Any, **kwargs: Any) -> None:
        pass


class Response:
    async def __aenter__(self) -> "Response":
        return self

    async def __aexit__(self, *exc: object) -> None:
        pass

    async def json(self) -> dict[str, Any]:
        return {}


@pytest.fixture
def sent(monkeypatch) -> list[str]:
    """The requests kopf hands to its HTTP session, recorded instead of sent."""
    requests: list[str] = []

    async def record(method: str, url: str, **_: Any) -> Response:
        requests.append(f"{method.upper()} {url}")
        return Response()

    monkeypatch.setattr(kopf_api, "request", record)
    return requests


def test_kopf_writes_only_while_the_replica_leads(sent):
    clock, lost = Clock(), []
    leader = LeaderElector(client.ApiClient(), "system", "lease", "a", ElectionTiming(8, 5, 1), monotonic=clock,
                           on_lost=lambda: lost.append("a"))
    leader._leases = FreeLease()
    assert leader.try_acquire_or_renew()
    guard_kopf_writes(leader)
    settings, logger = kopf.OperatorSettings(), logging.getLogger("test")

    async def patch_and_post() -> None:
        await kopf_api.patch("/apis/queueworker.dev/v1/namespaces/n/queueworkers/q", payload={},
                             settings=settings, logger=logger)
        await kopf_api.post("/api/v1/namespaces/n/events", payload={}, settings=settings, logger=logger)

    asyncio.run(patch_and_post())
    assert [line.split()[0] for line in sent] == ["PATCH", "POST"]

    clock.now += 5.0  # the renew deadline passed without a renewal
    sent.clear()
    with pytest.raises(NotLeading):
        asyncio.run(kopf_api.patch("/apis/queueworker.dev/v1/namespaces/n/queueworkers/q", payload={},
                                   settings=settings, logger=logger))
    with pytest.raises(NotLeading):
        asyncio.run(kopf_api.delete("/api/v1/namespaces/n/events/e", settings=settings, logger=logger))
    assert sent == [] and lost == ["a", "a"], "no write left, and each attempt stopped the replica"
    asyncio.run(kopf_api.get("/apis/queueworker.dev/v1/queueworkers", settings=settings, logger=logger))
    assert sent == ["GET /apis/queueworker.dev/v1/queueworkers"], "reads go on"
