"""How the suite shares one machine between several pytest processes (pytest-xdist's `-n`, which
`.ci/run` uses).

Every process has its own Postgres server, control plane (on free ports) and temp directory, so
most test modules may run side by side. What the machine has only one of may not: the real node
(its kubelet, containerd, CNI and the host directories under /run and /var/lib they own, and the
service networking only one node per machine runs), and the Docker engine with the images it
holds, which the image tier and the real node's image imports share. The modules that use them
(`HOST_MODULES`) form one unit of work that goes to one process and runs there one test after
another; every other module is a unit of its own, so its module-scoped fixtures start once.

xdist's own `--dist loadgroup` would do this from an `xdist_group` mark, but it tells the workers
by renaming each test's node id, which pytest 9.2 no longer lets a plugin do; the scheduler here
needs only the module paths. `check_host_modules` keeps the list true: a test that asks for one of
the host's fixtures outside these modules fails the collection.
"""

from __future__ import annotations

from typing import Any

import pytest

HOST_MODULES = frozenset({
    "tests/smoke/test_smoke.py",
    "tests/test_images.py",
    "tests/test_real_node.py",
    "tests/test_worker_pods_real_node.py",
})
HOST_UNIT = "the host's real node and container engine"
# The fixtures that reach them (tests/cluster/fixtures.py, tests/containers/fixtures.py,
# tests/smoke/conftest.py).
HOST_FIXTURES = frozenset({"real_node", "real_node_namespace", "node_postgres", "container_engine", "images",
                           "containers", "smoke_cluster", "smoke"})


def unit_of_work(nodeid: str) -> str:
    """The unit a test is scheduled in: its module, or HOST_UNIT for the host's modules."""
    module = nodeid.split("::", 1)[0]
    return HOST_UNIT if module in HOST_MODULES else module


def check_host_modules(items: list[pytest.Item]) -> None:
    """Fails the collection when a test outside HOST_MODULES uses one of HOST_FIXTURES."""
    strays = sorted({item.nodeid.split("::", 1)[0] for item in items
                     if HOST_FIXTURES.intersection(getattr(item, "fixturenames", ()))} - HOST_MODULES)
    if strays:
        raise pytest.UsageError(f"{', '.join(strays)} use the host's real node or container engine: add them to "
                                "tests/parallel.py's HOST_MODULES so that they never run beside the others")


# Units of work go out in this order: the slowest kinds first, so that none starts near the end.
SLOWEST_FIRST = ("cluster", "integration")


def order_slowest_first(items: list[pytest.Item]) -> None:
    """Sorts `items` (stably) by unit of work: the host's unit first, then units with cluster
    tests, then integration, then the rest. Every process collects in this order, and the
    scheduler hands out units in the order of the collection."""
    rank: dict[str, int] = {}
    for item in items:
        unit = unit_of_work(item.nodeid)
        tiers = [i for i, marker in enumerate(SLOWEST_FIRST, start=1) if item.get_closest_marker(marker)]
        rank[unit] = min(rank.get(unit, len(SLOWEST_FIRST) + 1), 0 if unit == HOST_UNIT else min(tiers, default=len(SLOWEST_FIRST) + 1))
    items.sort(key=lambda item: rank[unit_of_work(item.nodeid)])


def make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's scope scheduler (whole units of work to one process at a time, more as processes
    finish), with `unit_of_work` as the scope, in the order of the collection."""
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False

    class ModuleOrHostScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of_work(nodeid)

    return ModuleOrHostScheduling(config, log)
