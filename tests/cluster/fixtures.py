"""Pytest fixtures for the `cluster` tier: one control plane per session, one namespace per test.

Import them in tests/conftest.py:
    from tests.cluster.fixtures import cluster_namespace, control_plane  # noqa: F401
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client

from .binaries import BinariesUnavailable, ensure_binaries
from .controlplane import ControlPlane

REQUIRE_ENV = "QUEUEWORKER_REQUIRE_CLUSTER"


def require_binaries() -> Path:
    """The binaries' directory, built if needed. Skips the test where they can't be built, fails it
    instead when QUEUEWORKER_REQUIRE_CLUSTER=1 (CI). A cold build takes minutes: prebuild with
    `python -m tests.cluster build` so it does not count against the first test's timeout."""
    try:
        return ensure_binaries()
    except BinariesUnavailable as e:
        reason = f"test control plane unavailable: {e}"
        if os.environ.get(REQUIRE_ENV) == "1":
            pytest.fail(reason, pytrace=False)
        pytest.skip(reason)


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


@pytest.fixture
def cluster_namespace(control_plane: ControlPlane) -> Iterator[str]:
    """A fresh namespace (its default ServiceAccount exists), deleted after the test without waiting."""
    name = control_plane.create_namespace()
    yield name
    with control_plane.api_client() as api:
        client.CoreV1Api(api).delete_namespace(name)
