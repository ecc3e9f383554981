"""The smoke tier's session: one kind cluster, both images built and loaded, the chart installed
with its demo Postgres. Skipped, with the reason, where Docker or kind is missing.

QUEUEWORKER_SMOKE_CLUSTER=NAME reuses (and keeps) an existing kind cluster of that name;
otherwise a fresh one is created and deleted at the end.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from tests.cluster.binaries import BinariesUnavailable
from tests.go_tools import HELM, KIND, ensure

from .harness import KindCluster, Smoke, SmokeUnavailable, require_docker


@pytest.fixture(scope="session")
def kind_cluster(tmp_path_factory) -> Iterator[KindCluster]:
    try:
        docker = require_docker()
        kind, helm = ensure(KIND), ensure(HELM)
    except (SmokeUnavailable, BinariesUnavailable) as exc:
        pytest.skip(f"smoke tier needs Docker and kind: {exc}")
    reuse = os.environ.get("QUEUEWORKER_SMOKE_CLUSTER")
    cluster = KindCluster(kind, helm, docker, reuse or f"qw-smoke-{uuid.uuid4().hex[:6]}",
                          tmp_path_factory.mktemp("kind") / "kubeconfig")
    try:
        cluster.create()
        cluster.build_and_load_images()
        cluster.install()
        yield cluster
    finally:
        if not reuse:
            cluster.delete()


@pytest.fixture(scope="session")
def smoke(kind_cluster: KindCluster) -> Iterator[Smoke]:
    with kind_cluster.api() as api:
        harness = Smoke(kind_cluster, api)
        harness.run_cli("migrate")
        yield harness
