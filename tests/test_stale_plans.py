"""Plans made while the queue was empty, run once it has grown. A generic plan is made once per
session, for the size the table has then, and kept until an ANALYZE of the table replans it: a worker
that starts on an empty queue, or a producer's first enqueue into a new keyed queue, plans its
statements for a table of a few rows. Without care the planner picks a sequential scan and a sort
for such a table, and every claim (or every enqueue into a keyed queue, and every row of a batch)
then reads the whole table once the backlog arrives, until autovacuum gets to it. Here autovacuum is
off for the table, so no ANALYZE replans anything: the statements must read by index whatever the
table held when they were planned (lease.sql, `claim_settings`, `lock_queue`, `lock_keys`,
`completion_settings`; migrations/functions/, `tag_fair` and `lock_key_limited_queue`)."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from queueworker.client import operations
from queueworker.db import statements
from queueworker.db.lease import (CLAIM, CLAIM_KEYS, COMPLETE_SUCCEEDED, GENERIC_COMPLETION, LOCK_KEYS,
                                  KeyClaimParams, LockQueueParams)
from queueworker.db.statements import Bound
from tests.support import numbered
from tests.test_claim_plans import CLAIMS, claim_params, completion, explained, nodes

pytestmark = pytest.mark.integration

GROWN = 20_000
CLAIMS_ALL = {**CLAIMS, "key-limited": (CLAIM_KEYS, {True: Bound(LOCK_KEYS, LockQueueParams(queue="default"))})}


def without_autovacuum(dsn: str) -> None:
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE queueworker.tasks_active SET (autovacuum_enabled = off)")


def analyzed(dsn: str) -> None:
    """What autovacuum does to a small queue: the planner then knows the table as small (a table never
    analyzed is assumed to span at least 10 pages, which hides the problem)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE queueworker.tasks_active")


def enqueue(dsn: str, claim: str, tasks: int) -> None:
    """`tasks` more tasks in the default queue, never analyzed: in 100 keys for a fair or key-limited
    claim; a cap on the running tasks (too high to bind) for a limited one, per-key limits for a
    key-limited one."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        if claim == "key-limited":
            operations.set_limits(conn, "default", per_key_rate_per_second=1e6, per_key_burst=1_000_000,
                                  per_key_max_running=1_000_000)
        elif "limited" in claim:
            operations.set_limits(conn, "default", max_running=1_000_000)
        keyed = "fair" in claim or claim == "key-limited"
        # One INSERT, never enqueue_many: a batch that large goes through a temporary staging table,
        # and the first one a session creates makes every session replan everything (a new schema),
        # which would hide what is tested here.
        conn.execute("INSERT INTO queueworker.new_tasks (queue, task, key, delayed) "
                     "SELECT 'default', 't', CASE WHEN %s THEN 'k' || (n %% 100) END, false "
                     "FROM generate_series(1, %s) AS n", (keyed, tasks))


def whole_reads(plan: dict) -> list[tuple[str, str | None, int]]:
    """The nodes that read a task table other than by index, or sorted more rows than a claim takes."""
    def scans_tasks(node: dict) -> bool:
        return (node["Node Type"] in ("Seq Scan", "Bitmap Heap Scan")
                and node.get("Relation Name", "").startswith("tasks") and node["Actual Rows"] > 100)
    return [(node["Node Type"], node.get("Relation Name"), node["Actual Rows"]) for node in nodes(plan)
            if scans_tasks(node) or (node["Node Type"] == "Sort" and node["Actual Rows"] > 200)]


@pytest.mark.parametrize("claim", CLAIMS_ALL)
def test_a_claim_planned_on_an_empty_queue_reads_by_index_once_the_queue_has_grown(dsn, claim):
    """Planned with 5 tasks waiting, run with 20,005: the claim of 10 reads what a plan made now for
    its parameters reads, give or take half, and never the table whole."""
    without_autovacuum(dsn)
    enqueue(dsn, claim, 5)
    analyzed(dsn)
    statement, firsts = CLAIMS_ALL[claim]
    first = firsts[True]
    params = claim_params(10) if statement is not CLAIM_KEYS else KeyClaimParams(
        **vars(claim_params(10)), held_keys=[])
    with psycopg.connect(dsn, prepare_threshold=None) as conn:
        conn.pgconn.prepare(b"measured", numbered(statement.text)[0].encode())
        explained(conn, statement, first, "force_generic_plan", params)  # the generic plan, made now
        enqueue(dsn, claim, GROWN)
        generic = explained(conn, statement, first, "force_generic_plan", params)
        assert generic["Actual Rows"] == 10
        assert not whole_reads(generic), whole_reads(generic)
        custom = explained(conn, statement, first, "force_custom_plan", params)
    buffers = {plan: run["Shared Hit Blocks"] + run["Shared Read Blocks"]
               for plan, run in (("generic", generic), ("custom", custom))}
    print(f"buffers of a {claim} claim of 10, planned at 5 waiting, run at {GROWN + 5:,}: {buffers}")
    assert buffers["generic"] <= 1.5 * buffers["custom"] + 10


def test_a_completion_planned_with_few_running_never_reads_the_waiting_tasks(dsn):
    """Planned with 5 tasks running, run with 100 running and 20,000 waiting: the completion of 10
    reads the running tasks at most (a plan made for the empty table read the whole table, backlog
    included), never the tasks that wait."""
    without_autovacuum(dsn)
    enqueue(dsn, "plain", 5)
    with psycopg.connect(dsn, autocommit=True) as conn:
        few = statements.fetch(conn, CLAIM, claim_params(5))
    analyzed(dsn)
    with psycopg.connect(dsn, prepare_threshold=None) as conn:
        conn.pgconn.prepare(b"measured", numbered(COMPLETE_SUCCEEDED.text)[0].encode())
        explained(conn, COMPLETE_SUCCEEDED, GENERIC_COMPLETION, "force_generic_plan", completion(few[:1]))
        enqueue(dsn, "plain", GROWN)
        with psycopg.connect(dsn, autocommit=True) as other:
            running = statements.fetch(other, CLAIM, claim_params(100))
        plan = explained(conn, COMPLETE_SUCCEEDED, GENERIC_COMPLETION, "force_generic_plan", completion(running[:10]))
    assert plan["Actual Rows"] == 10
    read = [(node["Node Type"], node["Actual Rows"] + node.get("Rows Removed by Filter", 0)) for node in nodes(plan)
            if node.get("Relation Name") == "tasks_active"]  # the rows each node read, kept or not
    assert read and all(rows <= 105 for _, rows in read), read


def rows_read_whole(conn: psycopg.Connection, sql: str, table: str = "tasks_active") -> int:
    """Runs `sql` in a transaction of its own; the rows its sequential scans of `table` read (counted
    by this backend before its statistics are flushed: nothing but this connection's work)."""
    def read() -> int:
        return conn.execute("SELECT coalesce(sum(seq_tup_read), 0) FROM pg_stat_xact_user_tables "
                            "WHERE relid = %s::regclass", (f"queueworker.{table}",)).fetchone()[0]
    with conn.transaction():
        before = read()
        conn.execute(sql)
        return read() - before


@pytest.mark.parametrize("limited", [False, True], ids=["keyed", "key-limited"])
def test_tagging_planned_on_an_empty_keyed_queue_reads_by_index_once_it_has_grown(dsn, limited):
    """A producer's session tags a keyed task while the queue holds 6, then enqueues 20,000 more in
    one statement, then one: the fair-share tagging (tag_fair, in the insert trigger) reads
    none of the table whole, for the batch or for the single task (a plan made for the empty table
    scanned it once per row of the batch, quadratic: 3,000 tasks took seconds)."""
    without_autovacuum(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        if limited:
            operations.set_limits(conn, "q", per_key_max_running=1_000_000)
        insert = ("INSERT INTO queueworker.new_tasks (queue, task, key, delayed) "
                  "SELECT 'q', 't', 'k' || (n % 100), false FROM generate_series(1, {}) AS n")
        conn.execute(insert.format(5))
        analyzed(dsn)
        conn.execute(insert.format(1))  # plans the tagging for a table of 6
        assert rows_read_whole(conn, insert.format(GROWN)) < 100
        assert rows_read_whole(conn, insert.format(1)) < 100
        tags = conn.execute("SELECT count(*), count(fair_tag), count(DISTINCT (key, fair_tag)) "
                            "FROM queueworker.tasks_active").fetchone()
    assert tags == (GROWN + 7, GROWN + 7, GROWN + 7)  # every task tagged, a key's tags apart


def test_the_lock_of_a_key_limited_queue_planned_with_few_key_settings_reads_by_index_with_many(dsn):
    """The lock every claim of a key-limited queue takes first looks for key pauses that are over
    (lock_key_limited_queue): planned while 5 keys have settings of their own, it reads none of the
    20,000 that have them later whole."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("ALTER TABLE queueworker.queue_keys SET (autovacuum_enabled = off)")
        operations.set_limits(conn, "q", per_key_max_running=10)
        for key in range(5):
            operations.set_limits(conn, "q", key=f"k{key}", weight=2)
        conn.execute("VACUUM ANALYZE queueworker.queue_keys")
        lock = "SELECT queueworker.lock_key_limited_queue('q', true)"
        conn.execute(lock)  # planned now
        conn.execute("INSERT INTO queueworker.queue_keys (queue, key, weight) "
                     "SELECT 'q', 'w' || n, 2 FROM generate_series(1, %s) AS n", (GROWN,))
        assert rows_read_whole(conn, lock, "queue_keys") < 100
