"""A circuit breaker per key, and each key's health (docs/flow-control.md, migration 022): the claim
passes over a key whose breaker is open and over the keys a worker holds back itself, probes it once
after its cooldown; reports keep each key's failure streak and last success and failure, and move
its breaker; bad settings are refused in one line; a worker of an earlier version claims nothing
from a queue with per-key breakers; and real worker processes open a failing key's breaker while
another key's tasks keep running, probe it, close it, and get past a worker killed mid-probe."""

from __future__ import annotations

import signal
import urllib.request
import uuid
from collections import Counter
from pathlib import Path

import psycopg
import pytest
from prometheus_client.parser import text_string_to_metric_families

from queueworker import enqueue_many
from queueworker.client import keys as key_reports
from queueworker.client import operations
from queueworker.client.producer import TaskSpec
from queueworker.db import statements
from queueworker.db.flow import RECORD_KEY_OUTCOMES, RecordKeyOutcomesParams
from queueworker.db.lease import (CLAIM_FAIR, CLAIM_KEYS, CLAIM_LIMITED, CLAIM_LIMITED_FAIR, ClaimParams,
                                  KeyClaimParams, LockQueueParams)
from queueworker.db.statements import Statement
from queueworker.dev.localpg import free_port
from tests.support import FAST_LEASES, WorkerProcess, query, scalar, wait_until
from tests.test_cli import qw_here
from tests.test_key_limits import CLAIM_LIMITED_FAIR_V20, claim_with, keyed

pytestmark = pytest.mark.integration

HANDLERS = ("--handlers", "tests.flow_handlers")
# CLAIM_KEYS as a worker of schema version 21 runs it, after its LOCK_KEYS.
CLAIM_KEYS_V21 = (Path(__file__).parent / "fixtures" / "claim_keys_v21.sql").read_text()
LOCK_KEYS_V21 = "SELECT queueworker.lock_key_limited_queue(%(queue)s)"


def claim_keys(conn: psycopg.Connection, queue: str, limit: int = 100, held: tuple[str, ...] = ()) -> list[str]:
    """One claim of the queue as a worker of this version makes it: the keys claimed, in order."""
    with conn.transaction():
        conn.execute("SELECT queueworker.lock_key_limited_queue(%s, true)", (queue,))
        return [row.key or "-" for row in statements.fetch(conn, CLAIM_KEYS, KeyClaimParams(
            queue=queue, limit=limit, worker=uuid.uuid4(), lease_seconds=30, timeout_seconds=60,
            held_keys=list(held)))]


def report(conn: psycopg.Connection, queue: str, outcomes: dict[str, tuple[bool, int]]) -> dict[str, str]:
    """A worker's report of outcomes per key: the keys' breaker states after it."""
    rows = statements.fetch(conn, RECORD_KEY_OUTCOMES, RecordKeyOutcomesParams(
        queue=queue, keys=list(outcomes), any_succeeded=[o[0] for o in outcomes.values()],
        trailing_failures=[o[1] for o in outcomes.values()]))
    return {row.key: row.now_state for row in rows}


def key_changes(dsn: str, queue: str) -> list[tuple[str, str]]:
    return [(change, detail["key"]) for change, detail in query(
        dsn, "SELECT change, detail FROM queueworker.queue_events WHERE queue = %s AND change LIKE 'key_breaker%%' "
             "ORDER BY id", (queue,))]


def metric(port: int, name: str, **labels: str) -> float:
    """A sample of a worker's /metrics (0 when it has none yet)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == name and labels.items() <= sample.labels.items())


def finish_running(dsn: str, queue: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("UPDATE queueworker.tasks SET state = 'succeeded', finished_at = now() "
                     "WHERE queue = %s AND state = 'running'", (queue,))


# -- settings -------------------------------------------------------------------------------------

def test_a_per_key_breaker_is_stored_audited_shown_and_makes_the_queue_key_limited(dsn, monkeypatch):
    with psycopg.connect(dsn, autocommit=True) as conn:
        row = operations.set_breaker(conn, "src", failures=3, cooldown_seconds=30, per_key=True)
        assert (row.key_breaker_failures, row.key_breaker_cooldown_seconds, row.key_limited, row.limited) == (
            3, 30.0, True, True)
        assert row.breaker_failures is None, "the queue's own breaker is another setting"
        assert scalar(dsn, "SELECT keyed FROM queueworker.queues WHERE name = 'src'") is True
        off = operations.set_breaker(conn, "src", failures=None, per_key=True)
        assert (off.key_breaker_failures, off.key_limited, off.limited) == (None, False, False)
    detail = query(dsn, "SELECT detail FROM queueworker.queue_events WHERE queue = 'src' ORDER BY id")
    assert {"key_breaker_failures": 3, "key_breaker_cooldown_seconds": 30}.items() <= detail[0][0].items()
    result = qw_here(monkeypatch, "breaker", "src", "--per-key", "--failures", "5", "--cooldown", "1m",
                     "--dsn", dsn)
    assert result.returncode == 0, result
    assert "breaker per key (5 failures, cooldown 60s)" in result.stdout


@pytest.mark.parametrize("args, message", [
    (("--failures", "0", "--cooldown", "1s"), "--failures"),
    (("--failures", "3"), "a breaker needs a cooldown"),
    (("--failures", "3", "--cooldown", "0s"), "not a duration"),
    (("--failures", "3", "--cooldown", "400d"), "at most a year"),
    (("--off", "--failures", "3"), "give --failures and --cooldown, or --off"),
])
def test_bad_per_key_breaker_settings_are_refused_in_one_line_and_change_nothing(dsn, monkeypatch, args, message):
    with psycopg.connect(dsn, autocommit=True) as conn:
        operations.set_breaker(conn, "src", failures=4, cooldown_seconds=10, per_key=True)
    result = qw_here(monkeypatch, "breaker", "src", "--per-key", *args, "--dsn", dsn)
    assert result.returncode == 2, result
    assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr, result.stderr
    with psycopg.connect(dsn, autocommit=True) as conn:
        for failures, cooldown in ((0, 1.0), (3, None), (3, 0.0), (3, float("nan")), (2_000_000, 1.0)):
            with pytest.raises(ValueError):
                operations.set_breaker(conn, "src", failures=failures, cooldown_seconds=cooldown, per_key=True)
        with pytest.raises(psycopg.errors.CheckViolation):
            conn.execute("UPDATE queueworker.queues SET key_breaker_cooldown_seconds = NULL WHERE name = 'src'")
    assert query(dsn, "SELECT key_breaker_failures, key_breaker_cooldown_seconds FROM queueworker.queues") == [
        (4, 10.0)]


# -- the claim and the reports --------------------------------------------------------------------

def test_an_open_key_loses_its_turn_is_probed_once_after_its_cooldown_and_a_success_closes_it(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        operations.set_breaker(conn, "src", failures=2, cooldown_seconds=0.5, per_key=True)
        enqueue_many(conn, keyed("src", {"a": 5, "b": 5, None: 5}))
        assert report(conn, "src", {"a": (False, 1)}) == {"a": "closed"}
        assert report(conn, "src", {"a": (False, 1), "b": (True, 0)}) == {"a": "open", "b": "closed"}
        assert Counter(claim_keys(conn, "src", limit=4)) == {"b": 2, "-": 2}, "a is passed over"
        assert claim_keys(conn, "src", limit=4, held=("b", "")) == [], "the keys the worker holds back itself"
        finish_running(dsn, "src")
        wait_until(lambda: claim_keys(conn, "src", limit=1, held=("b", "")) == ["a"], timeout=10,
                   message="the probe once the cooldown has passed")
        assert claim_keys(conn, "src", limit=10, held=("b", "")) == [], "one probe, then the key waits"
        assert report(conn, "src", {"a": (False, 1)}) == {"a": "open"}, "the probe failed"
        wait_until(lambda: claim_keys(conn, "src", limit=1, held=("b", "")) == ["a"], timeout=10,
                   message="another probe after another cooldown")
        assert report(conn, "src", {"a": (True, 0)}) == {"a": "closed"}
        assert Counter(claim_keys(conn, "src", limit=10, held=("b", ""))) == {"a": 3}, "the two probes run"
    assert key_changes(dsn, "src") == [("key_breaker_open", "a"), ("key_breaker_half_open", "a"),
                                       ("key_breaker_open", "a"), ("key_breaker_half_open", "a"),
                                       ("key_breaker_closed", "a")]
    health = {key: (state, streak, ok is not None, failed is not None) for key, state, streak, ok, failed in query(
        dsn, "SELECT key, breaker_state, failure_streak, last_success_at, last_failure_at FROM queueworker.key_state")}
    assert health == {"a": ("closed", 0, True, True), "b": ("closed", 0, True, False)}


def test_reports_of_one_key_by_two_workers_add_up_and_a_queue_without_the_breaker_keeps_health_only(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        operations.set_limits(conn, "plain", per_key_max_running=5)
        assert report(conn, "plain", {"k": (False, 7)}) == {"k": "closed"}, "no breaker: health only"
        operations.set_breaker(conn, "src", failures=3, cooldown_seconds=10, per_key=True)
        assert report(conn, "src", {"k": (False, 2)}) == {"k": "closed"}
        assert report(conn, "src", {"k": (False, 1)}) == {"k": "open"}, "2 + 1 of another worker's"
        assert report(conn, "src", {"k": (True, 0)}) == {"k": "open"}, "an open breaker waits for its probe"
        operations.set_breaker(conn, "src", failures=3, cooldown_seconds=10, per_key=True)
    assert query(dsn, "SELECT breaker_state, failure_streak FROM queueworker.key_state WHERE queue = 'src'") == [
        ("closed", 0)], "a changed breaker starts closed"
    assert scalar(dsn, "SELECT failure_streak FROM queueworker.key_state WHERE queue = 'plain'") == 7
    assert key_changes(dsn, "src")[-1] == ("key_breaker_closed", "k")


def test_a_worker_of_an_earlier_version_claims_nothing_from_a_queue_with_per_key_breakers(dsn):
    """Workers of version 20 run CLAIM_LIMITED_FAIR (or CLAIM_LIMITED before they heard the queue is
    keyed), those of version 21 LOCK_KEYS and CLAIM_KEYS as they were, blind to per-key breakers:
    none of them takes anything from the queue, and the version-21 claim works again once the queue
    has no per-key breaker."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        operations.set_breaker(conn, "rolling", failures=1, cooldown_seconds=600, per_key=True)
        enqueue_many(conn, keyed("rolling", {"a": 5, "b": 5}))
        report(conn, "rolling", {"a": (False, 1)})
        old = Statement("lease.claim_limited_fair_v20", CLAIM_LIMITED_FAIR_V20, ClaimParams, CLAIM_LIMITED.row)
        for statement in (old, CLAIM_LIMITED, CLAIM_LIMITED_FAIR, CLAIM_FAIR):
            assert claim_with(conn, statement, "rolling") == [], statement.name
        v21 = Statement("lease.claim_keys_v21", CLAIM_KEYS_V21, ClaimParams, CLAIM_KEYS.row)
        lock_v21 = Statement("lease.lock_keys_v21", LOCK_KEYS_V21, LockQueueParams, None)

        def claim_v21() -> list[str]:
            with conn.transaction():
                statements.execute(conn, lock_v21, LockQueueParams(queue="rolling"))
                return [row.key for row in statements.fetch(conn, v21, ClaimParams(
                    queue="rolling", limit=100, worker=uuid.uuid4(), lease_seconds=30, timeout_seconds=60))]
        assert claim_v21() == []
        assert scalar(dsn, "SELECT count(*) FROM queueworker.task_events WHERE to_state = 'running'") == 0
        assert Counter(claim_keys(conn, "rolling", limit=3)) == {"b": 3}, "this version's passes over a"
        operations.set_breaker(conn, "rolling", failures=None, per_key=True)
        operations.set_limits(conn, "rolling", per_key_max_running=10)
        assert Counter(claim_v21()) == {"a": 5, "b": 2}


# -- real workers ---------------------------------------------------------------------------------

def test_workers_open_a_failing_keys_breaker_while_another_key_keeps_running_probe_it_and_close_it(dsn, tmp_path):
    down = tmp_path / "down"
    down.touch()
    never = tmp_path / "never-down"
    with psycopg.connect(dsn, autocommit=True) as conn:
        operations.set_breaker(conn, "scrape", failures=3, cooldown_seconds=1.0, per_key=True)
        enqueue_many(conn, [TaskSpec(task="flow.flaky_source", queue="scrape", key="down", max_attempts=1,
                                     payload={"down_marker": str(down)}) for _ in range(30)]
                     + [TaskSpec(task="flow.flaky_source", queue="scrape", key="up", max_attempts=1,
                                 payload={"down_marker": str(never)}) for _ in range(1000)])
    port = free_port()
    worker = WorkerProcess(dsn, *HANDLERS, "--queue", "scrape", "--concurrency", "1", *FAST_LEASES,
                           "--metrics-port", str(port), "--metrics-address", "127.0.0.1")

    def failed() -> int:
        return scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE key = 'down' AND state = 'failed'")
    try:
        wait_until(lambda: ("key_breaker_open", "down") in key_changes(dsn, "scrape"), timeout=30,
                   message="the failing key's breaker to open")
        failed_while_open = failed()
        with psycopg.connect(dsn, autocommit=True) as conn:
            shown = {key["key"]: key for key in key_reports.key_report(conn, "scrape")["keys"]}
        assert shown["down"]["breaker_state"] in ("open", "half_open") and shown["down"]["failure_streak"] >= 3
        assert shown["up"]["breaker_state"] == "closed" and shown["up"]["last_success_at"] is not None
        wait_until(lambda: metric(port, "queueworker_key_breakers_open", queue="scrape") == 1, timeout=20,
                   message="the gauge of open key breakers")
        wait_until(lambda: key_changes(dsn, "scrape").count(("key_breaker_open", "down")) >= 2, timeout=30,
                   message="a failed probe to open it again")
        down.unlink()
        wait_until(lambda: ("key_breaker_closed", "down") in key_changes(dsn, "scrape"), timeout=30,
                   message="a successful probe to close it")
        wait_until(lambda: scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE state = 'succeeded'")
                   == 1030 - failed(), timeout=120, message="every other task to succeed")
        assert metric(port, "queueworker_key_breaker_transitions_total", queue="scrape", to_state="open") >= 2
        assert metric(port, "queueworker_key_breaker_transitions_total", queue="scrape", to_state="closed") == 1
        wait_until(lambda: metric(port, "queueworker_key_breakers_open", queue="scrape") == 0, timeout=20,
                   message="the gauge once the breaker closed")
    finally:
        worker.stop()
    # The third failure opens it, and the worker claimed nothing more of that key until the breaker
    # had counted that failure: nothing else of it ran. Then each probe but the last failed and
    # opened it again, one task each, and the last closed it.
    assert failed_while_open == 3, failed_while_open
    changes = key_changes(dsn, "scrape")
    reopened = changes.count(("key_breaker_open", "down")) - 1
    assert reopened >= 1 and failed() == 3 + reopened
    assert changes == [("key_breaker_open", "down"),
                       *[("key_breaker_half_open", "down"), ("key_breaker_open", "down")] * reopened,
                       ("key_breaker_half_open", "down"), ("key_breaker_closed", "down")], changes
    # The other key was never held back: its tasks started while the failing key was open.
    opened, probed = [at for at, in query(dsn, "SELECT at FROM queueworker.queue_events WHERE queue = 'scrape' "
                                               "AND change LIKE 'key_breaker%%' ORDER BY id LIMIT 2")]
    assert scalar(dsn, "SELECT count(*) FROM queueworker.task_events e JOIN queueworker.tasks t ON t.id = e.task_id "
                       "WHERE t.key = 'up' AND e.to_state = 'running' AND e.at > %s AND e.at < %s",
                  (opened, probed)) > 0
    assert scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE key = 'up' AND state <> 'succeeded'") == 0
    assert query(dsn, "SELECT key, breaker_state, failure_streak, last_failure_at IS NOT NULL "
                      "FROM queueworker.key_state WHERE queue = 'scrape' ORDER BY key") == [
        ("down", "closed", 0, True), ("up", "closed", 0, False)]


def test_a_worker_killed_mid_probe_does_not_leave_the_key_stuck(dsn, tmp_path):
    down, hang = tmp_path / "down", tmp_path / "hang"
    down.touch()
    with psycopg.connect(dsn, autocommit=True) as conn:
        operations.set_breaker(conn, "scrape", failures=2, cooldown_seconds=1.0, per_key=True)
        enqueue_many(conn, [TaskSpec(task="flow.flaky_source", queue="scrape", key="k", max_attempts=5,
                                     payload={"down_marker": str(down), "hang_marker": str(hang)})
                            for _ in range(2)])
    first = WorkerProcess(dsn, *HANDLERS, "--queue", "scrape", "--concurrency", "2", *FAST_LEASES)
    try:
        wait_until(lambda: ("key_breaker_open", "k") in key_changes(dsn, "scrape"), timeout=30,
                   message="the key's breaker to open")
        hang.touch()
        with psycopg.connect(dsn, autocommit=True) as conn:
            enqueue_many(conn, [TaskSpec(task="flow.flaky_source", queue="scrape", key="k", max_attempts=5,
                                         payload={"down_marker": str(down), "hang_marker": str(hang)})
                                for _ in range(5)])
        wait_until(lambda: Path(str(hang) + ".started").exists(), timeout=30, message="the probe to hang")
        assert key_changes(dsn, "scrape")[-1] == ("key_breaker_half_open", "k")
        first.signal(signal.SIGKILL)
        first.wait()
    finally:
        first.stop()
    hang.unlink()
    down.unlink()
    second = WorkerProcess(dsn, *HANDLERS, "--queue", "scrape", "--concurrency", "2", *FAST_LEASES)
    try:
        wait_until(lambda: scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE state = 'succeeded'") == 7,
                   timeout=60, message="the key's tasks, once a new probe succeeded")
    finally:
        second.stop()
    assert key_changes(dsn, "scrape")[-1] == ("key_breaker_closed", "k")
    assert scalar(dsn, "SELECT breaker_state FROM queueworker.key_state WHERE key = 'k'") == "closed"


def test_workers_keep_the_health_of_every_key_of_a_key_limited_queue_without_a_breaker(dsn, tmp_path):
    """Without a per-key breaker the reports (once a second per worker) keep each key's health, and
    hold back no key: the failing key's tasks all run."""
    down, never = tmp_path / "down", tmp_path / "never-down"
    down.touch()
    with psycopg.connect(dsn, autocommit=True) as conn:
        operations.set_limits(conn, "scrape", per_key_max_running=5)
        enqueue_many(conn, [TaskSpec(task="flow.flaky_source", queue="scrape", key=key, max_attempts=1,
                                     payload={"down_marker": str(marker)})
                            for key, marker in (("bad", down), ("good", never), (None, never)) for _ in range(10)])
    worker = WorkerProcess(dsn, *HANDLERS, "--queue", "scrape", "--concurrency", "4")

    def health() -> dict[str, tuple[int, bool, bool]]:
        return {key: (streak, ok is not None, failed is not None) for key, streak, ok, failed in query(
            dsn, "SELECT key, failure_streak, last_success_at, last_failure_at FROM queueworker.key_state")}
    try:
        wait_until(lambda: health() == {"bad": (10, False, True), "good": (0, True, False), "": (0, True, False)},
                   timeout=30, message="every key's health reported")
    finally:
        worker.stop()
    assert scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE state = 'failed'") == 10
    assert key_changes(dsn, "scrape") == []


def test_a_worker_claims_nothing_more_of_a_key_while_a_failure_of_it_is_on_its_way_to_the_breaker(dsn, tmp_path):
    """One key alone, one slot, outcomes written a second after their handler ends: without holding
    the key back, the worker would claim the key's next tasks while the failure that opens its
    breaker waits to be written and reported, and run them."""
    down = tmp_path / "down"
    down.touch()
    with psycopg.connect(dsn, autocommit=True) as conn:
        operations.set_breaker(conn, "scrape", failures=3, cooldown_seconds=600, per_key=True)
        enqueue_many(conn, [TaskSpec(task="flow.flaky_source", queue="scrape", key="down", max_attempts=1,
                                     payload={"down_marker": str(down)}) for _ in range(50)])
    worker = WorkerProcess(dsn, *HANDLERS, "--queue", "scrape", "--concurrency", "1",
                           "--flush-interval-seconds", "1")
    try:
        wait_until(lambda: ("key_breaker_open", "down") in key_changes(dsn, "scrape"), timeout=30,
                   message="the key's breaker to open")
        with psycopg.connect(dsn, autocommit=True) as conn:
            enqueue_many(conn, [TaskSpec(task="flow.flaky_source", queue="scrape", key="other",
                                         payload={"down_marker": str(down) + ".never"})])
        wait_until(lambda: scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE key = 'other' "
                                       "AND state = 'succeeded'") == 1, timeout=30,
                   message="a later claim of the worker, of another key")
    finally:
        worker.stop()
    assert scalar(dsn, "SELECT count(*) FROM queueworker.tasks WHERE key = 'down' AND state = 'failed'") == 3
