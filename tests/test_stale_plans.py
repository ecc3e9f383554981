"""Plans made while the queue was empty, run once it has grown. A generic plan is made once per
session, for the size the table has then, and kept until an ANALYZE of the table replans it: a worker
that starts on an empty queue, or a producer's first enqueue into a new keyed queue, plans its
statements for a table of a few rows. Without care the planner picks a sequential scan and a sort
for such a table, and every claim (or every enqueue into a keyed queue, and every row of a batch)
then reads the whole table once the backlog arrives, until autovacuum gets to it. Here autovacuum is
off for the table, so no ANALYZE replans anything: the statements must read by index whatever the
table held when they were planned (lease.sql, `lock_queue`, `lock_keys`, `completion_settings`;
migrations/functions/, `claim_tasks`, `claim_fair_tasks`, `tag_fair` and `lock_key_limited_queue`).
The same for a producer's session (its lookups of tasks and runs) and for the size of an update
(the statement triggers that pair an update's old and new rows, planned for the first update a
session makes)."""

from __future__ import annotations

import json
import uuid

import psycopg
import pytest

from queueworker.client import operations, producer
from queueworker.db import statements
from queueworker.db.connection import SESSION_SETTINGS
from queueworker.db.duties import PROMOTE_DUE, PromoteDueParams
from queueworker.db.lease import (CLAIM, CLAIM_KEYS, COMPLETE_FAILED, COMPLETE_SUCCEEDED, GENERIC_COMPLETION,
                                  LOCK_KEYS, CompleteFailedParams, KeyClaimParams, LockQueueParams)
from queueworker.db.migration import SCHEMA_EXISTS
from queueworker.db.statements import NO_PARAMS, Bound
from tests.support import scalar
from tests.test_claim_plans import CLAIMS, claim_params, completion, explained, nodes, prepared

pytestmark = pytest.mark.integration

GROWN = 20_000
CLAIMS_ALL = {**CLAIMS, "key-limited": {True: (CLAIM_KEYS, Bound(LOCK_KEYS, LockQueueParams(queue="default")))}}


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
    statement, first = CLAIMS_ALL[claim][True]
    params = claim_params(10) if statement is not CLAIM_KEYS else KeyClaimParams(
        **vars(claim_params(10)), held_keys=[])
    with psycopg.connect(dsn, prepare_threshold=None) as conn:
        measured = prepared(conn, statement, first)
        explained(conn, measured, "force_generic_plan", params)  # the generic plan, made now
        enqueue(dsn, claim, GROWN)
        generic = explained(conn, measured, "force_generic_plan", params)
        assert generic["Actual Rows"] == 10
        assert not whole_reads(generic), whole_reads(generic)
        custom = explained(conn, measured, "force_custom_plan", params)
    buffers = {plan: run["Shared Hit Blocks"] + run["Shared Read Blocks"]
               for plan, run in (("generic", generic), ("custom", custom))}
    print(f"buffers of a {claim} claim of 10, planned at 5 waiting, run at {GROWN + 5:,}: {buffers}")
    assert buffers["generic"] <= 1.5 * buffers["custom"] + 10


def test_a_completion_planned_with_few_running_reads_only_the_tasks_it_completes(dsn):
    """Planned with 5 tasks running, run with 100 running and 20,000 waiting: the completion of 10
    reads those 10 by primary key, neither the tasks that wait (a plan made for the empty table read
    the whole table, backlog included) nor every running task (the running tasks' index, hashed
    whole, at every flush: at 64 worker processes of 8 slots, 512 entries read to complete 8)."""
    without_autovacuum(dsn)
    enqueue(dsn, "plain", 5)
    with psycopg.connect(dsn, autocommit=True) as conn:
        few = statements.fetch(conn, CLAIM, claim_params(5))
    analyzed(dsn)
    with psycopg.connect(dsn, prepare_threshold=None) as conn:
        measured = prepared(conn, COMPLETE_SUCCEEDED, GENERIC_COMPLETION)
        explained(conn, measured, "force_generic_plan", completion(few[:1]))
        enqueue(dsn, "plain", GROWN)
        with psycopg.connect(dsn, autocommit=True) as other:
            running = statements.fetch(other, CLAIM, claim_params(100))
        plan = explained(conn, measured, "force_generic_plan", completion(running[:10]))
    assert plan["Actual Rows"] == 10
    read = [(node["Node Type"], node["Actual Rows"] + node.get("Rows Removed by Filter", 0)) for node in nodes(plan)
            if node.get("Relation Name") == "tasks_active"]  # the rows each node read, kept or not
    assert read and all(rows <= 10 for _, rows in read), read


def test_failures_written_with_statistics_taken_while_few_ran_read_only_the_tasks_they_fail(dsn):
    """Statistics taken with 5 tasks running among 20,000 waiting (a queue analyzed at rest), a
    flush of 10 failures with 105 running: planned for its parameters, as every flush of failures
    is (the session's custom plans), it reads those 10 by primary key. Written `state = 'running'`,
    the planner looped over the running tasks' index and compared each entry with every failure of
    the batch (at 64 worker processes of 8 slots, 512 entries × 8 failures)."""
    without_autovacuum(dsn)
    enqueue(dsn, "plain", GROWN)
    with psycopg.connect(dsn, autocommit=True) as conn:
        statements.fetch(conn, CLAIM, claim_params(5))
    analyzed(dsn)
    with psycopg.connect(dsn, autocommit=True) as conn:
        running = statements.fetch(conn, CLAIM, claim_params(100))
    failing = running[:10]
    failed = CompleteFailedParams(ids=[row.id for row in failing], tokens=[row.lease_token for row in failing],
                                  retryables=[True] * 10, backoffs=[60.0] * 10, errors=['{"type": "Boom"}'] * 10)
    with psycopg.connect(dsn, prepare_threshold=None) as conn:
        measured = prepared(conn, COMPLETE_FAILED, Bound(SCHEMA_EXISTS, NO_PARAMS))
        plan = explained(conn, measured, "force_custom_plan", failed)
    assert plan["Actual Rows"] == 10
    read = [(node["Node Type"], node["Actual Rows"] * node["Actual Loops"] + node.get("Rows Removed by Filter", 0))
            for node in nodes(plan) if node.get("Relation Name") == "tasks_active"]
    assert read and all(rows <= 10 for _, rows in read), read


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


def seq_reads_of_tasks(conn: psycopg.Connection) -> int:
    """The rows this connection's transaction has read by sequential scans of the task, edge and run tables."""
    return conn.execute("SELECT coalesce(sum(seq_tup_read), 0) FROM pg_stat_xact_user_tables WHERE relid = ANY("
                        "ARRAY['queueworker.tasks_active', 'queueworker.tasks_finished', 'queueworker.runs', "
                        "'queueworker.task_dependencies']::regclass[])").fetchone()[0]


# A producer's enqueues that look tasks or runs up (the holder of a dedupe key, a run's partitions, a
# watermark's owner), each given a connection and a number that makes its spec new where it must be.
PRODUCER_LOOKUPS = {
    "a duplicate": lambda conn, n: producer.enqueue(conn, "t", queue="q", dedupe_key="held"),
    "a duplicate replacing": lambda conn, n: producer.enqueue(conn, "t", {"n": n}, queue="q", dedupe_key="held",
                                                              on_conflict="replace"),
    "a duplicate by spec": lambda conn, n: producer.enqueue(conn, "t", {"same": True}, queue="q", dedupe="spec"),
    "a duplicate through SQL": lambda conn, n: conn.execute(
        "SELECT queueworker.enqueue('t', '{}', 'q', dedupe_key => 'held')"),
    "a run with a watermark": lambda conn, n: producer.start_run(
        conn, f"run-{n}", [producer.TaskSpec(task="t", queue="q", payload={"n": n, "p": p}) for p in range(3)],
        watermark="mark"),
}


@pytest.mark.parametrize("lookup", PRODUCER_LOOKUPS)
def test_a_producer_session_planned_on_small_tables_looks_up_by_index_once_they_have_grown(dsn, lookup):
    """A producer's session enqueues 8 times while the tables hold a few rows (PL/pgSQL keeps a generic
    plan after five calls), then 20,000 tasks, 5,000 of them finished, and 20,000 runs arrive without
    an ANALYZE: its next enqueue reads none of them by a sequential scan (plans made for the small
    tables read all 20,000 tasks for each duplicate, and every run for each run started)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table in ("tasks_active", "tasks_finished", "runs"):
            conn.execute(f"ALTER TABLE queueworker.{table} SET (autovacuum_enabled = off)")
        for n in range(5):
            producer.enqueue(conn, "t", {"seed": n}, queue="q", dedupe_key=f"seed-{n}")
        conn.execute("VACUUM ANALYZE")
    with psycopg.connect(dsn) as conn:
        for n in range(8):
            PRODUCER_LOOKUPS[lookup](conn, n)
            conn.commit()
        with psycopg.connect(dsn, autocommit=True) as other:
            other.execute("INSERT INTO queueworker.tasks (queue, task, dedupe_key) "
                          "SELECT 'q', 't', 'grown-' || n FROM generate_series(1, %s) AS n", (GROWN,))
            other.execute("UPDATE queueworker.tasks SET state = 'cancelled', finished_at = now() WHERE id IN ("
                          "SELECT id FROM queueworker.tasks_active WHERE dedupe_key LIKE 'grown-%%' "
                          "ORDER BY id LIMIT 5000)")
            other.execute("INSERT INTO queueworker.runs (name, expected, watermark, queues) "
                          "SELECT 'grown', 1, 'mark-' || n, ARRAY['q'] FROM generate_series(1, %s) AS n", (GROWN,))
        before = seq_reads_of_tasks(conn)
        PRODUCER_LOOKUPS[lookup](conn, 8)
        assert seq_reads_of_tasks(conn) - before < 100


def test_a_duplicate_finds_its_holder_without_reading_the_finished_tasks(dsn):
    """A duplicate of a key an unfinished task holds, with 20,000 finished tasks in the history: the
    lookup of its holder reads none of them (a lookup of both partitions at once read them all, for
    every duplicate). And once the holder has finished, a duplicate is inserted anew, as before."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO queueworker.tasks (queue, task, dedupe_key) "
                     "SELECT 'q', 't', 'old-' || n FROM generate_series(1, %s) AS n", (GROWN,))
        conn.execute("UPDATE queueworker.tasks SET state = 'succeeded', finished_at = now() WHERE queue = 'q'")
        conn.execute("VACUUM ANALYZE")
        holder = producer.enqueue(conn, "t", queue="q", dedupe_key="held")
    with psycopg.connect(dsn) as conn:
        before = seq_reads_of_tasks(conn)
        assert producer.enqueue(conn, "t", queue="q", dedupe_key="held") == holder
        assert seq_reads_of_tasks(conn) - before == 0
        conn.commit()
        assert conn.execute("SELECT * FROM queueworker.existing_tasks(ARRAY[7::bigint], ARRAY['q'], ARRAY['held'])"
                            ).fetchall() == [(7, holder, "pending")]
        conn.execute("UPDATE queueworker.tasks SET state = 'cancelled', finished_at = now() WHERE id = %s", (holder,))
        conn.commit()
        # The holder gone between an insert and its lookup: the one that finished last is found, and
        # the lookup stops there (an index walk of every finished task read them all just the same).
        index_reads = ("SELECT idx_tup_fetch FROM pg_stat_xact_user_tables "
                       "WHERE relid = 'queueworker.tasks_finished'::regclass")
        before = conn.execute(index_reads).fetchone()[0]
        assert conn.execute("SELECT * FROM queueworker.existing_tasks(ARRAY[7::bigint], ARRAY['q'], ARRAY['held'])"
                            ).fetchall() == [(7, holder, "cancelled")]
        assert conn.execute(index_reads).fetchone()[0] - before < 100
        assert seq_reads_of_tasks(conn) < 100
        assert producer.enqueue(conn, "t", queue="q", dedupe_key="held") not in (holder, None)


def plans_of_nested_statements(conn: psycopg.Connection) -> list[dict]:
    """From now on, the plan of every statement `conn` runs, the triggers' and functions' included
    (auto_explain, sent back as notices): the list they are appended to."""
    plans: list[dict] = []

    def keep(diagnostic: psycopg.errors.Diagnostic) -> None:
        text = diagnostic.message_primary or ""
        if "plan:" in text:
            plans.append(json.loads(text.split("plan:", 1)[1])["Plan"])
    conn.add_notice_handler(keep)
    conn.execute("LOAD 'auto_explain'")
    for setting, value in (("log_min_duration", "0"), ("log_nested_statements", "on"), ("log_format", "json"),
                           ("log_level", "notice")):
        conn.execute(f"SET auto_explain.{setting} = '{value}'")
    return plans


def joins_of_transition_tables(plans: list[dict]) -> list[str]:
    """The join nodes whose two sides are an update's transition tables (old and new rows)."""
    return [node["Node Type"] for plan in plans for node in nodes(plan)
            if len(node.get("Plans", ())) == 2
            and all(any(below["Node Type"] == "Named Tuplestore Scan" for below in nodes(side))
                    for side in node["Plans"])]


def test_an_update_of_thousands_pairs_its_transition_rows_without_a_nested_loop(dsn):
    """A worker's scheduler session admits one due task, then 2,000 at once (in a keyed queue, so
    the fair-share tagging runs too). The statement triggers that pair each update's old rows with its
    new ones are planned once per session, for the first update's transition tables (one row each):
    those joins must not be nested loops, which compared every row with every other (a pass
    admitting 5,000 took 5 s instead of 0.1)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute("INSERT INTO queueworker.tasks (queue, task, key, run_after, delayed) "
                      "SELECT 'q', 't', 'k' || (n % 10), now() - interval '1 minute', true "
                      "FROM generate_series(1, 2001) AS n")
        conn.execute("VACUUM ANALYZE queueworker.tasks_active")
    with psycopg.connect(dsn, autocommit=True, options=SESSION_SETTINGS) as conn:
        assert statements.fetch(conn, PROMOTE_DUE, PromoteDueParams(limit=1))[0].promoted == 1
        plans = plans_of_nested_statements(conn)
        assert statements.fetch(conn, PROMOTE_DUE, PromoteDueParams(limit=2000))[0].promoted == 2000
    joins = joins_of_transition_tables(plans)
    assert len(joins) >= 4 and "Nested Loop" not in joins, joins
    assert scalar(dsn, "SELECT count(*) FROM queueworker.tasks_active WHERE fair_tag IS NOT NULL") == 2001


def settle_and_count(conn: psycopg.Connection, n: int) -> None:
    """What an operator's long-lived session does to dependencies and runs: a dependent enqueued on a
    prerequisite (its edges settled at once), the prerequisite cancelled (its dependent settled),
    then retried (settled back), and a run's partition cancelled (the run's outcomes counted)."""
    prerequisite = producer.enqueue(conn, "t", queue="q")
    producer.enqueue(conn, "t", queue="q", depends_on=[prerequisite])
    conn.execute("SET CONSTRAINTS ALL IMMEDIATE")  # the enqueue's settlement, due at commit, now
    assert operations.cancel(conn, prerequisite)
    operations.retry(conn, prerequisite)
    run = producer.start_run(conn, f"run-{n}", [producer.TaskSpec(task="t", queue="q", payload={"n": n})])
    [partition] = [row[0] for row in conn.execute("SELECT id FROM queueworker.tasks WHERE run_id = %s", (run,))]
    assert operations.cancel(conn, partition)


def test_a_long_lived_session_settles_dependents_and_counts_runs_by_index_once_the_tables_have_grown(dsn):
    """A session that keeps its plans (an operator's console, an app cancelling and retrying tasks, a
    worker through a pooler) settles dependents and counts runs 8 times while the tables hold a few
    rows, then 20,000 tasks (10,000 edges, 5,000 finished) arrive without an ANALYZE: the same work
    then reads none of them by a sequential scan (a cancel read 150,000 rows: every task, every edge)."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table in ("tasks_active", "tasks_finished", "task_dependencies", "runs"):
            conn.execute(f"ALTER TABLE queueworker.{table} SET (autovacuum_enabled = off)")
        settle_and_count(conn, 0)
        conn.execute("VACUUM ANALYZE")
    with psycopg.connect(dsn) as conn:
        for n in range(1, 9):
            settle_and_count(conn, n)
            conn.commit()
        with psycopg.connect(dsn, autocommit=True) as other:
            grown = other.execute("INSERT INTO queueworker.tasks (queue, task) SELECT 'q', 't' "
                                  "FROM generate_series(1, %s) RETURNING id", (GROWN,)).fetchall()
            # Edges as their enqueue's commit leaves them: counted (their prerequisite waits).
            other.execute("INSERT INTO queueworker.task_dependencies (prerequisite_id, task_id, cancel_on_failure, "
                          "counted) SELECT p, p + 1, true, 'waiting' FROM unnest(%s::bigint[]) AS p "
                          "WHERE p %% 2 = 0 AND p + 1 <= %s", ([row[0] for row in grown], max(row[0] for row in grown)))
            other.execute("UPDATE queueworker.tasks SET state = 'cancelled', finished_at = now() WHERE id IN ("
                          "SELECT id FROM queueworker.tasks_active ORDER BY id DESC LIMIT 5000)")
        before = seq_reads_of_tasks(conn)
        settle_and_count(conn, 9)
        assert seq_reads_of_tasks(conn) - before < 100


def test_a_cleaner_session_planned_on_a_small_history_deletes_a_batch_without_reading_it_whole(dsn):
    """The cleaner's retention (clean_finished and the others) in a session that keeps its plans (a
    worker through a pooler, whose session settings are refused): run 8 times while the history held
    5 tasks, then once 20,000 finished tasks (and their audit rows) are past the retention: a batch
    of 100 reads none of the history by a sequential scan (a plan made for the small history read it
    whole once per row deleted: 100 million rows, 12 s, for a batch of 1,000 at 100,000)."""
    cleaners = ("clean_finished", "clean_runs", "clean_queue_events", "clean_watermarks", "clean_key_state")
    with psycopg.connect(dsn, autocommit=True) as conn:
        for table in ("tasks_active", "tasks_finished", "task_events", "runs"):
            conn.execute(f"ALTER TABLE queueworker.{table} SET (autovacuum_enabled = off)")
        conn.execute("INSERT INTO queueworker.tasks (queue, task, state, finished_at) "
                     "SELECT 'q', 't', 'succeeded', now() - interval '2 hours' FROM generate_series(1, 5)")
        conn.execute("VACUUM ANALYZE")
    with psycopg.connect(dsn, autocommit=True) as conn:
        for _ in range(8):
            for cleaner in cleaners:
                conn.execute(f"SELECT count(*) FROM queueworker.{cleaner}(3600, 100)")
        with psycopg.connect(dsn, autocommit=True) as other:
            other.execute("INSERT INTO queueworker.tasks (queue, task, state, finished_at) SELECT 'q', 't', "
                          "'succeeded', now() - interval '2 hours' - make_interval(secs => n) "
                          "FROM generate_series(1, %s) AS n", (GROWN,))
        with conn.transaction():
            history = ("SELECT coalesce(sum(seq_tup_read), 0) FROM pg_stat_xact_user_tables WHERE relid = ANY("
                       "ARRAY['queueworker.tasks_finished', 'queueworker.task_events']::regclass[])")
            before = conn.execute(history).fetchone()[0]
            assert conn.execute("SELECT count(*) FROM queueworker.clean_finished(3600, 100)").fetchone()[0] == 100
            for cleaner in cleaners[1:]:
                conn.execute(f"SELECT count(*) FROM queueworker.{cleaner}(3600, 100)")
            assert conn.execute(history).fetchone()[0] - before < 100
