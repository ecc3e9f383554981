"""The smoke tier's package: one cluster from the chosen provider (harness.py: `kind` or the local
real `node`), both images built and loaded, the chart installed with its demo Postgres.

Where the provider cannot run (kind: no Docker engine, no kind, or kind's node image neither present
nor pullable; node: not root, or the node's packages or images cannot be had) the tests skip with the
reason; in CI (CI=true, or QUEUEWORKER_REQUIRE_CLUSTER=1, which `.ci/run` sets there) they fail.
With kind, QUEUEWORKER_SMOKE_CLUSTER=NAME reuses (and keeps) an existing cluster of that name;
otherwise a fresh one is created and deleted at the end.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from tests.cluster.binaries import BINARIES, BinariesUnavailable
from tests.cluster.fixtures import require_binaries, unavailable
from tests.cluster.node import NodeUnavailable
from tests.containers import ContainersUnavailable
from tests.containers.engine import ensure_engine
from tests.go_tools import HELM, KIND, ensure

from .harness import KindCluster, NodeCluster, Smoke, SmokeCluster, SmokeUnavailable, chosen_provider, require_docker


def make_cluster(provider: str, tmp_path_factory: pytest.TempPathFactory) -> SmokeCluster:
    helm = ensure(HELM)
    kubeconfig = tmp_path_factory.mktemp(provider) / "kubeconfig"
    if provider == "node":
        return NodeCluster(helm, kubeconfig, bin_dir=require_binaries(BINARIES),
                           state_dir=tmp_path_factory.mktemp("smoke-node"), engine=ensure_engine())
    reuse = os.environ.get("QUEUEWORKER_SMOKE_CLUSTER")
    return KindCluster(helm, kubeconfig, kind=ensure(KIND), docker=require_docker(),
                       name=reuse or f"qw-smoke-{uuid.uuid4().hex[:6]}", reuse=bool(reuse))


@pytest.fixture(scope="package")
def smoke_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SmokeCluster]:
    try:
        cluster = make_cluster(chosen_provider(), tmp_path_factory)
    except (SmokeUnavailable, BinariesUnavailable, ContainersUnavailable) as exc:
        unavailable(f"smoke tier unavailable: {exc}")
    try:
        try:
            cluster.create()
        except (NodeUnavailable, SmokeUnavailable) as exc:
            unavailable(f"smoke tier unavailable ({chosen_provider()} provider): {exc}")
        cluster.load_images()
        cluster.install()
        yield cluster
    finally:
        cluster.delete()


@pytest.fixture(scope="package")
def smoke(smoke_cluster: SmokeCluster) -> Iterator[Smoke]:
    with smoke_cluster.api() as api:
        harness = Smoke(smoke_cluster, api)
        harness.run_cli("migrate")
        yield harness
