"""The controller's database side against a real Postgres and against servers that hang: coalesced
depth reads, caps, timeouts, isolation between databases, reference counting and the LISTEN shortcut."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import psycopg
import pytest

from queueworker.client.producer import enqueue_many
from queueworker.db.connection import StatementTimedOut
from queueworker_controller import queuedb
from queueworker.scaling.policy import QueueDepth
from queueworker_controller.queuedb import QueueDatabases
from tests.hanging_servers import SilentServer, StalledPostgres

pytestmark = pytest.mark.integration


def enqueue(dsn: str, queue: str, count: int) -> None:
    with psycopg.connect(dsn) as conn:
        enqueue_many(conn, [{"task": "qw.noop", "queue": queue} for _ in range(count)])


def run(scenario):
    """Runs `scenario(databases)` on a fresh QueueDatabases, closed afterwards."""
    async def main():
        databases = QueueDatabases()
        try:
            return await scenario(databases)
        finally:
            databases.close()
    return asyncio.run(main())


def without_budget(depth: QueueDepth) -> QueueDepth:
    """`depth` less the connection budget every read brings (tests/test_connection_budget.py)."""
    assert depth.connection_limit is not None
    return dataclasses.replace(depth, connection_limit=None, other_role_connections=0)


def test_depth_reads_on_one_database_share_one_query(dsn, monkeypatch):
    enqueue(dsn, "a", 5)
    enqueue(dsn, "b", 50)
    queries = []
    original = queuedb.Database.fetch

    async def counting_fetch(self, statement, params):
        queries.append(statement)
        return await original(self, statement, params)
    monkeypatch.setattr(queuedb.Database, "fetch", counting_fetch)

    async def read_three(databases):
        for owner, queue in (("qa", "a"), ("qb", "b"), ("qe", "empty")):
            databases.bind(owner, dsn, queue)
        return await asyncio.gather(databases.depth(dsn, "a", 100), databases.depth(dsn, "b", 10),
                                    databases.depth(dsn, "empty", 10))
    a, b, empty = run(read_three)
    assert len(queries) == 1
    assert (a.ready, a.running) == (5, 0)
    assert b.ready == 50  # the batch's cap is the highest asked for (100)
    assert without_budget(empty) == QueueDepth(0, 0, 0, None)


def test_ready_count_is_capped(dsn):
    enqueue(dsn, "big", 30)

    async def read(databases):
        databases.bind("q", dsn, "big")
        return await databases.depth(dsn, "big", 11)
    depth = run(read)
    assert depth.ready == 11 and depth.oldest_ready_age_seconds is not None


def test_blocked_tasks_are_reported_apart_and_older_schemas_still_read(blank_dsn):
    """Blocked tasks are counted (capped) but are not ready work; a database whose schema predates
    them (version 4: no `blocked` state yet) still gets its depth read, with none blocked."""
    from queueworker.db.migrate import migrate
    from queueworker.client.producer import enqueue_chain
    from tests.schema_history import insert_plain_tasks, migrate_to

    def read():
        async def scenario(databases):
            databases.bind("q", blank_dsn, "pipeline")
            return await databases.depth(blank_dsn, "pipeline", 2)
        return run(scenario)

    migrate_to(blank_dsn, 4)
    with psycopg.connect(blank_dsn) as conn:
        insert_plain_tasks(conn, [("pipeline", "qw.noop", {})] * 3)
    old = read()
    assert (old.ready, old.running, old.retrying, old.blocked) == (2, 0, 0, 0)
    migrate(blank_dsn)
    with psycopg.connect(blank_dsn) as conn:
        enqueue_chain(conn, [{"task": "qw.noop", "queue": "pipeline"}] * 4)
    depth = read()
    assert (depth.ready, depth.blocked) == (2, 2), "4 pending (capped at 2) and 3 blocked (capped at 2)"


def test_sessions_have_a_statement_timeout_keepalives_and_a_tcp_user_timeout(dsn):
    async def settings(databases):
        databases.bind("q", dsn, "jobs")
        async with databases._bound(dsn)._pool.connection() as conn:
            timeout = (await (await conn.execute("SHOW statement_timeout")).fetchone())[0]
            return timeout, conn.info.get_parameters()
    statement_timeout, parameters = run(settings)
    assert statement_timeout == "2s"
    assert parameters["keepalives"] == "1" and parameters["tcp_user_timeout"] == "15000"
    assert parameters["connect_timeout"] == str(queuedb.CONNECT_TIMEOUT_SECONDS)


def test_unreachable_database_fails_fast_for_every_waiter():
    dead = "postgresql://nobody@127.0.0.1:1/none"

    async def read_two(databases):
        databases.bind("a", dead, "a")
        databases.bind("b", dead, "b")
        return await asyncio.gather(databases.depth(dead, "a", 1), databases.depth(dead, "b", 1),
                                    return_exceptions=True)
    started = time.monotonic()
    results = run(read_two)
    assert all(isinstance(r, psycopg.OperationalError) for r in results)
    assert time.monotonic() - started < queuedb.CONNECT_TIMEOUT_SECONDS + 1


@pytest.mark.parametrize("server_type", [SilentServer, StalledPostgres], ids=["silent", "stalled-after-startup"])
def test_a_hung_server_fails_its_own_reads_and_holds_up_no_other_database(dsn, server_type):
    """Six QueueWorkers on a hung server and one on a healthy database, read at the same time:
    the healthy read answers at once; the hung ones fail within the connect timeout or the
    statement deadline, with an error that says it timed out."""
    hung = server_type()
    enqueue(dsn, "healthy", 3)

    async def scenario(databases):
        for i in range(6):
            databases.bind(f"hung-{i}", hung.dsn(), f"q{i}")
        databases.bind("healthy", dsn, "healthy")
        started = time.monotonic()
        stuck = [asyncio.ensure_future(databases.depth(hung.dsn(), f"q{i}", 10)) for i in range(6)]
        healthy = await databases.depth(dsn, "healthy", 10)
        healthy_after = time.monotonic() - started
        outcomes = await asyncio.gather(*stuck, return_exceptions=True)
        return healthy, healthy_after, outcomes, time.monotonic() - started
    try:
        healthy, healthy_after, outcomes, all_after = run(scenario)
    finally:
        hung.close()
    assert healthy.ready == 3
    assert healthy_after < 1.5, "the healthy database waited for the hung one"
    assert all(isinstance(o, psycopg.OperationalError) for o in outcomes), outcomes
    assert all("timeout" in str(o) or "timed out" in str(o) for o in outcomes), outcomes
    bound = queuedb.CONNECT_TIMEOUT_SECONDS + queuedb.STATEMENT_DEADLINE_SECONDS + queuedb.ABANDON_SECONDS
    assert all_after < bound + 1


def test_a_statement_past_its_deadline_frees_its_connection(monkeypatch):
    """The connection of a statement that timed out is shut down, not kept waiting on the server."""
    monkeypatch.setattr(queuedb, "STATEMENT_DEADLINE_SECONDS", 0.5)
    stalled = StalledPostgres()

    async def scenario(databases):
        databases.bind("q", stalled.dsn(), "q")
        for _ in range(queuedb.POOL_SIZE + 1):  # a stuck connection would keep its pool slot forever
            with pytest.raises(StatementTimedOut):
                await databases.depth(stalled.dsn(), "q", 1)
        await asyncio.sleep(0.2)
        return stalled.hung_up
    try:
        hung_up = run(scenario)
    finally:
        stalled.close()
    assert hung_up >= queuedb.POOL_SIZE + 1  # each timed-out statement's connection was shut down


def test_listen_passes_announcements_to_the_queueworkers_of_their_queue_only(dsn):
    """A producer's NOTIFY reaches the QueueWorkers bound to its queue (due now: 0; a delayed batch:
    its due time), malformed ones and other queues' reach nobody, and nothing is kept for them.
    A last announcement for a queue of its own marks the end: notifications arrive in order."""
    heard: dict[str, list[float]] = {"a": [], "b": [], "other": []}
    marked = asyncio.Event()

    async def scenario(databases):
        databases.bind("a", dsn, "wake", heard["a"].append)
        databases.bind("b", dsn, "wake", heard["b"].append)
        databases.bind("other", dsn, "elsewhere", heard["other"].append)
        databases.bind("marker", dsn, "marker", lambda due: marked.set())
        for _ in range(50):  # the LISTEN is up once its catch-up announcement arrived
            if heard["a"]:
                break
            await asyncio.sleep(0.05)
        for owners in heard.values():
            owners.clear()
        marked.clear()
        due = time.time() + 60
        await asyncio.to_thread(enqueue, dsn, "wake", 1)
        with psycopg.connect(dsn, autocommit=True) as conn:
            enqueue_many(conn, [{"task": "t", "queue": "wake", "delay": 60}])
            for payload in ("unwatched", "wake nan", "wake not-a-time", "wake inf", "wake 1e400", "wake -inf",
                            "marker"):
                conn.execute("SELECT pg_notify('queueworker', %s)", (payload,))
        await asyncio.wait_for(marked.wait(), 10)  # every announcement before it has been handled
        return due, set(databases._bound(dsn).watched)
    due, watched = run(scenario)
    assert heard["a"][0] == 0.0 and heard["a"][1] == pytest.approx(due, abs=2) and len(heard["a"]) == 2
    assert heard["b"] == heard["a"] and heard["other"] == []
    assert watched == {"wake", "elsewhere", "marker"}, "nothing is kept for queues nobody watches"


def test_databases_are_reference_counted_and_closed_when_unused(dsn, postgres):
    _, other_database = postgres

    async def scenario(databases):
        databases.bind(("ns", "a"), dsn, "jobs")
        databases.bind(("ns", "b"), dsn, "other")
        await databases.depth(dsn, "jobs", 5)
        first = databases._bound(dsn)
        assert databases.open_databases == 1
        databases.bind(("ns", "a"), other_database, "jobs")  # a's Secret now names another database
        assert databases.open_databases == 2
        databases.release(("ns", "b"))  # deleted: nobody reads the first database any more
        assert databases.open_databases == 1
        await asyncio.sleep(0.1)
        assert first._listener.cancelled() and first._pool._closed
        with pytest.raises(LookupError):
            await databases.depth(dsn, "jobs", 5)
        databases.release(("ns", "a"))
        return databases.open_databases
    assert run(scenario) == 0


def test_reads_arriving_during_a_query_share_the_next_one(dsn, monkeypatch):
    """Reads made while a query runs (here: held until the test lets it go), even well after the
    coalescing window, wait for it and then share one query."""
    queries = []
    original = queuedb.Database.fetch
    running, let_go = asyncio.Event(), asyncio.Event()

    async def held_fetch(self, statement, params):
        queries.append(sorted(params.queues))
        running.set()
        await let_go.wait()
        return await original(self, statement, params)
    monkeypatch.setattr(queuedb.Database, "fetch", held_fetch)

    async def staggered(databases):
        for queue in "abcd":
            databases.bind(queue, dsn, queue)
        first = asyncio.ensure_future(databases.depth(dsn, "a", 5))
        await asyncio.wait_for(running.wait(), 10)  # the first query is running now
        later = [asyncio.ensure_future(databases.depth(dsn, q, 5)) for q in ("b", "c")]
        await asyncio.sleep(5 * queuedb.COALESCE_SECONDS)
        later.append(asyncio.ensure_future(databases.depth(dsn, "d", 5)))
        await asyncio.sleep(5 * queuedb.COALESCE_SECONDS)
        let_go.set()
        return await asyncio.gather(first, *later)
    assert len(run(staggered)) == 4
    assert queries == [["a"], ["b", "c", "d"]]


def test_depth_carries_the_queues_flow_control(dsn):
    from queueworker.client import operations

    enqueue(dsn, "held", 5)
    enqueue(dsn, "metered", 5)
    with psycopg.connect(dsn, autocommit=True) as conn:
        operations.pause(conn, "held")
        operations.set_limits(conn, "metered", rate_per_second=4, max_running=6)
        conn.execute("INSERT INTO queueworker.tasks (queue, task, state, delayed, attempts, started_at, finished_at) "
                     "SELECT 'metered', 'done', 'succeeded', false, 1, now() - interval '3 s', now() "
                     "FROM generate_series(1, 3)")

    async def read(databases):
        for queue in ("held", "metered", "plain"):
            databases.bind(queue, dsn, queue)
        return await asyncio.gather(*(databases.depth(dsn, queue, 100) for queue in ("held", "metered", "plain")))
    held, metered, plain = run(read)
    assert (held.ready, held.paused, held.breaker_open) == (5, True, False)
    assert (metered.paused, metered.rate_per_second, metered.max_running) == (False, 4.0, 6)
    assert metered.mean_task_seconds == pytest.approx(3.0, abs=0.01)
    assert without_budget(plain) == QueueDepth(0, 0, 0, None)


def test_the_durations_a_limit_needs_are_read_from_a_bounded_sample_of_the_history(dsn):
    """A rate-limited and a key-limited queue, neither with a success among 20,000 finished tasks of
    another queue: the depth read walks the database's last 5,000 finishes for their durations, not
    the whole history looking for their own (which it did at every tick); a queue whose successes
    are among them gets their mean."""
    from queueworker.client import operations
    from queueworker.db import statements
    from queueworker.db.depth import QUEUE_DEPTH, QueueDepthParams

    with psycopg.connect(dsn, autocommit=True) as conn:
        operations.set_limits(conn, "rare", rate_per_second=4)
        operations.set_limits(conn, "tenants", per_key_max_running=2)
        operations.set_limits(conn, "metered", rate_per_second=4)
        conn.execute("INSERT INTO queueworker.tasks (queue, task, state, delayed, attempts, started_at, finished_at) "
                     "SELECT 'busy', 'done', 'succeeded', false, 1, now() - interval '1 s', now() "
                     "FROM generate_series(1, 20000)")
        conn.execute("INSERT INTO queueworker.tasks (queue, task, state, delayed, attempts, started_at, finished_at) "
                     "SELECT 'metered', 'done', 'succeeded', false, 1, now() - interval '3 s', now() "
                     "FROM generate_series(1, 3)")
        conn.execute("VACUUM ANALYZE queueworker.tasks")
    with psycopg.connect(dsn) as conn:
        rows = statements.fetch(conn, QUEUE_DEPTH, QueueDepthParams(
            queues=["rare", "tenants", "metered"], lookaheads=[None] * 3, cap=100, throughput=False))
        read = conn.execute("SELECT coalesce(idx_tup_fetch, 0) + coalesce(seq_tup_read, 0) "
                            "FROM pg_stat_xact_user_tables WHERE relid = 'queueworker.tasks_finished'::regclass"
                            ).fetchone()[0]
    means = {row.queue: row.mean_task_seconds for row in rows}
    assert means["rare"] is None and means["tenants"] is None
    assert means["metered"] == pytest.approx(3.0, abs=0.01)
    assert read <= 5_000 + 100, f"{read} finished tasks read"


def finishes(conn, queue: str, count: int, every: float, lasting: float, ago: float = 0.0) -> None:
    """`count` tasks of `queue` that finished `every` seconds apart, the newest `ago` seconds ago, each
    after running `lasting` seconds."""
    conn.execute("""INSERT INTO queueworker.tasks (queue, task, state, delayed, attempts, started_at, finished_at)
                    SELECT %(queue)s, 'done', 'succeeded', false, 1,
                           now() - make_interval(secs => %(ago)s + i * %(every)s + %(lasting)s),
                           now() - make_interval(secs => %(ago)s + i * %(every)s)
                    FROM generate_series(0, %(count)s - 1) AS i""",
                 {"queue": queue, "count": count, "every": every, "lasting": lasting, "ago": ago})


def test_lookahead_counts_what_is_due_soon_and_throughput_what_finished_lately(dsn):
    with psycopg.connect(dsn, autocommit=True) as conn:
        enqueue_many(conn, [{"task": "t", "queue": "soon", "delay": 20}] * 4
                     + [{"task": "t", "queue": "soon", "delay": 600}] * 3)
        conn.execute("INSERT INTO queueworker.tasks (queue, task, state, delayed, attempts, run_after) "
                     "VALUES ('soon', 't', 'retrying', false, 1, now() + interval '10 s')")
        finishes(conn, "steady", 120, every=0.5, lasting=1.5)  # 2/s over the last minute, 1.5 s each
        finishes(conn, "steady", 10, every=1, lasting=60, ago=90)  # before the window: not counted
        finishes(conn, "other", 30, every=2, lasting=0.1)

    async def read(databases):
        for owner in ("a", "b", "c", "d"):
            databases.bind(owner, dsn, "soon" if owner in "ab" else "steady")
        return await asyncio.gather(databases.depth(dsn, "soon", 100, lookahead_seconds=30),
                                    databases.depth(dsn, "soon", 100),
                                    databases.depth(dsn, "steady", 100, throughput=True),
                                    databases.depth(dsn, "idle", 100, throughput=True))
    ahead, plain, steady, idle = run(read)
    assert (ahead.ready, ahead.due_soon, ahead.demand) == (0, 5, 5), "4 delayed + 1 retrying due within 30 s"
    assert plain.due_soon == 0 and plain.demand == 0, "without a lookahead, only what is due now counts"
    assert steady.finish_rate == pytest.approx(2.0, rel=0.02)
    assert steady.recent_task_seconds == pytest.approx(1.5, abs=0.01)
    assert (idle.finish_rate, idle.recent_task_seconds) == (None, None)


def test_throughput_reads_a_bounded_sample_of_a_busy_database(dsn):
    """More finishes in the window than the sample holds: the sample covers a shorter span, and each
    queue's rate is its share of the sample over that span."""
    with psycopg.connect(dsn, autocommit=True) as conn:
        finishes(conn, "flood", 6000, every=0.005, lasting=0.05)  # 200/s for the last 30 s
        finishes(conn, "trickle", 30, every=1.0, lasting=0.5)  # 1/s

    async def read(databases):
        databases.bind("f", dsn, "flood")
        databases.bind("t", dsn, "trickle")
        return await asyncio.gather(databases.depth(dsn, "flood", 10, throughput=True),
                                    databases.depth(dsn, "trickle", 10, throughput=True))
    flood, trickle = run(read)
    assert flood.finish_rate == pytest.approx(200, rel=0.05)
    assert trickle.finish_rate == pytest.approx(1.0, rel=0.3)  # few of its finishes fall in a ~25 s sample
    assert flood.recent_task_seconds == pytest.approx(0.05, abs=0.005)


def test_the_depth_statements_share_one_throughput_sample():
    """The sample of recent finishes is written out in the depth statement for each schema age: the
    same text in all of them, its size and window each stated twice (the LIMIT and the test of whether
    the sample filled; the window and the span of a sample that did not), and smaller than the
    flood test_throughput_reads_a_bounded_sample_of_a_busy_database writes."""
    import re

    from queueworker.db.depth import QUEUE_DEPTHS_BY_AGE

    end = "FROM recent\n)"  # the end of `sampled`, which `recent` leads up to
    samples = {statement.text[:statement.text.index(end) + len(end)] for statement in QUEUE_DEPTHS_BY_AGE}
    assert len(samples) == 1, "the depth statements sample recent finishes differently"
    (sample,) = samples
    sizes = re.findall(r"LIMIT (\d+)|count\(\*\) < (\d+)", sample)
    windows = re.findall(r"secs => (\d+)\)|THEN (\d+)::float8", sample)
    assert len(sizes) == len(windows) == 2
    (size,) = {int(limit or below) for limit, below in sizes}
    (window,) = {int(secs or then) for secs, then in windows}
    assert (size, window) == (5000, 60) and size < 6000


def test_the_depth_statements_read_one_connection_budget():
    """The budget (docs/controller.md, "The database's connection budget") is written out in the depth
    statement for each schema age: the same text in all of them, counting other roles by usesysid,
    never by application_name."""
    from queueworker.db.depth import QUEUE_DEPTHS_BY_AGE

    start, end = "budget AS (", "AS other_role_connections\n)"
    budgets = {statement.text[statement.text.index(start):statement.text.index(end) + len(end)]
               for statement in QUEUE_DEPTHS_BY_AGE}
    assert len(budgets) == 1, "the depth statements read the connection budget differently"
    (budget,) = budgets
    assert "usesysid" in budget and "application_name" not in budget


def test_the_depth_statements_read_one_sample_of_durations():
    """The durations the limits need are written out in each depth statement that reads them: the
    same text in all of them, a bounded walk of the finished tasks (tests above)."""
    from queueworker.db.depth import QUEUE_DEPTHS_BY_AGE

    start, end = "durations AS MATERIALIZED (", "AS d\n    WHERE d.state = 'succeeded' AND d.started_at IS NOT NULL\n)"
    samples = {statement.text[statement.text.index(start):statement.text.index(end) + len(end)]
               for statement in QUEUE_DEPTHS_BY_AGE if "FROM durations" in statement.text}
    assert len(samples) == 1, "the depth statements read the durations differently"
    (sample,) = samples
    assert "LIMIT 5000" in sample
