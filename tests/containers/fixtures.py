"""Pytest fixtures for the `image` tier: a running engine and the images, once per session.

Import them in tests/conftest.py:
    from tests.containers.fixtures import container_engine, images  # noqa: F401

Where no engine can run (not root, no apt, debootstrap refused) the tests skip with the reason;
in CI (CI=true or QUEUEWORKER_REQUIRE_CLUSTER=1) they fail instead. A Dockerfile that does not
build always fails. A cold build takes minutes and counts against the first test's timeout:
run `python -m tests.containers build` first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import pytest

from tests.cluster.fixtures import unavailable

from . import ContainersUnavailable
from .engine import Engine, ensure_engine
from .images import Images, ensure_images

T = TypeVar("T")


def require(get: Callable[[], T]) -> T:
    try:
        return get()
    except ContainersUnavailable as exc:
        unavailable(f"container engine unavailable: {exc}")


@pytest.fixture(scope="session")
def container_engine() -> Engine:
    return require(ensure_engine)


@pytest.fixture(scope="session")
def images(container_engine: Engine) -> Images:
    return require(lambda: ensure_images(container_engine))
