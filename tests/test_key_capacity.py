"""What a key-limited queue's keys let run, as the controller reads it with the queue's depth
(queueworker.key_capacity, migrations/functions/78_key_capacity.sql): caps, pauses, breakers and
rates per key, the sample's bound, bad arguments, the grant, and databases of earlier versions."""

from __future__ import annotations

import asyncio
import uuid

import psycopg
import pytest

from queueworker import TaskSpec, enqueue_many
from queueworker.client import operations
from queueworker.db import statements
from queueworker.db.lease import CLAIM_KEYS, KeyClaimParams
from queueworker.scaling.policy import QueueDepth
from queueworker_controller.queuedb import QueueDatabases
from tests.test_key_breaker import report
from tests.test_key_limits import keyed

pytestmark = pytest.mark.integration


def depths(dsn: str, *queues: str, cap: int = 1000) -> list[QueueDepth]:
    """One depth read of `queues` as the controller makes it."""
    async def main():
        databases = QueueDatabases()
        try:
            for queue in queues:
                databases.bind(queue, dsn, queue)
            return await asyncio.gather(*(databases.depth(dsn, queue, cap) for queue in queues))
        finally:
            databases.close()
    return asyncio.run(main())


def keys_of(depth: QueueDepth) -> tuple[bool, int | None, int, int]:
    return depth.key_limited, depth.key_slots, depth.keys_ready, depth.keys_held


def claim(dsn: str, queue: str) -> list[str]:
    """One claim as a worker makes it: the keys of the tasks claimed."""
    with psycopg.connect(dsn) as conn, conn.transaction():
        conn.execute("SELECT queueworker.lock_key_limited_queue(%s, true)", (queue,))
        return [row.key or "" for row in statements.fetch(conn, CLAIM_KEYS, KeyClaimParams(
            queue=queue, limit=100, worker=uuid.uuid4(), lease_seconds=30, timeout_seconds=60, held_keys=[]))]


def test_caps_and_pauses_bound_what_the_keys_let_run_before_and_after_a_claim(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        operations.set_limits(conn, "tenants", per_key_max_running=2)
        operations.set_limits(conn, "tenants", key="d", max_running=5)
        operations.pause(conn, "tenants", key="c")
        enqueue_many(conn, keyed("tenants", {"a": 10, "b": 1, "c": 5, "d": 3, None: 4}))
    # a: 2 of 10, b: its 1, c: paused, d: its 3 (its own cap is 5), no key: 2 of 4.
    (before,) = depths(dsn, "tenants")
    assert keys_of(before) == (True, 8, 5, 1)
    assert sorted(claim(dsn, "tenants")) == ["", "", "a", "a", "b", "d", "d", "d"], "the claim agrees"
    # Running now: a 2, b 1, d 3, none 2; ready: a 8, c 5, none 2. The same 8 slots, 3 keys ready.
    (after,) = depths(dsn, "tenants")
    assert keys_of(after) == (True, 8, 3, 1) and (after.ready, after.running) == (15, 8)


def test_a_key_behind_an_open_breaker_counts_its_running_tasks_only_then_one_probe(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        operations.set_breaker(conn, "flaky", failures=2, cooldown_seconds=3600, per_key=True)
        operations.set_limits(conn, "flaky", per_key_max_running=3)
        enqueue_many(conn, keyed("flaky", {"bad": 6, "good": 6}))
    claim(dsn, "flaky")  # bad 3, good 3 running
    with psycopg.connect(dsn, autocommit=True) as conn:
        assert report(conn, "flaky", {"bad": (False, 2)}) == {"bad": "open"}
    (held,) = depths(dsn, "flaky")
    assert keys_of(held) == (True, 6, 2, 1), "bad: its 3 running, nothing more; good: 3"
    with psycopg.connect(dsn, autocommit=True) as conn:  # the cooldown is over
        conn.execute("UPDATE queueworker.key_state SET breaker_changed_at = now() - interval '2 hours' "
                     "WHERE queue = 'flaky' AND key = 'bad'")
    (probing,) = depths(dsn, "flaky")
    assert keys_of(probing) == (True, 7, 2, 0), "bad: its 3 running and one probe"


def test_a_keys_rate_keeps_rate_times_duration_slots_busy(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        operations.set_limits(conn, "metered", per_key_rate_per_second=2, per_key_burst=1)
        enqueue_many(conn, keyed("metered", {"a": 20, "b": 20, "c": 1}))
    (unknown,) = depths(dsn, "metered")
    assert keys_of(unknown) == (True, 3, 3, 0), "one slot per key until a task's duration is known"
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO queueworker.tasks (queue, task, state, delayed, attempts, started_at, finished_at) "
                     "SELECT 'metered', 'done', 'succeeded', false, 1, now() - interval '3 s', now() "
                     "FROM generate_series(1, 3)")
    (known,) = depths(dsn, "metered")
    assert known.mean_task_seconds == pytest.approx(3.0, abs=0.01)
    assert keys_of(known) == (True, 13, 3, 0), "2/s x 3 s = 6 slots for a and for b, c has 1 task"


def test_a_full_sample_that_no_limit_bounds_bounds_nothing_and_other_queues_have_no_keys(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        operations.set_limits(conn, "wide", per_key_max_running=100)
        enqueue_many(conn, keyed("wide", {"a": 10, "b": 10, "c": 10}))
        operations.set_limits(conn, "capped", max_running=5)
        enqueue_many(conn, keyed("capped", {"a": 3}))
        enqueue_many(conn, keyed("plain", {None: 3}))
    wide, capped, plain = depths(dsn, "wide", "capped", "plain", cap=11)
    assert keys_of(wide) == (True, None, 3, 0), "11 of 30 sampled, none bound: nothing known to bound"
    assert keys_of(capped) == keys_of(plain) == (False, None, 0, 0)
    (all_read,) = depths(dsn, "wide", cap=100)
    assert keys_of(all_read) == (True, 30, 3, 0)


def rows_fetched(conn: psycopg.Connection, sql: str) -> int:
    """Rows of `tasks_active` a statement reads, by index or sequentially (the transaction's own counters)."""
    with conn.transaction(force_rollback=True):
        conn.execute(sql)
        return conn.execute("SELECT coalesce(idx_tup_fetch, 0) + coalesce(seq_tup_read, 0) "
                            "FROM pg_stat_xact_user_tables "
                            "WHERE relid = 'queueworker.tasks_active'::regclass").fetchone()[0]


def test_the_sample_bounds_what_is_read_whatever_the_backlog(dsn):
    """A sample of 1,000 reads about as many rows behind 2,000 waiting tasks as behind 20,000: the
    untagged tasks are looked for among the head of the queue's line once the tagged ones did not
    fill the sample, where every controller tick read the whole backlog for them (40 ms at 200,000
    waiting)."""
    read = {}
    with psycopg.connect(dsn) as conn:
        for backlog in (2_000, 20_000):
            queue = f"backlog-{backlog}"
            operations.set_limits(conn, queue, per_key_max_running=5)
            enqueue_many(conn, [TaskSpec(task="t", queue=queue, key=f"k{n % 10}") for n in range(backlog)])
            conn.commit()
            read[backlog] = rows_fetched(conn, f"SELECT queueworker.key_capacity('{queue}', 1000, 1.0)")
    print(f"rows of tasks_active read by key_capacity: {read}")
    assert read[20_000] <= 2 * read[2_000] + 100, read


def test_an_untagged_task_is_sampled_after_the_tagged_ones(dsn):
    """A task without a tag (made claimable by a transaction that had not seen its queue become
    keyed) counts as ready once the tagged tasks leave room in the sample, and not before."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        operations.set_limits(conn, "late", per_key_max_running=5)
        enqueue_many(conn, keyed("late", {"a": 3, "b": 1}))
        conn.execute("UPDATE queueworker.tasks_active SET fair_tag = NULL WHERE queue = 'late' AND key = 'b'")
        ready = conn.execute("SELECT queueworker.key_capacity('late', 10, 1.0) ->> 'keys_ready'").fetchone()[0]
        full = conn.execute("SELECT queueworker.key_capacity('late', 3, 1.0) ->> 'keys_ready'").fetchone()[0]
    assert (ready, full) == ("2", "1")


@pytest.mark.parametrize(("args", "refused"), [
    ("NULL, 10, NULL", "a queue name"),
    ("'q', 0, NULL", "a sample of at least 1"),
    ("'q', NULL, NULL", "a sample of at least 1"),
    ("'q', 10, 'NaN'", "finite task duration"),
    ("'q', 10, 'Infinity'", "finite task duration"),
    ("'q', 10, -1", "finite task duration"),
])
def test_bad_arguments_are_refused_in_one_line(dsn, args, refused):
    with psycopg.connect(dsn, autocommit=True) as conn:
        with pytest.raises(psycopg.errors.InvalidParameterValue, match=refused) as caught:
            conn.execute(f"SELECT * FROM queueworker.key_capacity({args})")
    assert "\n" not in caught.value.diag.message_primary


def test_without_key_capacity_or_its_grant_the_depth_is_read_without_the_keys(dsn, caplog):
    """A database migrated by the previous release (schema version 22 without key_capacity), and a
    controller login whose grants predate it (docs/database-roles.sql not run again): the depth and
    the queue's own limits are read as before, the keys bound nothing, and the missing grant is said
    once in the log. Granted, the keys are read."""
    login, password = f"ctl_{uuid.uuid4().hex[:12]}", uuid.uuid4().hex
    with psycopg.connect(dsn, autocommit=True) as conn:
        operations.set_limits(conn, "older", max_running=4, per_key_max_running=1)
        enqueue_many(conn, keyed("older", {"a": 3, "b": 3}))
        conn.execute(f"CREATE ROLE {login} LOGIN PASSWORD '{password}'")
        conn.execute(f"GRANT USAGE ON SCHEMA queueworker TO {login}")
        conn.execute(f"GRANT SELECT (id, queue, state, delayed, priority, run_after, lease_owner, started_at, "
                     f"finished_at) ON queueworker.tasks TO {login}")
        conn.execute(f"GRANT SELECT ON queueworker.queues TO {login}")
    controller = psycopg.conninfo.make_conninfo(dsn, user=login, password=password)
    try:
        for _ in range(2):
            (refused,) = depths(controller, "older")
            assert (refused.ready, refused.max_running) == (6, 4) and keys_of(refused) == (False, None, 0, 0)
        said = [r.getMessage() for r in caplog.records
                if r.name.startswith("queueworker_controller") and "key_capacity" in r.getMessage()]
        assert len(said) == 2 and "depth.queue_depth was refused" in said[0], said  # once per database read
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"GRANT EXECUTE ON FUNCTION queueworker.key_capacity(text, integer, float8) TO {login}")
        (granted,) = depths(controller, "older")
        assert keys_of(granted) == (True, 2, 2, 0)
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute("DROP FUNCTION queueworker.key_capacity(text, integer, float8)")
        (previous_release,) = depths(dsn, "older")
        assert (previous_release.max_running, keys_of(previous_release)) == (4, (False, None, 0, 0))
    finally:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(f"DROP OWNED BY {login}")
            conn.execute(f"DROP ROLE {login}")
