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

import os
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


def order_slowest_first(items: list[pytest.Item]) -> dict[str, int]:
    """Sorts `items` (stably) by unit of work: the host's unit first, then units with cluster
    tests, then integration, then the rest. Every process collects in this order, and the
    scheduler hands out units in the order of the collection. Returns each unit's rank in that
    order (0 the host's unit, 1 cluster, 2 integration, 3 the rest)."""
    rank: dict[str, int] = {}
    for item in items:
        unit = unit_of_work(item.nodeid)
        tiers = [i for i, marker in enumerate(SLOWEST_FIRST, start=1) if item.get_closest_marker(marker)]
        rank[unit] = min(rank.get(unit, len(SLOWEST_FIRST) + 1), 0 if unit == HOST_UNIT else min(tiers, default=len(SLOWEST_FIRST) + 1))
    items.sort(key=lambda item: rank[unit_of_work(item.nodeid)])
    return rank


# Session fixtures that only the units up to a rank use, with that rank: the real node only the
# host's unit, the process kubelet's control plane the host's and the cluster units. Since every
# process runs its units in rank order, once a process's next test ranks later it will not use
# them again, and it stops them then rather than at the session's end (what was built on them, the
# CRD or the controller's kubeconfig, goes with them). An idle control plane (API server, etcd,
# controller manager, kubelet) keeps about a tenth of a core busy. Should a later test ask for
# one all the same, pytest starts it anew.
LAST_RANK_USING = {"real_node": 0, "control_plane": 1}
UNIT_RANKS = pytest.StashKey[dict[str, int]]()


def finish_unused_fixtures(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """After `item`'s teardown: finishes each fixture of LAST_RANK_USING that runs here and that
    no test after `item` uses, when the units are ranked (under `-n`, `UNIT_RANKS` in the stash)."""
    ranks = item.config.stash.get(UNIT_RANKS, None)
    request = getattr(item, "_request", None)
    if ranks is None or nextitem is None or request is None:
        return
    next_rank = ranks.get(unit_of_work(nextitem.nodeid), 0)
    for name, last_rank in LAST_RANK_USING.items():
        if next_rank > last_rank and name not in getattr(nextitem, "fixturenames", ()):
            for fixturedef in item.session._fixturemanager.getfixturedefs(name, item) or ():
                fixturedef.finish(request)


def make_scheduler(config: pytest.Config, log: Any) -> Any:
    """xdist's scope scheduler (whole units of work to one process at a time, more as processes
    finish), with `unit_of_work` as the scope, in the order of the collection."""
    from xdist.scheduler import LoadScopeScheduling

    config.option.loadscopereorder = False

    class ModuleOrHostScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit_of_work(nodeid)

    return ModuleOrHostScheduling(config, log)


# The hooks, imported by tests/conftest.py.

def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    check_host_modules(items)
    if os.environ.get("PYTEST_XDIST_WORKER"):
        config.stash[UNIT_RANKS] = order_slowest_first(items)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None):
    """Under `-n`: the control planes stop once this process has no test left that uses them."""
    result = yield
    finish_unused_fixtures(item, nextitem)
    return result


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log):
    """Under `-n`: the host's tests in one process, every other module a unit of its own."""
    return make_scheduler(config, log)
