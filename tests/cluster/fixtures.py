"""Pytest fixtures for the `cluster` tier: one control plane per session, one namespace per test.

Two clusters, each started on first use and stopped at the session's end:
- `control_plane`: pods run as local processes by the process kubelet (fast, no root, no images);
- `real_node`: pods run in containers on a real node (kubelet, containerd, CNI; root only).
Import them in tests/conftest.py:
    from tests.cluster.fixtures import cluster_namespace, control_plane, ...  # noqa: F401
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
import yaml
from kubernetes import client
from kubernetes.client.rest import ApiException

from queueworker.dev.localpg import LocalPostgres, PostgresNotFound

from .binaries import BINARIES, CONTROL_PLANE_BINARIES, Binary, BinariesUnavailable, ensure_binaries
from .controlplane import ControlPlane
from .node import NodeUnavailable

REQUIRE_ENV = "QUEUEWORKER_REQUIRE_CLUSTER"
CRD_FILE = Path(__file__).resolve().parents[2] / "crds" / "queueworker.dev_queueworkers.yaml"


def required() -> bool:
    """Whether a tier that cannot run is a failure here rather than a skip: in CI (CI=true) or with
    QUEUEWORKER_REQUIRE_CLUSTER=1 (which `.ci/run` sets in CI)."""
    return os.environ.get(REQUIRE_ENV) == "1" or os.environ.get("CI") == "true"


def unavailable(reason: str) -> None:
    """Skip the test with `reason`, or fail it when a tier that cannot run must fail (`required`)."""
    if required():
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


def require_binaries(binaries: tuple[Binary, ...] = CONTROL_PLANE_BINARIES) -> Path:
    """The binaries' directory, built if needed. Skips the test where they can't be built, fails it
    instead in CI (`required`). A cold build takes minutes: prebuild with
    `python -m tests.cluster build` so it does not count against the first test's timeout."""
    try:
        return ensure_binaries(binaries)
    except BinariesUnavailable as e:
        unavailable(f"test control plane unavailable: {e}")


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """The running control plane, started once per session and stopped at its end."""
    bin_dir = require_binaries()
    plane = ControlPlane(tmp_path_factory.mktemp("control-plane"))
    plane.start(bin_dir)
    try:
        yield plane
    finally:
        plane.stop()


def install_crd(plane: ControlPlane) -> None:
    """The QueueWorker CRD in `plane`'s API server, Established."""
    with plane.api_client() as api:
        extensions = client.ApiextensionsV1Api(api)
        manifest = yaml.safe_load(CRD_FILE.read_text())
        try:
            extensions.create_custom_resource_definition(manifest)
        except ApiException as exc:
            if exc.status != 409:
                raise
        plane.wait_for(lambda: any(
            c.type == "Established" and c.status == "True"
            for c in extensions.read_custom_resource_definition(manifest["metadata"]["name"]).status.conditions or []
        ), timeout=30, message="CRD Established")


@pytest.fixture(scope="session")
def crd(control_plane: ControlPlane) -> None:
    """The QueueWorker CRD, created once per session in the test control plane and Established."""
    install_crd(control_plane)


def fresh_namespace(plane: ControlPlane) -> Iterator[str]:
    """A fresh namespace of `plane` (its default ServiceAccount exists), deleted afterwards without waiting."""
    name = plane.create_namespace()
    yield name
    with plane.api_client() as api:
        client.CoreV1Api(api).delete_namespace(name)


@pytest.fixture
def cluster_namespace(control_plane: ControlPlane) -> Iterator[str]:
    """A fresh namespace on the control plane, deleted after the test without waiting."""
    yield from fresh_namespace(control_plane)


@pytest.fixture(scope="session")
def real_node(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    """A cluster of its own whose pods run in containers on a real node, for tests that need a
    runtime: images (`load_image`, nothing can be pulled), volumes, security contexts, resources,
    signals through the runtime, pod networking (pods reach this machine at `node_ip`). Skipped
    (failed in CI) where it cannot run: not root, packages or images unavailable."""
    bin_dir = require_binaries(BINARIES)
    plane = ControlPlane(tmp_path_factory.mktemp("real-node"), node=True)
    try:
        plane.start(bin_dir)
    except NodeUnavailable as e:
        unavailable(f"real node unavailable: {e}")
    try:
        yield plane
    finally:
        plane.stop()


@pytest.fixture
def real_node_namespace(real_node: ControlPlane) -> Iterator[str]:
    """A fresh namespace on the real node's cluster, deleted after the test without waiting."""
    yield from fresh_namespace(real_node)


@dataclass(frozen=True)
class NodePostgres:
    server: LocalPostgres
    pod_dsn: str  # the superuser's URL as pods must use it: the node's IP instead of loopback

    @property
    def dsn(self) -> str:
        return self.server.dsn


@contextmanager
def postgres_for_pods(plane: ControlPlane) -> Iterator[NodePostgres]:
    """A throwaway Postgres that the real node's pods reach: it listens on the node's IP as well as on
    loopback (pods' 127.0.0.1 is their own), and pg_hba admits the pod subnet with a password, and the
    node's IP itself: a process on this machine (a controller under test) can then use the pods' URL.
    Raises PostgresNotFound where no Postgres is installed."""
    server = LocalPostgres(extra_settings={"listen_addresses": f"'127.0.0.1,{plane.node_ip}'"})
    server.start()
    try:
        with (server.data_dir / "pg_hba.conf").open("a") as hba:
            hba.write(f"host all all {plane.pod_subnet} scram-sha-256\n"
                      f"host all all {plane.node_ip}/32 scram-sha-256\n")
        with psycopg.connect(server.dsn, autocommit=True) as conn:
            conn.execute("SELECT pg_reload_conf()")
        yield NodePostgres(server, server.dsn.replace("@127.0.0.1:", f"@{plane.node_ip}:"))
    finally:
        server.destroy()


@pytest.fixture(scope="session")
def node_postgres(real_node: ControlPlane) -> Iterator[NodePostgres]:
    """`postgres_for_pods` of the real node, for the whole session."""
    with ExitStack() as stack:
        try:
            postgres = stack.enter_context(postgres_for_pods(real_node))
        except PostgresNotFound as e:
            unavailable(str(e))
        yield postgres
