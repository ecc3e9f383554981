"""How the suite is split between pytest processes (tests/parallel.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import parallel

ROOT = Path(__file__).resolve().parent.parent
pytest_plugins = ["pytester"]


class Item:
    """What the ordering and the check read of a collected test."""

    def __init__(self, nodeid: str, fixturenames: tuple[str, ...] = (), markers: tuple[str, ...] = ()):
        self.nodeid, self.fixturenames, self._markers = nodeid, fixturenames, markers

    def get_closest_marker(self, name: str) -> object | None:
        return name if name in self._markers else None


def test_the_host_modules_exist_and_are_one_unit_every_other_module_its_own():
    assert all((ROOT / module).is_file() for module in parallel.HOST_MODULES)
    assert {parallel.unit_of_work(f"{module}::test_x[a]") for module in parallel.HOST_MODULES} == {parallel.HOST_UNIT}
    assert parallel.unit_of_work("tests/test_cli.py::test_a") == "tests/test_cli.py"
    assert parallel.unit_of_work("tests/test_cli.py::test_b[x::y]") == "tests/test_cli.py"


def test_units_go_out_host_first_then_cluster_then_integration_then_the_rest_each_in_collection_order():
    items = [Item("tests/test_a.py::t1"), Item("tests/test_b.py::t1", markers=("integration",)),
             Item("tests/test_c.py::t1"), Item("tests/test_c.py::t2", markers=("cluster", "integration")),
             Item("tests/test_real_node.py::t1", markers=("cluster",)), Item("tests/test_b.py::t2"),
             Item("tests/test_d.py::t1", markers=("integration",))]
    parallel.order_slowest_first(items)  # type: ignore[arg-type]
    assert [item.nodeid for item in items] == [
        "tests/test_real_node.py::t1", "tests/test_c.py::t1", "tests/test_c.py::t2", "tests/test_b.py::t1",
        "tests/test_b.py::t2", "tests/test_d.py::t1", "tests/test_a.py::t1"]


def test_a_test_that_reaches_the_host_outside_the_host_modules_fails_the_collection():
    parallel.check_host_modules([Item("tests/test_real_node.py::t", ("real_node",))])  # type: ignore[list-item]
    with pytest.raises(pytest.UsageError, match="tests/test_new.py use the host's real node"):
        parallel.check_host_modules([Item("tests/test_new.py::t", ("dsn", "images"))])  # type: ignore[list-item]


CONFTEST = """
import pytest

from tests.parallel import pytest_collection_modifyitems, pytest_runtest_teardown, pytest_xdist_make_scheduler

EVENTS = []


@pytest.fixture(scope="session")
def control_plane():
    EVENTS.append("started")
    yield
    EVENTS.append("stopped")


@pytest.fixture
def plane_events():
    return EVENTS
"""


def test_a_process_stops_the_control_plane_after_its_last_cluster_test(pytester, monkeypatch):
    """Under -n, the suite's own hooks (tests/parallel.py's, which tests/conftest.py imports) stop the session's control plane before the first test of a
    later rank, not at the session's end; a cluster module's tests that do not use it keep it."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    pytester.makeconftest(CONFTEST)
    pytester.makeini("[pytest]\nmarkers =\n    cluster: c\n    integration: i\n")
    pytester.makepyfile(
        test_a_cluster="""
            import pytest
            pytestmark = pytest.mark.cluster
            def test_uses_it(control_plane, plane_events):
                assert plane_events == ["started"]
            def test_beside_it(plane_events):
                assert plane_events == ["started"]
            def test_uses_it_again(control_plane, plane_events):
                assert plane_events == ["started"]
        """,
        test_b_integration="""
            import pytest
            @pytest.mark.integration
            def test_after(plane_events):
                assert plane_events == ["started", "stopped"]
        """,
        test_c_rest="""
            def test_later_still(plane_events):
                assert plane_events == ["started", "stopped"]
        """)
    result = pytester.runpytest_subprocess("-n", "1", "-p", "no:cacheprovider", "-p", "no:hypothesispytest",
                                           "-p", "no:anyio")
    result.assert_outcomes(passed=5)
